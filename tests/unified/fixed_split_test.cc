#include "unified/fixed_split_allocator.h"

#include <gtest/gtest.h>

#include "unified/test_configs.h"

namespace ula {
namespace {

using namespace ula::testing;

TEST(FixedSplit, EachKindUsesOnlyItsOwnPool) {
  auto a = FixedSplitAllocator::Create(TwoKindFixed(24, 0.5)).value();
  EXPECT_EQ(a->pool_blocks(kState), 6u);
  EXPECT_EQ(a->pool_blocks(kKv), 11u);
  auto ids = a->AllocateDemand(RequestDemand(6, 0)).value();
  EXPECT_FALSE(a->CanAllocate(RequestDemand(1, 0)));
  EXPECT_TRUE(a->CanAllocate(RequestDemand(0, 11)));
  EXPECT_FALSE(a->CanAllocate(RequestDemand(0, 12)));
  // The padding page (first slot of the KV pool) is never handed out.
  auto pages = a->AllocateDemand(RequestDemand(0, 11)).value();
  for (auto p : pages) EXPECT_NE(a->Offset(p).value(), 12 * kUnit);
  EXPECT_TRUE(a->CheckInvariants());
  ASSERT_TRUE(a->Free(ids[0]));
  EXPECT_TRUE(a->CanAllocate(RequestDemand(1, 0)));
}

TEST(FixedSplit, BadInputIsAnErrorThatChangesNothing) {
  auto a = FixedSplitAllocator::Create(TwoKindFixed(24, 0.5)).value();
  auto ids = a->AllocateDemand(RequestDemand(2, 2)).value();
  ASSERT_TRUE(a->Free(ids[0]));
  ASSERT_TRUE(a->Pin(ids[1]));
  const Snapshot before = Take(*a);
  EXPECT_EQ(a->Free(ids[0]).error().code(), ErrorCode::kNotFound);
  EXPECT_EQ(a->Free(BlockId(77)).error().code(), ErrorCode::kNotFound);
  EXPECT_EQ(a->Free(ids[1]).error().code(), ErrorCode::kFailedPrecondition);
  EXPECT_EQ(a->Unpin(ids[2]).error().code(), ErrorCode::kFailedPrecondition);
  EXPECT_EQ(a->AllocateDemand(RequestDemand(0, 30)).error().code(), ErrorCode::kResourceExhausted);
  EXPECT_EQ(a->AllocateDemand(RequestDemand(1, 30)).error().code(), ErrorCode::kResourceExhausted);
  EXPECT_EQ(a->AllocateDemand(Demand::Of(1)).error().code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(Take(*a), before);
  EXPECT_TRUE(a->CheckInvariants());
}

TEST(FixedSplit, InvalidConfigNamesTheBadField) {
  auto c = TwoKindFixed(24, 0.5);
  c.fractions = {0.7, 0.7};
  EXPECT_NE(FixedSplitAllocator::Create(c).error().message().find("fractions"), std::string::npos);
  c = TwoKindFixed(24, 0.5);
  c.kinds[0].block_bytes = 0;
  EXPECT_NE(FixedSplitAllocator::Create(c).error().message().find("kinds[0].block_bytes"), std::string::npos);
  c = TwoKindFixed(24, 0.5, 40);
  EXPECT_NE(FixedSplitAllocator::Create(c).error().message().find("padding_blocks"), std::string::npos);
}

}  // namespace
}  // namespace ula
