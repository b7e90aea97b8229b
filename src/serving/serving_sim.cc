// The decode loop of the serving comparison (serving_sim.h).
//
// Per (config, system): admission limit from the ledger over the workload in order; then one
// continuing simulation of the simulated rank visits the batch grid in ascending order. At
// each batch size it admits requests until the rank holds its share of the batch (or the
// next request does not fit: it waits), runs warmup steps, then measured steps. Each step:
// selections from the selection model (query 0 + draft queries), the system's Step on the
// representative group, new tokens appended (MTP: accepted drafts drawn per request),
// finished requests replaced, and the cost model turns the step's counters into time.
// Requests enter mid-decode (a seeded fraction of their output already produced), so that
// completions are spread as in a long-running server.
#include "serving/serving_sim.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <deque>
#include <limits>
#include <optional>

#include "workload/rng.h"
#include "serving/availability.h"
#include "serving/engine_limits.h"
#include "serving/serving_systems.h"
#include "serving/shared_admission.h"
#include "workload/shared_workload.h"
#include "config/hardware_config.h"
#include "config/model_config.h"
#include "workload/selection_model.h"
#include "workload/workload.h"

namespace ula {
namespace {

struct Active {
  std::uint64_t id = 0;
  std::uint32_t history = 0;    // tokens written so far
  std::uint32_t remaining = 0;  // output tokens still to produce
  workload_internal::Rng rng{0};              // MTP acceptance draws of this request
};

std::string HardwareLabel(std::uint32_t p, std::string name) {
  for (char& ch : name) ch = static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
  return fmt::format("{}x{}", p, name);
}

// Pairs (field of acc, same field of t) over every term of StepTime.
static_assert(sizeof(StepTime) == 16 * sizeof(double), "TimeFields must list every field of StepTime");
std::array<std::pair<double*, double>, 16> TimeFields(StepTime& acc, const StepTime& t) {
  return {{{&acc.weights, t.weights},
           {&acc.dense, t.dense},
           {&acc.experts, t.experts},
           {&acc.attention, t.attention},
           {&acc.indexer, t.indexer},
           {&acc.hbm_copies, t.hbm_copies},
           {&acc.gpu, t.gpu},
           {&acc.host_link, t.host_link},
           {&acc.nvlink_fetch, t.nvlink_fetch},
           {&acc.arriving, t.arriving},
           {&acc.transfer_exposed, t.transfer_exposed},
           {&acc.collectives, t.collectives},
           {&acc.collective_latency, t.collective_latency},
           {&acc.planner, t.planner},
           {&acc.overhead, t.overhead},
           {&acc.total, t.total}}};
}

void SetPeak(SystemResult& result) {
  result.peak_tput = 0;
  result.peak_batch = 0;
  for (const CurvePoint& pt : result.curve) {
    if (pt.tput > result.peak_tput) {
      result.peak_tput = pt.tput;
      result.peak_batch = pt.batch;
    }
    if (pt.batch == 1 && pt.tokens_per_step > 0) {
      result.tpot_b1_ms = pt.step_ms / pt.tokens_per_step;
      result.hit_b1 = pt.hit_rate;
    }
  }
}

// One batch size's measured steps, summed in step order, and the curve point they give.
struct PointSums {
  double t = 0, tokens = 0, batch = 0;
  double distinct = 0, hits = 0, h2d = 0, d2h = 0, nv = 0, arriving = 0;
  std::uint32_t steps = 0;
  StepTime time;
  std::vector<StepCounts> measured;
  // Output tokens at the expected acceptance (the drawn acceptances only grow the
  // histories): a few measured steps of draws would make MTP curves noisy.
  void Add(const StepCounts& k, const StepTime& st, const serving_internal::SimCounters& c, double tokens_per_step) {
    ++steps;
    measured.push_back(k);
    t += st.total;
    tokens += k.batch_total * tokens_per_step;
    batch += k.batch_total;
    distinct += c.distinct;
    hits += c.hits;
    h2d += c.h2d;
    d2h += c.d2h;
    nv += c.nvlink;
    arriving += k.arriving_host_bytes + k.arriving_device_bytes;
    for (auto [acc, v] : TimeFields(time, st)) *acc += v;
  }
};

struct RunContext {
  const ScenarioConfig& scenario;
  const ModelConfig& model;
  const CostModel& cost;
  const MemoryBudget& budget;
  const std::vector<RequestSpec>& requests;
  const std::vector<std::uint32_t>& finals;  // [requests] input + output
  const std::string& label;
  const CompareOptions& options;
  const AvailabilityConfig& availability;  // each system's engine: its CUDA-graph limit's form
};

// HiSparse's host_to_device_ratio under the scenario's rule: matched to the host budget
// (baselines.h, HiSparseMatchedRatio), or as configured.
double HiSparseRatio(const ScenarioConfig& sc, const PlacementRules& rules) {
  return sc.hisparse_match_host_budget ? HiSparseMatchedRatio(rules) : sc.hisparse_host_to_device_ratio;
}

PlacementRules MakeRules(const RunContext& ctx, SystemKind system) {
  const ScenarioConfig& sc = ctx.scenario;
  const CostModelInputs& in = ctx.cost.inputs();
  const std::uint32_t p = in.num_ranks, q = ctx.cost.queries();
  PlacementRules rules;
  rules.system = system;
  rules.mode = in.mode;
  rules.num_ranks = p;
  rules.device_bytes_per_rank = ctx.budget.device_kv_bytes;
  rules.host_bytes_per_rank = ctx.budget.host_bytes;
  rules.kv_bytes_per_token = static_cast<double>(ctx.cost.kv_bytes_per_token());
  rules.index_bytes_per_token = static_cast<double>(ctx.cost.index_bytes_per_token());
  // One step's distinct selections of a request: top-k for query 0 plus what each draft
  // query adds beyond the draft before it (the selection model's drafts are chained and keep
  // draft_keep of the previous one); UlaCache must hold them on device.
  rules.working_set_entries = static_cast<std::uint32_t>(std::ceil(
      ctx.model.top_k * (1.0 + (q - 1) * (1.0 - sc.selection.draft_keep))));
  rules.hisparse_buffer_entries = sc.hisparse_buffer_entries;
  rules.helix_tokens_per_block = sc.helix_tokens_per_block;
  if (system == SystemKind::kHiSparse) {
    rules.host_bytes_per_rank = HiSparseHostPoolBytes(rules, HiSparseRatio(sc, rules));
  }
  if (system == SystemKind::kVllmHiSparse) {
    // device_buffer_size defaults to (max decode query length + 1) x top-k rows.
    rules.hisparse_buffer_entries = (q + 1) * ctx.model.top_k;
    rules.tail_entries = sc.vllm_hisparse_tail_entries;
    rules.admission_window_entries = VllmHiSparseAdmissionWindow(sc);
  }
  if (system == SystemKind::kTrtllmOffload) {
    // gpu_cache_factor x the units one decode step selects (every query's top-k) plus the
    // unit being written, rounded up to whole pages.
    const double units = sc.trtllm_offload_gpu_cache_factor * double(q) * ctx.model.top_k + 1;
    const double page = sc.trtllm_offload_tokens_per_page;
    rules.hisparse_buffer_entries = static_cast<std::uint32_t>(std::ceil(units / page) * page);
  }
  if (system == SystemKind::kHelix) {
    rules.device_bytes_per_rank = std::max(0.0, rules.device_bytes_per_rank - ctx.cost.RedundantQkvExtraWeightBytes());
  }
  if (!HasHostTier(system)) rules.host_bytes_per_rank = 0;  // nothing of a running request on host
  rules.tp_buffer_entries = system == SystemKind::kUlaCacheAtHome ? 0  // attention at home: no local buffer
                            : in.mtp                                ? sc.tp_buffer_entries_per_request_mtp
                                                                    : sc.tp_buffer_entries_per_request;
  return rules;
}

// UlaCache's device carve-outs sized at the admission limit: index keys (index_tokens /
// divisor per rank: TP a 1/P stripe) and the TP local buffer (none at home); the rest of the
// device and all of the host hold the KV pools. false (with the note) if no room is left.
bool SizeUlaCache(const PlacementRules& rules, bool tp, std::uint32_t admitted, double index_tokens, double divisor,
                  serving_internal::SimSystemConfig& cfg, std::string& note) {
  const double kv = rules.kv_bytes_per_token;
  const double index_reserve = rules.index_bytes_per_token * index_tokens / divisor;
  const double buffer_entries = tp ? double(admitted) * rules.tp_buffer_entries : 0;
  const double device_pool = rules.device_bytes_per_rank - index_reserve - buffer_entries * kv;
  if (device_pool < kv) {
    note = "no device room left for the KV pool";
    return false;
  }
  cfg.device_tokens = static_cast<std::uint64_t>(device_pool / kv);
  cfg.host_tokens = static_cast<std::uint64_t>(rules.host_bytes_per_rank / kv);
  cfg.buffer_tokens = static_cast<std::uint64_t>(buffer_entries);
  return true;
}

// The curve point of batch size b from its measured steps (m of them), and its progress line.
CurvePoint MakePoint(const RunContext& ctx, SystemKind system, std::uint32_t b, double m, PointSums& s, bool blocked,
                     std::chrono::steady_clock::time_point wall0) {
  const CostModelInputs& in = ctx.cost.inputs();
  CurvePoint pt;
  pt.batch = b;
  pt.mean_batch = s.batch / m;
  pt.tput = s.tokens / s.t;
  pt.step_ms = 1e3 * s.t / m;
  pt.tokens_per_step = ctx.cost.ExpectedTokensPerStep(ctx.scenario.mtp_acceptance_rate);
  pt.hit_rate = s.distinct > 0 ? s.hits / s.distinct : 1;
  const double tb = static_cast<double>(ctx.cost.kv_bytes_per_token()) / 1e9 / m;
  pt.h2d_gb = s.h2d * tb, pt.d2h_gb = s.d2h * tb, pt.nvlink_gb = s.nv * tb;
  pt.arriving_gb = s.arriving / 1e9 / m;
  pt.time = s.time;
  pt.measured = std::move(s.measured);
  for (auto [v, unused] : TimeFields(pt.time, s.time)) *v /= m;
  if (ctx.options.progress) {
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - wall0).count();
    ctx.options.progress(fmt::format("  {} {} mtp={} {:<8} batch {:>4} (mean {:>6.1f}{}): {:>9.0f} tok/s, step {:>7.2f} ms, "
                                     "hit {:.3f}  [{:.1f} s]",
                                     ctx.label, ParallelModeName(in.mode), in.mtp ? "on" : "off", SystemName(system), b,
                                     pt.mean_batch, blocked ? ", queue head waits" : "", pt.tput, pt.step_ms, pt.hit_rate,
                                     secs));
  }
  return pt;
}

// One stderr line per system: the memory its rules give it.
void PrintBudget(const RunContext& ctx, SystemKind system, const PlacementRules& rules) {
  if (!ctx.options.progress) return;
  const CostModelInputs& in = ctx.cost.inputs();
  std::string why;
  switch (system) {
    case SystemKind::kHiSparse: {
      PlacementRules base = rules;
      base.host_bytes_per_rank = ctx.budget.host_bytes;
      const double r = HiSparseRatio(ctx.scenario, base);
      why = std::isinf(r) ? " (host pool: the largest SGLang's ratio allows, index keys of ratio x D tokens fill the device)"
                          : fmt::format(" (host pool = host_to_device_ratio {:.2f} x device pool{})", r,
                                        ctx.scenario.hisparse_match_host_budget ? ", matched to the host budget"
                                                                                : ", as configured");
      break;
    }
    case SystemKind::kVllmHiSparse:
      why = in.mode == ParallelMode::kTp ? fmt::format(" (one host pool of {:.0f} GB shared by the {} TP ranks)",
                                                       rules.host_bytes_per_rank * in.num_ranks / 1e9, in.num_ranks)
                                         : " (one host pool per DP replica)";
      break;
    case SystemKind::kHelix:
      why = fmt::format(" (device less {:.2f} GB of replicated q_b / W_UK)", ctx.cost.RedundantQkvExtraWeightBytes() / 1e9);
      break;
    case SystemKind::kTrtllmOffload:
      why = fmt::format(" (host_history_size per rank; GPU cache {} rows per request)", rules.hisparse_buffer_entries);
      break;
    default:
      if (!HasHostTier(system)) why = " (no host tier for running requests)";
      break;
  }
  ctx.options.progress(fmt::format("  budget {:<14} device {:.2f} GB/GPU, host {:.2f} GB/GPU{}", SystemName(system),
                                   rules.device_bytes_per_rank / 1e9, rules.host_bytes_per_rank / 1e9, why));
}

// The largest batch a curve runs: the admission limit, capped at its engine's CUDA-graph
// capture limit per engine instance (TP: the node; DP: each GPU's rank, P of them), in
// requests for SGLang (and UlaCache, TensorRT-LLM), in tokens for vLLM (engine_limits.h). A
// cap below the admission limit is said in the result's note.
std::uint32_t CurveLimit(const RunContext& ctx, SystemResult& result) {
  const CostModelInputs& in = ctx.cost.inputs();
  const SystemAvailability* a = ctx.availability.Find(SystemName(result.system));
  const std::string_view engine = a != nullptr ? std::string_view(a->engine) : std::string_view();
  const std::uint32_t q = ctx.cost.queries();
  const std::uint64_t per = CudaGraphRequestsPerInstance(engine, ctx.scenario.cuda_graph_max_batch,
                                                         in.rates.vllm_max_cudagraph_capture_size, q);
  const std::uint64_t cap = per * (in.mode == ParallelMode::kDp ? in.num_ranks : 1);
  if (per == 0 || result.admitted <= cap) return result.admitted;
  const std::string unit = CudaGraphLimitInTokens(engine)
                               ? fmt::format("{} requests{} ({} tokens)", per, q > 1 ? fmt::format(" of {} tokens", q) : "",
                                             in.rates.vllm_max_cudagraph_capture_size)
                               : fmt::format("{}", per);
  result.note = fmt::format("admits {} but decodes at most {}: the engines' CUDA-graph capture limit, {} per engine instance",
                            result.admitted, cap, unit);
  return static_cast<std::uint32_t>(cap);
}

// The batch sizes visited: the grid's below the limit, then the limit.
std::vector<std::uint32_t> BatchGrid(const ScenarioConfig& sc, std::uint32_t admitted) {
  std::vector<std::uint32_t> grid;
  for (std::uint32_t b : sc.sampling.batch_grid) {
    if (b < admitted) grid.push_back(b);
  }
  grid.push_back(admitted);
  return grid;
}

// Prefill KV arriving (StepCounts::arriving_*): bytes landing on one GPU per output token
// the node produces. In steady state a request arrives per L_out output tokens (L_out: the
// workload's mean output length), carrying its prompt's KV and index keys, placed as the
// system places a history (TokenPart: device, host; UlaCache's either-tier bytes land on host,
// where its history lives past the working set); DP: one of the P GPUs receives it.
// Sharing workloads skip part of each prompt's prefill: not charged there (empty requests).
struct ArrivingKv {
  double host = 0, device = 0;
};
ArrivingKv ArrivingPerOutputToken(const std::vector<RequestSpec>& requests, const PlacementRules& rules) {
  ArrivingKv a;
  double output = 0;
  for (const RequestSpec& r : requests) {
    const RankDemand d = serving_internal::TokenPart(rules, r.input_tokens);
    a.host += d.host + d.either;
    a.device += d.device;
    output += r.output_tokens;
  }
  if (!(output > 0)) return {};
  const double share = rules.mode == ParallelMode::kDp ? 1.0 / rules.num_ranks : 1.0;
  a.host *= share / output;
  a.device *= share / output;
  return a;
}

// What the cost model prices for one step of `system`: `local` requests simulated of
// `total` decoding on all GPUs, with the step's counters; `arriving` x the node's output
// tokens of the step is the prefill KV it receives. `hisparse_prefetch`: SGLang's HiSparse
// runs its shared-index prefetch (ScenarioConfig::hisparse_shared_index_prefetch).
StepCounts CountsOf(const serving_internal::SimSystem& sys, SystemKind system, const serving_internal::SimCounters& c,
                    double local, double total, double history_sum, std::uint32_t p, bool hisparse_prefetch,
                    const ArrivingKv& arriving = {}, double tokens_per_request = 0) {
  StepCounts k;
  k.arriving_host_bytes = arriving.host * total * tokens_per_request;
  k.arriving_device_bytes = arriving.device * total * tokens_per_request;
  k.batch_local = local;
  k.batch_total = total;
  k.history_scored = sys.striped_indexer() ? history_sum / p : history_sum;
  k.striped_indexer = sys.striped_indexer();
  k.h2d_entries = c.h2d;
  k.d2h_entries = c.d2h;
  k.nvlink_entries = c.nvlink;
  k.attention_at_home = sys.attention_at_home();
  k.home_entries = c.home;
  k.distinct_entries = c.batch_distinct;
  // vllm_hisparse's resolver and gather kernels run per index group on a copy stream,
  // overlapped within the group like UlaCache's copies. SGLang's HiSparse with its
  // shared-index prefetch: the group's anchor layer plans and swaps in on the forward
  // stream (the first layer's share exposed, as the pipeline rule exposes everyone's), its
  // shared layers' copies replay that plan on a side stream; without it, a swap-in per layer
  // on the forward stream.
  // TensorRT-LLM's offload: its fetch kernels taken as vLLM's (per group, on a copy stream;
  // an assumption: COST_MODEL.md "The systems engines run today").
  const bool hisparse = system == SystemKind::kHiSparse;
  k.planner_per_group = IsUlaCache(system) || system == SystemKind::kVllmHiSparse || system == SystemKind::kTrtllmOffload ||
                        (hisparse && hisparse_prefetch);
  k.swap_in_per_layer = hisparse && !hisparse_prefetch;
  k.home_exchange = system == SystemKind::kHelix       ? HomeExchange::kHelix
                    : system == SystemKind::kDcpSglang ? HomeExchange::kDcpPacked
                    : system == SystemKind::kDcp       ? HomeExchange::kDcp
                                                       : HomeExchange::kUlaCache;
  k.redundant_qkv = system == SystemKind::kHelix;
  return k;
}

Result<SystemResult> RunSystem(const RunContext& ctx, SystemKind system) {
  const ScenarioConfig& sc = ctx.scenario;
  const CostModelInputs& in = ctx.cost.inputs();
  const bool tp = in.mode == ParallelMode::kTp;
  const std::uint32_t p = in.num_ranks, q = ctx.cost.queries();
  SystemResult result;
  result.system = system;

  const PlacementRules rules = MakeRules(ctx, system);
  PrintBudget(ctx, system, rules);
  const ArrivingKv arriving = ArrivingPerOutputToken(ctx.requests, rules);
  result.device_budget_bytes = rules.device_bytes_per_rank;
  result.host_budget_bytes = rules.host_bytes_per_rank;
  result.admitted = MaxAdmitted(rules, ctx.finals);
  {
    double admitted_tokens = 0;
    for (std::uint32_t i = 0; i < result.admitted; ++i) admitted_tokens += ctx.finals[i];
    result.fill = FillOf(rules, admitted_tokens, HasHostTier(system) ? ctx.budget.host_bytes : 0);
  }
  if (result.admitted == 0) {
    result.note = "admits no request: one request's history does not fit its placement rules";
    return result;
  }

  serving_internal::SimSystemConfig cfg;
  cfg.rules = rules;
  if (!tp) cfg.rules.num_ranks = 1;  // the simulated rank
  cfg.group_entry_bytes = ctx.model.group_entry_bytes();
  cfg.resident_device_bytes = rules.device_bytes_per_rank;
  cfg.host_shadows = ctx.options.host_shadows;
  if (IsUlaCache(system)) {
    double sum_final = 0;
    for (std::uint32_t i = 0; i < result.admitted; ++i) sum_final += ctx.finals[i];
    if (!SizeUlaCache(rules, tp, result.admitted, sum_final, p, cfg, result.note)) return result;
  }
  auto made = serving_internal::MakeSimSystem(cfg);
  if (!made) return std::unexpected(made.error());
  serving_internal::SimSystem& sys = **made;
  SelectionModelParams sp = sc.selection;
  sp.top_k = ctx.model.top_k;
  auto selection = SelectionModel::Create(sp);
  if (!selection) return std::unexpected(selection.error());

  const std::vector<std::uint32_t> grid = BatchGrid(sc, CurveLimit(ctx, result));

  std::deque<Active> active;
  std::size_t next = 0;
  bool blocked = false;
  auto fill = [&](std::uint32_t target) -> Status {
    blocked = false;
    while (active.size() < target && next < ctx.requests.size()) {
      const RequestSpec& r = ctx.requests[next];
      workload_internal::Rng rng(workload_internal::StreamSeed(sc.sampling.seed, r.id.value()));
      const auto done = static_cast<std::uint32_t>(rng.Uniform01() * (r.output_tokens - 1));
      auto ok = sys.Admit(r.id.value(), r.input_tokens + done, ctx.finals[next]);
      if (!ok) return std::unexpected(ok.error());
      if (!*ok) {
        blocked = true;
        return Ok();  // the queue head waits
      }
      active.push_back(Active{r.id.value(), r.input_tokens + done, r.output_tokens - done, std::move(rng)});
      ++next;
    }
    return Ok();
  };

  std::vector<std::uint64_t> ids;
  std::vector<std::vector<std::uint32_t>> sel;
  std::vector<std::vector<std::uint32_t>> queries;
  const auto wall0 = std::chrono::steady_clock::now();
  for (std::uint32_t b : grid) {
    const std::uint32_t target = tp ? b : (b + p - 1) / p;
    ULA_RETURN_IF_ERROR(fill(target));
    if (active.empty()) {
      result.note = fmt::format("batch {}: no request could be admitted", b);
      break;
    }
    PointSums sums;
    const std::uint32_t steps = sc.sampling.warmup_steps + sc.sampling.measure_steps;
    bool failed = false;
    for (std::uint32_t s = 0; s < steps; ++s) {
      const bool measured = s >= sc.sampling.warmup_steps;
      ids.clear();
      sel.resize(active.size());
      double history_sum = 0;
      for (std::size_t i = 0; i < active.size(); ++i) {
        const Active& a = active[i];
        ids.push_back(a.id);
        ULA_RETURN_IF_ERROR(selection->Step(a.id, a.history, q, queries));
        sel[i].clear();
        for (const auto& qs : queries) sel[i].insert(sel[i].end(), qs.begin(), qs.end());
        history_sum += a.history;
      }
      serving_internal::SimCounters c;
      if (auto st = sys.Step(ids, std::span(sel).first(active.size()), c); !st) {
        if (st.error().code() != ErrorCode::kResourceExhausted) return std::unexpected(st.error());
        result.note = fmt::format("batch {}: {}", b, st.error().message());
        failed = true;
        break;
      }
      const double local = static_cast<double>(active.size());
      for (Active& a : active) {
        std::uint32_t n = 1;
        if (in.mtp) {
          for (std::uint32_t d = 0; d < in.draft_tokens && a.rng.Uniform01() < sc.mtp_acceptance_rate; ++d) ++n;
        }
        n = std::min(n, a.remaining);
        ULA_RETURN_IF_ERROR(sys.Append(a.id, a.history, n, c));
        a.history += n;
        a.remaining -= n;
      }
      // DP: the other ranks hold the rest of the batch (rank 0 holds the largest share).
      const StepCounts k =
          CountsOf(sys, system, c, local, tp ? local : std::max(local, double(b) * local / target), history_sum, p,
                   sc.hisparse_shared_index_prefetch, arriving, ctx.cost.ExpectedTokensPerStep(sc.mtp_acceptance_rate));
      ULA_RETURN_IF_ERROR(ctx.cost.CheckCounts(k));
      const StepTime t = ctx.cost.Time(ctx.cost.Work(k));
      if (measured) sums.Add(k, t, c, ctx.cost.ExpectedTokensPerStep(sc.mtp_acceptance_rate));
      // Continuous batching: finished requests leave, waiting ones enter.
      for (auto it = active.begin(); it != active.end();) {
        if (it->remaining == 0) {
          ULA_RETURN_IF_ERROR(sys.Finish(it->id));
          selection->Forget(it->id);
          it = active.erase(it);
        } else {
          ++it;
        }
      }
      ULA_RETURN_IF_ERROR(fill(target));
      if (active.empty()) break;
    }
    if (failed) break;
    if (sums.t <= 0) continue;
    result.curve.push_back(MakePoint(ctx, system, b, sc.sampling.measure_steps, sums, blocked, wall0));
  }
  SetPeak(result);
  return result;
}

// The decode loop on a sharing workload (shared_admission.h): the same loop as RunSystem,
// with the shared ledger of all ranks deciding admission (prefixes charged once per holder,
// idle prefixes evicted LRU for room, DP requests routed by prefix over every rank) and the
// system adapter of the simulated rank (TP: every request; DP: those routed to rank 0)
// adopting cached prefixes. Requests on other DP ranks are advanced (tokens, finishes) but
// not simulated; the step is priced for rank 0's batch within the whole batch.
struct SharedActive {
  std::uint64_t item = 0;       // index in the stream
  std::uint32_t holder = 0;
  bool local = false;           // on the simulated rank
  std::uint32_t history = 0;
  std::uint32_t remaining = 0;
  workload_internal::Rng rng{0};
};

// The admission limit of a sharing workload and the figures at it (SharingResult's first
// part). false: no request fits (result.note says so).
Result<bool> SharedLimit(const RunContext& ctx, const serving_internal::SharedStream& stream, const PlacementRules& rules,
                         SystemResult& result, serving_internal::SharedAdmissionLimit& lim) {
  const bool tp = ctx.cost.inputs().mode == ParallelMode::kTp;
  const std::uint32_t p = ctx.cost.inputs().num_ranks;
  auto got = serving_internal::MaxAdmittedShared(rules, stream);
  if (!got) return std::unexpected(got.error());
  lim = *got;
  result.admitted = lim.admitted;
  SharingResult& sh = result.sharing;
  sh.on = true;
  sh.distinct_fraction = lim.named_tokens > 0 ? double(lim.stored_tokens) / double(lim.named_tokens) : 0;
  // TP all-GPU and SGLang HiSparse: a full copy per GPU (MLA's latent KV is replicated under
  // TP, HiSparse's host pool is per GPU); the striped systems and vLLM's shared host pool: one.
  const bool copies = result.system == SystemKind::kAllGpu || result.system == SystemKind::kHiSparse ||
                      result.system == SystemKind::kTrtllmOffload;
  sh.copies_per_node = tp && copies ? p : 1;
  sh.prefill_saved_at_limit = lim.prefill_saved;
  sh.input_tokens_at_limit = lim.input_tokens;
  sh.max_rank_load = !tp && lim.admitted > 0 ? double(lim.max_load) * p / lim.admitted : 1;
  if (result.admitted == 0) {
    result.note = "admits no request: one request's history does not fit its placement rules";
    return false;
  }
  return true;
}

// One continuing simulation of a sharing workload: the queue, the shared ledger, the
// simulated rank's adapter and the selection model, advanced a step at a time.
class SharedRun {
 public:
  SharedRun(const RunContext& ctx, const serving_internal::SharedStream& stream, SystemKind system,
            serving_internal::SimSystem& sys, serving_internal::SharedLedger& ledger, SelectionModel& selection,
            SharingResult& sh)
      : ctx_(ctx), stream_(stream), system_(system), sys_(sys), ledger_(ledger), selection_(selection), sh_(sh),
        queue_(stream.arrivals.begin(), stream.arrivals.end()),
        computed_(stream.items.empty() ? 0 : stream.items.back().group + 1, 0) {}

