// TpPrefetcher: the overlap within one layer group of a TP decode step (docs/ARCHITECTURE.md,
// "One decode step of one layer group", step 7). A group's selection is known only after that group's own
// indexer ran on the output of the layers before it, so the next group's misses cannot be
// fetched early. What overlaps is inside the group: its L layers share one selection, so
// the first layer's bytes of the selected entries are on the critical path and layers
// 1 .. L-1 arrive while the earlier layers of the group compute.
//
// Layout: a group entry of E bytes holds the group's L layers side by side; layer l of an
// entry is bytes [l * E / L, (l + 1) * E / L). A per-layer transfer moves that strided
// sub-range of every fetched entry (one copy batch per source rank, tier and layer, all
// submitted at once in layer order: TpLayerSink, tp_step_planner.h), so the copy engine
// delivers layer 0 of every entry first.
//
// RunStep, per group g in order: the planner's step (validation, dedup, home swaps — whole
// entries, swaps are all-or-nothing —, buffer slots, the per-layer remote copies) runs on a
// worker thread; the driver gets the refs, waits for layer 0, calls compute(g, 0, plan),
// then compute(g, l, plan) as soon as layer l arrived, and waits for the step to publish
// before group g + 1 (whose selection depends on group g's output). compute(g, l, plan)
// may read only layer l's sub-range of the entries. layered = false runs the same work
// serially: the whole group step with whole-entry copies, then the L layer computes.
//
// Overlap is measured, not assumed: fetch = wall time from the start of each group step
// until its last layer arrived, exposed = until its layer 0 arrived (the fetch on the
// critical path; serially both are the whole step), compute = wall time of the callbacks, overlap = (fetch + compute - wall) / fetch,
// clamped to [0, 1].
//
// Failure contract: refusal is total (every group checked before any is stepped, and the
// layer count checked against the entry size): kInvalidArgument, kOutOfRange, kNotFound,
// kResourceExhausted change nothing and call no compute. kIo (a failed copy in group g):
// groups before g were stepped, published and computed; group g is in TpStepPlanner::Step's
// kIo state — a slot whose copy failed in any layer is not published, nothing is lost —;
// compute ran for group g's layers that arrived before the failure (their outputs belong to
// a failed step: the caller discards them), for no later layer and no later group.
//
// In-process ranks only (an MPI fabric's collectives must stay on the main thread).
// Lifetime: holds the space by reference (the space outlives it).
// Thread-safety: one driver thread; the worker only runs the planner's step.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "ula/tp_step_planner.h"

namespace ula {

struct TpPipelineStats {
  double wall_s = 0;
  double fetch_s = 0;    // sum of the group steps' durations
  double exposed_s = 0;  // sum over groups of the time until layer 0 arrived
  double compute_s = 0;  // sum of the compute callbacks' durations
  double overlap() const;  // fraction of fetch time hidden behind compute
  StepStats totals;  // over groups and hosted ranks
};

class TpPrefetcher {
 public:
  // layers_per_group: L, the layers that share a group's selection (ModelConfig::layers_per_group).
  explicit TpPrefetcher(TpAddressSpace& space, std::uint32_t layers_per_group = 1, TpPlannerOptions options = {});

  using Compute = std::function<void(GroupId, std::uint32_t layer, const TpStepPlan&)>;
  // selections[g]: group g's selections; runs[g]: which request each of them belongs to
  // (selection_run.h). Groups run in order 0..G-1, layers 0..L-1 within each. Errors: the
  // header's failure contract; kInvalidArgument also unless selections.size() ==
  // runs.size() == num_groups and L >= 1 divides entry_bytes.
  Result<TpPipelineStats> RunStep(std::span<const std::vector<LogicalAddr>> selections,
                                  std::span<const std::vector<SelectionRun>> runs, const Compute& compute,
                                  bool layered = true);

  std::uint32_t layers_per_group() const { return layers_; }

 private:
  TpAddressSpace& space_;
  std::uint32_t layers_;
  TpStepPlanner planner_;
};

}  // namespace ula
