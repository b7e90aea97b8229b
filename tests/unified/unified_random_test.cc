// Randomized alloc/free/pin/unpin/compact sequences with real bytes, checked against a
// shadow copy of every live block after every operation.
#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <random>

#include "unified/test_configs.h"
#include "test_seed.h"

namespace ula {
namespace {

using namespace ula::testing;

struct Shadow {
  std::vector<std::byte> bytes;
  std::uint32_t pins = 0;
  std::uint64_t pinned_offset = 0;
};

// Three kinds: state (3 units, low), window ring (5 units, low), KV page (2 units, high).
UnifiedBufferConfig ThreeKindConfig(CompactionMode mode) {
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

void RunRandom(CompactionMode mode, std::uint32_t default_seed, int steps) {
  ULA_TEST_SEEDED(seed64, default_seed);
  const auto seed = static_cast<std::uint32_t>(seed64);
  std::printf("unified random test: mode=%s seed=%u steps=%d\n", mode == CompactionMode::kEager ? "eager" : "lazy",
              seed, steps);
  std::mt19937 rng(seed);
  auto buffer = UnifiedBuffer::Create(ThreeKindConfig(mode)).value();
  std::map<std::uint32_t, Shadow> shadow;
  std::uint64_t allocations = 0, refusals = 0;

  auto verify = [&] {
    ASSERT_TRUE(buffer->CheckInvariants()) << buffer->CheckInvariants().error().ToString();
    for (auto& [id, s] : shadow) {
      auto bytes = buffer->Bytes(BlockId(id)).value();
      ASSERT_EQ(bytes.size(), s.bytes.size());
      ASSERT_EQ(std::memcmp(bytes.data(), s.bytes.data(), bytes.size()), 0) << "block " << id << " lost its bytes";
      if (s.pins > 0) {
        ASSERT_EQ(buffer->Offset(BlockId(id)).value(), s.pinned_offset) << "pinned block moved";
      }
    }
  };
  auto pick = [&]() -> std::uint32_t {
    auto it = shadow.begin();
    std::advance(it, std::uniform_int_distribution<std::size_t>(0, shadow.size() - 1)(rng));
    return it->first;
  };

  for (int step = 0; step < steps; ++step) {
    const int op = std::uniform_int_distribution<int>(0, 99)(rng);
    if (op < 35 || shadow.empty()) {
      Demand d = Demand::Of(3);
      d.blocks[0] = std::uniform_int_distribution<std::uint32_t>(0, 1)(rng);
      d.blocks[1] = std::uniform_int_distribution<std::uint32_t>(0, 6)(rng);
      d.blocks[2] = std::uniform_int_distribution<std::uint32_t>(0, 1)(rng);
      const bool can = buffer->CanAllocate(d);
      const std::uint64_t digest = buffer->DebugDigest();
      auto ids = buffer->AllocateDemand(d);
      ASSERT_EQ(can, ids.has_value()) << "CanAllocate disagrees with AllocateDemand at step " << step;
      if (!ids) {
        ASSERT_EQ(buffer->DebugDigest(), digest) << "a refused allocation changed the state at step " << step;
        ++refusals;
      } else {
        for (BlockId id : *ids) {
          auto bytes = buffer->Bytes(id).value();
          Shadow s;
          s.bytes.resize(bytes.size());
          for (auto& b : s.bytes) b = std::byte(rng() & 0xff);
          std::memcpy(bytes.data(), s.bytes.data(), bytes.size());
          shadow[id.value()] = std::move(s);
          ++allocations;
        }
      }
    } else if (op < 70) {
      const auto id = pick();
      const std::uint64_t digest = buffer->DebugDigest();
      auto status = buffer->Free(BlockId(id));
      ASSERT_EQ(status.has_value(), shadow[id].pins == 0);
      if (status) shadow.erase(id);
      if (!status) {
        ASSERT_EQ(buffer->DebugDigest(), digest) << "a refused free changed the state at step " << step;
      }
    } else if (op < 80) {
      const auto id = pick();
      if (shadow[id].pins == 0) shadow[id].pinned_offset = buffer->Offset(BlockId(id)).value();
      ASSERT_TRUE(buffer->Pin(BlockId(id)));
      ++shadow[id].pins;
    } else if (op < 94) {
      const auto id = pick();
      const std::uint64_t digest = buffer->DebugDigest();
      auto status = buffer->Unpin(BlockId(id));
      ASSERT_EQ(status.has_value(), shadow[id].pins > 0);
      if (status) --shadow[id].pins;
      if (!status) {
        ASSERT_EQ(buffer->DebugDigest(), digest) << "a refused unpin changed the state at step " << step;
      }
    } else if (op < 97) {
      buffer->Compact();
    } else {
      const auto id = pick();  // overwrite a block in place
      auto bytes = buffer->Bytes(BlockId(id)).value();
      for (auto& b : shadow[id].bytes) b = std::byte(rng() & 0xff);
      std::memcpy(bytes.data(), shadow[id].bytes.data(), bytes.size());
    }
    verify();
    if (::testing::Test::HasFatalFailure()) return;
  }
  const auto stats = buffer->Stats();
  std::printf("  allocated %llu blocks, %llu refusals, %llu bytes moved by %llu moves\n",
              static_cast<unsigned long long>(allocations), static_cast<unsigned long long>(refusals),
              static_cast<unsigned long long>(stats.bytes_moved), static_cast<unsigned long long>(stats.blocks_moved));
  EXPECT_GT(stats.blocks_moved, 0u);
  EXPECT_GT(refusals, 0u);  // the sequence did run into pressure
}

TEST(UnifiedBufferRandom, LazyCompactionKeepsEveryLiveBlocksBytesAndNeverMovesPinnedBlocks) {
  RunRandom(CompactionMode::kLazy, 20240607u, 4000);
}

TEST(UnifiedBufferRandom, EagerCompactionKeepsEveryLiveBlocksBytesAndNeverMovesPinnedBlocks) {
  RunRandom(CompactionMode::kEager, 7u, 4000);
}

}  // namespace
}  // namespace ula
