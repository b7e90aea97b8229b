// The systems engines run today: decode context parallel as vLLM and SGLang run
// it, Helix, vLLM's HiSparse port, and the seed's budget rule for SGLang HiSparse. Their
// admission arithmetic on hand-sized budgets, fill, the collectives each engine issues, the
// adapters' step counts, and the systems in a small end-to-end comparison.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <map>
#include <vector>

#include "config/hardware_config.h"
#include "config/model_config.h"
#include "serving/availability.h"
#include "serving/baselines.h"
#include "serving/cost_model.h"
#include "serving/engine_limits.h"
#include "serving/serving_sim.h"
#include "serving/serving_systems.h"

namespace ula {
namespace {

// The test configs (tests/serving/configs), found beside the clone's configs/ at run time.
const std::filesystem::path kTestConfigs = DefaultConfigDir().parent_path() / "tests" / "serving" / "configs";

// kv 100 B/token, index 10 B/token, device 10000 B, host 20000 B per rank, 4 ranks.
PlacementRules Rules(SystemKind s, ParallelMode m = ParallelMode::kTp, std::uint32_t ranks = 4) {
  PlacementRules r;
  r.system = s;
  r.mode = m;
  r.num_ranks = ranks;
  r.device_bytes_per_rank = 10000;
  r.host_bytes_per_rank = 20000;
  r.kv_bytes_per_token = 100;
  r.index_bytes_per_token = 10;
  r.hisparse_buffer_entries = 16;
  r.helix_tokens_per_block = 8;
  r.tail_entries = 4;
  return r;
}

TEST(Engines, DcpStripesKvAndIndexKeysSglangReplicatesTheKeys) {
  // 100 tokens over 4 ranks: 25 per rank.
  const RankDemand vllm = DemandOf(Rules(SystemKind::kDcp), 100);
  EXPECT_DOUBLE_EQ(vllm.device, 25 * (100 + 10));
  EXPECT_DOUBLE_EQ(vllm.host + vllm.either, 0);
  const RankDemand sglang = DemandOf(Rules(SystemKind::kDcpSglang), 100);
  EXPECT_DOUBLE_EQ(sglang.device, 25 * 100 + 100 * 10);  // every rank holds every index key
  EXPECT_DOUBLE_EQ(sglang.host + sglang.either, 0);
  // 101 tokens: the busiest rank holds 26.
  EXPECT_DOUBLE_EQ(DemandOf(Rules(SystemKind::kDcp), 101).device, 26 * 110);
  // Admission: 10000 / 2750 -> 3 requests of 100 tokens (all-GPU TP: 10000 / 11000 -> 0).
  const std::vector<std::uint32_t> t(10, 100);
  EXPECT_EQ(MaxAdmitted(Rules(SystemKind::kDcp), t), 3u);
  EXPECT_EQ(MaxAdmitted(Rules(SystemKind::kDcpSglang), t), 2u);  // 3500 each
  EXPECT_EQ(MaxAdmitted(Rules(SystemKind::kAllGpu), t), 0u);
}

TEST(Engines, HelixHoldsWholeBlocksDealtRoundRobin) {
  // Blocks of 8 tokens over 4 ranks: 100 tokens = 13 blocks, the busiest rank holds 4 of them.
  EXPECT_DOUBLE_EQ(HelixRankTokens(100, 8, 4), 32);
  EXPECT_DOUBLE_EQ(HelixRankTokens(64, 8, 4), 16);  // 8 blocks, 2 each
  EXPECT_DOUBLE_EQ(HelixRankTokens(5, 8, 4), 5);    // one partial block: its tokens
  EXPECT_DOUBLE_EQ(DemandOf(Rules(SystemKind::kHelix), 100).device, 32 * 110);
  // Coarser blocks cost room: with 1-token blocks it is DCP's demand.
  PlacementRules fine = Rules(SystemKind::kHelix);
  fine.helix_tokens_per_block = 1;
  EXPECT_DOUBLE_EQ(DemandOf(fine, 101).device, DemandOf(Rules(SystemKind::kDcp), 101).device);
}

TEST(Engines, VllmHiSparseSharesOneHostPoolAcrossTheTpRanks) {
  const RankDemand tp = DemandOf(Rules(SystemKind::kVllmHiSparse), 400);
  EXPECT_DOUBLE_EQ(tp.device, 400 * 10 + (16 + 4) * 100);  // index keys + hot buffer + tail
  EXPECT_DOUBLE_EQ(tp.host, 400 * 100 / 4.0);               // one copy for the node
  const RankDemand dp = DemandOf(Rules(SystemKind::kVllmHiSparse, ParallelMode::kDp), 400);
  EXPECT_DOUBLE_EQ(dp.host, 400 * 100);
  // 400-token histories (40000 B of KV): over one GPU's host budget, so SGLang HiSparse (a
  // host copy per GPU) admits none in TP; vLLM's shared pool holds 2 (80000 B of 4 x 20000).
  const std::vector<std::uint32_t> t(10, 400);
  EXPECT_EQ(MaxAdmitted(Rules(SystemKind::kHiSparse), t), 0u);
  EXPECT_EQ(MaxAdmitted(Rules(SystemKind::kVllmHiSparse), t), 1u);  // device: 6000 B each
  PlacementRules room = Rules(SystemKind::kVllmHiSparse);
  room.device_bytes_per_rank = 20000;
  EXPECT_EQ(MaxAdmitted(room, t), 2u);
}

// vLLM's HiSparseResidentManager.get_num_blocks_to_allocate with apply_admission_cap: a new
// request needs its resident pages up to the in-flight window free when it is admitted;
// once written they move to host, so only the tail (and the hot buffer) stays reserved.
TEST(Engines, VllmHiSparseAdmissionCountsTheResidentWindowWithoutReservingIt) {
  PlacementRules r = Rules(SystemKind::kVllmHiSparse, ParallelMode::kDp, 1);
  r.host_bytes_per_rank = 1e9;
  r.admission_window_entries = 24;  // 20 tokens beyond the 4-token tail
  const RankDemand d = DemandOf(r, 100);
  EXPECT_DOUBLE_EQ(d.device, 100 * 10 + (16 + 4) * 100);  // 3000 B reserved
  EXPECT_DOUBLE_EQ(d.device_transient, 20 * 100);         // 2000 B needed only to admit
  EXPECT_DOUBLE_EQ(DemandOf(r, 10).device_transient, (10 - 4) * 100);  // a short request: its pages
  // 10000 B: the third request finds 4000 B free, less than its 3000 + 2000 B: two admitted
  // (without the window, 10000 / 3000 -> 3).
  auto ledger = AdmissionLedger::Create(r);
  ASSERT_TRUE(ledger.has_value());
  EXPECT_TRUE(ledger->TryAdmit(100).has_value());
  EXPECT_DOUBLE_EQ(ledger->device_only(0), 3000);  // the window is not reserved
  EXPECT_TRUE(ledger->TryAdmit(100).has_value());
  EXPECT_FALSE(ledger->TryAdmit(100).has_value());
  EXPECT_DOUBLE_EQ(ledger->device_only(0), 6000);  // the refusal changed nothing
  const std::vector<std::uint32_t> t(10, 100);
  EXPECT_EQ(MaxAdmitted(r, t), 2u);
  r.admission_window_entries = 0;  // the tail only
  EXPECT_EQ(MaxAdmitted(r, t), 3u);
}

// TensorRT-LLM's sparse KV offload (SparseKvCacheOffloadConfig): HiSparse's placement with
// its own per-request GPU cache, gpu_cache_factor x one step's selections + 1, in pages.
TEST(Engines, TrtllmOffloadKeepsItsGpuCacheOnDeviceAndTheHistoryOnHost) {
  PlacementRules r = Rules(SystemKind::kTrtllmOffload);
  r.hisparse_buffer_entries = 24;
  const RankDemand d = DemandOf(r, 400);
  EXPECT_DOUBLE_EQ(d.device, 24 * 100 + 400 * 10);
  EXPECT_DOUBLE_EQ(d.host, 400 * 100);  // per rank, every TP rank its own copy
  EXPECT_TRUE(SystemRunsIn(SystemKind::kTrtllmOffload, ParallelMode::kDp));
  EXPECT_TRUE(HasHostTier(SystemKind::kTrtllmOffload));
  r.hisparse_buffer_entries = 0;
  ASSERT_FALSE(r.Validate());
  EXPECT_NE(r.Validate().error().message().find("hisparse_buffer_entries"), std::string::npos);
  // In the comparison: its cache is ceil((2 x q x top-k + 1) / page) pages (tiny: top-k,
  // pages of 4 tokens), and fetched misses move bytes over the host link.
  CompareOptions o;
  o.config_dir = kTestConfigs;
  auto sc = LoadScenarioConfig(kTestConfigs / "scenarios" / "tiny.json", kTestConfigs);
  ASSERT_TRUE(sc) << sc.error().ToString();
  auto res = RunComparison(*sc, o);
  ASSERT_TRUE(res) << res.error().ToString();
  for (const ConfigResult& c : res->configs) {
    const SystemResult* t = c.Find(SystemKind::kTrtllmOffload);
    const SystemResult* h = c.Find(SystemKind::kHiSparse);
    ASSERT_NE(t, nullptr);
    EXPECT_GT(t->admitted, 0u);
    EXPECT_TRUE(t->ships) << t->why_not;
    EXPECT_GT(t->hit_b1, 0);
    EXPECT_LE(t->hit_b1, 1);
    // The same placement as SGLang's HiSparse but for the cache size and the host budget
    // (HiSparse's pool follows its ratio): both admit some.
    EXPECT_GT(h->admitted, 0u);
  }
  // A smaller cache factor leaves device room for more requests somewhere, never fewer; a
  // larger one fewer.
  ScenarioConfig small = *sc, large = *sc;
  small.trtllm_offload_gpu_cache_factor = 1.0;
  large.trtllm_offload_gpu_cache_factor = 8.0;
  auto rs = RunComparison(small, o), rl = RunComparison(large, o);
  ASSERT_TRUE(rs && rl);
  bool more = false, fewer = false;
  for (std::size_t i = 0; i < res->configs.size(); ++i) {
    const std::uint32_t base = res->configs[i].Find(SystemKind::kTrtllmOffload)->admitted;
    const std::uint32_t s = rs->configs[i].Find(SystemKind::kTrtllmOffload)->admitted;
    const std::uint32_t l = rl->configs[i].Find(SystemKind::kTrtllmOffload)->admitted;
    EXPECT_GE(s, base);
    EXPECT_LE(l, base);
    more = more || s > base;
    fewer = fewer || l < base;
  }
  EXPECT_TRUE(more);
  EXPECT_TRUE(fewer);
}

TEST(Engines, ContextParallelSystemsAreTpOnlyAndRefuseBadRules) {
  for (SystemKind s : {SystemKind::kDcp, SystemKind::kDcpSglang, SystemKind::kHelix}) {
    SCOPED_TRACE(SystemName(s));
    EXPECT_TRUE(SystemRunsIn(s, ParallelMode::kTp));
    EXPECT_FALSE(SystemRunsIn(s, ParallelMode::kDp));
    auto refused = Rules(s, ParallelMode::kDp).Validate();
    ASSERT_FALSE(refused);
    EXPECT_NE(refused.error().message().find("'mode'"), std::string::npos);
    EXPECT_TRUE(Rules(s).Validate());
  }
  EXPECT_TRUE(SystemRunsIn(SystemKind::kVllmHiSparse, ParallelMode::kDp));
  PlacementRules helix = Rules(SystemKind::kHelix);
  helix.helix_tokens_per_block = 0;
  ASSERT_FALSE(helix.Validate());
  EXPECT_NE(helix.Validate().error().message().find("helix_tokens_per_block"), std::string::npos);
  PlacementRules vllm = Rules(SystemKind::kVllmHiSparse);
  vllm.hisparse_buffer_entries = 0;
  EXPECT_FALSE(vllm.Validate());
  EXPECT_FALSE(AdmissionLedger::Create(vllm));
}

TEST(Engines, HiSparseRatioMatchedToTheHostBudgetFillsIt) {
  PlacementRules r = Rules(SystemKind::kHiSparse);
  // device 10000, host 20000, kv 100, ix 10: ratio = 20000 x 100 / (10000 x 100 - 20000 x 10) = 2.5.
  const double ratio = HiSparseMatchedRatio(r);
  EXPECT_DOUBLE_EQ(ratio, 2.5);
  EXPECT_NEAR(HiSparseHostPoolBytes(r, ratio), r.host_bytes_per_rank, 1e-6);
  // SGLang's default 2 gives it less: 2 x 10000 x 100 / (100 + 20) = 16667 B.
  EXPECT_NEAR(HiSparseHostPoolBytes(r, 2), 2 * 10000.0 * 100 / 120, 1e-6);
  // A host budget no ratio reaches: +inf, and the pool is its limit device x kv / ix.
  r.host_bytes_per_rank = 200000;
  EXPECT_TRUE(std::isinf(HiSparseMatchedRatio(r)));
  EXPECT_DOUBLE_EQ(HiSparseHostPoolBytes(r, HiSparseMatchedRatio(r)), 10000.0 * 100 / 10);
}

TEST(Engines, FillIsStoredBytesOverTheMemoryTheSystemMayUse) {
  const PlacementRules r = Rules(SystemKind::kDcp);
  // 300 tokens x 110 B over 4 x 10000 B.
  EXPECT_DOUBLE_EQ(FillOf(r, 300, 0), 300 * 110 / 40000.0);
  // With a host tier the host budget counts too.
  EXPECT_DOUBLE_EQ(FillOf(r, 300, 20000), 300 * 110 / 120000.0);
  PlacementRules none = r;
  none.device_bytes_per_rank = 0;
  EXPECT_DOUBLE_EQ(FillOf(none, 300, 0), 0);
}

CostModelInputs TinyInputs(bool mtp) {
  CostModelInputs in;
  in.model = *LoadModelConfigByName("tiny_glm", kTestConfigs);
  in.costs = *LoadModelCostConfigByName("tiny_glm", kTestConfigs);
  in.hardware = *LoadHardwareConfigByName("tiny_gpu", kTestConfigs);
  in.rates = *LoadComputeRatesByName("tiny_gpu", kTestConfigs);
  in.mode = ParallelMode::kTp;
  in.mtp = mtp;
  in.num_ranks = 2;
  in.draft_tokens = 2;
  return in;
}

StepCounts Home(HomeExchange e) {
  StepCounts k;
  k.batch_total = k.batch_local = 3;
  k.history_scored = 1000;
  k.attention_at_home = true;
  k.home_entries = 50;
  k.distinct_entries = 100;
  k.home_exchange = e;
  return k;
}

TEST(Engines, DcpAndHelixIssueTheirEnginesCollectives) {
  for (bool mtp : {false, true}) {
    SCOPED_TRACE(mtp ? "mtp on" : "mtp off");
    auto cm = CostModel::Create(TinyInputs(mtp));  // P = 2; 4 heads, kv_lora 16, rope 8, 6 layers (+1 MTP)
    ASSERT_TRUE(cm) << cm.error().ToString();
    const double heads = 4, passes = mtp ? 3.0 * 3 * 6 + 3.0 * 2 : 3.0 * 6;
    const StepWork ula = cm->Work(Home(HomeExchange::kUlaCache));
    const StepWork dcp = cm->Work(Home(HomeExchange::kDcp));
    const StepWork helix = cm->Work(Home(HomeExchange::kHelix));
    // DCP: the queries all-gathered in bf16 (as UlaCache's), then cp_lse_ag_out_rs: every GPU
    // receives the other rank's LSE of all heads (fp32) and reduce-scatters its bf16 outputs.
    EXPECT_DOUBLE_EQ(dcp.query_gather_bytes, ula.query_gather_bytes);
    EXPECT_DOUBLE_EQ(dcp.query_gather_bytes, 0.5 * heads * (16 + 8) * 2 * passes);
    EXPECT_DOUBLE_EQ(dcp.partial_exchange_bytes, (1 * heads * 4 + 0.5 * heads * 16 * 2) * passes);
    EXPECT_DOUBLE_EQ(dcp.gather_calls - ula.gather_calls, 1.0 * dcp.layers);  // three calls, not two
    // Helix: no query gather (each GPU projects every head), one all-to-all of bf16 outputs + LSE.
    EXPECT_DOUBLE_EQ(helix.query_gather_bytes, 0);
    EXPECT_DOUBLE_EQ(helix.partial_exchange_bytes, 0.5 * heads * (16 * 2 + 4) * passes);
    EXPECT_DOUBLE_EQ(ula.gather_calls - helix.gather_calls, 1.0 * helix.layers);
    // SGLang's DCP: the same query gather, then outputs + LSE in one packed all-to-all.
    const StepWork packed = cm->Work(Home(HomeExchange::kDcpPacked));
    EXPECT_DOUBLE_EQ(packed.query_gather_bytes, dcp.query_gather_bytes);
    EXPECT_DOUBLE_EQ(packed.partial_exchange_bytes, helix.partial_exchange_bytes);
    EXPECT_DOUBLE_EQ(packed.gather_calls, ula.gather_calls);  // two calls per layer pass
    // The hidden-state all-reduces of TP stay in all three.
    EXPECT_DOUBLE_EQ(dcp.allreduce_calls, 2.0 * dcp.layers);
    EXPECT_DOUBLE_EQ(helix.allreduce_calls, dcp.allreduce_calls);
    EXPECT_DOUBLE_EQ(dcp.collective_bytes - dcp.query_gather_bytes - dcp.partial_exchange_bytes,
                     helix.collective_bytes - helix.partial_exchange_bytes);
  }
}

TEST(Engines, HelixRedundantQkvReadsAndComputesTheQueryProjectionsWhole) {
  auto cm = CostModel::Create(TinyInputs(false));
  ASSERT_TRUE(cm);
  const ModelConfig& m = cm->inputs().model;
  StepCounts plain = Home(HomeExchange::kHelix);
  StepCounts redundant = plain;
  redundant.redundant_qkv = true;
  const StepWork a = cm->Work(plain), b = cm->Work(redundant);
  // q_b (32 x 4 x (16 + 8)) and W_UK (16 x 4 x 16) per layer: whole on both GPUs instead of half.
  const double qkv = 32.0 * 4 * (16 + 8) + 16.0 * 4 * 16;
  EXPECT_DOUBLE_EQ(cm->RedundantQkvParamsPerLayer(), qkv);
  EXPECT_NEAR(b.dense_bytes - a.dense_bytes, m.num_layers * qkv * (1 - 0.5), 1e-6);
  // FLOPs: every token of the batch through them on every GPU.
  EXPECT_NEAR(b.dense_flops - a.dense_flops, 2 * m.num_layers * qkv * 3 * (1 - 0.5), 1e-6);
  // And the weights they add to each GPU's budget: (P - 1) / P of them over the layers in use.
  EXPECT_DOUBLE_EQ(cm->RedundantQkvExtraWeightBytes(), 0.5 * m.num_layers * qkv * 1);
}

// The adapters on hand-made selections.
serving_internal::SimSystemConfig SimConfig(SystemKind s) {
  serving_internal::SimSystemConfig cfg;
  cfg.rules = Rules(s);
  cfg.rules.device_bytes_per_rank = 1e9;
  cfg.rules.host_bytes_per_rank = 1e9;
  cfg.group_entry_bytes = 100;
  cfg.resident_device_bytes = cfg.rules.device_bytes_per_rank;
  return cfg;
}

TEST(Engines, HelixCountsTheBusiestRankDcpRankZero) {
  // Positions 0..7 are one Helix block (8 tokens) on rank 0; 8..15 the next, on rank 1.
  const std::vector<std::uint32_t> sel = {1, 8, 9, 13, 17};
  const std::uint64_t ids[] = {1};
  const std::vector<std::vector<std::uint32_t>> sels = {sel};
  for (SystemKind s : {SystemKind::kDcp, SystemKind::kHelix}) {
    SCOPED_TRACE(SystemName(s));
    auto sys = serving_internal::MakeSimSystem(SimConfig(s));
    ASSERT_TRUE(sys) << sys.error().ToString();
    ASSERT_TRUE(*(*sys)->Admit(1, 20, 40));
    serving_internal::SimCounters c;
    ASSERT_TRUE((*sys)->Step(ids, sels, c));
    EXPECT_TRUE((*sys)->attention_at_home());
    EXPECT_DOUBLE_EQ(c.batch_distinct, 5);
    EXPECT_DOUBLE_EQ(c.h2d + c.d2h + c.nvlink, 0);
    // dcp: g mod 4 == 0 -> {8} on rank 0; helix: {1} on rank 0, {8,9,13} on rank 1 (the
    // busiest, which sets the step), {17} on rank 2.
    EXPECT_DOUBLE_EQ(c.home, s == SystemKind::kDcp ? 1 : 3);
    EXPECT_DOUBLE_EQ(c.hits, c.home);
  }
  auto sglang = serving_internal::MakeSimSystem(SimConfig(SystemKind::kDcpSglang));
  ASSERT_TRUE(sglang);
  EXPECT_FALSE((*sglang)->striped_indexer());  // SGLang scores every key on every rank
}

TEST(Engines, VllmHiSparseReadsResidentPagesAndFetchesTheRestThroughItsHotBuffer) {
  std::vector<std::uint32_t> sel;
  for (std::uint32_t p = 0; p < 400; p += 40) sel.push_back(p);  // 10 positions, one page each (64)
  sel.push_back(950);  // in the tail of 64 (history 1000), not among the 16 newest the hot buffer starts with
  const std::uint64_t ids[] = {7};
  const std::vector<std::vector<std::uint32_t>> sels = {sel};
  // Room for everything: every selection is resident, nothing crosses the host link.
  {
    auto sys = serving_internal::MakeSimSystem(SimConfig(SystemKind::kVllmHiSparse));
    ASSERT_TRUE(sys);
    ASSERT_TRUE(*(*sys)->Admit(7, 1000, 1200));
    serving_internal::SimCounters c;
    ASSERT_TRUE((*sys)->Step(ids, sels, c));
    EXPECT_DOUBLE_EQ(c.distinct, 11);
    EXPECT_DOUBLE_EQ(c.hits, 11);
    EXPECT_DOUBLE_EQ(c.h2d, 0);
    ASSERT_TRUE((*sys)->Append(7, 1000, 2, c));
    EXPECT_DOUBLE_EQ(c.d2h, 2);  // every decode-written row is mirrored to host
  }
  // No room beside the ledger's reservations: only the tail is resident, the other 10 miss
  // the hot buffer once and are fetched from host; the next step hits them there.
  {
    serving_internal::SimSystemConfig cfg = SimConfig(SystemKind::kVllmHiSparse);
    cfg.resident_device_bytes = 0;
    cfg.rules.tail_entries = 64;
    auto sys = serving_internal::MakeSimSystem(cfg);
    ASSERT_TRUE(sys);
    ASSERT_TRUE(*(*sys)->Admit(7, 1000, 1200));
    serving_internal::SimCounters c;
    ASSERT_TRUE((*sys)->Step(ids, sels, c));
    EXPECT_DOUBLE_EQ(c.distinct, 11);
    EXPECT_DOUBLE_EQ(c.hits, 1);
    EXPECT_DOUBLE_EQ(c.h2d, 10);
    serving_internal::SimCounters again;
    ASSERT_TRUE((*sys)->Step(ids, sels, again));
    EXPECT_DOUBLE_EQ(again.hits, 11);
    EXPECT_DOUBLE_EQ(again.h2d, 0);
  }
}

ScenarioConfig Tiny() {
  auto sc = LoadScenarioConfig(kTestConfigs / "scenarios" / "tiny.json", kTestConfigs);
  EXPECT_TRUE(sc) << sc.error().ToString();
  return *sc;
}

TEST(Engines, TheComparisonRunsEveryEngineOnTheSameTracesAndBudgets) {
  CompareOptions o;
  o.config_dir = kTestConfigs;
  auto r = RunComparison(Tiny(), o);
  ASSERT_TRUE(r) << r.error().ToString();
  std::map<bool, double> tp_all_gpu;  // by mtp: all_gpu's arriving GB per request per step in TP
  for (const ConfigResult& c : r->configs) {
    SCOPED_TRACE(fmt::format("{} {}", ParallelModeName(c.entry.mode), c.entry.mtp));
    const bool tp = c.entry.mode == ParallelMode::kTp;
    for (SystemKind k : kAllSystems) EXPECT_EQ(c.Find(k) != nullptr, SystemRunsIn(k, c.entry.mode)) << SystemName(k);
    for (const SystemResult& s : c.systems) {
      SCOPED_TRACE(SystemName(s.system));
      EXPECT_GT(s.admitted, 0u);
      EXPECT_GT(s.fill, 0);
      EXPECT_LE(s.fill, 1.0 + 1e-9);
      EXPECT_GT(s.hit_b1, 0);
      if (IsContextParallel(s.system) || s.system == SystemKind::kAllGpu) {
        EXPECT_DOUBLE_EQ(s.hit_b1, 1);
      }
    }
    if (tp) {
      // DCP stripes what all-GPU copies: it admits more; SGLang's replicated keys admit no more than vLLM's.
      EXPECT_GT(c.Find(SystemKind::kDcp)->admitted, c.Find(SystemKind::kAllGpu)->admitted);
      EXPECT_LE(c.Find(SystemKind::kDcpSglang)->admitted, c.Find(SystemKind::kDcp)->admitted);
      // ulacache_home is DCP's placement plus a host tier: at least as many.
      EXPECT_GE(c.Find(SystemKind::kUlaCacheAtHome)->admitted, c.Find(SystemKind::kDcp)->admitted);
    }
    // The test availability file ships Helix on b300 only and dcp_sglang for no DSA model:
    // both hypothetical on tiny_gpu, out of the ranking; the rest ship; UlaCache is proposed.
    for (const SystemResult& s : c.systems) {
      const bool hyp = s.system == SystemKind::kHelix || s.system == SystemKind::kDcpSglang;
      EXPECT_EQ(s.ships, !hyp) << SystemName(s.system) << ": " << s.why_not;
      EXPECT_EQ(s.proposed, IsUlaCache(s.system)) << SystemName(s.system);
    }
    // Prefill KV arriving: every system receives it; per request a replicated TP copy
    // (all_gpu) gets P = 2 times what a striped one (dcp) gets.
    auto per_request = [&](SystemKind k) {
      const SystemResult& s = *c.Find(k);
      const CurvePoint& p = s.curve.back();
      return p.arriving_gb / p.mean_batch;
    };
    for (const SystemResult& s : c.systems) EXPECT_GT(s.curve.back().arriving_gb, 0) << SystemName(s.system);
    if (tp) {
      EXPECT_GT(per_request(SystemKind::kAllGpu), 1.5 * per_request(SystemKind::kDcp));
    }
    // DP: a request's KV lands on the one GPU it is routed to, 1 / P of TP's per GPU.
    if (tp) {
      tp_all_gpu[c.entry.mtp] = per_request(SystemKind::kAllGpu);
    } else if (tp_all_gpu.contains(c.entry.mtp)) {
      EXPECT_NEAR(per_request(SystemKind::kAllGpu), tp_all_gpu[c.entry.mtp] / 2, 1e-9 * tp_all_gpu[c.entry.mtp]);
    }
    const SystemResult* best = c.BestShippingEngine();
    ASSERT_NE(best, nullptr);
    for (const SystemResult& s : c.systems) {
      if (!s.proposed && s.ships) {
        EXPECT_GE(best->peak_tput, s.peak_tput) << SystemName(s.system);
      }
    }
    EXPECT_TRUE(best->ships && !best->proposed);
  }
}

TEST(Engines, TheRankingLeavesHypotheticalAndProposedSystemsOut) {
  ConfigResult c;
  auto add = [&](SystemKind k, double peak, bool ships, bool proposed) {
    SystemResult s;
    s.system = k;
    s.peak_tput = peak;
    s.ships = ships;
    s.proposed = proposed;
    c.systems.push_back(s);
  };
  add(SystemKind::kAllGpu, 100, true, false);
  add(SystemKind::kUlaCache, 900, true, true);  // proposed: never the best engine
  add(SystemKind::kHelix, 500, false, false);   // hypothetical: out of the ranking
  add(SystemKind::kDcp, 300, true, false);
  ASSERT_NE(c.BestShippingEngine(), nullptr);
  EXPECT_EQ(c.BestShippingEngine()->system, SystemKind::kDcp);
  c.systems[3].ships = false;
  EXPECT_EQ(c.BestShippingEngine()->system, SystemKind::kAllGpu);
  c.systems[0].ships = false;
  EXPECT_EQ(c.BestShippingEngine(), nullptr);
}

TEST(Engines, AvailabilitySaysWhyASystemDoesNotShip) {
  auto a = LoadAvailabilityConfig(DefaultConfigDir());
  ASSERT_TRUE(a) << a.error().ToString();
  const SystemAvailability* helix = a->Find("helix");
  ASSERT_NE(helix, nullptr);
  // TensorRT-LLM ships Helix for MLA models on Blackwell only.
  const std::string h200 = WhyNotShipped(*helix, {"h200", ParallelMode::kTp, false});
  EXPECT_NE(h200.find("hardware b300 only"), std::string::npos) << h200;
  EXPECT_NE(h200.find("not for DSA models"), std::string::npos) << h200;
  EXPECT_EQ(WhyNotShipped(*helix, {"b300", ParallelMode::kTp, false}), "not for DSA models");
  const SystemAvailability* dcp = a->Find("dcp");
  ASSERT_NE(dcp, nullptr);
  EXPECT_EQ(WhyNotShipped(*dcp, {"b300", ParallelMode::kTp, true}), "");
  EXPECT_EQ(WhyNotShipped(*dcp, {"b300", ParallelMode::kDp, false}), "not in dp mode");
  EXPECT_EQ(WhyNotShipped(*a->Find("ulacache"), {"nowhere", ParallelMode::kDp, true}), "");  // proposed
  // Bad files name the field and give nothing.
  const char* missing_source = R"({"name": "x", "systems": {"dcp": {"engine": "vLLM", "proposed": false,
      "hardware": ["b300"], "modes": ["tp"], "dsa": true, "mtp": true}}})";
  auto bad = ParseAvailabilityConfig(missing_source, "t");
  ASSERT_FALSE(bad);
  EXPECT_NE(bad.error().message().find("systems.dcp.source"), std::string::npos) << bad.error().message();
  const char* bad_mode = R"({"name": "x", "systems": {"dcp": {"engine": "vLLM", "proposed": false,
      "hardware": ["b300"], "modes": ["pp"], "dsa": true, "mtp": true, "source": "s"}}})";
  ASSERT_FALSE(ParseAvailabilityConfig(bad_mode, "t"));
  const char* unknown = R"({"name": "x", "systems": {"dcp": {"engine": "vLLM", "proposed": false, "gpus": 8,
      "hardware": ["b300"], "modes": ["tp"], "dsa": true, "mtp": true, "source": "s"}}})";
  auto u = ParseAvailabilityConfig(unknown, "t");
  ASSERT_FALSE(u);
  EXPECT_NE(u.error().message().find("systems.dcp.gpus"), std::string::npos);
  // The file must name every system and nothing else.
  EXPECT_TRUE(CheckEverySystemListed(*a));
  AvailabilityConfig less = *a;
  less.systems.pop_back();
  auto miss = CheckEverySystemListed(less);
  ASSERT_FALSE(miss);
  EXPECT_NE(miss.error().message().find("no entry for system"), std::string::npos);
  AvailabilityConfig more = *a;
  more.systems.push_back(more.systems.front());
  more.systems.back().system = "sglang_hicache";
  auto extra = CheckEverySystemListed(more);
  ASSERT_FALSE(extra);
  EXPECT_NE(extra.error().message().find("systems.sglang_hicache"), std::string::npos);
}

