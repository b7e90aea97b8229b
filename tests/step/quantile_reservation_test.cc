// ReserveRound's quantile mode (EngineStepConfig::reserve = ReserveMode::kQuantile,
// ula/step_planner.h): a request's selections are reserved as a measured quantile of the
// guaranteed bound. Unmeasured it is the bound; measured, it follows the quantile of the
// shares the planner's plans selected (over its window), never above the bound; a bad
// quantile or window is refused at Create, naming the field. TP's side is in
// tests/tp/tp_round_reservation_test.cc.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "step/space_fixture.h"
#include "ula/address_space.h"
#include "ula/step_planner.h"

namespace ula {
namespace {

constexpr std::uint32_t kTopK = 64;

// Request 1 holding 300 tokens and request 2 holding 10, over a device that never runs out;
// plans of request 1's one row of kTopK selections of which `distinct` are distinct (the
// rest repeat the first).
struct Fixture {
  std::unique_ptr<Backend> backend = MakeCountingBackend();
  std::unique_ptr<AddressSpace> space;
  std::unique_ptr<StepPlanner> planner;
  std::vector<LogicalAddr> addrs;

  explicit Fixture(EngineStepConfig config) {
    space = AddressSpace::Create(testing::EngineModes(testing::SmallConfig(4096, 4096, 1, 1)), *backend).value();
    EXPECT_TRUE(space->AddRequest(RequestId(1), Rank(0)));
    addrs = space->Allocate(RequestId(1), 300).value();
    EXPECT_TRUE(space->AddRequest(RequestId(2), Rank(0)));
    EXPECT_TRUE(space->Allocate(RequestId(2), 10));
    space->AdvanceRound();
    config.max_batch = 1;
    config.max_q_len = 1;
    config.max_top_k = kTopK;
    planner = StepPlanner::Create(*space, config).value();
  }

  void Step(std::uint32_t distinct) {
    std::vector<std::int32_t> sel(kTopK), idx(kTopK);
    for (std::uint32_t k = 0; k < kTopK; ++k) sel[k] = static_cast<std::int32_t>(addrs[k < distinct ? k : 0].value());
    std::vector<CopyDescriptor> desc(planner->max_descriptors());
    const std::vector<RequestId> one{RequestId(1)};
    auto plan = planner->Plan(Rank(0), GroupId(0), {1, 1, kTopK}, one, sel, idx, desc);
    ASSERT_TRUE(plan) << plan.error().ToString();
    ASSERT_TRUE(planner->Complete(plan->fence, std::vector<std::uint8_t>(plan->num_descriptors, 0)));
    space->AdvanceRound();
  }

  // Device slots the round of one request (1 new token, up to max_selections) is reserved.
  std::uint64_t Needed(std::uint32_t max_selections = kTopK, RequestId request = RequestId(1)) {
    auto r = planner->ReserveRound(Rank(0), std::vector<RoundDemand>{{request, 1, max_selections}});
    EXPECT_TRUE(r) << r.error().ToString();
    return r ? r->device_needed : 0;
  }
};

EngineStepConfig Quantile(double q, std::uint32_t window = 4096) {
  return {.reserve = ReserveMode::kQuantile, .reserve_quantile = q, .reserve_window = window};
}

// q = 0.9 needs ceil(1 / 0.1) = 10 samples: until then the bound (1 new + 64 selections).
TEST(QuantileReservation, UnmeasuredReservesTheBound) {
  Fixture f(Quantile(0.9));
  EXPECT_EQ(f.Needed(), 65u);
  for (int i = 0; i < 9; ++i) f.Step(16);
  EXPECT_EQ(f.Needed(), 65u) << "9 samples do not measure a 0.9 quantile";
  f.Step(16);
  EXPECT_EQ(f.Needed(), 17u) << "10 samples at 16 of 64: 1 + 16";
  Fixture guaranteed({});
  for (int i = 0; i < 10; ++i) guaranteed.Step(16);
  EXPECT_EQ(guaranteed.Needed(), 65u) << "the default mode measures nothing";
}

// Half the samples at 16 of 64, half at 48: the 0.9 quantile is 48, the 0.5 quantile 16.
TEST(QuantileReservation, ReservesTheMeasuredQuantile) {
  for (double q : {0.9, 0.5}) {
    Fixture f(Quantile(q));
    for (int i = 0; i < 10; ++i) f.Step(i % 2 == 0 ? 16 : 48);
    EXPECT_EQ(f.Needed(), q == 0.9 ? 49u : 17u) << "q = " << q;
    // A smaller demand scales alike: 0.75 (0.25) of 20 selections.
    EXPECT_EQ(f.Needed(20), q == 0.9 ? 16u : 6u) << "q = " << q;
  }
}

// Steps that select their whole demand leave the reservation at the bound; a request whose
// history caps its bound (request 2: 10 tokens + 1 new) is never reserved more than it, even
// where the measured share of its demand is larger; only the window's latest samples count.
TEST(QuantileReservation, NeverAboveTheBoundAndForgetsPastTheWindow) {
  Fixture f(Quantile(0.99, 16));
  for (int i = 0; i < 16; ++i) f.Step(kTopK);
  EXPECT_EQ(f.Needed(), 65u);
  EXPECT_EQ(f.Needed(7), 8u) << "the bound of 7 selections, not more";
  EXPECT_EQ(f.Needed(kTopK, RequestId(2)), 12u) << "1 new + its 11 tokens";
  for (int i = 0; i < 15; ++i) f.Step(16);
  EXPECT_EQ(f.Needed(), 65u) << "one full sample left in the window of 16";
  f.Step(16);
  EXPECT_EQ(f.Needed(), 17u) << "the full samples left the window";
  EXPECT_EQ(f.Needed(kTopK, RequestId(2)), 12u) << "16 of 64 is more than its bound of 11";
}

TEST(QuantileReservation, BadConfigIsRefusedNamingTheField) {
  auto backend = MakeCountingBackend();
  auto space = AddressSpace::Create(testing::EngineModes(testing::SmallConfig(64, 64, 1, 1)), *backend).value();
  const std::uint64_t before = space->DebugDigest();
  const double nan = std::numeric_limits<double>::quiet_NaN();
  for (double q : {0.0, -0.5, 1.5, nan}) {
    auto r = StepPlanner::Create(*space, Quantile(q));
    ASSERT_FALSE(r) << "quantile " << q;
    EXPECT_EQ(r.error().code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(r.error().message().find("reserve_quantile"), std::string::npos) << r.error().ToString();
  }
  auto window = StepPlanner::Create(*space, Quantile(0.9, 0));
  ASSERT_FALSE(window);
  EXPECT_NE(window.error().message().find("reserve_window"), std::string::npos) << window.error().ToString();
  EXPECT_EQ(space->DebugDigest(), before);
  EXPECT_TRUE(StepPlanner::Create(*space, Quantile(1.0, 1)));
}

}  // namespace
}  // namespace ula
