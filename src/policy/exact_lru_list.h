// ExactLruList: exact LRU as an intrusive doubly linked list over slot indices — the best a
// CPU can do: O(1) touch, O(1) victim. Order: head = least recently used.
//
// Invariants: the list holds exactly the tracked slots; every slot used in the current
// round sits in the MRU suffix of the list (a touch moves a slot to the tail), so victims
// are taken from the head until the first current-round slot.
// Metadata: prev + next (4 B each) + round stamp (4 B) per slot.
#pragma once

#include <vector>

#include "ula/residency_policy.h"

namespace ula::policy {

class ExactLruList final : public ResidencyPolicy {
 public:
  explicit ExactLruList(std::uint32_t capacity);

  std::string_view name() const override { return "exact_lru_list"; }
  std::uint32_t capacity() const override { return capacity_; }
  void Insert(SlotId slot) override;
  void Remove(SlotId slot) override;
  void Touch(std::span<const SlotId> slots) override;
  std::size_t ClaimVictims(std::span<SlotId> out) override;
  std::uint64_t NumEvictable() const override { return tracked_ - used_this_round_; }
  void AdvanceRound() override;
  bool IsTracked(SlotId slot) const override { return stamp_[slot.value()] != kUntracked; }
  bool UsedInCurrentRound(SlotId slot) const override { return stamp_[slot.value()] == round_; }
  Status CheckInvariants() const override;
  std::size_t MemoryBytes() const override;
  std::uint64_t DebugDigest() const override;

 private:
  static constexpr std::uint32_t kNil = ~std::uint32_t{0};
  static constexpr std::uint32_t kUntracked = 0;  // rounds start at 1

  void Unlink(std::uint32_t s);
  void PushBack(std::uint32_t s);
  void MarkUsed(std::uint32_t s);

  std::uint32_t capacity_;
  std::vector<std::uint32_t> prev_, next_;  // [capacity] list links, kNil at the ends
  std::vector<std::uint32_t> stamp_;        // [capacity] round of last use; kUntracked if free
  std::uint32_t head_ = kNil, tail_ = kNil;
  std::uint32_t round_ = 1;
  std::uint64_t tracked_ = 0;
  std::uint64_t used_this_round_ = 0;
};

}  // namespace ula::policy
