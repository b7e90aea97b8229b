// The selection turnover of `ula compare --model deepseek_v4_flash` (kind_compare.h
// MeasureKindTurnover): measured by the real indexer over the kind config's C4 indexer
// workload, recomputed here from the indexer's own selections, and what every system's host
// fetches are priced with; a bad workload is refused naming the field.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <unistd.h>
#include <vector>

#include "config/model_config.h"
#include "serving/kind_compare.h"
#include "serving/kind_config.h"
#include "workload/indexer_decode.h"

namespace ula {
namespace {

struct Expected {
  double single = 0, per_query = 0;
};

// The turnover by its definition, from IndexerDecodeSim's selections: per request and step
// t >= 1, |S0_t \ S0_{t-1}| / top_k (query 0 alone) and |U_t \ U_{t-1}| / (queries x top_k)
// (U the set of every query's positions).
void Recompute(const KindCompareConfig& kc, Expected* out) {
  auto model = LoadModelConfigByName(kc.model, DefaultConfigDir());
  ASSERT_TRUE(model) << model.error().ToString();
  auto schedule = LoadDecodeSimConfigByName(kc.selection_workload, DefaultConfigDir());
  ASSERT_TRUE(schedule) << schedule.error().ToString();
  auto sim = IndexerDecodeSim::Create(model->indexer_shape(), *schedule);
  ASSERT_TRUE(sim) << sim.error().ToString();
  const double k = model->top_k, q = schedule->queries_per_step();
  std::vector<std::set<std::uint32_t>> prev_q0(schedule->num_requests), prev_union(schedule->num_requests);
  double single = 0, per_query = 0, n = 0;
  for (std::uint32_t step = 0; step < schedule->decode_steps; ++step) {
    ASSERT_TRUE((*sim)->Step());
    for (std::uint32_t r = 0; r < schedule->num_requests; ++r) {
      const auto sel = (*sim)->Selections(r);
      const std::set<std::uint32_t> q0(sel[0].begin(), sel[0].end());
      std::set<std::uint32_t> all;
      for (const auto& s : sel) all.insert(s.begin(), s.end());
      if (step > 0) {
        double new_q0 = 0, new_all = 0;
        for (std::uint32_t p : q0) new_q0 += prev_q0[r].count(p) == 0;
        for (std::uint32_t p : all) new_all += prev_union[r].count(p) == 0;
        single += new_q0 / k;
        per_query += new_all / (q * k);
        n += 1;
      }
      prev_q0[r] = q0;
      prev_union[r] = all;
    }
  }
  ASSERT_GT(n, 0);
  *out = {single / n, per_query / n};
}

Result<KindCompareConfig> LoadKinds() { return LoadKindCompareConfigByName("deepseek_v4_flash", DefaultConfigDir()); }

// Under the sanitizers the comparison runs once, as `ula compare --model deepseek_v4_flash`
// (ctest serving_compare_kinds_cli: the same MeasureKindTurnover and RunKindComparison); the
// numbers below are the Release tree's checks.
#if defined(ULA_EXPENSIVE_CHECKS)
#define ULA_RELEASE_TREE_CHECK() GTEST_SKIP() << "the Release tree's check; the sanitizers run the comparison in the CLI test"
#else
#define ULA_RELEASE_TREE_CHECK() (void)0
#endif

TEST(KindTurnover, PricedMissesComeFromTheIndexersSelections) {
  ULA_RELEASE_TREE_CHECK();
  const auto loaded = LoadKinds();
  ASSERT_TRUE(loaded) << loaded.error().ToString();
  const KindCompareConfig& kc = *loaded;
  Expected want;
  ASSERT_NO_FATAL_FAILURE(Recompute(kc, &want));
  std::printf("[ turnover ] %s: %.4f a step (MTP off), %.4f per query (MTP on)\n", kc.selection_workload.c_str(), want.single,
              want.per_query);
  // V4's indexer keeps most of its selection: a few percent turn over, and a draft adds to the
  // step's union less than a query of its own.
  EXPECT_GT(want.single, 0.005);
  EXPECT_LT(want.single, 0.2);
  EXPECT_GT(want.per_query, 0.0);
  EXPECT_LT(want.per_query, want.single);

  auto r = RunKindComparison(kc, DefaultConfigDir());
  ASSERT_TRUE(r) << r.error().ToString();
  EXPECT_EQ(r->turnover.workload, "v4_flash_c4_indexer");
  EXPECT_NEAR(r->turnover.single, want.single, 1e-12);
  EXPECT_NEAR(r->turnover.per_query, want.per_query, 1e-12);
  // The engines with a per-request buffer fetch every turned-over selection once a request
  // outgrows it: batch x queries x 21 CSA layers x min(C4 entries, 512) x the turnover.
  int checked = 0;
  for (const KindConfigResult& c : r->configs) {
    const double queries = c.entry.mtp ? 3 : 1, t = c.entry.mtp ? want.per_query : want.single;
    for (const KindCurvePoint& pt : c.Find(KindSystem::kSglangHiSparse)->curve) {
      const double c4 = std::floor(pt.context / 4);
      if (c4 <= 4096) continue;  // inside HiSparse's buffer
      const double local = c.entry.mode == ParallelMode::kDp ? std::ceil(pt.batch / 8.0) : pt.batch;
      EXPECT_NEAR(pt.host_fetch, local * queries * 21 * std::min(c4, 512.0) * t, 1e-6 * pt.host_fetch)
          << c.hardware_label << " batch " << pt.batch;
      ++checked;
    }
    // UlaCache's: those that land on the C4 entries its run left on host, at least the host
    // share of them (the previous step's top-k stays on device), at most all of them.
    const KindSystemResult& ula = *c.Find(KindSystem::kUlaCache);
    const KindCurvePoint& last = ula.curve.back();
    const double local = c.entry.mode == ParallelMode::kDp ? std::ceil(last.batch / 8.0) : last.batch;
    const double stripe = c.entry.mode == ParallelMode::kTp ? 1.0 / 8 : 1.0;
    const double turned = local * queries * 21 * std::min(std::floor(last.context / 4), 512.0) * t * stripe;
    if (ula.admission.host_share_csa > 0 && last.batch == ula.admission.admitted) {
      EXPECT_GE(last.host_fetch, turned * ula.admission.host_share_csa * (1 - 1e-9)) << c.hardware_label;
      ++checked;
    }
    EXPECT_LE(last.host_fetch, turned * (1 + 1e-9)) << c.hardware_label;
  }
  EXPECT_GT(checked, 20);
  // The sensitivity's faster drift (query_keep 0.3) turns more over.
  auto drift = MeasureKindTurnover(kc, DefaultConfigDir(), kc.selection_sensitivity_query_keep);
  ASSERT_TRUE(drift) << drift.error().ToString();
  EXPECT_DOUBLE_EQ(drift->query_keep, 0.3);
  EXPECT_GT(drift->single, r->turnover.single);
}

TEST(KindTurnover, EverySystemsFetchesScaleWithIt) {
  ULA_RELEASE_TREE_CHECK();
  const auto loaded = LoadKinds();
  ASSERT_TRUE(loaded) << loaded.error().ToString();
  const KindCompareConfig& kc = *loaded;
  // Pricing alone (the measurement is the test above): any turnover, then twice it.
  const KindTurnover t{.workload = kc.selection_workload, .single = 0.04, .per_query = 0.02};
  KindTurnover doubled = t;
  doubled.single *= 2;
  doubled.per_query *= 2;
  auto a = RunKindComparison(kc, DefaultConfigDir(), t);
  auto b = RunKindComparison(kc, DefaultConfigDir(), doubled);
  ASSERT_TRUE(a && b);
  int fetching = 0, ula_fetching = 0;
  for (std::size_t i = 0; i < a->configs.size(); ++i) {
    for (std::size_t s = 0; s < a->configs[i].systems.size(); ++s) {
      const KindSystemResult &x = a->configs[i].systems[s], &y = b->configs[i].systems[s];
      ASSERT_EQ(x.admission.admitted, y.admission.admitted);  // admission does not depend on it
      ASSERT_EQ(x.curve.size(), y.curve.size());
      for (std::size_t p = 0; p < x.curve.size(); ++p) {
        EXPECT_NEAR(y.curve[p].host_fetch, 2 * x.curve[p].host_fetch, 1e-9 * x.curve[p].host_fetch);
        if (x.curve[p].host_fetch > 0) {
          ++fetching;
          ula_fetching += x.system == KindSystem::kUlaCache;
          EXPECT_GT(y.curve[p].time.total, x.curve[p].time.total);  // more misses, a slower step
        }
      }
    }
  }
  EXPECT_GT(fetching, 50);
  EXPECT_GE(ula_fetching, 2);  // UlaCache's 8xH200 DP runs leave C4 entries on host at 4096
}

// A workload config in a scratch config dir beside the real model.
class ScratchConfigs {
 public:
  ScratchConfigs() : dir_(std::filesystem::temp_directory_path() / ("kind_turnover_test_" + std::to_string(::getpid()))) {
    std::filesystem::create_directories(dir_ / "models");
    std::filesystem::create_directories(dir_ / "workloads");
    std::filesystem::copy_file(DefaultConfigDir() / "models" / "deepseek_v4_flash.json", dir_ / "models" / "deepseek_v4_flash.json",
                               std::filesystem::copy_options::overwrite_existing);
  }
  ~ScratchConfigs() { std::filesystem::remove_all(dir_); }
  // The V4 C4 indexer workload with `field` set to `value` (its JSON text).
  void Write(const std::string& name, const std::string& field, const std::string& value) {
    std::ifstream in(DefaultConfigDir() / "workloads" / "v4_flash_c4_indexer.json");
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const std::size_t at = text.find("\"" + field + "\":");
    ASSERT_NE(at, std::string::npos) << field;
    const std::size_t from = text.find(':', at) + 1, to = text.find_first_of(",\n}", from);
    text.replace(from, to - from, " " + value);
    std::ofstream(dir_ / "workloads" / (name + ".json")) << text;
  }
  const std::filesystem::path& dir() const { return dir_; }

