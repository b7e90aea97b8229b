// `ula compare --model M` for a model with layer kinds (compare_kinds.h).
#include "compare_kinds.h"

#include <fmt/format.h>

#include <cctype>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <vector>

#include "serving/kind_compare.h"

namespace ula::cli {
namespace {

std::string ConfigName(const KindConfigResult& c) {
  return fmt::format("{} {} mtp={}", c.hardware_label, ParallelModeName(c.entry.mode), c.entry.mtp ? "on" : "off");
}
std::string Stem(const ScenarioEntry& e) {
  return fmt::format("{}_{}_mtp{}", e.hardware, ParallelModeName(e.mode), e.mtp ? "on" : "off");
}
double Share(double part, const PoolPlan& p, std::uint32_t ranks) {
  return p.memory_bytes > 0 ? part / (p.memory_bytes * ranks) : 0;
}
std::uint32_t Ranks(const KindConfigResult& c) { return c.num_ranks; }
std::string HardwareLabel(std::string name) {
  for (char& ch : name) ch = static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
  return "8x" + name;  // the starvation sweep runs the scenario's 8-GPU configs
}

const KindCurvePoint* Peak(const KindSystemResult& s) {
  for (const KindCurvePoint& p : s.curve) {
    if (p.batch == s.peak_batch) return &p;
  }
  return nullptr;
}

void PrintTables(const KindComparison& r) {
  fmt::print("\nula compare --model {}: scenario {} (engines: per-kind accounting; ulacache: a run of its space; roofline step; throughput = output tokens/s of the "
             "8-GPU node)\n", r.model, r.scenario);
  const KindTurnover& t = r.turnover;
  fmt::print("selection turnover, measured by the real indexer over workload {} (query_keep {}, {} queries a step, {:.2f} s): "
             "{:.4f} of a query's top-k a step with MTP off, {:.4f} per query with MTP on (the step's union)\n",
             t.workload, t.query_keep, t.queries, t.seconds, t.single, t.per_query);
  fmt::print("{:<20} {:<16} | {:>5} {:<9} | {:>5} {:>6} {:>6} {:>6} {:>6} | {:>9} {:>5} {:>7} {:>8} | {:>7}\n", "config",
             "system", "adm", "binds", "fill", "window", "c4", "c128", "index", "peak", "@B", "tpot1", "host@B", "ula/x");
  for (const KindConfigResult& c : r.configs) {
    const KindSystemResult* ula = c.Find(KindSystem::kUlaCache);
    for (const KindSystemResult& s : c.systems) {
      const Admission& a = s.admission;
      const KindCurvePoint* pk = Peak(s);
      const std::uint32_t P = Ranks(c);
      fmt::print("{:<20} {:<16} | {:>5} {:<9} | {:>5.3f} {:>6.3f} {:>6.3f} {:>6.3f} {:>6.3f} | {:>9.0f} {:>5} {:>7.2f} {:>8.3f} | "
                 "{:>7}\n",
                 ConfigName(c), KindSystemName(s.system), a.admitted, a.binds.empty() ? "-" : a.binds, a.fill,
                 Share(a.held.window, s.plan, P), Share(a.held.csa, s.plan, P), Share(a.held.hca, s.plan, P),
                 Share(a.held.index, s.plan, P), s.peak_tput, s.peak_batch, s.tpot_b1_ms,
                 pk ? pk->host_fetch * 584 / 1e9 : 0.0,
                 ula && s.peak_tput > 0 ? fmt::format("{:.2f}x", ula->peak_tput / s.peak_tput) : "-");
    }
  }
  fmt::print("adm = requests decoding at once; binds = the pool that refused the next request (sglang: full = the full-token "
             "space with its C4 / C128 / index pools, swa = the window pool, c4_device = HiSparse's device C4 pool; blocks = "
             "vLLM's shared pool; device / host / space = the tiers); fill = the admitted requests' bytes (exact entries) / "
             "the system's KV memory on all GPUs (device, + host with a host tier), then the share of that memory each kind "
             "holds; peak = tokens/s at @B; tpot1 = TPOT at batch 1 (ms); host@B = GB of C4 entries fetched from host per "
             "step per GPU at @B; ula/x = ulacache peak / this system's. The engines' admission is their pools' accounting; "
             "ulacache's is a run of its space over frames at the same budget (binds: device = no free frame for the resident "
             "kinds, space = C4 entries past the device share + host)\n");
  for (const KindConfigResult& c : r.configs) {
    fmt::print("pools {}: weights {:.1f} GB/GPU, KV budget {:.1f} GB device + {:.0f} GB host per GPU\n", ConfigName(c),
               c.weight_bytes_per_gpu / 1e9, c.device_kv_bytes_per_gpu / 1e9, c.host_bytes_per_gpu / 1e9);
    for (const KindSystemResult& s : c.systems) {
      if (s.system == KindSystem::kSglang || s.system == KindSystem::kSglangHiSparse) {
        fmt::print("  {:<16} {}; reserved: window {:.1f} GB, c4 {:.1f} GB, c128 {:.2f} GB, index {:.1f} GB, state {:.1f} GB\n",
                   KindSystemName(s.system), s.plan.derivation, s.plan.reserved.window / 1e9, s.plan.reserved.csa / 1e9,
                   s.plan.reserved.hca / 1e9, s.plan.reserved.index / 1e9, s.plan.state_bytes / 1e9);
      }
      if (s.system == KindSystem::kUlaCache && !s.admission.space.empty()) {
        // The space's run: its fullest rank's frames by kind and its C4 entries by tier.
        const Admission& a = s.admission;
        const KindBudget* b = &a.space.front();
        for (const KindBudget& r : a.space) {
          if (r.free_frames < b->free_frames) b = &r;
        }
        std::string kinds;
        for (std::size_t k = 0; k < b->frames_of_kind.size() && k < a.space_kinds.size(); ++k) {
          if (b->frames_of_kind[k] > 0) kinds += fmt::format(" {} {}", a.space_kinds[k], b->frames_of_kind[k]);
        }
        fmt::print("  {:<16} {}; the run's fullest rank: {} frames, of them{}, free (the C4 share) {}: {} C4 slots; C4 entries "
                   "{} on device, {} on host (all ranks: {:.1f} % on host)\n",
                   KindSystemName(s.system), s.plan.derivation, b->frames, kinds, b->free_frames, b->c4_device_slots,
                   b->c4_on_device, b->c4_entries - b->c4_on_device, 100 * a.host_share_csa);
      }
      if (!s.note.empty()) fmt::print("  note {}: {}\n", KindSystemName(s.system), s.note);
    }
  }
  fmt::print("\nwhere the fixed per-kind pools starve: starvation_requests (configs/kinds) requests of one context length "
             "each (input; output the workload's mean), MTP off\n");
  fmt::print("{:<20} {:>7} | {:>6} {:<5} {:>6} {:>6} | {:>6} | {:>6} | {:>7}\n", "config", "context", "sglang", "binds",
             "full%", "swa%", "vllm", "ula", "ula/sgl");
  for (const KindStarvationRow& row : r.starvation) {
    const Admission& sg = row.cells[0].admission;
    fmt::print("{:<20} {:>7} | {:>6} {:<5} {:>6.1f} {:>6.1f} | {:>6} | {:>6} | {:>7}\n",
               fmt::format("{} {}", HardwareLabel(row.entry.hardware), ParallelModeName(row.entry.mode)), row.context, sg.admitted,
               sg.binds.empty() ? "-" : sg.binds, 100 * sg.pool_fill[0], 100 * sg.pool_fill[1], row.cells[1].admission.admitted,
               row.cells[2].admission.admitted,
               sg.admitted > 0 ? fmt::format("{:.2f}x", double(row.cells[2].admission.admitted) / sg.admitted) : "-");
  }
  fmt::print("full%, swa% = SGLang's full-token pool and window (SWA) pool used when it refuses (the fullest GPU); binds = "
             "the one that filled: swa below swa_full_tokens_ratio x context = window + page per request, full above\n");
  fmt::print("\nranking: ulacache against the best engine per config (peak)\n");
  for (const KindConfigResult& c : r.configs) {
    const KindSystemResult* ula = c.Find(KindSystem::kUlaCache);
    const KindSystemResult* best = nullptr;
    for (const KindSystemResult& s : c.systems) {
      if (s.system != KindSystem::kUlaCache && (best == nullptr || s.peak_tput > best->peak_tput)) best = &s;
    }
    if (ula && best) {
      fmt::print("{:<20} ulacache {:>9.0f} ({:>5} admitted) | best engine {:<16} {:>9.0f} ({:>5} admitted) | {:.2f}x\n",
                 ConfigName(c), ula->peak_tput, ula->admission.admitted, KindSystemName(best->system), best->peak_tput,
                 best->admission.admitted, best->peak_tput > 0 ? ula->peak_tput / best->peak_tput : 0.0);
    }
  }
}

bool WriteCsvs(const KindComparison& r, const std::filesystem::path& out) {
  std::error_code ec;
  std::filesystem::create_directories(out, ec);
  std::ofstream s(out / "kinds_summary.csv"), c(out / "kinds_curve.csv"), v(out / "kinds_starvation.csv");
  if (!s || !c || !v) return false;
  s << "config,hardware,mode,mtp,system,admitted,binds,fill,fill_window,fill_c4,fill_c128,fill_index,peak_tput,peak_batch,"
       "tpot_b1_ms,device_kv_gb_per_gpu,host_gb_per_gpu\n";
  c << "config,system,batch,context,tput,step_ms,weights_ms,attention_ms,indexer_ms,host_link_ms,collectives_ms,overhead_ms,"
       "host_fetch_entries\n";
  v << "config,context,system,admitted,binds,pool_fill\n";
  for (const KindConfigResult& k : r.configs) {
    for (const KindSystemResult& x : k.systems) {
      const Admission& a = x.admission;
      s << fmt::format("{},{},{},{},{},{},{},{:.4f},{:.4f},{:.4f},{:.4f},{:.4f},{:.1f},{},{:.4f},{:.3f},{:.3f}\n", Stem(k.entry),
                       k.hardware_label, ParallelModeName(k.entry.mode), k.entry.mtp ? 1 : 0, KindSystemName(x.system),
                       a.admitted, a.binds.empty() ? "-" : a.binds, a.fill, Share(a.held.window, x.plan, k.num_ranks),
                       Share(a.held.csa, x.plan, k.num_ranks), Share(a.held.hca, x.plan, k.num_ranks), Share(a.held.index, x.plan, k.num_ranks), x.peak_tput,
                       x.peak_batch, x.tpot_b1_ms, x.plan.device_bytes / 1e9, x.plan.host_bytes / 1e9);
      for (const KindCurvePoint& p : x.curve) {
        const KindStepTime& t = p.time;
        c << fmt::format("{},{},{},{:.0f},{:.1f},{:.4f},{:.4f},{:.4f},{:.4f},{:.4f},{:.4f},{:.4f},{:.0f}\n", Stem(k.entry),
                         KindSystemName(x.system), p.batch, p.context, p.tput, 1e3 * t.total, 1e3 * t.weights,
                         1e3 * t.attention, 1e3 * t.indexer, 1e3 * t.host_link, 1e3 * t.collectives, 1e3 * t.overhead,
                         p.host_fetch);
      }
    }
  }
  for (const KindStarvationRow& row : r.starvation) {
    for (const auto& cell : row.cells) {
      std::string fills;
      for (double f : cell.admission.pool_fill) fills += fmt::format("{}{:.4f}", fills.empty() ? "" : ";", f);
      v << fmt::format("{},{},{},{},{},{}\n", Stem(row.entry), row.context, KindSystemName(cell.system), cell.admission.admitted,
                       cell.admission.binds.empty() ? "-" : cell.admission.binds, fills);
    }
  }
  return bool(s) && bool(c) && bool(v);
}

nlohmann::json ToJson(const KindComparison& r) {
  nlohmann::json configs = nlohmann::json::array();
  for (const KindConfigResult& k : r.configs) {
    nlohmann::json systems = nlohmann::json::object();
    for (const KindSystemResult& x : k.systems) {
      systems[std::string(KindSystemName(x.system))] = {
          {"admitted", x.admission.admitted}, {"binds", x.admission.binds},   {"fill", x.admission.fill},
          {"peak_tput", x.peak_tput},         {"peak_batch", x.peak_batch},   {"tpot_b1_ms", x.tpot_b1_ms},
          {"fill_window", Share(x.admission.held.window, x.plan, k.num_ranks)}, {"fill_c4", Share(x.admission.held.csa, x.plan, k.num_ranks)},
          {"fill_c128", Share(x.admission.held.hca, x.plan, k.num_ranks)},     {"fill_index", Share(x.admission.held.index, x.plan, k.num_ranks)},
          {"pools", x.plan.derivation}};
    }
    configs.push_back({{"config", Stem(k.entry)}, {"systems", systems}});
  }
  const KindTurnover& t = r.turnover;
  return {{"model", r.model},
          {"scenario", r.scenario},
          {"turnover", {{"workload", t.workload}, {"query_keep", t.query_keep}, {"queries", t.queries}, {"single", t.single},
                        {"per_query", t.per_query}}},
          {"configs", configs}};
}

// --sensitivity: one constant at a time, the H200 MTP-off configs.
int Sensitivity(const KindCompareConfig& base, const std::filesystem::path& dir) {
  struct Variant {
    std::string constant, value;
    std::function<void(KindCompareConfig&)> apply;
    const KindTurnover* turnover = nullptr;  // the measured one unless set
  };
  // The turnover: measured once at the workload's query_keep (every variant but one) and once
  // at the sensitivity's.
  auto measured = MeasureKindTurnover(base, dir);
  if (!measured) {
    fmt::print(stderr, "ula compare --sensitivity: {}\n", measured.error().ToString());
    return 1;
  }
  auto drift = MeasureKindTurnover(base, dir, base.selection_sensitivity_query_keep);
  if (!drift) {
    fmt::print(stderr, "ula compare --sensitivity: {}\n", drift.error().ToString());
    return 1;
  }
  std::vector<Variant> vs = {{"(base)", fmt::format("turnover {:.4f} / {:.4f} per query, MTP off / on (query_keep {})", measured->single,
                                                    measured->per_query, measured->query_keep),
                              [](KindCompareConfig&) {}}};
  for (double x : {0.05, 0.2, 0.5}) {
    vs.push_back({"sglang_swa_full_tokens_ratio", fmt::format("{}", x), [x](KindCompareConfig& k) { k.sglang_swa_full_tokens_ratio = x; }});
  }
  vs.push_back({"selection query_keep", fmt::format("{} (turnover {:.4f} / {:.4f} per query, MTP off / on)", drift->query_keep,
                                                     drift->single, drift->per_query),
                [](KindCompareConfig&) {}, &*drift});
  vs.push_back({"vllm_block_tokens", "128", [](KindCompareConfig& k) { k.vllm_block_tokens = 128; }});
  vs.push_back({"sglang_state_dtype_bytes", "2", [](KindCompareConfig& k) { k.sglang_state_dtype_bytes = 2; }});
  fmt::print("| constant | value | config | sglang_dsv4 adm / peak | sglang_hisparse adm / peak | vllm adm / peak | "
             "trtllm_offload adm / peak | dcp adm / peak | ulacache adm / peak | ula / best engine |\n|---|---|---|---|---|---|---|---|---|---|\n");
  for (const Variant& v : vs) {
    KindCompareConfig k = base;
    v.apply(k);
    auto r = RunKindComparison(k, dir, v.turnover ? *v.turnover : *measured);
    if (!r) {
      fmt::print(stderr, "ula compare --sensitivity: {} {}: {}\n", v.constant, v.value, r.error().ToString());
      return 1;
    }
    for (const KindConfigResult& c : r->configs) {
      if (c.entry.mtp || c.entry.hardware != r->configs.front().entry.hardware) continue;
      std::string cells;
      double best = 0;
      for (KindSystem s : {KindSystem::kSglang, KindSystem::kSglangHiSparse, KindSystem::kVllm, KindSystem::kTrtllmOffload,
                           KindSystem::kDcp, KindSystem::kUlaCache}) {
        const KindSystemResult* x = c.Find(s);
        cells += x ? fmt::format(" {} / {:.0f} |", x->admission.admitted, x->peak_tput) : " - |";
        if (x && s != KindSystem::kUlaCache) best = std::max(best, x->peak_tput);
      }
      const KindSystemResult* ula = c.Find(KindSystem::kUlaCache);
      fmt::print("| {} | {} | {} |{} {:.2f}x |\n", v.constant, v.value, ConfigName(c), cells, best > 0 ? ula->peak_tput / best : 0.0);
    }
  }
  return 0;
}

}  // namespace

int RunCompareKinds(const CompareKindsOptions& o) {
  auto kc = LoadKindCompareConfigByName(o.model, o.config_dir);
  if (!kc) {
    fmt::print(stderr, "ula compare: {}\n", kc.error().ToString());
    return 2;
  }
  if (o.sensitivity) return Sensitivity(*kc, o.config_dir);
  auto r = RunKindComparison(*kc, o.config_dir);
  if (!r) {
    fmt::print(stderr, "ula compare: {}\n", r.error().ToString());
    return 1;
  }
  if (!WriteCsvs(*r, o.out)) {
    fmt::print(stderr, "ula compare: cannot write the CSV files in '{}'\n", o.out.string());
    return 1;
  }
  if (o.json) {
    fmt::print("{}\n", ToJson(*r).dump());
  } else {
    PrintTables(*r);
    fmt::print("wrote {0}/kinds_summary.csv, {0}/kinds_curve.csv and {0}/kinds_starvation.csv\n", o.out.string());
  }
  return 0;
}

}  // namespace ula::cli
