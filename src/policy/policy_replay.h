// Policy-level replay: a harness that replays a selection trace through one residency
// policy over one device slot pool, for `ula bench policy`. The trace itself comes from the
// shared selection model (src/workload/selection_model.h, calibrated against the real
// indexer in docs/WORKLOADS.md); tools/ula/bench_policy_command.cc builds it, so that every policy
// and every other benchmark sees the same calibrated selections.
//
// Trace layout: `batch` requests decode together; request r owns the addresses
// [r * span, (r + 1) * span), span = context_tokens + steps. Step t's selections are the
// requests' selections (all queries) concatenated; addresses may repeat within a step
// (speculative-decoding queries overlap), and the harness dedups them.
//
// The harness maps addresses to slots itself (an address -> slot array and its inverse; no
// location table, no data copy). Per step, timed, for every policy alike: look up every
// selection in one tight loop with software prefetch (hit = already on device), Touch the
// hit slots, place the distinct misses in free slots first (SlotPool) and then in victims
// from ClaimVictims, AdvanceRound. Device pool = pool_fraction * batch * context_tokens
// slots, all empty at step 0; the first warmup_steps steps are replayed but not measured.
//
// Thread-safety: reentrant; a trace is immutable once built.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "ula/error.h"
#include "ula/ids.h"
#include "ula/residency_policy.h"

namespace ula::policy {

struct SelectionTrace {
  std::uint32_t batch = 0;           // requests decoding together
  std::uint32_t context_tokens = 0;  // history of each request at step 0
  std::uint32_t steps = 0;
  std::uint64_t num_addresses = 0;        // batch * (context_tokens + steps)
  std::vector<std::uint64_t> step_begin;  // [steps + 1] offsets into selections
  std::vector<LogicalAddr> selections;    // [step_begin[steps]]

  std::span<const LogicalAddr> Step(std::uint32_t t) const {
    return std::span(selections).subspan(step_begin[t], step_begin[t + 1] - step_begin[t]);
  }
  // kInvalidArgument naming the first inconsistency (shape, offsets, an address out of range).
  Status Validate() const;
};

struct ReplayConfig {
  PolicyKind policy = DefaultPolicyKind();
  PolicyOptions options;
  double pool_fraction = 0.5;  // device slots / (batch * context_tokens), in (0, 1]
  std::uint32_t warmup_steps = 16;
};

struct ReplayResult {
  std::uint32_t pool_slots = 0;
  std::uint64_t selections = 0;  // measured steps only
  std::uint64_t hits = 0;
  std::uint64_t distinct = 0;       // distinct selections of the measured steps (per step)
  std::uint64_t distinct_hits = 0;  // of those, already on device (distinct - misses)
  std::uint64_t evictions = 0;
  // Measured victims last used more than R = options.recent_buckets steps before the step
  // that evicted them: for PB-LRU exactly the victims taken from its cold bucket, where it
  // orders by slot index instead of age (its only approximation of LRU besides ties within
  // a round). Counted outside the timed part of the step.
  std::uint64_t cold_evictions = 0;
  double step_ns_median = 0;
  double hit_rate() const { return selections == 0 ? 0.0 : static_cast<double>(hits) / selections; }
  double distinct_hit_rate() const { return distinct == 0 ? 0.0 : static_cast<double>(distinct_hits) / distinct; }
};

// Replays `trace` through each config's policy. The policies advance in lockstep, one step
// of each in turn (rotating which goes first), so that a change in machine load during the
// run affects every policy alike and their step times are comparable within one run.
// kInvalidArgument for a bad config; kResourceExhausted if a step's misses do not fit in
// free plus evictable slots (pool too small for batch * (top_k + 1)).
Result<std::vector<ReplayResult>> ReplayTrace(const SelectionTrace& trace, std::span<const ReplayConfig> configs);

}  // namespace ula::policy
