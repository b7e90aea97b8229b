// Admission that guarantees the round (StepPlanner::ReserveRound, docs/ARCHITECTURE.md
// "Draft rollback and the engine step's contract with the scheduler"): a vLLM-shaped decode
// loop whose selections outgrow the device. Scheduled by its token budget alone, a round's
// plan is refused after the round's tokens were allocated (the engine cannot take back a
// forward pass); reserving each round first, and deferring the requests that do not fit, no
// Allocate or Plan is ever refused.
#include <gtest/gtest.h>

#include <optional>
#include <random>
#include <vector>

#include "step/space_fixture.h"
#include "test_seed.h"
#include "ula/address_space.h"
#include "ula/step_planner.h"

namespace ula {
namespace {

constexpr std::uint32_t kTopK = 64, kRequests = 4, kGroups = 2;

struct LoopCounts {
  std::uint32_t rounds = 0, refused_plans = 0, refused_reservations = 0, deferred = 0;
};

LoopCounts RunLoop(bool reserve, std::uint64_t seed) {
  auto backend = MakeCountingBackend();
  AddressSpaceConfig cfg = testing::EngineModes(testing::SmallConfig(200, 4096, 1, kGroups));
  auto space = AddressSpace::Create(cfg, *backend).value();
  auto planner = StepPlanner::Create(*space, {.max_batch = kRequests, .max_q_len = 1, .max_top_k = kTopK}).value();
  std::vector<RequestId> running;
  for (std::uint32_t r = 1; r <= kRequests; ++r) {
    EXPECT_TRUE(space->AddRequest(RequestId(r), Rank(0)));
    EXPECT_TRUE(space->Allocate(RequestId(r), 300));
    space->AdvanceRound();
    running.push_back(RequestId(r));
  }
  std::mt19937_64 rng(seed);
  std::vector<CopyDescriptor> desc(planner->max_descriptors());
  std::vector<std::uint8_t> status(desc.size(), 1);  // nothing runs the copies: publish nothing
  LoopCounts out;
  std::uint32_t first = 0;  // round-robin start: a deferred request goes first next time
  for (std::uint32_t round = 0; round < 30; ++round) {
    std::vector<RequestId> rows;
    for (std::uint32_t i = 0; i < kRequests; ++i) rows.push_back(running[(first + i) % kRequests]);
    ++first;
    if (reserve) {
      for (;;) {
        std::vector<RoundDemand> demands;
        for (RequestId r : rows) demands.push_back({r, 1, kTopK});
        auto ok = planner->ReserveRound(Rank(0), demands);
        if (ok) break;
        EXPECT_EQ(ok.error().code(), ErrorCode::kResourceExhausted) << ok.error().ToString();
        ++out.refused_reservations;
        ++out.deferred;
        rows.pop_back();  // the scheduler defers the last request to a later round
      }
    }
    std::vector<LogicalAddr> fresh;
    for (RequestId r : rows) {
      auto a = space->Allocate(r, 1);
      EXPECT_TRUE(a) << a.error().ToString();
      fresh.push_back((*a)[0]);
    }
    const auto batch = static_cast<std::uint32_t>(rows.size());
    for (std::uint32_t g = 0; g < kGroups; ++g) {
      std::vector<std::int32_t> sel(std::size_t{batch} * kTopK), idx(sel.size());
      for (std::uint32_t b = 0; b < batch; ++b) {
        auto list = space->AddressesOf(rows[b]).value();
        std::vector<LogicalAddr> pool(list.begin(), list.end() - 1);
        std::shuffle(pool.begin(), pool.end(), rng);
        sel[b * kTopK] = static_cast<std::int32_t>(fresh[b].value());
        for (std::uint32_t k = 1; k < kTopK; ++k) sel[b * kTopK + k] = static_cast<std::int32_t>(pool[k].value());
      }
      auto plan = planner->Plan(Rank(0), GroupId(0 + g), {batch, 1, kTopK}, rows, sel, idx, desc);
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

// 4 running requests x 64 selections = 256 distinct entries per group step against 200
// device slots: by the token budget alone every round's plans are refused; reserved,
// three requests run per round (3 x (64 + 1) = 195 <= 200), the fourth waits its turn.
TEST(RoundReservation, AReservedRoundsPlansAreNeverRefused) {
  ULA_TEST_SEEDED(seed, 20261244);
  const LoopCounts unreserved = RunLoop(false, seed);
  EXPECT_GT(unreserved.refused_plans, 0u);
  const LoopCounts reserved = RunLoop(true, seed);
  EXPECT_EQ(reserved.refused_plans, 0u);
  EXPECT_EQ(reserved.rounds, 30u);
  EXPECT_EQ(reserved.deferred, 30u);  // exactly one request waits each round
}

TEST(RoundReservation, BadDemandsAreRefusedAndChangeNothing) {
  auto backend = MakeCountingBackend();
  auto space = AddressSpace::Create(testing::EngineModes(testing::SmallConfig(16, 64, 2)), *backend).value();
  auto planner = StepPlanner::Create(*space, {.max_batch = 2, .max_q_len = 2, .max_top_k = 4}).value();
  ASSERT_TRUE(space->AddRequest(RequestId(1), Rank(0)));
  ASSERT_TRUE(space->AddRequest(RequestId(2), Rank(1)));
  ASSERT_TRUE(space->Allocate(RequestId(1), 10));
  const std::uint64_t before = space->DebugDigest();
  auto code = [&](std::vector<RoundDemand> d, Rank rank = Rank(0)) {
    auto r = planner->ReserveRound(rank, d);
    EXPECT_EQ(space->DebugDigest(), before);
    return r ? std::optional<ErrorCode>() : r.error().code();
  };
  EXPECT_EQ(code({{RequestId(9), 1, 1}}), ErrorCode::kNotFound);
  EXPECT_EQ(code({{RequestId(2), 1, 1}}), ErrorCode::kInvalidArgument);           // another rank's
  EXPECT_EQ(code({{RequestId(1), 1, 9}}), ErrorCode::kInvalidArgument);           // past 2 x 4
  EXPECT_EQ(code({{RequestId(1), 1, 1}, {RequestId(1), 1, 1}}), ErrorCode::kInvalidArgument);
  EXPECT_EQ(code({{RequestId(1), 1, 1}}, Rank(5)), ErrorCode::kOutOfRange);
  // The 10 tokens allocated in this round use 10 of 16 device slots: 7 new + 8 selections do
  // not fit the 6 left; in the next round they do.
  EXPECT_EQ(code({{RequestId(1), 7, 8}}), ErrorCode::kResourceExhausted);
  space->AdvanceRound();
  auto ok = planner->ReserveRound(Rank(0), std::vector<RoundDemand>{{RequestId(1), 7, 8}});
  ASSERT_TRUE(ok) << ok.error().ToString();
  EXPECT_EQ(ok->device_needed, 15u);
  EXPECT_EQ(ok->device_room, 16u);
}

}  // namespace
}  // namespace ula

namespace ula {
namespace {

// A token-budget scheduler's planner (vLLM: budget 8,192, chunks of 2,048, top-k 2,048): sized
// by max_batch x max_q_len it would need 2^35 selections and is refused; max_rows = the budget
// sizes it for the rows one step reads. A shape with more rows than max_rows is refused and
// changes nothing; ReserveRound still caps a request at max_q_len x max_top_k.
TEST(EngineStepConfig, MaxRowsSizesATokenBudget) {
  EngineStepConfig vllm{.max_batch = 8192, .max_q_len = 2048, .max_top_k = 2048};
  auto refused = vllm.Validate();
  ASSERT_FALSE(refused);
  EXPECT_NE(refused.error().message().find("max_rows"), std::string::npos) << refused.error().ToString();
  vllm.max_rows = 8192;
  EXPECT_TRUE(vllm.Validate());
  EXPECT_EQ(vllm.rows(), 8192u);
  vllm.max_rows = 8192u * 2048u + 1;
  EXPECT_EQ(vllm.Validate().error().code(), ErrorCode::kInvalidArgument) << "more rows than batch x q_len";

  auto backend = MakeCountingBackend();
  auto space = AddressSpace::Create(testing::EngineModes(testing::SmallConfig(64, 256, 1, 1)), *backend).value();
  ASSERT_TRUE(space->AddRequest(RequestId(1), Rank(0)));
  const auto addrs = space->Allocate(RequestId(1), 8).value();
  space->AdvanceRound();
  auto planner = StepPlanner::Create(*space, {.max_batch = 4, .max_q_len = 4, .max_top_k = 2, .max_rows = 4}).value();
  std::vector<CopyDescriptor> desc(planner->max_descriptors());
  const std::vector<RequestId> one{RequestId(1)};
  std::vector<std::int32_t> sel(8), idx(8);
  for (int i = 0; i < 8; ++i) sel[i] = static_cast<std::int32_t>(addrs[i].value());
  auto at_limit = planner->Plan(Rank(0), GroupId(0), {.batch = 1, .q_len = 4, .top_k = 2}, one,
                            std::span(sel).first(8), std::span(idx).first(8), desc);
  ASSERT_TRUE(at_limit) << at_limit.error().ToString();  // 4 rows: at the limit, accepted
  ASSERT_TRUE(planner->Complete(at_limit->fence, std::vector<std::uint8_t>(at_limit->num_descriptors, 0)));
  const std::uint64_t planned = space->DebugDigest();
  std::vector<std::int32_t> sel6(12, sel[0]), idx6(12);
  const std::vector<RequestId> two_rows{RequestId(1), RequestId(1)};
  auto over = planner->Plan(Rank(0), GroupId(0), {.batch = 2, .q_len = 3, .top_k = 2}, two_rows, sel6, idx6, desc);
  ASSERT_FALSE(over);
  EXPECT_EQ(over.error().code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(over.error().message().find("max_rows = 4"), std::string::npos) << over.error().ToString();
  EXPECT_EQ(space->DebugDigest(), planned) << "a refused shape changes nothing";
  EXPECT_FALSE(planner->has_pending());
}

}  // namespace
}  // namespace ula
