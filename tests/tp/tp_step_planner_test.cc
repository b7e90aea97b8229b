#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <string>

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
  auto plan = f.planner.Step(GroupId(0), sel, testing::TpRuns(RequestId(1), sel.size())).value();
  ASSERT_EQ(plan.ranks.size(), 4u);
  f.ExpectPlanReadsPattern(plan, GroupId(0), sel);
  for (std::size_t h = 0; h < 4; ++h) {
    EXPECT_EQ(plan.refs[h][0], plan.refs[h][8]);
    EXPECT_EQ(plan.stats[h].distinct, 8u);
    EXPECT_EQ(plan.stats[h].hits, 2u);
    EXPECT_EQ(plan.stats[h].remote_fetches, 6u);
    EXPECT_EQ(plan.stats[h].source_batches, 3u);  // one batch per other rank
  }
  f.space->AdvanceRound();
  auto again = f.planner.Step(GroupId(0), sel, testing::TpRuns(RequestId(1), sel.size())).value();
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
  auto plan = f.planner.Step(GroupId(1), sel, testing::TpRuns(RequestId(1), sel.size())).value();
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
    EXPECT_EQ(plan.stats[h].misses, 3u);                         // the newest entries lay on host
    EXPECT_EQ(plan.stats[h].distinct, 12u);
    EXPECT_EQ(plan.stats[h].hits + plan.stats[h].misses, 3u);
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
  auto plan = f.planner.Step(GroupId(0), sel, testing::TpRuns(RequestId(1), sel.size())).value();
  f.ExpectPlanReadsPattern(plan, GroupId(0), sel);
  const auto total = plan.Total();
  EXPECT_EQ(total.misses, 8u);
  EXPECT_EQ(total.evictions, 8u);  // the device pools were full: swaps
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
  ASSERT_TRUE(f.planner.Step(GroupId(0), warm, testing::TpRuns(RequestId(2), warm.size())));
  f.space->AdvanceRound();
  // Rank 0: its own 5 host entries (2 free + 3 evictions); rank 1 fetches 2 of them.
  std::vector<LogicalAddr> home;
  for (LogicalAddr a : y) {
    if (f.space->HomeOf(a) == Rank(0) && f.space->Lookup(a, GroupId(0))->tier() == Tier::kHost) home.push_back(a);
  }
  ASSERT_EQ(home.size(), 5u);
  auto plan = f.planner.Step(GroupId(0), home, testing::TpRuns(RequestId(2), home.size())).value();
  f.ExpectPlanReadsPattern(plan, GroupId(0), home);
  EXPECT_EQ(plan.stats[0].misses, 5u);
  EXPECT_EQ(plan.stats[0].evictions, 3u);
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
  auto first = f.planner.Step(GroupId(0), odd, testing::TpRuns(RequestId(1), odd.size())).value();
  // Same round: the buffer is full of this round's entries, so the next remote set is refused.
  const auto before = f.Take();
  auto refused = f.planner.Step(GroupId(0), odd2, testing::TpRuns(RequestId(1), odd2.size()));
  ASSERT_FALSE(refused);
  EXPECT_EQ(refused.error().code(), ErrorCode::kResourceExhausted);
  EXPECT_NE(refused.error().message().find("6 copies are used in this round and cannot be evicted: call "
                                           "AdvanceRound() after the round's attention"), std::string::npos)
      << refused.error().ToString();
  EXPECT_EQ(f.Take(), before);
  f.ExpectPlanReadsPattern(first, GroupId(0), odd);  // the first plan is still valid
  f.space->AdvanceRound();
  auto second = f.planner.Step(GroupId(0), odd2, testing::TpRuns(RequestId(1), odd2.size())).value();
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
        auto plan = f.planner.Step(GroupId(g), sel, testing::TpRuns(RequestId(1), sel.size()));
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

