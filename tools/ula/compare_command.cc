// `ula compare [--scenario FILE] [--json] [--out DIR] [--sensitivity]`: the serving comparison,
// the main job. Prints the memory budget derivation and progress to stderr, the table (or
// one JSON object with --json) to stdout, writes DIR/compare.csv (every curve point) and
// DIR/summary.csv, and calls scripts/plot_compare.py for one PNG per config. Without
// python3 or matplotlib it warns and keeps the CSVs. A sharing workload
// adds a second table, a "sharing" object per system in the JSON and DIR/sharing.csv.
// `--model M` names the model: the scenario's own (GLM-5 for the default) runs as above; a
// model with layer kinds and a configs/kinds/M.json runs the per-kind comparison instead
// (compare_kinds.h).
#include <fmt/format.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <nlohmann/json.hpp>
#include <string>

#include "command_registry.h"
#include "compare_kinds.h"
#include "compare_sensitivity.h"
#include "config/model_config.h"
#include "serving/serving_sim.h"

namespace ula::cli {
namespace {

struct CompareCliOptions {
  std::string scenario;
  std::string model;  // empty: the scenario's model
  std::string config_dir;
  std::string out = "compare-out";
  bool json = false;
  bool plot = true;
  bool quiet = false;
  bool sensitivity = false;
  std::string shadows = "off";  // UlaCache host shadows, DP and TP (CompareOptions::host_shadows)
};

std::string Ratio(std::optional<double> a, std::optional<double> b) {
  if (!a || !b) return "-";
  return *b > 0 ? fmt::format("{:.2f}x", *a / *b) : "inf";
}

std::string ConfigName(const ConfigResult& c) {
  return fmt::format("{} {} mtp={}", c.hardware_label, ParallelModeName(c.entry.mode), c.entry.mtp ? "on" : "off");
}

std::string FileStem(const ConfigResult& c) {
  return fmt::format("{}_{}_mtp{}", c.entry.hardware, ParallelModeName(c.entry.mode), c.entry.mtp ? "on" : "off");
}

nlohmann::json ToJson(const ComparisonResult& r) {
  nlohmann::json configs = nlohmann::json::array();
  for (const ConfigResult& c : r.configs) {
    nlohmann::json systems = nlohmann::json::object();
    for (const SystemResult& s : c.systems) {
      nlohmann::json curve = nlohmann::json::array();
      nlohmann::json detail = nlohmann::json::array();
      for (const CurvePoint& p : s.curve) {
        curve.push_back({p.batch, p.tput});
        detail.push_back({{"batch", p.batch},           {"mean_batch", p.mean_batch}, {"tput", p.tput},
                          {"step_ms", p.step_ms},       {"hit_rate", p.hit_rate},     {"h2d_gb", p.h2d_gb},
                          {"d2h_gb", p.d2h_gb},         {"nvlink_gb", p.nvlink_gb},   {"gpu_ms", 1e3 * p.time.gpu},
                          {"transfer_exposed_ms", 1e3 * p.time.transfer_exposed},
                          {"arriving_gb", p.arriving_gb},     {"arriving_ms", 1e3 * p.time.arriving},
                          {"collectives_ms", 1e3 * p.time.collectives}});
      }
      systems[std::string(SystemName(s.system))] = {{"admitted", s.admitted},     {"peak_tput", s.peak_tput},
                                                    {"peak_batch", s.peak_batch}, {"tpot_b1_ms", s.tpot_b1_ms},
                                                    {"hit_b1", s.hit_b1},         {"fill", s.fill},
                                                    {"curve", curve},             {"points", detail},
                                                    {"note", s.note},             {"engine", s.engine},
                                                    {"ships", s.ships},           {"why_not", s.why_not},
                                                    {"device_budget_bytes_per_gpu", s.device_budget_bytes},
                                                    {"host_budget_bytes_per_gpu", s.host_budget_bytes}};
      if (s.sharing.on) {
        const SharingResult& h = s.sharing;
        systems[std::string(SystemName(s.system))]["sharing"] = {
            {"distinct_fraction", h.distinct_fraction},   {"copies_per_node", h.copies_per_node},
            {"prefill_saved_at_limit", h.prefill_saved_at_limit}, {"input_tokens_at_limit", h.input_tokens_at_limit},
            {"max_rank_load", h.max_rank_load},           {"prefill_saved", h.prefill_saved},
            {"prefill_computed", h.prefill_computed},     {"recomputed", h.recomputed},
            {"evictions", h.evictions}};
      }
    }
    configs.push_back({{"hardware", c.hardware_label},
                       {"mode", std::string(ParallelModeName(c.entry.mode))},
                       {"mtp", c.entry.mtp},
                       {"device_kv_bytes_per_gpu", c.budget.device_kv_bytes},
                       {"host_bytes_per_gpu", c.budget.host_bytes},
                       {"weight_bytes_per_gpu", c.budget.weight_bytes},
                       {"seconds", c.seconds},
                       {"systems", systems}});
  }
  return {{"scenario", r.scenario}, {"model", r.model}, {"configs", configs}};
}

bool IsSharing(const ComparisonResult& r) {
  return !r.configs.empty() && !r.configs.front().systems.empty() && r.configs.front().systems.front().sharing.on;
}

double Percent(std::uint64_t part, std::uint64_t whole) { return whole > 0 ? 100.0 * double(part) / double(whole) : 0; }

// Sharing workloads: one line per config and system.
void PrintSharingTable(const ComparisonResult& r) {
  fmt::print("\nshared prefixes: {:<20} {:<14} | {:>5} {:>9} {:>6} | {:>8} {:>6} {:>8} | {:>8} {:>8} {:>9} {:>6} | {:>5}\n",
             "config", "system", "adm", "peak", "@B", "distinct", "copies", "saved@adm", "saved", "computed", "recomputed",
             "evict", "load");
  for (const ConfigResult& c : r.configs) {
    for (const SystemResult& s : c.systems) {
      const SharingResult& h = s.sharing;
      fmt::print("                 {:<20} {:<14} | {:>5} {:>9.0f} {:>6} | {:>8.3f} {:>6} {:>8.1f}% | {:>7.1f}% {:>8.3g} {:>9.3g} "
                 "{:>6} | {:>5.2f}\n",
                 ConfigName(c), SystemName(s.system), s.admitted, s.peak_tput, s.peak_batch, h.distinct_fraction,
                 h.copies_per_node, Percent(h.prefill_saved_at_limit, h.input_tokens_at_limit),
                 Percent(h.prefill_saved, h.prefill_saved + h.prefill_computed), double(h.prefill_computed),
                 double(h.recomputed), h.evictions, h.max_rank_load);
    }
  }
  fmt::print("distinct = distinct stored entries / entries the admitted requests' histories name (at the admission limit; "
             "a prefix once per holder: TP the node, DP its rank); copies = copies of each in the node (TP baselines: one "
             "per GPU); saved@adm = input tokens of the admitted requests whose prefill the radix cache skips; saved, "
             "computed, recomputed = over the decode simulation: prefill skipped (% of input), tokens prefilled, and of "
             "those prefix tokens prefilled before (evicted, or cached on another rank); evict = idle prefixes dropped for "
             "room; load = DP requests on the fullest rank / the mean at the admission limit (routing by prefix)\n");
}

// The system UlaCache is measured against in a config: attention at home in TP, UlaCache in DP.
SystemKind UlaRef(const ConfigResult& c) {
  return c.entry.mode == ParallelMode::kTp ? SystemKind::kUlaCacheAtHome : SystemKind::kUlaCache;
}

const CurvePoint* PointAt(const SystemResult& s, std::uint32_t batch) {
  for (const CurvePoint& p : s.curve) {
    if (p.batch == batch) return &p;
  }
  return nullptr;
}

const CurvePoint* PeakPoint(const SystemResult& s) { return PointAt(s, s.peak_batch); }

// Per config: the best engine that ships against UlaCache's best, and the systems left out
// of the ranking as hypothetical (configs/systems/availability.json).
void PrintRanking(const ComparisonResult& r) {
  fmt::print("\nranking: UlaCache against the best engine that ships for each config\n");
  for (const ConfigResult& c : r.configs) {
    const SystemResult* ref = c.Find(UlaRef(c));
    const SystemResult* best = c.BestShippingEngine();
    fmt::print("{:<20} {:<14} {:>9.0f} | best shipping engine {:<14} {:>9.0f} ({}) | {:>6}\n", ConfigName(c),
               SystemName(UlaRef(c)), ref ? ref->peak_tput : 0.0, best ? SystemName(best->system) : "-",
               best ? best->peak_tput : 0.0, best ? best->engine : "-",
               ref && best ? Ratio(ref->peak_tput, best->peak_tput) : "-");
    for (const SystemResult& s : c.systems) {
      if (!s.ships) {
        fmt::print("  hypothetical: {} ({}, peak {:.0f}): {}\n", SystemName(s.system), s.engine, s.peak_tput, s.why_not);
      }
    }
  }
}

void PrintTable(const ComparisonResult& r) {
  fmt::print("\nula compare: scenario {}, model {} (throughput = output tokens/s of the 8-GPU node)\n", r.scenario, r.model);
  fmt::print("{:<20} {:<14} {:<5} | {:>5} {:>5} {:>9} {:>5} {:>8} | {:>5} {:>5} {:>7} {:>7} {:>7} | {:>8}\n", "config",
             "system", "ships", "adm", "fill", "peak", "@B", "tpot1", "hit1", "hit@B", "host@B", "pfkv@B", "pfms@B",
             "vs ula");
  for (const ConfigResult& c : r.configs) {
    const SystemResult* ref = c.Find(UlaRef(c));
    for (const SystemResult& s : c.systems) {
      const CurvePoint* at = PeakPoint(s);
      fmt::print("{:<20} {:<14} {:<5} | {:>5} {:>5.2f} {:>9.0f} {:>5} {:>8.2f} | {:>5.3f} {:>5.3f} {:>7.3f} {:>7.3f} {:>7.3f} | "
                 "{:>8}\n",
                 ConfigName(c), SystemName(s.system), s.proposed ? "ours" : s.ships ? "yes" : "hyp", s.admitted, s.fill,
                 s.peak_tput, s.peak_batch, s.tpot_b1_ms, s.hit_b1, at ? at->hit_rate : 0.0,
                 at ? at->h2d_gb + at->d2h_gb : 0.0, at ? at->arriving_gb : 0.0, at ? 1e3 * at->time.arriving : 0.0,
                 ref ? Ratio(ref->peak_tput, s.peak_tput) : "-");
    }
  }
  fmt::print("adm = requests decoding at once (admission limit); fill = the admitted requests' KV + index-key bytes / "
             "the memory the system may use for KV on all GPUs (device, plus host with a host tier); peak = tokens/s; "
             "@B = batch at peak; tpot1 = TPOT at batch 1 (ms); hit1, hit@B = distinct selections already on the "
             "attending GPU's device at batch 1 and at the peak batch (HiSparse: its per-request buffer; context "
             "parallel and all_gpu: 1); host@B = GB over the host link per step per GPU at the peak batch (fetches and write-backs); "
             "pfkv@B, pfms@B = prefill KV arriving per step per GPU at the peak batch (GB) and its host-link time (ms; "
             "disaggregated serving: one prompt's KV per mean output length, at the link's bulk rate); vs ula = "
             "peak of ulacache_home (TP) / ulacache (DP) over this system's; ships = yes: its engine ships it for this "
             "config, hyp: hypothetical (simulated, not shipped: out of the ranking), ours: UlaCache "
             "(configs/systems/availability.json)\n");
  fmt::print("ulacache_home = UlaCache TP with attention at home; dcp = decode context parallel as vLLM runs it (index "
             "keys sharded, global top-k merge), dcp_sglang = as SGLang runs it (index keys replicated); helix = "
             "TensorRT-LLM Helix; vllm_hisparse = vLLM's HiSparse port; trtllm_offload = TensorRT-LLM's sparse KV cache offload (a "
             "per-request GPU cache of 2 x one step's selections, the history on host); hisparse = SGLang HiSparse (its DP rows: DP "
             "attention, as SGLang's published HiSparse runs deploy it); TP-only systems have no DP rows\n");
  for (const ConfigResult& c : r.configs) {
    for (const SystemResult& s : c.systems) {
      if (!s.note.empty()) fmt::print("note: {} {}: {}\n", ConfigName(c), SystemName(s.system), s.note);
    }
  }
  PrintRanking(r);
}

// What UlaCache adds to DCP: ulacache_home is DCP's placement (token
// striping, attention at home, the striped indexer = vLLM's sharded keys) plus a host tier,
// one pool shared by all requests under PB-LRU, and shared prefixes stored once; dcp is vLLM's
// DCP, dcp_sglang SGLang's (replicated index keys). At the largest batch both ran, the step's
// terms side by side.
void PrintOverDcp(const ComparisonResult& r) {
  fmt::print("\nwhat UlaCache adds to DCP (TP configs): ulacache_home against dcp\n");
  fmt::print("{:<20} | {:>5} {:>5} {:>6} | {:>9} {:>9} {:>6} | {:>5} | {:>8} {:>8} {:>8} {:>8} {:>8} | {:>7} | {:>8}\n",
             "config", "adm", "dcp", "x", "peak", "dcp", "x", "@B", "step", "dcp", "planner", "exposed", "coll", "host",
             "sglang");
  for (const ConfigResult& c : r.configs) {
    const SystemResult* home = c.Find(SystemKind::kUlaCacheAtHome);
    const SystemResult* dcp = c.Find(SystemKind::kDcp);
    const SystemResult* sgl = c.Find(SystemKind::kDcpSglang);
    if (home == nullptr || dcp == nullptr) continue;
    // The largest batch both curves measured.
    const CurvePoint* a = nullptr;
    const CurvePoint* b = nullptr;
    for (const CurvePoint& p : dcp->curve) {
      if (const CurvePoint* q = PointAt(*home, p.batch)) a = q, b = &p;
    }
    const std::uint32_t eq = a ? a->batch : 0;
    const auto ms = [](const CurvePoint* p, double StepTime::*f) { return p ? 1e3 * (p->time.*f) : 0.0; };
    fmt::print("{:<20} | {:>5} {:>5} {:>6} | {:>9.0f} {:>9.0f} {:>6} | {:>5} | {:>8.2f} {:>8.2f} {:>8.3f} {:>8.3f} {:>8.3f} | "
               "{:>7.3f} | {:>8}\n",
               ConfigName(c), home->admitted, dcp->admitted, Ratio(double(home->admitted), double(dcp->admitted)),
               home->peak_tput, dcp->peak_tput, Ratio(home->peak_tput, dcp->peak_tput), eq, a ? a->step_ms : 0.0,
               b ? b->step_ms : 0.0, ms(a, &StepTime::planner) - ms(b, &StepTime::planner),
               ms(a, &StepTime::transfer_exposed) - ms(b, &StepTime::transfer_exposed),
               ms(a, &StepTime::collectives) - ms(b, &StepTime::collectives), a ? a->h2d_gb + a->d2h_gb : 0.0,
               sgl ? Ratio(sgl->peak_tput, dcp->peak_tput) : "-");
  }
  fmt::print("adm, peak: ulacache_home, dcp and their ratio (what the host tier and the shared PB-LRU pool add); @B = "
             "the largest batch both ran; step = step ms there (ulacache_home, dcp); planner, exposed, coll = "
             "ulacache_home minus dcp at @B (ms): its planner kernels, its exposed host copies, its collectives (its "
             "float32 partials against DCP's bf16 outputs); host = ulacache_home's GB over the host link per step per "
             "GPU at @B (dcp: 0); sglang = dcp_sglang peak / dcp peak (the cost of replicated index keys, which the "
             "striped indexer avoids)\n");
}

Status WriteCsv(const ComparisonResult& r, const std::filesystem::path& out) {
  std::error_code ec;
  std::filesystem::create_directories(out, ec);
  if (ec) return MakeError(ErrorCode::kIo, fmt::format("cannot create '{}': {}", out.string(), ec.message()));
  std::ofstream f(out / "compare.csv");
  std::ofstream s(out / "summary.csv");
  if (!f || !s) return MakeError(ErrorCode::kIo, fmt::format("cannot write CSV files in '{}'", out.string()));
  f << "config,hardware,mode,mtp,system,batch,mean_batch,tput,step_ms,tokens_per_step,hit_rate,h2d_gb,d2h_gb,nvlink_gb,"
       "weights_ms,attention_ms,indexer_ms,gpu_ms,host_link_ms,nvlink_fetch_ms,transfer_exposed_ms,collectives_ms,"
       "overhead_ms,dense_ms,experts_ms,hbm_copies_ms,collective_latency_ms,planner_ms,arriving_gb,arriving_ms\n";
  s << "config,hardware,mode,mtp,system,admitted,peak_tput,peak_batch,tpot_b1_ms,device_kv_gb_per_gpu,host_gb_per_gpu,"
       "fill,hit_b1,ships\n";
  for (const ConfigResult& c : r.configs) {
    for (const SystemResult& sys : c.systems) {
      const std::string head = fmt::format("{},{},{},{},{}", FileStem(c), c.hardware_label, ParallelModeName(c.entry.mode),
                                           c.entry.mtp ? 1 : 0, SystemName(sys.system));
      // The system's own budgets (its placement rules), not the config's.
      s << fmt::format("{},{},{:.1f},{},{:.4f},{:.3f},{:.3f},{:.4f},{:.4f},{}\n", head, sys.admitted, sys.peak_tput,
                       sys.peak_batch, sys.tpot_b1_ms, sys.device_budget_bytes / 1e9, sys.host_budget_bytes / 1e9, sys.fill,
                       sys.hit_b1, sys.proposed ? "ours" : sys.ships ? "yes" : "hyp");
      for (const CurvePoint& p : sys.curve) {
        const StepTime& t = p.time;
        f << fmt::format("{},{},{:.2f},{:.1f},{:.4f},{:.4f},{:.5f},{:.4f},{:.4f},{:.4f},{:.4f},{:.4f},{:.4f},{:.4f},{:.4f},"
                         "{:.4f},{:.4f},{:.4f},{:.4f},{:.4f},{:.4f},{:.4f},{:.4f},{:.4f},{:.4f},{:.4f}\n",
                         head, p.batch, p.mean_batch, p.tput, p.step_ms, p.tokens_per_step, p.hit_rate, p.h2d_gb, p.d2h_gb,
                         p.nvlink_gb, 1e3 * t.weights, 1e3 * t.attention, 1e3 * t.indexer, 1e3 * t.gpu, 1e3 * t.host_link,
                         1e3 * t.nvlink_fetch, 1e3 * t.transfer_exposed, 1e3 * t.collectives, 1e3 * t.overhead,
                         1e3 * t.dense, 1e3 * t.experts, 1e3 * t.hbm_copies, 1e3 * t.collective_latency, 1e3 * t.planner,
                         p.arriving_gb, 1e3 * t.arriving);
      }
    }
  }
  if (!f || !s) return MakeError(ErrorCode::kIo, "CSV write failed");
  if (IsSharing(r)) {
    std::ofstream h(out / "sharing.csv");
    if (!h) return MakeError(ErrorCode::kIo, fmt::format("cannot write '{}'", (out / "sharing.csv").string()));
    h << "config,hardware,mode,mtp,system,admitted,peak_tput,peak_batch,distinct_fraction,copies_per_node,"
         "prefill_saved_at_limit,input_tokens_at_limit,prefill_saved,prefill_computed,recomputed,evictions,max_rank_load\n";
    for (const ConfigResult& c : r.configs) {
      for (const SystemResult& sys : c.systems) {
        const SharingResult& x = sys.sharing;
        h << fmt::format("{},{},{},{},{},{},{:.1f},{},{:.4f},{},{},{},{},{},{},{},{:.3f}\n", FileStem(c), c.hardware_label,
                         ParallelModeName(c.entry.mode), c.entry.mtp ? 1 : 0, SystemName(sys.system), sys.admitted,
                         sys.peak_tput, sys.peak_batch, x.distinct_fraction, x.copies_per_node, x.prefill_saved_at_limit,
                         x.input_tokens_at_limit, x.prefill_saved, x.prefill_computed, x.recomputed, x.evictions,
                         x.max_rank_load);
      }
    }
    if (!h) return MakeError(ErrorCode::kIo, "CSV write failed");
  }
  return Ok();
}

// Runs scripts/plot_compare.py (source tree, next to configs/). Returns false with a warning.
bool Plot(const std::filesystem::path& config_dir, const std::filesystem::path& out) {
  const std::filesystem::path script = config_dir.parent_path() / "scripts" / "plot_compare.py";
  const char* python = "/usr/bin/python3";
  if (!std::filesystem::exists(python)) {
    fmt::print(stderr, "warning: {} not found: no plots (the CSV files are written)\n", python);
    return false;
  }
  if (!std::filesystem::exists(script)) {
    fmt::print(stderr, "warning: {} not found: no plots (the CSV files are written)\n", script.string());
    return false;
  }
  const std::string cmd = fmt::format("'{}' '{}' '{}' '{}'", python, script.string(), (out / "compare.csv").string(), out.string());
  const int rc = std::system(cmd.c_str());
  if (rc != 0) {
    fmt::print(stderr, "warning: the plot script failed (exit {}; is python3-matplotlib installed?): no plots, the CSV "
                       "files are written\n", rc);
    return false;
  }
  return true;
}

int Run(const CompareCliOptions& o) {
  const auto start = std::chrono::steady_clock::now();
  const std::filesystem::path dir = o.config_dir.empty() ? DefaultConfigDir() : std::filesystem::path(o.config_dir);
  const std::filesystem::path scenario_path = o.scenario.empty() ? dir / "scenarios" / "default.json" : std::filesystem::path(o.scenario);
  auto scenario = LoadScenarioConfig(scenario_path, dir);
  if (!scenario) {
    fmt::print(stderr, "ula compare: {}\n", scenario.error().ToString());
    return 2;
  }
  if (!o.model.empty() && o.model != scenario->model) {
    return RunCompareKinds({.model = o.model, .config_dir = dir, .out = o.out, .json = o.json, .sensitivity = o.sensitivity});
  }
  CompareOptions copt;
  copt.config_dir = dir;
  copt.host_shadows = o.shadows == "on";
  if (!o.quiet) {
    copt.progress = [](std::string_view line) {
      fmt::print(stderr, "{}\n", line);
      std::fflush(stderr);
    };
  }
  if (o.sensitivity) return RunCompareSensitivity(*scenario, copt);
  auto result = RunComparison(*scenario, copt);
  if (!result) {
    fmt::print(stderr, "ula compare: {}\n", result.error().ToString());
    return 1;
  }
  if (auto s = WriteCsv(*result, o.out); !s) {
    fmt::print(stderr, "ula compare: {}\n", s.error().ToString());
    return 1;
  }
  const bool plotted = o.plot && Plot(dir, o.out);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (o.json) {
    fmt::print("{}\n", ToJson(*result).dump());
  } else {
    PrintTable(*result);
    PrintOverDcp(*result);
    if (IsSharing(*result)) PrintSharingTable(*result);
    fmt::print("wrote {}/compare.csv{} and {}/summary.csv{}; {:.1f} s\n", o.out,
               IsSharing(*result) ? fmt::format(", {}/sharing.csv", o.out) : "", o.out,
               plotted ? fmt::format(" and one PNG per config in {}", o.out) : "", secs);
  }
  return 0;
}

Action SetupCompare(CLI::App& app) {
  auto o = std::make_shared<CompareCliOptions>();
  app.add_option("--scenario", o->scenario, "scenario JSON (default: configs/scenarios/default.json)");
  app.add_option("--model", o->model,
                 "model (default: the scenario's, glm5); one with layer kinds (deepseek_v4_flash) runs the per-kind "
                 "comparison of configs/kinds/MODEL.json");
  app.add_option("--config-dir", o->config_dir, "configs directory (default: $ULA_CONFIG_DIR or the source tree's)");
  app.add_option("--out", o->out, "directory for compare.csv, summary.csv and the plots")->capture_default_str();
  app.add_flag("--json", o->json, "print one JSON object instead of the table");
  app.add_option("--shadows", o->shadows, "UlaCache (DP and TP): clean host shadows: on or off")
      ->check(CLI::IsMember({"on", "off"}))->capture_default_str();
  app.add_flag("!--no-plot", o->plot, "do not call the plot script");
  app.add_flag("--quiet", o->quiet, "no progress lines on stderr");
  app.add_flag("--sensitivity", o->sensitivity,
               "instead: how admission and peak ratios move over the range of each uncertain constant (markdown table)");
  return [o]() { return Run(*o); };
}

ULA_REGISTER_COMMAND(compare, "", "compare",
                     "serving comparison: UlaCache against all-GPU, SGLang and vLLM HiSparse, TensorRT-LLM's offload, DCP and Helix "
                     "(admission, fill, throughput)",
                     SetupCompare);

}  // namespace
}  // namespace ula::cli
