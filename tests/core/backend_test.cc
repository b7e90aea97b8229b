#include "ula/backend.h"

#include <gtest/gtest.h>

#include <cstring>
#include <thread>

namespace ula {
namespace {

// Each batch reads what the one before it wrote, so any other order gives other bytes:
// swap a[0,16) <-> b[16,32), then copy b[16,32) -> a[32,48) (a's old first bytes only if
// the swap ran first), then copy a[32,48) -> b[48,64) (only if the copy ran before it).
TEST(CpuBackend, CopiesAndSwapsInSubmissionOrder) {
  for (int threads : {0, 1, 2}) {
    auto backend = MakeCpuBackend({.copy_threads = threads});
    auto a = backend->CreateArena(Tier::kDevice, Rank(0), 64).value();
    auto b = backend->CreateArena(Tier::kHost, Rank(0), 64).value();
    for (int round = 0; round < 50; ++round) {
      for (int i = 0; i < 64; ++i) {
        a.data[i] = std::byte(i);
        b.data[i] = std::byte(100 + i);
      }
      ASSERT_TRUE(backend->Submit(CopyBatch{a.id, b.id, 16, true, {{0, 16}}}));
      ASSERT_TRUE(backend->Submit(CopyBatch{b.id, a.id, 16, false, {{16, 32}}}));
      auto fence = backend->Submit(CopyBatch{a.id, b.id, 16, false, {{32, 48}}});
      ASSERT_TRUE(fence);
      ASSERT_TRUE(backend->Wait(*fence));
      for (int i = 0; i < 16; ++i) {
        ASSERT_EQ(a.data[i], std::byte(116 + i)) << threads << " threads, round " << round;   // swapped in
        ASSERT_EQ(b.data[16 + i], std::byte(i)) << threads << " threads, round " << round;    // swapped out
        ASSERT_EQ(a.data[32 + i], std::byte(i)) << "the copy ran before the swap, " << threads << " threads";
        ASSERT_EQ(b.data[48 + i], std::byte(i)) << "the second copy ran before the first, " << threads << " threads";
      }
    }
    const auto c = backend->counters();
    EXPECT_EQ(c.Bytes(Tier::kDevice, Tier::kHost, false), 50u * (16 + 16));
    EXPECT_EQ(c.Bytes(Tier::kHost, Tier::kDevice, false), 50u * (16 + 16));
  }
}

TEST(CpuBackend, RejectsMovesOutsideTheArena) {
  auto backend = MakeCpuBackend();
  auto a = backend->CreateArena(Tier::kDevice, Rank(0), 64).value();
  auto r = backend->Submit(CopyBatch{a.id, a.id, 16, false, {{0, 56}}});
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code(), ErrorCode::kOutOfRange);
  auto unknown = backend->Submit(CopyBatch{ArenaId(99), a.id, 16, false, {{0, 0}}});
  ASSERT_FALSE(unknown);
  EXPECT_EQ(unknown.error().code(), ErrorCode::kNotFound);
  EXPECT_EQ(backend->counters().TotalBytes(), 0u);
}

// The bounds are exact: a move that ends at the arena's last byte is accepted, one byte
// further is refused (either end), and so is an overlapping move inside one arena (a move
// onto itself is a no-op and accepted). A refused batch moves and counts nothing.
TEST(CpuBackend, RefusesExactlyTheMovesPastTheEndAndOverlaps) {
  auto backend = MakeCpuBackend({.copy_threads = 0});
  auto a = backend->CreateArena(Tier::kDevice, Rank(0), 64).value();
  auto b = backend->CreateArena(Tier::kHost, Rank(0), 64).value();
  for (int i = 0; i < 64; ++i) a.data[i] = std::byte(i);
  ASSERT_TRUE(backend->Submit(CopyBatch{a.id, b.id, 16, false, {{48, 48}}}));
  EXPECT_EQ(b.data[63], std::byte(63));
  for (SlotMove m : {SlotMove{49, 0}, SlotMove{0, 49}}) {
    auto r = backend->Submit(CopyBatch{a.id, b.id, 16, false, {{0, 0}, m}});
    ASSERT_FALSE(r) << m.src_offset << "->" << m.dst_offset;
    EXPECT_EQ(r.error().code(), ErrorCode::kOutOfRange);
  }
  for (SlotMove m : {SlotMove{0, 8}, SlotMove{8, 0}, SlotMove{0, 15}}) {
    auto r = backend->Submit(CopyBatch{a.id, a.id, 16, false, {m}});
    ASSERT_FALSE(r) << m.src_offset << "->" << m.dst_offset;
    EXPECT_EQ(r.error().code(), ErrorCode::kInvalidArgument);
  }
  EXPECT_TRUE(backend->Submit(CopyBatch{a.id, a.id, 16, false, {{0, 16}, {32, 32}}}));  // adjacent, and onto itself
  EXPECT_EQ(backend->counters().TotalBytes(), 16u + 2 * 16);
  for (int i = 0; i < 16; ++i) EXPECT_EQ(a.data[16 + i], std::byte(i));
}

// A swap of an entry larger than the copy's bounce buffer (4 KiB) swaps every byte.
TEST(CpuBackend, SwapsEntriesLargerThanTheBounceBuffer) {
  constexpr std::uint32_t kBytes = 3 * 4096 + 100;
  for (int threads : {0, 1}) {
    auto backend = MakeCpuBackend({.copy_threads = threads});
    auto a = backend->CreateArena(Tier::kDevice, Rank(0), 2 * kBytes).value();
    auto b = backend->CreateArena(Tier::kHost, Rank(0), 2 * kBytes).value();
    for (std::uint32_t i = 0; i < 2 * kBytes; ++i) {
      a.data[i] = std::byte((i * 7) & 0xff);
      b.data[i] = std::byte((i * 13 + 1) & 0xff);
    }
    auto f = backend->Submit(CopyBatch{a.id, b.id, kBytes, true, {{0, kBytes}}});
    ASSERT_TRUE(f);
    ASSERT_TRUE(backend->Wait(*f));
    for (std::uint32_t i = 0; i < kBytes; ++i) {
      ASSERT_EQ(a.data[i], std::byte(((kBytes + i) * 13 + 1) & 0xff)) << "byte " << i << ", " << threads << " threads";
      ASSERT_EQ(b.data[kBytes + i], std::byte((i * 7) & 0xff)) << "byte " << i << ", " << threads << " threads";
    }
  }
}

TEST(CpuBackend, ManyThreadsSubmittingAndWaiting) {
  auto backend = MakeCpuBackend({.copy_threads = 2});
  auto a = backend->CreateArena(Tier::kDevice, Rank(0), 4096).value();
  auto b = backend->CreateArena(Tier::kHost, Rank(1), 4096).value();
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 200; ++i) {
        CopyBatch batch{a.id, b.id, 64, false, {{std::uint64_t(t) * 1024, std::uint64_t(t) * 1024}}};
        auto f = backend->Submit(batch);
        ASSERT_TRUE(f);
        ASSERT_TRUE(backend->Wait(*f));
      }
    });
  }
  for (auto& th : threads) th.join();
  backend->WaitAll();
  EXPECT_EQ(backend->counters().Moves(Tier::kDevice, Tier::kHost, true), 800u);
}

TEST(CountingBackend, CountsWithoutBytes) {
  auto backend = MakeCountingBackend();
  EXPECT_FALSE(backend->holds_bytes());
  auto a = backend->CreateArena(Tier::kDevice, Rank(0), std::uint64_t{1} << 40).value();
  EXPECT_EQ(a.data, nullptr);
  auto b = backend->CreateArena(Tier::kHost, Rank(0), std::uint64_t{1} << 40).value();
  ASSERT_TRUE(backend->Submit(CopyBatch{a.id, b.id, 656, true, {{0, 0}, {656, 656}}}));
  EXPECT_EQ(backend->counters().Bytes(Tier::kDevice, Tier::kHost, false), 2u * 656);
  EXPECT_EQ(backend->counters().Bytes(Tier::kHost, Tier::kDevice, false), 2u * 656);
}

}  // namespace
}  // namespace ula
