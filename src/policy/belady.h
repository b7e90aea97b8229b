// Belady's MIN on a selection trace: the hit rate no replacement policy can beat. At each
// step the distinct selected addresses must all be on device; a miss goes to a free slot
// or displaces the resident entry whose next selection is farthest in the future (never
// selected again first). Entries selected in the current step are not candidates — the
// same rule the real policies obey ("never evict what this step reads"). With equal-size
// entries and that constraint, farthest-next-use is optimal by the usual exchange argument
// (any schedule evicting an entry used sooner can swap the two evictions without losing a
// hit), so every policy's hit-rate gap to this is what better replacement could still buy.
//
// MIN is optimal for the number of distinct misses (each step's distinct selections, as the
// planner dedups them), not for misses weighted by how many queries of a step selected an
// entry: the bound is therefore on the distinct hit rate (ReplayResult::distinct_hit_rate),
// over the same measured steps and the same pool size as ReplayTrace. The per-selection
// hit count of the same schedule is reported too (not a bound).
// Cost: O(selections + distinct accesses x log pool) time, O(addresses + pool) memory.
// Thread-safety: reentrant.
#pragma once

#include <cstdint>

#include "policy/policy_replay.h"

namespace ula::policy {

struct BeladyResult {
  std::uint32_t pool_slots = 0;
  std::uint64_t selections = 0;  // measured steps only
  std::uint64_t hits = 0;          // per selection (not a bound)
  std::uint64_t distinct = 0;      // distinct selections of the measured steps
  std::uint64_t distinct_hits = 0;  // the bound
  std::uint64_t evictions = 0;
  double hit_rate() const { return selections == 0 ? 0.0 : static_cast<double>(hits) / selections; }
  double distinct_hit_rate() const { return distinct == 0 ? 0.0 : static_cast<double>(distinct_hits) / distinct; }
};

// kInvalidArgument for a bad trace or config (as ReplayTrace); kResourceExhausted if a
// step's distinct selections exceed the pool.
Result<BeladyResult> ReplayBelady(const SelectionTrace& trace, double pool_fraction, std::uint32_t warmup_steps);

}  // namespace ula::policy
