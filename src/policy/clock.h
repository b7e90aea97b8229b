// Clock: the second-chance CLOCK policy. Slots sit on a circle in index order; a hand
// sweeps it. A use sets the slot's reference bit; the hand clears the bit of a referenced
// slot and passes it, and takes the first tracked slot whose bit is clear and that was not
// used in the current round.
//
// Invariants: stamp_[s] == kUntracked iff s is untracked, and then its reference bit is
// clear; used_this_round_ == slots with stamp round_; tracked_ == tracked slots;
// hand_ < capacity (or 0 when capacity is 0).
// Costs: Insert/Touch/Remove O(1); ClaimVictims O(slots swept), at most two sweeps of the
// circle per victim. Metadata: 4 B stamp + 1 reference bit per slot.
// Thread-safety: none.
#pragma once

#include <vector>

#include "ula/residency_policy.h"

namespace ula::policy {

class Clock final : public ResidencyPolicy {
 public:
  explicit Clock(std::uint32_t capacity);

  std::string_view name() const override { return "clock"; }
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

  bool Referenced(std::uint32_t s) const { return (ref_[s >> 6] >> (s & 63)) & 1; }
  void SetReferenced(std::uint32_t s) { ref_[s >> 6] |= std::uint64_t{1} << (s & 63); }
  void ClearReferenced(std::uint32_t s) { ref_[s >> 6] &= ~(std::uint64_t{1} << (s & 63)); }
  void MarkUsed(std::uint32_t s);

  std::uint32_t capacity_;
  std::vector<std::uint32_t> stamp_;  // [capacity] round of last use; kUntracked if free
  std::vector<std::uint64_t> ref_;    // [ceil(capacity / 64)] reference bits
  std::uint32_t hand_ = 0;
  std::uint32_t round_ = 1;
  std::uint64_t tracked_ = 0;
  std::uint64_t used_this_round_ = 0;
};

}  // namespace ula::policy
