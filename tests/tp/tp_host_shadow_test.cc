// Host shadows per TP shard (TpConfig::host_shadows, sparse/host_shadows.h): a home
// entry fetched host -> device keeps its host slot as a clean copy, counted free; evicting it
// later moves no bytes; a write drops the shadow; a free frees it; host allocations reclaim
// shadows, oldest first. The engine path (TpStepPlanner::Plan / Complete) keeps them
// as the library path (TpStepPlanner::Step) does: the same decisions and the same bytes read,
// step by step on a seeded workload; the device step refuses them.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "backend/fault_backend.h"
#include "test_seed.h"
#include "tp/tp_fixture.h"
#include "ula/device_step.h"
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

// Host shadows are a mode of the space (TpConfig::host_shadows). The device step does not
// keep them: it refuses a space with them, with the reason, and changes nothing.
TEST(TpHostShadows, TheDeviceStepRefusesThemAndChangesNothing) {
  Fixture f;
  ASSERT_TRUE(f.Step({8, 10, 12, 14}));
  f.space->AdvanceRound();
  ASSERT_EQ(f.space->NumHostShadows(Rank(0), GroupId(0)), 4u);
  const std::uint64_t before = f.space->DebugDigest();
  auto step = DeviceStep::Create(*f.space, Rank(0), GroupId(0), DeviceStepConfig{.max_rows = 1, .max_batch = 1, .max_top_k = 8});
  ASSERT_FALSE(step);
  EXPECT_EQ(step.error().code(), ErrorCode::kUnsupported);
  EXPECT_NE(step.error().message().find("TpConfig.host_shadows"), std::string::npos) << step.error().ToString();
  EXPECT_EQ(f.space->DebugDigest(), before) << "the refusal changes nothing";
  EXPECT_EQ(f.space->NumHostShadows(Rank(0), GroupId(0)), 4u) << "no shadow dropped behind the space's back";
  f.ExpectBytes();
}

// The engine path with host shadows (tp_step_planner.h, "Host shadows"): Plan's descriptors run
// by ExecuteOnShards, then Complete, against TpStepPlanner::Step on a twin space, step by step
// over one seeded workload under device pressure, in both attentions: the same indices (the
// refs of Step), the same stats, the same state (DebugDigest), and every selection reads its
// entry's bytes. Victims go to their shadows (no descriptor of their own), to host slots of
// their own (kEvict) and swap. With injected faults: nothing lost, every published selection
// reads its bytes, the invariants (a shadow equals its entry's device bytes) hold.
class TpHostShadowEngineTest : public ::testing::TestWithParam<TpAttention> {};

