// Policy-level replay: a seeded selection trace and a harness that replays it through one
// residency policy over one device slot pool, for `ula bench policy` and bench/policy_bench.cc.
//
// The trace (a stand-in until a shared selection model exists): `batch` requests decode
// together; request r owns the addresses [r * span, (r + 1) * span), span = context_tokens +
// steps. At step t request r has context_tokens + t + 1 tokens, and its top-k is
//   the newest token (written this step) + `sinks` attention sinks (positions 0..sinks-1)
//   + round(overlap * top_k) positions kept from its previous top-k (a uniform subset)
//   + fresh draws up to top_k: with probability recent_share from the last recent_window
//     positions, otherwise uniform over the whole history.
// A step's selections are the requests' top-k concatenated; no address repeats in a step.
// The trace is a pure function of its config (own splitmix64 generator).
//
// The harness maps addresses to slots itself (an address -> slot array and its inverse; no
// location table, no data copy). Per step, timed: look up every selection (hit = already on
// device), Touch the hit slots, place the distinct misses in free slots first (SlotPool) and
// then in victims from ClaimVictims, AdvanceRound. The newest token of each request is a miss
// by construction (it has never been on device) for every policy alike.
// Device pool = pool_fraction * batch * context_tokens slots, all empty at step 0; the first
// warmup_steps steps are replayed but not measured.
//
// Thread-safety: reentrant; a trace is immutable once generated.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "ula/error.h"
#include "ula/ids.h"
#include "ula/residency_policy.h"

namespace ula::policy {

struct SelectionTraceConfig {
  std::uint32_t batch = 1;               // requests decoding together
  std::uint32_t context_tokens = 16384;  // history of each request at step 0
  std::uint32_t top_k = 2048;
  std::uint32_t steps = 64;
  double overlap = 0.8;  // fraction of the previous top-k kept, in [0, 1]
  std::uint32_t sinks = 16;
  double recent_share = 0.5;  // of the fresh draws, in [0, 1]
  std::uint32_t recent_window = 4096;
  std::uint64_t seed = 1;

  // Names the first bad field.
  Status Validate() const;
};

struct SelectionTrace {
  SelectionTraceConfig config;
  std::uint64_t num_addresses = 0;      // batch * (context_tokens + steps)
  std::vector<std::uint64_t> step_begin;  // [steps + 1] offsets into selections
  std::vector<LogicalAddr> selections;    // [step_begin[steps]]

  std::span<const LogicalAddr> Step(std::uint32_t t) const {
    return std::span(selections).subspan(step_begin[t], step_begin[t + 1] - step_begin[t]);
  }
};

Result<SelectionTrace> GenerateSelectionTrace(const SelectionTraceConfig& config);

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
  std::uint64_t evictions = 0;
  double step_ns_median = 0;
  double hit_rate() const { return selections == 0 ? 0.0 : static_cast<double>(hits) / selections; }
};

// Replays `trace` through each config's policy. The policies advance in lockstep, one step
// of each in turn (rotating which goes first), so that a change in machine load during the
// run affects every policy alike and their step times are comparable within one run.
// kInvalidArgument for a bad config; kResourceExhausted if a step's misses do not fit in
// free plus evictable slots (pool too small for batch * (top_k + 1)).
Result<std::vector<ReplayResult>> ReplayTrace(const SelectionTrace& trace, std::span<const ReplayConfig> configs);

}  // namespace ula::policy
