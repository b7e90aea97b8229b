// Freed virtual block ids stay refused after their table entry is reused (generations).
#include <gtest/gtest.h>

#include <cstring>

#include "unified/block_table.h"
#include "unified/test_configs.h"

namespace ula {
namespace {

using internal::BlockTable;
using namespace ula::testing;

// Frees `old_id`, reallocates until the same table index comes back, and checks that every
// call with the stale id is kNotFound and changes nothing.
void ExpectStaleIdRefused(HybridAllocator& a) {
  const BlockId old_id = a.Allocate(kKv).value();
  ASSERT_TRUE(a.Free(old_id));
  const BlockId fresh = a.Allocate(kKv).value();
  ASSERT_EQ(BlockTable::IndexOf(fresh), BlockTable::IndexOf(old_id)) << "the test needs the index to be reused";
  ASSERT_NE(fresh, old_id);
  auto bytes = a.Bytes(fresh).value();
  if (!bytes.empty()) std::memset(bytes.data(), 0x5a, bytes.size());
  ASSERT_TRUE(a.Pin(fresh));
  const Snapshot before = Take(a);

  EXPECT_EQ(a.Free(old_id).error().code(), ErrorCode::kNotFound);
  EXPECT_EQ(a.Pin(old_id).error().code(), ErrorCode::kNotFound);
  EXPECT_EQ(a.Unpin(old_id).error().code(), ErrorCode::kNotFound);
  EXPECT_EQ(a.KindOf(old_id).error().code(), ErrorCode::kNotFound);
  EXPECT_EQ(a.Offset(old_id).error().code(), ErrorCode::kNotFound);
  EXPECT_EQ(a.Bytes(old_id).error().code(), ErrorCode::kNotFound);
  std::vector<BlockId> batch = {fresh, old_id};
  std::vector<std::uint64_t> offsets = {7, 7};
  EXPECT_EQ(a.Translate(batch, offsets).error().code(), ErrorCode::kNotFound);
  EXPECT_EQ(offsets, (std::vector<std::uint64_t>{7, 7}));
  EXPECT_NE(a.Free(old_id).error().message().find("stale"), std::string::npos);

  EXPECT_EQ(Take(a), before);
  EXPECT_TRUE(a.CheckInvariants());
  auto after = a.Bytes(fresh).value();
  for (auto b : after) ASSERT_EQ(b, std::byte{0x5a});
  ASSERT_TRUE(a.Unpin(fresh));
  ASSERT_TRUE(a.Free(fresh));
}

TEST(StaleBlockId, UnifiedBufferRefusesAFreedIdAfterItsIndexIsReused) {
  auto a = UnifiedBuffer::Create(TwoKindConfig(24)).value();
  ExpectStaleIdRefused(*a);
}

TEST(StaleBlockId, UnifiedBufferRefusesAFreedIdAfterCompactionMovedTheNewBlock) {
  auto a = UnifiedBuffer::Create(TwoKindConfig(24, 1, CompactionMode::kEager)).value();
  auto keep = a->AllocateDemand(RequestDemand(3, 0)).value();
  ASSERT_TRUE(a->Free(keep[0]));  // eager: keep[2] moves into the hole
  const BlockId fresh = a->Allocate(kState).value();
  ASSERT_EQ(BlockTable::IndexOf(fresh), BlockTable::IndexOf(keep[0]));
  const Snapshot before = Take(*a);
  EXPECT_EQ(a->Free(keep[0]).error().code(), ErrorCode::kNotFound);
  EXPECT_EQ(a->Offset(keep[0]).error().code(), ErrorCode::kNotFound);
  EXPECT_EQ(Take(*a), before);
}

TEST(StaleBlockId, FixedSplitRefusesAFreedIdAfterItsIndexIsReused) {
  auto a = FixedSplitAllocator::Create(TwoKindFixed(24, 0.5)).value();
  ExpectStaleIdRefused(*a);
}

TEST(StaleBlockId, AFreedIdStaysRefusedUntilItsIndexIsReallocated1024Times) {
  // The documented bound: 10 generation bits.
  static_assert(BlockTable::kGenerationBits == 10);
  auto a = UnifiedBuffer::Create(TwoKindConfig(24)).value();
  const BlockId old_id = a->Allocate(kKv).value();
  ASSERT_TRUE(a->Free(old_id));
  for (int reuse = 1; reuse < 1024; ++reuse) {
    const BlockId id = a->Allocate(kKv).value();
    ASSERT_EQ(BlockTable::IndexOf(id), BlockTable::IndexOf(old_id));
    ASSERT_FALSE(a->Offset(old_id)) << "stale id accepted after " << reuse << " reuses";
    ASSERT_TRUE(a->Free(id));
  }
  // The 1024th reallocation wraps the generation: the stale id names the new block again.
  const BlockId wrapped = a->Allocate(kKv).value();
  EXPECT_EQ(wrapped, old_id);
}

TEST(StaleBlockId, FreedIndicesAreReusedOldestFirst) {
  auto a = UnifiedBuffer::Create(TwoKindConfig(24)).value();
  auto ids = a->AllocateDemand(RequestDemand(0, 3)).value();
  ASSERT_TRUE(a->Free(ids[2]));
  ASSERT_TRUE(a->Free(ids[0]));
  EXPECT_EQ(BlockTable::IndexOf(a->Allocate(kKv).value()), BlockTable::IndexOf(ids[2]));
  EXPECT_EQ(BlockTable::IndexOf(a->Allocate(kKv).value()), BlockTable::IndexOf(ids[0]));
}

}  // namespace
}  // namespace ula