 private:
  std::filesystem::path dir_;
};

TEST(KindTurnover, RefusesABadWorkloadNamingTheField) {
  const auto loaded = LoadKinds();
  ASSERT_TRUE(loaded) << loaded.error().ToString();
  const KindCompareConfig& kc = *loaded;
  ScratchConfigs scratch;
  scratch.Write("other_model", "model", "\"glm5\"");
  scratch.Write("per_token", "tokens_per_entry", "1");
  scratch.Write("one_step", "decode_steps", "1");
  scratch.Write("short_prompt", "prompt_tokens", "1024");  // 256 entries < top-k 512
  for (const char* name : {"missing", "other_model", "per_token", "one_step", "short_prompt"}) {
    KindCompareConfig bad = kc;
    bad.selection_workload = name;
    auto t = MeasureKindTurnover(bad, scratch.dir());
    ASSERT_FALSE(t) << name;
    EXPECT_EQ(t.error().code(), ErrorCode::kInvalidArgument) << name;
    EXPECT_NE(t.error().message().find("selection_workload"), std::string::npos) << t.error().message();
    EXPECT_NE(t.error().message().find(name), std::string::npos) << t.error().message();
    auto r = RunKindComparison(bad, scratch.dir());
    EXPECT_FALSE(r) << name;
  }
  // A sensitivity drift the indexer refuses.
  auto drift = MeasureKindTurnover(kc, DefaultConfigDir(), -1.0);
  ASSERT_FALSE(drift);
  EXPECT_NE(drift.error().message().find("query_keep"), std::string::npos) << drift.error().message();
  // A turnover outside [0, 1] prices nothing.
  KindTurnover wild{.workload = "x", .single = 1.5, .per_query = 0.1};
  auto r = RunKindComparison(kc, DefaultConfigDir(), wild);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(r.error().message().find("turnover"), std::string::npos) << r.error().message();
}

TEST(KindTurnover, TheConfigRefusesABadTurnoverFieldByName) {
  std::ifstream in(DefaultConfigDir() / "kinds" / "deepseek_v4_flash.json");
  const std::string good((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  ASSERT_TRUE(ParseKindCompareConfig(good, "t.json"));
  const auto replace = [&](const std::string& from, const std::string& to) {
    std::string t = good;
    const std::size_t at = t.find(from);
    EXPECT_NE(at, std::string::npos) << from;
    return t.replace(at, from.size(), to);
  };
  const struct {
    std::string text, field;
  } bad[] = {
      {replace("\"value\": \"v4_flash_c4_indexer\"", "\"value\": \"\""), "selection_workload"},
      {replace("\"value\": \"v4_flash_c4_indexer\"", "\"value\": 4"), "selection_workload"},
      {replace("\"selection_workload\": {", "\"selection_workload\": {\"typo\": 1, "), "typo"},
      {replace("\"selection_sensitivity_query_keep\": {\"value\": 0.3", "\"selection_sensitivity_query_keep\": {\"value\": 0"),
       "selection_sensitivity_query_keep"},
      {replace("\"selection_workload\"", "\"selection_turnover\""), "selection_workload"},  // the old assumed value
  };
  for (const auto& b : bad) {
    auto c = ParseKindCompareConfig(b.text, "t.json");
    ASSERT_FALSE(c) << b.field;
    EXPECT_NE(c.error().message().find(b.field), std::string::npos) << c.error().message();
  }
  KindCompareConfig in_code = *ParseKindCompareConfig(good, "t.json");
  in_code.selection_workload.clear();
  EXPECT_FALSE(in_code.Validate());
  EXPECT_FALSE(MeasureKindTurnover(in_code, DefaultConfigDir()));
}

}  // namespace
}  // namespace ula
