#include "ula/tp_prefetcher.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <random>

#include "tp/tp_fixture.h"
#include "test_seed.h"
#include "backend/fault_backend.h"

namespace ula {
namespace {

// The layered step gives the same plans as the serial one; compute(g, l) comes in group
// and layer order, and every ref handed to compute(g, l) holds layer l's bytes of its entry
// (layer l = bytes [l * E / L, (l + 1) * E / L)) while later layers may still be in flight;
// at the last layer the whole entry is there.
TEST(TpPrefetcher, LayeredPlansEqualSerialPlansAndEachLayerReadsItsBytes) {
  ULA_TEST_SEEDED(seed, 99);
  constexpr std::uint32_t kLayers = 4, kEntry = 64, kGroups = 4;
  std::vector<std::vector<TpReadRef>> refs[2];
  for (int layered = 0; layered < 2; ++layered) {
    testing::TpFixture f(testing::SmallTpConfig(4, 24, 64, 64, kGroups, kEntry), /*copy_threads=*/2);
    TpPrefetcher prefetcher(*f.space, kLayers);
    auto addrs = f.AddFilled(RequestId(1), 300);
    f.space->AdvanceRound();
    std::mt19937_64 rng(seed);
    for (int step = 0; step < 8; ++step) {
      std::vector<std::vector<LogicalAddr>> sel(kGroups);
      for (auto& s : sel) {
        for (int i = 0; i < 40; ++i) s.push_back(addrs[rng() % addrs.size()]);
      }
      std::vector<std::vector<SelectionRun>> runs(kGroups, testing::TpRuns(RequestId(1), 40));
      std::vector<std::pair<std::uint16_t, std::uint32_t>> order;
      auto stats = prefetcher.RunStep(sel, runs, [&](GroupId g, std::uint32_t l, const TpStepPlan& plan) {
        order.emplace_back(g.value(), l);
        constexpr std::uint32_t lb = kEntry / kLayers;
        for (std::size_t h = 0; h < plan.ranks.size(); ++h) {
          for (std::size_t j = 0; j < sel[g.value()].size(); ++j) {
            const std::byte* d = f.space->RefData(plan.ranks[h], g, plan.refs[h][j]);
            ASSERT_NE(d, nullptr);
            const auto want = testing::TpPattern(sel[g.value()][j], g.value(), kEntry);
            ASSERT_EQ(std::memcmp(d + l * lb, want.data() + l * lb, lb), 0)
                << "group " << g.value() << " layer " << l << " rank " << plan.ranks[h].value() << " selection " << j;
          }
        }
        if (l + 1 == kLayers) f.ExpectPlanReadsPattern(plan, g, sel[g.value()]);
        if (l == 0) refs[layered].insert(refs[layered].end(), plan.refs.begin(), plan.refs.end());
      }, layered == 1);
      ASSERT_TRUE(stats) << stats.error().ToString();
      ASSERT_EQ(order.size(), kGroups * kLayers);
      for (std::size_t i = 0; i < order.size(); ++i) {
        EXPECT_EQ(order[i], std::make_pair(static_cast<std::uint16_t>(i / kLayers), static_cast<std::uint32_t>(i % kLayers)));
      }
      // The raw timings, before overlap() clamps them: every group step and every compute
      // lies inside the wall time, the exposed part inside the fetch, and serially nothing
      // overlaps.
      EXPECT_GT(stats->fetch_s, 0.0);
      EXPECT_LE(stats->exposed_s, stats->fetch_s);
      EXPECT_LE(stats->compute_s, stats->wall_s);
      EXPECT_LE(stats->fetch_s, stats->wall_s);
      if (layered == 0) {
        EXPECT_GE(stats->wall_s, stats->fetch_s + stats->compute_s);
      }
      f.space->AdvanceRound();
    }
    EXPECT_TRUE(f.space->CheckInvariants());
    std::vector<std::vector<LogicalAddr>> wrong(3);
    std::vector<std::vector<SelectionRun>> wrong_runs(3);
    auto none = [](GroupId, std::uint32_t, const TpStepPlan&) {};
    EXPECT_EQ(prefetcher.RunStep(wrong, wrong_runs, none).error().code(), ErrorCode::kInvalidArgument);
    std::vector<std::vector<LogicalAddr>> empty(kGroups);
    EXPECT_EQ(prefetcher.RunStep(empty, wrong_runs, none).error().code(), ErrorCode::kInvalidArgument);
  }
  EXPECT_EQ(refs[0], refs[1]);
}

// A layer count that does not divide the entry is refused before anything changes.
TEST(TpPrefetcher, LayersThatDoNotDivideTheEntryAreRefused) {
  testing::TpFixture f(testing::SmallTpConfig(2, 8, 24, 6, /*groups=*/2, /*entry_bytes=*/32));
  auto addrs = f.AddFilled(RequestId(1), 20);
  f.space->AdvanceRound();
  const auto digest = f.space->DebugDigest();
  std::vector<std::vector<LogicalAddr>> sel(2, std::vector<LogicalAddr>(addrs.begin(), addrs.begin() + 4));
  std::vector<std::vector<SelectionRun>> runs(2, testing::TpRuns(RequestId(1), 4));
  int computed = 0;
  for (std::uint32_t layers : {0u, 3u}) {
    TpPrefetcher prefetcher(*f.space, layers);
    auto r = prefetcher.RunStep(sel, runs, [&](GroupId, std::uint32_t, const TpStepPlan&) { ++computed; });
    ASSERT_FALSE(r);
    EXPECT_EQ(r.error().code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(r.error().message().find("layers per group"), std::string::npos) << r.error().message();
  }
  EXPECT_EQ(computed, 0);
  EXPECT_EQ(f.space->DebugDigest(), digest);
  TpPrefetcher ok(*f.space, 8);
  EXPECT_TRUE(ok.RunStep(sel, runs, [&](GroupId, std::uint32_t, const TpStepPlan&) { ++computed; }));
  EXPECT_EQ(computed, 16);
}

TEST(TpPrefetcher, OverlapIsTheHiddenFractionOfFetchTime) {
  EXPECT_DOUBLE_EQ((TpPipelineStats{.wall_s = 1.5, .fetch_s = 1.0, .compute_s = 1.0, .totals = {}}).overlap(), 0.5);
  EXPECT_DOUBLE_EQ((TpPipelineStats{.wall_s = 1.0, .fetch_s = 0.5, .compute_s = 1.0, .totals = {}}).overlap(), 1.0);
  EXPECT_DOUBLE_EQ((TpPipelineStats{.wall_s = 2.0, .fetch_s = 1.0, .compute_s = 1.0, .totals = {}}).overlap(), 0.0);
  EXPECT_DOUBLE_EQ((TpPipelineStats{.wall_s = 2.5, .fetch_s = 1.0, .compute_s = 1.0, .totals = {}}).overlap(), 0.0);  // clamped
  EXPECT_DOUBLE_EQ((TpPipelineStats{.wall_s = 1.0, .fetch_s = 0.0, .compute_s = 1.0, .totals = {}}).overlap(), 0.0);
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
  auto refused = prefetcher.RunStep(sel, runs_of(sel), [&](GroupId, std::uint32_t, const TpStepPlan&) { ++computed; });
  ASSERT_FALSE(refused);
  EXPECT_EQ(refused.error().code(), ErrorCode::kResourceExhausted);
  EXPECT_NE(refused.error().message().find("group 2"), std::string::npos) << refused.error().message();
  EXPECT_EQ(computed, 0);
  EXPECT_EQ(f.Take(), before);
  EXPECT_EQ(f.space->DebugDigest(), digest) << "policy state, rounds or free lists changed";
  sel[2].resize(6);
  ASSERT_TRUE(prefetcher.RunStep(sel, runs_of(sel), [&](GroupId, std::uint32_t, const TpStepPlan&) { ++computed; }));
  EXPECT_EQ(computed, 3);
}

// A failed transfer in group g: groups before g were stepped and computed, g has the
// planner's documented state, later groups are untouched. Layered: a copy of layer 1 fails,
// so group 0's layer 0 was computed (its bytes had arrived) and no later layer or group;
// the entries whose layer-1 copy failed are not published in the buffer.
TEST(TpPrefetcher, FailedLayerCopyStopsAtItsLayerAndPublishesNothing) {
  for (int layered = 0; layered < 2; ++layered) {
    auto inner = MakeCpuBackend({.copy_threads = 1});
    auto fb = MakeFaultInjectingBackend(*inner, FaultPlan{.fail_every_nth = 4, .at_submit = false}).value();
    auto space = TpAddressSpace::Create(testing::SmallTpConfig(2, 8, 24, 16, /*groups=*/3), *fb).value();
    TpPrefetcher prefetcher(*space, /*layers_per_group=*/2, {.parallel_ranks = false});
    fb->set_armed(false);
    ASSERT_TRUE(space->AddRequest(RequestId(1)));
    const auto addrs = space->Allocate(RequestId(1), 60).value();
    for (LogicalAddr a : addrs) {
      for (std::uint16_t g = 0; g < 3; ++g) ASSERT_TRUE(space->Write(a, GroupId(g), testing::TpPattern(a, g, 32)));
    }
    space->AdvanceRound();
    const std::vector<LogicalAddr> chosen(addrs.end() - 6, addrs.end());
    std::vector<std::vector<LogicalAddr>> sel(3, chosen);
    std::vector<std::pair<std::uint16_t, std::uint32_t>> computed;
    fb->set_armed(true);
    // Per group, ranks in turn: one home swap batch per rank, then per rank one remote copy
    // batch per layer when layered (rank 0: layer 0 = the 3rd batch, layer 1 = the 4th,
    // which fails at its wait), or one whole-entry batch per rank when serial (the 4th:
    // rank 1's, which fails).
    const std::vector<std::vector<SelectionRun>> runs(3, testing::TpRuns(RequestId(1), 6));
    auto failed = prefetcher.RunStep(
        sel, runs, [&](GroupId g, std::uint32_t l, const TpStepPlan&) { computed.emplace_back(g.value(), l); },
        layered == 1);
    fb->set_armed(false);
    ASSERT_FALSE(failed);
    EXPECT_EQ(failed.error().code(), ErrorCode::kIo);
    EXPECT_NE(failed.error().message().find("group 0 of 3 failed"), std::string::npos) << failed.error().message();
    if (layered) {
      EXPECT_EQ(computed, (std::vector<std::pair<std::uint16_t, std::uint32_t>>{{0, 0}}));
    } else {
      EXPECT_TRUE(computed.empty());
    }
    EXPECT_TRUE(space->CheckInvariants());
    const Rank failed_rank(layered ? 0 : 1);
    std::vector<std::byte> out(32);
    for (LogicalAddr a : addrs) {
      for (std::uint16_t g = 0; g < 3; ++g) {
        ASSERT_TRUE(space->Read(a, GroupId(g), out));
        EXPECT_EQ(out, testing::TpPattern(a, g, 32));
        for (std::uint16_t r = 0; r < 2; ++r) {
          auto slot = space->BufferSlot(Rank(r), a, GroupId(g)).value();
          if (g > 0) {
            EXPECT_FALSE(slot) << "a later group was stepped";
          }
          if (Rank(r) == failed_rank && a.value() % 2 != r) {
            EXPECT_FALSE(slot) << "a failed copy was published";
          }
          if (slot) {
            EXPECT_EQ(std::memcmp(space->RefData(Rank(r), GroupId(g), TpReadRef{TpReadRef::Source::kBuffer, *slot, Rank(r)}),
                                  out.data(), 32), 0);
          }
        }
      }
    }
    EXPECT_GE(fb->stats().injected, 1u);
    EXPECT_EQ(fb->stats().waits_failed, fb->stats().injected);
  }
}

}  // namespace
}  // namespace ula
