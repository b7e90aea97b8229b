// KernelStepPlanner: StepPlanner's step (ula/step_planner.h, its contract word for word)
// with its per-selection phases run as the step's data-parallel kernels (src/kernels), in
// their OpenMP form. It is the kernels' differential harness against the CPU
// reference planner: on the same state and inputs both return the same result, stats and
// out_slots, publish the same tables and leave the same state (DebugDigest), whatever the
// thread count.
//
// Phases (src/kernels/step_kernels.inl has each kernel's arrays and atomics):
//   1-3. Classify (kernel): validate, dedup by the stamp CAS + a first-occurrence minimum,
//        hits' slots to out_slots; the first invalid selection is a reduction. Compact
//        (kernel, exclusive scan): the distinct hits and misses in first-occurrence order.
//   room  the CPU planner's check, on the host (counts only).
//   touch the policy's Touch of the hits (host: PB-LRU's bucket words are not written by the
//        kernels yet).
//   4.   TakeLowest (kernel, a scan through the bitmaps' first summary level): the device
//        slots of the misses as the lowest set bits of the free bitmap (free slots first, lowest first: SlotPool's order), then — with PB-LRU
//        — of its victim buckets (PbLru::VictimBuckets: cold, oldest to newest, never the
//        current one). The pool and the policy are then told (Allocate, Touch of the
//        victims: the state ClaimVictims leaves). Other policies claim victims on the host.
//   5.   MakeDescriptors (kernel): the step's CopyDescriptors (step_arrays.h), copies first;
//        the backend batches are built from them; after both fences, Publish (kernel) writes
//        the locations of the batches that completed; pool frees and policy inserts of the
//        copied entries follow on the host, in descriptor order.
//   6.   WriteIndices (kernel): the misses' selections read their published slots.
// Threads: KernelStepPlannerOptions::threads sets the OpenMP team of the calling thread for
// the step's kernels (restored after).
// Thread-safety: as StepPlanner.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "space/address_space_state.h"
#include "step/kernel_runs.h"
#include "step/kernel_targets.h"
#include "ula/address_space.h"
#include "ula/step_arrays.h"
#include "ula/step_planner.h"

namespace ula {

struct KernelStepPlannerOptions {
  static constexpr std::uint32_t kMaxThreads = 64;
  std::uint32_t threads = 1;  // [1, kMaxThreads]: the OpenMP team of the kernels
  // kInvalidArgument naming the first bad field.
  Status Validate() const;
};

class KernelStepPlanner {
 public:
  explicit KernelStepPlanner(AddressSpace& space);
  KernelStepPlanner(const KernelStepPlanner&) = delete;
  KernelStepPlanner& operator=(const KernelStepPlanner&) = delete;

  // kInvalidArgument for invalid options: the planner keeps its old ones.
  Status SetOptions(const KernelStepPlannerOptions& options);
  const KernelStepPlannerOptions& options() const { return options_; }

  // StepPlanner::Step's contract (same errors, same state after each).
  Result<StepStats> Step(const StepInput& input, std::span<SlotId> out_slots);

  // The last step's copy descriptors ([misses], copies into free slots first, then swaps,
  // each in first-occurrence order of its address); empty after a refused step.
  std::span<const CopyDescriptor> descriptors() const { return descriptors_; }

 private:
  AddressSpace& space_;
  KernelStepPlannerOptions options_;
  // Step scratch, grown only.
  KernelRuns<RequestState> runs_;
  std::vector<std::uint32_t> first_;                 // [table size]
  std::vector<std::uint8_t> kind_;                   // [selections]
  std::vector<std::uint32_t> hit_first_, miss_first_, pos_;  // [selections]
  std::vector<std::uint32_t> hits_, missed_, targets_;       // [distinct]
  KernelTargetScratch target_scratch_;
  std::vector<CopyDescriptor> descriptors_;
};

}  // namespace ula
