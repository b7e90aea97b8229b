// ExactLruScan: exact LRU the way GPU systems usually keep it — a round stamp per slot,
// written by every use (a data-parallel store), and a scan over all stamps for the oldest
// when victims are needed.
//
// Victim choice: two passes over the stamp array. Pass 1 builds a histogram of ages
// (round_ - stamp, the last bin collecting every age >= kAgeBins - 1) and finds the
// youngest age that must be taken; pass 2 collects the slots at least that old, which are
// then sorted by (stamp, slot). Victims are returned oldest round first, lowest slot first
// within a round — exact LRU at round granularity.
//
// Invariants: stamp_[s] == kUntracked iff s is untracked; used_this_round_ == number of
// slots with stamp round_; tracked_ == number of tracked slots.
// Metadata: 4 B per slot. Touch of a batch >= PolicyOptions::parallel_min_slots is split
// over OpenMP threads (relaxed atomic exchange of the stamp; a reduction of the count).
// Thread-safety: none for callers.
#pragma once

#include <vector>

#include "policy/fork_join.h"
#include "ula/residency_policy.h"

namespace ula::policy {

class ExactLruScan final : public ResidencyPolicy {
 public:
  ExactLruScan(std::uint32_t capacity, const PolicyOptions& options);

  std::string_view name() const override { return "exact_lru_scan"; }
  std::uint32_t capacity() const override { return capacity_; }
  void Insert(SlotId slot) noexcept override;
  void Remove(SlotId slot) noexcept override;
  void Touch(std::span<const SlotId> slots) noexcept override;
  std::size_t ClaimVictims(std::span<SlotId> out) noexcept override;
  std::uint64_t NumEvictable() const noexcept override { return tracked_ - used_this_round_; }
  void AdvanceRound() noexcept override;
  bool IsTracked(SlotId slot) const override { return stamp_[slot.value()] != kUntracked; }
  bool UsedInCurrentRound(SlotId slot) const override { return stamp_[slot.value()] == round_; }
  Status CheckInvariants() const override;
  std::size_t MemoryBytes() const override;
  std::uint64_t DebugDigest() const override;

 private:
  static constexpr std::uint32_t kUntracked = 0;  // rounds start at 1
  static constexpr std::uint32_t kAgeBins = 256;

  ForkJoin fork_join_;  // first: sizes fresh_
  std::uint32_t capacity_;
  std::uint32_t parallel_min_slots_;
  std::vector<std::uint32_t> stamp_;       // [capacity] round of last use; kUntracked if free
  std::vector<std::uint64_t> fresh_;       // [threads] Touch scratch: newly used slots per thread
  std::vector<std::uint64_t> candidates_;  // scratch: (stamp << 32 | slot) of old slots
  std::uint32_t round_ = 1;
  std::uint64_t tracked_ = 0;
  std::uint64_t used_this_round_ = 0;
};

}  // namespace ula::policy
