// `ula bench dup`: how much of the stored KV is distinct history, TP and DP, 8 ranks, on
// the default GLM-5 scenario (model glm5, workload long_doc_summarization), counting
// backend. Rows:
//   all_gpu   TP: every rank stores every entry; DP: each request on one rank.
//   hisparse  full history on host + a fixed per-request device buffer (4096 slots) whose
//             entries duplicate host entries; in TP every rank holds both.
//   ulacache  measured from the address spaces after decode steps: TP with the
//             local buffers (TpAttention::kLocalBuffer) = the shards (exclusive
//             device/host) + every rank's local buffer; DP = exclusive device/host pools.
//   ulacache_home  TP with attention at home (TpAttention::kAtHome): the shards, no buffer.
// (The names are those of `ula compare`.)
// The baselines' counts follow from their definition (docs/COST_MODEL.md); UlaCache's
// are read from the pools. Also, per step after a warm-up step, the traffic between ranks
// of each TP strategy: local buffer = hit rate and KV bytes fetched from other ranks
// (counted by the backend); at home = the absorbed queries all-gathered and the partial
// outputs exchanged (bf16 queries, float32 partial records as partial_attention.h), per
// query token and layer from the model shape. Prefetch overlap: `ula bench tp-prefetch`.
// Selections: the selection model with the one calibrated parameter set of the configs
// (configs/selection/<fit>.json named by configs/scenarios/default.json, fitted to the real
// indexer by `ula bench trace --write-fit`), top-k from the model, seeded by the workload.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <nlohmann/json.hpp>

#include "bench_dup_shared.h"
#include "cli_checks.h"
#include "command_registry.h"
#include "ula/address_space.h"
#include "config/model_config.h"
#include "ula/reference_attention.h"
#include "workload/selection_model.h"
#include "serving/serving_config.h"
#include "workload/shared_workload.h"
#include "ula/tp_prefetcher.h"
#include "workload/workload.h"

