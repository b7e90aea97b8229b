// Admission that guarantees the round in TP (TpStepPlanner::ReserveRound): the DP loop
// of tests/step/round_reservation_test.cc over two in-process ranks, attention at home and
// with local buffers. Scheduled by the token budget alone, a round's plan is refused after its
// tokens were allocated; reserving each round first, and deferring the requests that do not
// fit, no Allocate or Plan is refused.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <vector>

#include "test_seed.h"
#include "tp/tp_fixture.h"
#include "ula/tp_address_space.h"
#include "ula/tp_step_planner.h"

namespace ula {
namespace {

constexpr std::uint32_t kRanks = 2, kTopK = 64, kRequests = 4, kGroups = 2;

struct LoopCounts {
  std::uint32_t rounds = 0, refused_plans = 0, refused_allocates = 0, deferred = 0;
};

// Each rank's shard holds 100 device slots per group: 4 requests x 64 selections = 256
// distinct entries a step, about 128 homed on each rank, so the token budget alone has plans
// refused. The reservation cannot know how the indexer splits a request's 64 selections
// between the ranks (each rank's share is data), so it bounds each rank by all 64 (and the
// local buffer by all 64 homed elsewhere): one request per round fits (64 + 1 <= 100), two do
// not (130). Safe, and pessimistic by up to P x: the price of a guarantee without the split.
LoopCounts RunLoop(TpAttention attention, bool reserve, std::uint64_t seed) {
  auto backend = MakeCountingBackend();
  TpConfig c = testing::TpEngineModes(testing::SmallTpConfig(kRanks, 100, 4096, attention == TpAttention::kLocalBuffer ? 100 : 0,
                                                             kGroups));
  c.attention = attention;
  c.page_tokens = 64;
  auto space = TpAddressSpace::Create(c, *backend).value();
  auto planner = TpStepPlanner::Create(*space, {.max_batch = kRequests, .max_q_len = 1, .max_top_k = kTopK}).value();
  std::vector<RequestId> running;
  for (std::uint32_t r = 1; r <= kRequests; ++r) {
    EXPECT_TRUE(space->AddRequest(RequestId(r)));
    EXPECT_TRUE(space->Allocate(RequestId(r), 300));
    space->AdvanceRound();
    running.push_back(RequestId(r));
  }
  std::mt19937_64 rng(seed);
  std::vector<CopyDescriptor> desc(planner->max_descriptors());
  std::vector<std::uint8_t> status(desc.size(), 1);  // nothing runs the copies: publish nothing
  LoopCounts out;
  std::uint32_t first = 0;
  for (std::uint32_t round = 0; round < 24; ++round) {
    std::vector<RequestId> rows;
    for (std::uint32_t i = 0; i < kRequests; ++i) rows.push_back(running[(first + i) % kRequests]);
    ++first;
    if (reserve) {
      for (;;) {
        std::vector<RoundDemand> demands;
        for (RequestId r : rows) demands.push_back({r, 1, kTopK});
        auto ok = planner->ReserveRound(demands);
        if (ok) break;
        EXPECT_EQ(ok.error().code(), ErrorCode::kResourceExhausted) << ok.error().ToString();
        ++out.deferred;
        rows.pop_back();
      }
    }
    std::vector<LogicalAddr> fresh;
    for (RequestId r : rows) {
      auto a = space->Allocate(r, 1);
      if (!a) {
        ++out.refused_allocates;
        continue;
      }
      fresh.push_back((*a)[0]);
    }
    if (fresh.size() != rows.size()) continue;
    const auto batch = static_cast<std::uint32_t>(rows.size());
    for (std::uint32_t g = 0; g < kGroups; ++g) {
      std::vector<std::int32_t> sel(std::size_t{batch} * kTopK), idx(kRanks * sel.size());
      for (std::uint32_t b = 0; b < batch; ++b) {
        auto list = space->AddressesOf(rows[b]).value();
        std::vector<LogicalAddr> pool(list.begin(), list.end() - 1);
        std::shuffle(pool.begin(), pool.end(), rng);
        sel[b * kTopK] = static_cast<std::int32_t>(fresh[b].value());
        for (std::uint32_t k = 1; k < kTopK; ++k) sel[b * kTopK + k] = static_cast<std::int32_t>(pool[k].value());
      }
      auto plan = planner->Plan(GroupId(static_cast<std::uint16_t>(g)), {batch, 1, kTopK}, rows, sel, idx, desc);
      if (!plan) {
        EXPECT_EQ(plan.error().code(), ErrorCode::kResourceExhausted) << plan.error().ToString();
        ++out.refused_plans;
        continue;
      }
      EXPECT_TRUE(planner->Complete(plan->fence, std::span(status).first(plan->num_descriptors)));
    }
    space->AdvanceRound();
    ++out.rounds;
  }
  EXPECT_TRUE(space->CheckInvariants());
  return out;
}

TEST(TpRoundReservation, AReservedRoundsPlansAreNeverRefused) {
  ULA_TEST_SEEDED(seed, 20261209);
  for (TpAttention attention : {TpAttention::kAtHome, TpAttention::kLocalBuffer}) {
    SCOPED_TRACE(TpAttentionName(attention));
    const LoopCounts unreserved = RunLoop(attention, false, seed);
    EXPECT_GT(unreserved.refused_plans, 0u);
    const LoopCounts reserved = RunLoop(attention, true, seed);
    EXPECT_EQ(reserved.refused_plans, 0u);
    EXPECT_EQ(reserved.refused_allocates, 0u);
    EXPECT_EQ(reserved.rounds, 24u);
    EXPECT_EQ(reserved.deferred, 3u * 24u) << "one request a round by the bound (above)";
  }
}

TEST(TpRoundReservation, BadDemandsAreRefusedAndChangeNothing) {
  auto backend = MakeCountingBackend();
  TpConfig c = testing::TpEngineModes(testing::SmallTpConfig(kRanks, 16, 64, 0));
  c.attention = TpAttention::kAtHome;
  auto space = TpAddressSpace::Create(c, *backend).value();
  auto planner = TpStepPlanner::Create(*space, {.max_batch = 2, .max_q_len = 2, .max_top_k = 4}).value();
  ASSERT_TRUE(space->AddRequest(RequestId(1)));
  ASSERT_TRUE(space->Allocate(RequestId(1), 10));
  const std::vector<RoundDemand> unknown{{RequestId(7), 1, 4}};
  EXPECT_EQ(planner->ReserveRound(unknown).error().code(), ErrorCode::kNotFound);
  const std::vector<RoundDemand> twice{{RequestId(1), 1, 4}, {RequestId(1), 1, 4}};
  EXPECT_EQ(planner->ReserveRound(twice).error().code(), ErrorCode::kInvalidArgument);
  const std::vector<RoundDemand> too_many{{RequestId(1), 1, 9}};  // past max_q_len x max_top_k = 8
  EXPECT_EQ(planner->ReserveRound(too_many).error().code(), ErrorCode::kInvalidArgument);
  const std::vector<RoundDemand> fits{{RequestId(1), 1, 8}};
  auto ok = planner->ReserveRound(fits);
  ASSERT_TRUE(ok) << ok.error().ToString();
  EXPECT_LE(ok->device_needed, ok->device_room);
  const std::vector<RoundDemand> huge{{RequestId(1), 200, 8}};
  EXPECT_EQ(planner->ReserveRound(huge).error().code(), ErrorCode::kResourceExhausted) << "200 new tokens, 80 slots";
  EXPECT_TRUE(space->CheckInvariants());
}

// ReserveRound's quantile mode in TP (ReserveMode::kQuantile, ula/step_planner.h): the same
// measurement as DP's, over the plans of every hosted rank. One request of 300 tokens (150
// homed on each rank; its new token at position 300 on rank 0): unmeasured, rank 0's bound is
// 1 + 64; after 10 plans selecting 16 distinct of 64, its 0.9 quantile is 1 + 16. A bad
// quantile is refused at Create, naming the field.
TEST(TpRoundReservation, QuantileModeReservesTheMeasuredShare) {
  for (ReserveMode mode : {ReserveMode::kGuaranteed, ReserveMode::kQuantile}) {
    SCOPED_TRACE(mode == ReserveMode::kQuantile ? "quantile" : "guaranteed");
    auto backend = MakeCountingBackend();
    TpConfig c = testing::TpEngineModes(testing::SmallTpConfig(kRanks, 4096, 4096, 0));
    c.attention = TpAttention::kAtHome;
    c.page_tokens = 64;
    auto space = TpAddressSpace::Create(c, *backend).value();
    ASSERT_TRUE(space->AddRequest(RequestId(1)));
    const auto addrs = space->Allocate(RequestId(1), 300).value();
    space->AdvanceRound();
    EngineStepConfig config{.max_batch = 1, .max_q_len = 1, .max_top_k = kTopK, .reserve = mode,
                            .reserve_quantile = 0.9};
    auto planner = TpStepPlanner::Create(*space, config).value();
    const std::vector<RoundDemand> demand{{RequestId(1), 1, kTopK}};
    EXPECT_EQ(planner->ReserveRound(demand)->device_needed, 65u) << "unmeasured: the bound";
    std::vector<CopyDescriptor> desc(planner->max_descriptors());
    const std::vector<RequestId> one{RequestId(1)};
    for (int i = 0; i < 10; ++i) {
      std::vector<std::int32_t> sel(kTopK), idx(std::size_t{kRanks} * kTopK);
      for (std::uint32_t k = 0; k < kTopK; ++k) sel[k] = static_cast<std::int32_t>(addrs[k < 16 ? k : 0].value());
      auto plan = planner->Plan(GroupId(0), {1, 1, kTopK}, one, sel, idx, desc);
      ASSERT_TRUE(plan) << plan.error().ToString();
      ASSERT_TRUE(planner->Complete(plan->fence, std::vector<std::uint8_t>(plan->num_descriptors, 0)));
      space->AdvanceRound();
    }
    EXPECT_EQ(planner->ReserveRound(demand)->device_needed, mode == ReserveMode::kQuantile ? 17u : 65u);
  }
  auto backend = MakeCountingBackend();
  TpConfig c = testing::TpEngineModes(testing::SmallTpConfig(kRanks, 16, 64, 0));
  c.attention = TpAttention::kAtHome;
  auto space = TpAddressSpace::Create(c, *backend).value();
  auto bad = TpStepPlanner::Create(*space, {.reserve = ReserveMode::kQuantile, .reserve_quantile = 1.01});
  ASSERT_FALSE(bad);
  EXPECT_EQ(bad.error().code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(bad.error().message().find("reserve_quantile"), std::string::npos) << bad.error().ToString();
}

}  // namespace
}  // namespace ula
