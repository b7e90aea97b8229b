// `ula bench policy`: the same seeded selection trace replayed through every residency
// policy (pb_lru, exact_lru_scan, exact_lru_list, clock) on the same device pool, for batch
// sizes 1, 4, 16, 64, 256, plus sweeps of the pool size relative to the working set and of
// the selection overlap (at batch 64). Per row: hit rate and the median scheduling time of a
// step (lookup + touch + victim choice + round advance; no data copy). The trace and the
// harness are src/policy/policy_replay.h.
//
// --json prints {"rows":[{"policy", "batch", "pool_fraction", "overlap", "hit_rate",
// "step_ns_median"}, ...]}; the text table adds each policy's step time relative to the
// faster exact LRU of the same configuration. The four policies of one configuration are
// replayed in lockstep (policy_replay.h), so their ratios come from the same run.
#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <memory>
#include <nlohmann/json.hpp>

#include "command_registry.h"
#include "policy/policy_replay.h"

namespace ula::cli {
namespace {

struct BenchPolicyOptions {
  bool json = false;
  bool quick = false;
  std::uint64_t seed = 1;
  std::uint32_t recent_buckets = PolicyOptions{}.recent_buckets;
  std::uint32_t parallel_min_slots = PolicyOptions{}.parallel_min_slots;
};

constexpr std::array<PolicyKind, 4> kPolicies{PolicyKind::kPbLru, PolicyKind::kExactLruScan,
                                              PolicyKind::kExactLruList, PolicyKind::kClock};

struct Row {
  PolicyKind policy;
  std::uint32_t batch;
  double pool_fraction;
  double overlap;
  policy::ReplayResult result;
};

struct Config {
  std::uint32_t batch;
  double overlap;
  std::vector<double> pool_fractions;
};

int RunBenchPolicy(const BenchPolicyOptions& o) {
  constexpr double kPoolFraction = 0.5, kOverlap = 0.8;
  constexpr std::uint32_t kSweepBatch = 64;
  std::vector<Config> configs;
  for (std::uint32_t batch : {1u, 4u, 16u, 64u, 256u}) {
    configs.push_back({batch, kOverlap, batch == kSweepBatch ? std::vector<double>{0.25, 0.5, 0.75}
                                                             : std::vector<double>{kPoolFraction}});
  }
  for (double overlap : {0.5, 0.95}) configs.push_back({kSweepBatch, overlap, {kPoolFraction}});

  policy::SelectionTraceConfig base;
  base.seed = o.seed;
  if (o.quick) {
    base.context_tokens = 8192;
    base.steps = 24;
  }
  const std::uint32_t warmup = o.quick ? 8 : 16;
  PolicyOptions options;
  options.recent_buckets = o.recent_buckets;
  options.parallel_min_slots = o.parallel_min_slots;

  std::vector<Row> rows;
  for (const Config& c : configs) {
    policy::SelectionTraceConfig tc = base;
    tc.batch = c.batch;
    tc.overlap = c.overlap;
    auto trace = policy::GenerateSelectionTrace(tc);
    if (!trace) {
      fmt::print(stderr, "ula bench policy: {}\n", trace.error().ToString());
      return 2;
    }
    for (double fraction : c.pool_fractions) {
      std::vector<policy::ReplayConfig> replays;
      for (PolicyKind kind : kPolicies) {
        replays.push_back({.policy = kind, .options = options, .pool_fraction = fraction, .warmup_steps = warmup});
      }
      auto results = policy::ReplayTrace(*trace, replays);
      if (!results) {
        fmt::print(stderr, "ula bench policy: {}\n", results.error().ToString());
        return 1;
      }
      for (std::size_t i = 0; i < kPolicies.size(); ++i) {
        rows.push_back({kPolicies[i], c.batch, fraction, c.overlap, (*results)[i]});
      }
    }
  }

  if (o.json) {
    nlohmann::json out = {{"rows", nlohmann::json::array()}};
    for (const Row& r : rows) {
      out["rows"].push_back({{"policy", PolicyKindName(r.policy)},
                             {"batch", r.batch},
                             {"pool_fraction", r.pool_fraction},
                             {"overlap", r.overlap},
                             {"hit_rate", r.result.hit_rate()},
                             {"step_ns_median", r.result.step_ns_median}});
    }
    fmt::print("{}\n", out.dump());
    return 0;
  }
  fmt::print("trace: top-k {}, context {} tokens/request, {} steps ({} warm-up), seed {}, R = {}\n", base.top_k,
             base.context_tokens, base.steps, warmup, base.seed, o.recent_buckets);
  fmt::print("{:<15} {:>5} {:>6} {:>7} {:>10} {:>9} {:>14} {:>11}\n", "policy", "batch", "pool", "overlap",
             "pool_slots", "hit_rate", "step_us_median", "vs_best_lru");
  for (std::size_t i = 0; i < rows.size(); i += kPolicies.size()) {
    // rows[i .. i+3] share a configuration, in kPolicies order.
    const double best_lru = std::min(rows[i + 1].result.step_ns_median, rows[i + 2].result.step_ns_median);
    for (std::size_t j = i; j < i + kPolicies.size(); ++j) {
      const Row& r = rows[j];
      fmt::print("{:<15} {:>5} {:>6.2f} {:>7.2f} {:>10} {:>8.4f}% {:>14.1f} {:>11.3f}\n", PolicyKindName(r.policy),
                 r.batch, r.pool_fraction, r.overlap, r.result.pool_slots, 100 * r.result.hit_rate(),
                 r.result.step_ns_median / 1e3, r.result.step_ns_median / best_lru);
    }
  }
  return 0;
}

Action SetupBenchPolicy(CLI::App& app) {
  auto o = std::make_shared<BenchPolicyOptions>();
  app.add_flag("--json", o->json, "print one JSON object");
  app.add_flag("--quick", o->quick, "shorter trace and smaller contexts (a smoke run)");
  app.add_option("--seed", o->seed, "trace seed")->capture_default_str();
  app.add_option("--recent-buckets", o->recent_buckets, "PB-LRU ring size R")->capture_default_str();
  app.add_option("--parallel-min-slots", o->parallel_min_slots, "smallest Touch batch split over OpenMP threads")
      ->capture_default_str();
  return [o] { return RunBenchPolicy(*o); };
}

ULA_REGISTER_COMMAND(bench_policy, "bench", "policy", "residency policies replayed on one selection trace",
                     SetupBenchPolicy);

}  // namespace
}  // namespace ula::cli
