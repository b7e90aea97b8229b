// Per-kind pricing (kind_pools.h, kind_step_cost.h, kind_compare.h) on DeepSeek-V4-Flash:
// the shape of its kinds, SGLang's pool sizing against a hand computation of
// DSV4PoolConfigurator, which pool fills first at short and long contexts, the shared pools'
// admission, the weights against the published size, and the step's terms.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "config/model_config.h"
#include "serving/kind_compare.h"
#include "serving/kind_config.h"
#include "serving/kind_pools.h"
#include "serving/kind_step_cost.h"

namespace ula {
namespace {

struct Fixture {
  ModelConfig model;
  KindCompareConfig kc;
};
Fixture Load() {
  auto m = LoadModelConfigByName("deepseek_v4_flash", DefaultConfigDir());
  auto k = LoadKindCompareConfigByName("deepseek_v4_flash", DefaultConfigDir());
  EXPECT_TRUE(m && k);
  return {*m, *k};
}

PoolSetup MakeSetup(ParallelMode mode, double device) {
  PoolSetup s;
  s.mode = mode;
  s.num_ranks = 8;
  s.device_bytes = device;
  s.host_bytes = 128e9;
  return s;
}

// SGLang's C128 state for 256 + 1 request slots, ring 128, 20 HCA layers, fp32:
// ceil((257 * 128 + 129) / 128) * 128 rows x 2 x 512 x 4 B x 20.
constexpr double kC128StateTp = 33152.0 * 2 * 512 * 4 * 20;
// _get_bytes_per_full_token, MTP off: 0.1*584*43 + 584*21/4 + 584*20/128 + 132*21/4
// + 0.1*(8/128)*(2*2*512*4 + 2*2*128*4)*21.
constexpr double kBpft = 0.1 * 584 * 43 + 584.0 * 21 / 4 + 584.0 * 20 / 128 + 132.0 * 21 / 4 + 0.1 * (8.0 / 128) * (8192 + 2048) * 21;

TEST(KindPools, V4FlashShape) {
  const Fixture f = Load();
  auto off = MakeKindShape(f.model, false);
  auto on = MakeKindShape(f.model, true);
  ASSERT_TRUE(off && on);
  EXPECT_EQ(off->window_layers, 43u);
  EXPECT_EQ(on->window_layers, 44u);  // the MTP layer keeps window KV only
  EXPECT_EQ(off->csa_layers, 21u);
  EXPECT_EQ(off->hca_layers, 20u);
  EXPECT_EQ(on->csa_layers, 21u);
  EXPECT_EQ(off->entry_bytes, 584u);
  EXPECT_EQ(off->key_bytes, 132u);
  const KindUse u = ExactKindUse(*off, 1000);
  EXPECT_DOUBLE_EQ(u.window, 128.0 * 584 * 43);
  EXPECT_DOUBLE_EQ(u.csa, 250.0 * 584 * 21);
  EXPECT_DOUBLE_EQ(u.hca, 7.0 * 584 * 20);
  EXPECT_DOUBLE_EQ(u.index, 250.0 * 132 * 21);
}

TEST(KindPools, SglangSizesItsPoolsAsDsv4PoolConfigurator) {
  const Fixture f = Load();
  const KindShape s = *MakeKindShape(f.model, false);
  // 1000 pages of full tokens, plus the fixed C128 state and a few bytes of slack.
  const PoolSetup setup = MakeSetup(ParallelMode::kTp, kC128StateTp + kBpft * 256000 + 100);
  auto plan = MakePoolPlan(KindSystem::kSglang, s, f.kc, setup);
  ASSERT_TRUE(plan) << plan.error().ToString();
  ASSERT_EQ(plan->pools.size(), 2u);
  EXPECT_EQ(plan->pools[0].capacity, 256000);  // full tokens
  EXPECT_EQ(plan->pools[1].capacity, 25600);   // swa tokens = 0.1 x full, page-aligned
  EXPECT_NEAR(plan->reserved.csa, 64000.0 * 584 * 21, 1);
  EXPECT_NEAR(plan->reserved.window, 25600.0 * 584 * 43, 1);
  EXPECT_NEAR(plan->state_bytes + plan->reserved.total(), kBpft * 256000 + kC128StateTp, 1e3);
}

TEST(KindPools, TheWindowPoolFillsFirstAtShortContextsTheFullPoolAtLongOnes) {
  const Fixture f = Load();
  const KindShape s = *MakeKindShape(f.model, false);
  const PoolSetup setup = MakeSetup(ParallelMode::kTp, kC128StateTp + kBpft * 256000 + 100);
  auto plan = MakePoolPlan(KindSystem::kSglang, s, f.kc, setup);
  ASSERT_TRUE(plan);
  // 1374 tokens: 6 pages (1536 full tokens) but window + page = 384 SWA tokens each:
  // 25600 / 384 = 66 requests, while the full pool would take 166.
  const std::vector<std::uint32_t> short_reqs(1000, 1374);
  const Admission a = Admit(*plan, s, f.kc, setup, short_reqs);
  EXPECT_EQ(a.admitted, 66u);
  EXPECT_EQ(a.binds, "swa");
  EXPECT_LT(a.pool_fill[0], 0.5);  // the full pool idles
  // 65886 tokens: 258 pages = 66048 full tokens each: 3 requests; the SWA pool holds 3 x 384.
  const std::vector<std::uint32_t> long_reqs(1000, 65886);
  const Admission b = Admit(*plan, s, f.kc, setup, long_reqs);
  EXPECT_EQ(b.admitted, 3u);
  EXPECT_EQ(b.binds, "full");
  EXPECT_LT(b.pool_fill[1], 0.05);
  // The same memory as one space admits more of both: a run of the space
  // (kind_space_admission_test, AdmitsMoreThanSglangsFixedPoolsAtTheSameBudget).
}

TEST(KindPools, SharedPoolsAndTiers) {
  const Fixture f = Load();
  const KindShape s = *MakeKindShape(f.model, false);
  const PoolSetup setup = MakeSetup(ParallelMode::kTp, 100e9);
  const std::vector<std::uint32_t> reqs(4096, 100000);
  auto vllm = MakePoolPlan(KindSystem::kVllm, s, f.kc, setup);
  auto dcp = MakePoolPlan(KindSystem::kDcp, s, f.kc, setup);
  auto trt = MakePoolPlan(KindSystem::kTrtllmOffload, s, f.kc, setup);
  auto ula = MakePoolPlan(KindSystem::kUlaCache, s, f.kc, setup);
  ASSERT_TRUE(vllm && dcp && trt && ula);
  // UlaCache's admission is a run of its space (kind_space_admission.h), not a pool formula.
  EXPECT_TRUE(PoolDemand(*ula, s, f.kc, setup, 100000).empty());
  EXPECT_EQ(Admit(*ula, s, f.kc, setup, reqs).admitted, 0u);
  // vLLM: 391 blocks of 256 tokens; per block 21 x (37440 + 8448) + 20 x 1728 B; the window
  // two blocks of 149760 B in each of 43 layers.
  const double per = 391.0 * (21 * (37440 + 8448) + 20 * 1728) + 2 * 149760.0 * 43;
  EXPECT_NEAR(PoolDemand(*vllm, s, f.kc, setup, 100000)[0], per, 1);
  const Admission av = Admit(*vllm, s, f.kc, setup, reqs);
  EXPECT_EQ(av.admitted, static_cast<std::uint32_t>(100e9 / per));
  EXPECT_EQ(av.binds, "blocks");
  // DCP holds 1/8 of each request's tokens per rank, in whole blocks (the window's two
  // blocks stay two): between 5x and 8x vLLM.
  const Admission ad = Admit(*dcp, s, f.kc, setup, reqs);
  EXPECT_GT(ad.admitted, 5 * av.admitted);
  EXPECT_LE(ad.admitted, 8 * av.admitted + 8);
  // TensorRT-LLM's offload: C4 on host, one copy per GPU: fewer than DCP's striped pools.
  const Admission at = Admit(*trt, s, f.kc, setup, reqs);
  EXPECT_LT(at.admitted, ad.admitted);
  EXPECT_FALSE(MakePoolPlan(KindSystem::kDcp, s, f.kc, MakeSetup(ParallelMode::kDp, 100e9)).has_value());
}

TEST(KindPools, HiSparseRatioKeepsOneBufferPerRequestOnDevice) {
  const Fixture f = Load();
  const KindShape s = *MakeKindShape(f.model, false);
  PoolSetup setup = MakeSetup(ParallelMode::kDp, 100e9);
  setup.host_bytes = 1e15;  // the host budget allows any ratio: the buffer cap decides
  setup.mean_tokens = 98304;
  auto plan = MakePoolPlan(KindSystem::kSglangHiSparse, s, f.kc, setup);
  ASSERT_TRUE(plan);
  EXPECT_DOUBLE_EQ(plan->hisparse_ratio, 98304.0 / (4 * 4096));
  // The device C4 pool then holds a 4096-entry buffer for every request the full pool admits.
  const std::vector<std::uint32_t> reqs(100000, 98304);
  const Admission a = Admit(*plan, s, f.kc, setup, reqs);
  EXPECT_NE(a.binds, "c4_device");
  // A small host budget lowers the ratio until the host pool (every C4 entry) fits.
  setup.host_bytes = 20e9;
  auto small = MakePoolPlan(KindSystem::kSglangHiSparse, s, f.kc, setup);
  ASSERT_TRUE(small);
  EXPECT_LT(small->hisparse_ratio, plan->hisparse_ratio);
  EXPECT_LE(small->host_bytes, 20e9);
}

KindStepInputs StepInputs(const Fixture& f, ParallelMode mode, bool mtp) {
  KindStepInputs in;
  in.shape = *MakeKindShape(f.model, mtp);
  in.main_layers = f.model.num_layers;
  in.attention_heads = f.model.attention_heads;
  in.index_heads = f.model.index_heads;
  in.kinds = f.kc;
  in.hardware = *LoadHardwareConfigByName("h200", DefaultConfigDir());
  in.rates = *LoadComputeRatesByName("h200", DefaultConfigDir());
  in.mode = mode;
  in.mtp = mtp;
  in.draft_tokens = 2;
  in.kernel_overhead_s_per_layer = 10e-6;
  return in;
}

TEST(KindStepCost, WeightsMatchThePublishedSize) {
  const Fixture f = Load();
  const KindWeights w = DeriveKindWeights(StepInputs(f, ParallelMode::kTp, false));
  // DeepSeek-V4-Flash: 284B parameters (model card), embeddings included.
  const double total = w.non_expert_params + w.routed_params + 2.0 * f.kc.vocab_size * f.kc.hidden_size;
  EXPECT_NEAR(total / 1e9, 284, 284 * 0.02);
}

TEST(KindStepCost, TermsFollowTheKinds) {
  const Fixture f = Load();
  const KindStepInputs tp = StepInputs(f, ParallelMode::kTp, false);
  KindStepCounts c{.batch_total = 64, .batch_local = 64, .context = 100000};
  auto rep = PriceKindStep(tp, c);
  c.at_home = true;
  c.striped_indexer = true;
  auto home = PriceKindStep(tp, c);
  ASSERT_TRUE(rep && home);
  // At home every GPU reads 1/8 of the entries with all 64 heads instead of 8 padded to 64.
  EXPECT_NEAR(home->attention * 8, rep->attention, rep->attention * 1e-9);
  EXPECT_NEAR(home->indexer * 8, rep->indexer, rep->indexer * 1e-9);
  EXPECT_GT(home->collectives, rep->collectives);
  c.host_fetch_entries = 1e6;
  auto fetch = PriceKindStep(tp, c);
  ASSERT_TRUE(fetch);
  EXPECT_NEAR(fetch->host_link, 1e6 * 584 / tp.rates.host_link_scattered_bytes_per_s, 1e-12);
  EXPECT_NEAR(fetch->total - home->total, fetch->host_link, 1e-12);
  EXPECT_NEAR(KindTokensPerStep(StepInputs(f, ParallelMode::kTp, true), 0.7), 1 + 0.7 + 0.49, 1e-12);
  c.batch_local = -1;
  EXPECT_FALSE(PriceKindStep(tp, c).has_value());
  KindStepCounts dp_home{.batch_total = 1, .batch_local = 1, .context = 1000, .at_home = true};
  EXPECT_FALSE(PriceKindStep(StepInputs(f, ParallelMode::kDp, false), dp_home).has_value());
}

TEST(KindCompare, RunsEverySystemOfEveryConfig) {
  const Fixture f = Load();
  auto r = RunKindComparison(f.kc, DefaultConfigDir());
  ASSERT_TRUE(r) << r.error().ToString();
  ASSERT_EQ(r->configs.size(), 8u);
  for (const KindConfigResult& c : r->configs) {
    EXPECT_EQ(c.systems.size(), c.entry.mode == ParallelMode::kTp ? 6u : 5u);
    for (const KindSystemResult& s : c.systems) {
      EXPECT_GT(s.admission.admitted, 0u) << KindSystemName(s.system);
      EXPECT_GT(s.peak_tput, 0) << KindSystemName(s.system);
      EXPECT_GT(s.tpot_b1_ms, 0) << KindSystemName(s.system);
      EXPECT_LE(s.admission.fill, 1.0 + 1e-9);
    }
    // UlaCache's admission is a run of its space at the same budget: more than SGLang's
    // fixed pools, every rank's budget reported, its host share in [0, 1].
    const Admission& ula = c.Find(KindSystem::kUlaCache)->admission;
    EXPECT_GT(ula.admitted, c.Find(KindSystem::kSglang)->admission.admitted);
    EXPECT_EQ(ula.space.size(), c.entry.mode == ParallelMode::kTp ? 1u : 8u);
    EXPECT_GE(ula.host_share_csa, 0.0);
    EXPECT_LE(ula.host_share_csa, 1.0);
  }
  EXPECT_EQ(r->starvation.size(), 2 * f.kc.starvation_contexts.size());
}

TEST(KindConfig, RefusesUnknownFieldsAndMissingModels) {
  auto bad = ParseKindCompareConfig(R"({"name": "x", "source": "s", "model": "m", "scenario": "d", "typo": 1})", "t.json");
  EXPECT_FALSE(bad.has_value());
  auto none = LoadKindCompareConfigByName("glm5", DefaultConfigDir());
  ASSERT_FALSE(none.has_value());
  EXPECT_EQ(none.error().code(), ErrorCode::kNotFound);
  EXPECT_NE(none.error().message().find("deepseek_v4_flash"), std::string::npos);
}

}  // namespace
}  // namespace ula
