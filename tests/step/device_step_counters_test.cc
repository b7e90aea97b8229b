// DeviceStepCounters (ula/device_step.h): the kernel launches and host synchronisations of
// one plan-execute-complete iteration of a (rank, group) step, by phase, pinned at today's
// counts in DP and TP (docs/ARCHITECTURE.md, "The device step": its launch count). A change
// that adds one launch or one host synchronisation to a phase fails here. The counts do not
// depend on the data (fixed shapes), so one step of each kind pins them; the OpenMP form
// counts the CUDA form's kernels.
#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <vector>

#include "step/device_step_fixture.h"
#include "step/space_fixture.h"
#include "tp/tp_fixture.h"
#include "ula/address_space.h"
#include "ula/backend.h"
#include "ula/device_step.h"
#include "ula/tp_address_space.h"

namespace ula {
namespace {

using testing::DeviceIo;

// Today's counts of one (rank, group) step: one cooperative launch per phase, its grid
// barriers where the kernel boundaries were (docs/ARCHITECTURE.md, "The device step"). Check:
// classify | tally scan | scatter with decide. Claim: one scan over the free and victim
// blocks' popcounts | take (the hits touched, free bits cleared, victims touched) |
// descriptors with indices and the resets | record (TP: the agreement is read by each of
// them, no launch of its own). Complete: publish. AdvanceRound: [rebase] | round end with the
// clock | fold (one launch in a rebase round too). DP's Plan is Check and Claim in one launch
// (no agreement between them), counted under check: 3 in DP, 4 in TP.
constexpr DeviceStepCounts kCheck{.launches = 1, .syncs = 0};
constexpr DeviceStepCounts kClaimDp{.launches = 0, .syncs = 0};
constexpr DeviceStepCounts kClaimTp{.launches = 1, .syncs = 0};
constexpr DeviceStepCounts kComplete{.launches = 1, .syncs = 0};
constexpr DeviceStepCounts kAdvance{.launches = 1, .syncs = 0};
constexpr DeviceStepCounts kNone{};

void ExpectCounts(const DeviceStepCounters& got, const DeviceStepCounts& claim, const char* what) {
  EXPECT_EQ(got.check.launches, kCheck.launches) << what << ": check launches";
  EXPECT_EQ(got.check.syncs, kCheck.syncs) << what << ": check syncs";
  EXPECT_EQ(got.claim.launches, claim.launches) << what << ": claim launches";
  EXPECT_EQ(got.claim.syncs, claim.syncs) << what << ": claim syncs";
  EXPECT_EQ(got.complete.launches, kComplete.launches) << what << ": complete launches";
  EXPECT_EQ(got.complete.syncs, kComplete.syncs) << what << ": complete syncs";
  EXPECT_EQ(got.advance_round.launches, kAdvance.launches) << what << ": advance_round launches";
  EXPECT_EQ(got.advance_round.syncs, kAdvance.syncs) << what << ": advance_round syncs";
  EXPECT_EQ(got.state, kNone) << what << ": nothing outside the step's phases";
}

TEST(DeviceStepCounters, DpIterationHasTodaysLaunchesAndNoSync) {
  auto backend = MakeCpuBackend();
  AddressSpaceConfig cfg = testing::EngineModes(testing::SmallConfig(24, 256, 1, 1, 32));
  cfg.policy = PolicyKind::kKernelPbLru;
  cfg.policy_options.recent_buckets = 2;
  auto space = AddressSpace::Create(cfg, *backend).value();
  ASSERT_TRUE(space->AddRequest(RequestId(0), Rank(0)));
  for (int round = 0; round < 6; ++round) {
    ASSERT_TRUE(space->Allocate(RequestId(0), 8).has_value());
    space->AdvanceRound();
  }
  const DeviceStepConfig dc{.max_rows = 2, .max_batch = 2, .max_top_k = 24};
  auto step = DeviceStep::Create(*space, Rank(0), GroupId(0), dc).value();
  const auto addrs = space->AddressesOf(RequestId(0)).value();
  // The request's 20 oldest entries (some on host), each twice: fewer than the device's 24 slots.
  std::vector<std::int32_t> dense(48, -1);
  for (std::size_t i = 0; i < 40; ++i) dense[i] = static_cast<std::int32_t>(addrs[i % 20].value());
  DeviceIo io;
  io.Fill({.batch = 2, .q_len = 1, .top_k = 24, .sel_stride = 24, .idx_stride = 24}, dense,
          {RequestId(0), RequestId(0)}, step->max_descriptors());
  std::vector<std::uint8_t> status(step->max_descriptors(), 0);
  for (int iteration = 0; iteration < 2; ++iteration) {
    const DeviceStepCounters before = step->counters();
    ASSERT_TRUE(step->Plan(io.arrays, nullptr));
    ASSERT_EQ(io.record.error, 0u);
    ASSERT_TRUE(step->Complete(status.data(), nullptr));
    ASSERT_TRUE(step->AdvanceRound(nullptr));
    const DeviceStepCounters got = step->counters().Since(before);
    ExpectCounts(got, kClaimDp, "DP");
    EXPECT_EQ(got.Step().launches, 3u);
    if (iteration == 0) {
      EXPECT_GT(io.record.misses, 0u) << "the step moves entries (descriptors written)";
    }
  }
  // Reading the state back is a host synchronisation, counted outside the step's phases.
  const DeviceStepCounters before = step->counters();
  ASSERT_TRUE(step->ReadState(nullptr).has_value());
  EXPECT_GT(step->counters().Since(before).state.syncs, 0u);
  EXPECT_EQ(step->counters().Since(before).Step(), kNone);
}

TEST(DeviceStepCounters, TpIterationHasTodaysLaunchesAndNoSync) {
  auto backend = MakeCpuBackend();
  TpConfig c = testing::SmallTpConfig(2, 16, /*host=*/200, /*buffer=*/0, 1, 48);
  c.attention = TpAttention::kAtHome;
  c.policy = PolicyKind::kKernelPbLru;
  c.policy_options.recent_buckets = 2;
  auto space = TpAddressSpace::Create(testing::TpEngineModes(c), *backend).value();
  ASSERT_TRUE(space->AddRequest(RequestId(1)));
  for (int round = 0; round < 6; ++round) {
    ASSERT_TRUE(space->Allocate(RequestId(1), 6).has_value());
    space->AdvanceRound();
  }
  const DeviceStepConfig dc{.max_rows = 1, .max_batch = 1, .max_top_k = 24};
  std::vector<std::unique_ptr<DeviceStep>> steps;
  for (std::uint32_t r = 0; r < 2; ++r) steps.push_back(DeviceStep::Create(*space, Rank(r), GroupId(0), dc).value());
  const auto addrs = space->AddressesOf(RequestId(1)).value();
  std::vector<std::int32_t> dense(24, -1);
  for (std::size_t i = 0; i < addrs.size() && i < dense.size(); ++i) dense[i] = static_cast<std::int32_t>(addrs[i].value());
  std::vector<DeviceIo> io(2);
  std::vector<DeviceStepCounters> before;
  for (auto& s : steps) before.push_back(s->counters());
  std::uint32_t agreed = 0;
  for (std::size_t r = 0; r < steps.size(); ++r) {
    io[r].Fill({.batch = 1, .q_len = 1, .top_k = 24, .sel_stride = 24, .idx_stride = 24}, dense, {RequestId(1)},
               steps[r]->max_descriptors());
    ASSERT_TRUE(steps[r]->Check(io[r].arrays, nullptr));
    agreed = std::max(agreed, *steps[r]->verdict());
  }
  ASSERT_EQ(agreed, 0u);
  for (std::size_t r = 0; r < steps.size(); ++r) {
    ASSERT_TRUE(steps[r]->Claim(&agreed, nullptr));
    std::vector<std::uint8_t> status(steps[r]->max_descriptors(), 0);
    ASSERT_TRUE(steps[r]->Complete(status.data(), nullptr));
    ASSERT_TRUE(steps[r]->AdvanceRound(nullptr));
    const DeviceStepCounters got = steps[r]->counters().Since(before[r]);
    ExpectCounts(got, kClaimTp, r == 0 ? "TP rank 0" : "TP rank 1");
    EXPECT_EQ(got.Step().launches, 4u);
  }
}

}  // namespace
}  // namespace ula
