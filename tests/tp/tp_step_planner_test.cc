#include <gtest/gtest.h>

#include <cstring>

#include "tp/tp_fixture.h"

namespace ula {
namespace {

using testing::SmallTpConfig;
using testing::TpFixture;

TEST(TpStepPlanner, ReadsOwnShardAndFetchesRemoteEntriesOnce) {
  TpFixture f(SmallTpConfig(4, 16, 0, 16));
  auto addrs = f.AddFilled(RequestId(1), 40);
  std::vector<LogicalAddr> sel(addrs.begin(), addrs.begin() + 8);
  sel.push_back(sel[0]);  // a duplicate selection reads the same slot
  auto plan = f.planner.Step(GroupId(0), sel).value();
  ASSERT_EQ(plan.ranks.size(), 4u);
  f.ExpectPlanReadsPattern(plan, GroupId(0), sel);
  for (std::size_t h = 0; h < 4; ++h) {
    EXPECT_EQ(plan.refs[h][0], plan.refs[h][8]);
    EXPECT_EQ(plan.stats[h].distinct, 8u);
    EXPECT_EQ(plan.stats[h].home_hits, 2u);
    EXPECT_EQ(plan.stats[h].remote_fetches, 6u);
    EXPECT_EQ(plan.stats[h].source_batches, 3u);  // one batch per other rank
  }
  f.space->AdvanceRound();
  auto again = f.planner.Step(GroupId(0), sel).value();
  f.ExpectPlanReadsPattern(again, GroupId(0), sel);
  EXPECT_EQ(again.Total().remote_fetches, 0u);
  EXPECT_EQ(again.Total().buffer_hits, 4u * 6);
  EXPECT_TRUE(f.space->CheckInvariants());
}

// Attention at home: each rank makes only its own shard's selected entries resident and
// reads them there; entries homed elsewhere are left to their home (no copy, no fetch).
TEST(TpStepPlanner, AttentionAtHomeReadsOnlyTheOwnShardAndMovesNothingBetweenRanks) {
  TpConfig c = SmallTpConfig(4, 4, 12, 0, /*groups=*/2);
  c.attention = TpAttention::kAtHome;
  TpFixture f(c);
  auto addrs = f.AddFilled(RequestId(1), 64);  // 16 per rank: 4 on device, 12 on host
  f.space->AdvanceRound();
  std::vector<LogicalAddr> sel(addrs.end() - 12, addrs.end());
  sel.push_back(sel[3]);
  auto plan = f.planner.Step(GroupId(1), sel).value();
  ASSERT_EQ(plan.ranks.size(), 4u);
  for (std::size_t h = 0; h < 4; ++h) {
    const Rank r = plan.ranks[h];
    std::uint64_t mine = 0;
    for (std::size_t j = 0; j < sel.size(); ++j) {
      const TpReadRef ref = plan.refs[h][j];
      if (f.space->HomeOf(sel[j]) != r) {
        EXPECT_EQ(ref.source, TpReadRef::Source::kElsewhere);
        EXPECT_EQ(f.space->RefData(r, GroupId(1), ref), nullptr);
        continue;
      }
      ++mine;
      ASSERT_EQ(ref.source, TpReadRef::Source::kShard);
      const std::byte* p = f.space->RefData(r, GroupId(1), ref);
      ASSERT_NE(p, nullptr);
      const auto want = testing::TpPattern(sel[j], 1, c.entry_bytes);
      EXPECT_EQ(std::memcmp(p, want.data(), want.size()), 0);
      EXPECT_EQ(f.space->Lookup(sel[j], GroupId(1)).value().tier(), Tier::kDevice);
    }
    EXPECT_EQ(mine, 3u + (f.space->HomeOf(sel[3]) == r ? 1u : 0u));  // striped 3 per rank, plus the duplicate
    EXPECT_EQ(plan.stats[h].home_misses, 3u);                         // the newest entries lay on host
    EXPECT_EQ(plan.stats[h].distinct, 12u);
    EXPECT_EQ(plan.stats[h].home_hits + plan.stats[h].home_misses, 3u);
    EXPECT_EQ(plan.stats[h].elsewhere, 9u);
    EXPECT_EQ(plan.stats[h].remote_fetches, 0u);
    EXPECT_EQ(plan.stats[h].remote_bytes, 0u);
    EXPECT_EQ(f.space->NumBuffered(r, GroupId(1)), 0u);
  }
  EXPECT_TRUE(f.space->CheckInvariants());
}

TEST(TpStepPlanner, SwapsHostResidentHomeEntriesOntoDevice) {
  TpFixture f(SmallTpConfig(2, 4, 12, 16));
  auto addrs = f.AddFilled(RequestId(1), 32);  // 16 per rank: 4 on device, 12 on host
  f.space->AdvanceRound();  // new entries count as used in the round they arrived
  std::vector<LogicalAddr> sel(addrs.end() - 8, addrs.end());
  auto plan = f.planner.Step(GroupId(0), sel).value();
  f.ExpectPlanReadsPattern(plan, GroupId(0), sel);
  const auto total = plan.Total();
  EXPECT_EQ(total.home_misses, 8u);
  EXPECT_EQ(total.home_evictions, 8u);  // the device pools were full: swaps
  for (LogicalAddr a : sel) EXPECT_EQ(f.space->Lookup(a, GroupId(0))->tier(), Tier::kDevice);
  // Every entry still reads its bytes, wherever it went.
  std::vector<std::byte> out(32);
  for (LogicalAddr a : addrs) {
    ASSERT_TRUE(f.space->Read(a, GroupId(0), out));
    EXPECT_EQ(out, testing::TpPattern(a, 0, 32));
  }
  EXPECT_TRUE(f.space->CheckInvariants());
}

// Free slots first, then victims, in the home phase (device pool) and in the remote phase
// (local buffer).
TEST(TpStepPlanner, MissesFillEveryFreeSlotThenEvict) {
  TpFixture f(SmallTpConfig(2, 6, 12, 6));
  auto x = f.AddFilled(RequestId(1), 4);   // 2 per rank, on device
  auto y = f.AddFilled(RequestId(2), 18);  // 9 per rank: 4 on device, 5 on host
  ASSERT_TRUE(f.space->Free(RequestId(1)));  // 2 device slots free per rank
  // Rank 1 buffers 3 of rank 0's device entries (3 of its 6 buffer slots).
  std::vector<LogicalAddr> warm;
  for (LogicalAddr a : y) {
    if (warm.size() < 3 && f.space->HomeOf(a) == Rank(0) && f.space->Lookup(a, GroupId(0))->tier() == Tier::kDevice) {
      warm.push_back(a);
    }
  }
  ASSERT_TRUE(f.planner.Step(GroupId(0), warm));
  f.space->AdvanceRound();
  // Rank 0: its own 5 host entries (2 free + 3 evictions); rank 1 fetches 2 of them.
  std::vector<LogicalAddr> home;
  for (LogicalAddr a : y) {
    if (f.space->HomeOf(a) == Rank(0) && f.space->Lookup(a, GroupId(0))->tier() == Tier::kHost) home.push_back(a);
  }
  ASSERT_EQ(home.size(), 5u);
  auto plan = f.planner.Step(GroupId(0), home).value();
  f.ExpectPlanReadsPattern(plan, GroupId(0), home);
  EXPECT_EQ(plan.stats[0].home_misses, 5u);
  EXPECT_EQ(plan.stats[0].home_evictions, 3u);
  EXPECT_EQ(f.space->NumFree(Rank(0), GroupId(0), Tier::kDevice), 0u);
  EXPECT_EQ(plan.stats[1].remote_fetches, 5u);
  EXPECT_EQ(plan.stats[1].buffer_evictions, 2u);  // 3 free buffer slots, then 2 victims
  EXPECT_EQ(f.space->NumBuffered(Rank(1), GroupId(0)), 6u);
  (void)x;
}

TEST(TpStepPlanner, NeverEvictsBufferEntriesOfTheCurrentRound) {
  TpFixture f(SmallTpConfig(2, 32, 0, 6));
  auto addrs = f.AddFilled(RequestId(1), 40);
  std::vector<LogicalAddr> odd, odd2;  // addresses homed on rank 1, remote for rank 0
  for (LogicalAddr a : addrs) {
    if (a.value() % 2 == 1) (odd.size() < 6 ? odd : odd2).push_back(a);
  }
  odd2.resize(6);
  auto first = f.planner.Step(GroupId(0), odd).value();
  // Same round: the buffer is full of this round's entries, so the next remote set is refused.
  const auto before = f.Take();
  auto refused = f.planner.Step(GroupId(0), odd2);
  ASSERT_FALSE(refused);
  EXPECT_EQ(refused.error().code(), ErrorCode::kResourceExhausted);
  EXPECT_EQ(f.Take(), before);
  f.ExpectPlanReadsPattern(first, GroupId(0), odd);  // the first plan is still valid
  f.space->AdvanceRound();
  auto second = f.planner.Step(GroupId(0), odd2).value();
  f.ExpectPlanReadsPattern(second, GroupId(0), odd2);
  EXPECT_EQ(second.stats[0].buffer_evictions, 6u);
  EXPECT_TRUE(f.space->CheckInvariants());
}

TEST(TpStepPlanner, SerialAndParallelRanksGiveIdenticalPlans) {
  std::vector<TpStepPlan> plans[2];
  for (int parallel = 0; parallel < 2; ++parallel) {
    TpFixture f(SmallTpConfig(8, 8, 24, 24, 2), /*copy_threads=*/parallel ? 2 : 0, parallel == 1);
    auto addrs = f.AddFilled(RequestId(1), 200);
    f.space->AdvanceRound();
    for (int step = 0; step < 6; ++step) {
      for (std::uint16_t g = 0; g < 2; ++g) {
        std::vector<LogicalAddr> sel;
        for (int i = 0; i < 20; ++i) sel.push_back(addrs[(step * 13 + i * 7 + g) % addrs.size()]);
        auto plan = f.planner.Step(GroupId(g), sel);
        ASSERT_TRUE(plan) << plan.error().ToString();
        f.ExpectPlanReadsPattern(*plan, GroupId(g), sel);
        plans[parallel].push_back(std::move(*plan));
      }
      f.space->AdvanceRound();
    }
    EXPECT_TRUE(f.space->CheckInvariants());
  }
  ASSERT_EQ(plans[0].size(), plans[1].size());
  for (std::size_t i = 0; i < plans[0].size(); ++i) {
    EXPECT_EQ(plans[0][i].refs, plans[1][i].refs);
    EXPECT_EQ(plans[0][i].stats, plans[1][i].stats);
  }
}

}  // namespace
}  // namespace ula
