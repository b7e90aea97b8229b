#include "ula/tp_prefetcher.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <random>

#include "tp/tp_fixture.h"
#include "test_seed.h"

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
      EXPECT_GE(stats->overlap(), 0.0);
      EXPECT_LE(stats->overlap(), 1.0);
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

}  // namespace
}  // namespace ula
