#include "ula/backend.h"

#include <gtest/gtest.h>

#include <cstring>
#include <thread>

namespace ula {
namespace {

TEST(CpuBackend, CopiesAndSwapsInSubmissionOrder) {
  for (int threads : {0, 1, 2}) {
    auto backend = MakeCpuBackend({.copy_threads = threads});
    auto a = backend->CreateArena(Tier::kDevice, Rank(0), 64).value();
    auto b = backend->CreateArena(Tier::kHost, Rank(0), 64).value();
    for (int i = 0; i < 64; ++i) {
      a.data[i] = std::byte(i);
      b.data[i] = std::byte(100 + i);
    }
    CopyBatch swap{a.id, b.id, 16, true, {{0, 16}}};
    CopyBatch copy{b.id, a.id, 16, false, {{0, 32}}};  // after the swap: b[0..16) holds a's old bytes
    ASSERT_TRUE(backend->Submit(swap));
    auto fence = backend->Submit(copy);
    ASSERT_TRUE(fence);
    backend->Wait(*fence);
    for (int i = 0; i < 16; ++i) {
      EXPECT_EQ(a.data[i], std::byte(116 + i)) << threads;
      EXPECT_EQ(b.data[16 + i], std::byte(i));
      EXPECT_EQ(a.data[32 + i], std::byte(100 + i));
    }
    const auto c = backend->counters();
    EXPECT_EQ(c.Bytes(Tier::kDevice, Tier::kHost, false), 16u);
    EXPECT_EQ(c.Bytes(Tier::kHost, Tier::kDevice, false), 32u);
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
        backend->Wait(*f);
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
