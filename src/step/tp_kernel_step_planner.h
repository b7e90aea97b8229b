// TpKernelStepPlanner: TpStepPlanner::Step's contract (ula/tp_step_planner.h, word for word)
// for TP with attention at home, every rank in this process, with each rank's per-selection
// phases run as the step's data-parallel kernels (src/kernels) in their OpenMP
// form: each rank plans its own shard. It is the kernels' TP differential harness against
// TpStepPlanner: on the same state and inputs both return the same plan (refs and stats),
// the same refusal, publish the same home tables and leave the same state (DebugDigest),
// whatever the thread count.
//
// The kernels in TP mode (step_kernels.h, "TP mode"): a rank's records are its home table,
// address a at home[a / P] (plain locations); the dedup stamps are this planner's, one per
// home entry and rank and group (stamps_), so the home table other ranks read is never
// written by a classify. A selection homed on another rank is checked against the
// directory (live, held by its run's request) and classified kKindElsewhere.
//
// Phases of one step, for group g:
//   A. per rank r: Classify (kernel: validate, dedup, hit / miss / elsewhere, hits' slots),
//      Compact (kernel, exclusive scans) of the distinct hits and misses; then the refusals
//      TpStepPlanner makes, in its order: an invalid selection (the lowest one, named as
//      TpStepPlanner names it), a miss pinned on host by this round's Allocate, a rank
//      whose misses do not fit (the first such rank names the error). Nothing has changed.
//   B. per rank r: Touch of the hits; TakeTargets (kernel_targets.h: free slots, then
//      PB-LRU's victims as bit ranks); MakeDescriptors (kernel); the copies through
//      CopyPublish (copies into free slots, then swaps, each batch waited on); Publish
//      (kernel) of the batches that arrived; host frees and policy inserts of the copies;
//      WriteIndices (kernel) for the misses. A failed batch publishes nothing of itself;
//      the other ranks still step; the first failure is the step's kIo (TpStepPlanner's
//      kIo state, attention at home).
// Refused (kFailedPrecondition): TpAttention::kLocalBuffer (the remote phase is not a kernel
// yet), a space that does not host every rank.
// Threads: KernelStepPlannerOptions::threads sets the OpenMP team of the kernels.
// Thread-safety: as TpStepPlanner (one thread drives a planner).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "step/kernel_runs.h"
#include "step/kernel_step_planner.h"
#include "step/kernel_targets.h"
#include "space/tp_state.h"
#include "ula/selection_run.h"
#include "ula/step_arrays.h"
#include "ula/tp_address_space.h"
#include "ula/tp_step_planner.h"

namespace ula {

class TpKernelStepPlanner {
 public:
  explicit TpKernelStepPlanner(TpAddressSpace& space);
  TpKernelStepPlanner(const TpKernelStepPlanner&) = delete;
  TpKernelStepPlanner& operator=(const TpKernelStepPlanner&) = delete;

  // kInvalidArgument for invalid options: the planner keeps its old ones.
  Status SetOptions(const KernelStepPlannerOptions& options);

  // TpStepPlanner::Step's contract, attention at home, no layer sink.
  Result<TpStepPlan> Step(GroupId group, std::span<const LogicalAddr> selections, std::span<const SelectionRun> runs);

  // The last step's copy descriptors of hosted rank h (copies first, then swaps, each in
  // first-occurrence order); empty after a refused step.
  std::span<const CopyDescriptor> descriptors(std::size_t h) const;

 private:
  struct RankScratch {  // one hosted rank's step scratch, grown only
    std::vector<std::uint8_t> kind;
    std::vector<std::int32_t> slots;
    std::vector<std::uint32_t> hit_first, miss_first, pos, hits, missed, targets;
    std::vector<CopyDescriptor> descriptors;
    std::uint32_t n_free = 0;
    KernelTargetScratch target_scratch;
  };
  // The dedup stamps and first-occurrence scratch of one (rank, group), by home entry.
  struct Stamps {
    std::vector<std::uint32_t> stamp, first;
    std::uint32_t epoch = 0;
  };

  TpAddressSpace& space_;
  KernelStepPlannerOptions options_;
  KernelRuns<TpAddressSpace::State::Holder> runs_;
  std::vector<RankScratch> ranks_;  // [hosted]
  std::vector<Stamps> stamps_;    // [ranks * groups]
};

}  // namespace ula