// Isolation in TP, for both attention strategies: a selection kept from a freed request
// is refused after its addresses were reused by another request, with nothing changed on
// any rank; the new owner's selection of the same addresses is served.
TEST(TpStepPlanner, RefusesAFreedThenReusedAddressWithNothingChanged) {
  for (TpAttention attention : {TpAttention::kLocalBuffer, TpAttention::kAtHome}) {
    SCOPED_TRACE(std::string(TpAttentionName(attention)));
    TpConfig c = SmallTpConfig(4, 4, 8, attention == TpAttention::kAtHome ? 0 : 8);
    c.attention = attention;
    TpFixture f(c);
    auto old_addrs = f.AddFilled(RequestId(1), 8);
    std::vector<LogicalAddr> stale{old_addrs[5], old_addrs[0], old_addrs[3]};  // request 1's, kept
    ASSERT_TRUE(f.space->Free(RequestId(1)));
    f.requests.clear();
    auto reused = f.AddFilled(RequestId(2), 8);
    std::vector<LogicalAddr> a = old_addrs, b = reused;
    std::sort(a.begin(), a.end());
    std::sort(b.begin(), b.end());
    ASSERT_EQ(a, b);  // the freed addresses went to the next request
    f.space->AdvanceRound();
    const auto before = f.Take();
    auto refused = f.planner.Step(GroupId(0), stale, testing::TpRuns(RequestId(1), stale.size()));
    ASSERT_FALSE(refused);
    EXPECT_EQ(refused.error().code(), ErrorCode::kNotFound);
    EXPECT_NE(refused.error().message().find("request 1 of its run is unknown or freed"), std::string::npos)
        << refused.error().ToString();
    EXPECT_EQ(f.Take(), before);
    // One stale run in a batch refuses the whole step.
    std::vector<SelectionRun> runs{{RequestId(2), 2}, {RequestId(1), 1}};
    EXPECT_EQ(f.planner.Step(GroupId(0), stale, runs).error().code(), ErrorCode::kNotFound);
    EXPECT_EQ(f.Take(), before);
    // A live request's run naming another live request's addresses.
    auto mine = f.AddFilled(RequestId(3), 1);
    const auto before3 = f.Take();
    std::vector<LogicalAddr> mixed{mine[0], stale[0]};
    auto other = f.planner.Step(GroupId(0), mixed, testing::TpRuns(RequestId(3), mixed.size()));
    ASSERT_FALSE(other);
    EXPECT_EQ(other.error().code(), ErrorCode::kNotFound);
    EXPECT_NE(other.error().message().find("belongs to request 2, not to request 3"), std::string::npos)
        << other.error().ToString();
    EXPECT_EQ(f.Take(), before3);
    // Runs that do not cover the selections.
    std::vector<SelectionRun> short_runs{{RequestId(2), 2}};
    EXPECT_EQ(f.planner.Step(GroupId(0), stale, short_runs).error().code(), ErrorCode::kInvalidArgument);
    EXPECT_EQ(f.Take(), before3);
    auto plan = f.planner.Step(GroupId(0), stale, testing::TpRuns(RequestId(2), stale.size()));
    ASSERT_TRUE(plan) << plan.error().ToString();
    if (attention == TpAttention::kLocalBuffer) f.ExpectPlanReadsPattern(*plan, GroupId(0), stale);
    EXPECT_TRUE(f.space->CheckInvariants());
  }
}

// A space that hosts only some ranks needs the fabric that reaches the others: without it
// the step is refused (it used to dereference the missing fabric).
TEST(TpStepPlanner, WithoutTheFabricItNeedsTheStepFailsWithFailedPrecondition) {
  for (TpAttention attention : {TpAttention::kLocalBuffer, TpAttention::kAtHome}) {
    SCOPED_TRACE(std::string(TpAttentionName(attention)));
    auto backend = MakeCpuBackend({.copy_threads = 1});
    TpConfig c = SmallTpConfig(2, 4, 4, attention == TpAttention::kAtHome ? 0 : 4);
    c.attention = attention;
    const Rank mine(0);
    auto space = TpAddressSpace::Create(c, *backend, std::span(&mine, 1)).value();
    ASSERT_TRUE(space->AddRequest(RequestId(1)));
    auto addrs = space->Allocate(RequestId(1), 4).value();  // two homed on rank 1
    TpStepPlanner planner(*space);
    auto refused = planner.Step(GroupId(0), addrs, testing::TpRuns(RequestId(1), addrs.size()));
    ASSERT_FALSE(refused);
    EXPECT_EQ(refused.error().code(), ErrorCode::kFailedPrecondition);
    EXPECT_NE(refused.error().message().find("TpFabric"), std::string::npos) << refused.error().ToString();
    EXPECT_EQ(space->NumBuffered(mine, GroupId(0)), 0u);
    EXPECT_TRUE(space->CheckInvariants());
  }
}

