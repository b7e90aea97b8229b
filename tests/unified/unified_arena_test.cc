// The unified buffer on a Backend arena: the caller's arena, the counting backend, and the
// convenience path that owns its own CPU arena.
#include <gtest/gtest.h>

#include <cstring>

#include "ula/backend.h"
#include "unified/test_configs.h"

namespace ula {
namespace {

using namespace ula::testing;

TEST(UnifiedBufferArena, LivesOnTheCallersArenaAndCompactsInsideIt) {
  auto backend = MakeCpuBackend(CpuBackendOptions{.copy_threads = 0});
  const auto config = TwoKindConfig(24);
  const Arena arena = backend->CreateArena(Tier::kDevice, Rank(1), config.capacity_bytes).value();
  auto b = UnifiedBuffer::Create(config, arena).value();
  EXPECT_EQ(b->base(), arena.data);
  EXPECT_EQ(b->arena().rank, Rank(1));
  auto s = b->AllocateDemand(RequestDemand(3, 0)).value();
  std::memset(b->Bytes(s[2]).value().data(), 0x77, 2 * kUnit);
  ASSERT_TRUE(b->Free(s[0]));
  ASSERT_EQ(b->Compact(), 2 * kUnit);
  EXPECT_EQ(b->Offset(s[2]).value(), 0u);
  for (std::uint64_t i = 0; i < 2 * kUnit; ++i) ASSERT_EQ(arena.data[i], std::byte{0x77});
  b.reset();
  EXPECT_TRUE(backend->DestroyArena(arena.id));  // the buffer never owned it
}

TEST(UnifiedBufferArena, OnTheCountingBackendItOnlyAccounts) {
  auto backend = MakeCountingBackend();
  const auto config = TwoKindConfig(24);
  const Arena arena = backend->CreateArena(Tier::kDevice, Rank(0), config.capacity_bytes).value();
  auto b = UnifiedBuffer::Create(config, arena).value();
  EXPECT_EQ(b->base(), nullptr);
  EXPECT_EQ(AdmitUntilFull(*b, RequestDemand(1, 1)), 7);
  auto id = b->LiveBlocks().front().id;
  EXPECT_TRUE(b->Bytes(id).value().empty());
}

TEST(UnifiedBufferArena, ATooSmallArenaIsAnError) {
  auto backend = MakeCpuBackend(CpuBackendOptions{.copy_threads = 0});
  const auto config = TwoKindConfig(24);
  const Arena arena = backend->CreateArena(Tier::kDevice, Rank(0), config.capacity_bytes - kUnit).value();
  auto b = UnifiedBuffer::Create(config, arena);
  ASSERT_FALSE(b);
  EXPECT_EQ(b.error().code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(b.error().message().find("arena"), std::string::npos);
}

TEST(UnifiedBufferArena, TheConvenienceCreateHoldsZeroedBytesOrNone) {
  auto b = UnifiedBuffer::Create(TwoKindConfig(24)).value();
  ASSERT_NE(b->base(), nullptr);
  EXPECT_EQ(b->arena().bytes, 24 * kUnit);
  for (std::uint64_t i = 0; i < 24 * kUnit; ++i) ASSERT_EQ(b->base()[i], std::byte{0});
  auto c = TwoKindConfig(24);
  c.hold_bytes = false;
  EXPECT_EQ(UnifiedBuffer::Create(c).value()->base(), nullptr);
}

}  // namespace
}  // namespace ula
