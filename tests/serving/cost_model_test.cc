// Cost model: GLM-5's derived parameter counts match its published size, each roofline term
// and the overlap rule on hand-computed cases, the memory budget derivation, and errors.
#include <gtest/gtest.h>

#include <cmath>

#include "ula/cost_model.h"
#include "ula/hardware_config.h"
#include "ula/model_config.h"

namespace ula {
namespace {

const std::filesystem::path kTestConfigs = ULA_SERVING_TEST_CONFIGS;

CostModelInputs TinyInputs(ParallelMode mode, bool mtp) {
  CostModelInputs in;
  in.model = *LoadModelConfigByName("tiny_glm", kTestConfigs);
  in.costs = *LoadModelCostConfigByName("tiny_glm", kTestConfigs);
  in.hardware = *LoadHardwareConfigByName("tiny_gpu", kTestConfigs);
  in.rates = *LoadComputeRatesByName("tiny_gpu", kTestConfigs);
  in.mode = mode;
  in.mtp = mtp;
  in.num_ranks = 2;
  in.draft_tokens = 2;
  in.kernel_overhead_s_per_layer = 1e-6;
  in.candidate_bytes = 8;
  in.activation_reserve_fraction = 0.1;
  return in;
}

TEST(CostModel, Glm5ParametersMatchThePublishedSize) {
  auto m = LoadModelConfigByName("glm5", DefaultConfigDir());
  auto c = LoadModelCostConfigByName("glm5", DefaultConfigDir());
  ASSERT_TRUE(m && c);
  const WeightParams p = DeriveWeightParams(*m, *c);
  // GLM-5 model card: 744B parameters, 40B active (the MTP layer adds about 10B).
  EXPECT_NEAR((p.total - (p.attention_per_layer + p.indexer_per_group + 257 * p.expert + p.router_per_layer +
                          p.mtp_extra)) / 1e9, 744, 744 * 0.01);
  EXPECT_NEAR(p.active_per_token / 1e9, 40, 40 * 0.05);
}

TEST(CostModel, EachTermIsItsOwnRoofline) {
  auto cm = CostModel::Create(TinyInputs(ParallelMode::kTp, false));
  ASSERT_TRUE(cm) << cm.error().ToString();
  StepWork w;
  w.weight_bytes = 1e9;       // 1 ms at 1e12 B/s
  w.weight_flops = 4e11;      // 2 ms at 2e14 FP8 -> compute bound
  w.attention_bytes = 3e9;    // 3 ms
  w.attention_flops = 1e11;   // 1 ms at 1e14 BF16 (from the costs file: the profile has 0)
  w.indexer_bytes = 0;
  w.indexer_flops = 2e11;     // 1 ms at FP8
  w.groups = 1;
  w.layers = 0;
  const StepTime t = cm->Time(w);
  EXPECT_DOUBLE_EQ(t.weights, 2e-3);
  EXPECT_DOUBLE_EQ(t.attention, 3e-3);
  EXPECT_DOUBLE_EQ(t.indexer, 1e-3);
  EXPECT_DOUBLE_EQ(t.gpu, 6e-3);
  EXPECT_DOUBLE_EQ(t.total, 6e-3);
}

TEST(CostModel, TransfersOverlapOtherGroupsComputeAndCollectivesDoNot) {
  auto cm = CostModel::Create(TinyInputs(ParallelMode::kTp, false));
  ASSERT_TRUE(cm);
  StepWork w;
  w.attention_bytes = 2e9;   // gpu 2 ms
  w.h2d_bytes = 3e7;         // 3 ms at 1e10 B/s
  w.d2h_bytes = 4e7;         // 4 ms: the link is full duplex, the larger direction counts
  w.nvlink_fetch_bytes = 1e8;  // 1 ms at 1e11 B/s (half of the bidirectional 2e11)
  w.collective_bytes = 2e8;    // 2 ms
  w.groups = 2;
  w.layers = 7;
  const StepTime t = cm->Time(w);
  EXPECT_DOUBLE_EQ(t.host_link, 4e-3);
  EXPECT_DOUBLE_EQ(t.nvlink_fetch, 1e-3);
  // tx = 4, gpu = 2, G = 2: 4/2 + 2/2 + (1/2) * max(2, 4) = 5 ms.
  EXPECT_NEAR(t.gpu + t.transfer_exposed, 5e-3, 1e-12);
  EXPECT_DOUBLE_EQ(t.collectives, 2e-3);
  EXPECT_DOUBLE_EQ(t.overhead, 7e-6);
  EXPECT_NEAR(t.total, 5e-3 + 2e-3 + 7e-6, 1e-12);
}

TEST(CostModel, WorkCountsTheSelectedEntriesTheKeysAndTheMovedBytes) {
  auto cm = CostModel::Create(TinyInputs(ParallelMode::kDp, false));
  ASSERT_TRUE(cm);
  const ModelConfig& m = cm->inputs().model;  // tiny_glm: 6 layers, groups of 4 (+1 MTP), top-k 32
  EXPECT_EQ(cm->kv_bytes_per_token(), 6u * 96u);     // MTP off: main layers only
  EXPECT_EQ(cm->index_bytes_per_token(), 2u * 64u);  // 2 main groups
  StepCounts k;
  k.batch_total = 4;
  k.batch_local = 2;
  k.history_scored = 1000;
  k.h2d_entries = 10;
  k.d2h_entries = 3;
  const StepWork w = cm->Work(k);
  EXPECT_DOUBLE_EQ(w.attention_bytes, 2.0 * 1 * m.top_k * 6 * 96);
  EXPECT_DOUBLE_EQ(w.indexer_bytes, 1000.0 * 2 * 64);
  EXPECT_DOUBLE_EQ(w.indexer_flops, 1000.0 * 2 * 1 * 2 * m.index_heads * m.index_head_dim);
  EXPECT_DOUBLE_EQ(w.h2d_bytes, 10.0 * 6 * 96);
  EXPECT_DOUBLE_EQ(w.d2h_bytes, 3.0 * 6 * 96);
  EXPECT_EQ(w.groups, 2u);
  EXPECT_EQ(w.layers, 6u);
  // The striped gather is the only difference a striped indexer makes, and it is the same
  // formula for anyone who stripes.
  StepCounts s = k;
  s.striped_indexer = true;
  const StepWork ws = cm->Work(s);
  EXPECT_DOUBLE_EQ(ws.collective_bytes - w.collective_bytes, (2 - 1) * 32.0 * 8 * 4 * 2);
}

// Ordinary UlaCache TP counts and the same step with attention at home, where the GPU's
// share of the batch's distinct selections is home / distinct.
StepCounts TpCounts() {
  StepCounts k;
  k.batch_total = k.batch_local = 3;
  k.history_scored = 1000;
  k.striped_indexer = true;
  k.h2d_entries = 5;
  k.d2h_entries = 2;
  k.nvlink_entries = 7;
  return k;
}
StepCounts AtHome(StepCounts k, double home, double distinct) {
  k.attention_at_home = true;
  k.nvlink_entries = 0;  // nothing is fetched
  k.home_entries = home;
  k.distinct_entries = distinct;
  return k;
}

TEST(CostModel, AttentionAtHomeReadsOneRankthOfTheBytesWithTheSameFlopsAndExchangesQueriesAndPartials) {
  for (bool mtp : {false, true}) {
    SCOPED_TRACE(mtp ? "mtp on" : "mtp off");
    auto cm = CostModel::Create(TinyInputs(ParallelMode::kTp, mtp));  // P = 2
    ASSERT_TRUE(cm);
    const ModelConfig& m = cm->inputs().model;  // 4 heads, kv_lora 16, rope 8, 6 layers (+1 MTP)
    const StepCounts tp = TpCounts();
    const StepCounts home = AtHome(tp, 50, 100);  // share 1/2 = 1/P
    ASSERT_TRUE(cm->CheckCounts(tp));
    ASSERT_TRUE(cm->CheckCounts(home));
    const StepWork a = cm->Work(tp), b = cm->Work(home);
    ASSERT_GT(a.attention_bytes, 0);
    EXPECT_DOUBLE_EQ(b.attention_bytes, a.attention_bytes / 2);
    EXPECT_DOUBLE_EQ(b.attention_flops, a.attention_flops);
    // Everything but attention and the collectives is the same step.
    EXPECT_DOUBLE_EQ(b.weight_bytes, a.weight_bytes);
    EXPECT_DOUBLE_EQ(b.weight_flops, a.weight_flops);
    EXPECT_DOUBLE_EQ(b.indexer_bytes, a.indexer_bytes);
    EXPECT_DOUBLE_EQ(b.h2d_bytes, a.h2d_bytes);
    EXPECT_DOUBLE_EQ(b.d2h_bytes, a.d2h_bytes);
    EXPECT_DOUBLE_EQ(b.nvlink_fetch_bytes, 0);
    EXPECT_GT(a.nvlink_fetch_bytes, 0);
    EXPECT_DOUBLE_EQ(a.query_gather_bytes, 0);
    EXPECT_DOUBLE_EQ(a.partial_exchange_bytes, 0);
    // Query tokens per step x layer passes: 3 requests x q x 6 layers (+ 3 x 2 MTP passes).
    const double passes = mtp ? 3.0 * 3 * 6 + 3.0 * 2 : 3.0 * 1 * 6;
    const double gather = (2 - 1) / 2.0 * m.attention_heads * (16 + 8) * 2 * passes;    // bf16 queries
    const double partials = (2 - 1) / 2.0 * m.attention_heads * (16 + 2) * 4 * passes;  // fp32 records
    EXPECT_DOUBLE_EQ(b.query_gather_bytes, gather);
    EXPECT_DOUBLE_EQ(b.partial_exchange_bytes, partials);
    EXPECT_DOUBLE_EQ(b.collective_bytes - a.collective_bytes, gather + partials);
    const StepTime ta = cm->Time(a), tb = cm->Time(b);
    EXPECT_DOUBLE_EQ(tb.nvlink_fetch, 0);
    EXPECT_GT(ta.nvlink_fetch, 0);
    EXPECT_DOUBLE_EQ(tb.collectives - ta.collectives, (gather + partials) / (2e11 / 2));
    EXPECT_LE(tb.attention, ta.attention);
  }
}

TEST(CostModel, AttentionAtHomeTakesItsShareFromThePlannersCounts) {
  auto cm = CostModel::Create(TinyInputs(ParallelMode::kTp, false));
  ASSERT_TRUE(cm);
  const StepWork a = cm->Work(TpCounts());
  // 30 of the batch's 100 distinct selections are homed here: 0.3 of the reads, all 4 heads
  // over them (ordinary TP: 2 heads over all).
  const StepWork b = cm->Work(AtHome(TpCounts(), 30, 100));
  EXPECT_DOUBLE_EQ(b.attention_bytes, 0.3 * a.attention_bytes);
  EXPECT_DOUBLE_EQ(b.attention_flops, 0.3 * 2 * a.attention_flops);
  // The exchanges do not depend on the share: every rank sends its partial of every query.
  const StepWork c = cm->Work(AtHome(TpCounts(), 70, 100));
  EXPECT_DOUBLE_EQ(c.query_gather_bytes, b.query_gather_bytes);
  EXPECT_DOUBLE_EQ(c.partial_exchange_bytes, b.partial_exchange_bytes);
}

TEST(CostModel, CountsWorkCannotPriceAreRefusedWithTheFieldNamed) {
  auto tp = CostModel::Create(TinyInputs(ParallelMode::kTp, false));
  auto dp = CostModel::Create(TinyInputs(ParallelMode::kDp, false));
  ASSERT_TRUE(tp && dp);
  auto field_of = [](const CostModel& cm, const StepCounts& k) {
    auto s = cm.CheckCounts(k);
    if (s) return std::string("accepted");
    EXPECT_EQ(s.error().code(), ErrorCode::kInvalidArgument);
    return s.error().message();
  };
  EXPECT_EQ(field_of(*tp, TpCounts()), "accepted");
  EXPECT_EQ(field_of(*tp, AtHome(TpCounts(), 50, 100)), "accepted");
  EXPECT_NE(field_of(*dp, AtHome(TpCounts(), 50, 100)).find("attention_at_home"), std::string::npos);
  EXPECT_NE(field_of(*tp, AtHome(TpCounts(), 101, 100)).find("home_entries"), std::string::npos);
  EXPECT_NE(field_of(*tp, AtHome(TpCounts(), 0, 0)).find("distinct_entries"), std::string::npos);
  StepCounts bad = TpCounts();
  bad.h2d_entries = -1;
  EXPECT_NE(field_of(*tp, bad).find("h2d_entries"), std::string::npos);
  bad = TpCounts();
  bad.batch_local = std::nan("");
  EXPECT_NE(field_of(*tp, bad).find("batch_local"), std::string::npos);
}

TEST(CostModel, MtpAddsQueriesDraftPassesAndTheMtpLayersKv) {
  auto off = CostModel::Create(TinyInputs(ParallelMode::kTp, false));
  auto on = CostModel::Create(TinyInputs(ParallelMode::kTp, true));
  ASSERT_TRUE(off && on);
  EXPECT_EQ(off->queries(), 1u);
  EXPECT_EQ(on->queries(), 3u);
  EXPECT_EQ(on->kv_bytes_per_token(), 7u * 96u);
  EXPECT_DOUBLE_EQ(on->ExpectedTokensPerStep(0.5), 1.75);
  EXPECT_DOUBLE_EQ(off->ExpectedTokensPerStep(0.5), 1.0);
  StepCounts k;
  k.batch_total = k.batch_local = 1;
  EXPECT_EQ(on->Work(k).layers, 6u + 2u);  // two MTP passes
}

TEST(CostModel, BudgetIsHbmMinusWeightsMinusReserveAndDpReplicatesAttention) {
  auto tp = CostModel::Create(TinyInputs(ParallelMode::kTp, false));
  auto dp = CostModel::Create(TinyInputs(ParallelMode::kDp, false));
  ASSERT_TRUE(tp && dp);
  const MemoryBudget bt = tp->Budget(), bd = dp->Budget();
  EXPECT_DOUBLE_EQ(bt.hbm_bytes, 3e6);
  EXPECT_DOUBLE_EQ(bt.activation_bytes, 3e5);
  EXPECT_DOUBLE_EQ(bt.device_kv_bytes, 3e6 - bt.weight_bytes - 3e5);
  EXPECT_GT(bd.weight_bytes, bt.weight_bytes);
  EXPECT_DOUBLE_EQ(bt.host_bytes, 4e6);
  EXPECT_FALSE(bt.derivation.empty());
}

TEST(CostModel, UnknownFlopRateIsRefusedWithTheFieldNamed) {
  CostModelInputs in = TinyInputs(ParallelMode::kTp, false);
  in.rates.dense_bf16_flops = 0;  // the profile has 0 too
  auto cm = CostModel::Create(in);
  ASSERT_FALSE(cm);
  EXPECT_NE(cm.error().message().find("dense_bf16_flops"), std::string::npos);
}

}  // namespace
}  // namespace ula
