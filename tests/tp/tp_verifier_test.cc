#include "ula/tp_verifier.h"

#include <gtest/gtest.h>

#include <cstdio>

#include "test_seed.h"

namespace ula {
namespace {

// The sanitizer trees run every structure's CheckInvariants inside each call: fewer ops
// there keep the test well under its time budget.
#ifdef ULA_EXPENSIVE_CHECKS
constexpr std::uint64_t kOps = 110;
#else
constexpr std::uint64_t kOps = 250;
#endif
constexpr std::uint64_t Scaled(std::uint64_t at_250_ops) { return at_250_ops * kOps / 250; }

void ExpectClean(const TpVerifierReport& r) {
  for (const auto& f : r.first_failures) ADD_FAILURE() << f;
  EXPECT_EQ(r.mismatches, 0u);
  EXPECT_EQ(r.invariant_failures, 0u);
  EXPECT_EQ(r.bad_input_failures, 0u);
}

TEST(TpVerifier, RandomWorkloadKeepsEveryByteWith2_4_8InProcessRanks) {
  ULA_TEST_SEEDED(seed, 20260505);
  for (std::uint32_t ranks : {2u, 4u, 8u}) {
    TpVerifierConfig c;
    c.seed = seed;
    c.ops = kOps;
    c.num_ranks = ranks;
    c.top_k = 16;
    c.device_slots_per_group = 48;   // pressure: home swaps
    c.buffer_slots_per_group = 160;  // pressure: buffer evictions, some refused rounds
    c.copy_threads = ranks == 4 ? 0 : 2;
    std::printf("seed=%llu ranks=%u\n", static_cast<unsigned long long>(c.seed), ranks);
    auto report = RunTpVerifier(c);
    ASSERT_TRUE(report) << report.error().ToString();
    ExpectClean(*report);
    std::printf("  steps=%llu refused=%llu swaps=%llu hits=%llu fetches=%llu buffer evictions=%llu checked=%llu\n",
                (unsigned long long)report->steps, (unsigned long long)report->rejected_steps,
                (unsigned long long)report->home_swaps, (unsigned long long)report->buffer_hits,
                (unsigned long long)report->remote_fetches, (unsigned long long)report->buffer_evictions,
                (unsigned long long)report->entries_checked);
    EXPECT_GT(report->steps, Scaled(150));
    EXPECT_GT(report->home_swaps, Scaled(50));        // under device pressure
    if (ranks >= 4) {
      EXPECT_GT(report->buffer_evictions, Scaled(50));  // under buffer pressure
    }
    EXPECT_GT(report->buffer_hits, report->remote_fetches / 4);
    EXPECT_GT(report->bad_input_checks, Scaled(20));
  }
}

// Attention at home: no local buffer; every query's partials from all ranks, merged in
// rank order, match the reference attention over the shadow.
TEST(TpVerifier, AttentionAtHomeMatchesTheReferenceWith2_4_8InProcessRanks) {
  ULA_TEST_SEEDED(seed, 20261129);
  for (std::uint32_t ranks : {2u, 4u, 8u}) {
    TpVerifierConfig c;
    c.seed = seed;
    c.ops = 250;  // cheap without buffers even with the sanitizers' checks; 8 ranks need the history
    c.num_ranks = ranks;
    // Pressure (home swaps): 8 shards hold 8 device pools, so they get smaller ones (a
    // pool must hold one request's step: top_k x 3 queries).
    c.top_k = ranks == 8 ? 8 : 16;
    c.device_slots_per_group = 3 * c.top_k;
    c.attention = TpAttention::kAtHome;
    c.copy_threads = ranks == 4 ? 0 : 2;
    std::printf("seed=%llu ranks=%u attention at home\n", static_cast<unsigned long long>(c.seed), ranks);
    auto report = RunTpVerifier(c);
    ASSERT_TRUE(report) << report.error().ToString();
    ExpectClean(*report);
    EXPECT_EQ(report->attention_mismatches, 0u);
    std::printf("  steps=%llu refused=%llu swaps=%llu left to home=%llu attention checks=%llu max error=%.3g\n",
                (unsigned long long)report->steps, (unsigned long long)report->rejected_steps,
                (unsigned long long)report->home_swaps, (unsigned long long)report->left_to_home,
                (unsigned long long)report->attention_checks, report->max_attention_error);
    EXPECT_GT(report->steps, 150u);
    EXPECT_GT(report->home_swaps, 50u);
    EXPECT_GT(report->attention_checks, 500u);
    EXPECT_GT(report->left_to_home, 0u);
    EXPECT_EQ(report->remote_fetches, 0u);
    EXPECT_EQ(report->buffer_hits, 0u);
    EXPECT_GT(report->bad_input_checks, 20u);
  }
}

// Sharing (issue 17), both attention strategies, at the ops of the tests above.
TEST(TpVerifier, RandomSharingKeepsEveryByteBothAttentions) {
  ULA_TEST_SEEDED(seed, 20261201);
  for (TpAttention attention : {TpAttention::kLocalBuffer, TpAttention::kAtHome}) {
    TpVerifierConfig c;
    c.seed = seed;
    c.ops = kOps;
    c.num_ranks = 4;
    c.top_k = 16;
    c.device_slots_per_group = 48;
    c.buffer_slots_per_group = attention == TpAttention::kAtHome ? 0 : 160;
    c.attention = attention;
    c.share_percent = 80;
    std::printf("seed=%llu sharing attention=%d\n", static_cast<unsigned long long>(c.seed), int(attention));
    auto report = RunTpVerifier(c);
    ASSERT_TRUE(report) << report.error().ToString();
    ExpectClean(*report);
    EXPECT_TRUE(report->ok());
    std::printf("  steps=%llu shares=%llu sharer checks=%llu evictions=%llu locked checks=%llu\n",
                (unsigned long long)report->steps, (unsigned long long)report->shares,
                (unsigned long long)report->sharer_checks, (unsigned long long)report->cache_evictions,
                (unsigned long long)report->locked_checks);
    EXPECT_GT(report->shares, Scaled(5));
    EXPECT_GT(report->sharer_checks, Scaled(100));
    EXPECT_GT(report->steps, Scaled(100));
  }
}

TEST(TpVerifier, InvalidConfigIsRefused) {
  TpVerifierConfig c;
  c.entry_bytes = 30;
  EXPECT_EQ(RunTpVerifier(c).error().code(), ErrorCode::kInvalidArgument);
  c = {};
  c.device_slots_per_group = 4;
  EXPECT_EQ(RunTpVerifier(c).error().code(), ErrorCode::kInvalidArgument);
  c = {};
  c.attention = TpAttention::kAtHome;
  c.buffer_slots_per_group = 64;  // no buffer at home
  EXPECT_EQ(RunTpVerifier(c).error().code(), ErrorCode::kInvalidArgument);
}

}  // namespace
}  // namespace ula
