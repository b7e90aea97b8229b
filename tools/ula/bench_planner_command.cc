// `ula bench planner`: the DP step planner at full GLM-5 scale on one rank (counting
// backend: real tables, pools and policy, no bytes), against the machine's own cost of a
// random memory read, measured in the same run.
//
// Per config (the DP configs of `ula compare`, read from its summary CSV: admitted
// requests and KV bytes per GPU of the ulacache row): one rank holds admitted / 8 requests
// of 64K-128K tokens (uniform, seeded), in 21 layer groups (GLM-5: 78 + 1 MTP layers, 4 per
// group) of 2,624-byte entries, device and host pools sized as the comparison sized them.
// Batches: the rank's admission limit and a few smaller ones. Each step, every group's
// selections come from the scenario's selection model (top-k 2048, 1 + draft queries) and
// one StepPlanner::Step per group is timed (after --warmup unmeasured steps that fill the
// device pool from empty); AdvanceRound ends the step. Reported per row:
// the median per-group planner latency (ms), ns per distinct selection, and the ratio to
// the random-read cost: an independent 8-byte read at a random index of an array as large
// as one group's location table (prefetch-free loop over precomputed indices, timed in the
// same run). The target  is ratio <= 1.5 on one thread. --threads T1,T2,...
// (default 1,2): the measured steps rotate over the thread counts (step s runs every group
// at T[s mod n]; a step's result does not depend on T, so the state each sees is the same),
// and every row is reported per thread count. --prefetch-distance sets the planner's.
// Victim claims: each row also reports the evictions per group step, the
// mean wall time of the step's victim claim (StepPlanner::counters(): PB-LRU's claim, serial
// or on the T threads) and its share of the planner's time; --parallel-claim-min-victims
// sets the planner's threshold (1: every evicting step with T > 1 claims in parallel), and
// --device-fraction F shrinks the device pool to F of the comparison's (more evictions per
// step; the host pool and the admission stay).
// Host shadows: --shadows on|off sets AddressSpaceConfig::host_shadows; each row
// reports the entries moved over the host link per miss (bytes_moved / entry / misses: 2.0
// for a swap, 1.0 for a fetch into a free slot or a victim that goes back to its shadow), the
// evictions that moved no bytes, and the host pool's free share (a shadow counts free) after
// the warm-up; --host-free F sizes the host pool instead so that F of it is free after the
// prefill (the batch's tokens minus the device pool, over 1 - F); --prefer-shadowed sets
// PolicyOptions::prefer_shadowed (PB-LRU claims each bucket's shadowed slots first).
// --claim-sweep measures PB-LRU's victim claim alone instead: two PB-LRUs of
// --claim-capacity slots (R = 64, every slot tracked; before each claim the cold bucket is
// made to hold ~60 % of the slots at random positions), one claiming with ClaimVictims, the other with ClaimVictimsParallel on a team of
// T (each --threads value), the same demand in turn (--claim-demands, --claim-reps of each,
// the two claims' victims checked equal); median microseconds of each and their ratio, and
// the median time of two empty fork/joins of the same team after the same preparation (the
// floor of the parallel claim, which forks twice). The cost model's GPU time
// per group at the same batch (step_ms / groups of the compare CSV's nearest batch row) is
// printed beside it, so the planner can be compared with the GPU work it must hide behind.
// --planner device: after each host row, the device step (ula/device_step.h; its OpenMP
// form, docs/ARCHITECTURE.md "The device step") on an engine-path copy of the same workload
// (kernel_pb_lru, stable_new_entries, no host shadows; the same requests and selections), one
// DeviceStep per group: Plan + Complete per group timed (every copy reported arrived),
// AdvanceRound per step. Reported per row: median ms per group, ns per distinct selection
// beside the host planner's, and the kernel launches and host synchronisations per (rank,
// group) step by phase (DeviceStep::counters()). --cuda runs the CUDA form instead: the
// arrays on the GPU (step/device_io.h: the selections copied there before each group step,
// not timed), each group step timed with CUDA events on the step's stream, the same rows and
// JSON fields (form "cuda", timing "cuda_events"; the OpenMP form's: "openmp",
// "steady_clock"). Refused with the reason (exit 2, before any work) in a build without CUDA
// or on a machine without a GPU.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <sstream>

