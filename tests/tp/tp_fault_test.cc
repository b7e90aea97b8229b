// TP step planner under injected transfer failures (backend/fault_backend.h, fault_fabric.h):
// a failed fetch or copy publishes nothing it did not copy and loses no entry's bytes.
//   - with a fabric (ranks as threads, tests/tp/thread_fabric.h): a failed FetchFromHome
//     (whole or partial) leaves none of its entries buffered, and the next step fetches
//     them again and reads their bytes;
//   - in-process ranks with a fault-injecting backend (home swaps, home copies, remote
//     copies; failures at Submit and at the fence; partial batches; delayed completions):
//     after every step, failed or not, every home and every buffered copy holds its
//     entry's bytes and every invariant holds.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <random>
#include <thread>

#include "tp/thread_fabric.h"
#include "tp/tp_fixture.h"
#include "backend/fault_backend.h"
#include "tp/fault_fabric.h"
#include "test_seed.h"

namespace ula {
namespace {

using testing::SmallTpConfig;
using testing::TpPattern;

// Every selection of the plan reads its entry's pattern bytes.
int PlanMismatches(const TpAddressSpace& space, const TpStepPlan& plan, GroupId g, std::span<const LogicalAddr> sel) {
  int bad = 0;
  for (std::size_t h = 0; h < plan.ranks.size(); ++h) {
    for (std::size_t j = 0; j < sel.size(); ++j) {
      if (plan.refs[h][j].source == TpReadRef::Source::kElsewhere) continue;  // its home reads it
      const std::byte* p = space.RefData(plan.ranks[h], g, plan.refs[h][j]);
      const auto want = TpPattern(sel[j], g.value(), space.config().entry_bytes);
      bad += p == nullptr || std::memcmp(p, want.data(), want.size()) != 0;
    }
  }
  return bad;
}

// One rank of a two-rank job; rank 0's fabric fails every fetch (whole or partial).
void FetchFailureRank(testing::ThreadFabricHub& hub, Rank me, bool partial) {
  auto backend = MakeCpuBackend({.copy_threads = 1});
  const TpConfig c = SmallTpConfig(2, 16, 16, 16);
  auto space = TpAddressSpace::Create(c, *backend, std::span(&me, 1)).value();
  testing::ThreadFabric base(hub, me);
  auto faulty = MakeFaultInjectingFabric(base, FaultPlan{.seed = 5, .fail_every_nth = 1, .partial = partial}).value();
  faulty->set_armed(me.value() == 0);
  TpFabric& fabric = *faulty;
  EXPECT_TRUE(space->AddRequest(RequestId(1)));
  const auto addrs = space->Allocate(RequestId(1), 20).value();
  for (LogicalAddr a : addrs) EXPECT_TRUE(space->Write(a, GroupId(0), TpPattern(a, 0, c.entry_bytes)));
  EXPECT_TRUE(fabric.Expose(*space));
  TpStepPlanner planner(*space, &fabric);
  std::vector<LogicalAddr> remote;
  for (LogicalAddr a : addrs) {
    if (space->HomeOf(a) != me) remote.push_back(a);
  }

  auto first = planner.Step(GroupId(0), addrs, std::vector<SelectionRun>{{RequestId(1), static_cast<std::uint32_t>(addrs.size())}});
  if (me.value() == 0) {
    EXPECT_FALSE(first);
    if (!first) {
      EXPECT_EQ(first.error().code(), ErrorCode::kIo);
      EXPECT_NE(first.error().message().find("fetch of 10 entries from rank 1"), std::string::npos) << first.error().message();
    }
    EXPECT_EQ(faulty->stats().fetches_failed, 1u);
    if (partial) {
      EXPECT_GT(faulty->stats().moves_landed_before_failure, 0u);
    }
    for (LogicalAddr a : remote) {
      EXPECT_FALSE(space->BufferSlot(me, a, GroupId(0)).value().has_value())
          << "address " << a.value() << " is buffered though its fetch failed";
    }
    EXPECT_EQ(space->NumBuffered(me, GroupId(0)), 0u);
    EXPECT_EQ(space->NumFree(me, GroupId(0), Tier::kDevice) + space->NumUsed(me, GroupId(0), Tier::kDevice), 16u);
  } else {
    EXPECT_TRUE(first) << first.error().ToString();
    if (first) {
      EXPECT_EQ(PlanMismatches(*space, *first, GroupId(0), addrs), 0);
    }
  }
  EXPECT_TRUE(space->CheckInvariants());

  faulty->set_armed(false);
  space->AdvanceRound();
  auto second = planner.Step(GroupId(0), addrs, std::vector<SelectionRun>{{RequestId(1), static_cast<std::uint32_t>(addrs.size())}});
  EXPECT_TRUE(second) << second.error().ToString();
  if (second) {
    EXPECT_EQ(PlanMismatches(*space, *second, GroupId(0), addrs), 0) << "rank " << me.value();
    EXPECT_EQ(second->stats[0].remote_fetches, me.value() == 0 ? remote.size() : 0u) << "rank " << me.value();
  }
  EXPECT_TRUE(space->CheckInvariants());
  fabric.Unexpose();
}

TEST(TpFault, FailedFabricFetchIsNotBufferedAndIsFetchedAgain) {
  for (bool partial : {false, true}) {
    SCOPED_TRACE(partial ? "partial fetch" : "whole fetch failed");
    testing::ThreadFabricHub hub(2);
    std::jthread r1([&] { FetchFailureRank(hub, Rank(1), partial); });
    FetchFailureRank(hub, Rank(0), partial);
  }
}

// In-process ranks on a fault-injecting backend, random steps.
void RandomInProcess(TpAttention attention, std::uint64_t seed) {
  SCOPED_TRACE(::ula::testing::SeedMessage(seed));
  auto inner = MakeCpuBackend({.copy_threads = 1});
  auto fb = MakeFaultInjectingBackend(*inner, FaultPlan{.seed = seed, .fail_fraction = 0.06, .partial = true,
                                                        .delay = std::chrono::microseconds(1)}).value();
  TpConfig c = SmallTpConfig(3, 12, 30, attention == TpAttention::kAtHome ? 0 : 14, /*groups=*/2);
  c.attention = attention;
  auto space = TpAddressSpace::Create(c, *fb).value();
  TpStepPlanner planner(*space, nullptr, {.parallel_ranks = true});
  std::mt19937_64 rng(seed);
  std::vector<LogicalAddr> addrs;
  fb->set_armed(false);
  for (std::uint64_t r = 1; r <= 3; ++r) {
    ASSERT_TRUE(space->AddRequest(RequestId(r)));
    const auto fresh = space->Allocate(RequestId(r), 30).value();
    for (LogicalAddr a : fresh) {
      addrs.push_back(a);
      for (std::uint16_t g = 0; g < 2; ++g) {
        auto w = space->Write(a, GroupId(g), TpPattern(a, g, c.entry_bytes));
        ASSERT_TRUE(w) << w.error().ToString();
      }
    }
  }
  fb->set_armed(true);
  int ok = 0, failed = 0;
  for (int step = 0; step < 160; ++step) {
    const GroupId g(static_cast<std::uint16_t>(rng() % 2));
    std::vector<LogicalAddr> sel;
    std::vector<SelectionRun> runs;  // one per selection: addrs[k] is request 1 + k / 30's
    const int n = 4 + static_cast<int>(rng() % 10);
    for (int i = 0; i < n; ++i) {
      const std::size_t k = rng() % addrs.size();
      sel.push_back(addrs[k]);
      runs.push_back(SelectionRun{RequestId(1 + k / 30), 1});
    }
    auto plan = planner.Step(g, sel, runs);
    fb->set_armed(false);
    if (plan) {
      ++ok;
      ASSERT_EQ(PlanMismatches(*space, *plan, g, sel), 0) << "step " << step;
    } else if (plan.error().code() == ErrorCode::kIo) {
      ++failed;
      EXPECT_NE(plan.error().message().find("injected fault"), std::string::npos) << plan.error().message();
    } else {
      ASSERT_EQ(plan.error().code(), ErrorCode::kResourceExhausted) << plan.error().ToString();
    }
    ASSERT_TRUE(space->CheckInvariants()) << "step " << step;
    // No entry lost (every home reads its bytes), no copy published early (every buffered
    // copy reads its entry's bytes).
    std::vector<std::byte> out(c.entry_bytes);
    for (LogicalAddr a : addrs) {
      for (std::uint16_t gg = 0; gg < 2; ++gg) {
        ASSERT_TRUE(space->Read(a, GroupId(gg), out));
        ASSERT_EQ(out, TpPattern(a, gg, c.entry_bytes)) << "step " << step << ": home bytes of " << a.value() << " lost";
        for (std::uint16_t q = 0; q < c.num_ranks; ++q) {
          auto slot = space->BufferSlot(Rank(q), a, GroupId(gg)).value();
          if (!slot) continue;
          const std::byte* p = space->RefData(Rank(q), GroupId(gg), TpReadRef{TpReadRef::Source::kBuffer, *slot, Rank(q)});
          ASSERT_EQ(std::memcmp(p, out.data(), out.size()), 0)
              << "step " << step << ": rank " << q << " buffers " << a.value() << " without its bytes";
        }
      }
    }
    if (rng() % 3 == 0) space->AdvanceRound();
    fb->set_armed(true);
  }
  const FaultStats s = fb->stats();
  std::printf("tp fault (%s): %d steps ok, %d failed; %llu faults injected (%llu partial, %llu at the wait)\n",
              TpAttentionName(attention).data(), ok, failed, (unsigned long long)s.injected,
              (unsigned long long)s.partial, (unsigned long long)s.waits_failed);
  EXPECT_GT(failed, 10);
  EXPECT_GT(ok, 10);
  if (attention == TpAttention::kLocalBuffer) {
    EXPECT_GT(s.partial, 0u);
  }
  EXPECT_GT(s.swaps_failed, 0u);
}

// Copy, wait, then publish, with several batches per phase: the backend holds every batch
// back until a wait reaches its fence (FaultPlan::delay), so a planner that waits on any
// fence but each batch's own (or on none) publishes slots whose bytes have not landed and
// the plan reads the wrong bytes. Home phase: a copy batch and a swap batch per rank;
// remote phase: one batch per source rank and tier (4 ranks: up to 6).
TEST(TpFault, EveryBatchIsPublishedOnlyAfterItsOwnFence) {
  auto inner = MakeCpuBackend({.copy_threads = 1});
  auto fb = MakeFaultInjectingBackend(*inner, FaultPlan{.delay = std::chrono::microseconds(1)}).value();
  TpConfig c = SmallTpConfig(4, 6, 20, 24);
  auto space = TpAddressSpace::Create(c, *fb).value();
  TpStepPlanner planner(*space, nullptr, {.parallel_ranks = false});
  ASSERT_TRUE(space->AddRequest(RequestId(1)));
  const auto addrs = space->Allocate(RequestId(1), 80).value();  // 20 per rank: 6 on device, 14 on host
  for (LogicalAddr a : addrs) ASSERT_TRUE(space->Write(a, GroupId(0), TpPattern(a, 0, c.entry_bytes)));
  std::mt19937_64 rng(::ula::testing::TestSeed(3));
  std::uint64_t batches = 0;
  for (int step = 0; step < 30; ++step) {
    space->AdvanceRound();
    std::vector<LogicalAddr> sel;
    for (int i = 0; i < 12; ++i) sel.push_back(addrs[rng() % addrs.size()]);
    const auto before = inner->counters().batches;
    auto plan = planner.Step(GroupId(0), sel, std::vector<SelectionRun>{{RequestId(1), static_cast<std::uint32_t>(sel.size())}});
    ASSERT_TRUE(plan) << plan.error().ToString();
    ASSERT_EQ(PlanMismatches(*space, *plan, GroupId(0), sel), 0) << "step " << step;
    batches += inner->counters().batches - before;
  }
  EXPECT_GT(fb->stats().delayed, 30u);
  EXPECT_GT(batches, 60u);  // several batches per step
}

// The home phase alone (attention at home: nothing waits after it; the selections are rank
// 0's own entries), so a swap batch published without its own wait is still held back
// when the plan is read.
TEST(TpFault, HomePhasePublishesEachBatchAfterItsOwnFence) {
  auto inner = MakeCpuBackend({.copy_threads = 1});
  auto fb = MakeFaultInjectingBackend(*inner, FaultPlan{.delay = std::chrono::microseconds(1)}).value();
  TpConfig c = SmallTpConfig(2, 6, 20, 0);
  c.attention = TpAttention::kAtHome;
  const Rank me(0);  // the selections are rank 0's own entries; rank 1 has nothing to do
  auto space = TpAddressSpace::Create(c, *fb).value();  // every rank hosted: no fabric needed
  TpStepPlanner planner(*space, nullptr, {.parallel_ranks = false});
  ASSERT_TRUE(space->AddRequest(RequestId(1)));
  ASSERT_TRUE(space->AddRequest(RequestId(2)));
  ASSERT_TRUE(space->Allocate(RequestId(1), 8));  // 4 of rank 0's 6 device slots, freed below
  const auto addrs = space->Allocate(RequestId(2), 32).value();
  std::vector<LogicalAddr> mine;
  for (LogicalAddr a : addrs) {
    if (space->HomeOf(a) != me) continue;
    mine.push_back(a);
    ASSERT_TRUE(space->Write(a, GroupId(0), TpPattern(a, 0, c.entry_bytes)));
  }
  ASSERT_TRUE(space->Free(RequestId(1)));
  std::mt19937_64 rng(::ula::testing::TestSeed(4));
  std::uint64_t swaps = 0;
  int mixed_steps = 0;  // steps with both a copy batch and a swap batch
  for (int step = 0; step < 30; ++step) {
    space->AdvanceRound();
    std::vector<LogicalAddr> sel;
    if (step == 0) {  // 6 host entries: 4 into the free slots, 2 swaps
      for (LogicalAddr a : mine) {
        if (sel.size() < 6 && space->Lookup(a, GroupId(0))->tier() == Tier::kHost) sel.push_back(a);
      }
    }
    while (sel.size() < 5) sel.push_back(mine[rng() % mine.size()]);
    auto plan = planner.Step(GroupId(0), sel, std::vector<SelectionRun>{{RequestId(2), static_cast<std::uint32_t>(sel.size())}});
    ASSERT_TRUE(plan) << plan.error().ToString();
    ASSERT_EQ(PlanMismatches(*space, *plan, GroupId(0), sel), 0) << "step " << step;
    swaps += plan->stats[0].evictions;
    const auto copies = plan->stats[0].misses - plan->stats[0].evictions;
    mixed_steps += copies > 0 && plan->stats[0].evictions > 0;
  }
  EXPECT_GT(swaps, 10u);
  EXPECT_GE(mixed_steps, 1);
}

TEST(TpFault, InProcessStepsLoseNothingAndPublishNothingEarly) {
  RandomInProcess(TpAttention::kLocalBuffer, ::ula::testing::TestSeed(20260613));
}

TEST(TpFault, InProcessAttentionAtHomeLosesNothing) { RandomInProcess(TpAttention::kAtHome, ::ula::testing::TestSeed(77)); }

}  // namespace
}  // namespace ula
