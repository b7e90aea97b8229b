// Unified-buffer compaction under injected copy failures (backend/fault_backend.h): a failed
// move leaves its block in place with its bytes; no block ever loses bytes, pinned blocks
// never move, every invariant holds; an allocation that needed the failed compaction
// returns kIo with nothing allocated.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <map>
#include <tuple>
#include <random>

#include "backend/fault_backend.h"
#include "unified/test_configs.h"
#include "test_seed.h"

namespace ula {
namespace {

using namespace ula::testing;

UnifiedBufferConfig Config(CompactionMode mode) {
  UnifiedBufferConfig c;
  c.alignment = kUnit;
  c.capacity_bytes = 160 * kUnit;
  c.kinds = {{"state", 3 * kUnit, BufferEnd::kLow}, {"kv", 2 * kUnit, BufferEnd::kHigh},
             {"swa", 5 * kUnit, BufferEnd::kLow}};
  c.padding_kind = kKv;
  c.padding_blocks = 1;
  c.compaction = mode;
  return c;
}

TEST(UnifiedFault, MoverMustOwnTheArena) {
  auto a = MakeCpuBackend({.copy_threads = 0});
  auto b = MakeCpuBackend({.copy_threads = 0});
  const Arena arena = a->CreateArena(Tier::kDevice, Rank(0), 160 * kUnit).value();
  EXPECT_FALSE(UnifiedBuffer::Create(Config(CompactionMode::kLazy), arena, *b));
  EXPECT_TRUE(UnifiedBuffer::Create(Config(CompactionMode::kLazy), arena, *a));
}

void RunFaulty(CompactionMode mode, std::uint32_t seed) {
  SCOPED_TRACE(::ula::testing::SeedMessage(seed));
  std::mt19937 rng(seed);
  auto inner = MakeCpuBackend({.copy_threads = 1});
  auto fb = MakeFaultInjectingBackend(*inner, FaultPlan{.seed = seed, .fail_fraction = 0.3,
                                                        .delay = std::chrono::microseconds(1)}).value();
  const Arena arena = fb->CreateArena(Tier::kDevice, Rank(0), 160 * kUnit).value();
  auto buffer = UnifiedBuffer::Create(Config(mode), arena, *fb).value();
  struct Shadow {
    std::vector<std::byte> bytes;
    std::uint32_t pins = 0;
    std::uint64_t pinned_offset = 0;
  };
  std::map<std::uint32_t, Shadow> shadow;
  std::uint64_t failed_allocations = 0, io_with_kept_moves = 0;
  auto pick = [&]() -> std::uint32_t {
    auto it = shadow.begin();
    std::advance(it, std::uniform_int_distribution<std::size_t>(0, shadow.size() - 1)(rng));
    return it->first;
  };
  for (int step = 0; step < 2500; ++step) {
    const int op = std::uniform_int_distribution<int>(0, 99)(rng);
    if (op < 40 || shadow.empty()) {
      Demand d = Demand::Of(3);
      d.blocks[0] = std::uniform_int_distribution<std::uint32_t>(0, 1)(rng);
      d.blocks[1] = std::uniform_int_distribution<std::uint32_t>(0, 6)(rng);
      d.blocks[2] = std::uniform_int_distribution<std::uint32_t>(0, 1)(rng);
      const std::vector<BlockInfo> live_before = buffer->LiveBlocks();
      const AllocatorStats stats_before = buffer->Stats();
      const std::uint64_t digest_before = buffer->DebugDigest();
      auto ids = buffer->AllocateDemand(d);
      if (!ids) {
        ASSERT_TRUE(ids.error().code() == ErrorCode::kResourceExhausted || ids.error().code() == ErrorCode::kIo)
            << ids.error().ToString();
        const std::vector<BlockInfo> live_after = buffer->LiveBlocks();
        const AllocatorStats stats_after = buffer->Stats();
        if (ids.error().code() == ErrorCode::kIo) {
          ++failed_allocations;
          ASSERT_NE(ids.error().message().find("compaction move of block"), std::string::npos) << ids.error().message();
          // What a kIo keeps (unified_buffer.h): the compaction moves completed before the
          // failed one, and nothing else. The same blocks (ids, kinds, pins) and bytes live;
          // exactly the blocks counted as moved changed offset, none of them pinned; free
          // bytes only changed place (holes into middle), none were allocated.
          ASSERT_EQ(live_after.size(), live_before.size()) << "step " << step << ": a failed allocation allocated";
          std::uint64_t moved = 0;
          for (std::size_t i = 0; i < live_after.size(); ++i) {
            const BlockInfo& a = live_before[i];
            const BlockInfo& b = live_after[i];
            ASSERT_EQ(std::tie(a.id, a.kind, a.pins), std::tie(b.id, b.kind, b.pins)) << "step " << step;
            if (a.offset != b.offset) {
              ++moved;
              ASSERT_EQ(a.pins, 0u) << "step " << step << ": pinned block " << a.id.value() << " moved";
            }
          }
          ASSERT_EQ(moved, stats_after.blocks_moved - stats_before.blocks_moved) << "step " << step;
          ASSERT_EQ(stats_after.live_bytes, stats_before.live_bytes) << "step " << step;
          ASSERT_EQ(stats_after.live_blocks_per_kind, stats_before.live_blocks_per_kind) << "step " << step;
          ASSERT_EQ(stats_after.hole_bytes + stats_after.middle_bytes, stats_before.hole_bytes + stats_before.middle_bytes)
              << "step " << step;
          ASSERT_LE(stats_after.hole_bytes, stats_before.hole_bytes) << "step " << step;
          if (moved > 0) ++io_with_kept_moves;
        } else {
          ASSERT_EQ(live_after, live_before) << "step " << step << ": a refused allocation changed a block";
          ASSERT_EQ(buffer->DebugDigest(), digest_before) << "step " << step << ": a refused allocation changed the state";
        }
      } else {
        for (BlockId id : *ids) {
          auto bytes = buffer->Bytes(id).value();
          Shadow s;
          s.bytes.resize(bytes.size());
          for (auto& b : s.bytes) b = std::byte(rng() & 0xff);
          std::memcpy(bytes.data(), s.bytes.data(), bytes.size());
          shadow[id.value()] = std::move(s);
        }
      }
    } else if (op < 75) {
      const auto id = pick();
      auto status = buffer->Free(BlockId(id));
      ASSERT_EQ(status.has_value(), shadow[id].pins == 0);
      if (status) shadow.erase(id);
    } else if (op < 85) {
      const auto id = pick();
      if (shadow[id].pins == 0) shadow[id].pinned_offset = buffer->Offset(BlockId(id)).value();
      ASSERT_TRUE(buffer->Pin(BlockId(id)));
      ++shadow[id].pins;
    } else if (op < 97) {
      const auto id = pick();
      auto status = buffer->Unpin(BlockId(id));
      ASSERT_EQ(status.has_value(), shadow[id].pins > 0);
      if (status) --shadow[id].pins;
    } else {
      buffer->Compact();
    }
    ASSERT_TRUE(buffer->CheckInvariants()) << buffer->CheckInvariants().error().ToString();
    for (auto& [id, s] : shadow) {
      auto bytes = buffer->Bytes(BlockId(id)).value();
      ASSERT_EQ(std::memcmp(bytes.data(), s.bytes.data(), bytes.size()), 0) << "step " << step << ": block " << id
                                                                            << " lost its bytes";
      if (s.pins > 0) {
        ASSERT_EQ(buffer->Offset(BlockId(id)).value(), s.pinned_offset) << "pinned block moved";
      }
    }
  }
  const FaultStats f = fb->stats();
  std::printf("unified fault (%s): %llu compaction moves, %llu failed (%llu at the wait), %llu allocations failed\n",
              mode == CompactionMode::kEager ? "eager" : "lazy", (unsigned long long)buffer->Stats().blocks_moved,
              (unsigned long long)f.injected, (unsigned long long)f.waits_failed, (unsigned long long)failed_allocations);
  EXPECT_GT(f.injected, 10u);
  EXPECT_GT(buffer->Stats().blocks_moved, 10u);
  if (mode == CompactionMode::kLazy) {
    EXPECT_GT(failed_allocations, 0u);
    EXPECT_GT(io_with_kept_moves, 0u) << "no kIo came after a partial compaction: the case above went unchecked";
  }
}

TEST(UnifiedFault, LazyCompactionLosesNoBytesOnFailedMoves) { RunFaulty(CompactionMode::kLazy, static_cast<std::uint32_t>(::ula::testing::TestSeed(31337))); }
TEST(UnifiedFault, EagerCompactionLosesNoBytesOnFailedMoves) { RunFaulty(CompactionMode::kEager, static_cast<std::uint32_t>(::ula::testing::TestSeed(4242))); }

}  // namespace
}  // namespace ula
