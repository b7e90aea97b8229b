// Cost model: GLM-5's derived parameter counts match its published size, each roofline term
// and the overlap rule on hand-computed cases, the memory budget derivation, and errors.
#include <gtest/gtest.h>

#include <cmath>

#include "serving/cost_model.h"
#include "config/hardware_config.h"
#include "config/model_config.h"

namespace ula {
namespace {

// The test configs (tests/serving/configs), found beside the clone's configs/ at run time.
const std::filesystem::path kTestConfigs = DefaultConfigDir().parent_path() / "tests" / "serving" / "configs";

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
  w.dense_bytes = 1e9;        // 1 ms at 1e12 B/s
  w.dense_flops = 1e11;       // 0.5 ms at 2e14 FP8 -> memory bound
  w.expert_bytes = 1e8;       // 0.1 ms
  w.expert_flops = 2e11;      // 1 ms -> compute bound
  w.attention_bytes = 3e9;    // 3 ms
  w.attention_flops = 1e11;   // 2 ms at the sparse decode kernel's 5e13 (not 1 ms at BF16 1e14)
  w.indexer_bytes = 0;
  w.indexer_flops = 2e11;     // 1 ms at FP8
  w.transfer_hbm_bytes = 5e8; // 0.5 ms: bytes over the links cross HBM
  w.groups = 1;
  w.layers = 0;
  const StepTime t = cm->Time(w);
  // Dense GEMMs and routed experts are separate rooflines: 1 + 1 ms, not max(1.1, 1.5) ms.
  EXPECT_DOUBLE_EQ(t.dense, 1e-3);
  EXPECT_DOUBLE_EQ(t.experts, 1e-3);
  EXPECT_DOUBLE_EQ(t.weights, 2e-3);
  EXPECT_DOUBLE_EQ(t.attention, 3e-3);
  EXPECT_DOUBLE_EQ(t.indexer, 1e-3);
  EXPECT_DOUBLE_EQ(t.hbm_copies, 0.5e-3);
  EXPECT_DOUBLE_EQ(t.gpu, 6.5e-3);
  EXPECT_DOUBLE_EQ(t.total, 6.5e-3);
  w.attention_bytes = 0;
  EXPECT_DOUBLE_EQ(cm->Time(w).attention, 2e-3);  // the kernel's achieved rate
}

TEST(CostModel, TransfersOverlapOnlyTheLayersOfTheirOwnGroupAndCollectivesDoNot) {
  auto cm = CostModel::Create(TinyInputs(ParallelMode::kTp, false));
  ASSERT_TRUE(cm);
  StepWork w;
  w.attention_bytes = 2e9;     // gpu 2 ms
  w.h2d_bytes = 1.5e7;         // 3 ms at the scattered-row rate 5e9 B/s (not 1.5 ms at the link's 1e10)
  w.d2h_bytes = 2e7;           // 4 ms: the link is full duplex, the larger direction counts
  w.nvlink_fetch_bytes = 1e8;  // 1 ms at 1e11 B/s (half of the bidirectional 2e11)
  w.collective_bytes = 2e8;    // 2 ms
  w.groups = 20;               // the number of groups does not matter: no overlap across groups
  w.layers_per_group = 2;
  w.layers = 7;
  const StepTime t = cm->Time(w);
  EXPECT_DOUBLE_EQ(t.host_link, 4e-3);
  EXPECT_DOUBLE_EQ(t.nvlink_fetch, 1e-3);
  // tx = 4, gpu = 2, L = 2 layers per group: 4/2 + 2/2 + (1/2) * max(2, 4) = 5 ms.
  EXPECT_NEAR(t.gpu + t.transfer_exposed, 5e-3, 1e-12);
  EXPECT_DOUBLE_EQ(t.collectives, 2e-3);
  EXPECT_DOUBLE_EQ(t.overhead, 7e-6);
  EXPECT_NEAR(t.total, 5e-3 + 2e-3 + 7e-6, 1e-12);
  // A transfer shorter than the compute hides except for the first layer's share of it.
  w.d2h_bytes = 0;
  w.h2d_bytes = 5e6;  // 1 ms < gpu 2 ms: exposed 1/L of it
  EXPECT_NEAR(cm->Time(w).transfer_exposed, 0.5e-3, 1e-12);
  // HiSparse's per-layer swap-in: its host fetch is exposed in full, not pipelined.
  w.h2d_critical = true;
  EXPECT_NEAR(cm->Time(w).transfer_exposed, 1e-3 + (1e-3 / 2 + 2e-3 / 2 + 0.5 * 2e-3) - 2e-3, 1e-12);
  w.nvlink_fetch_bytes = 0;
  EXPECT_NEAR(cm->Time(w).transfer_exposed, 1e-3, 1e-12);  // nothing else to pipeline
}

TEST(CostModel, WorkSplitsTransfersByLayerWithinAGroup) {
  auto cm = CostModel::Create(TinyInputs(ParallelMode::kTp, false));
  ASSERT_TRUE(cm);
  StepCounts k = {};
  k.batch_total = k.batch_local = 1;
  EXPECT_EQ(cm->Work(k).layers_per_group, 4u);  // tiny_glm: groups of 4 layers
  k.swap_in_per_layer = true;
  EXPECT_TRUE(cm->Work(k).h2d_critical);
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

TEST(CostModel, AttentionAtHomeReadsOneRankthOfTheBytesWithoutPaddingAndExchangesQueriesAndPartials) {
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
    // tiny_gpu pads to 4 heads per call: TP's 2 heads per GPU are computed as 4, at home the
    // 4 heads need no padding, so at home does half of TP's padded FLOPs.
    EXPECT_DOUBLE_EQ(a.attention_heads_per_call, 4);
    EXPECT_DOUBLE_EQ(b.attention_heads_per_call, 4);
    EXPECT_DOUBLE_EQ(b.attention_flops, a.attention_flops / 2);
    // Everything but attention and the collectives is the same step.
    EXPECT_DOUBLE_EQ(b.dense_bytes, a.dense_bytes);
    EXPECT_DOUBLE_EQ(b.dense_flops, a.dense_flops);
    EXPECT_DOUBLE_EQ(b.expert_bytes, a.expert_bytes);
    EXPECT_DOUBLE_EQ(b.expert_flops, a.expert_flops);
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
    // Bandwidth plus two more calls (query all-gather, partial reduce-scatter) per layer pass.
    EXPECT_DOUBLE_EQ(b.gather_calls - a.gather_calls, 2.0 * b.layers);
    EXPECT_DOUBLE_EQ(tb.collectives - ta.collectives,
                     (gather + partials) / (2e11 / 2) + 2.0 * b.layers * cm->GatherLatency());
    EXPECT_LE(tb.attention, ta.attention);
  }
}

TEST(CostModel, AttentionAtHomeTakesItsShareFromThePlannersCounts) {
  auto cm = CostModel::Create(TinyInputs(ParallelMode::kTp, false));
  ASSERT_TRUE(cm);
  const StepWork a = cm->Work(TpCounts());
  // 30 of the batch's 100 distinct selections are homed here: 0.3 of the reads, all 4 heads
  // over them (ordinary TP: 2 heads over all, padded to the kernel's 4).
  const StepWork b = cm->Work(AtHome(TpCounts(), 30, 100));
  EXPECT_DOUBLE_EQ(b.attention_bytes, 0.3 * a.attention_bytes);
  EXPECT_DOUBLE_EQ(b.attention_flops, 0.3 * a.attention_flops);
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

// TP attention is priced with the query heads of one call padded to the
// kernel's head multiple, at the kernel's achieved rate; at home all heads, no padding.
TEST(CostModel, TpAttentionFlopsUseThePaddedHeadCount) {
  auto cm = CostModel::Create(TinyInputs(ParallelMode::kTp, false));
  ASSERT_TRUE(cm);
  const ModelConfig& m = cm->inputs().model;
  EXPECT_EQ(cm->PaddedHeads(2), 4u);
  EXPECT_EQ(cm->PaddedHeads(4), 4u);
  EXPECT_EQ(cm->PaddedHeads(5), 8u);
  StepCounts k;
  k.batch_total = k.batch_local = 2;
  const StepWork w = cm->Work(k);
  const double reads = 2.0 * m.top_k * m.num_layers;  // 2 requests x top-k x 6 layers
  const double per_entry_head = 2.0 * (16 + 8) + 2.0 * 16;
  EXPECT_DOUBLE_EQ(w.attention_flops, reads * 4 /* 4/2 = 2 heads padded to 4 */ * per_entry_head);
  StepWork only_flops;
  only_flops.attention_flops = w.attention_flops;
  EXPECT_DOUBLE_EQ(cm->Time(only_flops).attention, w.attention_flops / 5e13);
}

// Item 4: every byte over PCIe or NVLink crosses HBM.
// Prefill KV arriving (disaggregated serving): bulk writes at the link's own rate in the
// host -> device direction, sharing it with the step's fetches; only the bytes landing on
// device are written to HBM; overlapped like the other transfers (HiSparse: beside its
// critical-path fetch, not added to it).
TEST(CostModel, ArrivingPrefillKvSharesTheHostLinkAtItsBulkRate) {
  auto cm = CostModel::Create(TinyInputs(ParallelMode::kTp, false));
  ASSERT_TRUE(cm);
  StepCounts k = TpCounts();
  const StepWork before = cm->Work(k);
  k.arriving_host_bytes = 3e7;
  k.arriving_device_bytes = 1e7;
  const StepWork w = cm->Work(k);
  EXPECT_DOUBLE_EQ(w.arriving_bytes, 4e7);
  EXPECT_DOUBLE_EQ(w.transfer_hbm_bytes, before.transfer_hbm_bytes + 1e7);  // device landing only
  StepWork x;
  x.attention_bytes = 2e9;  // gpu 2 ms
  x.h2d_bytes = 5e6;        // 1 ms at the scattered-row rate 5e9 B/s
  x.arriving_bytes = 2e7;   // 2 ms at the link's bulk 1e10 B/s
  x.layers_per_group = 2;
  const StepTime t = cm->Time(x);
  EXPECT_DOUBLE_EQ(t.arriving, 2e-3);
  EXPECT_DOUBLE_EQ(t.host_link, 3e-3);  // the same direction: 1 + 2 ms
  // tx = 3, gpu = 2, L = 2: 3/2 + 2/2 + 1/2 * 3 = 4 ms.
  EXPECT_NEAR(t.gpu + t.transfer_exposed, 4e-3, 1e-12);
  x.h2d_critical = true;  // HiSparse: its 1 ms fetch in full, the 2 ms arriving pipelined
  EXPECT_NEAR(cm->Time(x).transfer_exposed, 1e-3 + (2e-3 / 2 + 2e-3 / 2 + 0.5 * 2e-3) - 2e-3, 1e-12);
  k.arriving_host_bytes = -1;
  auto bad = cm->CheckCounts(k);
  ASSERT_FALSE(bad);
  EXPECT_NE(bad.error().message().find("arriving_host_bytes"), std::string::npos);
}

TEST(CostModel, LinkBytesAreChargedToHbm) {
  auto cm = CostModel::Create(TinyInputs(ParallelMode::kTp, false));
  ASSERT_TRUE(cm);
  StepCounts k = TpCounts();  // h2d 5, d2h 2, nvlink 7 entries
  const StepWork w = cm->Work(k);
  const double token = double(cm->kv_bytes_per_token());
  EXPECT_DOUBLE_EQ(w.transfer_hbm_bytes, (5 + 2) * token + 2 * 7 * token + 2 * w.collective_bytes);
  const StepTime t = cm->Time(w);
  EXPECT_DOUBLE_EQ(t.hbm_copies, w.transfer_hbm_bytes / 1e12);
  EXPECT_DOUBLE_EQ(t.gpu, t.weights + t.attention + t.indexer + t.hbm_copies);
}

// Item 5: every collective call pays NCCL's per-call latency on top of its bandwidth.
TEST(CostModel, CollectivesPayALatencyPerCall) {
  auto tp = CostModel::Create(TinyInputs(ParallelMode::kTp, false));
  auto dp = CostModel::Create(TinyInputs(ParallelMode::kDp, true));
  ASSERT_TRUE(tp && dp);
  // tiny_gpu: base 2 us, 1 us per ring step, P = 2.
  EXPECT_DOUBLE_EQ(tp->AllReduceLatency(), 2e-6 + 2 * 1e-6);
  EXPECT_DOUBLE_EQ(tp->GatherLatency(), 2e-6 + 1e-6);
  StepCounts k = TpCounts();  // striped indexer
  const StepWork w = tp->Work(k);
  EXPECT_DOUBLE_EQ(w.allreduce_calls, 2.0 * 6);  // two per layer pass
  EXPECT_DOUBLE_EQ(w.gather_calls, 2.0);         // candidate gather per main group (2 groups)
  const StepTime t = tp->Time(w);
  EXPECT_DOUBLE_EQ(t.collective_latency, 12 * 4e-6 + 2 * 3e-6);
  EXPECT_DOUBLE_EQ(t.collectives, w.collective_bytes / 1e11 + t.collective_latency);
  // DP: MoE dispatch + combine per MoE layer pass: 5 MoE layers + 2 MTP passes.
  StepCounts d;
  d.batch_total = 4;
  d.batch_local = 2;
  EXPECT_DOUBLE_EQ(dp->Work(d).gather_calls, 2.0 * (5 + 2));
  EXPECT_DOUBLE_EQ(dp->Work(d).allreduce_calls, 0);
}

// Item 6: UlaCache's planner costs kernels per group and time per selection; HiSparse's
// swap-in a kernel per layer; all-GPU nothing.
TEST(CostModel, PlannerAndSwapInKernelsAreCharged) {
  for (bool mtp : {false, true}) {
    SCOPED_TRACE(mtp ? "mtp on" : "mtp off");
    auto cm = CostModel::Create(TinyInputs(ParallelMode::kDp, mtp));
    ASSERT_TRUE(cm);
    const double q = mtp ? 3 : 1, passes = mtp ? 2 : 0;
    StepCounts k;
    k.batch_total = k.batch_local = 3;
    const StepTime none = cm->Time(cm->Work(k));
    EXPECT_DOUBLE_EQ(none.planner, 0);
    k.planner_per_group = true;
    const StepWork u = cm->Work(k);
    EXPECT_DOUBLE_EQ(u.planner_kernels, 2 /* per call */ * (2 + passes));
    EXPECT_DOUBLE_EQ(u.planner_selections, 3.0 * 32 * (q * 2 + passes));
    const StepTime tu = cm->Time(u);
    EXPECT_DOUBLE_EQ(tu.planner, u.planner_kernels * 3e-6 + u.planner_selections * 1e-9);
    EXPECT_DOUBLE_EQ(tu.total - none.total, tu.planner);  // batch 1 pays it too
    k.planner_per_group = false;
    k.swap_in_per_layer = true;
    const StepWork h = cm->Work(k);
    EXPECT_DOUBLE_EQ(h.planner_kernels, 6 + passes);
    EXPECT_DOUBLE_EQ(h.planner_selections, 3.0 * 32 * (q * 6 + passes));
  }
}

// Item 7: under TP the replicated projections are read whole and computed on every token on
// every GPU, and they count in the weights each GPU holds.
TEST(CostModel, TpReplicatedWeightsCountWholeOnEveryGpu) {
  auto cm = CostModel::Create(TinyInputs(ParallelMode::kTp, false));
  ASSERT_TRUE(cm);
  const ModelConfig& m = cm->inputs().model;
  const WeightParams& p = cm->params();
  const double h = 64, P = 2;
  EXPECT_DOUBLE_EQ(p.attention_a_per_layer, h * 32 + h * (16 + 8));
  const double rep = TpReplicatedParams(m, cm->inputs().costs, p, 0);
  EXPECT_DOUBLE_EQ(rep, 6 * p.attention_a_per_layer + 2 * p.indexer_per_group + 5 * p.router_per_layer);
  const double non_routed = 6 * p.attention_per_layer + 2 * p.indexer_per_group + 1 * p.dense_mlp_per_layer +
                            5 * (p.expert + p.router_per_layer);
  StepCounts k;
  k.batch_total = k.batch_local = 3;
  const StepWork w = cm->Work(k);
  EXPECT_DOUBLE_EQ(w.dense_bytes, ((non_routed - rep) * 1 + p.embedding * 2) / P + rep * 1);
  EXPECT_DOUBLE_EQ(w.dense_flops, 2 * ((non_routed - rep + p.embedding) * 3 / P + rep * 3));
  const double routed = 5 * 16 * p.expert;
  EXPECT_DOUBLE_EQ(cm->Budget().weight_bytes, (non_routed - rep + routed + 2 * p.embedding * 2) / P + rep);
}

// GEMMs at their achieved rates: weight reads at gemm_hbm_efficiency of HBM peak (dense
// and routed experts, not the attention or the indexer), the routed experts compute-bound
// at grouped_gemm_flops; the expert term turns compute-bound where its FLOPs pass the
// reads, which more tokens per expert do.
TEST(CostModel, GemmsReadWeightsAtTheirEfficiencyAndExpertsTurnComputeBoundAtTheGroupedRate) {
  CostModelInputs in = TinyInputs(ParallelMode::kDp, false);
  in.rates.gemm_hbm_efficiency = 0.5;
  in.rates.grouped_gemm_flops = 1e14;  // half the tiny FP8 peak
  auto cm = CostModel::Create(in);
  ASSERT_TRUE(cm) << cm.error().ToString();
  StepWork w;
  w.dense_bytes = 1e9;       // 2 ms at 0.5 x 1e12 B/s
  w.expert_bytes = 1e9;      // 2 ms
  w.expert_flops = 1e11;     // 1 ms at 1e14: memory bound
  w.attention_bytes = 1e9;   // 1 ms: the attention kernel keeps HBM peak
  w.indexer_bytes = 1e9;     // 1 ms
  w.groups = 1;
  const StepTime t = cm->Time(w);
  EXPECT_DOUBLE_EQ(t.dense, 2e-3);
  EXPECT_DOUBLE_EQ(t.experts, 2e-3);
  EXPECT_DOUBLE_EQ(t.attention, 1e-3);
  EXPECT_DOUBLE_EQ(t.indexer, 1e-3);
  w.expert_flops = 3e11;     // 3 ms at the grouped rate (1.5 ms at the FP8 peak): compute bound
  EXPECT_DOUBLE_EQ(cm->Time(w).experts, 3e-3);
  // 0 = the FP8 peak.
  in.rates.grouped_gemm_flops = 0;
  auto peak = CostModel::Create(in);
  ASSERT_TRUE(peak);
  EXPECT_DOUBLE_EQ(peak->Time(w).experts, 2e-3);
  // Bad values are refused with the field named.
  in.rates.gemm_hbm_efficiency = 0;
  auto bad = CostModel::Create(in);
  ASSERT_FALSE(bad);
  EXPECT_NE(bad.error().message().find("gemm_hbm_efficiency"), std::string::npos);
}

// The indexer scores every key of the context for every query, and each query's logits are
// written and read back by the top-k: O(context) per query, not O(top-k).
TEST(CostModel, IndexerScoresTheWholeContextPerQueryAndRoundTripsItsLogits) {
  CostModelInputs in = TinyInputs(ParallelMode::kDp, true);  // 3 queries, 2 MTP passes
  in.indexer_logit_bytes = 4;
  auto cm = CostModel::Create(in);
  ASSERT_TRUE(cm);
  const ModelConfig& m = cm->inputs().model;  // 2 main groups + 1 MTP group
  StepCounts k;
  k.batch_total = k.batch_local = 2;
  k.history_scored = 1000;
  const StepWork w = cm->Work(k);
  const double scorings = 1000.0 * (2 * 3 + 2);  // keys x (main groups x queries + MTP passes)
  EXPECT_DOUBLE_EQ(w.indexer_bytes, 1000.0 * (2 + 2) * 64 + 2 * 4 * scorings);
  EXPECT_DOUBLE_EQ(w.indexer_flops, scorings * 2 * m.index_heads * m.index_head_dim);
  // Twice the context, twice the indexer; the top-k does not bound it.
  k.history_scored = 2000;
  EXPECT_DOUBLE_EQ(cm->Work(k).indexer_bytes, 2 * w.indexer_bytes);
}

}  // namespace
}  // namespace ula