TEST_P(TpHostShadowEngineTest, EnginePathMakesTheLibraryPathsDecisionsAndReadsTheSameBytes) {
  ULA_TEST_SEEDED(seed, 20261212);
  const TpAttention attention = GetParam();
  const bool at_home = attention == TpAttention::kAtHome;
  constexpr std::uint32_t kRanks = 2, kRequests = 3, kTokens = 40, kTopK = 6;
  for (bool faults : {false, true}) {
    std::mt19937_64 rng(seed + faults);
    TpConfig c = testing::SmallTpConfig(kRanks, /*device=*/16, /*host=*/48, /*buffer=*/at_home ? 0 : 16, 1, kBytes);
    c.attention = attention;
    c.stable_new_entries = true;  // the engine path's mode
    c.host_shadows = true;
    c.policy = PolicyKind::kKernelPbLru;
    auto inner = MakeCpuBackend({.copy_threads = 1});
    auto fb = MakeFaultInjectingBackend(*inner, FaultPlan{.seed = seed, .fail_fraction = faults ? 0.2 : 0.0,
                                                          .partial = true})
                  .value();
    auto twin_backend = MakeCpuBackend({.copy_threads = 1});
    auto space = TpAddressSpace::Create(c, *fb).value();
    auto twin = TpAddressSpace::Create(c, *twin_backend).value();
    std::vector<std::vector<LogicalAddr>> addrs;
    for (TpAddressSpace* s : {space.get(), twin.get()}) {
      addrs.clear();
      for (std::uint32_t r = 0; r < kRequests; ++r) {
        ASSERT_TRUE(s->AddRequest(RequestId(r)));
        addrs.push_back(s->Allocate(RequestId(r), kTokens).value());
        for (LogicalAddr a : addrs.back()) ASSERT_TRUE(s->Write(a, GroupId(0), testing::TpPattern(a, 0, kBytes)));
      }
      s->AdvanceRound();
    }
    auto engine = TpStepPlanner::Create(*space, {kRequests, 1, kTopK}).value();
    TpStepPlanner library(*twin);
    const std::vector<RequestId> requests{RequestId(0), RequestId(1), RequestId(2)};
    const StepShape shape{kRequests, 1, kTopK};
    std::vector<CopyDescriptor> descriptors(engine->max_descriptors());
    std::uint64_t to_shadow = 0, evicts = 0, swaps = 0, failed = 0;
    // The bytes at an index of rank h's array (or at a ref), else a failure.
    const auto expect_reads = [&](const TpAddressSpace& s, std::size_t rank, TpReadRef ref, LogicalAddr a, int step) {
      const std::byte* bytes = s.RefData(Rank(static_cast<std::uint16_t>(rank)), GroupId(0), ref);
      ASSERT_NE(bytes, nullptr) << "step " << step;
      EXPECT_EQ(std::memcmp(bytes, testing::TpPattern(a, 0, kBytes).data(), kBytes), 0)
          << "rank " << rank << " address " << a.value() << " step " << step;
    };
    for (int step = 0; step < 40; ++step) {
      // Selections [batch][1][top_k]: distinct addresses of the row's request, the last one padding.
      std::vector<std::int32_t> sel(shape.size(), kPadIndex);
      std::vector<LogicalAddr> compact;
      std::vector<SelectionRun> runs;
      for (std::uint32_t b = 0; b < kRequests; ++b) {
        std::vector<LogicalAddr> pool = addrs[b];
        std::shuffle(pool.begin(), pool.end(), rng);
        for (std::uint32_t j = 0; j + 1 < kTopK; ++j) {
          sel[std::size_t{b} * kTopK + j] = static_cast<std::int32_t>(pool[j].value());
          compact.push_back(pool[j]);
        }
        runs.push_back(SelectionRun{requests[b], kTopK - 1});
      }
      std::vector<std::int32_t> indices(kRanks * shape.size(), 777);
      auto planned = engine->Plan(GroupId(0), shape, requests, sel, indices, descriptors);
      ASSERT_TRUE(planned) << planned.error().message();
      const std::span<const CopyDescriptor> run(descriptors.data(), planned->num_descriptors);
      for (std::size_t i = planned->first_phase; i < run.size(); ++i) {
        evicts += run[i].op == static_cast<std::uint8_t>(CopyOp::kEvict);
        swaps += run[i].op == static_cast<std::uint8_t>(CopyOp::kSwap);
      }
      for (const StepStats& st : planned->stats) to_shadow += st.shadow_evictions;
      std::vector<std::uint8_t> status(run.size(), 9);
      engine->ExecuteOnShards(run, status);
      auto report = engine->Complete(planned->fence, status);
      ASSERT_TRUE(report) << report.error().message();
      failed += report->failed;
      ASSERT_TRUE(space->CheckInvariants()) << space->CheckInvariants().error().message();
      for (const auto& request : addrs) {  // nothing lost
        for (LogicalAddr a : request) {
          std::vector<std::byte> got(kBytes);
          ASSERT_TRUE(space->Read(a, GroupId(0), got));
          ASSERT_EQ(got, testing::TpPattern(a, 0, kBytes)) << "address " << a.value() << " step " << step;
        }
      }
      const auto ref_of = [&](std::size_t rank, std::int32_t index) {
        const auto u = static_cast<std::uint32_t>(index);
        const bool shard = u < engine->device_slots();
        return TpReadRef{shard ? TpReadRef::Source::kShard : TpReadRef::Source::kBuffer,
                         SlotId(shard ? u : u - engine->device_slots()), Rank(static_cast<std::uint16_t>(rank))};
      };
      if (faults) {  // only the published descriptors' selections are read
        std::vector<std::uint32_t> unpublished;
        for (std::size_t i = 0; i < status.size(); ++i) {
          if (status[i] != kDescriptorDone) unpublished.push_back(run[i].addr);
        }
        for (std::size_t rank = 0; rank < kRanks; ++rank) {
          for (std::size_t j = 0; j < shape.size(); ++j) {
            const std::int32_t index = indices[rank * shape.size() + j];
            if (index < 0 || std::count(unpublished.begin(), unpublished.end(), std::uint32_t(sel[j])) > 0) continue;
            expect_reads(*space, rank, ref_of(rank, index), LogicalAddr(std::uint32_t(sel[j])), step);
          }
        }
        space->AdvanceRound();
        continue;
      }
      EXPECT_EQ(report->failed, 0u);
      auto plan = library.Step(GroupId(0), compact, runs);
      ASSERT_TRUE(plan) << plan.error().message();
      ASSERT_TRUE(twin->CheckInvariants()) << twin->CheckInvariants().error().message();
      for (std::size_t rank = 0; rank < kRanks; ++rank) {
        EXPECT_EQ(planned->stats[rank], plan->stats[rank]) << "step " << step;
        for (std::size_t j = 0, k = 0; j < shape.size(); ++j) {
          const std::int32_t index = indices[rank * shape.size() + j];
          if (sel[j] == kPadIndex) {
            EXPECT_EQ(index, kPadIndex);
            continue;
          }
          const TpReadRef& ref = plan->refs[rank][k++];
          const LogicalAddr a(static_cast<std::uint32_t>(sel[j]));
          if (ref.source == TpReadRef::Source::kElsewhere) {
            EXPECT_EQ(index, kPadIndex) << "step " << step;
            continue;
          }
          ASSERT_GE(index, 0) << "step " << step;
          const TpReadRef got_ref = ref_of(rank, index);
          EXPECT_EQ(got_ref.source, ref.source) << "step " << step;
          EXPECT_EQ(got_ref.slot, ref.slot) << "step " << step;
          expect_reads(*space, rank, got_ref, a, step);
          expect_reads(*twin, rank, ref, a, step);
        }
      }
      EXPECT_EQ(space->DebugDigest(), twin->DebugDigest()) << "step " << step;
      twin->AdvanceRound();
      space->AdvanceRound();
    }
    std::printf("%s faults=%d: %llu victims to their shadows, %llu kEvict, %llu swaps, %llu failed\n",
                std::string(TpAttentionName(attention)).c_str(), faults ? 1 : 0,
                static_cast<unsigned long long>(to_shadow), static_cast<unsigned long long>(evicts),
                static_cast<unsigned long long>(swaps), static_cast<unsigned long long>(failed));
    EXPECT_GT(to_shadow, 5u) << "victims went to their shadows";
    EXPECT_GT(evicts + swaps, 0u) << "victims without a shadow moved";
    if (faults) {
      EXPECT_GT(failed, 0u);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Attention, TpHostShadowEngineTest,
                         ::testing::Values(TpAttention::kAtHome, TpAttention::kLocalBuffer),
                         [](const auto& info) { return std::string(TpAttentionName(info.param)); });

}  // namespace
}  // namespace ula
