// Victim order of the policies that promise one, on hand-built histories where a policy
// without the promised rule picks other victims:
//   - CLOCK gives a referenced slot a second chance (the hand clears its bit and passes);
//   - the exact LRU list orders uses within one round by the order of the calls.
#include <gtest/gtest.h>

#include <vector>

#include "ula/residency_policy.h"

namespace ula {
namespace {

std::vector<std::uint32_t> Claim(ResidencyPolicy& p, std::size_t n) {
  std::vector<SlotId> out(n);
  out.resize(p.ClaimVictims(out));
  std::vector<std::uint32_t> v;
  for (SlotId s : out) v.push_back(s.value());
  return v;
}

TEST(ClockOrder, AReferencedSlotGetsASecondChance) {
  auto p = MakePolicy(PolicyKind::kClock, 4).value();
  for (std::uint32_t s = 0; s < 4; ++s) p->Insert(SlotId(s));  // all referenced
  p->AdvanceRound();
  // Every bit is set: the hand clears all four, comes round, and takes slot 0.
  EXPECT_EQ(Claim(*p, 1), (std::vector<std::uint32_t>{0}));
  p->AdvanceRound();
  const SlotId two(2);
  p->Touch(std::span(&two, 1));  // slot 2 referenced again; 1 and 3 are not
  p->AdvanceRound();
  // The hand stands at 1: takes 1, passes 2 (clearing its bit: second chance), takes 3.
  EXPECT_EQ(Claim(*p, 2), (std::vector<std::uint32_t>{1, 3}));
  p->AdvanceRound();
  // Round again: 0 and 1 were referenced by their claims and lose their bits; 2 has none left.
  EXPECT_EQ(Claim(*p, 1), (std::vector<std::uint32_t>{2}));
  EXPECT_TRUE(p->CheckInvariants());
}

TEST(ExactLruListOrder, UsesWithinOneRoundKeepTheirCallOrder) {
  auto p = MakePolicy(PolicyKind::kExactLruList, 5).value();
  for (std::uint32_t s = 0; s < 5; ++s) p->Insert(SlotId(s));
  p->AdvanceRound();
  for (std::uint32_t s : {2u, 0u, 4u, 3u, 1u}) {  // one round, five calls
    const SlotId slot(s);
    p->Touch(std::span(&slot, 1));
  }
  p->AdvanceRound();
  EXPECT_EQ(Claim(*p, 5), (std::vector<std::uint32_t>{2, 0, 4, 3, 1}));
  p->AdvanceRound();
  // A batch Touch keeps its order too (1 before 3: the reverse of the list's order, so
  // a batch applied in any other order or not at all gives another result), and an older
  // round still goes first.
  const std::vector<SlotId> batch{SlotId(1), SlotId(3)};
  p->Touch(batch);
  p->AdvanceRound();
  EXPECT_EQ(Claim(*p, 5), (std::vector<std::uint32_t>{2, 0, 4, 1, 3}));
  EXPECT_TRUE(p->CheckInvariants());
}

}  // namespace
}  // namespace ula
