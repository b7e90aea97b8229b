// `ula bench policy`: the same selection trace replayed through every residency policy
// (pb_lru, exact_lru_scan, exact_lru_list, clock, lfu_aged, and PB-LRU at other ring sizes,
// --extra-rings) on the same device pool, for batch sizes 1, 4, 16, 64, 256, plus sweeps of
// the pool size relative to the working set (--pools), of the selection overlap and of the
// selection model's heavy_skew (--skews), at batch 64. Each configuration also gets a
// `belady` row: Belady's MIN on the same trace and pool (policy/belady.h), and every policy
// row its gap to it in distinct hit rate. Per row: hit rate and the median scheduling time of a
// step (lookup + touch + victim choice + round advance; no data copy). The harness is
// src/policy/policy_replay.h; the trace comes from the shared selection model
// (src/workload/selection_model.h) with the parameters fitted to the real indexer in
// docs/WORKLOADS.md ("Selection model"), so it is the trace the other benchmarks use. The
// overlap sweep changes only keep_mean; each row reports the overlap its trace achieved
// (mean over requests and steps of |S_t ∩ S_t-1| / |S_t|, query 0).
//
// --json prints {"rows":[{"policy", "batch", "pool_fraction", "overlap", "keep_mean",
// "heavy_skew", "hit_rate", "distinct_hit_rate", "belady_distinct_hit_rate",
// "gap_to_belady_pp", "evictions", "cold_evictions", "step_ns_median"}, ...]} (cold_evictions: measured
// victims last used more than R steps before; for PB-LRU those taken from its cold bucket);
// the text table adds each policy's step time relative to the faster exact LRU of the same
// configuration. The policies of one configuration are
// replayed in lockstep (policy_replay.h), so their ratios come from the same run.
#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>
#include <memory>
#include <nlohmann/json.hpp>

#include "cli_checks.h"
#include "command_registry.h"
#include "policy/belady.h"
#include "policy/policy_replay.h"
#include "config/model_config.h"
#include "workload/selection_fit.h"
#include "workload/selection_model.h"

