// Attention through UlaCache (indexer -> step planner -> device slots) equals the dense
// reference bit for bit under memory pressure, with swaps on every step.
#include <gtest/gtest.h>

#include <cstdio>

#include "verify/attention_check.h"
#include "ula/backend.h"
#include "config/model_config.h"
#include "test_seed.h"

namespace ula {
namespace {

// ULA_TEST_SEED replaces it (tests/test_seed.h); printed when the test program starts.
const std::uint64_t kSeed = ::ula::testing::TestSeed(777);

AttentionCheckOptions Options(const char* model) {
  auto m = LoadModelConfigByName(model, DefaultConfigDir());
  EXPECT_TRUE(m) << (m ? "" : m.error().ToString());
  AttentionCheckOptions o;
  if (m) o.model = *m;
  o.num_requests = 4;
  o.prompt_tokens = 384;
  o.decode_steps = 8;
  o.draft_tokens = 2;
  o.seed = kSeed;
  return o;
}

TEST(AttentionCheck, BitIdenticalUnderPressureWithSwapsEveryStep) {
  std::printf("seed %llu\n", static_cast<unsigned long long>(kSeed));
  for (const char* model : {"tiny_glm", "tiny_dsa"}) {
    AttentionCheckOptions o = Options(model);
    // Pressure needs more live entries than one step can select (tiny_dsa: top-k 256).
    if (o.model.top_k > 64) o.prompt_tokens = 2048;
    auto report = RunAttentionCheckUnderPressure(o, 0.4);
    ASSERT_TRUE(report) << model << ": " << report.error().ToString();
    EXPECT_EQ(report->steps, 8u);
    EXPECT_GT(report->checks, 0u);
    EXPECT_EQ(report->mismatches, 0u) << model;
    EXPECT_EQ(report->entry_mismatches, 0u) << model;
    EXPECT_GT(report->entries_checked, 0u);
    // Memory pressure: every planner call of every step displaced entries.
    EXPECT_EQ(report->steps_with_swaps, report->planner_calls) << model;
    EXPECT_GT(report->planner.evictions, 0u);
    for (const auto& f : report->first_failures) ADD_FAILURE() << f;
  }
}

TEST(AttentionCheck, TwoRanks) {
  auto report = RunAttentionCheckUnderPressure(Options("tiny_glm"), 0.5, 2);
  ASSERT_TRUE(report) << report.error().ToString();
  EXPECT_TRUE(report->ok());
  EXPECT_GT(report->planner.evictions, 0u);
}

TEST(AttentionCheck, RejectsMismatchedSpaceAndNonFloatModels) {
  auto o = Options("tiny_glm");
  AddressSpaceConfig cfg;
  cfg.num_groups = 1;  // the model has 3
  cfg.entry_bytes = o.model.group_entry_bytes();
  cfg.device_bytes_per_rank = 1 << 20;
  cfg.host_bytes_per_rank = 1 << 20;
  auto backend = MakeCpuBackend();
  auto space = AddressSpace::Create(cfg, *backend);
  ASSERT_TRUE(space) << space.error().ToString();
  EXPECT_FALSE(RunAttentionCheck(**space, o));
  EXPECT_EQ((*space)->num_requests(), 0u);
  auto glm5 = LoadModelConfigByName("glm5", DefaultConfigDir());
  ASSERT_TRUE(glm5);
  o.model = *glm5;  // fp8 entries: the reference attention reads float32 only
  EXPECT_FALSE(RunAttentionCheckUnderPressure(o));
}

}  // namespace
}  // namespace ula
