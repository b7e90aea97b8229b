// `ula bench trace`: the real CPU indexer at small scale next to the calibrated selection
// model (overlap mean and distribution, both side by side), an optional overlap sweep,
// byte-for-byte trace replay of both runs, and attention through UlaCache under memory
// pressure checked bit for bit against the dense reference.
#include <fmt/format.h>

#include <chrono>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cli_checks.h"
#include "command_registry.h"
#include "verify/attention_check.h"
#include "workload/calibration.h"
#include "config/model_config.h"
#include "workload/selection_fit.h"
#include "workload/trace_file.h"

namespace ula::cli {
namespace {

struct TraceOptions {
  std::string config_dir;
  std::string calibration = "indexer_calibration";
  std::string attention_model = "tiny_glm";
  std::string trace_out;
  std::string write_fit;  // configs/selection/<name>.json to write the fit to
  std::vector<double> sweep;
  double heavy_skew = -1;  // < 0: fitted
  double return_fraction = -1;
  std::uint32_t attention_steps = 12;
  bool json = false;
};

nlohmann::json StatsJson(const OverlapStats& s) {
  return {{"count", s.count}, {"mean", s.mean}, {"stddev", s.stddev}, {"min", s.min},      {"p10", s.p10},
          {"p50", s.p50},     {"p90", s.p90},   {"max", s.max},       {"histogram", s.histogram}};
}

nlohmann::json ReuseJson(const ReuseStats& s) {
  nlohmann::json hist = nlohmann::json::object();
  for (std::size_t b = 0; b < ReuseStats::kBins; ++b) hist[ReuseStats::kBinNames[b]] = s.histogram[b];
  return {{"selections", s.selections}, {"reuses", s.reuses},   {"first_uses", s.first_uses},
          {"p50", s.p50},               {"p90", s.p90},         {"p99", s.p99},
          {"mean_gap", s.mean_gap},     {"persistent_share", s.persistent_share},
          {"window", s.window},         {"histogram", hist}};
}

// Encodes, decodes and re-encodes: true iff the bytes are identical and the trace equal.
Result<std::pair<bool, std::size_t>> Replays(const Trace& t) {
  auto a = EncodeTrace(t);
  if (!a) return std::unexpected(a.error());
  auto back = DecodeTrace(*a);
  if (!back) return std::unexpected(back.error());
  auto b = EncodeTrace(*back);
  if (!b) return std::unexpected(b.error());
  return std::make_pair(*a == *b && *back == t, a->size());
}

int Run(const TraceOptions& o) {
  const auto start = std::chrono::steady_clock::now();
  const std::filesystem::path dir = o.config_dir.empty() ? DefaultConfigDir() : std::filesystem::path(o.config_dir);
  auto fail = [](const Error& e) {
    fmt::print(stderr, "ula bench trace: {}\n", e.ToString());
    return 2;
  };
  auto schedule = LoadDecodeSimConfigByName(o.calibration, dir);
  if (!schedule) return fail(schedule.error());
  auto model = LoadModelConfigByName(schedule->model, dir);
  if (!model) return fail(model.error());
  const IndexerShape shape = model->indexer_shape();
  auto cal = CalibrateSelectionModel(shape, *schedule);
  if (!cal) return fail(cal.error());
  if (o.heavy_skew >= 0 || o.return_fraction >= 0) {  // explicit values instead of the fitted ones
    if (o.heavy_skew >= 0) cal->fitted.heavy_skew = o.heavy_skew;
    if (o.return_fraction >= 0) cal->fitted.return_fraction = o.return_fraction;
    auto fitted = FitKeepForOverlap(cal->fitted, *schedule, cal->real.overlap.mean);
    if (!fitted) return fail(fitted.error());
    cal->fitted = *fitted;
    auto run = RunSelectionModel(cal->fitted, *schedule);
    if (!run) return fail(run.error());
    cal->synthetic = std::move(*run);
  }
  auto real_replay = Replays(cal->real.trace);
  if (!real_replay) return fail(real_replay.error());
  auto syn_replay = Replays(cal->synthetic.trace);
  if (!syn_replay) return fail(syn_replay.error());
  if (!o.trace_out.empty()) {
    if (auto st = WriteTraceFile(o.trace_out + ".real", cal->real.trace); !st) return fail(st.error());
    if (auto st = WriteTraceFile(o.trace_out + ".synthetic", cal->synthetic.trace); !st) return fail(st.error());
  }
  if (!o.write_fit.empty()) {  // the one fitted parameter set every consumer reads (selection_fit.h)
    if (o.heavy_skew >= 0 || o.return_fraction >= 0) {
      fmt::print(stderr, "ula bench trace: --write-fit writes the fit: not with --heavy-skew/--return-fraction\n");
      return 2;
    }
    SelectionFit fit;
    fit.name = std::filesystem::path(o.write_fit).stem().string();
    fit.source = fmt::format(
        "`ula bench trace --calibration {} --write-fit configs/selection/{}.json`: the selection model "
        "(drafts chained) fitted to the real CPU indexer on workloads/{}.json (model {}, top-k {}, {} requests x {} "
        "prompt tokens, {} steps, {} queries/step, seed {}); docs/WORKLOADS.md",
        o.calibration, fit.name, o.calibration, schedule->model, shape.top_k, schedule->num_requests,
        schedule->prompt_tokens, schedule->decode_steps, schedule->queries_per_step(), schedule->seed);
    fit.params = cal->fitted;
    std::ofstream out(o.write_fit, std::ios::binary | std::ios::trunc);
    out << SelectionFitJson(fit);
    out.close();
    if (!out) {
      fmt::print(stderr, "ula bench trace: cannot write {}\n", o.write_fit);
      return 2;
    }
  }
  std::vector<std::pair<double, double>> sweep;  // (target, achieved)
  for (double target : o.sweep) {
    auto p = FitKeepForOverlap(cal->fitted, *schedule, target);
    if (!p) return fail(p.error());
    auto run = RunSelectionModel(*p, *schedule, false);
    if (!run) return fail(run.error());
    sweep.emplace_back(target, run->overlap.mean);
  }
  auto amodel = LoadModelConfigByName(o.attention_model, dir);
  if (!amodel) return fail(amodel.error());
  AttentionCheckOptions aopt;
  aopt.model = *amodel;
  aopt.decode_steps = o.attention_steps;
  aopt.seed = schedule->seed;
  auto att = RunAttentionCheckUnderPressure(aopt, 0.5);
  if (!att) return fail(att.error());
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const bool ok = att->ok() && real_replay->first && syn_replay->first;
  const SelectionModelParams& p = cal->fitted;
  if (o.json) {
    nlohmann::json j;
    j["real"] = {{"overlap_mean", cal->real.overlap.mean},
                 {"overlap", StatsJson(cal->real.overlap)},
                 {"draft_overlap_mean", cal->real.draft_overlap.mean},
                 {"draft_chain_overlap_mean", cal->real.draft_chain_overlap.mean},
                 {"union_per_top_k", cal->real.union_per_top_k},
                 {"reuse", ReuseJson(cal->real.reuse)},
                 {"seconds", cal->real.seconds},
                 {"trace_bytes", real_replay->second},
                 {"trace_replays", real_replay->first}};
    j["synthetic"] = {{"overlap_mean", cal->synthetic.overlap.mean},
                      {"overlap", StatsJson(cal->synthetic.overlap)},
                      {"draft_overlap_mean", cal->synthetic.draft_overlap.mean},
                      {"draft_chain_overlap_mean", cal->synthetic.draft_chain_overlap.mean},
                      {"union_per_top_k", cal->synthetic.union_per_top_k},
                      {"reuse", ReuseJson(cal->synthetic.reuse)},
                      {"seconds", cal->synthetic.seconds},
                      {"trace_bytes", syn_replay->second},
                      {"trace_replays", syn_replay->first}};
    j["fitted"] = {{"top_k", p.top_k},         {"sink_tokens", p.sink_tokens}, {"recent_tokens", p.recent_tokens},
                   {"keep_mean", p.keep_mean}, {"keep_stddev", p.keep_stddev}, {"draft_keep", p.draft_keep},
                   {"heavy_skew", p.heavy_skew}, {"return_fraction", p.return_fraction}, {"return_window", p.return_window}};
    j["schedule"] = {{"config", o.calibration},           {"model", schedule->model},
                     {"requests", schedule->num_requests}, {"prompt_tokens", schedule->prompt_tokens},
                     {"decode_steps", schedule->decode_steps}, {"queries_per_step", schedule->queries_per_step()},
                     {"seed", schedule->seed}};
    nlohmann::json sw = nlohmann::json::array();
    for (auto [t, a] : sweep) sw.push_back({{"target", t}, {"overlap_mean", a}});
    j["sweep"] = sw;
    j["attention_checks"] = att->checks;
    j["attention_mismatches"] = att->mismatches;
    j["attention_entries_checked"] = att->entries_checked;
    j["attention_entry_mismatches"] = att->entry_mismatches;
    j["attention_planner_calls"] = att->planner_calls;
    j["attention_planner_calls_with_swaps"] = att->steps_with_swaps;
    j["attention_swaps"] = att->planner.evictions;
    j["seconds"] = seconds;
    j["ok"] = ok;
    fmt::print("{}\n", j.dump());
  } else {
    fmt::print("ula bench trace: {} ({} requests x {} prompt tokens, {} steps, {} queries/step, model {}, top-k {})\n",
               o.calibration, schedule->num_requests, schedule->prompt_tokens, schedule->decode_steps,
               schedule->queries_per_step(), schedule->model, shape.top_k);
    fmt::print("  step-to-step overlap     {:>10} {:>10}\n", "real", "synthetic");
    auto row = [](const char* name, double a, double b) { fmt::print("  {:<24} {:>10.4f} {:>10.4f}\n", name, a, b); };
    const OverlapStats &r = cal->real.overlap, &s = cal->synthetic.overlap;
    row("mean", r.mean, s.mean);
    row("stddev", r.stddev, s.stddev);
    row("p10", r.p10, s.p10);
    row("p50", r.p50, s.p50);
    row("p90", r.p90, s.p90);
    row("draft vs query 0 mean", cal->real.draft_overlap.mean, cal->synthetic.draft_overlap.mean);
    row("draft vs previous mean", cal->real.draft_chain_overlap.mean, cal->synthetic.draft_chain_overlap.mean);
    row("union / top-k", cal->real.union_per_top_k, cal->synthetic.union_per_top_k);
    for (int b = 0; b < 10; ++b) {
      fmt::print("  hist [{:.1f},{:.1f}{}       {:>10} {:>10}\n", b / 10.0, (b + 1) / 10.0, b == 9 ? "]" : ")",
                 r.histogram[b], s.histogram[b]);
    }
    const ReuseStats &ru = cal->real.reuse, &su = cal->synthetic.reuse;
    fmt::print("  reuse distance (steps, step unions)  {:>10} {:>10}\n", "real", "synthetic");
    row("p50", ru.p50, su.p50);
    row("p90", ru.p90, su.p90);
    row("p99", ru.p99, su.p99);
    row("mean gap (distance >= 2)", ru.mean_gap, su.mean_gap);
    row("reuses / selections", ru.selections ? double(ru.reuses) / ru.selections : 0,
        su.selections ? double(su.reuses) / su.selections : 0);
    fmt::print("  {:<24} {:>10.4f} {:>10.4f}\n", fmt::format("persistent (>{}/{} steps)", ru.window / 2, ru.window),
               ru.persistent_share, su.persistent_share);
    for (std::size_t b = 0; b < ReuseStats::kBins; ++b) {
      fmt::print("  reuse hist {:<13} {:>10} {:>10}\n", ReuseStats::kBinNames[b], ru.histogram[b], su.histogram[b]);
    }
    fmt::print("  fitted: sinks {} recent {} keep_mean {:.4f} keep_stddev {:.4f} draft_keep {:.4f} heavy_skew {:.2f} "
               "return_fraction {:.4f} return_window {}\n",
               p.sink_tokens, p.recent_tokens, p.keep_mean, p.keep_stddev, p.draft_keep, p.heavy_skew,
               p.return_fraction, p.return_window);
    fmt::print("  time: real indexer {:.2f} s, selection model {:.3f} s\n", cal->real.seconds, cal->synthetic.seconds);
    fmt::print("  traces: real {} B, synthetic {} B, replay byte-for-byte: {}\n", real_replay->second,
               syn_replay->second, real_replay->first && syn_replay->first ? "yes" : "NO");
    for (auto [t, a] : sweep) fmt::print("  sweep: target overlap {:.2f} -> {:.4f}\n", t, a);
    fmt::print("  attention ({}, device pool 1/2 of live entries): {} checks, {} mismatches; {} entry reads, {} "
               "differ; {} of {} planner calls swapped ({} swaps)\n",
               o.attention_model, att->checks, att->mismatches, att->entries_checked, att->entry_mismatches,
               att->steps_with_swaps, att->planner_calls, att->planner.evictions);
    for (const auto& f : att->first_failures) fmt::print("  FAIL: {}\n", f);
    fmt::print("  total {:.1f} s: {}\n", seconds, ok ? "OK" : "FAILED");
  }
  return ok ? 0 : 1;
}

Action SetupTrace(CLI::App& app) {
  auto o = std::make_shared<TraceOptions>();
  app.add_option("--config-dir", o->config_dir, "configs directory (default: $ULA_CONFIG_DIR or the source tree's)");
  app.add_option("--calibration", o->calibration, "configs/workloads/<name>.json decode schedule")->capture_default_str();
  app.add_option("--attention-model", o->attention_model, "float32 model for the attention check")->capture_default_str();
  app.add_option("--attention-steps", o->attention_steps, "decode steps of the attention check")->capture_default_str()
      ->check(IntIn(0, 100000));
  app.add_option("--sweep", o->sweep, "target overlaps to fit the selection model to (e.g. --sweep 0.3 0.6 0.9)")
      ->check(OpenFraction());
  app.add_option("--heavy-skew", o->heavy_skew, "use this selection-model heavy_skew instead of the fitted one")
      ->check(RealIn(0, 4));
  app.add_option("--return-fraction", o->return_fraction, "use this selection-model return_fraction instead of the fitted one")
      ->check(RealIn(0, 1));
  app.add_option("--trace-out", o->trace_out, "write PATH.real and PATH.synthetic trace files");
  app.add_option("--write-fit", o->write_fit, "write the fitted parameter set as a configs/selection/ file");
  app.add_flag("--json", o->json, "print one JSON object");
  return [o]() { return Run(*o); };
}

ULA_REGISTER_COMMAND(bench_trace, "bench", "trace", "real indexer vs calibrated selection model; traces; attention check",
                     SetupTrace);

}  // namespace
}  // namespace ula::cli