  bool empty() const { return active_.empty(); }
  bool blocked() const { return blocked_; }

  // Admits queued requests until `target` decode at once or the queue head does not fit.
  Status Fill(std::uint32_t target) {
    blocked_ = false;
    while (active_.size() < target && !queue_.empty()) {
      auto admitted = AdmitHead();
      if (!admitted) return std::unexpected(admitted.error());
      if (!*admitted) {
        blocked_ = true;
        return Ok();  // the queue head waits
      }
    }
    return Ok();
  }

  // One decode step; false (with `note`) when the adapter ran out of room.
  Result<bool> Step(bool measured, PointSums& sums, std::string& note, std::uint32_t b) {
    const ScenarioConfig& sc = ctx_.scenario;
    const CostModelInputs& in = ctx_.cost.inputs();
    const std::uint32_t q = ctx_.cost.queries();
    ids_.clear();
    sel_.resize(active_.size());
    double history_sum = 0;
    std::size_t n = 0;
    for (const SharedActive& a : active_) {
      if (!a.local) continue;
      ids_.push_back(stream_.items[a.item].id);
      ULA_RETURN_IF_ERROR(selection_.Step(stream_.items[a.item].id, a.history, q, queries_));
      sel_[n].clear();
      for (const auto& qs : queries_) sel_[n].insert(sel_[n].end(), qs.begin(), qs.end());
      history_sum += a.history;
      ++n;
    }
    serving_internal::SimCounters c;
    if (n > 0) {
      if (auto st = sys_.Step(ids_, std::span(sel_).first(n), c); !st) {
        if (st.error().code() != ErrorCode::kResourceExhausted) return std::unexpected(st.error());
        note = fmt::format("batch {}: {}", b, st.error().message());
        return false;
      }
    }
    for (SharedActive& a : active_) {
      std::uint32_t m = 1;
      if (in.mtp) {
        for (std::uint32_t d = 0; d < in.draft_tokens && a.rng.Uniform01() < sc.mtp_acceptance_rate; ++d) ++m;
      }
      m = std::min(m, a.remaining);
      if (a.local) ULA_RETURN_IF_ERROR(sys_.Append(stream_.items[a.item].id, a.history, m, c));
      a.history += m;
      a.remaining -= m;
    }
    if (n > 0) {
      const bool tp = in.mode == ParallelMode::kTp;
      const double local = static_cast<double>(n);
      const StepCounts k =
          CountsOf(sys_, system_, c, local, tp ? local : static_cast<double>(active_.size()), history_sum, in.num_ranks,
                   sc.hisparse_shared_index_prefetch);
      ULA_RETURN_IF_ERROR(ctx_.cost.CheckCounts(k));
      const StepTime t = ctx_.cost.Time(ctx_.cost.Work(k));
      if (measured) sums.Add(k, t, c, ctx_.cost.ExpectedTokensPerStep(sc.mtp_acceptance_rate));
    }
    return true;
  }