// RefData checks rank, group, source and slot, and refuses the refs of another rank's row.
TEST(TpStepPlanner, RefDataRefusesRefsOfAnotherRankAndBadSlots) {
  TpFixture f(SmallTpConfig(2, 4, 4, 4));
  auto addrs = f.AddFilled(RequestId(1), 4);
  auto plan = f.planner.Step(GroupId(0), addrs, testing::TpRuns(RequestId(1), addrs.size())).value();
  ASSERT_EQ(plan.ranks.size(), 2u);
  for (std::size_t j = 0; j < addrs.size(); ++j) {
    EXPECT_NE(f.space->RefData(Rank(0), GroupId(0), plan.refs[0][j]), nullptr);
    EXPECT_EQ(f.space->RefData(Rank(1), GroupId(0), plan.refs[0][j]), nullptr) << "rank 0's ref read on rank 1";
    EXPECT_EQ(f.space->RefData(Rank(0), GroupId(0), plan.refs[1][j]), nullptr) << "rank 1's ref read on rank 0";
    EXPECT_EQ(f.space->RefData(Rank(0), GroupId(1), plan.refs[0][j]), nullptr);
  }
  TpReadRef bad = plan.refs[0][0];
  bad.slot = SlotId::Invalid();
  EXPECT_EQ(f.space->RefData(Rank(0), GroupId(0), bad), nullptr);
  bad.slot = SlotId(3);  // a free device slot of rank 0 (2 entries homed there)
  EXPECT_EQ(f.space->RefData(Rank(0), GroupId(0), bad), nullptr);
  bad.source = static_cast<TpReadRef::Source>(9);
  bad.slot = plan.refs[0][0].slot;
  EXPECT_EQ(f.space->RefData(Rank(0), GroupId(0), bad), nullptr);
  EXPECT_EQ(f.space->RefData(Rank(7), GroupId(0), plan.refs[0][0]), nullptr);
  EXPECT_EQ(f.space->ShardMemory(Rank(7), GroupId(0)).home, nullptr);
  EXPECT_EQ(f.space->ShardMemory(Rank(0), GroupId(3)).home, nullptr);
  EXPECT_NE(f.space->ShardMemory(Rank(0), GroupId(0)).home, nullptr);
}

// The home room bound, exactly: a rank whose device pool has 4 slots, all evictable, takes 4
// misses and refuses 5 (kResourceExhausted naming the room, nothing changed).
TEST(TpStepPlanner, TheHomeRoomBoundIsExact) {
  auto backend = MakeCpuBackend();
  TpConfig c = SmallTpConfig(2, /*device=*/4, /*host=*/16, 0, /*groups=*/2);
  c.attention = TpAttention::kAtHome;
  auto space = TpAddressSpace::Create(c, *backend).value();
  ASSERT_TRUE(space->AddRequest(RequestId(1)));
  ASSERT_TRUE(space->Allocate(RequestId(1), 24));  // 12 per rank: 4 on device, 8 on host
  space->AdvanceRound();
  std::vector<LogicalAddr> on_host;  // rank 0's entries on host
  const auto list = space->AddressesOf(RequestId(1)).value();
  for (LogicalAddr x : list) {
    if (space->HomeOf(x) == Rank(0) && space->Lookup(x, GroupId(0))->tier() == Tier::kHost) on_host.push_back(x);
  }
  ASSERT_GE(on_host.size(), 5u);
  TpStepPlanner planner(*space, nullptr, {.parallel_ranks = false});
  for (std::size_t k : {5u, 4u}) {
    const std::vector<LogicalAddr> sel(on_host.begin(), on_host.begin() + static_cast<std::ptrdiff_t>(k));
    const std::vector<SelectionRun> runs{{RequestId(1), static_cast<std::uint32_t>(k)}};
    const auto before = space->DebugDigest();
    auto plan = planner.Step(GroupId(0), sel, runs);
    ASSERT_EQ(plan.has_value(), k == 4) << k << " misses";
    if (k == 5) {
      EXPECT_EQ(plan.error().code(), ErrorCode::kResourceExhausted) << plan.error().ToString();
      EXPECT_NE(plan.error().message().find("only 4 device slots are free or evictable"), std::string::npos)
          << plan.error().ToString();
      EXPECT_EQ(space->DebugDigest(), before) << "a refused step changes nothing";
    }
  }
  EXPECT_TRUE(space->CheckInvariants());
}

}  // namespace
}  // namespace ula
