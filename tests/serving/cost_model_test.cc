// Cost model: GLM-5's derived parameter counts match its published size, each roofline term
// and the overlap rule on hand-computed cases, the memory budget derivation, and errors.
#include <gtest/gtest.h>

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
