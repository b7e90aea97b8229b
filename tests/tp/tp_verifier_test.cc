#include "verify/tp_verifier.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <string_view>

#include "config/model_config.h"
#include "test_seed.h"
#include "verify/consistency_verifier.h"

namespace ula {
namespace {

// The sanitizer trees run fewer ops: the ASan tree runs every structure's CheckInvariants
// inside each call, and TSan runs each memory access 5-15x slower. TSan looks for races
// between the copy threads and the driver, which every batch of copies exercises: 60 ops
// (47 s of the TSan tree's tests at 110, its longest by twice).
#if defined(__SANITIZE_THREAD__)
constexpr std::uint64_t kOps = 60;
#elif defined(ULA_EXPENSIVE_CHECKS)
constexpr std::uint64_t kOps = 110;
#else
constexpr std::uint64_t kOps = 250;
#endif
void ExpectClean(const TpVerifierReport& r) {
  for (const auto& f : r.first_failures) ADD_FAILURE() << f;
  EXPECT_EQ(r.mismatches, 0u);
  EXPECT_EQ(r.invariant_failures, 0u);
  EXPECT_EQ(r.bad_input_failures, 0u);
}

// Floors from the configuration, not from one seed's counts. The run starts with the
// verifier's full workload (initial_requests = 24 requests of top_k / 2 + U[0, 6 top_k)
// tokens: 3.5 top_k on average), so that pools smaller than it are under pressure from the
// first round whatever the seed. The floors take the workload as at least 24 x top_k entries
// (2 top_k per request: a seed below that is 4 standard deviations from the mean, below
// 1e-4):
//   - every non-empty sub-batch steps every group once: steps + refused == sub_batches x
//     groups; each rank's device pool holds its share of one round's selections (RoundDevice:
//     2 sub-batches x max_batch x queries x top_k / P, evenly striped), so more than half of
//     the steps are planned (refusals come from uneven striping only);
//   - device pressure: the ranks' device pools (P x device slots per group) hold no more
//     entries than the workload, so entries live on host and a step that selects one swaps
//     it in: at least one home swap;
//   - buffer pressure (local buffers, P > 1): the P buffers hold fewer entries than the
//     workload has homed elsewhere ((P - 1) / P of it), so misses evict older copies: at
//     least one buffer eviction, and, as selections keep 3/4 of their previous entries,
//     some buffer hits and remote fetches.
// Pressure off (pools that hold the whole workload) fails these floors.
constexpr std::uint32_t kFullWorkload = 24;

// Device slots per group: a rank's share of one round's selections, at least one request's step.
std::uint32_t RoundDevice(const TpVerifierConfig& c) {
  return std::max(c.top_k * c.queries_per_request, 2 * c.max_batch * c.queries_per_request * c.top_k / c.num_ranks);
}

// Four ranks under pressure with injected faults (the local buffer's path fails more often
// per fault, so it gets a quarter of the rate).
TpVerifierConfig FaultedConfig(std::uint64_t seed, TpAttention attention, double fault_rate) {
  TpVerifierConfig c;
  c.seed = seed;
  c.ops = kOps;
  c.num_ranks = 4;
  c.top_k = 16;
  c.initial_requests = kFullWorkload;
  c.device_slots_per_group = RoundDevice(c);
  c.attention = attention;
  c.fault_rate = attention == TpAttention::kLocalBuffer ? fault_rate / 4 : fault_rate;
  return c;
}

void ExpectPressure(const TpVerifierConfig& c, const TpVerifierReport& r) {
  const std::uint64_t min_entries = std::uint64_t{kFullWorkload} * c.top_k;
  ASSERT_LE(std::uint64_t{c.num_ranks} * c.device_slots_per_group, min_entries) << "the test's config has no device pressure";
  EXPECT_GT(r.rounds, 0u);
  EXPECT_EQ(r.steps + r.rejected_steps + r.failed_calls, r.sub_batches * c.num_groups);
  EXPECT_GT(2 * r.steps, r.sub_batches * c.num_groups) << "most sub-batches were refused";
  EXPECT_GT(r.home_swaps, 0u) << "no home swap although the device pools hold less than the workload";
  EXPECT_GT(r.bad_input_checks, 0u);
  if (c.attention == TpAttention::kLocalBuffer && c.num_ranks > 1) {
    ASSERT_LT(std::uint64_t{c.buffer_slots()} * c.num_ranks, min_entries * (c.num_ranks - 1))
        << "the test's config has no buffer pressure";
    EXPECT_GT(r.remote_fetches, 0u);
    EXPECT_GT(r.buffer_hits, 0u);
    EXPECT_GT(r.buffer_evictions, 0u) << "no buffer eviction although the buffers hold less than the remote entries";
  }
}

void PrintReport(const TpVerifierReport& r) {
  std::printf("  rounds=%llu sub-batches=%llu steps=%llu refused=%llu swaps=%llu hits=%llu fetches=%llu "
              "buffer evictions=%llu left to home=%llu attention checks=%llu checked=%llu\n",
              (unsigned long long)r.rounds, (unsigned long long)r.sub_batches, (unsigned long long)r.steps,
              (unsigned long long)r.rejected_steps, (unsigned long long)r.home_swaps,
              (unsigned long long)r.buffer_hits, (unsigned long long)r.remote_fetches,
              (unsigned long long)r.buffer_evictions, (unsigned long long)r.left_to_home,
              (unsigned long long)r.attention_checks, (unsigned long long)r.entries_checked);
}

TEST(TpVerifier, RandomWorkloadKeepsEveryByteWith2_4_8InProcessRanks) {
  ULA_TEST_SEEDED(seed, 20260505);
  for (std::uint32_t ranks : {2u, 4u, 8u}) {
    TpVerifierConfig c;
    c.seed = seed;
    c.ops = kOps;
    c.num_ranks = ranks;
    c.top_k = 16;
    c.initial_requests = kFullWorkload;
    c.device_slots_per_group = RoundDevice(c);
    c.buffer_slots_per_group = 160;  // more than one round's remote selections need
    c.copy_threads = ranks == 4 ? 0 : 2;
    std::printf("seed=%llu ranks=%u\n", static_cast<unsigned long long>(c.seed), ranks);
    auto report = RunTpVerifier(c);
    ASSERT_TRUE(report) << report.error().ToString();
    ExpectClean(*report);
    PrintReport(*report);
    ExpectPressure(c, *report);
  }
}

// Attention at home: no local buffer; every query's partials from all ranks, merged in
// rank order, match the reference attention over the shadow.
TEST(TpVerifier, AttentionAtHomeMatchesTheReferenceWith2_4_8InProcessRanks) {
  ULA_TEST_SEEDED(seed, 20261129);
  for (std::uint32_t ranks : {2u, 4u, 8u}) {
    TpVerifierConfig c;
    c.seed = seed;
    c.ops = kOps;
    c.num_ranks = ranks;
    c.top_k = 16;
    c.initial_requests = kFullWorkload;
    c.device_slots_per_group = RoundDevice(c);
    c.attention = TpAttention::kAtHome;
    c.copy_threads = ranks == 4 ? 0 : 2;
    std::printf("seed=%llu ranks=%u attention at home\n", static_cast<unsigned long long>(c.seed), ranks);
    auto report = RunTpVerifier(c);
    ASSERT_TRUE(report) << report.error().ToString();
    ExpectClean(*report);
    PrintReport(*report);
    EXPECT_EQ(report->attention_mismatches, 0u);
    ExpectPressure(c, *report);
    // Every planned step of a rank with heads compares each query's merged output; with
    // P > 1 some selections are homed elsewhere. (No buffer exists at home: the zero buffer
    // counters follow from the configuration and are not checked.)
    EXPECT_GT(report->attention_checks, 0u);
    EXPECT_GT(report->left_to_home, 0u);
  }
}

// Injected transfer failures (TpVerifierConfig::fault_rate, in-process ranks: home copies
// and swaps, cross-rank buffer copies): some steps fail, and after each the verifier finds
// no early publish and no lost entry; the steps between failures read what they left.
TEST(TpVerifier, FailedStepsPublishNothingEarlyAndLoseNothingWithBothStrategies) {
  ULA_TEST_SEEDED(seed, 20261201);
  for (TpAttention attention : {TpAttention::kLocalBuffer, TpAttention::kAtHome}) {
    const TpVerifierConfig c = FaultedConfig(seed, attention, 0.2);
    auto report = RunTpVerifier(c);
    ASSERT_TRUE(report) << report.error().ToString();
    ExpectClean(*report);
    PrintReport(*report);
    std::printf("  faults=%llu failed steps=%llu lost=%llu early=%llu\n", (unsigned long long)report->faults_injected,
                (unsigned long long)report->failed_calls, (unsigned long long)report->entries_lost,
                (unsigned long long)report->early_publishes);
    EXPECT_EQ(report->entries_lost, 0u);
    EXPECT_EQ(report->early_publishes, 0u);
    EXPECT_GT(report->failed_calls, 0u);
    EXPECT_GE(report->faults_injected, report->failed_calls);  // a failed step had at least one fault
    EXPECT_GT(report->steps, 0u);
    EXPECT_EQ(report->steps + report->rejected_steps + report->failed_calls, report->sub_batches * c.num_groups);
    EXPECT_TRUE(report->ok());
  }
  TpVerifierConfig bad;
  bad.fault_rate = 1.5;
  EXPECT_EQ(RunTpVerifier(bad).error().code(), ErrorCode::kInvalidArgument);
}

// Host shadows per shard (TpConfig::host_shadows): the same workloads, faults or
// none, both strategies: every byte kept, nothing published early or lost, the invariants
// (a shadow equals its entry's device bytes) hold, and most home evictions move no bytes.
TEST(TpVerifier, HostShadowsKeepEveryByteWithFaultsOrNone) {
  ULA_TEST_SEEDED(seed, 20261204);
  for (TpAttention attention : {TpAttention::kLocalBuffer, TpAttention::kAtHome}) {
    for (double fault_rate : {0.0, 0.2}) {
      TpVerifierConfig c = FaultedConfig(seed, attention, fault_rate);
      c.host_shadows = true;
      auto report = RunTpVerifier(c);
      ASSERT_TRUE(report) << report.error().ToString();
      ExpectClean(*report);
      PrintReport(*report);
      std::printf("  shadows: %llu of %llu home evictions moved no bytes; faults=%llu failed=%llu\n",
                  (unsigned long long)report->home_shadow_evictions, (unsigned long long)report->home_swaps,
                  (unsigned long long)report->faults_injected, (unsigned long long)report->failed_calls);
      EXPECT_EQ(report->entries_lost, 0u);
      EXPECT_EQ(report->early_publishes, 0u);
      EXPECT_GT(report->home_shadow_evictions, 0u);
      if (fault_rate > 0) {
        EXPECT_GT(report->failed_calls, 0u);
      }
      EXPECT_TRUE(report->ok());
    }
  }
}

// A run that starts with more requests than the live cap is refused.
// DeepSeek-V4-Flash's kinds over a TP space (TpVerifierConfig::model; docs/ARCHITECTURE.md,
// "Kinds under TP"): the host step at home runs clean at P = 2 and 4 with every rank's page
// tables checked against the model, and what a TP space with kinds does not run is refused
// before anything runs, naming the reason (the long runs: ctest cli_verify_model_v4_tp*).
TEST(TpVerifier, ModelKindsRunAtHomeAndTheRefusalsNameTheirReasons) {
  ULA_TEST_SEEDED(seed, 20261206);
  auto flash = LoadModelConfigByName("deepseek_v4_flash", DefaultConfigDir());
  ASSERT_TRUE(flash) << flash.error().ToString();
  VerifierConfig shape;
  ASSERT_TRUE(ApplyModel(shape, *flash));
  TpVerifierConfig c;
  c.seed = seed;
  c.ops = kOps / 4;
  c.num_groups = shape.num_groups;
  c.entry_bytes = shape.entry_bytes;
  c.top_k = 16;
  c.device_slots_per_group = 48;
  c.attention = TpAttention::kAtHome;
  c.draft_reject_percent = 50;
  c.model = *flash;
  for (std::uint32_t ranks : {2u, 4u}) {
    c.num_ranks = ranks;
    std::printf("seed=%llu ranks=%u model deepseek_v4_flash\n", static_cast<unsigned long long>(c.seed), ranks);
    auto report = RunTpVerifier(c);
    ASSERT_TRUE(report) << report.error().ToString();
    ExpectClean(*report);
    EXPECT_TRUE(report->ok());
    EXPECT_GT(report->steps, 0u);
    EXPECT_GT(report->c4_made, 0u);
    EXPECT_GE(report->kind_pages_checked, report->ops * ranks);  // every rank's tables after every op
  }
  auto refused = [&](TpVerifierConfig bad, std::string_view says) {
    auto report = RunTpVerifier(bad);
    ASSERT_FALSE(report) << "ran: " << says;
    EXPECT_EQ(report.error().code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(report.error().message().find(says), std::string::npos) << report.error().message();
  };
  TpVerifierConfig local = c;
  local.attention = TpAttention::kLocalBuffer;
  refused(local, "runs attention at home only");
  TpVerifierConfig device = c;
  device.form = PlannerForm::kDevice;
  device.stable_new_entries = true;
  device.policy = PolicyKind::kKernelPbLru;
  refused(device, "device step over a TP space with kinds is not built");
  TpVerifierConfig sharing = c;
  sharing.share_percent = 10;
  refused(sharing, "refuses ShareInto");
  TpVerifierConfig three = c;
  three.num_ranks = 3;
  refused(three, "must divide the page's 64 C4 entries");
  TpVerifierConfig groups = c;
  groups.num_groups = 2;
  refused(groups, "model 'deepseek_v4_flash' has 21");
}

TEST(TpVerifier, TooManyInitialRequestsAreRefused) {
  TpVerifierConfig c;
  c.initial_requests = kFullWorkload + 1;
  EXPECT_EQ(RunTpVerifier(c).error().code(), ErrorCode::kInvalidArgument);
}

// Sharing, both attention strategies, at the ops of the tests above.
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
    // The sharing path ran (not a seed's counts: any seed adopts at 80 % of the arrivals).
    EXPECT_GT(report->shares, 0u);
    EXPECT_GT(report->sharer_checks, 0u);
    EXPECT_GT(report->steps, 0u);
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
  c = {};
  c.cuda = true;  // the CUDA form is the device step's
  c.form = PlannerForm::kEngine;
  c.stable_new_entries = true;
  EXPECT_EQ(RunTpVerifier(c).error().code(), ErrorCode::kInvalidArgument);
}

}  // namespace
}  // namespace ula
