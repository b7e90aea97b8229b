// ReserveRound's quantile mode (EngineStepConfig::reserve = ReserveMode::kQuantile,
// ula/step_planner.h): a request's selections are reserved as a measured quantile of the
// guaranteed bound. Unmeasured it is the bound; measured, it follows the quantile of the
// shares the planner's plans selected (over its window), never above the bound; a bad
// quantile or window is refused at Create, naming the field. TP's side is in
// tests/tp/tp_round_reservation_test.cc. SelectionShareCount: the share's distinct count
// against sort and unique.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "step/selection_share.h"
#include "step/space_fixture.h"
#include "test_seed.h"
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

// The reference: the distinct entries of one sample by sort and unique, padding (-1) dropped.
std::uint64_t SortedDistinct(std::span<const std::int32_t> rows) {
  std::vector<std::int32_t> v;
  for (std::int32_t a : rows) {
    if (a >= 0) v.push_back(a);
  }
  std::sort(v.begin(), v.end());
  return static_cast<std::uint64_t>(std::unique(v.begin(), v.end()) - v.begin());
}

// Random plans of batch x (q_len x top_k) selections: each request draws from its own
// addresses, from addresses every request shares (a shared prefix) and again from what it
// already selected (duplicates in the request), with -1 padding at the end of its rows and
// scattered; some rows are padding only; addresses range up to 2^31 - 1. Every sample's count
// is sort and unique's, in plan order (a sample's entries left in the set by the previous
// sample are not its duplicates), and Record bins that count: with a window of one sample
// and q = 1, a request of demand d is reserved ceil(d x (bin + 1) / kBins).
TEST(SelectionShareCount, DistinctMatchesSortUniqueOnRandomPlans) {
  ULA_TEST_SEEDED(seed, 20261206);
  std::mt19937_64 rng(seed);
  constexpr std::uint32_t kBins = SelectionShare::kBins;
  for (int plan = 0; plan < 60; ++plan) {
    const std::uint32_t q_len = 1 + static_cast<std::uint32_t>(rng() % 4);
    const std::uint32_t top_k = 64 * (1 + static_cast<std::uint32_t>(rng() % 8));
    const std::uint32_t batch = 1 + static_cast<std::uint32_t>(rng() % 12);
    const std::size_t per_row = std::size_t{q_len} * top_k;
    SelectionShare share;
    share.Configure(/*window=*/1, /*quantile=*/1.0, per_row);
    const std::int32_t span = rng() % 2 == 0 ? 1 << 12 : std::numeric_limits<std::int32_t>::max();
    std::vector<std::int32_t> shared(1 + rng() % 200);
    for (auto& a : shared) a = static_cast<std::int32_t>(rng() % static_cast<std::uint64_t>(span));
    std::vector<std::int32_t> sel(batch * per_row);
    for (std::uint32_t b = 0; b < batch; ++b) {
      const std::span<std::int32_t> row(sel.data() + b * per_row, per_row);
      const std::uint64_t mode = rng() % 8;
      const std::size_t padded = mode == 0 ? per_row : static_cast<std::size_t>(rng() % (per_row / 2 + 1));
      for (std::size_t i = 0; i < per_row; ++i) {
        const std::uint64_t pick = rng() % 10;
        if (i >= per_row - padded || pick == 0) {
          row[i] = -1;
        } else if (pick < 4) {
          row[i] = shared[rng() % shared.size()];
        } else if (pick < 7 && i > 0) {
          row[i] = row[rng() % i];  // a duplicate in the request (or padding)
        } else {
          row[i] = static_cast<std::int32_t>(rng() % static_cast<std::uint64_t>(span));
        }
      }
      const std::uint64_t want = SortedDistinct(row);
      ASSERT_EQ(share.Distinct(row), want) << "plan " << plan << " request " << b;
      const std::uint64_t before = share.samples();
      share.Record(row);
      if (want == 0) {
        EXPECT_EQ(share.samples(), before) << "padding only records nothing";
        continue;
      }
      const std::uint64_t bin = (want * kBins + per_row - 1) / per_row - 1;
      EXPECT_EQ(share.Reserve(per_row, per_row), (per_row * (bin + 1) + kBins - 1) / kBins)
          << "plan " << plan << " request " << b << ": " << want << " of " << per_row;
    }
  }
}

}  // namespace
}  // namespace ula
