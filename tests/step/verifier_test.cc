#include "verify/consistency_verifier.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>

#include "config/model_config.h"
#include "test_seed.h"

namespace ula {
namespace {

// The TSan tree runs the configurations with copy threads only (copy_threads 0 runs every
// batch inside Submit: nothing for TSan to see), and the sharing run with faults only.
#ifdef __SANITIZE_THREAD__
constexpr bool kThreadSanitizer = true;
#else
constexpr bool kThreadSanitizer = false;
#endif
// The sanitizer trees run 800 operations per configuration (the release tree the 1,500 the
// floors below were set at; they scale with the count): each op there costs 10-30x.
#if defined(ULA_EXPENSIVE_CHECKS) || defined(__SANITIZE_THREAD__) || defined(ULA_VERIFIER_TEST_SANITIZER_OPS)
constexpr std::uint64_t kOps = 800;
#else
constexpr std::uint64_t kOps = 1500;
#endif
// A floor set at 1,500 operations, scaled to kOps.
constexpr std::uint64_t Floor(std::uint64_t at_1500) { return at_1500 * kOps / 1500; }

TEST(ConsistencyVerifier, RandomWorkloadUnderPressureKeepsEveryByte) {
  ULA_TEST_SEEDED(seed, 20261129);
  for (int threads : {0, 2}) {
    if (kThreadSanitizer && threads == 0) continue;
    VerifierConfig c;
    c.seed = seed;
    c.ops = kOps;
    c.copy_threads = threads;
    std::printf("seed=%llu copy_threads=%d\n", static_cast<unsigned long long>(c.seed), threads);
    auto report = RunConsistencyVerifier(c);
    ASSERT_TRUE(report) << report.error().ToString();
    for (const auto& f : report->first_failures) ADD_FAILURE() << f;
    EXPECT_EQ(report->mismatches, 0u);
    EXPECT_EQ(report->invariant_failures, 0u);
    EXPECT_EQ(report->bad_input_failures, 0u);
    EXPECT_GT(report->swaps, Floor(500));  // the run really was under memory pressure
    EXPECT_GT(report->bad_input_checks, Floor(20));
    EXPECT_GT(report->entries_checked, Floor(50000));
  }
}

// Sharing at the same op count, with and without injected copy faults: adopted
// prefixes read their bytes, a sharer's free keeps what others hold in place, eviction
// keeps every locked match.
TEST(ConsistencyVerifier, RandomSharingKeepsEveryByteWithAndWithoutFaults) {
  ULA_TEST_SEEDED(seed, 20261201);
  for (double fault_rate : {0.0, 0.2}) {
    if (kThreadSanitizer && fault_rate == 0.0) continue;
    VerifierConfig c;
    c.seed = seed;
    c.ops = kOps;
    c.share_percent = 40;
    c.fault_rate = fault_rate;
    std::printf("seed=%llu sharing fault_rate=%.1f\n", static_cast<unsigned long long>(c.seed), fault_rate);
    auto report = RunConsistencyVerifier(c);
    ASSERT_TRUE(report) << report.error().ToString();
    for (const auto& f : report->first_failures) ADD_FAILURE() << f;
    EXPECT_TRUE(report->ok());
    std::printf("  shares=%llu sharer checks=%llu evictions=%llu locked checks=%llu swaps=%llu failed calls=%llu\n",
                (unsigned long long)report->shares, (unsigned long long)report->sharer_checks,
                (unsigned long long)report->cache_evictions, (unsigned long long)report->locked_checks,
                (unsigned long long)report->swaps, (unsigned long long)report->failed_calls);
    EXPECT_GT(report->shares, Floor(20));
    EXPECT_GT(report->sharer_checks, Floor(1000));
    EXPECT_GT(report->cache_evictions, Floor(5));
    EXPECT_GT(report->locked_checks, Floor(10));
    EXPECT_GT(report->swaps, Floor(200));
    if (fault_rate > 0) {
      EXPECT_GT(report->failed_calls, Floor(10));
    }
  }
}

// Host shadows at the same op count, with sharing, with and without injected
// faults, over a roomy host and a tight one (shadows reclaimed, some swaps): every entry
// reads its reference bytes and most evictions move no bytes.
TEST(ConsistencyVerifier, HostShadowsKeepEveryByteWithAndWithoutFaults) {
  ULA_TEST_SEEDED(seed, 20261230);
  for (std::uint32_t host : {8192u, 1024u}) {
    for (double fault_rate : {0.0, 0.2}) {
      if (kThreadSanitizer && fault_rate == 0.0) continue;
      VerifierConfig c;
      c.seed = seed;
      c.ops = kOps;
      c.host_shadows = true;
      c.host_slots_per_group = host;
      c.share_percent = 20;
      c.fault_rate = fault_rate;
      auto report = RunConsistencyVerifier(c);
      ASSERT_TRUE(report) << report.error().ToString();
      for (const auto& f : report->first_failures) ADD_FAILURE() << f;
      EXPECT_TRUE(report->ok());
      std::printf("seed=%llu shadows host=%u fault_rate=%.1f: swaps=%llu shadow evictions=%llu failed calls=%llu\n",
                  static_cast<unsigned long long>(c.seed), host, fault_rate, (unsigned long long)report->swaps,
                  (unsigned long long)report->shadow_evictions, (unsigned long long)report->failed_calls);
      EXPECT_GT(report->swaps, Floor(200));
      EXPECT_GT(report->shadow_evictions, report->swaps / 20);
      if (fault_rate > 0) {
        EXPECT_GT(report->failed_calls, Floor(10));
      }
    }
  }
}

TEST(ConsistencyVerifier, InvalidConfigIsRefused) {
  VerifierConfig c;
  c.device_slots_per_group = 8;
  auto report = RunConsistencyVerifier(c);
  ASSERT_FALSE(report);
  EXPECT_EQ(report.error().code(), ErrorCode::kInvalidArgument);
}

// The CUDA form is the device step's: VerifierConfig::cuda with another form is refused before
// anything runs, naming the field (with the device form it is DeviceStep::Create's to refuse).
TEST(ConsistencyVerifier, CudaWithAnotherFormIsRefused) {
  for (PlannerForm form : {PlannerForm::kHost, PlannerForm::kEngine}) {
    VerifierConfig c;
    c.ops = 20;
    c.form = form;
    c.stable_new_entries = true;
    c.cuda = true;
    auto report = RunConsistencyVerifier(c);
    ASSERT_FALSE(report) << PlannerFormName(form);
    EXPECT_EQ(report.error().code(), ErrorCode::kInvalidArgument) << report.error().ToString();
    EXPECT_NE(report.error().message().find("VerifierConfig.cuda"), std::string::npos) << report.error().ToString();
  }
}

// A model's shape comes from ApplyModel; what a space with kinds refuses (sharing) and a
// shape not the model's are refused before anything runs, the device form runs over the
// model's kinds, and a model without layer kinds changes nothing (the runs themselves: ctest
// cli_verify_model_v4, _engine and _device).
TEST(ConsistencyVerifier, ModelRefusesSharingAndAnotherShapeAndTheDeviceFormRuns) {
  auto flash = LoadModelConfigByName("deepseek_v4_flash", DefaultConfigDir());
  ASSERT_TRUE(flash) << flash.error().ToString();
  VerifierConfig c;
  c.ops = 50;
  ASSERT_TRUE(ApplyModel(c, *flash));
  EXPECT_EQ(c.num_groups, 21u);
  EXPECT_EQ(c.entry_bytes, 584u);
  EXPECT_EQ(c.group_layers, 1u);
  auto refused = [](VerifierConfig bad, std::string_view says) {
    auto report = RunConsistencyVerifier(bad);
    ASSERT_FALSE(report) << "ran: " << says;
    EXPECT_EQ(report.error().code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(report.error().message().find(says), std::string::npos) << report.error().message();
  };
  VerifierConfig sharing = c;
  sharing.share_percent = 10;
  refused(sharing, "refuses ShareInto");
  VerifierConfig device = c;
  device.form = PlannerForm::kDevice;
  device.stable_new_entries = true;
  device.policy = PolicyKind::kKernelPbLru;
  auto ran = RunConsistencyVerifier(device);
  ASSERT_TRUE(ran) << ran.error().ToString();
  for (const auto& f : ran->first_failures) ADD_FAILURE() << f;
  EXPECT_TRUE(ran->ok());
  EXPECT_GT(ran->steps, 0u);
  EXPECT_GT(ran->kind_pages_checked, 0u);
  VerifierConfig groups = c;
  groups.num_groups = 2;
  refused(groups, "model 'deepseek_v4_flash' has 21");

  auto glm = LoadModelConfigByName("tiny_glm", DefaultConfigDir());
  ASSERT_TRUE(glm) << glm.error().ToString();
  VerifierConfig before;
  auto applied = ApplyModel(before, *glm);
  ASSERT_FALSE(applied);
  EXPECT_EQ(applied.error().code(), ErrorCode::kFailedPrecondition);
  EXPECT_FALSE(before.model.has_value());
  EXPECT_EQ(before.num_groups, VerifierConfig{}.num_groups);
}

}  // namespace
}  // namespace ula
