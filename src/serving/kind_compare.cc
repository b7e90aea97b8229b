// The per-kind comparison driver (kind_compare.h).
#include "serving/kind_compare.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cmath>

#include "serving/engine_limits.h"
#include "serving/kind_space_admission.h"
#include "space/kind_frames.h"
#include "workload/calibration.h"
#include "workload/workload.h"

namespace ula {
namespace {

std::string Label(std::uint32_t p, std::string name) {
  for (char& ch : name) ch = static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
  return fmt::format("{}x{}", p, name);
}

// Selections per step per GPU that cross the host link: each query's top-k in each CSA layer
// turns over by the measured `turnover`; a system with a per-request buffer misses those once
// the request's C4 entries outgrow the buffer; UlaCache misses those that land on host
// (`landing`, AdmitInSpace), in TP only its own stripe's (attention at home: 1/P of each
// selection is homed on a rank).
double HostFetches(KindSystem s, const KindShape& shape, const PoolSetup& setup, double turnover,
                   double batch_local, double context, double landing) {
  const double c4 = std::floor(context / shape.csa_ratio);
  const double selected = std::min(c4, double(shape.top_k));
  const double turned = batch_local * setup.queries * shape.csa_layers * selected * turnover;
  switch (s) {
    case KindSystem::kSglangHiSparse: return c4 > setup.hisparse_buffer_entries ? turned : 0;
    case KindSystem::kTrtllmOffload:
      return c4 > setup.trtllm_gpu_cache_factor * setup.queries * shape.top_k + 1 ? turned : 0;
    case KindSystem::kUlaCache:
      return turned * landing / (setup.mode == ParallelMode::kTp ? double(setup.num_ranks) : 1.0);
    default: return 0;
  }
}

// UlaCache's admission: a run of its space at the setup's budget (kind_space_admission.h).
// The admitted requests' bytes per kind (exact entries, as every row's fill) and the space's
// budget per rank; landing (optional): [b] for the first b admitted requests, the chance that
// a turned-over selection lands on host. The tiers are exclusive and PB-LRU keeps the
// previous step's top-k on device (its newest buckets), so a turned-over selection is one of
// the entries outside it, and the run left H of those C - S on host: H / (C - S), C the C4
// entries, H those on host, S the previous step's top-k (min(C4 entries, top-k) a request,
// its 1/P stripe in TP); 1 when the device share cannot hold S.
Result<Admission> AdmitInSpace(const ModelConfig& model, const KindShape& shape, const PoolPlan& plan,
                               const PoolSetup& setup, std::uint32_t draft_tokens,
                               std::span<const std::uint32_t> finals, std::vector<double>* landing) {
  const KindSpaceSetup ks{.mode = setup.mode, .num_ranks = setup.num_ranks, .mtp = setup.mtp,
                          .draft_tokens = draft_tokens, .device_bytes = setup.device_bytes, .host_bytes = setup.host_bytes};
  auto run = RunKindSpace(model, ks, finals);
  if (!run) return std::unexpected(run.error());
  Admission a;
  a.admitted = run->admitted;
  a.binds = run->binds;
  for (std::uint32_t i = 0; i < a.admitted; ++i) a.held += ExactKindUse(shape, finals[i]);
  const double memory = plan.memory_bytes * setup.num_ranks;
  a.fill = memory > 0 ? a.held.total() / memory : 0;
  a.host_share_csa = run->host_share_csa.back();
  // Pools {device, space}: the fullest rank's device frames in use (resident kinds' frames
  // and the C4 entries on device) and its whole space in use (those and the C4 entries on host).
  const double frame = double(kKindFrameBytes), device = double(run->frames_per_rank) * frame;
  const double space = device + double(run->c4_entry_bytes) * std::floor(setup.host_bytes / double(run->c4_entry_bytes));
  a.pool_fill.assign(2, 0.0);
  for (const KindBudget& b : run->ranks) {
    const double resident = double(b.frames - b.free_frames) * frame;
    a.pool_fill[0] = std::max(a.pool_fill[0], (resident + double(b.c4_on_device) * run->c4_entry_bytes) / device);
    a.pool_fill[1] = std::max(a.pool_fill[1], (resident + double(b.c4_entries) * run->c4_entry_bytes) / space);
  }
  a.space = std::move(run->ranks);
  a.space_kinds = std::move(run->kinds);
  if (landing != nullptr) {
    const double stripes = setup.mode == ParallelMode::kTp ? double(setup.num_ranks) : 1.0;
    landing->assign(1, 0.0);
    double selected = 0;
    for (std::uint32_t b = 1; b <= a.admitted; ++b) {
      selected += std::min(std::floor(double(finals[b - 1]) / shape.csa_ratio), double(shape.top_k)) / stripes;
      const double c4 = double(run->c4_entries_csa[b]), host = run->host_share_csa[b] * c4;
      const double outside = c4 - selected;
      landing->push_back(host <= 0 ? 0.0 : outside <= host ? 1.0 : host / outside);
    }
  }
  return a;
}

}  // namespace

Result<KindTurnover> MeasureKindTurnover(const KindCompareConfig& kc, const std::filesystem::path& dir,
                                         std::optional<double> query_keep) {
  ULA_RETURN_IF_ERROR(kc.Validate());
  const auto bad = [&](std::string_view why) {
    return MakeError(ErrorCode::kInvalidArgument, fmt::format("field 'selection_workload': workload '{}' {}", kc.selection_workload, why));
  };
  auto model = LoadModelConfigByName(kc.model, dir);
  if (!model) return std::unexpected(model.error());
  auto shape = MakeKindShape(*model, /*mtp=*/false);
  if (!shape) return std::unexpected(shape.error());
  auto schedule = LoadDecodeSimConfigByName(kc.selection_workload, dir);
  if (!schedule) return bad(schedule.error().message());
  if (schedule->model != kc.model) return bad(fmt::format("runs model '{}', not '{}'", schedule->model, kc.model));
  if (schedule->tokens_per_entry != shape->csa_ratio) {
    return bad(fmt::format("has tokens_per_entry {}, not the model's CSA ratio {}: not its C4 indexer", schedule->tokens_per_entry,
                           shape->csa_ratio));
  }
  if (schedule->decode_steps < 2) return bad("needs at least 2 decode steps (a turnover is between two)");
  if (schedule->prompt_entries() < shape->top_k) {
    return bad(fmt::format("has {} prompt entries, fewer than the top-k {}", schedule->prompt_entries(), shape->top_k));
  }
  if (query_keep) {
    schedule->query_keep = *query_keep;
    ULA_RETURN_IF_ERROR(schedule->Validate());
  }
  auto run = RunRealIndexer(model->indexer_shape(), *schedule, /*record_trace=*/false);
  if (!run) return std::unexpected(run.error());
  KindTurnover t;
  t.workload = kc.selection_workload;
  t.query_keep = schedule->query_keep;
  t.queries = schedule->queries_per_step();
  t.single = 1.0 - run->overlap.mean;
  t.per_query = run->union_turnover / t.queries;
  t.seconds = run->seconds;
  return t;
}

Result<KindComparison> RunKindComparison(const KindCompareConfig& kc, const std::filesystem::path& dir) {
  auto turnover = MeasureKindTurnover(kc, dir);
  if (!turnover) return std::unexpected(turnover.error());
  return RunKindComparison(kc, dir, *turnover);
}

Result<KindComparison> RunKindComparison(const KindCompareConfig& kc, const std::filesystem::path& dir,
                                         const KindTurnover& turnover) {
  ULA_RETURN_IF_ERROR(kc.Validate());
  for (double t : {turnover.single, turnover.per_query}) {
    if (!(t >= 0 && t <= 1)) {
      return MakeError(ErrorCode::kInvalidArgument, fmt::format("selection turnover {} of workload '{}' is outside [0, 1]", t, turnover.workload));
    }
  }
  auto scenario = LoadScenarioConfig(dir / "scenarios" / (kc.scenario + ".json"), dir);
  if (!scenario) return std::unexpected(scenario.error());
  auto model = LoadModelConfigByName(kc.model, dir);
  if (!model) return std::unexpected(model.error());
  auto wl = LoadWorkloadConfigByName(scenario->workload, dir);
  if (!wl) return std::unexpected(wl.error());
  wl->num_requests = scenario->sampling.max_requests;
  auto requests = GenerateWorkload(*wl);
  if (!requests) return std::unexpected(requests.error());
  std::vector<std::uint32_t> finals;
  for (const RequestSpec& r : *requests) finals.push_back(r.input_tokens + r.output_tokens);

  KindComparison out;
  out.model = kc.model;
  out.scenario = scenario->name;
  out.turnover = turnover;
  for (const ScenarioEntry& e : scenario->configs) {
    auto hw = LoadHardwareConfigByName(e.hardware, dir);
    if (!hw) return std::unexpected(hw.error());
    auto rates = LoadComputeRatesByName(e.hardware, dir);
    if (!rates) return std::unexpected(rates.error());
    auto shape = MakeKindShape(*model, e.mtp);
    if (!shape) return std::unexpected(shape.error());
    KindStepInputs in;
    in.shape = *shape;
    in.main_layers = model->num_layers;
    in.attention_heads = model->attention_heads;
    in.index_heads = model->index_heads;
    in.kinds = kc;
    in.hardware = *hw;
    in.rates = *rates;
    in.mode = e.mode;
    in.num_ranks = scenario->num_ranks;
    in.mtp = e.mtp;
    in.draft_tokens = wl->draft_tokens;
    in.kernel_overhead_s_per_layer = scenario->kernel_overhead_s_per_layer;
    in.indexer_logit_bytes = scenario->indexer_logit_bytes;

    KindConfigResult cr;
    cr.entry = e;
    cr.hardware_label = Label(scenario->num_ranks, e.hardware);
    cr.num_ranks = scenario->num_ranks;
    const double hbm = double(hw->device_memory_bytes);
    cr.weight_bytes_per_gpu = DeriveKindWeights(in).bytes_per_gpu;
    cr.device_kv_bytes_per_gpu = std::max(0.0, hbm - cr.weight_bytes_per_gpu - scenario->activation_reserve_fraction * hbm);
    cr.host_bytes_per_gpu = double(hw->host_memory_bytes_per_gpu);
    cr.tokens_per_step = KindTokensPerStep(in, scenario->mtp_acceptance_rate);

    PoolSetup setup;
    setup.mode = e.mode;
    setup.num_ranks = scenario->num_ranks;
    setup.mtp = e.mtp;
    setup.queries = e.mtp ? 1 + wl->draft_tokens : 1;
    setup.device_bytes = cr.device_kv_bytes_per_gpu;
    setup.host_bytes = cr.host_bytes_per_gpu;
    setup.hisparse_buffer_entries = scenario->hisparse_buffer_entries;
    setup.hisparse_match_host_budget = scenario->hisparse_match_host_budget;
    setup.hisparse_host_to_device_ratio = scenario->hisparse_host_to_device_ratio;
    setup.trtllm_gpu_cache_factor = scenario->trtllm_offload_gpu_cache_factor;
    setup.trtllm_tokens_per_page = scenario->trtllm_offload_tokens_per_page;
    double mean = 0;
    for (std::uint32_t t : finals) mean += t;
    setup.mean_tokens = finals.empty() ? 0 : mean / finals.size();

    const double P = scenario->num_ranks;
    for (KindSystem s : kAllKindSystems) {
      if (!KindSystemRunsIn(s, e.mode)) continue;
      KindSystemResult r;
      r.system = s;
      auto plan = MakePoolPlan(s, *shape, kc, setup);
      if (!plan) return std::unexpected(plan.error());
      r.plan = *plan;
      std::vector<double> landing;  // ulacache: [b] where the first b admitted's turned-over selections land on host
      if (s == KindSystem::kUlaCache) {
        auto a = AdmitInSpace(*model, *shape, r.plan, setup, wl->draft_tokens, finals, &landing);
        if (!a) return std::unexpected(a.error());
        r.admission = std::move(*a);
      } else {
        r.admission = Admit(r.plan, *shape, kc, setup, finals);
      }
      // Curves stop at the engines' CUDA-graph limit per engine instance (the GLM-5 comparison's
      // rule, engine_limits.h): vLLM's systems (vllm, dcp) in tokens, the others in requests.
      std::uint32_t limit = r.admission.admitted;
      const bool vllm = s == KindSystem::kVllm || s == KindSystem::kDcp;
      const std::uint32_t per = CudaGraphRequestsPerInstance(vllm ? "vLLM" : "SGLang", scenario->cuda_graph_max_batch,
                                                             rates->vllm_max_cudagraph_capture_size, setup.queries);
      const std::uint64_t cap = std::uint64_t{per} * (e.mode == ParallelMode::kDp ? scenario->num_ranks : 1);
      if (per > 0 && limit > cap) {
        limit = static_cast<std::uint32_t>(cap);
        r.note = fmt::format("admits {} but decodes at most {} (CUDA-graph limit per engine instance)", r.admission.admitted, cap);
      }
      std::vector<std::uint32_t> grid;
      for (std::uint32_t b : scenario->sampling.batch_grid) {
        if (b < limit) grid.push_back(b);
      }
      if (limit > 0) grid.push_back(limit);
      const bool home = e.mode == ParallelMode::kTp && (s == KindSystem::kDcp || s == KindSystem::kUlaCache);
      for (std::uint32_t b : grid) {
        double ctx = 0;
        for (std::uint32_t i = 0; i < b; ++i) ctx += (*requests)[i].input_tokens + 0.5 * (*requests)[i].output_tokens;
        ctx /= b;
        const double local = e.mode == ParallelMode::kDp ? std::ceil(b / P) : b;
        const double landing_at_b = s == KindSystem::kUlaCache ? landing[b] : 0.0;
        KindStepCounts c;
        c.batch_total = b;
        c.batch_local = local;
        c.context = ctx;
        c.at_home = home;
        c.striped_indexer = home;
        c.home_partial_bytes = s == KindSystem::kUlaCache ? 4 : 2;
        c.host_fetch_entries = HostFetches(s, *shape, setup, turnover.For(e.mtp), local, ctx, landing_at_b);
        auto t = PriceKindStep(in, c);
        if (!t) return std::unexpected(t.error());
        KindCurvePoint pt{.batch = b, .context = ctx, .tput = b * cr.tokens_per_step / t->total,
                          .host_fetch = c.host_fetch_entries, .time = *t};
        if (b == 1) r.tpot_b1_ms = 1e3 * t->total / cr.tokens_per_step;
        if (pt.tput > r.peak_tput) r.peak_tput = pt.tput, r.peak_batch = b;
        r.curve.push_back(pt);
      }
      cr.systems.push_back(std::move(r));
    }
    out.configs.push_back(std::move(cr));

    // Starvation sweep: the first hardware's MTP-off configs.
    if (!e.mtp && e.hardware == scenario->configs.front().hardware) {
      const std::uint32_t out_tokens = (wl->min_output_tokens + wl->max_output_tokens) / 2;
      for (std::uint32_t L : kc.starvation_contexts) {
        const std::vector<std::uint32_t> same(kc.starvation_requests, L + out_tokens);
        PoolSetup fixed = setup;
        fixed.mean_tokens = L + out_tokens;
        KindStarvationRow row;
        row.entry = e;
        row.context = L;
        for (KindSystem s : {KindSystem::kSglang, KindSystem::kVllm, KindSystem::kUlaCache}) {
          auto plan = MakePoolPlan(s, *shape, kc, fixed);
          if (!plan) return std::unexpected(plan.error());
          if (s == KindSystem::kUlaCache) {
            auto a = AdmitInSpace(*model, *shape, *plan, fixed, wl->draft_tokens, same, nullptr);
            if (!a) return std::unexpected(a.error());
            row.cells.push_back({s, std::move(*a)});
          } else {
            row.cells.push_back({s, Admit(*plan, *shape, kc, fixed, same)});
          }
        }
        out.starvation.push_back(std::move(row));
      }
    }
  }
  return out;
}

}  // namespace ula
