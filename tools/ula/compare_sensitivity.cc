// `ula compare --sensitivity` (compare_sensitivity.h).
#include "compare_sensitivity.h"

#include <fmt/format.h>

#include <chrono>
#include <algorithm>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace ula::cli {
namespace {

struct Variant {
  std::string constant;  // what moves
  std::string value;     // to what
  std::function<void(CostModelInputs&)> reprice;  // set: re-price the base run
  std::function<void(ScenarioConfig&)> rerun;     // set: run the comparison again
};

std::vector<Variant> Variants() {
  std::vector<Variant> v;
  auto scale_rate = [](double f) { return [f](CostModelInputs& in) { in.rates.sparse_decode_flops *= f; }; };
  v.push_back({"sparse decode kernel rate", "x0.5", scale_rate(0.5), {}});
  v.push_back({"sparse decode kernel rate", "x1.5", scale_rate(1.5), {}});
  // The FP8 decode kernel pads <= 64 heads to 64 on every GPU; 128 is SM100's BF16 prefill
  // padding, run here as the reading that would double every attention term.
  v.push_back({"decode head padding", "128 instead of 64", [](CostModelInputs& in) {
                 in.rates.sparse_decode_head_multiple = std::max<std::uint32_t>(in.rates.sparse_decode_head_multiple, 128);
               }, {}});
  auto pcie = [](double r) { return [r](CostModelInputs& in) { in.rates.host_link_scattered_bytes_per_s = r; }; };
  v.push_back({"scattered-row PCIe rate", "25 GB/s", pcie(25e9), {}});
  v.push_back({"scattered-row PCIe rate", "55 GB/s", pcie(55e9), {}});
  auto latency = [](double f) {
    return [f](CostModelInputs& in) {
      in.rates.collective_base_latency_s *= f;
      in.rates.collective_hop_latency_s *= f;
    };
  };
  v.push_back({"collective latency", "x0.25", latency(0.25), {}});
  v.push_back({"collective latency", "x2", latency(2), {}});
  auto planner = [](double f) { return [f](CostModelInputs& in) { in.rates.planner_s_per_selection *= f; }; };
  v.push_back({"planner time per selection", "x0.25", planner(0.25), {}});
  v.push_back({"planner time per selection", "x4", planner(4), {}});
  auto launch = [](double f) { return [f](CostModelInputs& in) { in.rates.kernel_launch_s *= f; }; };
  v.push_back({"kernel launch (planner, swap-in)", "x0.5", launch(0.5), {}});
  v.push_back({"kernel launch (planner, swap-in)", "x2", launch(2), {}});
  // GEMMs at their achieved rates (configs/costs/<hardware>.json): the roofline and a
  // slower read; the experts' grouped GEMMs at the FP8 peak instead of DeepGEMM's achieved rate.
  auto gemm_eff = [](double e) { return [e](CostModelInputs& in) { in.rates.gemm_hbm_efficiency = e; }; };
  v.push_back({"GEMM weight-read efficiency", "1.0 (HBM peak)", gemm_eff(1.0), {}});
  v.push_back({"GEMM weight-read efficiency", "0.5", gemm_eff(0.5), {}});
  v.push_back({"grouped GEMM rate (routed experts)", "the FP8 peak", [](CostModelInputs& in) {
                 in.rates.grouped_gemm_flops = 0;
               }, {}});
  auto acceptance = [](double a) {
    return [a](ScenarioConfig& s) {
      s.mtp_acceptance_rate = a;
      std::erase_if(s.configs, [](const ScenarioEntry& e) { return !e.mtp; });  // MTP off does not draft
    };
  };
  v.push_back({"MTP acceptance", "0.6", {}, acceptance(0.6)});
  v.push_back({"MTP acceptance", "0.8", {}, acceptance(0.8)});
  auto reserve = [](double r) { return [r](ScenarioConfig& s) { s.activation_reserve_fraction = r; }; };
  v.push_back({"activation reserve", "5 % of HBM", {}, reserve(0.05)});
  v.push_back({"activation reserve", "20 % of HBM", {}, reserve(0.20)});
  v.push_back({"HiSparse host_to_device_ratio", "2 (SGLang's default) instead of the host budget", {},
               [](ScenarioConfig& s) {
                 s.hisparse_match_host_budget = false;
                 s.hisparse_host_to_device_ratio = 2;
               }});
  v.push_back({"SGLang HiSparse swap-in", "synchronous, every layer (no shared-index prefetch)", {},
               [](ScenarioConfig& s) { s.hisparse_shared_index_prefetch = false; }});
  auto window = [](std::uint32_t batches, std::uint32_t tokens) {
    return [batches, tokens](ScenarioConfig& s) {
      s.vllm_max_concurrent_batches = batches;
      s.vllm_max_num_batched_tokens = tokens;
    };
  };
  v.push_back({"vLLM HiSparse admission window", "8192 tokens (synchronous scheduling: one batch in flight)", {},
               window(1, 8192)});
  v.push_back({"vLLM HiSparse admission window", "128 tokens (the tail only)", {}, window(1, 128)});
  // Locality: the share of each step's selections that are new (1 - keep)
  // and how far back the returning ones come from; the fit's values are the base.
  auto keep = [](double k) {
    return [k](ScenarioConfig& s) { s.selection_adjust = [k](SelectionModelParams& p) { p.keep_mean = k; }; };
  };
  v.push_back({"selection locality: new per step", "40 % (keep 0.60)", {}, keep(0.60)});
  v.push_back({"selection locality: new per step", "3 % (keep 0.97)", {}, keep(0.97)});
  auto returns = [](double fraction, std::uint32_t window) {
    return [fraction, window](ScenarioConfig& s) {
      s.selection_adjust = [fraction, window](SelectionModelParams& p) {
        p.return_fraction = fraction;
        p.return_window = window;
      };
    };
  };
  v.push_back({"selection locality: reuse", "no returns (return_fraction 0)", {}, returns(0.0, 8)});
  v.push_back({"selection locality: reuse", "returns from 32 steps back (window 32)", {}, returns(0.578, 32)});
  return v;
}

std::optional<double> PeakOf(const ConfigResult& c, SystemKind k) {
  const SystemResult* s = c.Find(k);
  if (s == nullptr) return std::nullopt;
  return s->peak_tput;
}

std::string RatioText(std::optional<double> a, std::optional<double> b) {
  if (!a || !b) return "-";
  if (*b > 0) return fmt::format("{:.2f}", *a / *b);
  return *a > 0 ? "inf" : "-";  // "-": neither admits a request
}

std::string ConfigLabel(const ConfigResult& c) {
  return fmt::format("{} {} mtp={}", c.hardware_label, ParallelModeName(c.entry.mode), c.entry.mtp ? "on" : "off");
}

void PrintRows(std::string_view constant, std::string_view value, const ComparisonResult& r) {
  for (const ConfigResult& c : r.configs) {
    std::string adm;
    for (SystemKind k : kAllSystems) {
      const SystemResult* s = c.Find(k);
      adm += (adm.empty() ? "" : " / ") + (s == nullptr ? std::string("-") : fmt::format("{}", s->admitted));
    }
    const auto u = PeakOf(c, SystemKind::kUlaCache);
    // UlaCache's best in this mode (at home in TP) against the best of what engines run today.
    const auto best = c.entry.mode == ParallelMode::kTp ? PeakOf(c, SystemKind::kUlaCacheAtHome) : u;
    // Only engines that ship for this config (configs/systems/availability.json).
    std::optional<double> engines;
    if (const SystemResult* e = c.BestShippingEngine()) engines = e->peak_tput;
    fmt::print("| {} | {} | {} | {} | {:.0f} | {} | {} | {} | {} | {} |\n", constant, value, ConfigLabel(c), adm,
               u.value_or(0), RatioText(u, PeakOf(c, SystemKind::kAllGpu)), RatioText(u, PeakOf(c, SystemKind::kHiSparse)),
               RatioText(PeakOf(c, SystemKind::kUlaCacheAtHome), u), RatioText(PeakOf(c, SystemKind::kUlaCacheAtHome),
                                                                               PeakOf(c, SystemKind::kDcp)),
               RatioText(best, engines));
  }
}

}  // namespace

