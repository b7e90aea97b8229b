// TpPrefetcher: the layer-group pipeline of one decode step (DESIGN.md step 7). While the
// caller computes group g (its `compute` callback reads group g's plan), the step of group
// g + 1 — dedup, home swaps, fetches from other ranks — runs on a background worker. Steps
// of different groups touch disjoint state, so they may overlap; steps themselves run one
// at a time, in group order, so plans are identical to a serial run.
//
// Overlap is measured, not assumed: fetch time = wall time of the group steps, compute
// time = wall time of the callbacks, overlap = (fetch + compute - wall) / fetch, clamped
// to [0, 1]; RunStep(..., prefetch = false) runs the same work serially for comparison.
//
// In-process ranks only (an MPI fabric's collectives must stay on the main thread).
// Lifetime: holds the space by reference (the space outlives it).
// Thread-safety: one driver thread; the worker only runs planner steps.
#pragma once

#include <functional>
#include <span>
#include <vector>

#include "ula/tp_step_planner.h"

namespace ula {

struct TpPipelineStats {
  double wall_s = 0;
  double fetch_s = 0;    // sum of the group steps' durations
  double compute_s = 0;  // sum of the compute callbacks' durations
  double overlap() const;  // fraction of fetch time hidden behind compute
  TpRankStepStats totals;  // over groups and hosted ranks
};

class TpPrefetcher {
 public:
  explicit TpPrefetcher(TpAddressSpace& space, TpPlannerOptions options = {});

  using Compute = std::function<void(GroupId, const TpStepPlan&)>;
  // selections[g]: group g's selections; runs[g]: which request each of them belongs to
  // (selection_run.h). Groups run in order 0..G-1.
  // Refusal is total: every group's selections are checked (TpStepPlanner::Check) before
  // any group is stepped, so kInvalidArgument (also unless selections.size() ==
  // runs.size() == num_groups), kOutOfRange, kNotFound and kResourceExhausted (naming the
  // group) change nothing and call no compute.
  // kIo (a failed transfer in group g's step, named in the message): groups before g were
  // stepped and computed, group g is left in TpStepPlanner::Step's documented kIo state
  // (nothing published before its bytes arrived, nothing lost), later groups are
  // untouched, and no further compute runs.
  Result<TpPipelineStats> RunStep(std::span<const std::vector<LogicalAddr>> selections,
                                  std::span<const std::vector<SelectionRun>> runs, const Compute& compute,
                                  bool prefetch = true);

 private:
  TpAddressSpace& space_;
  TpStepPlanner planner_;
};

}  // namespace ula
