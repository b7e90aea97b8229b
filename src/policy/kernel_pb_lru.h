// KernelPbLru: PB-LRU (policy/pb_lru.h, the same verbs and the same victims in the same
// order) kept as the step kernels' flat arrays (kernels/step_kernels.h, PbLruArrays) and run
// by those kernels in their OpenMP form. It is the layout the device step holds on a GPU
// (ula/device_step.h loads it from an address space whose policy is kernel_pb_lru), and the
// policy conformance suite runs it like every other policy.
//
// State: R + 2 buckets (ring 0..R, ring[cur] current; cold = R + 1), each [W] level-0 words,
// [S] summary words (bit w: word w non-zero, exactly) and a count; stamps [capacity] (round of
// last use, 0 = untracked); the clock (round, cur, tracked). W = ceil(capacity / 64),
// S = ceil(W / 64).
// Invariants (CheckInvariants): the buckets are pairwise disjoint, their counts are their
// popcounts and sum to tracked; every summary bit says exactly whether its word is non-zero;
// a slot is set in a bucket iff its stamp is non-zero, and the bucket is the one its stamp's
// age names; no bit at or past capacity is set.
// Costs: Touch / Insert one kernel over the slots (atomic word updates); ClaimVictims a scan
// over the (R + 1) * S summary words, then the taken blocks, then a Touch of the victims;
// AdvanceRound one thread plus [S] threads (the reused bucket's non-empty words only).
// Threads: a call over fewer than PolicyOptions::parallel_min_slots slots (Touch's slots,
// ClaimVictims' victims, AdvanceRound's capacity) runs its kernels on a team of one, as the
// other policies run such calls on the calling thread; Insert and Remove (one slot) always
// do. Larger calls use the calling thread's OpenMP team (omp_get_max_threads()).
// Thread-safety: one driver thread.
#pragma once

#include <vector>

#include "kernels/step_kernels.h"
#include "ula/residency_policy.h"

namespace ula::policy {

class KernelPbLru final : public ResidencyPolicy {
 public:
  // REQUIRES: options validated by MakePolicy.
  KernelPbLru(std::uint32_t capacity, const PolicyOptions& options);
  KernelPbLru(const KernelPbLru&) = delete;
  KernelPbLru& operator=(const KernelPbLru&) = delete;

  std::string_view name() const override { return "kernel_pb_lru"; }
  std::uint32_t capacity() const override { return capacity_; }
  void Insert(SlotId slot) noexcept override;
  void Remove(SlotId slot) noexcept override;
  void Touch(std::span<const SlotId> slots) noexcept override;
  std::size_t ClaimVictims(std::span<SlotId> out) noexcept override;
  std::uint64_t NumEvictable() const noexcept override { return clock_.tracked - counts_[clock_.cur]; }
  void AdvanceRound() noexcept override;
  bool IsTracked(SlotId slot) const override { return slot.value() < capacity_ && stamps_[slot.value()] != 0; }
  bool UsedInCurrentRound(SlotId slot) const override { return stamps_[slot.value()] == clock_.round; }
  Status CheckInvariants() const override;
  std::size_t MemoryBytes() const override;
  // PbLru::DebugDigest's value for the same state (the same slots in the same buckets, the
  // same stamps, round and tracked count).
  std::uint64_t DebugDigest() const override;

  // The bucket the slot lives in: 0 = current, a in 1..R, R + 1 = cold, -1 = untracked.
  int AgeOf(SlotId slot) const noexcept;
  std::uint32_t recent_buckets() const { return recent_; }
  // The flat arrays (what the device step copies to the device). Valid until the next
  // non-const call.
  kernels::PbLruArrays arrays() const;
  // Replaces the state with `src`'s (same capacity and R): what a device step reads back.
  // REQUIRES: src's arrays have this policy's shapes.
  void LoadFrom(const kernels::PbLruArrays& src);
  // Rebases the round counter as the wrap after 2^32 rounds does (tests of that wrap).
  void SetRoundForTesting(std::uint32_t round) noexcept;

 private:
  kernels::PbLruArrays mutable_arrays();
  // The OpenMP team of a call over `slots` slots (see "Threads").
  std::uint32_t TeamFor(std::size_t slots) const noexcept;

  std::uint32_t capacity_;
  std::uint32_t recent_;
  std::uint32_t parallel_min_slots_;
  std::uint32_t num_words_, num_summary_;
  std::vector<std::uint64_t> words_;    // [R + 2][W]
  std::vector<std::uint64_t> summary_;  // [R + 2][S]
  std::vector<std::uint64_t> counts_;   // [R + 2]
  std::vector<std::uint32_t> stamps_;   // [capacity]
  kernels::PbLruClock clock_;
  // ClaimVictims scratch.
  std::vector<std::uint32_t> block_counts_, block_offsets_;  // [(R + 1) * S]
  std::vector<std::uint32_t> slots_;                         // [>= largest call]
};

}  // namespace ula::policy