namespace ula::cli {
namespace {

struct DupOptions {
  std::string config_dir, model = "glm5", workload = "long_doc_summarization";
  std::uint32_t ranks = 8, requests = 16, steps = 6, hisparse_buffer = 4096;
  double buffer_factor = 1.25;  // local buffer / one step's remote working set
  bool json = false;
};

struct Row {
  std::string system, mode, attention;
  std::uint64_t physical = 0, distinct = 0;
};

// One TP strategy run on the counting backend.
struct TpRun {
  std::uint64_t physical = 0, distinct = 0, buffered = 0;
  StepStats measured;       // steps 2.., all ranks
  std::uint64_t remote_bytes = 0;  // KV bytes fetched from other ranks, steps 2..
  std::uint64_t selections = 0;    // steps 2..
}; 

template <class T>
T OrDie(Result<T> r, const char* what) {
  if (!r) {
    fmt::print(stderr, "ula bench dup: {}: {}\n", what, r.error().ToString());
    std::exit(2);
  }
  return std::move(*r);
}

// Local buffer slots per rank per group: buffer_factor x one step's remote working set.
std::uint64_t BufferSlots(const DupOptions& o, const ModelConfig& model, const WorkloadConfig& wl, std::uint32_t n_req) {
  const std::uint64_t per_step_remote = std::uint64_t{n_req} * model.top_k * wl.queries_per_step() * (o.ranks - 1) / o.ranks;
  return static_cast<std::uint64_t>(o.buffer_factor * per_step_remote);
}

// Runs o.steps decode steps of the first requests through one TP strategy (the same
// selections for both: the selection model is re-seeded) and counts what is stored.
TpRun RunTp(const DupOptions& o, const ModelConfig& model, const WorkloadConfig& wl, const SelectionModelParams& sp,
            const std::vector<RequestSpec>& specs, TpAttention attention, Backend& counting) {
  const std::uint32_t n_req = std::min<std::uint32_t>(o.requests, static_cast<std::uint32_t>(specs.size()));
  const std::uint32_t groups = model.num_groups(), entry = model.group_entry_bytes(), p = o.ranks;
  const std::uint32_t queries = wl.queries_per_step();
  std::uint64_t n = 0;  // entries per group at the end of the run
  for (std::uint32_t i = 0; i < n_req; ++i) n += specs[i].input_tokens + o.steps;
  auto selector = OrDie(SelectionModel::Create(sp), "selection model");
  TpConfig tc;
  tc.num_ranks = p;
  tc.num_groups = groups;
  tc.entry_bytes = entry;
  tc.attention = attention;
  const std::uint64_t shard = (n + p - 1) / p + 1024;
  tc.device_bytes_per_rank = shard * entry * groups;  // the whole batch fits on device in TP
  tc.host_bytes_per_rank = 0;
  tc.buffer_bytes_per_rank = attention == TpAttention::kAtHome ? 0 : BufferSlots(o, model, wl, n_req) * entry * groups;
  auto tp = OrDie(TpAddressSpace::Create(tc, counting), "TP space");
  TpStepPlanner planner(*tp, nullptr, {.parallel_ranks = false});
  std::vector<std::vector<LogicalAddr>> addrs(n_req);
  for (std::uint32_t i = 0; i < n_req; ++i) {
    (void)tp->AddRequest(RequestId(i));
    addrs[i] = OrDie(tp->Allocate(RequestId(i), specs[i].input_tokens), "TP allocate");
  }
  tp->AdvanceRound();
  std::vector<std::vector<std::uint32_t>> per_query;
  std::vector<LogicalAddr> sel;
  std::vector<SelectionRun> runs;
  TpRun run;
  counting.ResetCounters();
  for (std::uint32_t step = 0; step < o.steps; ++step) {
    if (step == 1) counting.ResetCounters();
    for (std::uint32_t g = 0; g < groups; ++g) {
      sel.clear();
      runs.clear();
      for (std::uint32_t i = 0; i < n_req; ++i) {
        (void)selector.Step(std::uint64_t{i} * groups + g, static_cast<std::uint32_t>(addrs[i].size()), queries, per_query);
        const std::size_t first = sel.size();
        for (const auto& q : per_query) {
          for (std::uint32_t pos : q) sel.push_back(addrs[i][pos]);
        }
        runs.push_back(SelectionRun{RequestId(i), static_cast<std::uint32_t>(sel.size() - first)});
      }
      auto plan = OrDie(planner.Step(GroupId(static_cast<std::uint16_t>(g)), sel, runs), "TP step");
      if (step > 0) {
        run.measured += plan.Total();
        run.selections += sel.size();
      }
    }
    tp->AdvanceRound();
    for (std::uint32_t i = 0; i < n_req; ++i) {
      auto more = OrDie(tp->Allocate(RequestId(i), 1), "TP decode");
      addrs[i].push_back(more[0]);
    }
  }
  run.remote_bytes = counting.counters().Bytes(Tier::kDevice, Tier::kDevice, true) +
                     counting.counters().Bytes(Tier::kHost, Tier::kDevice, true);
  const TpStoredEntries stored = CountTpStoredEntries(*tp);
  run.physical = stored.physical();
  run.buffered = stored.buffered;
  run.distinct = tp->num_live_addresses() * groups;
  return run;
}

int RunDup(const DupOptions& o) {
  const std::filesystem::path dir = o.config_dir.empty() ? DefaultConfigDir() : std::filesystem::path(o.config_dir);
  const ModelConfig model = OrDie(LoadModelConfigByName(o.model, dir), "model");
  WorkloadConfig wl = OrDie(LoadWorkloadConfigByName(o.workload, dir), "workload");
  auto specs = OrDie(GenerateWorkload(wl), "workload");
  // The calibrated selection parameters: the default scenario's fit (configs/selection/), as `ula compare`.
  const ScenarioConfig scenario = OrDie(LoadScenarioConfig(dir / "scenarios" / "default.json", dir), "scenario");
  SelectionModelParams sp = scenario.selection;
  sp.top_k = model.top_k;
  sp.seed = wl.seed;
  const std::uint32_t n_req = std::min<std::uint32_t>(o.requests, static_cast<std::uint32_t>(specs.size()));
  const std::uint32_t groups = model.num_groups(), entry = model.group_entry_bytes(), p = o.ranks;
  const std::uint32_t queries = wl.queries_per_step();
  std::uint64_t n = 0;  // entries per group at the end of the run
  for (std::uint32_t i = 0; i < n_req; ++i) n += specs[i].input_tokens + o.steps;

  auto counting = MakeCountingBackend();
  const TpRun home = RunTp(o, model, wl, sp, specs, TpAttention::kAtHome, *counting);
  const TpRun buffered = RunTp(o, model, wl, sp, specs, TpAttention::kLocalBuffer, *counting);

  // --- UlaCache DP (counting backend): exclusive tiers, request i on rank i mod P ---
  AddressSpaceConfig dc;
  dc.num_ranks = p;
  dc.num_groups = groups;
  dc.entry_bytes = entry;
  std::vector<std::uint64_t> per_rank(p, 0);
  for (std::uint32_t i = 0; i < n_req; ++i) per_rank[i % p] += specs[i].input_tokens + o.steps;
  const std::uint64_t dp_rank_max = *std::max_element(per_rank.begin(), per_rank.end());
  dc.device_bytes_per_rank = (dp_rank_max / 2 + 1) * entry * groups;  // half on device, half on host
  dc.host_bytes_per_rank = (dp_rank_max / 2 + 1) * entry * groups;
  auto dp = OrDie(AddressSpace::Create(dc, *counting), "DP space");
  for (std::uint32_t i = 0; i < n_req; ++i) {
    (void)dp->AddRequest(RequestId(i), Rank(static_cast<std::uint16_t>(i % p)));
    (void)OrDie(dp->Allocate(RequestId(i), specs[i].input_tokens + o.steps), "DP allocate");
  }
  std::uint64_t dp_physical = 0;
  for (std::uint32_t r = 0; r < p; ++r) {
    for (std::uint32_t g = 0; g < groups; ++g) {
      dp_physical += dp->NumUsed(Rank(static_cast<std::uint16_t>(r)), GroupId(static_cast<std::uint16_t>(g)), Tier::kDevice) +
                     dp->NumUsed(Rank(static_cast<std::uint16_t>(r)), GroupId(static_cast<std::uint16_t>(g)), Tier::kHost);
    }
  }
  const std::uint64_t dp_distinct = dp->num_live_addresses() * groups;
  dp.reset();

  const std::uint64_t ng = n * groups, hs = std::uint64_t{n_req} * o.hisparse_buffer * groups;
  std::vector<Row> rows = {
      {"all_gpu", "tp", "", p * ng, ng},
      {"hisparse", "tp", "", p * (ng + hs), ng},
      {"ulacache", "tp", std::string(TpAttentionName(TpAttention::kLocalBuffer)), buffered.physical, buffered.distinct},
      {"ulacache_home", "tp", std::string(TpAttentionName(TpAttention::kAtHome)), home.physical, home.distinct},
      {"all_gpu", "dp", "", ng, ng},
      {"hisparse", "dp", "", ng + hs, ng},
      {"ulacache", "dp", "", dp_physical, dp_distinct}};
  const StepStats& m = buffered.measured;
  const double hit_rate =
      m.buffer_hits + m.remote_fetches == 0 ? 0 : double(m.buffer_hits) / double(m.buffer_hits + m.remote_fetches);
  const std::uint32_t measured_steps = o.steps > 1 ? o.steps - 1 : 1;
  const double fetch_per_step = double(buffered.remote_bytes) / measured_steps;
  // Attention at home: per query token and layer pass, each rank receives the other ranks'
  // absorbed queries (bf16) and sends its partial records of the heads other ranks own
  // (float32, partial_attention.h). Layer passes per step: layers_per_group per group (the
  // basis of the group entry, so that both strategies count the same layers).
  const double others = double(p - 1) / p;
  const double query_bytes = others * model.attention_heads * (model.kv_lora_rank + model.qk_rope_head_dim) * 2.0;
  const double partial_bytes = others * model.attention_heads * (model.kv_lora_rank + 2) * 4.0;
  const double query_tokens = double(n_req) * queries;
  const double layer_passes = double(groups) * model.layers_per_group;
  const double exchange_per_rank = query_tokens * layer_passes * (query_bytes + partial_bytes);
  // KV entries each rank's attention reads per step (per group, summed over groups).
  const double home_reads = double(home.measured.hits + home.measured.misses) / p / measured_steps;
  const double buffered_reads = double(m.distinct) / p / measured_steps;
  const std::uint64_t buffer_slots = BufferSlots(o, model, wl, n_req);

  if (o.json) {
    nlohmann::json j;
    j["systems"] = nlohmann::json::array();
    for (const Row& r : rows) {
      nlohmann::json row{{"system", r.system}, {"mode", r.mode}, {"ranks", p}, {"physical_entries", r.physical},
                         {"distinct_entries", r.distinct},
                         {"distinct_fraction", r.physical ? double(r.distinct) / double(r.physical) : 0.0}};
      if (!r.attention.empty()) row["tp_attention"] = r.attention;
      j["systems"].push_back(row);
    }
    j["scenario"] = {{"model", model.name}, {"workload", wl.name}, {"requests", n_req}, {"groups", groups},
                     {"entry_bytes", entry}, {"queries_per_step", queries}, {"steps", o.steps},
                     {"local_buffer_slots_per_rank_per_group", buffer_slots},
                     {"selection_fit", scenario.selection_fit}};
    j["tp"] = {{"local_buffer_hit_rate", hit_rate},
               {"remote_bytes_per_step_all_ranks", fetch_per_step},
               {"remote_bytes_per_step_per_rank", fetch_per_step / p},
               {"remote_fetches", m.remote_fetches},
               {"buffer_hits", m.buffer_hits},
               {"selections", buffered.selections},
               {"at_home_exchange_bytes_per_step_per_rank", exchange_per_rank},
               {"at_home_query_bytes_per_token_layer", query_bytes},
               {"at_home_partial_bytes_per_token_layer", partial_bytes},
               {"at_home_kv_reads_per_step_per_rank", home_reads},
               {"local_buffer_kv_reads_per_step_per_rank", buffered_reads},
               {"at_home_remote_fetches", home.measured.remote_fetches}};
    fmt::print("{}\n", j.dump());
    return 0;
  }
  fmt::print("ula bench dup: model {} workload {}: {} requests, {} groups of {} B, {} queries/step, {} ranks, {} steps\n",
             model.name, wl.name, n_req, groups, entry, queries, p, o.steps);
  fmt::print("selection model: configs/selection/{}.json (the default scenario's fit)\n", scenario.selection_fit);
  fmt::print("{:<14} {:<4} {:>16} {:>16} {:>9}\n", "system", "mode", "physical", "distinct", "fraction");
  for (const Row& r : rows) {
    fmt::print("{:<14} {:<4} {:>16} {:>16} {:>9.4f}\n", r.system, r.mode, r.physical, r.distinct,
               double(r.distinct) / double(r.physical));
  }
  fmt::print("TP ulacache: local buffers of {} slots per rank per group ({:.2f} x one step's remote working set); "
             "ulacache_home: attention at home, no buffer\n", buffer_slots, o.buffer_factor);
  fmt::print("TP traffic per step and rank (steps 2..{}):\n", o.steps);
  fmt::print("  local buffer: hit rate {:.4f}; KV fetched from other ranks {:.1f} MB ({:.1f} MB all ranks); "
             "KV entries read by attention {:.0f}\n", hit_rate, fetch_per_step / p / 1e6, fetch_per_step / 1e6,
             buffered_reads);
  fmt::print("  at home:      queries all-gathered + partials exchanged {:.1f} MB ({:.0f} + {:.0f} B per query token "
             "and layer); KV fetched 0 B; KV entries read by attention {:.0f}\n", exchange_per_rank / 1e6, query_bytes,
             partial_bytes, home_reads);
  fmt::print("  at home / local buffer traffic: {:.3f}\n", fetch_per_step > 0 ? exchange_per_rank / (fetch_per_step / p) : 0.0);
  return 0;
}

Action SetupDup(CLI::App& app) {
  auto o = std::make_shared<DupOptions>();
  app.add_option("--config-dir", o->config_dir, "configs directory (default: $ULA_CONFIG_DIR or the source tree's)");
  app.add_option("--model", o->model, "model config")->capture_default_str();
  app.add_option("--workload", o->workload, "workload config")->capture_default_str();
  app.add_option("--ranks", o->ranks, "ranks")->capture_default_str()->check(IntIn(1, 1024));
  auto* requests = app.add_option("--requests", o->requests,
                                  "resident requests (the first ones of the workload; a sharing workload: requests "
                                  "taken, all when not given)")
                       ->capture_default_str()
                       ->check(IntIn(1, 1 << 20));
  app.add_option("--steps", o->steps, "decode steps (the first warms the local buffers)")->capture_default_str()
      ->check(IntIn(1, 1000000));
  app.add_option("--buffer-factor", o->buffer_factor, "TP local buffer / one step's remote working set")
      ->capture_default_str()
      ->check(RealIn(1, 1000));
  app.add_option("--hisparse-buffer", o->hisparse_buffer, "HiSparse device slots per request")->capture_default_str()
      ->check(IntIn(1, 1 << 30));
  app.add_flag("--json", o->json, "print one JSON object");
  return [o, requests]() -> int {
    if (o->ranks == 0 || o->requests == 0 || o->steps == 0 || o->buffer_factor < 1.0) {
      fmt::print(stderr, "ula bench dup: --ranks, --requests, --steps must be > 0 and --buffer-factor >= 1\n");
      return 2;
    }
    // A sharing workload (configs/workloads with "sharing"): bench_dup_shared.h.
    const std::filesystem::path dir = o->config_dir.empty() ? DefaultConfigDir() : std::filesystem::path(o->config_dir);
    if (OrDie(IsSharedWorkload(o->workload, dir), "workload")) {
      return RunDupShared(SharedDupOptions{o->config_dir, o->model, o->workload, o->ranks,
                                           requests->count() > 0 ? o->requests : 0, o->steps, o->hisparse_buffer,
                                           o->buffer_factor, o->json});
    }
    return RunDup(*o);
  };
}

ULA_REGISTER_COMMAND(bench_dup, "bench", "dup", "distinct vs physical KV entries: all-GPU, HiSparse, UlaCache; TP and DP",
                     SetupDup);

}  // namespace
}  // namespace ula::cli
