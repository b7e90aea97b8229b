// DeviceStep::StoreInto / Reload over a TP space (ula/device_step.h, "The space between
// rounds"): every rank's device steps plan their shards (Check, the verdicts' MAX, Claim,
// Complete) and the host space allocates, frees and shares between rounds, against the same
// loop over TpStepPlanner on a twin space: the same indices and descriptors per rank,
// the same space digest after every round; a space changed behind a shard's step is refused.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <vector>

#include "step/device_step_fixture.h"
#include "test_seed.h"
#include "tp/tp_fixture.h"
#include "ula/backend.h"
#include "ula/device_step.h"
#include "ula/tp_step_planner.h"

namespace ula {
namespace {

using testing::DeviceIo;
using testing::Shape;

constexpr std::uint32_t kRanks = 2, kGroups = 2, kEntry = 48, kMaxBatch = 4, kTopK = 16;

TpConfig LoopConfig() {
  TpConfig c = testing::SmallTpConfig(kRanks, /*device=*/24, /*host=*/600, /*buffer=*/0, kGroups, kEntry);
  c.attention = TpAttention::kAtHome;
  c.policy = PolicyKind::kKernelPbLru;
  c.policy_options.recent_buckets = 3;
  c.page_tokens = 8;
  c.stable_new_entries = true;
  return c;
}

TEST(TpDeviceStepStore, ServesAnEngineLoopWithHostBookkeepingBetweenRounds) {
  ULA_TEST_SEEDED(seed, 20261203);
  std::mt19937_64 rng(seed);
  auto backend = MakeCountingBackend();
  auto ref = TpAddressSpace::Create(LoopConfig(), *backend).value();
  auto twin = TpAddressSpace::Create(LoopConfig(), *backend).value();
  auto planner =
      TpStepPlanner::Create(*ref, EngineStepConfig{.max_batch = kMaxBatch, .max_q_len = 1, .max_top_k = kTopK}).value();
  std::vector<RequestId> live;
  std::uint64_t next_id = 1;
  auto add_request = [&](std::uint32_t tokens) {
    const RequestId id(next_id++);
    ASSERT_TRUE(ref->AddRequest(id));
    ASSERT_TRUE(twin->AddRequest(id));
    auto a = ref->Allocate(id, tokens);
    auto b = twin->Allocate(id, tokens);
    ASSERT_TRUE(a && b);
    ASSERT_EQ(*a, *b);
    live.push_back(id);
  };
  for (int r = 0; r < 3; ++r) add_request(6 + static_cast<std::uint32_t>(rng() % 10));
  ref->AdvanceRound();
  twin->AdvanceRound();
  DeviceStepConfig dc{.max_rows = kMaxBatch, .max_batch = kMaxBatch, .max_top_k = kTopK};
  dc.max_addresses = 4096;
  dc.max_requests = 64;
  dc.max_adopted = 512;
  std::vector<std::vector<std::unique_ptr<DeviceStep>>> steps(kRanks);  // [rank][group]
  for (std::uint32_t r = 0; r < kRanks; ++r) {
    for (std::uint32_t g = 0; g < kGroups; ++g) steps[r].push_back(DeviceStep::Create(*twin, Rank(r), GroupId(g), dc).value());
  }
  std::vector<CopyDescriptor> ref_desc(planner->max_descriptors());
  int planned = 0, evictions = 0, failed = 0, freed = 0, shared = 0;
  for (int round = 0; round < 30; ++round) {
    if (round > 0) {  // the host's bookkeeping, the same on both spaces
      for (RequestId id : live) {
        auto a = ref->Allocate(id, 1);
        auto b = twin->Allocate(id, 1);
        ASSERT_EQ(a.has_value(), b.has_value());
        if (a) {
          ASSERT_EQ(*a, *b);
        }
      }
      if (rng() % 4 == 0 || live.size() < 2) add_request(4 + static_cast<std::uint32_t>(rng() % 12));
      if (rng() % 5 == 0 && live.size() > 2) {
        const std::size_t k = rng() % live.size();
        ASSERT_TRUE(ref->Free(live[k]));
        ASSERT_TRUE(twin->Free(live[k]));
        live.erase(live.begin() + static_cast<std::ptrdiff_t>(k));
        ++freed;
      }
      if (rng() % 5 == 0) {
        const auto src = ref->AddressesOf(live[rng() % live.size()]).value();
        const std::vector<LogicalAddr> prefix(src.begin(), src.begin() + std::min<std::size_t>(5, src.size()));
        const RequestId id(next_id++);
        ASSERT_TRUE(ref->AddRequest(id));
        ASSERT_TRUE(twin->AddRequest(id));
        ASSERT_TRUE(ref->ShareInto(id, prefix));
        ASSERT_TRUE(twin->ShareInto(id, prefix));
        live.push_back(id);
        ++shared;
      }
    }
    for (auto& per_rank : steps) {
      for (auto& step : per_rank) ASSERT_TRUE(step->Reload(*twin, nullptr)) << "round " << round;
    }
    for (int s = 0; s < 3; ++s) {
      const GroupId g(static_cast<std::uint32_t>(rng() % kGroups));
      Shape shape{.batch = 1 + static_cast<std::uint32_t>(rng() % std::min<std::size_t>(kMaxBatch, live.size())),
                  .q_len = 1, .top_k = kTopK, .sel_stride = kTopK, .idx_stride = kTopK};
      std::vector<RequestId> requests;
      std::vector<std::int32_t> dense(std::size_t{shape.batch} * kTopK, -1);
      for (std::uint32_t r = 0; r < shape.batch; ++r) {
        requests.push_back(live[rng() % live.size()]);
        const auto addrs = ref->AddressesOf(requests.back()).value();
        const std::uint32_t used = 1 + static_cast<std::uint32_t>(rng() % kTopK);
        for (std::uint32_t c = 0; c < used; ++c) {
          dense[std::size_t{r} * kTopK + c] = static_cast<std::int32_t>(addrs[rng() % addrs.size()].value());
        }
      }
      std::vector<std::int32_t> ref_indices(kRanks * dense.size(), -9);
      auto plan = planner->Plan(g, {shape.batch, 1, kTopK}, requests, dense, ref_indices, ref_desc);
      std::vector<DeviceIo> io(kRanks);
      std::uint32_t agreed = 0;
      for (std::uint32_t r = 0; r < kRanks; ++r) {
        io[r].Fill(shape, dense, requests, steps[r][g.value()]->max_descriptors());
        ASSERT_TRUE(steps[r][g.value()]->Check(io[r].arrays, nullptr));
        agreed = std::max(agreed, *steps[r][g.value()]->verdict());
      }
      for (std::uint32_t r = 0; r < kRanks; ++r) ASSERT_TRUE(steps[r][g.value()]->Claim(&agreed, nullptr));
      std::vector<std::uint8_t> status(plan ? plan->num_descriptors : 0, 0);
      if (plan && rng() % 3 == 0) {
        for (auto& x : status) x = rng() % 3 == 0 ? 1 : 0;
      }
      ASSERT_EQ(agreed == 0, plan.has_value()) << "round " << round << " seed " << seed;
      std::uint32_t first = 0;
      for (std::uint32_t r = 0; r < kRanks; ++r) {
        std::vector<std::uint8_t> mine(steps[r][g.value()]->max_descriptors(), 0);
        if (plan) {
          const std::uint32_t n = io[r].record.num_descriptors;
          for (std::uint32_t i = 0; i < n; ++i) {
            ASSERT_EQ(std::memcmp(&io[r].descriptors[i], &ref_desc[first + i], sizeof(CopyDescriptor)), 0)
                << "rank " << r << " descriptor " << i;
          }
          for (std::size_t i = 0; i < dense.size(); ++i) ASSERT_EQ(io[r].indices[i], ref_indices[r * dense.size() + i]);
          std::copy_n(status.begin() + first, n, mine.begin());
          first += n;
          evictions += static_cast<int>(io[r].record.evictions);
        }
        ASSERT_TRUE(steps[r][g.value()]->Complete(mine.data(), nullptr));
      }
      if (plan) {
        ++planned;
        failed += static_cast<int>(planner->Complete(plan->fence, status).value().failed);
      }
    }
    for (auto& per_rank : steps) {
      for (auto& step : per_rank) ASSERT_TRUE(step->StoreInto(*twin, nullptr)) << "round " << round;
    }
    ref->AdvanceRound();
    twin->AdvanceRound();
    ASSERT_EQ(ref->DebugDigest(), twin->DebugDigest()) << "round " << round << " seed " << seed;
    auto inv = twin->CheckInvariants();
    ASSERT_TRUE(inv) << inv.error().ToString();
  }
  EXPECT_GT(planned, 60);
  EXPECT_GT(evictions, 20);
  EXPECT_GT(failed, 3);
  EXPECT_GT(freed, 2);
  EXPECT_GT(shared, 2);
  // A shard's space changed behind its step (an Allocate after its moves): refused, nothing
  // changes; another TP space is refused too.
  for (auto& step : steps[1]) ASSERT_TRUE(step->Reload(*twin, nullptr));
  std::vector<std::int32_t> dense(kTopK, -1);
  const auto addrs = twin->AddressesOf(live[0]).value();
  for (std::size_t i = 0; i < std::min<std::size_t>(kTopK, addrs.size()); ++i) dense[i] = static_cast<std::int32_t>(addrs[i].value());
  DeviceIo io;
  io.Fill({.batch = 1, .q_len = 1, .top_k = kTopK, .sel_stride = kTopK, .idx_stride = kTopK}, dense, {live[0]},
          steps[1][0]->max_descriptors());
  ASSERT_TRUE(steps[1][0]->Check(io.arrays, nullptr));
  ASSERT_TRUE(steps[1][0]->Claim(steps[1][0]->verdict(), nullptr));
  std::vector<std::uint8_t> ok(steps[1][0]->max_descriptors(), 0);
  ASSERT_TRUE(steps[1][0]->Complete(ok.data(), nullptr));
  ASSERT_TRUE(twin->Allocate(live[0], 1));
  const std::uint64_t digest = twin->DebugDigest();
  auto st = steps[1][0]->StoreInto(*twin, nullptr);
  ASSERT_FALSE(st);
  EXPECT_EQ(st.error().code(), ErrorCode::kFailedPrecondition);
  EXPECT_EQ(twin->DebugDigest(), digest);
  EXPECT_EQ(steps[1][1]->StoreInto(*ref, nullptr).error().code(), ErrorCode::kInvalidArgument);
}

}  // namespace
}  // namespace ula
