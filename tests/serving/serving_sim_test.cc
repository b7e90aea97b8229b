// End to end on the tiny scenario (tests/serving/configs): every system produces a curve up
// to its admission limit, UlaCache admits at least as many requests as both baselines (and
// in TP, UlaCache with attention at home at least as many as UlaCache), runs are
// deterministic, and bad scenario input is refused with the field named.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "config/model_config.h"
#include "serving/serving_systems.h"
#include "serving/serving_sim.h"

namespace ula {
namespace {

// The test configs (tests/serving/configs), found beside the clone's configs/ at run time.
const std::filesystem::path kTestConfigs = DefaultConfigDir().parent_path() / "tests" / "serving" / "configs";

std::string ReadTiny() {
  std::ifstream in(kTestConfigs / "scenarios" / "tiny.json");
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

ComparisonResult RunScenario(const std::string& json) {
  auto sc = ParseScenarioConfig(json, "tiny.json");
  EXPECT_TRUE(sc) << sc.error().ToString();
  CompareOptions o;
  o.config_dir = kTestConfigs;
  auto r = RunComparison(*sc, o);
  EXPECT_TRUE(r) << r.error().ToString();
  return r ? *r : ComparisonResult{};
}

ComparisonResult RunTiny() { return RunScenario(ReadTiny()); }

// The tiny scenario with one field (a JSON pointer) replaced.
ComparisonResult RunTinyWith(const std::string& pointer, const nlohmann::json& value) {
  nlohmann::json j = nlohmann::json::parse(ReadTiny());
  j[nlohmann::json::json_pointer(pointer)] = value;
  return RunScenario(j.dump());
}

TEST(ServingSim, EverySystemRunsUpToItsAdmissionLimit) {
  const ComparisonResult r = RunTiny();
  ASSERT_EQ(r.configs.size(), 4u);
  for (const ConfigResult& c : r.configs) {
    // ulacache_home, dcp, dcp_sglang and helix run in TP only; kAllSystems order.
    ASSERT_EQ(c.systems.size(), c.entry.mode == ParallelMode::kTp ? 9u : 5u);
    std::size_t next = 0;
    for (SystemKind k : kAllSystems) {
      if (SystemRunsIn(k, c.entry.mode)) {
        EXPECT_EQ(c.systems[next++].system, k);
      }
    }
    EXPECT_GT(c.budget.device_kv_bytes, 0);
    for (const SystemResult& s : c.systems) {
      SCOPED_TRACE(std::string(SystemName(s.system)) + " " + c.hardware_label);
      ASSERT_GT(s.admitted, 0u) << s.note;
      ASSERT_FALSE(s.curve.empty()) << s.note;
      EXPECT_EQ(s.curve.front().batch, 1u);
      EXPECT_EQ(s.curve.back().batch, s.admitted);
      EXPECT_GT(s.peak_tput, 0);
      EXPECT_GT(s.tpot_b1_ms, 0);
      for (const CurvePoint& p : s.curve) {
        EXPECT_GE(p.hit_rate, 0);
        EXPECT_LE(p.hit_rate, 1);
      }
      if (s.system == SystemKind::kAllGpu) {
        for (const CurvePoint& p : s.curve) {
          EXPECT_DOUBLE_EQ(p.hit_rate, 1.0);
          EXPECT_DOUBLE_EQ(p.h2d_gb + p.d2h_gb + p.nvlink_gb, 0.0);
        }
      }
    }
    const auto& u = c.systems[2];
    EXPECT_GE(u.admitted, c.systems[0].admitted);
    EXPECT_GE(u.admitted, c.systems[1].admitted);
  }
}

// The same scenario on 2 and on 4 ranks: all-GPU TP keeps a full copy per rank, so its
// admission grows only with one rank's KV budget (weights sharded over more ranks leave a
// little more: +10% here), by at most one request of rounding; UlaCache TP stripes the
// history over the ranks and admits about twice as many.
TEST(ServingSim, TpAllGpuDoesNotGainCapacityFromMoreRanksButUlaCacheDoes) {
  const ComparisonResult two = RunTiny();
  const ComparisonResult four = RunTinyWith("/num_ranks", 4);
  ASSERT_EQ(two.configs.size(), 4u);
  ASSERT_EQ(four.configs.size(), 4u);
  for (int c : {0, 1}) {  // the TP configs (mtp off, on)
    ASSERT_EQ(two.configs[c].entry.mode, ParallelMode::kTp);
    const SystemResult* all2 = two.configs[c].Find(SystemKind::kAllGpu);
    const SystemResult* all4 = four.configs[c].Find(SystemKind::kAllGpu);
    const SystemResult* ula2 = two.configs[c].Find(SystemKind::kUlaCache);
    const SystemResult* ula4 = four.configs[c].Find(SystemKind::kUlaCache);
    ASSERT_TRUE(all2 && all4 && ula2 && ula4);
    std::printf("config %d: kv per rank %.4g -> %.4g B; all-GPU %u -> %u; UlaCache %u -> %u\n", c,
                double(two.configs[c].budget.device_kv_bytes), double(four.configs[c].budget.device_kv_bytes),
                all2->admitted, all4->admitted, ula2->admitted, ula4->admitted);
    const double budget_growth = four.configs[c].budget.device_kv_bytes / two.configs[c].budget.device_kv_bytes;
    EXPECT_LE(all4->admitted, all2->admitted * budget_growth + 1) << "config " << c;
    EXPECT_GE(ula4->admitted, 1.5 * ula2->admitted) << "config " << c;
    EXPECT_GT(ula2->admitted, all2->admitted) << "config " << c;
  }
  // And DP all-GPU, one history per rank, does gain from more ranks.
  EXPECT_GT(four.configs[2].Find(SystemKind::kAllGpu)->admitted, two.configs[2].Find(SystemKind::kAllGpu)->admitted);
}

TEST(ServingSim, AttentionAtHomeRunsInTpOnlyFetchesNothingAndAdmitsAtLeastUlaCacheTp) {
  const ComparisonResult r = RunTiny();
  ASSERT_EQ(r.configs.size(), 4u);
  for (const ConfigResult& c : r.configs) {
    SCOPED_TRACE(std::string(ParallelModeName(c.entry.mode)) + (c.entry.mtp ? " mtp on" : " mtp off"));
    const SystemResult* home = c.Find(SystemKind::kUlaCacheAtHome);
    const SystemResult* ula = c.Find(SystemKind::kUlaCache);
    ASSERT_NE(ula, nullptr);
    if (c.entry.mode == ParallelMode::kDp) {
      EXPECT_EQ(home, nullptr);
      continue;
    }
    ASSERT_NE(home, nullptr);
    EXPECT_GE(home->admitted, ula->admitted);
    ASSERT_FALSE(home->curve.empty()) << home->note;
    for (const CurvePoint& p : home->curve) {
      EXPECT_DOUBLE_EQ(p.nvlink_gb, 0.0);        // no KV crosses NVLink
      EXPECT_DOUBLE_EQ(p.time.nvlink_fetch, 0.0);
    }
    // The local-buffer system does fetch (the tiny budget has room for its buffers).
    double fetched = 0;
    for (const CurvePoint& p : ula->curve) fetched += p.nvlink_gb;
    EXPECT_GT(fetched, 0);
    // At batch 1 both run the same request: the same hidden-state all-reduces and candidate
    // gather, plus the query all-gather and partial exchange at home.
    ASSERT_EQ(home->curve.front().batch, 1u);
    ASSERT_EQ(ula->curve.front().batch, 1u);
    EXPECT_GT(home->curve.front().time.collectives, ula->curve.front().time.collectives);
    EXPECT_LT(home->curve.front().time.attention, ula->curve.front().time.attention * 1.0001);
  }
}

// Two runs of one scenario are bit-identical, and the comparison is not vacuous: the runs
// do draw from the scenario's seeds (another sampling seed changes the curves).
TEST(ServingSim, RunsAreDeterministic) {
  const ComparisonResult a = RunTiny();
  const ComparisonResult b = RunTiny();
  const ComparisonResult other = RunTinyWith("/sampling/seed", 10);
  ASSERT_EQ(a.configs.size(), b.configs.size());
  ASSERT_EQ(a.configs.size(), other.configs.size());
  bool seed_matters = false;
  for (std::size_t i = 0; i < a.configs.size(); ++i) {
    ASSERT_EQ(a.configs[i].systems.size(), b.configs[i].systems.size());
    for (std::size_t s = 0; s < a.configs[i].systems.size(); ++s) {
      const SystemResult &x = a.configs[i].systems[s], &y = b.configs[i].systems[s], &z = other.configs[i].systems[s];
      EXPECT_EQ(x.admitted, y.admitted);
      ASSERT_EQ(x.curve.size(), y.curve.size());
      for (std::size_t k = 0; k < x.curve.size(); ++k) {
        EXPECT_EQ(x.curve[k].tput, y.curve[k].tput);  // bit-identical
        EXPECT_EQ(x.curve[k].hit_rate, y.curve[k].hit_rate);
        EXPECT_EQ(x.curve[k].h2d_gb, y.curve[k].h2d_gb);
        if (k < z.curve.size()) seed_matters |= x.curve[k].tput != z.curve[k].tput;
      }
    }
  }
  EXPECT_TRUE(seed_matters) << "no curve depends on the sampling seed: the determinism check compares constants";
}

// The counts behind the curves' hit rates (a curve's hit rate is 1 when nothing is counted,
// so checking all-GPU's 1.0 alone proves nothing): all-GPU counts each distinct selection
// once, as a hit; UlaCache DP sees the same distinct selections and misses those on host.
TEST(ServingSystems, AllGpuCountsEachDistinctSelectionOnceAsAHit) {
  using namespace serving_internal;
  auto counters = [](SystemKind kind) {
    SimSystemConfig c;
    c.rules.system = kind;
    c.rules.mode = ParallelMode::kDp;
    c.rules.num_ranks = 1;
    c.rules.device_bytes_per_rank = 1e6;
    c.rules.host_bytes_per_rank = 1e6;
    c.rules.kv_bytes_per_token = 100;
    c.rules.index_bytes_per_token = 10;
    c.rules.working_set_entries = 16;
    c.group_entry_bytes = 100;
    c.device_tokens = 8;
    c.host_tokens = 200;
    auto sys = MakeSimSystem(c);
    EXPECT_TRUE(sys) << sys.error().ToString();
    SimCounters k;
    if (!sys) return k;
    EXPECT_TRUE((*sys)->Admit(1, 50, 60).value_or(false));
    const std::vector<std::uint64_t> ids{1};
    const std::vector<std::vector<std::uint32_t>> first{{0}};  // ends the admission's round
    EXPECT_TRUE((*sys)->Step(ids, first, k));
    k = SimCounters{};
    const std::vector<std::vector<std::uint32_t>> sel{{3, 7, 3, 9, 7, 40, 41, 9}};
    auto st = (*sys)->Step(ids, sel, k);
    EXPECT_TRUE(st) << st.error().ToString();
    return k;
  };
  const SimCounters all = counters(SystemKind::kAllGpu);
  EXPECT_EQ(all.distinct, 5.0);  // {3, 7, 9, 40, 41}
  EXPECT_EQ(all.hits, 5.0);
  const SimCounters ula = counters(SystemKind::kUlaCache);
  EXPECT_EQ(ula.distinct, 5.0);
  EXPECT_LT(ula.hits, 5.0);  // 8 device slots: the later positions start on host
  EXPECT_GT(ula.h2d, 0.0);
}

// UlaCache pays its planner per group, SGLang's HiSparse with its shared-index prefetch
// (tiny.json) too; without it its per-layer swap-in kernel with the host fetch on the
// critical path; all-GPU neither.
TEST(ServingSim, EachSystemPaysItsOwnKernelsAndHiSparsesFetchIsOnTheCriticalPathWithoutPrefetch) {
  const ComparisonResult r = RunTiny();
  const ComparisonResult sync = RunTinyWith("/hisparse_shared_index_prefetch/value", 0);
  ASSERT_EQ(r.configs.size(), 4u);
  ASSERT_EQ(sync.configs.size(), 4u);
  for (std::size_t i = 0; i < r.configs.size(); ++i) {
    const SystemResult* pre = r.configs[i].Find(SystemKind::kHiSparse);
    const SystemResult* syn = sync.configs[i].Find(SystemKind::kHiSparse);
    ASSERT_TRUE(pre && syn);
    ASSERT_FALSE(pre->curve.empty() || syn->curve.empty());
    for (const StepCounts& k : syn->curve.front().measured) {
      EXPECT_TRUE(k.swap_in_per_layer);
      EXPECT_FALSE(k.planner_per_group);
    }
    // The same counts, the fetch overlapped within the group: never slower.
    EXPECT_LE(pre->curve.front().time.total, syn->curve.front().time.total);
    EXPECT_LE(pre->curve.front().time.transfer_exposed, syn->curve.front().time.transfer_exposed);
  }
  for (const ConfigResult& c : r.configs) {
    SCOPED_TRACE(std::string(ParallelModeName(c.entry.mode)) + (c.entry.mtp ? " mtp on" : " mtp off"));
    for (const SystemResult& s : c.systems) {
      SCOPED_TRACE(std::string(SystemName(s.system)));
      ASSERT_FALSE(s.curve.empty());
      const CurvePoint& b1 = s.curve.front();
      ASSERT_FALSE(b1.measured.empty());
      // vllm_hisparse: its resolver and gather kernels per index group, priced as a planner;
      // trtllm_offload's fetch kernels taken as vLLM's.
      const bool planner = IsUlaCache(s.system) || s.system == SystemKind::kVllmHiSparse ||
                           s.system == SystemKind::kTrtllmOffload || s.system == SystemKind::kHiSparse;
      for (const StepCounts& k : b1.measured) {
        EXPECT_EQ(k.planner_per_group, planner);
        EXPECT_FALSE(k.swap_in_per_layer);
      }
      if (s.system == SystemKind::kAllGpu || IsContextParallel(s.system)) {
        EXPECT_DOUBLE_EQ(b1.time.planner, 0);
      } else {
        EXPECT_GT(b1.time.planner, 0);  // batch 1 pays it too
      }
    }
  }
}

TEST(ServingSim, RepricingWithTheSameInputsReproducesTheRunAndASlowerKernelSlowsIt) {
  const ComparisonResult r = RunTiny();
  auto same = RepriceComparison(r, [](CostModelInputs&) {});
  ASSERT_TRUE(same) << same.error().ToString();
  auto slow = RepriceComparison(r, [](CostModelInputs& in) { in.rates.sparse_decode_flops *= 0.01; });
  ASSERT_TRUE(slow) << slow.error().ToString();
  for (std::size_t i = 0; i < r.configs.size(); ++i) {
    for (std::size_t s = 0; s < r.configs[i].systems.size(); ++s) {
      const SystemResult &a = r.configs[i].systems[s], &b = same->configs[i].systems[s], &c = slow->configs[i].systems[s];
      EXPECT_EQ(b.admitted, a.admitted);
      EXPECT_NEAR(b.peak_tput, a.peak_tput, 1e-9 * a.peak_tput);
      EXPECT_LT(c.peak_tput, a.peak_tput);
    }
  }
}

// Prefill KV arriving follows the output tokens a step produces, MTP's accepted drafts
// included: per measured step, arriving bytes = (bytes per output token) x batch_total x
// tokens_per_step. The bytes per output token depend on the workload and the placement
// rules, not on the acceptance rate, so at two acceptance rates (MTP on: 1.5 and more
// tokens per step apart) arriving / (batch_total x tokens_per_step) is the same for every
// system and mode; leaving the drafts out (1 token per step) breaks it by that factor.
TEST(ServingSim, ArrivingPrefillKvFollowsTheOutputTokensIncludingAcceptedDrafts) {
  const ComparisonResult hi = RunTiny();  // acceptance 0.7
  const ComparisonResult lo = RunTinyWith("/mtp_acceptance_rate/value", 0.1);
  ASSERT_EQ(hi.configs.size(), 4u);
  ASSERT_EQ(lo.configs.size(), 4u);
  int mtp_checked = 0;
  for (std::size_t i = 0; i < hi.configs.size(); ++i) {
    const ConfigResult &h = hi.configs[i], &l = lo.configs[i];
    SCOPED_TRACE(std::string(ParallelModeName(h.entry.mode)) + (h.entry.mtp ? " mtp on" : " mtp off"));
    ASSERT_EQ(h.systems.size(), l.systems.size());
    for (std::size_t s = 0; s < h.systems.size(); ++s) {
      SCOPED_TRACE(std::string(SystemName(h.systems[s].system)));
      ASSERT_FALSE(h.systems[s].curve.empty() || l.systems[s].curve.empty());
      // Arriving bytes per output token, from each measured step of each curve point.
      auto per_output_token = [](const SystemResult& r) {
        std::vector<double> v;
        for (const CurvePoint& p : r.curve) {
          for (const StepCounts& k : p.measured) {
            v.push_back((k.arriving_host_bytes + k.arriving_device_bytes) / (k.batch_total * p.tokens_per_step));
          }
        }
        return v;
      };
      const std::vector<double> a = per_output_token(h.systems[s]), b = per_output_token(l.systems[s]);
      ASSERT_FALSE(a.empty() || b.empty());
      const double ref = a.front();
      ASSERT_GT(ref, 0);
      for (double x : a) EXPECT_NEAR(x, ref, 1e-9 * ref);
      for (double x : b) EXPECT_NEAR(x, ref, 1e-9 * ref);
      if (h.entry.mtp) {
        const double th = h.systems[s].curve.front().tokens_per_step, tl = l.systems[s].curve.front().tokens_per_step;
        EXPECT_GT(th, 1.5);
        EXPECT_GT(th, 1.3 * tl);  // the two rates differ enough to tell drafts from none
        ++mtp_checked;
      }
    }
  }
  EXPECT_GT(mtp_checked, 0);
}

// SGLang sizes HiSparse's host pool as host_to_device_ratio x its device
// pool, so a small ratio caps HiSparse's admission below what the host memory holds.
TEST(ServingSim, HiSparsesHostPoolIsTheRatioTimesItsDevicePool) {
  auto sc = ParseScenarioConfig(ReadTiny(), "tiny.json");
  ASSERT_TRUE(sc);
  CompareOptions o;
  o.config_dir = kTestConfigs;
  std::vector<std::vector<std::uint32_t>> admitted;  // [ratio][config]
  for (double ratio : {1.0, 2.0, 1e6}) {
    sc->hisparse_host_to_device_ratio = ratio;
    auto r = RunComparison(*sc, o);
    ASSERT_TRUE(r) << r.error().ToString();
    admitted.emplace_back();
    for (const ConfigResult& c : r->configs) admitted.back().push_back(c.Find(SystemKind::kHiSparse)->admitted);
  }
  bool capped = false;
  for (std::size_t c = 0; c < admitted[0].size(); ++c) {
    EXPECT_LE(admitted[0][c], admitted[1][c]);
    EXPECT_LE(admitted[1][c], admitted[2][c]);
    capped = capped || admitted[0][c] < admitted[2][c];
  }
  EXPECT_TRUE(capped) << "the ratio never limited HiSparse in the tiny scenario";
}

// Replaces one field (a JSON pointer) of the tiny scenario and returns the parse error.
std::string ErrorWith(const std::string& pointer, const nlohmann::json& value) {
  nlohmann::json j = nlohmann::json::parse(ReadTiny());
  if (value.is_null()) {
    j.erase(pointer.substr(1));
  } else {
    j[nlohmann::json::json_pointer(pointer)] = value;
  }
  auto sc = ParseScenarioConfig(j.dump(), "bad.json");
  return sc ? std::string("accepted") : sc.error().message();
}

TEST(ServingSim, BadScenarioInputIsRefusedWithTheFieldNamed) {
  EXPECT_NE(ErrorWith("/num_ranks", 0).find("num_ranks"), std::string::npos);
  EXPECT_NE(ErrorWith("/configs/1/mode", "pp").find("configs[1].mode"), std::string::npos);
  EXPECT_NE(ErrorWith("/configs/0/mtp", "yes").find("configs[0].mtp"), std::string::npos);
  EXPECT_NE(ErrorWith("/configs", nlohmann::json::array()).find("configs"), std::string::npos);
  EXPECT_NE(ErrorWith("/mtp_acceptance_rate/value", 1.5).find("mtp_acceptance_rate"), std::string::npos);
  EXPECT_NE(ErrorWith("/activation_reserve_fraction", 0.1).find("activation_reserve_fraction"), std::string::npos);
  EXPECT_NE(ErrorWith("/sampling/batch_grid", nlohmann::json::array({4, 2})).find("batch_grid[1]"), std::string::npos);
  EXPECT_NE(ErrorWith("/sampling/measure_steps", 0).find("measure_steps"), std::string::npos);
  // A scenario names its selection fit (configs/selection/); it cannot carry its own copy.
  EXPECT_NE(ErrorWith("/selection/keep_mean", 0.9).find("keep_mean"), std::string::npos);
  EXPECT_NE(ErrorWith("/selection/fit", "").find("fit"), std::string::npos);
  EXPECT_NE(ErrorWith("/selection/seed", -1).find("seed"), std::string::npos);
  EXPECT_NE(ErrorWith("/hisparse_buffer_entries", 0).find("hisparse_buffer_entries"), std::string::npos);
  EXPECT_NE(ErrorWith("/planner_kernels_per_call/value", 0).find("planner_kernels_per_call"), std::string::npos);
  EXPECT_NE(ErrorWith("/hisparse_host_to_device_ratio/value", 0.5).find("hisparse_host_to_device_ratio"),
            std::string::npos);
  EXPECT_NE(ErrorWith("/bogus", 1).find("bogus"), std::string::npos);
  EXPECT_NE(ErrorWith("/model", nlohmann::json()).find("model"), std::string::npos);
  EXPECT_EQ(ErrorWith("/num_ranks", 2), "accepted");
}

TEST(ServingSim, UnknownSelectionFitNamesTheFile) {
  auto sc = ParseScenarioConfig(ReadTiny(), "tiny.json");
  ASSERT_TRUE(sc);
  sc->selection_fit = "nonexistent_fit";
  CompareOptions o;
  o.config_dir = kTestConfigs;
  auto r = RunComparison(*sc, o);
  ASSERT_FALSE(r);
  EXPECT_NE(r.error().message().find("nonexistent_fit"), std::string::npos);
}

TEST(ServingSim, UnknownHardwareNamesTheFile) {
  auto sc = ParseScenarioConfig(ReadTiny(), "tiny.json");
  ASSERT_TRUE(sc);
  sc->configs[0].hardware = "nonexistent_gpu";
  CompareOptions o;
  o.config_dir = kTestConfigs;
  auto r = RunComparison(*sc, o);
  ASSERT_FALSE(r);
  EXPECT_NE(r.error().message().find("nonexistent_gpu"), std::string::npos);
}

}  // namespace
}  // namespace ula