  // Finished requests leave (a finished multi-turn turn queues its session's next turn).
  Status Retire() {
    for (auto it = active_.begin(); it != active_.end();) {
      if (it->remaining == 0) {
        const serving_internal::SharedItem& item = stream_.items[it->item];
        if (it->local) ULA_RETURN_IF_ERROR(sys_.FinishShared(item.id, item.group, item.extends));
        ULA_RETURN_IF_ERROR(ledger_.Release(item));
        if (it->local) selection_.Forget(item.id);
        // The session's next turn comes at once (an agent re-sends as soon as it has the answer).
        if (item.next >= 0) queue_.push_front(static_cast<std::uint64_t>(item.next));
        it = active_.erase(it);
      } else {
        ++it;
      }
    }
    return Ok();
  }

 private:
  // The queue head: through the shared ledger, then (on the simulated rank) the adapter.
  Result<bool> AdmitHead() {
    const ScenarioConfig& sc = ctx_.scenario;
    const bool tp = ctx_.cost.inputs().mode == ParallelMode::kTp;
    const serving_internal::SharedItem& it = stream_.items[queue_.front()];
    auto a = ledger_.TryAdmit(it);
    if (!a) return std::unexpected(a.error());
    const bool local = tp || a->holder == 0;
    if (local) {
      for (std::uint32_t g : a->evicted) ULA_RETURN_IF_ERROR(sys_.EvictPrefix(g));
    }
    sh_.evictions += a->evicted.size();
    if (!a->admitted) return false;
    workload_internal::Rng rng(workload_internal::StreamSeed(sc.sampling.seed, it.id));
    // Multi-turn turns after the entry one start at their first output token (arrivals
    // holds one entry turn per session, in session order).
    const bool fresh = it.extends && it.turn > 0 && queue_.front() != stream_.arrivals[it.group];
    const auto done = fresh ? 0u : static_cast<std::uint32_t>(rng.Uniform01() * (it.output - 1));
    if (local) {
      auto ok = sys_.AdmitShared(it.id, it.input + done, it.final_tokens(), it.group, a->matched, a->cached);
      if (!ok) return std::unexpected(ok.error());
      if (!*ok) {
        ULA_RETURN_IF_ERROR(ledger_.Cancel(it));
        return false;
      }
    }
    sh_.prefill_saved += a->saved();
    sh_.prefill_computed += it.input - a->saved();
    const std::uint32_t before = std::min(computed_[it.group], it.prefix);
    if (before > a->saved()) sh_.recomputed += before - a->saved();
    computed_[it.group] = std::max(computed_[it.group], it.extends ? it.input : it.prefix);
    active_.push_back(SharedActive{queue_.front(), a->holder, local, it.input + done, it.output - done, std::move(rng)});
    queue_.pop_front();
    return true;
  }

