// Host shadows per TP shard (TpConfig::host_shadows, sparse/host_shadows.h): a home
// entry fetched host -> device keeps its host slot as a clean copy, counted free; evicting it
// later moves no bytes; a write drops the shadow; a free frees it; host allocations reclaim
// shadows, oldest first; the engine path turns them off, PlanHome refuses them, a device
// step counts them free.
#include <gtest/gtest.h>

#include <vector>

#include "tp/tp_fixture.h"
#include "ula/device_step.h"
#include "ula/tp_engine_step.h"
#include "ula/tp_step_planner.h"

namespace ula {
namespace {

constexpr std::uint32_t kBytes = 32;

// 2 ranks, 1 group, 4 device and 16 host slots per shard; request 1 holds 32 tokens
// (addresses 0..31, one page: even ones homed on rank 0), each written: per shard 4 on device
// (no shadow: written there), 12 on host.
struct Fixture {
  static std::unique_ptr<TpAddressSpace> MakeSpace(Backend& backend) {
    TpConfig c = testing::SmallTpConfig(2, 4, 16, 0, 1, kBytes);
    c.attention = TpAttention::kAtHome;
    c.policy = PolicyKind::kKernelPbLru;
    c.host_shadows = true;
    return TpAddressSpace::Create(c, backend).value();
  }
  Fixture() {
    EXPECT_TRUE(space->AddRequest(RequestId(1)));
    addrs = space->Allocate(RequestId(1), 32).value();
    for (LogicalAddr a : addrs) EXPECT_TRUE(space->Write(a, GroupId(0), testing::TpPattern(a, 0, kBytes)));
    space->AdvanceRound();
  }
  // One step of rank 0's addresses `even` (all homed on rank 0).
  Result<TpStepPlan> Step(std::vector<std::uint32_t> even) {
    std::vector<LogicalAddr> sel;
    for (std::uint32_t a : even) sel.push_back(LogicalAddr(a));
    const std::vector<SelectionRun> runs{{RequestId(1), static_cast<std::uint32_t>(sel.size())}};
    return planner.Step(GroupId(0), sel, runs);
  }
  void ExpectBytes(std::uint32_t version_of_16 = 0) const {
    std::vector<std::byte> got(kBytes);
    for (LogicalAddr a : addrs) {
      ASSERT_TRUE(space->Read(a, GroupId(0), got));
      EXPECT_EQ(got, testing::TpPattern(a, 0, kBytes, a.value() == 16 ? version_of_16 : 0)) << "address " << a.value();
    }
    EXPECT_TRUE(space->CheckInvariants());
  }
  std::unique_ptr<Backend> backend = MakeCpuBackend({.copy_threads = 1});
  std::unique_ptr<TpAddressSpace> space = MakeSpace(*backend);
  TpStepPlanner planner{*space};
  std::vector<LogicalAddr> addrs;
};

TEST(TpHostShadows, FetchKeepsTheHostSlotAndTheNextEvictionMovesNoBytes) {
  Fixture f;
  const Rank r0(0);
  const GroupId g(0);
  EXPECT_EQ(f.space->NumFree(r0, g, Tier::kHost), 4u);
  // The victims were written on device: no shadow, copied out to the 4 free host slots.
  auto first = f.Step({8, 10, 12, 14});
  ASSERT_TRUE(first) << first.error().ToString();
  EXPECT_EQ(first->stats[0].misses, 4u);
  EXPECT_EQ(first->stats[0].shadow_evictions, 0u);
  EXPECT_EQ(first->stats[0].bytes_moved, 8u * kBytes) << "4 victims out, 4 entries in";
  EXPECT_EQ(f.space->NumHostShadows(r0, g), 4u) << "the fetched entries' host slots stay as shadows";
  EXPECT_EQ(f.space->NumFree(r0, g, Tier::kHost), 4u) << "a shadow is free capacity: 4 shadows, 0 plain free slots";
  EXPECT_EQ(f.space->NumUsed(r0, g, Tier::kHost), 12u);
  f.ExpectBytes();
  f.space->AdvanceRound();
  // Now the victims have shadows: evicted by the table alone, only the fills move.
  auto second = f.Step({16, 18, 20, 22});
  ASSERT_TRUE(second) << second.error().ToString();
  EXPECT_EQ(second->stats[0].shadow_evictions, 4u);
  EXPECT_EQ(second->stats[0].bytes_moved, 4u * kBytes) << "1.0 entries over the host link per miss";
  EXPECT_EQ(f.space->NumHostShadows(r0, g), 4u);
  f.ExpectBytes();
}

TEST(TpHostShadows, AWriteDropsTheShadowAndTheEvictionThenCopiesTheNewBytes) {
  Fixture f;
  ASSERT_TRUE(f.Step({16, 18, 20, 22}));
  f.space->AdvanceRound();
  ASSERT_EQ(f.space->NumHostShadows(Rank(0), GroupId(0)), 4u);
  ASSERT_TRUE(f.space->Write(LogicalAddr(16), GroupId(0), testing::TpPattern(LogicalAddr(16), 0, kBytes, 1)));
  EXPECT_EQ(f.space->NumHostShadows(Rank(0), GroupId(0)), 3u) << "the host copy is no longer clean";
  EXPECT_TRUE(f.space->CheckInvariants());
  auto evict = f.Step({8, 10, 12, 14});  // 16..22 evicted: 3 to their shadows, 16 copied out
  ASSERT_TRUE(evict) << evict.error().ToString();
  EXPECT_EQ(evict->stats[0].shadow_evictions, 3u);
  EXPECT_EQ(evict->stats[0].bytes_moved, 5u * kBytes);
  f.ExpectBytes(/*version_of_16=*/1);
}

TEST(TpHostShadows, FreeFreesTheShadowsAndAllocationsReclaimThem) {
  {
    Fixture f;
    ASSERT_TRUE(f.Step({8, 10, 12, 14}));
    f.space->AdvanceRound();
    ASSERT_EQ(f.space->NumHostShadows(Rank(0), GroupId(0)), 4u);
    ASSERT_EQ(f.space->NumFree(Rank(0), GroupId(0), Tier::kHost), 4u);
    // 8 new tokens, 4 per rank: rank 0's device is full and stable_new_entries is off, so they
    // go to host, where no plain slot is free: the 4 shadows are reclaimed, oldest first.
    auto more = f.space->Allocate(RequestId(1), 8);
    ASSERT_TRUE(more) << more.error().ToString();
    for (LogicalAddr a : *more) ASSERT_TRUE(f.space->Write(a, GroupId(0), testing::TpPattern(a, 0, kBytes)));
    f.addrs.insert(f.addrs.end(), more->begin(), more->end());
    EXPECT_EQ(f.space->NumHostShadows(Rank(0), GroupId(0)), 0u);
    EXPECT_EQ(f.space->NumFree(Rank(0), GroupId(0), Tier::kHost), 0u);
    f.ExpectBytes();
  }
  Fixture f;
  ASSERT_TRUE(f.Step({8, 10, 12, 14}));
  ASSERT_TRUE(f.space->Free(RequestId(1)));
  EXPECT_EQ(f.space->NumHostShadows(Rank(0), GroupId(0)), 0u);
  EXPECT_EQ(f.space->NumUsed(Rank(0), GroupId(0), Tier::kHost), 0u) << "no shadow outlives its entry";
  EXPECT_EQ(f.space->NumFree(Rank(0), GroupId(0), Tier::kHost), 16u);
  EXPECT_TRUE(f.space->CheckInvariants());
}

// Host shadows are a mode of the space (TpConfig::host_shadows). The forms that do not keep
// them refuse a space with them, with the reason, and change nothing: PlanHome and the
// engine path (TpEngineStepPlanner and the device step).
TEST(TpHostShadows, TheEnginePathAndPlanHomeRefuseThemAndChangeNothing) {
  Fixture f;
  ASSERT_TRUE(f.Step({8, 10, 12, 14}));
  f.space->AdvanceRound();
  ASSERT_EQ(f.space->NumHostShadows(Rank(0), GroupId(0)), 4u);
  const std::uint64_t before = f.space->DebugDigest();
  auto step = DeviceStep::Create(*f.space, Rank(0), GroupId(0), DeviceStepConfig{.max_rows = 1, .max_batch = 1, .max_top_k = 8});
  ASSERT_FALSE(step);
  EXPECT_EQ(step.error().code(), ErrorCode::kUnsupported);
  EXPECT_NE(step.error().message().find("TpConfig.host_shadows"), std::string::npos) << step.error().ToString();
  const std::vector<LogicalAddr> sel{LogicalAddr(16)};
  const std::vector<SelectionRun> runs{{RequestId(1), 1}};
  EXPECT_EQ(f.planner.PlanHome(GroupId(0), sel, runs, 8).error().code(), ErrorCode::kUnsupported);
  auto engine = TpEngineStepPlanner::Create(*f.space, {.max_batch = 1, .max_q_len = 1, .max_top_k = 8});
  ASSERT_FALSE(engine);
  EXPECT_EQ(engine.error().code(), ErrorCode::kUnsupported);
  EXPECT_EQ(f.space->DebugDigest(), before) << "every refusal changes nothing";
  EXPECT_EQ(f.space->NumHostShadows(Rank(0), GroupId(0)), 4u) << "no shadow dropped behind the space's back";
  f.ExpectBytes();
}

}  // namespace
}  // namespace ula