// Each engine's CUDA-graph limit in its own unit (engine_limits.h): vLLM counts tokens,
// requests x (1 + drafts) <= capture, SGLang (and UlaCache, TensorRT-LLM) requests.
TEST(Engines, CudaGraphLimitsAtTheirBoundaries) {
  // vLLM, 512 tokens (SM90): 170 requests of 3 tokens fit (510), 171 do not (513).
  EXPECT_EQ(CudaGraphRequestsPerInstance("vLLM", 512, 512, 3), 170u);
  EXPECT_LE(170u * 3, 512u);
  EXPECT_GT(171u * 3, 512u);
  EXPECT_EQ(CudaGraphRequestsPerInstance("vLLM", 512, 512, 1), 512u);
  // Compute capability family 100 (B300): 1024 tokens, 341 requests of 3.
  EXPECT_EQ(CudaGraphRequestsPerInstance("vLLM", 512, 1024, 3), 341u);
  EXPECT_EQ(CudaGraphRequestsPerInstance("vLLM", 512, 0, 3), 0u);  // no limit
  // SGLang counts requests, drafts or not; so do the engines that are not vLLM.
  for (const char* engine : {"SGLang", "this library", "TensorRT-LLM", "SGLang / vLLM"}) {
    SCOPED_TRACE(engine);
    EXPECT_EQ(CudaGraphRequestsPerInstance(engine, 512, 512, 3), 512u);
    EXPECT_EQ(CudaGraphRequestsPerInstance(engine, 512, 512, 1), 512u);
  }
  // The shipped per-GPU ceilings.
  auto h200 = LoadComputeRatesByName("h200", DefaultConfigDir());
  auto b300 = LoadComputeRatesByName("b300", DefaultConfigDir());
  ASSERT_TRUE(h200 && b300);
  EXPECT_EQ(h200->vllm_max_cudagraph_capture_size, 512u);
  EXPECT_EQ(b300->vllm_max_cudagraph_capture_size, 1024u);
}

