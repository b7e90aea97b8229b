// End to end on the tiny scenario (tests/serving/configs): every system produces a curve up
// to its admission limit, UlaCache admits at least as many requests as both baselines, runs
// are deterministic, and bad scenario input is refused with the field named.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "ula/serving_sim.h"

namespace ula {
namespace {

const std::filesystem::path kTestConfigs = ULA_SERVING_TEST_CONFIGS;

std::string ReadTiny() {
  std::ifstream in(kTestConfigs / "scenarios" / "tiny.json");
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

ComparisonResult RunTiny() {
  auto sc = ParseScenarioConfig(ReadTiny(), "tiny.json");
  EXPECT_TRUE(sc) << sc.error().ToString();
  CompareOptions o;
  o.config_dir = kTestConfigs;
  auto r = RunComparison(*sc, o);
  EXPECT_TRUE(r) << r.error().ToString();
  return r ? *r : ComparisonResult{};
}

TEST(ServingSim, EverySystemRunsUpToItsAdmissionLimit) {
  const ComparisonResult r = RunTiny();
  ASSERT_EQ(r.configs.size(), 4u);
  for (const ConfigResult& c : r.configs) {
    ASSERT_EQ(c.systems.size(), 3u);
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

TEST(ServingSim, TpAllGpuDoesNotGainCapacityFromMoreRanksButUlaCacheDoes) {
  const ComparisonResult r = RunTiny();
  ASSERT_EQ(r.configs.size(), 4u);
  const ConfigResult& tp = r.configs[0];
  const ConfigResult& dp = r.configs[2];
  // All-GPU TP holds a full copy per rank: about half of DP's admission on 2 ranks.
  EXPECT_LT(tp.systems[0].admitted, dp.systems[0].admitted);
  EXPECT_GT(tp.systems[2].admitted, tp.systems[0].admitted);
}

TEST(ServingSim, RunsAreDeterministic) {
  const ComparisonResult a = RunTiny();
  const ComparisonResult b = RunTiny();
  ASSERT_EQ(a.configs.size(), b.configs.size());
  for (std::size_t i = 0; i < a.configs.size(); ++i) {
    for (std::size_t s = 0; s < 3; ++s) {
      const SystemResult &x = a.configs[i].systems[s], &y = b.configs[i].systems[s];
      EXPECT_EQ(x.admitted, y.admitted);
      ASSERT_EQ(x.curve.size(), y.curve.size());
      for (std::size_t k = 0; k < x.curve.size(); ++k) {
        EXPECT_EQ(x.curve[k].tput, y.curve[k].tput);  // bit-identical
        EXPECT_EQ(x.curve[k].hit_rate, y.curve[k].hit_rate);
      }
    }
  }
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
  EXPECT_NE(ErrorWith("/selection/keep_mean", 2).find("keep_mean"), std::string::npos);
  EXPECT_NE(ErrorWith("/hisparse_buffer_entries", 0).find("hisparse_buffer_entries"), std::string::npos);
  EXPECT_NE(ErrorWith("/bogus", 1).find("bogus"), std::string::npos);
  EXPECT_NE(ErrorWith("/model", nlohmann::json()).find("model"), std::string::npos);
  EXPECT_EQ(ErrorWith("/num_ranks", 2), "accepted");
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