  const RunContext& ctx_;
  const serving_internal::SharedStream& stream_;
  SystemKind system_;
  serving_internal::SimSystem& sys_;
  serving_internal::SharedLedger& ledger_;
  SelectionModel& selection_;
  SharingResult& sh_;
  std::deque<SharedActive> active_;
  std::deque<std::uint64_t> queue_;
  std::vector<std::uint32_t> computed_;  // prefix tokens prefilled so far, per group
  bool blocked_ = false;
  std::vector<std::uint64_t> ids_;
  std::vector<std::vector<std::uint32_t>> sel_;
  std::vector<std::vector<std::uint32_t>> queries_;
};

Result<SystemResult> RunSharedSystem(const RunContext& ctx, const serving_internal::SharedStream& stream,
                                     SystemKind system) {
  const ScenarioConfig& sc = ctx.scenario;
  const bool tp = ctx.cost.inputs().mode == ParallelMode::kTp;
  const std::uint32_t p = ctx.cost.inputs().num_ranks;
  SystemResult result;
  result.system = system;
  const PlacementRules rules = MakeRules(ctx, system);
  PrintBudget(ctx, system, rules);
  result.device_budget_bytes = rules.device_bytes_per_rank;
  result.host_budget_bytes = rules.host_bytes_per_rank;
  serving_internal::SharedAdmissionLimit lim;
  auto fits = SharedLimit(ctx, stream, rules, result, lim);
  result.fill = FillOf(rules, double(lim.stored_tokens), HasHostTier(system) ? ctx.budget.host_bytes : 0);
  if (!fits) return std::unexpected(fits.error());
  if (!*fits) return result;

  serving_internal::SimSystemConfig cfg;
  cfg.rules = rules;
  if (!tp) cfg.rules.num_ranks = 1;  // the simulated rank
  // The shared ledger decides admission; the adapter's own ledger must not bind.
  cfg.rules.device_bytes_per_rank = cfg.rules.host_bytes_per_rank = 1e30;
  cfg.group_entry_bytes = ctx.model.group_entry_bytes();
  cfg.resident_device_bytes = rules.device_bytes_per_rank;
  cfg.host_shadows = ctx.options.host_shadows;
  if (IsUlaCache(system)) {
    // Index keys of the stored (deduplicated) tokens: TP a 1/P stripe of the node's, DP the
    // fullest rank's.
    const double stored = tp ? double(lim.stored_tokens) : double(lim.max_holder_stored);
    if (!SizeUlaCache(rules, tp, result.admitted, stored, tp ? p : 1, cfg, result.note)) return result;
  }
  auto made = serving_internal::MakeSimSystem(cfg);
  if (!made) return std::unexpected(made.error());
  auto ledger = serving_internal::SharedLedger::Create(rules, stream.items);
  if (!ledger) return std::unexpected(ledger.error());
  SelectionModelParams sp = sc.selection;
  sp.top_k = ctx.model.top_k;
  auto selection = SelectionModel::Create(sp);
  if (!selection) return std::unexpected(selection.error());

  SharedRun run(ctx, stream, system, **made, *ledger, *selection, result.sharing);
  const auto wall0 = std::chrono::steady_clock::now();
  for (std::uint32_t b : BatchGrid(sc, CurveLimit(ctx, result))) {
    ULA_RETURN_IF_ERROR(run.Fill(b));
    if (run.empty()) {
      result.note = fmt::format("batch {}: no request could be admitted", b);
      break;
    }
    PointSums sums;
    const std::uint32_t steps = sc.sampling.warmup_steps + sc.sampling.measure_steps;
    bool failed = false;
    for (std::uint32_t s = 0; s < steps; ++s) {
      auto ok = run.Step(s >= sc.sampling.warmup_steps, sums, result.note, b);
      if (!ok) return std::unexpected(ok.error());
      if (!*ok) {
        failed = true;
        break;
      }
      ULA_RETURN_IF_ERROR(run.Retire());
      ULA_RETURN_IF_ERROR(run.Fill(b));
      if (run.empty()) break;
    }
    if (failed) break;
    if (sums.t <= 0 || sums.steps == 0) continue;
    result.curve.push_back(MakePoint(ctx, system, b, sums.steps, sums, run.blocked(), wall0));
  }
  SetPeak(result);
  return result;
}

}  // namespace

