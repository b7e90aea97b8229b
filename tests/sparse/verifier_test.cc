#include "ula/consistency_verifier.h"

#include <gtest/gtest.h>

#include <cstdio>

#include "test_seed.h"

namespace ula {
namespace {

TEST(ConsistencyVerifier, RandomWorkloadUnderPressureKeepsEveryByte) {
  ULA_TEST_SEEDED(seed, 20261129);
  for (int threads : {0, 2}) {
    VerifierConfig c;
    c.seed = seed;
    c.ops = 1500;
    c.copy_threads = threads;
    std::printf("seed=%llu copy_threads=%d\n", static_cast<unsigned long long>(c.seed), threads);
    auto report = RunConsistencyVerifier(c);
    ASSERT_TRUE(report) << report.error().ToString();
    for (const auto& f : report->first_failures) ADD_FAILURE() << f;
    EXPECT_EQ(report->mismatches, 0u);
    EXPECT_EQ(report->invariant_failures, 0u);
    EXPECT_EQ(report->bad_input_failures, 0u);
    EXPECT_GT(report->swaps, 500u);  // the run really was under memory pressure
    EXPECT_GT(report->bad_input_checks, 20u);
    EXPECT_GT(report->entries_checked, 50000u);
  }
}

TEST(ConsistencyVerifier, InvalidConfigIsRefused) {
  VerifierConfig c;
  c.device_slots_per_group = 8;
  auto report = RunConsistencyVerifier(c);
  ASSERT_FALSE(report);
  EXPECT_EQ(report.error().code(), ErrorCode::kInvalidArgument);
}

}  // namespace
}  // namespace ula