// vLLM HiSparse's admission window: VllmConfig.max_in_flight_tokens = max_concurrent_batches
// x max_num_batched_tokens; the default scenario runs async scheduling (2 batches) x 8192.
TEST(Engines, VllmHiSparseAdmissionWindowIsTheInFlightTokens) {
  ScenarioConfig sc;
  sc.vllm_max_num_batched_tokens = 8192;
  sc.vllm_max_concurrent_batches = 2;
  EXPECT_EQ(VllmHiSparseAdmissionWindow(sc), 16384u);
  sc.vllm_max_concurrent_batches = 1;  // synchronous scheduling
  EXPECT_EQ(VllmHiSparseAdmissionWindow(sc), 8192u);
  sc.vllm_max_num_batched_tokens = 2048;
  sc.vllm_max_concurrent_batches = 3;  // async scheduling at PP 2 (V2 runner)
  EXPECT_EQ(VllmHiSparseAdmissionWindow(sc), 6144u);
  auto def = LoadScenarioConfig(DefaultConfigDir() / "scenarios" / "default.json", DefaultConfigDir());
  ASSERT_TRUE(def) << def.error().ToString();
  EXPECT_EQ(VllmHiSparseAdmissionWindow(*def), 16384u);
}

// The curves stop at the CUDA-graph limit per engine instance, TP at the limit, DP at P x the
// limit (one instance per GPU), each engine in its unit: tiny_gpu's vLLM capture is 9 tokens
// (9 requests, 3 with two drafts), SGLang's cuda_graph_max_bs here 5 requests. The note says
// so; admission is memory's and does not move.
TEST(Engines, CurvesStopAtTheCudaGraphCaptureLimit) {
  CompareOptions o;
  o.config_dir = kTestConfigs;
  ScenarioConfig sc = Tiny();
  auto free = RunComparison(sc, o);
  ASSERT_TRUE(free) << free.error().ToString();
  // A copy of the test configs whose tiny_gpu has vLLM's ceiling at 9 tokens.
  const std::filesystem::path dir = std::filesystem::path(::testing::TempDir()) / "cuda_graph_limit_configs";
  std::filesystem::remove_all(dir);
  std::filesystem::copy(kTestConfigs, dir, std::filesystem::copy_options::recursive);
  {
    const std::filesystem::path costs = dir / "costs" / "tiny_gpu.json";
    std::ifstream in(costs);
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const std::string from = "\"vllm_max_cudagraph_capture_size\": {\"value\": 0";
    const std::size_t at = text.find(from);
    ASSERT_NE(at, std::string::npos);
    text.replace(at, from.size(), "\"vllm_max_cudagraph_capture_size\": {\"value\": 9");
    std::ofstream(costs, std::ios::trunc) << text;
  }
  o.config_dir = dir;
  sc.cuda_graph_max_batch = 5;
  auto capped = RunComparison(sc, o);
  ASSERT_TRUE(capped) << capped.error().ToString();
  bool any_tokens = false, any_requests = false, drafts_bit = false;
  for (std::size_t i = 0; i < capped->configs.size(); ++i) {
    const ConfigResult& c = capped->configs[i];
    const std::uint32_t q = c.entry.mtp ? 1 + c.cost_inputs.draft_tokens : 1;
    const std::uint32_t instances = c.entry.mode == ParallelMode::kTp ? 1 : sc.num_ranks;
    for (const SystemResult& s : c.systems) {
      SCOPED_TRACE(fmt::format("{} mtp={} {} ({})", ParallelModeName(c.entry.mode), c.entry.mtp, SystemName(s.system),
                               s.engine));
      const bool tokens = s.engine == "vLLM";
      const std::uint32_t per = tokens ? 9 / q : 5;
      const std::uint32_t cap = per * instances;
      EXPECT_EQ(s.admitted, free->configs[i].Find(s.system)->admitted);
      ASSERT_FALSE(s.curve.empty());
      EXPECT_LE(s.curve.back().batch, cap);
      if (s.admitted > cap) {
        (tokens ? any_tokens : any_requests) = true;
        drafts_bit = drafts_bit || (tokens && q > 1);
        EXPECT_EQ(s.curve.back().batch, cap);  // at the boundary, not one past
        EXPECT_NE(s.note.find("CUDA-graph capture limit"), std::string::npos) << s.note;
      } else {
        EXPECT_EQ(s.curve.back().batch, s.admitted);
      }
    }
  }
  EXPECT_TRUE(any_tokens);    // vLLM's token limit bit somewhere
  EXPECT_TRUE(drafts_bit);    // ... with drafts counted
  EXPECT_TRUE(any_requests);  // and the request limit
}

TEST(Engines, HiSparseMatchedToTheHostBudgetAdmitsAtLeastItsDefaultRatio) {
  CompareOptions o;
  o.config_dir = kTestConfigs;
  ScenarioConfig base = Tiny();
  base.hisparse_match_host_budget = false;
  base.hisparse_host_to_device_ratio = 2;
  ScenarioConfig matched = base;
  matched.hisparse_match_host_budget = true;
  auto a = RunComparison(base, o);
  auto b = RunComparison(matched, o);
  ASSERT_TRUE(a && b);
  bool more = false;
  for (std::size_t i = 0; i < a->configs.size(); ++i) {
    const SystemResult* x = a->configs[i].Find(SystemKind::kHiSparse);
    const SystemResult* y = b->configs[i].Find(SystemKind::kHiSparse);
    EXPECT_GE(y->admitted, x->admitted);
    EXPECT_GE(y->fill, x->fill);
    more = more || y->admitted > x->admitted;
  }
  EXPECT_TRUE(more) << "the budget rule never changed HiSparse's admission in the tiny scenario";
}

}  // namespace
}  // namespace ula
