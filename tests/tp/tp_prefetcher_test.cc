#include "ula/tp_prefetcher.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <random>

#include "tp/tp_fixture.h"
#include "test_seed.h"
#include "ula/fault_backend.h"

namespace ula {
namespace {

// The pipelined step gives the same plans as the serial one, and every plan handed to
// compute reads the right bytes while the next group's step runs on the worker.
TEST(TpPrefetcher, PipelinedPlansEqualSerialPlansAndReadTheRightBytes) {
  ULA_TEST_SEEDED(seed, 99);
  std::vector<std::vector<TpReadRef>> refs[2];
  for (int prefetch = 0; prefetch < 2; ++prefetch) {
    testing::TpFixture f(testing::SmallTpConfig(4, 24, 64, 64, /*groups=*/4), /*copy_threads=*/2);
    TpPrefetcher prefetcher(*f.space);
    auto addrs = f.AddFilled(RequestId(1), 300);
    f.space->AdvanceRound();
    std::mt19937_64 rng(seed);
    for (int step = 0; step < 8; ++step) {
      std::vector<std::vector<LogicalAddr>> sel(4);
      for (auto& s : sel) {
        for (int i = 0; i < 40; ++i) s.push_back(addrs[rng() % addrs.size()]);
      }
      std::vector<std::vector<SelectionRun>> runs(4, testing::TpRuns(RequestId(1), 40));
      auto stats = prefetcher.RunStep(sel, runs, [&](GroupId g, const TpStepPlan& plan) {
        f.ExpectPlanReadsPattern(plan, g, sel[g.value()]);
        refs[prefetch].insert(refs[prefetch].end(), plan.refs.begin(), plan.refs.end());
      }, prefetch == 1);
      ASSERT_TRUE(stats) << stats.error().ToString();
      // The raw timings, before overlap() clamps them: every group step and every compute
      // lies inside the wall time, and serially they do not overlap at all.
      EXPECT_GT(stats->fetch_s, 0.0);
      EXPECT_LE(stats->compute_s, stats->wall_s);
      EXPECT_LE(stats->fetch_s, stats->wall_s);
      if (prefetch == 0) EXPECT_GE(stats->wall_s, stats->fetch_s + stats->compute_s);
      f.space->AdvanceRound();
    }
    EXPECT_TRUE(f.space->CheckInvariants());
    std::vector<std::vector<LogicalAddr>> wrong(3);
    std::vector<std::vector<SelectionRun>> wrong_runs(3);
    EXPECT_EQ(prefetcher.RunStep(wrong, wrong_runs, [](GroupId, const TpStepPlan&) {}).error().code(),
              ErrorCode::kInvalidArgument);
    std::vector<std::vector<LogicalAddr>> empty(4);
    EXPECT_EQ(prefetcher.RunStep(empty, wrong_runs, [](GroupId, const TpStepPlan&) {}).error().code(),
              ErrorCode::kInvalidArgument);
  }
  EXPECT_EQ(refs[0], refs[1]);
}

TEST(TpPrefetcher, OverlapIsTheHiddenFractionOfFetchTime) {
  EXPECT_DOUBLE_EQ((TpPipelineStats{.wall_s = 1.5, .fetch_s = 1.0, .compute_s = 1.0}).overlap(), 0.5);
  EXPECT_DOUBLE_EQ((TpPipelineStats{.wall_s = 1.0, .fetch_s = 0.5, .compute_s = 1.0}).overlap(), 1.0);
  EXPECT_DOUBLE_EQ((TpPipelineStats{.wall_s = 2.0, .fetch_s = 1.0, .compute_s = 1.0}).overlap(), 0.0);
  EXPECT_DOUBLE_EQ((TpPipelineStats{.wall_s = 2.5, .fetch_s = 1.0, .compute_s = 1.0}).overlap(), 0.0);  // clamped
  EXPECT_DOUBLE_EQ((TpPipelineStats{.wall_s = 1.0, .fetch_s = 0.0, .compute_s = 1.0}).overlap(), 0.0);
}

// A refusal in a later group changes nothing, in any group, and runs no compute.
TEST(TpPrefetcher, RefusalInALaterGroupStepsNoGroup) {
  testing::TpFixture f(testing::SmallTpConfig(2, 8, 24, 6, /*groups=*/3));
  TpPrefetcher prefetcher(*f.space);
  auto addrs = f.AddFilled(RequestId(1), 60);
  f.space->AdvanceRound();
  std::vector<std::vector<LogicalAddr>> sel(3);
  sel[0].assign(addrs.begin(), addrs.begin() + 6);
  sel[1].assign(addrs.begin() + 10, addrs.begin() + 14);
  sel[2].assign(addrs.begin(), addrs.begin() + 30);  // 15 remote entries per rank, 6 buffer slots
  const auto before = f.Take();
  const auto digest = f.space->DebugDigest();
  int computed = 0;
  auto runs_of = [](const std::vector<std::vector<LogicalAddr>>& sel) {  // every selection: request 1's
    std::vector<std::vector<SelectionRun>> runs;
    for (const auto& s : sel) runs.push_back(testing::TpRuns(RequestId(1), s.size()));
    return runs;
  };
  auto refused = prefetcher.RunStep(sel, runs_of(sel), [&](GroupId, const TpStepPlan&) { ++computed; });
  ASSERT_FALSE(refused);
  EXPECT_EQ(refused.error().code(), ErrorCode::kResourceExhausted);
  EXPECT_NE(refused.error().message().find("group 2"), std::string::npos) << refused.error().message();
  EXPECT_EQ(computed, 0);
  EXPECT_EQ(f.Take(), before);
  EXPECT_EQ(f.space->DebugDigest(), digest) << "policy state, rounds or free lists changed";
  sel[2].resize(6);
  ASSERT_TRUE(prefetcher.RunStep(sel, runs_of(sel), [&](GroupId, const TpStepPlan&) { ++computed; }));
  EXPECT_EQ(computed, 3);
}

// A failed transfer in group g: groups before g were stepped and computed, g has the
// planner's documented state, later groups are untouched.
TEST(TpPrefetcher, FailedTransferStopsAtItsGroupAndLosesNothing) {
  auto inner = MakeCpuBackend({.copy_threads = 1});
  auto fb = MakeFaultInjectingBackend(*inner, FaultPlan{.fail_every_nth = 3}).value();
  auto space = TpAddressSpace::Create(testing::SmallTpConfig(2, 8, 24, 16, /*groups=*/3), *fb).value();
  TpPrefetcher prefetcher(*space, {.parallel_ranks = false});
  fb->set_armed(false);
  ASSERT_TRUE(space->AddRequest(RequestId(1)));
  const auto addrs = space->Allocate(RequestId(1), 60).value();
  for (LogicalAddr a : addrs) {
    for (std::uint16_t g = 0; g < 3; ++g) ASSERT_TRUE(space->Write(a, GroupId(g), testing::TpPattern(a, g, 32)));
  }
  space->AdvanceRound();
  std::vector<std::vector<LogicalAddr>> sel(3, std::vector<LogicalAddr>(addrs.end() - 6, addrs.end()));
  std::vector<std::uint16_t> computed;
  fb->set_armed(true);
  // Per group: one home swap batch and one remote copy batch per rank (4 batches): the
  // third batch, group 0's first remote copy, fails.
  const std::vector<std::vector<SelectionRun>> runs(3, testing::TpRuns(RequestId(1), 6));
  auto failed =
      prefetcher.RunStep(sel, runs, [&](GroupId g, const TpStepPlan&) { computed.push_back(g.value()); }, false);
  fb->set_armed(false);
  ASSERT_FALSE(failed);
  EXPECT_EQ(failed.error().code(), ErrorCode::kIo);
  EXPECT_NE(failed.error().message().find("group 0 of 3 failed"), std::string::npos) << failed.error().message();
  EXPECT_TRUE(computed.empty());
  EXPECT_TRUE(space->CheckInvariants());
  std::vector<std::byte> out(32);
  for (LogicalAddr a : addrs) {
    for (std::uint16_t g = 0; g < 3; ++g) {
      ASSERT_TRUE(space->Read(a, GroupId(g), out));
      EXPECT_EQ(out, testing::TpPattern(a, g, 32));
      for (std::uint16_t r = 0; r < 2; ++r) {
        if (g > 0) EXPECT_FALSE(space->BufferSlot(Rank(r), a, GroupId(g)).value()) << "a later group was stepped";
        auto slot = space->BufferSlot(Rank(r), a, GroupId(g)).value();
        if (slot) {
          EXPECT_EQ(std::memcmp(space->RefData(Rank(r), GroupId(g), TpReadRef{TpReadRef::Source::kBuffer, *slot, Rank(r)}),
                                out.data(), 32), 0);
        }
      }
    }
  }
  EXPECT_GE(fb->stats().injected, 1u);
}

}  // namespace
}  // namespace ula
