#include "ula/unified_buffer.h"

#include <gtest/gtest.h>

#include <cstring>

#include "unified/test_configs.h"

namespace ula {
namespace {

using namespace ula::testing;

std::unique_ptr<UnifiedBuffer> Make(const UnifiedBufferConfig& c) {
  auto b = UnifiedBuffer::Create(c);
  EXPECT_TRUE(b) << (b ? "" : b.error().ToString());
  return std::move(b).value();
}

TEST(UnifiedBuffer, TwentyFourUnitExampleSharedAdmitsSevenFixedSplitAdmitsFour) {
  // 24 units; each request: 2 units of state + 1 unit of KV; one unit is the padding page.
  const Demand request = RequestDemand(1, 1);
  auto fixed = FixedSplitAllocator::Create(TwoKindFixed(24, 8.0 / 24.0));
  ASSERT_TRUE(fixed);
  EXPECT_EQ((*fixed)->pool_blocks(kState), 4u);
  EXPECT_EQ((*fixed)->pool_blocks(kKv), 15u);
  EXPECT_EQ(AdmitUntilFull(**fixed, request), 4);

  auto shared = Make(TwoKindConfig(24));
  EXPECT_EQ(AdmitUntilFull(*shared, request), 7);
  EXPECT_EQ(shared->Stats().live_bytes, 21 * kUnit);
  EXPECT_TRUE(shared->CheckInvariants());
}

TEST(UnifiedBuffer, WithoutAPaddingPageTheSharedBufferFillsAllTwentyFourUnits) {
  // The padding page is what makes the example 7, not 8: document it.
  auto shared = Make(TwoKindConfig(24, /*padding_pages=*/0));
  EXPECT_EQ(AdmitUntilFull(*shared, RequestDemand(1, 1)), 8);
  EXPECT_EQ(shared->Stats().live_bytes, 24 * kUnit);
}

TEST(UnifiedBuffer, LongContextsExhaustKvUnderAFixedSplitButNotWhenShared) {
  // 48 units, each request: 2 units of state + 12 KV pages.
  const Demand request = RequestDemand(1, 12);
  auto fixed = FixedSplitAllocator::Create(TwoKindFixed(48, 16.0 / 48.0));
  ASSERT_TRUE(fixed);
  EXPECT_EQ(AdmitUntilFull(**fixed, request), 2);
  // KV ran out while most of the state pool sits idle.
  const auto fs = (*fixed)->Stats();
  EXPECT_EQ(fs.live_blocks_per_kind[kState.value()], 2u);
  EXPECT_EQ((*fixed)->pool_blocks(kState), 8u);

  auto shared = Make(TwoKindConfig(48));
  EXPECT_EQ(AdmitUntilFull(*shared, request), 3);
}

TEST(UnifiedBuffer, StateGrowsFromTheLowEndAndKvFromTheHighEnd) {
  auto b = Make(TwoKindConfig(24));
  auto s0 = b->Allocate(kState).value();
  auto s1 = b->Allocate(kState).value();
  auto p0 = b->Allocate(kKv).value();
  auto p1 = b->Allocate(kKv).value();
  EXPECT_EQ(b->Offset(s0).value(), 0u);
  EXPECT_EQ(b->Offset(s1).value(), 2 * kUnit);
  EXPECT_EQ(b->padding_offset(), 23 * kUnit);
  EXPECT_EQ(b->Offset(p0).value(), 22 * kUnit);
  EXPECT_EQ(b->Offset(p1).value(), 21 * kUnit);
  EXPECT_EQ(b->Stats().middle_bytes, (23 - 6) * kUnit);
}

TEST(UnifiedBuffer, FreedBlockAtTheEdgeOfTheMiddleReturnsToIt) {
  auto b = Make(TwoKindConfig(24));
  auto s0 = b->Allocate(kState).value();
  auto s1 = b->Allocate(kState).value();
  ASSERT_TRUE(b->Free(s1));
  EXPECT_EQ(b->Stats().hole_bytes, 0u);
  EXPECT_EQ(b->Stats().middle_bytes, (23 - 2) * kUnit);
  ASSERT_TRUE(b->Free(s0));
  EXPECT_EQ(b->Stats().middle_bytes, 23 * kUnit);
}

TEST(UnifiedBuffer, AllocationFillsAHoleBeforeTakingTheMiddle) {
  auto b = Make(TwoKindConfig(24));
  std::vector<BlockId> s;
  for (int i = 0; i < 3; ++i) s.push_back(b->Allocate(kState).value());
  ASSERT_TRUE(b->Free(s[0]));
  EXPECT_EQ(b->Stats().hole_bytes, 2 * kUnit);
  auto again = b->Allocate(kState).value();
  EXPECT_EQ(b->Offset(again).value(), 0u);
  EXPECT_EQ(b->Stats().hole_bytes, 0u);
}

TEST(UnifiedBuffer, LazyCompactionMovesALiveBlockIntoTheHoleAndOnlyItsTableEntryChanges) {
  auto b = Make(TwoKindConfig(24));
  std::vector<BlockId> s;
  for (int i = 0; i < 4; ++i) {
    s.push_back(b->Allocate(kState).value());
    auto bytes = b->Bytes(s.back()).value();
    std::memset(bytes.data(), 0x10 + i, bytes.size());
  }
  // KV fills the rest of the middle: 23 - 8 = 15 pages.
  std::vector<BlockId> pages = b->AllocateDemand(RequestDemand(0, 15)).value();
  ASSERT_TRUE(b->Free(s[1]));  // a 2-unit hole between live states
  EXPECT_EQ(b->Stats().hole_bytes, 2 * kUnit);
  EXPECT_EQ(b->Stats().middle_bytes, 0u);
  EXPECT_EQ(b->Stats().bytes_moved, 0u);  // lazy: nothing moved at free
  // Two KV pages need the hole: only compaction can turn it into middle space.
  ASSERT_TRUE(b->CanAllocate(RequestDemand(0, 2)));
  auto more = b->AllocateDemand(RequestDemand(0, 2));
  ASSERT_TRUE(more);
  EXPECT_EQ(b->Stats().bytes_moved, 2 * kUnit);
  EXPECT_EQ(b->Offset(s[3]).value(), 2 * kUnit);  // the outermost state moved into the hole
  auto moved = b->Bytes(s[3]).value();
  for (auto byte : moved) ASSERT_EQ(byte, std::byte{0x13});
  EXPECT_EQ(b->Offset(s[0]).value(), 0u);
  EXPECT_TRUE(b->CheckInvariants());
}

TEST(UnifiedBuffer, EagerCompactionFillsTheHoleAtFree) {
  auto b = Make(TwoKindConfig(24, 1, CompactionMode::kEager));
  std::vector<BlockId> s;
  for (int i = 0; i < 3; ++i) s.push_back(b->Allocate(kState).value());
  ASSERT_TRUE(b->Free(s[0]));
  EXPECT_EQ(b->Stats().hole_bytes, 0u);
  EXPECT_EQ(b->Offset(s[2]).value(), 0u);
  EXPECT_EQ(b->Stats().bytes_moved, 2 * kUnit);
}

// Eager compaction also runs when the last pin of a block goes: the hole a pinned block
// kept open is filled at the Unpin, not at the next allocation.
TEST(UnifiedBuffer, EagerCompactionFillsTheHoleAtTheLastUnpin) {
  auto b = Make(TwoKindConfig(24, 1, CompactionMode::kEager));
  std::vector<BlockId> s;
  for (int i = 0; i < 3; ++i) s.push_back(b->Allocate(kState).value());
  ASSERT_TRUE(b->Pin(s[2]));
  ASSERT_TRUE(b->Pin(s[2]));
  ASSERT_TRUE(b->Free(s[0]));  // the pinned outermost block cannot move into the hole
  EXPECT_EQ(b->Stats().hole_bytes, 2 * kUnit);
  ASSERT_TRUE(b->Unpin(s[2]));  // still pinned once
  EXPECT_EQ(b->Stats().hole_bytes, 2 * kUnit);
  EXPECT_EQ(b->Stats().bytes_moved, 0u);
  ASSERT_TRUE(b->Unpin(s[2]));
  EXPECT_EQ(b->Stats().hole_bytes, 0u);
  EXPECT_EQ(b->Offset(s[2]).value(), 0u);
  EXPECT_EQ(b->Stats().bytes_moved, 2 * kUnit);
  EXPECT_TRUE(b->CheckInvariants());
}

TEST(UnifiedBuffer, APinnedBlockIsNeverMovedAndItsHoleIsNotCountedAsRecoverable) {
  auto b = Make(TwoKindConfig(24));
  std::vector<BlockId> s;
  for (int i = 0; i < 3; ++i) s.push_back(b->Allocate(kState).value());
  b->AllocateDemand(RequestDemand(0, 17)).value();  // middle now 0
  ASSERT_TRUE(b->Pin(s[2]));
  ASSERT_TRUE(b->Free(s[0]));
  const auto offset = b->Offset(s[2]).value();
  // The hole (2 units) can take a state block in place but cannot become KV space: the
  // pinned outermost state cannot move into it.
  EXPECT_FALSE(b->CanAllocate(RequestDemand(0, 1)));
  EXPECT_FALSE(b->AllocateDemand(RequestDemand(0, 1)));
  EXPECT_EQ(b->Compact(), 0u);
  EXPECT_EQ(b->Offset(s[2]).value(), offset);
  EXPECT_TRUE(b->CanAllocate(RequestDemand(1, 0)));
  // Pins are counted.
  ASSERT_TRUE(b->Pin(s[2]));
  ASSERT_TRUE(b->Unpin(s[2]));
  EXPECT_EQ(b->Compact(), 0u);
  ASSERT_TRUE(b->Unpin(s[2]));
  EXPECT_TRUE(b->CanAllocate(RequestDemand(0, 2)));
  EXPECT_EQ(b->Compact(), 2 * kUnit);
  EXPECT_EQ(b->Offset(s[2]).value(), 0u);
}

TEST(UnifiedBuffer, CanAllocateAgreesWithAllocateOnAMixedDemand) {
  auto b = Make(TwoKindConfig(32));
  std::vector<BlockId> s;
  for (int i = 0; i < 6; ++i) s.push_back(b->Allocate(kState).value());
  b->AllocateDemand(RequestDemand(0, 12)).value();  // middle: 31 - 24 = 7 units
  ASSERT_TRUE(b->Free(s[1]));
  ASSERT_TRUE(b->Free(s[3]));  // holes: 4 units, middle 7
  EXPECT_TRUE(b->CanAllocate(RequestDemand(2, 7)));    // 2 states in holes, 7 pages in middle
  EXPECT_TRUE(b->CanAllocate(RequestDemand(0, 11)));   // needs compaction
  EXPECT_FALSE(b->CanAllocate(RequestDemand(0, 12)));  // more than all free bytes
  EXPECT_FALSE(b->CanAllocate(RequestDemand(6, 0)));
  EXPECT_TRUE(b->AllocateDemand(RequestDemand(0, 11)));
  EXPECT_EQ(b->Stats().middle_bytes + b->Stats().hole_bytes, 0u);
}

// Translate against the layout rules (states up from 0, pages down from the padding page),
// not against Offset (the same lookup), and again after a compaction moved a block: the
// bytes at base() + offset are the block's own.
TEST(UnifiedBuffer, TranslateReturnsEveryOffsetOfABatch) {
  auto b = Make(TwoKindConfig(24));
  auto ids = b->AllocateDemand(RequestDemand(3, 4)).value();  // states, then pages
  ASSERT_EQ(ids.size(), 7u);
  std::vector<std::uint64_t> offsets(ids.size());
  ASSERT_TRUE(b->Translate(ids, offsets));
  EXPECT_EQ(offsets, (std::vector<std::uint64_t>{0, 2 * kUnit, 4 * kUnit, 22 * kUnit, 21 * kUnit, 20 * kUnit,
                                                  19 * kUnit}));
  for (std::size_t i = 0; i < ids.size(); ++i) {
    auto bytes = b->Bytes(ids[i]).value();
    std::memset(bytes.data(), 0x20 + static_cast<int>(i), bytes.size());
  }
  ASSERT_TRUE(b->Free(ids[1]));  // a hole between the states
  b->Compact();                  // the outermost state moves into it
  const std::vector<BlockId> live{ids[0], ids[2], ids[3], ids[6]};
  std::vector<std::uint64_t> after(live.size());
  ASSERT_TRUE(b->Translate(live, after));
  EXPECT_EQ(after, (std::vector<std::uint64_t>{0, 2 * kUnit, 22 * kUnit, 19 * kUnit}));
  const int fill[] = {0x20, 0x22, 0x23, 0x26};
  for (std::size_t i = 0; i < live.size(); ++i) {
    const std::byte* p = b->base() + after[i];
    for (std::uint64_t k = 0; k < b->kind_config(b->KindOf(live[i]).value()).block_bytes; ++k) {
      ASSERT_EQ(p[k], std::byte(fill[i])) << "block " << i << " byte " << k;
    }
  }
}

TEST(UnifiedBuffer, BadInputIsAnErrorThatChangesNothing) {
  auto b = Make(TwoKindConfig(24));
  auto ids = b->AllocateDemand(RequestDemand(2, 3)).value();
  ASSERT_TRUE(b->Free(ids[0]));
  ASSERT_TRUE(b->Pin(ids[1]));
  const Snapshot before = Take(*b);

  auto expect_error = [&](auto result, ErrorCode code) {
    ASSERT_FALSE(result);
    EXPECT_EQ(result.error().code(), code) << result.error().ToString();
    EXPECT_EQ(Take(*b), before);
    EXPECT_TRUE(b->CheckInvariants());
  };
  expect_error(b->Free(BlockId(999)), ErrorCode::kNotFound);             // unknown id
  expect_error(b->Free(BlockId::Invalid()), ErrorCode::kNotFound);
  expect_error(b->Free(ids[0]), ErrorCode::kNotFound);                   // double free
  expect_error(b->Pin(ids[0]), ErrorCode::kNotFound);                    // freed id
  expect_error(b->Unpin(ids[2]), ErrorCode::kFailedPrecondition);        // unpin without pin
  expect_error(b->Free(ids[1]), ErrorCode::kFailedPrecondition);         // pinned
  expect_error(b->AllocateDemand(RequestDemand(0, 24)), ErrorCode::kResourceExhausted);  // larger than the buffer
  expect_error(b->AllocateDemand(RequestDemand(8, 8)), ErrorCode::kResourceExhausted);
  expect_error(b->AllocateDemand(Demand::Of(3)), ErrorCode::kInvalidArgument);
  expect_error(b->Allocate(BlockKind(7)), ErrorCode::kInvalidArgument);
  expect_error(b->Offset(ids[0]), ErrorCode::kNotFound);
  EXPECT_FALSE(b->CanAllocate(RequestDemand(0, 24)));
  EXPECT_FALSE(b->CanAllocate(Demand::Of(1)));

  std::vector<BlockId> batch = {ids[1], ids[0]};
  std::vector<std::uint64_t> offsets = {7, 7};
  expect_error(b->Translate(batch, offsets), ErrorCode::kNotFound);
  EXPECT_EQ(offsets, (std::vector<std::uint64_t>{7, 7}));  // nothing written
}

TEST(UnifiedBuffer, InvalidConfigNamesTheBadField) {
  auto c = TwoKindConfig(24);
  c.kinds[1].block_bytes = 65;
  auto bad = UnifiedBuffer::Create(c);
  ASSERT_FALSE(bad);
  EXPECT_NE(bad.error().message().find("kinds[1].block_bytes"), std::string::npos);
  c = TwoKindConfig(24);
  c.capacity_bytes = 0;
  EXPECT_NE(UnifiedBuffer::Create(c).error().message().find("capacity_bytes"), std::string::npos);
  c = TwoKindConfig(24);
  c.padding_kind = BlockKind(5);
  EXPECT_NE(UnifiedBuffer::Create(c).error().message().find("padding_kind"), std::string::npos);
  c = TwoKindConfig(24, 24);
  EXPECT_NE(UnifiedBuffer::Create(c).error().message().find("padding_blocks"), std::string::npos);
  c = TwoKindConfig(24);
  c.kinds.clear();
  EXPECT_NE(UnifiedBuffer::Create(c).error().message().find("kinds"), std::string::npos);
}

}  // namespace
}  // namespace ula
