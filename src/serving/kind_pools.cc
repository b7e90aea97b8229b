// Per-kind pool accounting of each engine (kind_pools.h).
#include "serving/kind_pools.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>

namespace ula {
namespace {

double CeilDiv(double a, double b) { return std::ceil(a / b); }
double RoundUp(double bytes, double align) { return align > 0 ? std::ceil(bytes / align) * align : bytes; }

// SGLang DSV4PoolConfigurator._get_bytes_per_full_token with c4_shrink_factor `shrink`, and
// the MTP draft worker's (T + D) / T inflation.
double SglangBytesPerFullToken(const KindShape& s, const KindCompareConfig& kc, bool mtp, double shrink) {
  const double kv = s.entry_bytes, idx = s.key_bytes, r = kc.sglang_swa_full_tokens_ratio;
  const double ring = mtp ? kc.sglang_c4_state_ring_mtp : kc.sglang_c4_state_ring;
  const double sb = kc.sglang_state_dtype_bytes;
  const double c4_state = 2.0 * 2 * s.head_dim * sb, c4_index_state = 2.0 * 2 * s.index_head_dim * sb;
  const double state_ratio = ring / s.window;
  double b = r * kv * s.main_layers + kv * s.csa_layers / (s.csa_ratio * shrink) + kv * s.hca_layers / s.hca_ratio +
             idx * s.csa_layers / s.csa_ratio + r * state_ratio * (c4_state + c4_index_state) * s.csa_layers;
  if (mtp) b *= double(s.main_layers + 1) / s.main_layers;
  return b;
}

// SGLang _get_c128_state_fixed_bytes for max_running_requests // attn_dp_size slots.
double SglangC128StateBytes(const KindShape& s, const KindCompareConfig& kc, const PoolSetup& setup) {
  const double per_worker = setup.mode == ParallelMode::kDp ? std::floor(double(kc.sglang_max_running_requests) / setup.num_ranks)
                                                            : kc.sglang_max_running_requests;
  const double ring = setup.mtp ? kc.sglang_c128_state_ring_mtp : kc.sglang_c128_state_ring;
  const double rows = CeilDiv((per_worker + 1) * ring + ring + 1, 128) * 128;
  return rows * 2.0 * s.head_dim * kc.sglang_state_dtype_bytes * s.hca_layers;
}

struct SglangSizes {
  double full = 0, swa = 0, c4 = 0, c128 = 0, fixed = 0, bpft = 0;
};
// max_full: a cap on the full-token space (HiSparse: its host pool, every C4 entry, must fit).
SglangSizes SglangPools(const KindShape& s, const KindCompareConfig& kc, const PoolSetup& setup, double shrink,
                        double max_full = std::numeric_limits<double>::infinity()) {
  SglangSizes z;
  const double page = kc.sglang_page_size;
  z.bpft = SglangBytesPerFullToken(s, kc, setup.mtp, shrink);
  z.fixed = SglangC128StateBytes(s, kc, setup);
  const double avail = std::max(0.0, setup.device_bytes - z.fixed);
  z.full = std::floor(std::min(std::floor(avail / z.bpft), max_full) / page) * page;
  z.swa = std::floor(std::floor(z.full * kc.sglang_swa_full_tokens_ratio) / page) * page;
  z.c4 = std::floor(z.full / (s.csa_ratio * shrink));
  z.c128 = std::floor(z.full / s.hca_ratio);
  return z;
}

// vLLM: bytes one request of `tokens` (and a window of `window` tokens) holds in its pool.
double VllmBytes(const KindShape& s, const KindCompareConfig& kc, double tokens, double window) {
  const double bt = kc.vllm_block_tokens, a = kc.vllm_page_alignment;
  const double blocks = CeilDiv(tokens, bt);
  const double c4_page = RoundUp(bt / s.csa_ratio * s.entry_bytes, a);
  const double c128_page = RoundUp(bt / s.hca_ratio * s.entry_bytes, a);
  const double key_page = bt / s.csa_ratio * s.key_bytes;
  const double window_page = RoundUp(bt * s.entry_bytes, a);
  const double window_blocks = std::min(blocks, CeilDiv(window, bt) + kc.vllm_window_blocks_extra);
  return blocks * (c4_page * s.csa_layers + key_page * s.csa_layers + c128_page * s.hca_layers) +
         window_blocks * window_page * s.window_layers;
}

}  // namespace

std::string_view KindSystemName(KindSystem s) {
  switch (s) {
    case KindSystem::kSglang: return "sglang_dsv4";
    case KindSystem::kSglangHiSparse: return "sglang_hisparse";
    case KindSystem::kVllm: return "vllm";
    case KindSystem::kTrtllmOffload: return "trtllm_offload";
    case KindSystem::kDcp: return "dcp";
    case KindSystem::kUlaCache: return "ulacache";
  }
  return "?";
}

bool KindSystemRunsIn(KindSystem s, ParallelMode mode) { return s != KindSystem::kDcp || mode == ParallelMode::kTp; }

Result<KindShape> MakeKindShape(const ModelConfig& model, bool mtp) {
  if (!model.has_layer_kinds()) {
    return MakeError(ErrorCode::kFailedPrecondition, fmt::format("model '{}' has no layer kinds (no compress_ratios)", model.name));
  }
  ULA_RETURN_IF_ERROR(model.Validate());
  KindShape s;
  const std::uint32_t layers = model.num_layers + (mtp ? model.mtp_layers : 0);
  for (std::uint32_t l = 0; l < layers; ++l) {
    ++s.window_layers;
    const AttentionLayerType k = model.layer_kind(l);
    if (k == AttentionLayerType::kCompressedSparse) ++s.csa_layers;
    if (k == AttentionLayerType::kHeavilyCompressed) ++s.hca_layers;
  }
  s.main_layers = model.num_layers;
  s.window = model.sliding_window;
  s.csa_ratio = model.compress_rate_csa;
  s.hca_ratio = model.compress_rate_hca;
  s.top_k = model.top_k;
  s.entry_bytes = model.kv_entry_bytes_per_layer;
  s.key_bytes = model.index_key_bytes_per_layer;
  s.head_dim = model.kv_lora_rank + model.qk_rope_head_dim;
  s.index_head_dim = model.index_head_dim;
  return s;
}

KindUse ExactKindUse(const KindShape& s, double tokens) {
  const double c4 = std::floor(tokens / s.csa_ratio), c128 = std::floor(tokens / s.hca_ratio);
  return KindUse{.window = std::min(tokens, double(s.window)) * s.entry_bytes * s.window_layers,
                 .csa = c4 * s.entry_bytes * s.csa_layers,
                 .hca = c128 * s.entry_bytes * s.hca_layers,
                 .index = c4 * s.key_bytes * s.csa_layers};
}

Result<PoolPlan> MakePoolPlan(KindSystem system, const KindShape& shape, const KindCompareConfig& kc, const PoolSetup& setup) {
  if (!KindSystemRunsIn(system, setup.mode)) {
    return MakeError(ErrorCode::kInvalidArgument, fmt::format("{} does not run in DP mode", KindSystemName(system)));
  }
  if (!(setup.device_bytes > 0) || setup.num_ranks == 0 || setup.queries == 0) {
    return MakeError(ErrorCode::kInvalidArgument, "pool setup: device_bytes, num_ranks and queries must be > 0");
  }
  PoolPlan p;
  p.system = system;
  p.device_bytes = setup.device_bytes;
  const double kv = shape.entry_bytes;
  switch (system) {
    case KindSystem::kSglang:
    case KindSystem::kSglangHiSparse: {
      double shrink = 1;
      if (system == KindSystem::kSglangHiSparse) {
        // Host pool = every C4 entry of the full-token space (ratio x the device C4 pool).
        const auto host_of = [&](double r) { return SglangPools(shape, kc, setup, r).full / shape.csa_ratio * kv * shape.csa_layers; };
        if (!setup.hisparse_match_host_budget) {
          shrink = std::max(1.0, setup.hisparse_host_to_device_ratio);
        } else if (host_of(1) < setup.host_bytes) {
          double lo = 1, hi = 4096;
          if (host_of(hi) <= setup.host_bytes) {
            lo = hi;
          } else {
            for (int i = 0; i < 60; ++i) {
              const double mid = 0.5 * (lo + hi);
              (host_of(mid) <= setup.host_bytes ? lo : hi) = mid;
            }
          }
          shrink = lo;
        }
        if (setup.mean_tokens > 0 && setup.hisparse_buffer_entries > 0) {
          shrink = std::min(shrink, std::max(1.0, setup.mean_tokens / (double(shape.csa_ratio) * setup.hisparse_buffer_entries)));
        }
        p.hisparse_ratio = shrink;
      }
      // HiSparse's host pool holds every C4 entry of the full-token space: when even ratio 1
      // overflows the host budget, the host caps the full-token space.
      const double host_per_full = kv * shape.csa_layers / shape.csa_ratio;
      const double max_full = system == KindSystem::kSglangHiSparse ? std::floor(setup.host_bytes / host_per_full)
                                                                     : std::numeric_limits<double>::infinity();
      const SglangSizes z = SglangPools(shape, kc, setup, shrink, max_full);
      p.pools = {{"full", z.full, 0}, {"swa", z.swa, 0}};
      if (system == KindSystem::kSglangHiSparse) p.pools.push_back({"c4_device", z.c4, 0});
      p.reserved = KindUse{.window = z.swa * kv * shape.main_layers,
                           .csa = z.c4 * kv * shape.csa_layers,
                           .hca = z.c128 * kv * shape.hca_layers,
                           .index = z.full / shape.csa_ratio * shape.key_bytes * shape.csa_layers};
      p.state_bytes = z.full * z.bpft + z.fixed - p.reserved.total();  // state rings, C128 state, MTP draft share
      p.host_bytes = system == KindSystem::kSglangHiSparse ? z.full / shape.csa_ratio * kv * shape.csa_layers : 0;
      p.memory_bytes = setup.device_bytes + p.host_bytes;
      p.derivation = fmt::format("bytes_per_full_token {:.0f} B, C128 state {:.2f} GB -> full {:.0f} tokens, swa {:.0f} tokens "
                                 "(ratio {}), c4 {:.0f} entries/layer{}",
                                 z.bpft, z.fixed / 1e9, z.full, z.swa, kc.sglang_swa_full_tokens_ratio, z.c4,
                                 shrink > 1 ? fmt::format(" (host_to_device_ratio {:.2f}: host {:.1f} GB)", shrink, p.host_bytes / 1e9) : "");
      break;
    }
    case KindSystem::kVllm:
    case KindSystem::kDcp:
      p.pools = {{"blocks", setup.device_bytes, 0}};
      p.memory_bytes = setup.device_bytes;
      p.derivation = fmt::format("one block pool of {:.1f} GB shared by every kind, {}-token blocks{}", setup.device_bytes / 1e9,
                                 kc.vllm_block_tokens, system == KindSystem::kDcp ? ", tokens interleaved over the ranks" : "");
      break;
    case KindSystem::kTrtllmOffload:
      p.pools = {{"device", setup.device_bytes, 0}, {"host", setup.host_bytes, 0}};
      p.host_bytes = setup.host_bytes;
      p.memory_bytes = setup.device_bytes + setup.host_bytes;
      p.derivation = fmt::format("window, C128 and index keys on device, C4 history on host, GPU cache {} x one step's selections + 1",
                                 setup.trtllm_gpu_cache_factor);
      break;
    case KindSystem::kUlaCache:
      p.pools = {{"device", setup.device_bytes, 0}, {"space", setup.device_bytes + setup.host_bytes, 0}};
      p.host_bytes = setup.host_bytes;
      p.memory_bytes = setup.device_bytes + setup.host_bytes;
      p.derivation = fmt::format("one space over frames per GPU: {:.1f} GB device (whole frames of every kind, C4 in the "
                                 "free ones) + {:.1f} GB host (C4 entries), admitted by a run of the space{}",
                                 setup.device_bytes / 1e9, setup.host_bytes / 1e9,
                                 setup.mode == ParallelMode::kTp ? ", each rank 1/P of each request" : "");
      break;
  }
  return p;
}

std::vector<double> PoolDemand(const PoolPlan& plan, const KindShape& shape, const KindCompareConfig& kc,
                               const PoolSetup& setup, double tokens) {
  const double kv = shape.entry_bytes;
  switch (plan.system) {
    case KindSystem::kSglang:
    case KindSystem::kSglangHiSparse: {
      const double page = kc.sglang_page_size;
      const double full = CeilDiv(tokens, page) * page;
      std::vector<double> d = {full, std::min(full, double(shape.window) + page)};
      if (plan.system == KindSystem::kSglangHiSparse) {
        d.push_back(std::min(std::floor(tokens / shape.csa_ratio), double(setup.hisparse_buffer_entries)));
      }
      return d;
    }
    case KindSystem::kVllm: return {VllmBytes(shape, kc, tokens, shape.window)};
    case KindSystem::kDcp: {
      const double p = setup.num_ranks;
      return {VllmBytes(shape, kc, CeilDiv(tokens, p), CeilDiv(shape.window, p))};
    }
    case KindSystem::kTrtllmOffload: {
      const KindUse u = ExactKindUse(shape, tokens);
      const double c4 = std::floor(tokens / shape.csa_ratio);
      const double per_page = std::max(1.0, double(setup.trtllm_tokens_per_page) / shape.csa_ratio);
      const double cache = std::min(c4, CeilDiv(setup.trtllm_gpu_cache_factor * setup.queries * shape.top_k + 1, per_page) * per_page);
      return {u.window + u.hca + u.index + cache * kv * shape.csa_layers, u.csa};
    }
    case KindSystem::kUlaCache: return {};  // a run of the space (kind_space_admission.h)
  }
  return {};
}

Admission Admit(const PoolPlan& plan, const KindShape& shape, const KindCompareConfig& kc, const PoolSetup& setup,
                std::span<const std::uint32_t> final_tokens) {
  Admission a;
  if (plan.system == KindSystem::kUlaCache) return a;  // a run of the space admits it
  const std::uint32_t ranks = setup.mode == ParallelMode::kDp ? setup.num_ranks : 1;
  std::vector<std::vector<Pool>> per_rank(ranks, plan.pools);
  for (std::size_t i = 0; i < final_tokens.size(); ++i) {
    std::vector<Pool>& pools = per_rank[i % ranks];
    const std::vector<double> d = PoolDemand(plan, shape, kc, setup, final_tokens[i]);
    std::string refused;
    for (std::size_t k = 0; k < pools.size() && refused.empty(); ++k) {
      if (pools[k].used + d[k] > pools[k].capacity) refused = pools[k].name;
    }
    if (!refused.empty()) {
      a.binds = refused;
      break;
    }
    for (std::size_t k = 0; k < pools.size(); ++k) pools[k].used += d[k];
    a.held += ExactKindUse(shape, final_tokens[i]);
    ++a.admitted;
  }
  a.pool_fill.assign(plan.pools.size(), 0);
  for (const auto& pools : per_rank) {
    for (std::size_t k = 0; k < pools.size(); ++k) {
      if (pools[k].capacity > 0) a.pool_fill[k] = std::max(a.pool_fill[k], pools[k].used / pools[k].capacity);
    }
  }
  const double memory = plan.memory_bytes * setup.num_ranks;
  a.fill = memory > 0 ? a.held.total() / memory : 0;
  return a;
}

}  // namespace ula