#include "bench_memory.h"
#include "policy/fork_join.h"
#include "policy/pb_lru.h"
#include "cli_checks.h"
#include "command_registry.h"
#include "ula/address_space.h"
#include "config/model_config.h"
#include "workload/selection_model.h"
#include "serving/serving_config.h"
#include "ula/device_step.h"
#include "ula/step_planner.h"
#include "ula/tp_address_space.h"
#include "ula/tp_step_planner.h"
#include "bench_planner.h"
#include "step/device_io.h"
#include "verify/step_rows.h"

namespace ula::cli {
namespace {

using planner_bench::ConfigRow;
using planner_bench::DeviceRow;
using planner_bench::Median;
using planner_bench::PlannerOptions;
using planner_bench::MeasureDevice;
using planner_bench::MeasureDeviceTp;
using planner_bench::DeviceRowJson;
using planner_bench::PrintDeviceRows;

// Reads a CSV with a header row into maps.
std::vector<std::unordered_map<std::string, std::string>> ReadCsv(const std::string& path) {
  std::ifstream in(path);
  std::vector<std::unordered_map<std::string, std::string>> rows;
  std::string line;
  std::vector<std::string> header;
  auto split = [](const std::string& l) {
    std::vector<std::string> out;
    std::stringstream ss(l);
    std::string cell;
    while (std::getline(ss, cell, ',')) out.push_back(cell);
    return out;
  };
  if (!std::getline(in, line)) return rows;
  header = split(line);
  while (std::getline(in, line)) {
    const auto cells = split(line);
    std::unordered_map<std::string, std::string> row;
    for (std::size_t i = 0; i < header.size() && i < cells.size(); ++i) row[header[i]] = cells[i];
    rows.push_back(std::move(row));
  }
  return rows;
}

struct Row {
  std::string config;
  std::uint32_t batch = 0, groups = 0, threads = 1;
  std::uint64_t distinct = 0, selections = 0;
  double group_ms_median = 0, ns_per_distinct = 0, read_ns = 0, ratio = 0, gpu_group_ms = -1, hit_rate = 0;
  std::uint64_t table_bytes = 0;
  std::uint64_t evictions = 0, claim_ns = 0, parallel_claims = 0, group_steps = 0;
  std::uint64_t misses = 0, bytes_moved = 0, shadow_evictions = 0;
  double total_ms = 0, host_free_share = 0, moved_per_miss = 0;
};


int RunClaimSweep(const PlannerOptions& o) {
  using Clock = std::chrono::steady_clock;
  auto us = [](Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double, std::micro>(b - a).count(); };
  const std::uint32_t cap = o.claim_capacity;
  const PolicyOptions popt{.recent_buckets = 64};
  policy::PbLru serial(cap, popt), parallel(cap, popt);
  std::mt19937_64 rng(o.seed);
  for (std::uint32_t s = 0; s < cap; ++s) {
    serial.Insert(SlotId(s));
    parallel.Insert(SlotId(s));
  }
  // Before each claim (not timed) the same state: 65 rounds without a use make every slot
  // cold, then 8 rounds each touch a random sixteenth: the cold bucket holds ~60 % of the
  // slots at random positions (the victims), the 8 newest buckets the rest.
  std::vector<SlotId> touch(cap / 16);
  auto prepare = [&] {
    for (int r = 0; r < 65; ++r) {
      serial.AdvanceRound();
      parallel.AdvanceRound();
    }
    for (int r = 0; r < 8; ++r) {
      for (auto& t : touch) t = SlotId(static_cast<std::uint32_t>(rng() % cap));
      serial.Touch(touch);
      parallel.Touch(touch);
      serial.AdvanceRound();
      parallel.AdvanceRound();
    }
  };
  struct ClaimRow {
    std::uint32_t threads, demand;
    double serial_us, parallel_us, fork_join_us;
  };
  std::vector<ClaimRow> rows;
  std::vector<SlotId> a, b;
  for (std::uint32_t t : o.threads) {
    policy::ForkJoin team(static_cast<int>(t));
    auto nothing = [](std::size_t, std::size_t, std::size_t) {};
    for (std::uint32_t n : o.claim_demands) {
      if (n > cap / 2) {
        fmt::print(stderr, "ula bench planner: --claim-demands {} is more than half of --claim-capacity {}\n", n, cap);
        return 2;
      }
      std::vector<double> ts, tp, fj;
      a.resize(n);
      b.resize(n);
      for (std::uint32_t rep = 0; rep < o.claim_reps; ++rep) {
        // The floor: two empty fork/joins of the team (what the parallel claim does), after
        // the same preparation (its caches as cold as the claim's).
        prepare();
        const auto f0 = Clock::now();
        team.Run(t, nothing);
        team.Run(t, nothing);
        fj.push_back(us(f0, Clock::now()));
        prepare();
        const auto t0 = Clock::now();
        const std::size_t got = serial.ClaimVictims(a);
        const auto t1 = Clock::now();
        const Status st = parallel.ClaimVictimsParallel(b, team);
        const auto t2 = Clock::now();
        if (got != n || !st || a != b) {
          fmt::print(stderr, "ula bench planner: the parallel claim of {} victims on {} threads differs from the serial one\n",
                     n, t);
          return 1;
        }
        ts.push_back(us(t0, t1));
        tp.push_back(us(t1, t2));
      }
      rows.push_back({t, n, Median(ts), Median(tp), Median(fj)});
    }
  }
  if (o.json) {
    nlohmann::json out = {{"claim_rows", nlohmann::json::array()}};
    for (const auto& r : rows) {
      out["claim_rows"].push_back({{"threads", r.threads}, {"demand", r.demand}, {"serial_us", r.serial_us},
                                   {"parallel_us", r.parallel_us}, {"ratio", r.parallel_us / r.serial_us},
                                   {"two_fork_joins_us", r.fork_join_us}, {"capacity", cap}});
    }
    fmt::print("{}\n", out.dump());
    return 0;
  }
  fmt::print("ula bench planner --claim-sweep: PB-LRU (R = 64) of {} slots, every slot tracked, victims from a cold "
             "bucket of ~60 % density, {} claims per row (medians); victims identical in every claim\n",
             cap, o.claim_reps);
  fmt::print("{:>3} {:>8} {:>11} {:>13} {:>9} {:>14}\n", "T", "demand", "serial_us", "parallel_us", "par/ser",
             "2_forks_us");
  for (const auto& r : rows) {
    fmt::print("{:>3} {:>8} {:>11.1f} {:>13.1f} {:>9.2f} {:>14.1f}\n", r.threads, r.demand, r.serial_us, r.parallel_us,
               r.parallel_us / r.serial_us, r.fork_join_us);
  }
  return 0;
}


int Run(const PlannerOptions& o) {
  if (o.claim_sweep) return RunClaimSweep(o);
  if (o.cuda && o.planner != "device") {
    fmt::print(stderr, "ula bench planner: --cuda times the device step: it needs --planner device\n");
    return 2;
  }
  if (o.mode == "tp" && o.planner != "device") {
    fmt::print(stderr, "ula bench planner: --mode tp runs the device step beside the TP host step: it needs --planner device\n");
    return 2;
  }
  if (o.mode == "tp" && o.ranks < 2) {
    fmt::print(stderr, "ula bench planner: --mode tp needs --ranks of at least 2 (got {})\n", o.ranks);
    return 2;
  }
  if (o.cuda) {  // a build without CUDA, or a machine without a GPU, says so before any work
    if (auto io = DeviceIo::Create(true, DeviceIoShape{}); !io) {
      fmt::print(stderr, "ula bench planner: --cuda: {}\n", io.error().ToString());
      return 2;
    }
  }
  const std::filesystem::path dir = o.config_dir.empty() ? DefaultConfigDir() : std::filesystem::path(o.config_dir);
  auto fail = [](const std::string& m) {
    fmt::print(stderr, "ula bench planner: {}\n", m);
    return 2;
  };
  const std::string summary_path = o.summary.empty() ? (dir.parent_path() / "docs" / "img" / "summary.csv").string() : o.summary;
  const std::string compare_path = o.compare_csv.empty() ? (dir.parent_path() / "docs" / "img" / "compare.csv").string() : o.compare_csv;
  const auto summary = ReadCsv(summary_path);
  if (summary.empty()) return fail("cannot read the compare summary " + summary_path + " (run ula compare --out DIR; --summary)");
  const auto curve = ReadCsv(compare_path);
  auto scenario = LoadScenarioConfig(dir / "scenarios" / "default.json", dir);
  if (!scenario) return fail(scenario.error().ToString());
  auto model = LoadModelConfigByName("glm5", dir);
  if (!model) return fail(model.error().ToString());
  const std::uint32_t layers = model->num_layers;
  const std::uint32_t groups = o.groups != 0 ? o.groups
                                             : (layers + model->layers_per_group - 1) / model->layers_per_group +
                                                   (model->mtp_layers + model->layers_per_group - 1) / model->layers_per_group;
  const std::uint32_t entry = model->kv_entry_bytes_per_layer * model->layers_per_group;
  std::vector<Row> rows;
  std::vector<DeviceRow> device_rows;
  const bool tp = o.mode == "tp";
  std::vector<std::string> configs = o.configs;
  if (configs.empty()) {
    configs = tp ? std::vector<std::string>{"h200_tp_mtpoff", "h200_tp_mtpon", "b300_tp_mtpoff", "b300_tp_mtpon"}
                 : std::vector<std::string>{"h200_dp_mtpoff", "h200_dp_mtpon", "b300_dp_mtpoff", "b300_dp_mtpon"};
  }
  for (const std::string& name : tp ? configs : std::vector<std::string>{}) {
    ConfigRow cfg;
    for (const auto& r : summary) {
      if (r.at("config") == name && r.at("system") == "ulacache_home" && r.at("mode") == "tp") {
        cfg = {name, static_cast<std::uint32_t>(std::stoul(r.at("admitted"))), std::stod(r.at("device_kv_gb_per_gpu")),
               std::stod(r.at("host_gb_per_gpu")), r.at("mtp") == "1"};
      }
    }
    if (cfg.admitted == 0) return fail("--mode tp: no ulacache_home row of a TP config named " + name + " in " + summary_path);
    auto selection = SelectionModel::Create([&] { auto p = scenario->selection; p.top_k = model->top_k; return p; }());
    if (!selection) return fail(selection.error().ToString());
    for (double fraction : o.batch_fractions) {
      const std::uint32_t batch = std::max<std::uint32_t>(1, static_cast<std::uint32_t>(std::lround(fraction * cfg.admitted)));
      for (std::uint32_t t : o.threads) {
        std::string error;
        auto d = MeasureDeviceTp(o, cfg, batch, groups, entry, cfg.mtp ? 3 : 1, model->top_k, selection->params(), t, error);
        if (!d) return fail("--planner device --mode tp: " + error);
        device_rows.push_back(*d);
      }
    }
  }
  for (const std::string& name : tp ? std::vector<std::string>{} : configs) {
    ConfigRow cfg;
    for (const auto& r : summary) {
      if (r.at("config") == name && r.at("system") == "ulacache") {
        cfg = {name, static_cast<std::uint32_t>(std::stoul(r.at("admitted"))), std::stod(r.at("device_kv_gb_per_gpu")),
               std::stod(r.at("host_gb_per_gpu")), r.at("mtp") == "1"};
      }
    }
    if (cfg.admitted == 0) return fail("no ulacache row for " + name + " in " + summary_path);
    const std::uint32_t per_rank = std::max<std::uint32_t>(1, cfg.admitted / o.ranks);
    const std::uint32_t queries = cfg.mtp ? 3 : 1;
    for (double fraction : o.batch_fractions) {
      const std::uint32_t batch = std::max<std::uint32_t>(1, static_cast<std::uint32_t>(std::lround(fraction * per_rank)));
      auto backend = MakeCountingBackend();
      AddressSpaceConfig sc;
      sc.num_ranks = 1;
      sc.num_groups = groups;
      sc.entry_bytes = entry;
      sc.device_bytes_per_rank = static_cast<std::uint64_t>(cfg.device_gb * 1e9 * o.device_fraction);
      sc.host_bytes_per_rank = static_cast<std::uint64_t>(cfg.host_gb * 1e9);
      sc.host_shadows = o.shadows == "on";
      sc.policy_options.prefer_shadowed = o.prefer_shadowed;
      sc.stable_new_entries = o.planner == "engine";  // the engine path's mode
      if (o.host_free >= 0) {  // the batch's tokens (the same draws as below) beyond the device pool
        std::mt19937_64 draw(o.seed);
        std::uint64_t tokens = 0;
        for (std::uint32_t r = 0; r < batch; ++r) tokens += 65536 + draw() % 65537;
        const std::uint64_t dev = sc.device_slots_per_group();
        const double host_slots = std::ceil(static_cast<double>(tokens > dev ? tokens - dev : 1) / (1.0 - o.host_free));
        sc.host_bytes_per_rank = static_cast<std::uint64_t>(host_slots) * sc.bytes_per_address();
      }
      auto space = AddressSpace::Create(sc, *backend);
      if (!space) return fail(space.error().ToString());
      std::mt19937_64 rng(o.seed);
      // Requests of 64K-128K tokens until the batch or the rank is full (the comparison admits
      // by the workload's length distribution; a uniform draw may fit one request fewer).
      std::vector<std::vector<LogicalAddr>> addrs;
      for (std::uint32_t r = 0; r < batch; ++r) {
        if (auto s = (*space)->AddRequest(RequestId(r), Rank(0)); !s) return fail(s.error().ToString());
        const auto len = static_cast<std::uint32_t>(65536 + rng() % 65537);
        auto a = (*space)->Allocate(RequestId(r), len);
        if (!a) {
          if (a.error().code() != ErrorCode::kResourceExhausted) return fail(a.error().ToString());
          (void)(*space)->Free(RequestId(r));
          break;
        }
        addrs.push_back(std::move(*a));
      }
      const std::uint32_t placed = static_cast<std::uint32_t>(addrs.size());
      (*space)->AdvanceRound();  // prefill's round ends
      // The model's top-k (GLM-5: 2048), as `ula bench dup` and the serving simulation use: the
      // fitted set's own top_k is that of the small model it was fitted on (256).
      auto selection = SelectionModel::Create([&] { auto p = scenario->selection; p.top_k = model->top_k; return p; }());
      if (!selection) return fail(selection.error().ToString());
      StepPlanner planner(**space);
      // --planner engine: StepPlanner::Step (Plan, the descriptors on the backend,
      // Complete) on the same selections, each request's run as one row.
      std::unique_ptr<StepPlanner> engine;
      verify_internal::StepRows engine_rows;
      std::vector<std::int32_t> engine_indices;
      const std::uint32_t row_max = queries * model->top_k;
      if (o.planner == "engine") {
        auto made = StepPlanner::Create(**space, {.max_batch = std::max<std::uint32_t>(1, placed), .max_q_len = 1,
                                                         .max_top_k = row_max});
        if (!made) return fail(made.error().ToString());
        engine = std::move(*made);
      }
      std::vector<std::vector<std::uint32_t>> picks;
      std::vector<LogicalAddr> sel;
      std::vector<SelectionRun> runs;
      std::vector<SlotId> slots;
      const std::size_t nt = o.threads.size();
      std::vector<std::vector<double>> group_ms(nt);
      std::vector<Row> per_t(nt, Row{name, placed, groups});
      std::vector<std::uint64_t> hits(nt, 0);
      std::vector<double> total_ms(nt, 0);
      for (std::size_t k = 0; k < nt; ++k) per_t[k].threads = o.threads[k];
      double host_free_share = 0;
      for (std::uint32_t step = 0; step < o.warmup + o.steps * nt; ++step) {
        const std::size_t k = step < o.warmup ? 0 : (step - o.warmup) % nt;
        if (step == o.warmup) {
          const double cap = std::max<double>(1, sc.host_slots_per_group());
          host_free_share = (*space)->NumFree(Rank(0), GroupId(0), Tier::kHost) / cap;
        }
        const StepPlannerOptions options{o.threads[k], o.prefetch_distance, o.parallel_claim_min_victims};
        if (auto s = engine ? engine->SetOptions(options) : planner.SetOptions(options); !s) {
          return fail(s.error().ToString());
        }
        for (std::uint32_t g = 0; g < groups; ++g) {
          sel.clear();
          runs.clear();
          for (std::uint32_t r = 0; r < placed; ++r) {
            const std::uint32_t ctx = static_cast<std::uint32_t>(addrs[r].size());
            if (auto s = selection->Step(std::uint64_t{r} * 64 + g, ctx, queries, picks); !s) return fail(s.error().ToString());
            const std::size_t first = sel.size();
            for (const auto& q : picks) {
              for (std::uint32_t p : q) sel.push_back(addrs[r][p]);
            }
            runs.push_back(SelectionRun{RequestId(r), static_cast<std::uint32_t>(sel.size() - first)});
          }
          slots.resize(sel.size());
          if (engine) {  // the rows an engine hands over, made outside the timed step
            if (auto f = engine_rows.Fill(sel, runs, row_max); !f) return fail(f.error().ToString());
            engine_indices.resize(engine_rows.rows.size());
          }
          const auto counters = [&]() -> const StepPlannerCounters& { return engine ? engine->counters() : planner.counters(); };
          const StepPlannerCounters before = counters();
          const auto t0 = std::chrono::steady_clock::now();
          const StepInput input{Rank(0), GroupId(static_cast<std::uint16_t>(g)), sel, runs};
          auto stats = engine ? engine->Step(Rank(0), input.group, engine_rows.shape, engine_rows.requests,
                                             engine_rows.rows, engine_indices)
                              : planner.Step(input, slots);
          const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
          if (!stats) return fail(fmt::format("{} batch {} group {}: {}", name, batch, g, stats.error().ToString()));
          if (step >= o.warmup) {
            group_ms[k].push_back(ms);
            total_ms[k] += ms;
            per_t[k].distinct += stats->distinct;
            per_t[k].selections += stats->selections;
            hits[k] += stats->hits;
            per_t[k].evictions += stats->evictions;
            per_t[k].misses += stats->misses;
            per_t[k].bytes_moved += stats->bytes_moved;
            per_t[k].shadow_evictions += stats->shadow_evictions;
            per_t[k].claim_ns += counters().claim_ns - before.claim_ns;
            per_t[k].parallel_claims += counters().parallel_claims - before.parallel_claims;
            ++per_t[k].group_steps;
          }
        }
        (*space)->AdvanceRound();
      }
      std::uint64_t live = 0;
      for (const auto& a : addrs) live += a.size();
      // The random read: an array as large as one group's location (8 B per address).
      const double read_ns = RandomReadNs(live * 8, o.seed);
      // GPU time per group from the comparison's curve (nearest batch, node-wide batch = per rank x ranks).
      double gpu_group_ms = -1, best_gap = 1e30;
      for (const auto& c : curve) {
        if (c.at("config") != name || c.at("system") != "ulacache") continue;
        const double b = std::stod(c.at("batch"));
        const double gap = std::abs(b - double(placed) * o.ranks);
        if (gap < best_gap) {
          best_gap = gap;
          gpu_group_ms = std::stod(c.at("step_ms")) / groups;
        }
      }
      for (std::size_t k = 0; k < nt; ++k) {
        Row& row = per_t[k];
        std::sort(group_ms[k].begin(), group_ms[k].end());
        row.group_ms_median = group_ms[k][group_ms[k].size() / 2];
        row.ns_per_distinct = total_ms[k] * 1e6 / static_cast<double>(row.distinct);
        row.hit_rate = static_cast<double>(hits[k]) / static_cast<double>(row.distinct);
        row.table_bytes = live * 8;
        row.read_ns = read_ns;
        row.ratio = row.ns_per_distinct / row.read_ns;
        row.gpu_group_ms = gpu_group_ms;
        row.total_ms = total_ms[k];
        row.host_free_share = host_free_share;
        // bytes per entry of the groups, as StepStats counts them (one entry per miss per group)
        row.moved_per_miss = row.misses == 0 ? 0.0
                                             : static_cast<double>(row.bytes_moved) / entry / static_cast<double>(row.misses);
        rows.push_back(row);
        if (o.planner == "device") {
          std::string error;
          auto d = MeasureDevice(o, sc, name, batch, groups, queries, model->top_k, selection->params(), row.threads, error);
          if (!d) return fail("--planner device: " + error);
          d->host_ns_per_distinct = row.ns_per_distinct;
          device_rows.push_back(*d);
        }
      }
    }
  }
  if (o.json) {
    nlohmann::json out = {{"rows", nlohmann::json::array()}};
    for (const Row& r : rows) {
      out["rows"].push_back({{"config", r.config}, {"batch_per_rank", r.batch}, {"groups", r.groups},
                             {"threads", r.threads}, {"prefetch_distance", o.prefetch_distance},
                             {"group_ms_median", r.group_ms_median}, {"ns_per_distinct", r.ns_per_distinct},
                             {"random_read_ns", r.read_ns}, {"ratio", r.ratio}, {"table_bytes", r.table_bytes},
                             {"distinct_per_group_step", r.distinct / (r.groups * o.steps)}, {"hit_rate", r.hit_rate},
                             {"gpu_ms_per_group", r.gpu_group_ms},
                             {"parallel_claim_min_victims", o.parallel_claim_min_victims},
                             {"device_fraction", o.device_fraction},
                             {"evictions_per_group_step", r.evictions / r.group_steps},
                             {"claim_us_mean", r.claim_ns / 1e3 / static_cast<double>(r.group_steps)},
                             {"claim_share", r.claim_ns / 1e6 / r.total_ms},
                             {"parallel_claim_steps", r.parallel_claims},
                             {"planner", o.planner},
                             {"shadows", o.shadows},
                             {"prefer_shadowed", o.prefer_shadowed},
                             {"host_free_share", r.host_free_share},
                             {"misses_per_group_step", r.misses / r.group_steps},
                             {"moved_per_miss", r.moved_per_miss},
                             {"shadow_evictions_per_group_step", r.shadow_evictions / r.group_steps},
                             {"step_share_of_gpu_group", r.gpu_group_ms > 0 ? r.group_ms_median / r.gpu_group_ms : -1.0}});
    }
    for (const DeviceRow& d : device_rows) out["device_rows"].push_back(DeviceRowJson(d));
    fmt::print("{}\n", out.dump());
    return 0;
  }
  if (!rows.empty()) {
    fmt::print("ula bench planner ({} planner): DP, one rank of 8, counting backend, {} groups x {} B entries, {} warm-up + {} "
               "measured steps per thread count, prefetch distance {}, parallel claim from {} victims, device pool x {}, "
               "host shadows {}{}\n",
               o.planner == "engine" ? "engine" : "host", groups, entry, o.warmup, o.steps, o.prefetch_distance, o.parallel_claim_min_victims, o.device_fraction,
               o.shadows, o.prefer_shadowed ? ", shadowed victims preferred" : "");
    fmt::print("{:<15} {:>6} {:>3} {:>10} {:>9} {:>9} {:>9} {:>7} {:>7} {:>10} {:>9} {:>9} {:>9} {:>7} {:>5} {:>9} {:>10} {:>9}\n", "config",
               "batch", "T", "distinct/g", "group_ms", "ns/sel", "read_ns", "ratio", "hit", "table_MB", "gpu_ms/g",
               "evict/g", "claim_us", "claim%", "par", "host_free", "moved/miss", "free_ev/g");
    for (const Row& r : rows) {
      fmt::print("{:<15} {:>6} {:>3} {:>10} {:>9.3f} {:>9.1f} {:>9.1f} {:>7.2f} {:>7.4f} {:>10.1f} {:>9.3f} {:>9} {:>9.1f} "
                 "{:>7.2f} {:>5} {:>9.3f} {:>10.3f} {:>9}\n",
                 r.config, r.batch, r.threads, r.distinct / (r.groups * o.steps), r.group_ms_median, r.ns_per_distinct,
                 r.read_ns, r.ratio, r.hit_rate, r.table_bytes / 1e6, r.gpu_group_ms, r.evictions / r.group_steps,
                 r.claim_ns / 1e3 / static_cast<double>(r.group_steps), 100.0 * r.claim_ns / 1e6 / r.total_ms,
                 r.parallel_claims, r.host_free_share, r.moved_per_miss, r.shadow_evictions / r.group_steps);
    }
  }
  if (!device_rows.empty()) PrintDeviceRows(o, device_rows);
  return 0;
}

Action SetupPlanner(CLI::App& app) {
  auto o = std::make_shared<PlannerOptions>();
  app.add_option("--config-dir", o->config_dir, "configs directory (default: $ULA_CONFIG_DIR or the source tree's)");
  app.add_option("--summary", o->summary, "ula compare summary.csv (default: docs/img/summary.csv)");
  app.add_option("--compare-csv", o->compare_csv, "ula compare compare.csv (default: docs/img/compare.csv)");
  app.add_option("--configs", o->configs,
                 "configs of ula compare (default: h200/b300 x mtp off/on, DP; with --mode tp, TP)");
  app.add_option("--batch-fractions", o->batch_fractions, "batches as fractions of the rank's admission limit")
      ->capture_default_str()
      ->check(RealIn(0, 1, /*lo_open=*/true));
  app.add_option("--device-fraction", o->device_fraction, "device pool as a fraction of the comparison's")
      ->capture_default_str()
      ->check(RealIn(0, 1, /*lo_open=*/true));
  app.add_option("--threads", o->threads, "planner threads, one row each (StepPlannerOptions::threads)")
      ->capture_default_str()
      ->check(IntIn(1, StepPlannerOptions::kMaxThreads));
  app.add_option("--prefetch-distance", o->prefetch_distance, "selections ahead the planner prefetches (0: none)")
      ->capture_default_str()
      ->check(IntIn(0, StepPlannerOptions::kMaxPrefetchDistance));
  app.add_option("--parallel-claim-min-victims", o->parallel_claim_min_victims,
                 "evictions from which a step with T > 1 claims its victims on the T threads")
      ->capture_default_str()
      ->check(IntIn(1, 0xffffffffu));
  app.add_option("--groups", o->groups, "layer groups planned per step (0: the model's, GLM-5: 21)")
      ->capture_default_str()
      ->check(IntIn(0, 1024));
  app.add_option("--steps", o->steps, "measured steps per thread count")->capture_default_str()->check(IntIn(1, 1000));
  app.add_option("--warmup", o->warmup, "unmeasured steps first")->capture_default_str()->check(IntIn(0, 1000));
  app.add_option("--seed", o->seed, "request lengths")->capture_default_str()->check(Seed());
  app.add_flag("--json", o->json, "print one JSON object");
  app.add_option("--planner", o->planner,
                 "host (StepPlanner, the serial host step); engine (StepPlanner::Step instead: Plan, the "
                 "descriptors on the backend, Complete; each request's selections one row; the space in the engine "
                 "path's mode, stable_new_entries); device: also DeviceStep's OpenMP form (--cuda: its CUDA form) "
                 "on the same workload, beside the host planner, with its launches and syncs per step")
      ->check(CLI::IsMember({"host", "engine", "device"}))->capture_default_str();
  app.add_option("--ranks", o->ranks,
                 "GPUs of the node: DP gives one rank admitted / ranks requests; TP stripes over this many in-process ranks")
      ->capture_default_str()
      ->check(IntIn(1, 64));
  app.add_option("--mode", o->mode,
                 "dp; tp (with --planner device): TP attention at home over --ranks in-process ranks on the TP configs' "
                 "ulacache_home rows, the device step beside the TP host step")
      ->check(CLI::IsMember({"dp", "tp"}))->capture_default_str();
  app.add_flag("--cuda", o->cuda,
               "--planner device: the CUDA form, timed with CUDA events (a build with CUDA and a GPU; refused with the "
               "reason otherwise)");
  app.add_option("--shadows", o->shadows, "clean host shadows (AddressSpaceConfig::host_shadows): on or off")
      ->check(CLI::IsMember({"on", "off"}))->capture_default_str();
  app.add_option("--host-free", o->host_free,
                 "size the host pool so that this share of it is free after the prefill (default: the comparison's)")
      ->check(RealIn(0, 1, false, true));
  app.add_flag("--prefer-shadowed", o->prefer_shadowed,
               "PB-LRU claims each bucket's victims with a live host shadow first (PolicyOptions::prefer_shadowed)");
  app.add_flag("--claim-sweep", o->claim_sweep, "time PB-LRU's victim claim alone, serial against T threads");
  app.add_option("--claim-capacity", o->claim_capacity, "--claim-sweep: slots of the pool")
      ->capture_default_str()
      ->check(IntIn(1024, 1u << 26));
  app.add_option("--claim-demands", o->claim_demands, "--claim-sweep: victims per claim, one row each")
      ->capture_default_str()
      ->check(IntIn(1, 1u << 25));
  app.add_option("--claim-reps", o->claim_reps, "--claim-sweep: claims per row")->capture_default_str()->check(IntIn(1, 1000));
  return [o] { return Run(*o); };
}

ULA_REGISTER_COMMAND(bench_planner, "bench", "planner", "the DP step planner at full GLM-5 scale vs a random read",
                     SetupPlanner);

}  // namespace
}  // namespace ula::cli