int RunCompareSensitivity(const ScenarioConfig& scenario, const CompareOptions& options) {
  const auto start = std::chrono::steady_clock::now();
  auto progress = [&](std::string_view line) {
    if (options.progress) options.progress(line);
  };
  CompareOptions quiet = options;
  quiet.progress = nullptr;
  progress("sensitivity: base run");
  auto base = RunComparison(scenario, quiet);
  if (!base) {
    fmt::print(stderr, "ula compare --sensitivity: {}\n", base.error().ToString());
    return 1;
  }
  std::string names;
  for (SystemKind k : kAllSystems) names += (names.empty() ? "" : " / ") + std::string(SystemName(k));
  fmt::print("| constant | value | config | admitted ({}) | ulacache peak tok/s | ulacache / all_gpu | ulacache / "
             "hisparse | home / ulacache | home / dcp | best ula / best engine |\n",
             names);
  fmt::print("| --- | --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |\n");
  PrintRows("(base)", "configs as checked in", *base);
  for (const Variant& v : Variants()) {
    progress(fmt::format("sensitivity: {} {}", v.constant, v.value));
    Result<ComparisonResult> r = std::unexpected(Error(ErrorCode::kInternal, "no variant"));
    if (v.reprice) {
      r = RepriceComparison(*base, v.reprice);
    } else {
      ScenarioConfig s = scenario;
      v.rerun(s);
      r = RunComparison(s, quiet);
    }
    if (!r) {
      fmt::print(stderr, "ula compare --sensitivity: {} {}: {}\n", v.constant, v.value, r.error().ToString());
      return 1;
    }
    PrintRows(v.constant, v.value, *r);
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  fmt::print("\nadmitted: requests decoding at once; ratios of peak throughput. Re-priced rows keep the base run's "
             "admission limits and hit rates; MTP-acceptance, activation-reserve, HiSparse-ratio, admission-window and locality rows are new runs; best ula = ulacache_home in TP, "
             "ulacache in DP; best engine = the highest peak of the engines that ship for the config "
             "(configs/systems/availability.json: hypothetical systems are left out). {:.1f} s\n",
             secs);
  return 0;
}

}  // namespace ula::cli
