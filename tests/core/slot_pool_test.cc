#include "backend/slot_pool.h"

#include <gtest/gtest.h>

#include "core/address_records.h"

namespace ula {
namespace {

Arena FakeArena(std::uint64_t bytes) { return Arena{ArenaId(0), Tier::kDevice, Rank(0), bytes, nullptr}; }

TEST(SlotPool, AllocatesLowestFreeSlotAndRefusesWhenFull) {
  auto pool = SlotPool::Create(FakeArena(4 * 16), 16, 4);
  ASSERT_TRUE(pool);
  for (std::uint32_t i = 0; i < 4; ++i) EXPECT_EQ(pool->Allocate().value(), SlotId(i));
  auto full = pool->Allocate();
  ASSERT_FALSE(full);
  EXPECT_EQ(full.error().code(), ErrorCode::kResourceExhausted);
  ASSERT_TRUE(pool->Free(SlotId(2)));
  EXPECT_EQ(pool->Allocate().value(), SlotId(2));
  EXPECT_TRUE(pool->CheckInvariants());
}

TEST(SlotPool, BadFreesAreErrorsThatChangeNothing) {
  auto pool = SlotPool::Create(FakeArena(64), 16, 4);
  ASSERT_TRUE(pool);
  ASSERT_TRUE(pool->Allocate());
  const auto free_before = pool->num_free();
  auto out_of_range = pool->Free(SlotId(4));
  ASSERT_FALSE(out_of_range);
  EXPECT_EQ(out_of_range.error().code(), ErrorCode::kOutOfRange);
  auto double_free = pool->Free(SlotId(1));
  ASSERT_FALSE(double_free);
  EXPECT_EQ(double_free.error().code(), ErrorCode::kFailedPrecondition);
  EXPECT_EQ(pool->num_free(), free_before);
  EXPECT_TRUE(pool->IsAllocated(SlotId(0)));
}

TEST(SlotPool, RejectsAnArenaTooSmallForItsSlots) {
  auto pool = SlotPool::Create(FakeArena(63), 16, 4);
  ASSERT_FALSE(pool);
  EXPECT_EQ(pool.error().code(), ErrorCode::kInvalidArgument);
}

}  // namespace
}  // namespace ula
