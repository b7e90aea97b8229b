// StepPlanner::Step (the library path: Plan, CopyPublish, Complete) under injected
// transfer failures (backend/fault_backend.h): after every step, failed or not, every
// entry reads its own bytes at its published location (none lost, none published before
// its bytes arrived), every invariant holds, and a failed step reports kIo naming each
// failed batch. Its own binary, so that a mutation of the shared copy-wait-publish
// primitive shows which planner's tests catch it.
#include <gtest/gtest.h>

#include <random>

#include "step/engine_step_fixture.h"
#include "test_seed.h"

namespace ula {
namespace {

using testing::FaultStepSpace;

constexpr std::uint32_t kEntry = 32;
constexpr EngineStepConfig kOneRow{.max_batch = 1, .max_q_len = 1, .max_top_k = 4};

// 3 host entries selected with no free device slot: one swap batch of 3, failed at its wait.
TEST(EngineStepFault, FailedSwapBatchPublishesNothingAndVictimsKeepTheirBytes) {
  FaultStepSpace f(FaultPlan{.fail_every_nth = 1, .at_submit = false}, 4, 12, kEntry, kOneRow, {.copy_threads = 1});
  const auto addrs = f.Append(RequestId(1), 16);  // 4 on device, 12 on host
  f.space->AdvanceRound();
  const auto before = f.Locations(addrs);
  std::vector<std::int32_t> sel, idx(3);
  for (std::size_t i = addrs.size() - 3; i < addrs.size(); ++i) sel.push_back(static_cast<std::int32_t>(addrs[i].value()));
  const std::vector<RequestId> one{RequestId(1)};
  auto failed = f.ArmedStep({1, 1, 3}, one, sel, idx);
  ASSERT_FALSE(failed);
  EXPECT_EQ(failed.error().code(), ErrorCode::kIo);
  const std::string& m = failed.error().message();
  EXPECT_NE(m.find("3 of 3 copies not published: host<->device swap of 3 entries failed (injected fault"),
            std::string::npos) << m;
  EXPECT_EQ(m.find("host->device copy"), std::string::npos) << m;
  EXPECT_EQ(f.Locations(addrs), before);
  EXPECT_TRUE(f.AllIntact());
  EXPECT_TRUE(f.space->CheckInvariants());
  EXPECT_FALSE(f.planner->has_pending());

  // The retry succeeds once the round ends (the victims were claimed in this one).
  f.space->AdvanceRound();
  auto retry = f.planner->Step(Rank(0), GroupId(0), {1, 1, 3}, one, sel, idx);
  ASSERT_TRUE(retry) << retry.error().ToString();
  EXPECT_EQ(retry->evictions, 3u);
  for (int i = 0; i < 3; ++i) {
    const Location loc = f.space->Lookup(LogicalAddr(static_cast<std::uint32_t>(sel[i])), GroupId(0)).value();
    EXPECT_EQ(loc.tier(), Tier::kDevice);
    EXPECT_EQ(static_cast<std::int32_t>(loc.slot().value()), idx[i]);
  }
  EXPECT_TRUE(f.AllIntact());
}

// Request 1's 14 entries, 2 on device and 12 on host, and 2 free device slots (a request
// that held them was freed).
std::vector<LogicalAddr> TwoFreeDeviceSlots(FaultStepSpace& f) {
  f.Append(RequestId(2), 2);  // 2 of the 4 device slots, freed below
  auto addrs = f.Append(RequestId(1), 14);
  f.Free(RequestId(2));
  f.space->AdvanceRound();
  return addrs;
}

// 2 host entries selected with 2 free device slots: one copy batch, failed at its wait
// after landing a prefix; its slots go back to the pool, its entries stay on host.
TEST(EngineStepFault, FailedCopyBatchReturnsItsFreeSlots) {
  FaultStepSpace f(FaultPlan{.fail_every_nth = 1, .partial = true, .swaps = false, .at_submit = false}, 4, 12, kEntry,
                   kOneRow, {.copy_threads = 1});
  const std::vector<LogicalAddr> addrs = TwoFreeDeviceSlots(f);
  const auto before = f.Locations(addrs);
  std::vector<std::int32_t> sel, idx(2);
  for (std::size_t i = addrs.size() - 2; i < addrs.size(); ++i) sel.push_back(static_cast<std::int32_t>(addrs[i].value()));
  ASSERT_EQ(before.back().tier(), Tier::kHost);
  const std::vector<RequestId> one{RequestId(1)};
  auto failed = f.ArmedStep({1, 1, 2}, one, sel, idx);
  ASSERT_FALSE(failed);
  EXPECT_EQ(failed.error().code(), ErrorCode::kIo);
  const std::string& m = failed.error().message();
  EXPECT_NE(m.find("2 of 2 copies not published: host->device copy of 2 entries failed (injected fault"),
            std::string::npos) << m;
  EXPECT_EQ(m.find("swap"), std::string::npos) << m;
  EXPECT_EQ(f.faults->stats().partial, 1u);
  EXPECT_EQ(f.Locations(addrs), before);
  EXPECT_TRUE(f.AllIntact());
  EXPECT_TRUE(f.space->CheckInvariants());
  // The free slots went back: the retry copies into them again (no eviction).
  auto retry = f.planner->Step(Rank(0), GroupId(0), {1, 1, 2}, one, sel, idx);
  ASSERT_TRUE(retry) << retry.error().ToString();
  EXPECT_EQ(retry->into_free, 2u);
  EXPECT_EQ(retry->evictions, 0u);
  EXPECT_TRUE(f.AllIntact());
}

// A step with a copy batch and a swap batch: the copy batch fails at its wait after landing
// a prefix, the swap batch completes. The swap's wait also completes the earlier copy batch
// but reports only its own outcome, so only a wait on the copy's own fence sees the failure:
// the copies stay unpublished, the swaps are published.
TEST(EngineStepFault, FailedCopyIsSeenOnItsOwnFenceNextToACompletedSwap) {
  FaultStepSpace f(FaultPlan{.fail_every_nth = 1, .partial = true, .swaps = false, .at_submit = false}, 4, 12, kEntry,
                   kOneRow, {.copy_threads = 1});
  const std::vector<LogicalAddr> addrs = TwoFreeDeviceSlots(f);
  std::vector<std::int32_t> sel, idx(4);
  for (std::size_t i = addrs.size() - 4; i < addrs.size(); ++i) sel.push_back(static_cast<std::int32_t>(addrs[i].value()));
  const std::vector<RequestId> one{RequestId(1)};
  auto failed = f.ArmedStep({1, 1, 4}, one, sel, idx);
  ASSERT_FALSE(failed);
  const std::string& m = failed.error().message();
  EXPECT_NE(m.find("2 of 4 copies not published: host->device copy of 2 entries failed (injected fault"),
            std::string::npos) << m;
  EXPECT_EQ(m.find("swap"), std::string::npos) << m;
  EXPECT_EQ(f.faults->stats().partial, 1u);
  std::size_t published = 0;
  for (std::size_t i = addrs.size() - 4; i < addrs.size(); ++i) {
    published += f.space->Lookup(addrs[i], GroupId(0))->tier() == Tier::kDevice;
  }
  EXPECT_EQ(published, 2u);  // the swaps
  EXPECT_TRUE(f.AllIntact());
  EXPECT_TRUE(f.space->CheckInvariants());
}

// Random steps with 15 % of the batches failing (at Submit or at the wait, copies landing a
// prefix), every batch held back until a wait reaches its own fence.
TEST(EngineStepFault, RandomLibraryStepsLoseNothingAndPublishNothingEarly) {
  ULA_TEST_SEEDED(seed, 20261201);
  FaultStepSpace f(FaultPlan{.seed = seed, .fail_fraction = 0.15, .partial = true,
                             .delay = std::chrono::microseconds(1)},
                   10, 40, kEntry, {.max_batch = 2, .max_q_len = 1, .max_top_k = 8}, {.copy_threads = 1});
  std::mt19937_64 rng(seed);
  const auto addrs = f.Append(RequestId(1), 30);
  // A second request, freed and re-added every 6 steps, leaves free device slots for a
  // while (copy batches, not only swaps).
  std::uint64_t extra = 0, next_request = 2;
  std::vector<LogicalAddr> extra_addrs;
  int ok = 0, failed = 0, mixed = 0;
  for (int step = 0; step < 400; ++step) {
    if (step % 6 == 0) {
      if (extra != 0) {
        f.Free(RequestId(extra));
        extra = 0;
        extra_addrs.clear();
      } else {
        extra = next_request++;
        extra_addrs = f.Append(RequestId(extra), 8);
      }
    }
    // Row 0: request 1; row 1: the extra request (or padding).
    std::vector<std::int32_t> sel(16, kPadIndex), idx(16);
    for (int i = 0, n = 2 + static_cast<int>(rng() % 6); i < n; ++i) {  // <= 10 distinct: the device pool
      sel[i] = static_cast<std::int32_t>(addrs[rng() % addrs.size()].value());
    }
    if (!extra_addrs.empty()) {
      for (int i = 0, n = static_cast<int>(rng() % 4); i < n; ++i) {
        sel[8 + i] = static_cast<std::int32_t>(extra_addrs[rng() % extra_addrs.size()].value());
      }
    }
    const std::vector<RequestId> requests{RequestId(1), RequestId(extra == 0 ? 1 : extra)};
    auto st = f.ArmedStep({2, 1, 8}, requests, sel, idx);
    if (st) {
      ++ok;
      mixed += st->into_free > 0 && st->evictions > 0;
      for (std::size_t j = 0; j < sel.size(); ++j) {
        if (sel[j] == kPadIndex) continue;
        const Location loc = f.space->Lookup(LogicalAddr(static_cast<std::uint32_t>(sel[j])), GroupId(0)).value();
        ASSERT_EQ(loc.tier(), Tier::kDevice) << "step " << step;
        ASSERT_EQ(static_cast<std::int32_t>(loc.slot().value()), idx[j]) << "step " << step;
      }
    } else if (st.error().code() == ErrorCode::kIo) {
      ASSERT_NE(st.error().message().find("failed (injected fault"), std::string::npos) << st.error().message();
      ++failed;
    } else {
      ASSERT_EQ(st.error().code(), ErrorCode::kResourceExhausted) << st.error().ToString();
    }
    ASSERT_FALSE(f.planner->has_pending());
    ASSERT_TRUE(f.space->CheckInvariants()) << "step " << step;
    ASSERT_TRUE(f.AllIntact()) << "step " << step;
    if (rng() % 2 == 0) f.space->AdvanceRound();
  }
  const FaultStats s = f.faults->stats();
  std::printf("engine step fault: %d steps ok (%d with copies and swaps), %d failed; %llu faults (%llu copies, "
              "%llu swaps, %llu partial, %llu at the wait) of %llu batches\n",
              ok, mixed, failed, (unsigned long long)s.injected, (unsigned long long)s.copies_failed,
              (unsigned long long)s.swaps_failed, (unsigned long long)s.partial, (unsigned long long)s.waits_failed,
              (unsigned long long)s.operations);
  EXPECT_GT(failed, 10);
  EXPECT_GT(ok, 50);
  EXPECT_GT(mixed, 5);
  EXPECT_GT(s.copies_failed, 0u);
  EXPECT_GT(s.swaps_failed, 0u);
  EXPECT_GT(s.waits_failed, 0u);  // a partial copy failure: FailedCopyBatchReturnsItsFreeSlots
}

}  // namespace
}  // namespace ula
