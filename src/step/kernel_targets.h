// The device slots of a step's misses as the kernels take them, shared by KernelStepPlanner
// (DP) and TpKernelStepPlanner (TP at home, per rank): the lowest free slots of the device
// pool (SlotPool's order: lowest first), then, with PB-LRU, the slots of its victim buckets
// (PbLru::VictimBuckets: cold, oldest to newest, never the current one; ClaimVictims' order)
// as the ranks of set bits (kernels::TakeLowest through each bitmap's first summary level).
// The pool and the policy are then told: Allocate for the free ones, Touch for the victims
// (the state ClaimVictims leaves). Another policy's victims are claimed on the host.
// Thread-safety: the caller's (one planner thread); the kernels run on its OpenMP team.
#pragma once

#include <cstdint>
#include <vector>

#include "backend/slot_pool.h"
#include "ula/residency_policy.h"

namespace ula {

// Scratch of TakeTargets, grown only.
struct KernelTargetScratch {
  std::vector<std::uint32_t> word_counts, word_offsets;
  std::vector<const std::uint64_t*> bucket_words, bucket_summaries;
  std::vector<std::uint64_t> bucket_counts;
};

// targets[0, n_miss): free slots first, then victims. Returns how many were free.
// REQUIRES: n_miss <= device.num_free() + policy.NumEvictable() (the step's room check).
std::uint32_t TakeTargets(SlotPool& device, ResidencyPolicy& policy, std::uint32_t n_miss, KernelTargetScratch& scratch,
                          std::vector<std::uint32_t>& targets);

}  // namespace ula