Result<ComparisonResult> RunComparison(const ScenarioConfig& scenario_in, const CompareOptions& options) {
  if (auto s = scenario_in.Validate(); !s) return std::unexpected(s.error());
  const std::filesystem::path dir = options.config_dir.empty() ? DefaultConfigDir() : options.config_dir;
  ScenarioConfig scenario = scenario_in;  // with the selection fit read from dir
  ULA_RETURN_IF_ERROR(ResolveScenarioSelection(scenario, dir));
  auto model = LoadModelConfigByName(scenario.model, dir);
  if (!model) return std::unexpected(model.error());
  auto costs = LoadModelCostConfigByName(scenario.model_costs, dir);
  if (!costs) return std::unexpected(costs.error());
  // A sharing workload runs the shared loop over its stream; the others the
  // default one over GenerateWorkload's requests.
  auto shared = IsSharedWorkload(scenario.workload, dir);
  if (!shared) return std::unexpected(shared.error());
  std::optional<serving_internal::SharedStream> stream;
  std::vector<RequestSpec> requests;
  std::vector<std::uint32_t> finals;
  std::uint32_t draft_tokens = 0;
  if (*shared) {
    auto swl = LoadSharedWorkloadConfigByName(scenario.workload, dir);
    if (!swl) return std::unexpected(swl.error());
    auto st = serving_internal::MakeSharedStream(*swl, scenario.sampling.max_requests, scenario.sampling.seed);
    if (!st) return std::unexpected(st.error());
    stream = std::move(*st);
    draft_tokens = swl->draft_tokens;
  } else {
    auto wl = LoadWorkloadConfigByName(scenario.workload, dir);
    if (!wl) return std::unexpected(wl.error());
    wl->num_requests = scenario.sampling.max_requests;
    auto generated = GenerateWorkload(*wl);
    if (!generated) return std::unexpected(generated.error());
    requests = std::move(*generated);
    for (const RequestSpec& r : requests) finals.push_back(r.input_tokens + r.output_tokens);
    draft_tokens = wl->draft_tokens;
  }

  auto avail = LoadAvailabilityConfig(dir);
  if (!avail) return std::unexpected(avail.error());
  ULA_RETURN_IF_ERROR(CheckEverySystemListed(*avail));

  ComparisonResult out;
  out.scenario = scenario.name;
  out.model = scenario.model;
  for (const ScenarioEntry& e : scenario.configs) {
    const auto t0 = std::chrono::steady_clock::now();
    auto hw = LoadHardwareConfigByName(e.hardware, dir);
    if (!hw) return std::unexpected(hw.error());
    auto rates = LoadComputeRatesByName(e.hardware, dir);
    if (!rates) return std::unexpected(rates.error());
    CostModelInputs ci;
    ci.model = *model;
    ci.costs = *costs;
    ci.hardware = *hw;
    ci.rates = *rates;
    ci.mode = e.mode;
    ci.mtp = e.mtp;
    ci.num_ranks = scenario.num_ranks;
    ci.draft_tokens = draft_tokens;
    ci.kernel_overhead_s_per_layer = scenario.kernel_overhead_s_per_layer;
    ci.planner_kernels_per_call = scenario.planner_kernels_per_call;
    ci.candidate_bytes = scenario.candidate_bytes;
    ci.indexer_logit_bytes = scenario.indexer_logit_bytes;
    ci.activation_reserve_fraction = scenario.activation_reserve_fraction;
    auto cm = CostModel::Create(ci);
    if (!cm) return std::unexpected(cm.error());
    ConfigResult cr;
    cr.entry = e;
    cr.cost_inputs = ci;
    cr.mtp_acceptance_rate = scenario.mtp_acceptance_rate;
    cr.hardware_label = HardwareLabel(scenario.num_ranks, e.hardware);
    cr.budget = cm->Budget();
    if (options.progress) {
      options.progress(fmt::format("{} {} mtp={}:", cr.hardware_label, ParallelModeName(e.mode), e.mtp ? "on" : "off"));
      for (const std::string& line : cr.budget.derivation) options.progress("  " + line);
    }
    const RunContext ctx{scenario, *model, *cm, cr.budget, requests, finals, cr.hardware_label, options, *avail};
    for (SystemKind s : kAllSystems) {
      if (!SystemRunsIn(s, e.mode)) continue;  // ulacache_home: TP only
      auto r = stream ? RunSharedSystem(ctx, *stream, s) : RunSystem(ctx, s);
      if (!r) return std::unexpected(r.error());
      const SystemAvailability& a = *avail->Find(SystemName(s));
      r->engine = a.engine;
      r->proposed = a.proposed;
      r->why_not = WhyNotShipped(a, e);
      r->ships = r->why_not.empty();
      cr.systems.push_back(std::move(*r));
    }
    cr.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    out.configs.push_back(std::move(cr));
  }
  return out;
}

