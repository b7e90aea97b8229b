// LfuAged: frequency first, then recency; counts halve every lfu_aging_rounds rounds.
#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

#include "ula/residency_policy.h"

namespace ula {
namespace {

std::unique_ptr<ResidencyPolicy> Make(std::uint32_t capacity, std::uint32_t aging) {
  auto p = MakePolicy(PolicyKind::kLfuAged, capacity, PolicyOptions{.lfu_aging_rounds = aging});
  EXPECT_TRUE(p);
  return std::move(*p);
}

std::vector<std::uint32_t> Claim(ResidencyPolicy& p, std::size_t n) {
  std::vector<SlotId> out(n);
  out.resize(p.ClaimVictims(out));
  std::vector<std::uint32_t> v;
  for (SlotId s : out) v.push_back(s.value());
  return v;
}

TEST(LfuAged, AFrequentOldSlotOutlivesARecentSlotUsedOnce) {
  auto p = Make(4, 0);  // no aging
  for (std::uint32_t s = 0; s < 2; ++s) p->Insert(SlotId(s));
  for (int round = 0; round < 5; ++round) {  // slot 0 used in 5 more rounds, slot 1 never again
    p->AdvanceRound();
    const SlotId zero(0);
    p->Touch({&zero, 1});
  }
  p->AdvanceRound();
  p->AdvanceRound();
  p->Insert(SlotId(2));  // newest, used once
  p->AdvanceRound();
  // Slot 1 (count 1, oldest) first, then slot 2 (count 1, newer), slot 0 (count 6) last.
  EXPECT_EQ(Claim(*p, 3), (std::vector<std::uint32_t>{1, 2, 0}));
  EXPECT_TRUE(p->CheckInvariants());
}

// Equal counts go least recently used first, whatever the slot index: slot 3 (used two
// rounds ago) before slot 1 (last round), both used once.
TEST(LfuAged, EqualCountsGoLeastRecentFirstNotByIndex) {
  auto p = Make(4, 0);
  p->Insert(SlotId(3));
  p->AdvanceRound();
  p->Insert(SlotId(1));
  p->AdvanceRound();
  EXPECT_EQ(Claim(*p, 2), (std::vector<std::uint32_t>{3, 1}));
  EXPECT_TRUE(p->CheckInvariants());
}

TEST(LfuAged, AgingHalvesCountsSoOldFameFades) {
  auto p = Make(4, 4);
  p->Insert(SlotId(0));
  const SlotId zero(0);
  for (int round = 0; round < 20; ++round) {  // slot 0 used in 20 rounds in a row
    p->AdvanceRound();
    p->Touch({&zero, 1});
  }
  for (int round = 0; round < 40; ++round) p->AdvanceRound();  // ten aging periods idle: count 0
  p->Insert(SlotId(1));  // used once, just now
  p->AdvanceRound();
  // Without aging slot 0 (21 uses) would outlive slot 1 (1 use); with it, old fame is gone.
  EXPECT_EQ(Claim(*p, 1), (std::vector<std::uint32_t>{0}));
}

}  // namespace
}  // namespace ula
