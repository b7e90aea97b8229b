// LfuAged: a frequency-aware policy with aging (LFU with periodic halving, the "reset" of
// TinyLFU, Einziger et al., ACM TOS 2017). Heavy-hitter entries — selected again and again,
// with gaps — outlive entries selected once, which recency alone cannot tell apart.
//
// Per slot: the round of its last use (4 B) and a use count (1 B, saturating at 255). The
// first use of a slot in a round adds one to its count (Insert counts as a use). Every
// `lfu_aging_rounds` rounds every count is halved (rounded down), so a count measures
// recent frequency. Victims: lowest count first, then oldest last use, then lowest slot —
// never a slot used in the current round.
//
// Invariants: stamp_[s] == kUntracked iff s is untracked (then count_[s] == 0);
// used_this_round_ == slots with stamp round_; tracked_ == tracked slots.
// Costs: Insert/Touch/Remove O(1); ClaimVictims O(capacity + n log n) (one scan of the
// evictable slots, a partial selection of the n smallest keys); AdvanceRound O(capacity)
// every lfu_aging_rounds rounds, else O(1). Metadata: 5 B per slot.
// Thread-safety: none.
#pragma once

#include <vector>

#include "ula/residency_policy.h"

namespace ula::policy {

class LfuAged final : public ResidencyPolicy {
 public:
  LfuAged(std::uint32_t capacity, const PolicyOptions& options);

  std::string_view name() const override { return "lfu_aged"; }
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

  void Use(std::uint32_t s);

  std::uint32_t capacity_;
  std::uint32_t aging_rounds_;
  std::vector<std::uint32_t> stamp_;  // [capacity] round of last use; kUntracked if free
  std::vector<std::uint8_t> count_;   // [capacity] aged use count
  std::vector<std::uint64_t> keys_;   // scratch: (count << 56 | age-inverted stamp << 24 ...) see .cc
  std::uint32_t round_ = 1;
  std::uint64_t tracked_ = 0;
  std::uint64_t used_this_round_ = 0;
};

}  // namespace ula::policy