namespace ula::cli {
namespace {

struct BenchPolicyOptions {
  bool json = false;
  bool quick = false;
  bool no_sweeps = false;
  std::uint64_t seed = 1;
  std::uint32_t recent_buckets = PolicyOptions{}.recent_buckets;
  std::uint32_t parallel_min_slots = PolicyOptions{}.parallel_min_slots;
  std::vector<std::uint32_t> batches{1, 4, 16, 64, 256};
  std::vector<std::string> policies{"pb_lru", "exact_lru_scan", "exact_lru_list", "clock", "lfu_aged"};
  // Extra PB-LRU ring sizes replayed beside the policies (rows "pb_lru(R=8)", ...).
  std::vector<std::uint32_t> extra_rings{8, 16};
  // Selection-model heavy_skew values of the skew sweep (batch 64, pool 0.5).
  std::vector<double> skews{0.0, 0.5, 1.0, 1.5, 2.0};
  // Pool fractions of the sweeps (device slots / (batch * context)).
  std::vector<double> pools{0.15, 0.25, 0.5};
  // 192 steps = 3 R at the default R = 64: victims older than R rounds (PB-LRU's cold
  // bucket, where it departs from exact LRU) occur from step R + 1 on.
  std::uint32_t context_tokens = 16384, steps = 192, draft_tokens = 0;
  // The selection model: configs/selection/<selection_fit>.json (fitted to the real CPU
  // indexer by `ula bench trace --write-fit`, docs/WORKLOADS.md), top-k of configs/models/<model>.json;
  // --keep-mean / --heavy-skew (>= 0) override the fit's. Set by RunBenchPolicy.
  std::string config_dir;
  std::string selection_fit = "indexer_fit";
  std::string model_name = "glm5";
  double keep_mean_override = -1;
  double heavy_skew_override = -1;
  SelectionModelParams model;
};

struct Row {
  std::string label;  // policy name, "pb_lru(R=8)" for an extra ring size, or "belady"
  bool is_lru = false;
  std::uint32_t batch;
  double pool_fraction;
  double overlap;  // achieved by the trace
  double keep_mean;
  double heavy_skew;
  policy::ReplayResult result;
  double belady_hit_rate = 0;  // of the same trace and pool
};

struct Config {
  std::uint32_t batch;
  double keep_mean;
  std::vector<double> pool_fractions;
  double heavy_skew;
};

// The selection model's trace: request r is stream r with context_tokens + t + 1 tokens at
// step t; its positions map to addresses r * span + pos. Sets *overlap to the mean overlap.
Result<policy::SelectionTrace> BuildTrace(const BenchPolicyOptions& o, std::uint32_t batch, double keep_mean,
                                          double heavy_skew, double* overlap) {
  SelectionModelParams params = o.model;
  params.keep_mean = keep_mean;
  params.heavy_skew = heavy_skew;
  auto model = SelectionModel::Create(params);
  if (!model) return std::unexpected(model.error());
  policy::SelectionTrace trace;
  trace.batch = batch;
  trace.context_tokens = o.context_tokens;
  trace.steps = o.steps;
  const std::uint32_t span = o.context_tokens + o.steps;
  trace.num_addresses = std::uint64_t{batch} * span;
  if (trace.num_addresses > ~std::uint32_t{0}) {
    return MakeError(ErrorCode::kInvalidArgument, "batch * (context + steps) exceeds 2^32 - 1");
  }
  trace.selections.reserve(std::uint64_t{batch} * params.top_k * (1 + o.draft_tokens) * o.steps);
  std::vector<std::uint32_t> last_step(trace.num_addresses, 0);  // t + 1 of the last query-0 selection
  std::vector<std::vector<std::uint32_t>> queries;
  std::uint64_t common = 0, counted = 0;
  for (std::uint32_t t = 0; t < o.steps; ++t) {
    trace.step_begin.push_back(trace.selections.size());
    for (std::uint32_t r = 0; r < batch; ++r) {
      ULA_RETURN_IF_ERROR(model->Step(r, o.context_tokens + t + 1, 1 + o.draft_tokens, queries));
      const std::uint64_t base = std::uint64_t{r} * span;
      for (std::uint32_t pos : queries[0]) {
        if (t > 0) common += last_step[base + pos] == t;
        last_step[base + pos] = t + 1;
      }
      if (t > 0) counted += queries[0].size();
      for (const auto& q : queries) {
        for (std::uint32_t pos : q) trace.selections.push_back(LogicalAddr(static_cast<std::uint32_t>(base + pos)));
      }
    }
  }
  trace.step_begin.push_back(trace.selections.size());
  *overlap = counted == 0 ? 0.0 : static_cast<double>(common) / static_cast<double>(counted);
  return trace;
}

int RunBenchPolicy(const BenchPolicyOptions& o_in) {
  BenchPolicyOptions o = o_in;
  {
    const std::filesystem::path dir = o.config_dir.empty() ? DefaultConfigDir() : std::filesystem::path(o.config_dir);
    auto fit = LoadSelectionFitByName(o.selection_fit, dir);
    auto model = LoadModelConfigByName(o.model_name, dir);
    if (!fit || !model) {
      fmt::print(stderr, "ula bench policy: {}\n", (!fit ? fit.error() : model.error()).ToString());
      return 2;
    }
    o.model = fit->params;
    o.model.top_k = model->top_k;
    if (o.keep_mean_override >= 0) o.model.keep_mean = o.keep_mean_override;
    if (o.heavy_skew_override >= 0) o.model.heavy_skew = o.heavy_skew_override;
  }
  o.model.seed = o.seed;
  constexpr double kPoolFraction = 0.5;
  constexpr std::uint32_t kSweepBatch = 64;
  struct Variant {
    std::string label;
    PolicyKind kind;
    std::uint32_t ring;
  };
  std::vector<Variant> variants;
  for (const std::string& name : o.policies) {
    auto kind = ParsePolicyKind(name);
    if (!kind) {
      fmt::print(stderr, "ula bench policy: {}\n", kind.error().ToString());
      return 2;
    }
    variants.push_back({std::string(PolicyKindName(*kind)), *kind, o.recent_buckets});
  }
  for (std::uint32_t ring : o.extra_rings) {
    if (ring != o.recent_buckets) variants.push_back({fmt::format("pb_lru(R={})", ring), PolicyKind::kPbLru, ring});
  }
  const double keep = o.model.keep_mean;
  const double skew = o.model.heavy_skew;
  std::vector<Config> configs;
  for (std::uint32_t batch : o.batches) {
    configs.push_back({batch, keep, batch == kSweepBatch && !o.no_sweeps ? o.pools : std::vector<double>{kPoolFraction},
                       skew});
  }
  if (!o.no_sweeps) {
    for (double k : {0.5, 0.95}) configs.push_back({kSweepBatch, k, {kPoolFraction}, skew});
    for (double s : o.skews) {
      if (s != skew) configs.push_back({kSweepBatch, keep, o.pools, s});
    }
  }
  if (o.quick) {
    o.context_tokens = 8192;
    o.steps = 24;
  }
  const std::uint32_t warmup = o.quick ? 8 : 16;
  PolicyOptions options;
  options.recent_buckets = o.recent_buckets;
  options.parallel_min_slots = o.parallel_min_slots;

  std::vector<Row> rows;
  for (const Config& c : configs) {
    double overlap = 0;
    auto trace = BuildTrace(o, c.batch, c.keep_mean, c.heavy_skew, &overlap);
    if (!trace) {
      fmt::print(stderr, "ula bench policy: {}\n", trace.error().ToString());
      return 2;
    }
    for (double fraction : c.pool_fractions) {
      std::vector<policy::ReplayConfig> replays;
      for (const Variant& v : variants) {
        PolicyOptions vo = options;
        vo.recent_buckets = v.ring;
        replays.push_back({.policy = v.kind, .options = vo, .pool_fraction = fraction, .warmup_steps = warmup});
      }
      auto results = policy::ReplayTrace(*trace, replays);
      if (!results) {
        fmt::print(stderr, "ula bench policy: {}\n", results.error().ToString());
        return 1;
      }
      auto belady = policy::ReplayBelady(*trace, fraction, warmup);
      if (!belady) {
        fmt::print(stderr, "ula bench policy: {}\n", belady.error().ToString());
        return 1;
      }
      for (std::size_t i = 0; i < variants.size(); ++i) {
        const bool lru = variants[i].kind == PolicyKind::kExactLruScan || variants[i].kind == PolicyKind::kExactLruList;
        rows.push_back({variants[i].label, lru, c.batch, fraction, overlap, c.keep_mean, c.heavy_skew, (*results)[i],
                        belady->distinct_hit_rate()});
      }
      policy::ReplayResult opt;
      opt.pool_slots = belady->pool_slots;
      opt.selections = belady->selections;
      opt.hits = belady->hits;
      opt.distinct = belady->distinct;
      opt.distinct_hits = belady->distinct_hits;
      opt.evictions = belady->evictions;
      rows.push_back(
          {"belady", false, c.batch, fraction, overlap, c.keep_mean, c.heavy_skew, opt, belady->distinct_hit_rate()});
    }
  }

  if (o.json) {
    nlohmann::json out = {{"rows", nlohmann::json::array()}};
    for (const Row& r : rows) {
      out["rows"].push_back({{"policy", r.label},
                             {"batch", r.batch},
                             {"pool_fraction", r.pool_fraction},
                             {"overlap", r.overlap},
                             {"keep_mean", r.keep_mean},
                             {"heavy_skew", r.heavy_skew},
                             {"hit_rate", r.result.hit_rate()},
                             {"distinct_hit_rate", r.result.distinct_hit_rate()},
                             {"belady_distinct_hit_rate", r.belady_hit_rate},
                             {"gap_to_belady_pp", 100 * (r.belady_hit_rate - r.result.distinct_hit_rate())},
                             {"evictions", r.result.evictions},
                             {"cold_evictions", r.result.cold_evictions},
                             {"step_ns_median", r.result.step_ns_median}});
    }
    fmt::print("{}\n", out.dump());
    return 0;
  }
  const char* wait = std::getenv("OMP_WAIT_POLICY");
  fmt::print(
      "trace: selection model (top-k {}, sinks {}, recent {}, keep_mean {} +- {}, draft_keep {}, heavy_skew {}, "
      "return_fraction {} over {} steps, {} draft queries), context {} tokens/request, {} steps ({} warm-up), seed {}; "
      "R = {}, parallel_min_slots {}, OMP_WAIT_POLICY {}\n",
      o.model.top_k, o.model.sink_tokens, o.model.recent_tokens, o.model.keep_mean, o.model.keep_stddev,
      o.model.draft_keep, o.model.heavy_skew, o.model.return_fraction, o.model.return_window, o.draft_tokens,
      o.context_tokens, o.steps, warmup, o.seed, o.recent_buckets, o.parallel_min_slots, wait ? wait : "(unset)");
  fmt::print("{:<15} {:>5} {:>6} {:>5} {:>7} {:>10} {:>9} {:>9} {:>10} {:>14} {:>11} {:>10} {:>12}\n", "policy", "batch",
             "pool", "skew", "overlap", "pool_slots", "hit_rate", "distinct", "belady_gap", "step_us_median",
             "vs_best_lru", "evictions", "cold_victims");
  const std::size_t group = variants.size() + 1;  // + belady
  for (std::size_t i = 0; i < rows.size(); i += group) {
    // rows[i .. i + group) share a configuration, in `kinds` order.
    double best_lru = 0;
    for (std::size_t j = i; j < i + group; ++j) {
      if (rows[j].is_lru) {
        const double ns = rows[j].result.step_ns_median;
        best_lru = best_lru == 0 ? ns : std::min(best_lru, ns);
      }
    }
    for (std::size_t j = i; j < i + group; ++j) {
      const Row& r = rows[j];
      if (r.label == "belady") {
        fmt::print("{:<15} {:>5} {:>6.2f} {:>5.2f} {:>7.4f} {:>10} {:>8.4f}% {:>8.4f}% {:>10} {:>14} {:>11} {:>10} {:>12}\n",
                   r.label, r.batch, r.pool_fraction, r.heavy_skew, r.overlap, r.result.pool_slots,
                   100 * r.result.hit_rate(), 100 * r.result.distinct_hit_rate(), "-", "-", "-", r.result.evictions,
                   "-");
        continue;
      }
      fmt::print("{:<15} {:>5} {:>6.2f} {:>5.2f} {:>7.4f} {:>10} {:>8.4f}% {:>8.4f}% {:>8.3f}pp {:>14.1f} {:>11.3f} {:>10} "
                 "{:>12}\n",
                 r.label, r.batch, r.pool_fraction, r.heavy_skew, r.overlap, r.result.pool_slots,
                 100 * r.result.hit_rate(), 100 * r.result.distinct_hit_rate(),
                 100 * (r.belady_hit_rate - r.result.distinct_hit_rate()), r.result.step_ns_median / 1e3,
                 best_lru == 0 ? 0.0 : r.result.step_ns_median / best_lru, r.result.evictions, r.result.cold_evictions);
    }
  }
  return 0;
}

Action SetupBenchPolicy(CLI::App& app) {
  auto o = std::make_shared<BenchPolicyOptions>();
  app.add_flag("--json", o->json, "print one JSON object");
  app.add_flag("--quick", o->quick, "shorter trace and smaller contexts (a smoke run)");
  app.add_flag("--no-sweeps", o->no_sweeps, "only the batch rows (pool 0.5, calibrated overlap)");
  app.add_option("--batches", o->batches, "batch sizes")->capture_default_str()->check(IntIn(1, 65536));
  app.add_option("--policies", o->policies, "policies to replay")->capture_default_str();
  app.add_option("--context", o->context_tokens, "tokens of history per request at step 0")->capture_default_str()
      ->check(IntIn(1, 1 << 24));
  app.add_option("--steps", o->steps, "decode steps (16 warm-up)")->capture_default_str()->check(IntIn(1, 1000000));
  app.add_option("--draft-tokens", o->draft_tokens, "speculative draft queries per request and step")
      ->capture_default_str()->check(IntIn(0, 64));
  app.add_option("--keep-mean", o->keep_mean_override, "selection model keep_mean (overlap; default: the fit's)")
      ->check(RealIn(0, 1));
  app.add_option("--config-dir", o->config_dir, "configs directory (default: $ULA_CONFIG_DIR or the source tree's)");
  app.add_option("--selection-fit", o->selection_fit, "configs/selection/<name>.json fitted selection model")
      ->capture_default_str();
  app.add_option("--model", o->model_name, "configs/models/<name>.json (its top-k)")->capture_default_str();
  app.add_option("--seed", o->seed, "trace seed")->capture_default_str()->check(Seed());
  app.add_option("--recent-buckets", o->recent_buckets, "PB-LRU ring size R")->capture_default_str()
      ->check(IntIn(1, 1024));
  app.add_option("--extra-rings", o->extra_rings, "more PB-LRU ring sizes replayed beside the policies")
      ->capture_default_str()->check(IntIn(0, 1024));
  app.add_option("--pools", o->pools, "pool fractions of the sweeps (batch 64)")->capture_default_str()
      ->check(RealIn(0, 1, /*lo_open=*/true));
  app.add_option("--skews", o->skews, "selection-model heavy_skew values of the skew sweep (batch 64)")
      ->capture_default_str()->check(RealIn(0, 4));
  app.add_option("--heavy-skew", o->heavy_skew_override, "selection-model heavy_skew of the main rows (default: the fit's)")
      ->check(RealIn(0, 4));
  app.add_option("--parallel-min-slots", o->parallel_min_slots, "smallest Touch batch split over OpenMP threads")
      ->capture_default_str()->check(AtLeast<std::uint32_t>(1));
  return [o] { return RunBenchPolicy(*o); };
}

ULA_REGISTER_COMMAND(bench_policy, "bench", "policy", "residency policies replayed on one selection trace",
                     SetupBenchPolicy);

}  // namespace
}  // namespace ula::cli
