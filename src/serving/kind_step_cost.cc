// Roofline step time for a model with layer kinds (kind_step_cost.h).
#include "serving/kind_step_cost.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

namespace ula {
namespace {

double Fp8Rate(const KindStepInputs& in) { return in.hardware.dense_fp8_flops > 0 ? in.hardware.dense_fp8_flops : in.rates.dense_fp8_flops; }
double PaddedHeads(double heads, std::uint32_t multiple) {
  return multiple > 1 ? std::ceil(heads / multiple) * multiple : heads;
}
// Ring collective time for `bytes` sent per GPU (P - 1 hops), with `calls` calls.
double Collective(const KindStepInputs& in, double bytes, double calls, double hops) {
  const double uni = in.hardware.nvlink_bandwidth_bytes_per_s / 2;  // one direction
  const double latency = in.rates.collective_base_latency_s + in.rates.collective_hop_latency_s * hops;
  return (uni > 0 ? bytes / uni : 0) + calls * latency;
}

}  // namespace

KindWeights DeriveKindWeights(const KindStepInputs& in) {
  const KindCompareConfig& k = in.kinds;
  const KindShape& s = in.shape;
  const double h = k.hidden_size, heads = in.attention_heads, hd = k.head_dim;
  const double attention = h * k.q_lora_rank + k.q_lora_rank * heads * hd + h * hd + heads * hd * k.o_lora_rank +
                           double(k.o_groups) * k.o_lora_rank * h;
  const double indexer = double(k.q_lora_rank) * in.index_heads * s.index_head_dim + h * in.index_heads;
  KindWeights w;
  w.expert_params = 3.0 * h * k.moe_intermediate_size;
  const double mtp = in.mtp ? 1 : 0;  // the MTP layer: a full decoder layer plus its 2h x h projection
  w.moe_layers = in.main_layers + mtp;
  const double per_layer = attention + k.shared_experts * w.expert_params + h * k.routed_experts;
  w.non_expert_params = w.moe_layers * per_layer + s.csa_layers * indexer +
                        (s.csa_layers + s.hca_layers) * k.compressor_params_per_compressed_layer + mtp * 2 * h * h;
  w.routed_params = w.moe_layers * k.routed_experts * w.expert_params;
  const double embeddings = 2.0 * k.vocab_size * h * k.embedding_bytes_per_param;
  const double linear = w.non_expert_params * k.linear_bytes_per_param, routed = w.routed_params * k.expert_bytes_per_param;
  const double P = in.num_ranks;
  w.bytes_per_gpu = in.mode == ParallelMode::kTp ? (linear + embeddings + routed) / P : linear + embeddings + routed / P;
  return w;
}

double KindTokensPerStep(const KindStepInputs& in, double acceptance) {
  if (!in.mtp) return 1;
  double t = 1, p = 1;
  for (std::uint32_t d = 0; d < in.draft_tokens; ++d) t += (p *= acceptance);
  return t;
}

Result<KindStepTime> PriceKindStep(const KindStepInputs& in, const KindStepCounts& c) {
  for (double v : {c.batch_total, c.batch_local, c.context, c.host_fetch_entries, c.home_partial_bytes}) {
    if (!(v >= 0) || !std::isfinite(v)) return MakeError(ErrorCode::kInvalidArgument, "step counts: must be finite and >= 0");
  }
  if (c.at_home && in.mode != ParallelMode::kTp) {
    return MakeError(ErrorCode::kInvalidArgument, "step counts: attention at home needs TP mode");
  }
  const KindShape& s = in.shape;
  const KindCompareConfig& k = in.kinds;
  const double P = in.num_ranks, hbm = in.hardware.hbm_bandwidth_bytes_per_s;
  const double q = in.mtp ? 1.0 + in.draft_tokens : 1.0;
  const bool tp = in.mode == ParallelMode::kTp;
  KindStepTime t;

  // Weights.
  const KindWeights w = DeriveKindWeights(in);
  const double tokens = c.batch_total * q, local_tokens = c.batch_local * q;
  const double E = k.routed_experts, topk = k.experts_per_token;
  const double touched = tokens > 0 ? E * (1 - std::pow(1 - topk / E, tokens)) : 0;
  const double lm_head = double(k.vocab_size) * k.hidden_size * k.embedding_bytes_per_param;
  const double dense_bytes = (w.non_expert_params * k.linear_bytes_per_param + lm_head) / (tp ? P : 1);
  const double expert_bytes = w.moe_layers * touched * w.expert_params * k.expert_bytes_per_param / P;
  const double dense_flops = 2 * (w.non_expert_params + double(k.vocab_size) * k.hidden_size) * (tp ? tokens / P : local_tokens);
  const double expert_flops = 2 * w.moe_layers * topk * w.expert_params * tokens / P;
  const double eff = in.rates.gemm_hbm_efficiency * hbm;
  const double grouped = in.rates.grouped_gemm_flops > 0 ? in.rates.grouped_gemm_flops : Fp8Rate(in);
  t.weights = std::max(dense_bytes / eff, dense_flops / Fp8Rate(in)) + std::max(expert_bytes / eff, expert_flops / grouped);

  // Attention over the kinds.
  const double ctx = c.context;
  const double entries = s.window_layers * std::min(ctx, double(s.window)) +
                         s.csa_layers * std::min(std::floor(ctx / s.csa_ratio), double(s.top_k)) +
                         s.hca_layers * std::floor(ctx / s.hca_ratio);
  const double share = c.at_home ? 1.0 / P : 1.0;
  const double read = entries * share * c.batch_local * q;
  const double heads = PaddedHeads(tp && !c.at_home ? in.attention_heads / P : in.attention_heads, in.rates.sparse_decode_head_multiple);
  const double attn_flops = read * 4.0 * s.head_dim * heads;
  t.attention = std::max(read * s.entry_bytes / hbm, in.rates.sparse_decode_flops > 0 ? attn_flops / in.rates.sparse_decode_flops : 0);

  // Indexer over every C4 key.
  const double keys = s.csa_layers * std::floor(ctx / s.csa_ratio) * (c.striped_indexer ? 1.0 / P : 1.0) * c.batch_local * q;
  t.indexer = std::max(keys * (s.key_bytes + 2.0 * in.indexer_logit_bytes) / hbm,
                       keys * 2.0 * in.index_heads * s.index_head_dim / Fp8Rate(in));

  // Host link.
  t.host_link = in.rates.host_link_scattered_bytes_per_s > 0
                    ? c.host_fetch_entries * s.entry_bytes / in.rates.host_link_scattered_bytes_per_s : 0;

  // Collectives.
  const double layers = in.main_layers + (in.mtp ? in.draft_tokens : 0);
  if (tp && P > 1) {
    const double ar = 2 * (P - 1) / P * tokens * k.hidden_size * 2.0;  // bf16 hidden, ring all-reduce
    t.collectives = layers * 2 * Collective(in, ar, 1, 2 * (P - 1));
    if (c.at_home) {
      const double values = tokens * in.attention_heads * k.head_dim;
      const double gather = (P - 1) / P * values * 2.0, partial = (P - 1) / P * values * c.home_partial_bytes;
      t.collectives += layers * (Collective(in, gather, 1, P - 1) + Collective(in, partial, 1, P - 1));
    }
  } else if (P > 1) {
    const double a2a = (P - 1) / P * local_tokens * topk * k.hidden_size * (1.0 + 2.0);  // fp8 dispatch + bf16 combine
    t.collectives = layers * Collective(in, a2a, 2, P - 1);
  }
  t.overhead = layers * in.kernel_overhead_s_per_layer;
  t.total = t.weights + t.attention + t.indexer + t.host_link + t.collectives + t.overhead;
  return t;
}

}  // namespace ula