Result<ComparisonResult> RepriceComparison(const ComparisonResult& result,
                                           const std::function<void(CostModelInputs&)>& adjust) {
  ComparisonResult out = result;
  for (ConfigResult& cr : out.configs) {
    CostModelInputs in = cr.cost_inputs;
    if (adjust) adjust(in);
    auto cm = CostModel::Create(in);
    if (!cm) return std::unexpected(cm.error());
    cr.cost_inputs = in;
    cr.budget = cm->Budget();
    const double tokens = cm->ExpectedTokensPerStep(cr.mtp_acceptance_rate);
    for (SystemResult& sr : cr.systems) {
      for (CurvePoint& pt : sr.curve) {
        if (pt.measured.empty()) continue;
        StepTime sum;
        double sum_tokens = 0;
        for (const StepCounts& k : pt.measured) {
          ULA_RETURN_IF_ERROR(cm->CheckCounts(k));
          const StepTime t = cm->Time(cm->Work(k));
          for (auto [acc, v] : TimeFields(sum, t)) *acc += v;
          sum_tokens += k.batch_total * tokens;
        }
        const double m = static_cast<double>(pt.measured.size());
        pt.tput = sum.total > 0 ? sum_tokens / sum.total : 0;
        pt.step_ms = 1e3 * sum.total / m;
        pt.time = sum;
        for (auto [v, unused] : TimeFields(pt.time, sum)) *v /= m;
      }
      SetPeak(sr);
    }
  }
  return out;
}

}  // namespace ula
