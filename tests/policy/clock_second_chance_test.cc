// CLOCK's second chance (src/policy/clock.h): the hand clears the reference bit of a slot
// used in an earlier round and passes it, taking the next unreferenced slot instead.
#include <gtest/gtest.h>

#include <vector>

#include "policy/clock.h"

namespace ula::policy {
namespace {

TEST(Clock, AReferencedSlotGetsASecondChance) {
  Clock c(4);
  for (std::uint32_t s = 0; s < 4; ++s) c.Insert(SlotId(s));  // round 0: every bit set
  c.AdvanceRound();
  // One sweep clears every bit, the hand comes back to slot 0 and takes it.
  std::vector<SlotId> v(1);
  ASSERT_EQ(c.ClaimVictims(v), 1u);
  EXPECT_EQ(v[0], SlotId(0));
  // Slot 1 is used again (its bit set) in this round; in the next round the hand, now at
  // slot 1, must pass it (clearing the bit) and take slot 2, whose bit is clear.
  const std::vector<SlotId> touch{SlotId(1)};
  c.Touch(touch);
  c.AdvanceRound();
  ASSERT_EQ(c.ClaimVictims(v), 1u);
  EXPECT_EQ(v[0], SlotId(2)) << "slot 1 was referenced and should have had a second chance";
  // The hand goes on to slot 3, whose bit the first sweep cleared.
  c.AdvanceRound();
  ASSERT_EQ(c.ClaimVictims(v), 1u);
  EXPECT_EQ(v[0], SlotId(3));
  ASSERT_TRUE(c.CheckInvariants()) << c.CheckInvariants().error().ToString();
}

}  // namespace
}  // namespace ula::policy
