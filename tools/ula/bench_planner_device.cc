// `ula bench planner --planner device`: the device step's rows (ula/device_step.h, its OpenMP
// form, or its CUDA form with --cuda; docs/ARCHITECTURE.md "The device step") beside the host
// planner's, DP and --mode tp. The engine's side of each step (its arrays in the step's
// memory, its stream, its timer) is a DeviceIo (step/device_io.h): in the OpenMP form the host
// arrays and the host clock, in the CUDA form device arrays (the selections copied there
// before each group step, not timed) and CUDA events around each group step's calls.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <random>

#include "bench_planner.h"
#include "step/device_io.h"
#include "ula/backend.h"
#include "ula/tp_address_space.h"
#include "ula/tp_step_planner.h"

namespace ula::cli::planner_bench {

namespace {
// into += d, phase by phase: a row's launches and syncs over its (rank, group) steps.
void AddCounters(DeviceStepCounters& into, const DeviceStepCounters& d) {
  const auto add = [](DeviceStepCounts& a, const DeviceStepCounts& b) {
    a.launches += b.launches;
    a.syncs += b.syncs;
  };
  add(into.check, d.check);
  add(into.claim, d.claim);
  add(into.complete, d.complete);
  add(into.advance_round, d.advance_round);
  add(into.state, d.state);
  add(into.place, d.place);
}
}  // namespace

// The device step of every group on an engine-path copy of the workload (kernel_pb_lru,
// stable_new_entries, no host shadows): per measured step, every group's Plan + Complete
// (every copy reported arrived: the counting backend moves no bytes) timed, then every
// group's AdvanceRound (not timed: once per scheduler iteration). Launches and syncs by phase
// from DeviceStep::counters(). nullopt with `error` set on a failure (exit 2).
std::optional<DeviceRow> MeasureDevice(const PlannerOptions& o, AddressSpaceConfig sc, const std::string& name,
                                       std::uint32_t batch, std::uint32_t groups, std::uint32_t queries,
                                       std::uint32_t top_k, const SelectionModelParams& params, std::uint32_t threads,
                                       std::string& error) {
  sc.policy = PolicyKind::kKernelPbLru;
  sc.stable_new_entries = true;
  sc.host_shadows = false;
  auto backend = MakeCountingBackend();
  auto space = AddressSpace::Create(sc, *backend);
  if (!space) return error = space.error().ToString(), std::nullopt;
  std::mt19937_64 rng(o.seed);
  std::vector<std::vector<LogicalAddr>> addrs;
  for (std::uint32_t r = 0; r < batch; ++r) {
    if (auto s = (*space)->AddRequest(RequestId(r), Rank(0)); !s) return error = s.error().ToString(), std::nullopt;
    const auto len = static_cast<std::uint32_t>(65536 + rng() % 65537);
    auto a = (*space)->Allocate(RequestId(r), len);
    if (!a) {
      if (a.error().code() != ErrorCode::kResourceExhausted) return error = a.error().ToString(), std::nullopt;
      (void)(*space)->Free(RequestId(r));
      break;
    }
    addrs.push_back(std::move(*a));
  }
  (*space)->AdvanceRound();  // prefill's round ends: its entries may move
  // A model of its own: the host row's drew the same streams (the same selections here).
  auto selection = SelectionModel::Create(params);
  if (!selection) return error = selection.error().ToString(), std::nullopt;
  const auto placed = static_cast<std::uint32_t>(addrs.size());
  const std::uint32_t rows = placed * queries;
  const DeviceStepConfig dc{.cuda = o.cuda, .threads = threads, .max_rows = std::max(rows, 1u),
                            .max_batch = std::max(placed, 1u), .max_top_k = top_k};
  std::vector<std::unique_ptr<DeviceStep>> steps;
  for (std::uint32_t g = 0; g < groups; ++g) {
    auto step = DeviceStep::Create(**space, Rank(0), GroupId(static_cast<std::uint16_t>(g)), dc);
    if (!step) return error = (o.cuda ? "--cuda: " : "") + step.error().ToString(), std::nullopt;
    steps.push_back(std::move(*step));
  }
  const std::uint32_t max_desc = steps.empty() ? 0 : steps[0]->max_descriptors();
  std::vector<std::int32_t> selections(std::size_t{rows} * top_k, -1), indices(selections.size(), -1);
  std::vector<std::int64_t> requests(placed);
  for (std::uint32_t r = 0; r < placed; ++r) requests[r] = r;
  std::vector<CopyDescriptor> descriptors(max_desc);
  std::vector<std::uint8_t> status(max_desc, 0);
  StepRecord record;
  StepArrays arrays{.selections = selections.data(), .requests = requests.data(), .indices = indices.data(),
                    .descriptors = descriptors.data(), .stats = &record, .num_rows = rows, .batch = placed,
                    .q_len = queries, .top_k = top_k, .selection_stride = top_k, .index_stride = top_k,
                    .max_descriptors = max_desc};
  // The engine's side: the arrays in the step's memory (the CUDA form's on the GPU), its stream, its timer.
  auto io = DeviceIo::Create(o.cuda, {.max_selections = std::max<std::uint64_t>(1, selections.size()),
                                      .max_rows = std::max(rows, 1u), .max_batch = std::max(placed, 1u),
                                      .max_descriptors = max_desc});
  if (!io) return error = (o.cuda ? "--cuda: " : "") + io.error().ToString(), std::nullopt;
  auto status_dev = (*io)->UploadStatus(status);  // every copy reported arrived
  if (!status_dev) return error = status_dev.error().ToString(), std::nullopt;
  DeviceRow row;
  row.config = name;
  row.batch = placed;
  row.groups = groups;
  row.threads = threads;
  row.form = o.cuda ? "cuda" : "openmp";
  row.timing = (*io)->timing_source();
  std::vector<DeviceStepCounters> before(groups);
  std::vector<double> group_ms;
  std::vector<std::vector<std::uint32_t>> picks;
  for (std::uint32_t step = 0; step < o.warmup + o.steps; ++step) {
    const bool measured = step >= o.warmup;
    if (step == o.warmup) {
      for (std::uint32_t g = 0; g < groups; ++g) before[g] = steps[g]->counters();
    }
    for (std::uint32_t g = 0; g < groups; ++g) {
      std::fill(selections.begin(), selections.end(), -1);
      for (std::uint32_t r = 0; r < placed; ++r) {
        const auto ctx = static_cast<std::uint32_t>(addrs[r].size());
        if (auto s = selection->Step(std::uint64_t{r} * 64 + g, ctx, queries, picks); !s) {
          return error = s.error().ToString(), std::nullopt;
        }
        for (std::uint32_t q = 0; q < queries && q < picks.size(); ++q) {
          const std::size_t at = (std::size_t{r} * queries + q) * top_k;
          for (std::size_t c = 0; c < picks[q].size() && c < top_k; ++c) {
            selections[at + c] = static_cast<std::int32_t>(addrs[r][picks[q][c]].value());
          }
        }
      }
      record = StepRecord{};
      auto dev = (*io)->Upload(arrays);  // the selections to the step's memory, not timed
      if (!dev) return error = dev.error().ToString(), std::nullopt;
      double ms = 0;
      Status st = (*io)->Start();
      if (st) st = steps[g]->Plan(*dev, (*io)->stream());
      if (st) st = steps[g]->Complete(*status_dev, (*io)->stream());
      if (st) {
        auto t = (*io)->StopMs();
        if (t) ms = *t;
        else st = std::unexpected(t.error());
      }
      if (st) st = (*io)->Download(*dev, arrays);
      if (!st) return error = fmt::format("{} batch {} group {}: {}", name, placed, g, st.error().ToString()), std::nullopt;
      if (record.error != 0) {
        return error = fmt::format("{} batch {} group {}: the device step refused the step (error {})", name, placed, g,
                                   record.error),
               std::nullopt;
      }
      if (measured) {
        group_ms.push_back(ms);
        row.total_ms += ms;
        row.distinct += record.distinct;
        row.misses += record.misses;
        row.evictions += record.evictions;
        ++row.group_steps;
      }
    }
    for (auto& s : steps) {
      if (Status st = s->AdvanceRound((*io)->stream()); !st) return error = st.error().ToString(), std::nullopt;
    }
  }
  for (std::uint32_t g = 0; g < groups; ++g) AddCounters(row.counts, steps[g]->counters().Since(before[g]));
  row.group_ms_median = Median(group_ms);
  row.ns_per_distinct = row.distinct == 0 ? 0.0 : row.total_ms * 1e6 / static_cast<double>(row.distinct);
  return row;
}

// --mode tp: attention at home over P = --ranks in-process ranks (TpAttention::kAtHome) on
// the config's ulacache_home row: the node's admitted requests x the batch fraction, of
// 64K-128K tokens, every entry striped a mod P, the per-GPU device and host bytes of the
// comparison per rank (kernel_pb_lru, stable_new_entries, the device step's modes). Two
// spaces built alike from the same draws: on one the TP host step (TpStepPlanner::Step, the
// ranks one after the other) per group, on the other one DeviceStep per (rank, group), each
// group step as the engine runs it: every rank's Check, the MAX of the verdicts (the
// all-reduce), every rank's Claim, every rank's Complete (every copy reported arrived).
// Timed per group step over all ranks; a row's group_ms is the median over (rank, group)
// steps of the group step's time / P, ns per distinct selection over the ranks' distinct
// home entries (which add up to the step's distinct), the same for the host step. Launches
// and syncs per (rank, group) step from DeviceStep::counters().
std::optional<DeviceRow> MeasureDeviceTp(const PlannerOptions& o, const ConfigRow& cfg, std::uint32_t batch,
                                         std::uint32_t groups, std::uint32_t entry, std::uint32_t queries,
                                         std::uint32_t top_k, const SelectionModelParams& params, std::uint32_t threads,
                                         std::string& error) {
  TpConfig tc;
  tc.num_ranks = o.ranks;
  tc.num_groups = groups;
  tc.entry_bytes = entry;
  tc.attention = TpAttention::kAtHome;
  tc.device_bytes_per_rank = static_cast<std::uint64_t>(cfg.device_gb * 1e9 * o.device_fraction);
  tc.host_bytes_per_rank = static_cast<std::uint64_t>(cfg.host_gb * 1e9);
  tc.policy = PolicyKind::kKernelPbLru;
  tc.stable_new_entries = true;
  struct Side {
    std::unique_ptr<Backend> backend;
    std::unique_ptr<TpAddressSpace> space;
    std::vector<std::vector<LogicalAddr>> addrs;
  };
  auto build = [&](Side& side) -> bool {
    side.backend = MakeCountingBackend();
    auto space = TpAddressSpace::Create(tc, *side.backend);
    if (!space) return error = space.error().ToString(), false;
    side.space = std::move(*space);
    std::mt19937_64 rng(o.seed);
    for (std::uint32_t r = 0; r < batch; ++r) {
      if (Status s = side.space->AddRequest(RequestId(r)); !s) return error = s.error().ToString(), false;
      const auto len = static_cast<std::uint32_t>(65536 + rng() % 65537);
      auto a = side.space->Allocate(RequestId(r), len);
      if (!a) {
        if (a.error().code() != ErrorCode::kResourceExhausted) return error = a.error().ToString(), false;
        (void)side.space->Free(RequestId(r));
        break;
      }
      side.addrs.push_back(std::move(*a));
    }
    side.space->AdvanceRound();  // prefill's round ends
    return true;
  };
  Side host, dev;
  if (!build(host) || !build(dev)) return std::nullopt;
  const auto placed = static_cast<std::uint32_t>(dev.addrs.size());
  const std::uint32_t rows = placed * queries;
  const DeviceStepConfig dc{.cuda = o.cuda, .threads = threads, .max_rows = std::max(rows, 1u),
                            .max_batch = std::max(placed, 1u), .max_top_k = top_k};
  std::vector<std::vector<std::unique_ptr<DeviceStep>>> steps(o.ranks);  // [rank][group]
  for (std::uint32_t r = 0; r < o.ranks; ++r) {
    for (std::uint32_t g = 0; g < groups; ++g) {
      auto step = DeviceStep::Create(*dev.space, Rank(static_cast<std::uint16_t>(r)), GroupId(static_cast<std::uint16_t>(g)), dc);
      if (!step) return error = (o.cuda ? "--cuda: " : "") + step.error().ToString(), std::nullopt;
      steps[r].push_back(std::move(*step));
    }
  }
  TpStepPlanner planner(*host.space, nullptr, {.parallel_ranks = false});
  const std::uint32_t max_desc = steps.empty() || steps[0].empty() ? 0 : steps[0][0]->max_descriptors();
  std::vector<std::int32_t> selections(std::size_t{rows} * top_k, -1);
  std::vector<std::int64_t> requests(placed);
  for (std::uint32_t r = 0; r < placed; ++r) requests[r] = r;
  struct RankIo {  // what one rank's step writes
    std::vector<std::int32_t> indices;
    std::vector<CopyDescriptor> descriptors;
    StepRecord record;
    StepArrays arrays;
    std::unique_ptr<DeviceIo> dev;  // the engine's side of the rank: its arrays, stream, timer
    const std::uint8_t* status = nullptr;
  };
  std::vector<RankIo> io(o.ranks);
  std::vector<std::uint8_t> status(max_desc, 0);
  for (RankIo& x : io) {
    x.indices.assign(selections.size(), -1);
    x.descriptors.resize(max_desc);
    x.arrays = StepArrays{.selections = selections.data(), .requests = requests.data(), .indices = x.indices.data(),
                          .descriptors = x.descriptors.data(), .stats = &x.record, .num_rows = rows, .batch = placed,
                          .q_len = queries, .top_k = top_k, .selection_stride = top_k, .index_stride = top_k,
                          .max_descriptors = max_desc};
    auto made = DeviceIo::Create(o.cuda, {.max_selections = std::max<std::uint64_t>(1, selections.size()),
                                          .max_rows = std::max(rows, 1u), .max_batch = std::max(placed, 1u),
                                          .max_descriptors = max_desc});
    if (!made) return error = (o.cuda ? "--cuda: " : "") + made.error().ToString(), std::nullopt;
    x.dev = std::move(*made);
    auto s = x.dev->UploadStatus(status);  // every copy reported arrived
    if (!s) return error = s.error().ToString(), std::nullopt;
    x.status = *s;
  }
  std::vector<LogicalAddr> host_sel;
  std::vector<SelectionRun> host_runs;
  DeviceRow row;
  row.config = cfg.config;
  row.mode = "tp";
  row.ranks = o.ranks;
  row.batch = placed;
  row.groups = groups;
  row.threads = threads;
  row.form = o.cuda ? "cuda" : "openmp";
  row.timing = io.empty() ? "steady_clock" : io[0].dev->timing_source();
  auto selection = SelectionModel::Create(params);
  if (!selection) return error = selection.error().ToString(), std::nullopt;
  std::vector<std::vector<DeviceStepCounters>> before(o.ranks, std::vector<DeviceStepCounters>(groups));
  std::vector<double> group_ms;
  std::vector<std::vector<std::uint32_t>> picks;
  double host_ms = 0;
  std::uint64_t host_distinct = 0;
  using Clock = std::chrono::steady_clock;
  for (std::uint32_t step = 0; step < o.warmup + o.steps; ++step) {
    const bool measured = step >= o.warmup;
    if (step == o.warmup) {
      for (std::uint32_t r = 0; r < o.ranks; ++r) {
        for (std::uint32_t g = 0; g < groups; ++g) before[r][g] = steps[r][g]->counters();
      }
    }
    for (std::uint32_t g = 0; g < groups; ++g) {
      std::fill(selections.begin(), selections.end(), -1);
      host_sel.clear();
      host_runs.clear();
      for (std::uint32_t q = 0; q < placed; ++q) {
        const auto ctx = static_cast<std::uint32_t>(dev.addrs[q].size());
        if (auto s = selection->Step(std::uint64_t{q} * 64 + g, ctx, queries, picks); !s) {
          return error = s.error().ToString(), std::nullopt;
        }
        std::uint32_t n = 0;
        for (std::uint32_t k = 0; k < queries && k < picks.size(); ++k) {
          const std::size_t at = (std::size_t{q} * queries + k) * top_k;
          for (std::size_t c = 0; c < picks[k].size() && c < top_k; ++c) {
            selections[at + c] = static_cast<std::int32_t>(dev.addrs[q][picks[k][c]].value());
            host_sel.push_back(host.addrs[q][picks[k][c]]);
            ++n;
          }
        }
        host_runs.push_back({RequestId(q), n});
      }
      const GroupId group(static_cast<std::uint16_t>(g));
      const auto h0 = Clock::now();
      auto plan = planner.Step(group, host_sel, host_runs);
      const double hms = std::chrono::duration<double, std::milli>(Clock::now() - h0).count();
      if (!plan) return error = fmt::format("{} batch {} group {}: the TP host step: {}", cfg.config, placed, g, plan.error().ToString()), std::nullopt;
      std::uint32_t agreed = 0;
      double ms = 0;
      // The timer around `run` (the host clock or CUDA events, the rank's DeviceIo), added to ms.
      auto timed = [&](DeviceIo& d, const auto& run) -> Status {
        ULA_RETURN_IF_ERROR(d.Start());
        ULA_RETURN_IF_ERROR(run());
        auto t = d.StopMs();
        if (!t) return std::unexpected(t.error());
        ms += *t;
        return Ok();
      };
      std::vector<StepArrays> dev(o.ranks);
      for (std::uint32_t r = 0; r < o.ranks; ++r) {
        io[r].record = StepRecord{};
        auto up = io[r].dev->Upload(io[r].arrays);  // not timed
        Status st = up ? Ok() : Status(std::unexpected(up.error()));
        if (st) dev[r] = *up;
        if (st) st = timed(*io[r].dev, [&] { return steps[r][g]->Check(dev[r], io[r].dev->stream()); });
        // The engine's all-reduce (MAX), here on the host: not timed.
        auto v = st ? io[r].dev->ReadWord(steps[r][g]->verdict()) : Result<std::uint32_t>(0u);
        if (st && !v) st = std::unexpected(v.error());
        if (!st) return error = fmt::format("{} batch {} group {} rank {}: {}", cfg.config, placed, g, r, st.error().ToString()), std::nullopt;
        agreed = std::max(agreed, *v);
      }
      std::uint64_t distinct = 0, misses = 0, evictions = 0;
      for (std::uint32_t r = 0; r < o.ranks; ++r) {
        auto agreed_dev = io[r].dev->Agreed(agreed);
        Status st = agreed_dev ? Ok() : Status(std::unexpected(agreed_dev.error()));
        if (st) {
          st = timed(*io[r].dev, [&]() -> Status {
            ULA_RETURN_IF_ERROR(steps[r][g]->Claim(*agreed_dev, io[r].dev->stream()));
            return steps[r][g]->Complete(io[r].status, io[r].dev->stream());
          });
        }
        if (st) st = io[r].dev->Download(dev[r], io[r].arrays);
        if (!st) return error = fmt::format("{} batch {} group {} rank {}: {}", cfg.config, placed, g, r, st.error().ToString()), std::nullopt;
        if (io[r].record.error != 0) {
          return error = fmt::format("{} batch {} group {}: the device step refused the step (error {})", cfg.config,
                                     placed, g, io[r].record.error),
                 std::nullopt;
        }
        distinct += io[r].record.distinct;
        misses += io[r].record.misses;
        evictions += io[r].record.evictions;
      }
      if (measured) {
        group_ms.push_back(ms / o.ranks);
        row.total_ms += ms;
        row.distinct += distinct;
        row.misses += misses;
        row.evictions += evictions;
        row.group_steps += o.ranks;
        host_ms += hms;
        host_distinct += plan->stats.empty() ? 0 : plan->stats[0].distinct;  // each rank's: the step's
      }
    }
    host.space->AdvanceRound();
    for (std::uint32_t r = 0; r < o.ranks; ++r) {
      for (auto& s : steps[r]) {
        if (Status st = s->AdvanceRound(io[r].dev->stream()); !st) return error = st.error().ToString(), std::nullopt;
      }
    }
  }
  for (std::uint32_t r = 0; r < o.ranks; ++r) {
    for (std::uint32_t g = 0; g < groups; ++g) AddCounters(row.counts, steps[r][g]->counters().Since(before[r][g]));
  }
  if (host_distinct != row.distinct) {
    return error = fmt::format("{} batch {}: the TP host step counted {} distinct home entries, the device step {}",
                               cfg.config, placed, host_distinct, row.distinct),
           std::nullopt;
  }
  row.group_ms_median = Median(group_ms);
  row.ns_per_distinct = row.distinct == 0 ? 0.0 : row.total_ms * 1e6 / static_cast<double>(row.distinct);
  row.host_ns_per_distinct = host_distinct == 0 ? 0.0 : host_ms * 1e6 / static_cast<double>(host_distinct);
  return row;
}

namespace {
// Per (rank, group) step: the counts over the measured group steps divided by their number.
double PerStep(std::uint64_t total, const DeviceRow& d) {
  return d.group_steps == 0 ? 0.0 : static_cast<double>(total) / static_cast<double>(d.group_steps);
}
}  // namespace

nlohmann::json DeviceRowJson(const DeviceRow& d) {
  nlohmann::json launches, syncs;
  const std::pair<const char*, const DeviceStepCounts*> phases[] = {
      {"check", &d.counts.check}, {"claim", &d.counts.claim}, {"complete", &d.counts.complete},
      {"advance_round", &d.counts.advance_round}};
  for (const auto& [name, c] : phases) {
    launches[name] = PerStep(c->launches, d);
    syncs[name] = PerStep(c->syncs, d);
  }
  launches["total"] = PerStep(d.counts.Step().launches, d);
  syncs["total"] = PerStep(d.counts.Step().syncs, d);
  return {{"config", d.config}, {"mode", d.mode}, {"ranks", d.ranks},
          {d.mode == "tp" ? "batch" : "batch_per_rank", d.batch}, {"groups", d.groups}, {"threads", d.threads},
          {"form", d.form}, {"timing", d.timing}, {"group_ms_median", d.group_ms_median}, {"ns_per_distinct", d.ns_per_distinct},
          {"host_ns_per_distinct", d.host_ns_per_distinct},
          {"device_over_host", d.host_ns_per_distinct > 0 ? d.ns_per_distinct / d.host_ns_per_distinct : -1.0},
          {"misses_per_group_step", PerStep(d.misses, d)}, {"evictions_per_group_step", PerStep(d.evictions, d)},
          {"launches_per_step", launches}, {"syncs_per_step", syncs}};
}

namespace {
const char* FormName(const DeviceRow& d) { return d.form == "cuda" ? "CUDA" : "OpenMP"; }
}  // namespace

void PrintDeviceRows(const PlannerOptions& o, const std::vector<DeviceRow>& rows) {
  if (o.mode == "tp") {
    fmt::print("\nula bench planner (device planner, TP attention at home over {} in-process ranks): DeviceStep's {} "
               "form per (rank, group), every rank's Check, the MAX of the verdicts, every rank's Claim and Complete "
               "timed by {} (kernel_pb_lru, stable_new_entries), {} warm-up + {} measured steps; host_ns/sel: the TP "
               "host step (TpStepPlanner::Step, the ranks in turn) on a space built alike; batch: the node's requests\n",
               o.ranks, rows.empty() ? "OpenMP" : FormName(rows[0]), rows.empty() ? "" : rows[0].timing, o.warmup,
               o.steps);
  } else {
    fmt::print("\nula bench planner (device planner): DeviceStep's {} form on an engine-path copy of each row's "
               "workload (kernel_pb_lru, stable_new_entries), Plan + Complete per group timed by {}, {} warm-up + {} "
               "measured steps; host_ns/sel: the host planner's row above\n",
               rows.empty() ? "OpenMP" : FormName(rows[0]), rows.empty() ? "" : rows[0].timing, o.warmup, o.steps);
  }
  fmt::print("{:<15} {:>6} {:>3} {:>9} {:>9} {:>11} {:>9} {:>9} {:>9}\n", "config", "batch", "T", "group_ms", "ns/sel",
             "host_ns/sel", "dev/host", "miss/g", "evict/g");
  for (const DeviceRow& d : rows) {
    fmt::print("{:<15} {:>6} {:>3} {:>9.3f} {:>9.1f} {:>11.1f} {:>9.2f} {:>9.0f} {:>9.0f}\n", d.config, d.batch, d.threads,
               d.group_ms_median, d.ns_per_distinct, d.host_ns_per_distinct,
               d.host_ns_per_distinct > 0 ? d.ns_per_distinct / d.host_ns_per_distinct : -1.0, PerStep(d.misses, d),
               PerStep(d.evictions, d));
  }
  fmt::print("per (rank, group) step (Check, Claim, Complete, AdvanceRound; one cooperative launch each):\n");
  for (const DeviceRow& d : rows) {
    const DeviceStepCounters& c = d.counts;
    fmt::print("{:<15} {:>6} {:>3} launches {:.0f} = {:.0f} + {:.0f} + {:.0f} + {:.0f}, syncs {:.0f} = {:.0f} + {:.0f} + "
               "{:.0f} + {:.0f}\n",
               d.config, d.batch, d.threads, PerStep(c.Step().launches, d), PerStep(c.check.launches, d),
               PerStep(c.claim.launches, d), PerStep(c.complete.launches, d), PerStep(c.advance_round.launches, d),
               PerStep(c.Step().syncs, d), PerStep(c.check.syncs, d), PerStep(c.claim.syncs, d),
               PerStep(c.complete.syncs, d), PerStep(c.advance_round.syncs, d));
  }
}

}  // namespace ula::cli::planner_bench
