// FaultInjectingBackend: fails what its plan says, where it says, and counts it.
#include "backend/fault_backend.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include "test_seed.h"

namespace ula {
namespace {

struct Arenas {
  Arena src, dst;
};

Arenas Make(Backend& b, std::uint64_t slots, std::uint32_t bytes) {
  Arenas a{b.CreateArena(Tier::kHost, Rank(0), slots * bytes).value(), b.CreateArena(Tier::kDevice, Rank(0), slots * bytes).value()};
  for (std::uint64_t i = 0; i < slots * bytes; ++i) a.src.data[i] = std::byte(1 + i % 251);
  return a;
}

CopyBatch Batch(const Arenas& a, std::uint32_t bytes, std::uint64_t n, bool swap = false) {
  CopyBatch batch{a.src.id, a.dst.id, bytes, swap, {}};
  for (std::uint64_t i = 0; i < n; ++i) batch.moves.push_back({i * bytes, i * bytes});
  return batch;
}

int SlotsLanded(const Arenas& a, std::uint32_t bytes, std::uint64_t n) {
  int landed = 0;
  for (std::uint64_t i = 0; i < n; ++i) landed += a.dst.data[i * bytes] == a.src.data[i * bytes];
  return landed;
}

TEST(FaultBackend, RejectsABadPlan) {
  auto inner = MakeCpuBackend();
  EXPECT_FALSE(MakeFaultInjectingBackend(*inner, FaultPlan{.fail_fraction = 1.5}));
  EXPECT_FALSE(MakeFaultInjectingBackend(*inner, FaultPlan{.at_submit = false, .at_wait = false}));
  EXPECT_FALSE(MakeFaultInjectingBackend(*inner, FaultPlan{.delay = std::chrono::microseconds(-1)}));
}

TEST(FaultBackend, FailsEveryNthBatchAtSubmitWithNothingApplied) {
  auto inner = MakeCpuBackend({.copy_threads = 1});
  auto fb = MakeFaultInjectingBackend(*inner, FaultPlan{.fail_every_nth = 3, .at_wait = false}).value();
  const Arenas a = Make(*fb, 4, 8);
  for (int i = 1; i <= 9; ++i) {
    std::memset(a.dst.data, 0, 32);
    auto f = fb->Submit(Batch(a, 8, 4));
    if (i % 3 == 0) {
      ASSERT_FALSE(f) << i;
      EXPECT_EQ(f.error().code(), ErrorCode::kIo);
      EXPECT_NE(f.error().message().find("injected fault: copy batch"), std::string::npos);
      inner->WaitAll();
      EXPECT_EQ(SlotsLanded(a, 8, 4), 0) << i;
    } else {
      ASSERT_TRUE(f) << i;
      ASSERT_TRUE(fb->Wait(*f));
      EXPECT_EQ(SlotsLanded(a, 8, 4), 4) << i;
    }
  }
  const FaultStats s = fb->stats();
  EXPECT_EQ(s.operations, 9u);
  EXPECT_EQ(s.injected, 3u);
  EXPECT_EQ(s.copies_failed, 3u);
  EXPECT_EQ(s.waits_failed, 0u);
}

TEST(FaultBackend, PartialCopyLandsAPrefixThenWaitFails) {
  ULA_TEST_SEEDED(seed, 7);
  auto inner = MakeCpuBackend({.copy_threads = 1});
  auto fb = MakeFaultInjectingBackend(*inner, FaultPlan{.seed = seed, .fail_every_nth = 1, .partial = true,
                                                        .at_submit = false}).value();
  const Arenas a = Make(*fb, 16, 8);
  auto f = fb->Submit(Batch(a, 8, 16));
  ASSERT_TRUE(f);
  auto w = fb->Wait(*f);
  ASSERT_FALSE(w);
  EXPECT_EQ(w.error().code(), ErrorCode::kIo);
  const FaultStats s = fb->stats();
  EXPECT_EQ(s.partial, 1u);
  EXPECT_EQ(s.waits_failed, 1u);
  const int landed = SlotsLanded(a, 8, 16);
  EXPECT_EQ(std::uint64_t(landed), s.moves_landed_before_failure);
  EXPECT_GT(landed, 0);
  EXPECT_LT(landed, 16);
  for (int i = 0; i < landed; ++i) EXPECT_EQ(a.dst.data[i * 8], a.src.data[i * 8]) << "a prefix lands, slot " << i;
}

TEST(FaultBackend, FailedSwapExchangesNothingAtEitherPoint) {
  for (bool at_wait : {false, true}) {
    auto inner = MakeCpuBackend({.copy_threads = 1});
    auto fb = MakeFaultInjectingBackend(*inner, FaultPlan{.fail_every_nth = 1, .partial = true,
                                                          .at_submit = !at_wait, .at_wait = at_wait}).value();
    const Arenas a = Make(*fb, 8, 8);
    std::vector<std::byte> src_before(a.src.data, a.src.data + 64);
    auto f = fb->Submit(Batch(a, 8, 8, /*swap=*/true));
    if (at_wait) {
      ASSERT_TRUE(f);
      EXPECT_FALSE(fb->Wait(*f));
    } else {
      EXPECT_FALSE(f);
    }
    fb->WaitAll();
    EXPECT_EQ(std::memcmp(src_before.data(), a.src.data, 64), 0) << at_wait;
    EXPECT_EQ(SlotsLanded(a, 8, 8), 0) << at_wait;
    EXPECT_EQ(fb->stats().swaps_failed, 1u);
  }
}

TEST(FaultBackend, DelayHoldsBytesBackUntilTheirFenceIsWaited) {
  auto inner = MakeCpuBackend({.copy_threads = 1});
  auto fb = MakeFaultInjectingBackend(*inner, FaultPlan{.delay = std::chrono::microseconds(100)}).value();
  const Arenas a = Make(*fb, 4, 8);
  CopyBatch first{a.src.id, a.dst.id, 8, false, {{0, 0}}};
  CopyBatch second{a.src.id, a.dst.id, 8, false, {{8, 8}}};
  const Fence f1 = fb->Submit(first).value();
  const Fence f2 = fb->Submit(second).value();
  inner->WaitAll();
  EXPECT_EQ(SlotsLanded(a, 8, 2), 0) << "nothing lands before a wait";
  ASSERT_TRUE(fb->Wait(f1));
  inner->WaitAll();
  EXPECT_EQ(SlotsLanded(a, 8, 1), 1);
  EXPECT_NE(a.dst.data[8], a.src.data[8]) << "waiting on the first fence does not run the second batch";
  ASSERT_TRUE(fb->Wait(f2));
  EXPECT_EQ(SlotsLanded(a, 8, 2), 2);
  EXPECT_EQ(fb->stats().delayed, 2u);
}

TEST(FaultBackend, SeededFractionIsReproducibleAndCloseToTheRate) {
  ULA_TEST_SEEDED(seed, 11);
  auto run = [&] {
    auto inner = MakeCountingBackend();
    auto fb = MakeFaultInjectingBackend(*inner, FaultPlan{.seed = seed, .fail_fraction = 0.25}).value();
    const Arena x = fb->CreateArena(Tier::kHost, Rank(0), 64).value();
    const Arena y = fb->CreateArena(Tier::kDevice, Rank(0), 64).value();
    std::vector<bool> outcome;
    for (int i = 0; i < 4000; ++i) {
      auto f = fb->Submit(CopyBatch{x.id, y.id, 8, i % 2 == 1, {{0, 0}}});
      outcome.push_back(f && fb->Wait(*f).has_value());
    }
    EXPECT_EQ(fb->stats().injected, std::uint64_t(std::count(outcome.begin(), outcome.end(), false)));
    return outcome;
  };
  const auto a = run();
  EXPECT_EQ(a, run());
  const auto failed = std::count(a.begin(), a.end(), false);
  EXPECT_GT(failed, 850);  // 1000 expected; 5 standard deviations is about 137
  EXPECT_LT(failed, 1150);
}

TEST(FaultBackend, DisarmedInjectsNothing) {
  auto inner = MakeCountingBackend();
  auto fb = MakeFaultInjectingBackend(*inner, FaultPlan{.fail_every_nth = 1}).value();
  const Arena x = fb->CreateArena(Tier::kHost, Rank(0), 64).value();
  fb->set_armed(false);
  auto f = fb->Submit(CopyBatch{x.id, x.id, 8, false, {{0, 8}}});
  ASSERT_TRUE(f);
  EXPECT_TRUE(fb->Wait(*f));
  EXPECT_EQ(fb->stats().injected, 0u);
  fb->set_armed(true);
  auto g = fb->Submit(CopyBatch{x.id, x.id, 8, false, {{0, 8}}});
  EXPECT_FALSE(g && fb->Wait(*g).has_value());
  EXPECT_EQ(fb->stats().injected, 1u);
}

}  // namespace
}  // namespace ula
