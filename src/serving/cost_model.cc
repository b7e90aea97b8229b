// Cost model (cost_model.h): parameter counts, per-GPU memory budget, and the roofline of
// one decode step. Every constant comes from a config; the formulas are the ones written
// out in docs/COST_MODEL.md, in the same order.
#include "serving/cost_model.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <utility>

namespace ula {
namespace {

constexpr double kGB = 1e9;
// Attention at home: the absorbed queries travel as bf16; a partial is the float32 record of
// partial_attention.h (per head: kv_lora_rank accumulator values, max logit, sum).
constexpr double kQueryValueBytes = 2;
constexpr double kPartialValueBytes = 4;
constexpr double kPartialExtraValues = 2;
// Decode context parallel and Helix: partial outputs in the model's dtype (bf16), the LSE in
// float32 (vLLM cp_lse_ag_out_rs; TensorRT-LLM Helix's all-to-all carries both).
constexpr double kOutputValueBytes = 2;
constexpr double kLseBytes = 4;

std::uint32_t MainGroups(const ModelConfig& m) { return m.num_groups() - m.mtp_layers; }

}  // namespace

WeightParams DeriveWeightParams(const ModelConfig& m, const ModelCostConfig& c) {
  WeightParams p;
  const double h = c.hidden_size, heads = m.attention_heads;
  // MLA: q_a (h x q_lora), q_b (q_lora x heads*(nope+rope)), kv_a (h x (kv_lora+rope)),
  // kv_b (kv_lora x heads*(nope+v)), o (heads*v x h).
  p.attention_a_per_layer = h * c.q_lora_rank + h * (m.kv_lora_rank + m.qk_rope_head_dim);
  p.attention_per_layer = h * c.q_lora_rank + double(c.q_lora_rank) * heads * (c.qk_nope_head_dim + m.qk_rope_head_dim) +
                          h * (m.kv_lora_rank + m.qk_rope_head_dim) +
                          double(m.kv_lora_rank) * heads * (c.qk_nope_head_dim + c.v_head_dim) + heads * c.v_head_dim * h;
  // Indexer: wq (q_lora x index_heads*index_dim), wk (h x index_dim), head weights (h x index_heads).
  p.indexer_per_group = double(c.q_lora_rank) * m.index_heads * m.index_head_dim + h * m.index_head_dim + h * m.index_heads;
  p.dense_mlp_per_layer = 3.0 * h * c.dense_intermediate_size;
  p.expert = 3.0 * h * c.moe_intermediate_size;
  p.router_per_layer = h * c.routed_experts;
  p.embedding = double(c.vocab_size) * h;
  p.mtp_extra = 2.0 * h * h;
  const double moe_layers = double(m.num_layers) - c.first_dense_layers;
  const double moe_layer = (double(c.routed_experts) + c.shared_experts) * p.expert + p.router_per_layer;
  const double main = m.num_layers * p.attention_per_layer + MainGroups(m) * p.indexer_per_group +
                      c.first_dense_layers * p.dense_mlp_per_layer + moe_layers * moe_layer + 2 * p.embedding;
  const double mtp = m.mtp_layers * (p.attention_per_layer + p.indexer_per_group + moe_layer + p.mtp_extra);
  p.total = main + mtp;
  p.active_per_token = m.num_layers * p.attention_per_layer + MainGroups(m) * p.indexer_per_group +
                       c.first_dense_layers * p.dense_mlp_per_layer +
                       moe_layers * ((double(c.experts_per_token) + c.shared_experts) * p.expert + p.router_per_layer) +
                       p.embedding;  // LM head (the embedding lookup reads one row)
  return p;
}

double TpReplicatedParams(const ModelConfig& m, const ModelCostConfig& c, const WeightParams& p, double mtp_layers) {
  // vLLM / SGLang DeepSeek-V2/V3.2 models: fused q_a + kv_a_proj_with_mqa, the indexer's
  // wq_b / wk / weights_proj and the MoE gate are ReplicatedLinear; the MTP layer's eh_proj
  // is a plain nn.Linear (deepseek_mtp.py). Everything else is split over the TP ranks.
  const double moe_layers = double(m.num_layers) - c.first_dense_layers;
  return m.num_layers * p.attention_a_per_layer + MainGroups(m) * p.indexer_per_group + moe_layers * p.router_per_layer +
         mtp_layers * (p.attention_a_per_layer + p.indexer_per_group + p.router_per_layer + p.mtp_extra);
}

Result<CostModel> CostModel::Create(const CostModelInputs& inputs) {
  if (auto s = inputs.model.Validate(); !s) return std::unexpected(s.error());
  if (auto s = inputs.costs.Validate(); !s) return std::unexpected(s.error());
  if (auto s = inputs.hardware.Validate(); !s) return std::unexpected(s.error());
  if (inputs.num_ranks == 0) return MakeError(ErrorCode::kInvalidArgument, "field 'num_ranks': must be >= 1");
  CostModel cm;
  cm.in_ = inputs;
  if (!(cm.fp8_flops() > 0)) {
    return MakeError(ErrorCode::kInvalidArgument,
                     fmt::format("field 'dense_fp8_flops': unknown for hardware '{}' (0 in its profile and its costs file)",
                                 inputs.hardware.name));
  }
  if (!(cm.bf16_flops() > 0)) {
    return MakeError(ErrorCode::kInvalidArgument,
                     fmt::format("field 'dense_bf16_flops': unknown for hardware '{}'", inputs.hardware.name));
  }
  if (auto s = inputs.rates.Validate(); !s) {
    return MakeError(ErrorCode::kInvalidArgument, fmt::format("costs for hardware '{}': {}", inputs.hardware.name,
                                                              s.error().message()));
  }
  if (inputs.planner_kernels_per_call == 0) {
    return MakeError(ErrorCode::kInvalidArgument, "field 'planner_kernels_per_call': must be >= 1");
  }
  cm.params_ = DeriveWeightParams(inputs.model, inputs.costs);
  return cm;
}

double CostModel::fp8_flops() const {
  return in_.hardware.dense_fp8_flops > 0 ? in_.hardware.dense_fp8_flops : in_.rates.dense_fp8_flops;
}
double CostModel::bf16_flops() const {
  return in_.hardware.dense_bf16_flops > 0 ? in_.hardware.dense_bf16_flops : in_.rates.dense_bf16_flops;
}

std::uint32_t CostModel::PaddedHeads(std::uint32_t heads) const {
  const std::uint32_t m = std::max<std::uint32_t>(1, in_.rates.sparse_decode_head_multiple);
  return (heads + m - 1) / m * m;
}

double CostModel::RedundantQkvParamsPerLayer() const {
  const ModelConfig& m = in_.model;
  const ModelCostConfig& c = in_.costs;
  const double heads = m.attention_heads;
  return double(c.q_lora_rank) * heads * (c.qk_nope_head_dim + m.qk_rope_head_dim) +
         double(m.kv_lora_rank) * heads * c.qk_nope_head_dim;
}

double CostModel::RedundantQkvExtraWeightBytes() const {
  const double P = in_.num_ranks;
  const double layers = double(in_.model.num_layers) + (in_.mtp ? in_.model.mtp_layers : 0);
  return (P - 1) / P * layers * RedundantQkvParamsPerLayer() * in_.costs.weight_bytes_per_param;
}

double CostModel::AllReduceLatency() const {
  return in_.rates.collective_base_latency_s + 2.0 * (in_.num_ranks - 1) * in_.rates.collective_hop_latency_s;
}
double CostModel::GatherLatency() const {
  return in_.rates.collective_base_latency_s + double(in_.num_ranks - 1) * in_.rates.collective_hop_latency_s;
}

std::uint32_t CostModel::queries() const { return in_.mtp ? 1 + in_.draft_tokens : 1; }

double CostModel::ExpectedTokensPerStep(double a) const {
  if (!in_.mtp) return 1.0;
  double expected = 1.0, p = 1.0;
  for (std::uint32_t d = 0; d < in_.draft_tokens; ++d) {
    p *= a;
    expected += p;
  }
  return expected;
}

std::uint64_t CostModel::kv_bytes_per_token() const {
  const std::uint64_t layers = in_.model.num_layers + (in_.mtp ? in_.model.mtp_layers : 0);
  return layers * std::uint64_t{in_.model.kv_entry_bytes_per_layer};
}

std::uint64_t CostModel::index_bytes_per_token() const {
  const std::uint64_t groups = MainGroups(in_.model) + (in_.mtp ? in_.model.mtp_layers : 0);
  return groups * std::uint64_t{in_.model.index_key_bytes_per_layer};
}

MemoryBudget CostModel::Budget() const {
  const ModelConfig& m = in_.model;
  const ModelCostConfig& c = in_.costs;
  const WeightParams& p = params_;
  const double wb = c.weight_bytes_per_param, eb = c.embedding_bytes_per_param, P = in_.num_ranks;
  const double moe_layers = double(m.num_layers) - c.first_dense_layers;
  const double mtp_layers = in_.mtp ? m.mtp_layers : 0;
  // Weights that DP replicates (attention, indexer, dense MLP, shared experts, routers,
  // embedding + LM head) and routed experts (sharded over the ranks in both modes).
  const double replicated_linear =
      m.num_layers * p.attention_per_layer + MainGroups(m) * p.indexer_per_group + c.first_dense_layers * p.dense_mlp_per_layer +
      moe_layers * (c.shared_experts * p.expert + p.router_per_layer) +
      mtp_layers * (p.attention_per_layer + p.indexer_per_group + c.shared_experts * p.expert + p.router_per_layer + p.mtp_extra);
  const double embeddings = 2 * p.embedding;
  const double routed = (moe_layers + mtp_layers) * c.routed_experts * p.expert;
  MemoryBudget b;
  b.hbm_bytes = static_cast<double>(in_.hardware.device_memory_bytes);
  b.host_bytes = static_cast<double>(in_.hardware.host_memory_bytes_per_gpu);
  const double replicated_bytes = replicated_linear * wb + embeddings * eb;
  const double routed_bytes = routed * wb;
  // TP: every weight split over the P GPUs except those engines replicate (TpReplicatedParams).
  const double tp_replicated_bytes = TpReplicatedParams(m, c, p, mtp_layers) * wb;
  if (in_.mode == ParallelMode::kTp) {
    b.weight_bytes = (replicated_bytes + routed_bytes - tp_replicated_bytes) / P + tp_replicated_bytes;
  } else {
    b.weight_bytes = replicated_bytes + routed_bytes / P;
  }
  b.activation_bytes = in_.activation_reserve_fraction * b.hbm_bytes;
  b.device_kv_bytes = std::max(0.0, b.hbm_bytes - b.weight_bytes - b.activation_bytes);
  auto& d = b.derivation;
  d.push_back(fmt::format("parameters: {:.1f}B total ({} layers + {} MTP), {:.1f}B active per token", p.total / 1e9,
                          m.num_layers, m.mtp_layers, p.active_per_token / 1e9));
  d.push_back(fmt::format("weights: attention/indexer/dense/shared/router/MTP-non-routed {:.2f} GB ({} B/param) + "
                          "embedding+LM head {:.2f} GB ({} B/param) + routed experts {:.2f} GB{}",
                          replicated_linear * wb / kGB, wb, embeddings * eb / kGB, eb, routed_bytes / kGB,
                          in_.mtp ? " (MTP layer loaded)" : " (MTP layer not loaded)"));
  if (in_.mode == ParallelMode::kTp) {
    d.push_back(fmt::format("TP: every weight split over {} GPUs except q_a/kv_a, indexer, routers{} replicated ({:.2f} GB) "
                            "-> {:.2f} GB per GPU",
                            in_.num_ranks, in_.mtp ? ", MTP eh_proj" : "", tp_replicated_bytes / kGB, b.weight_bytes / kGB));
  } else {
    d.push_back(fmt::format("DP attention: non-routed weights replicated ({:.2f} GB), routed experts / {} ({:.2f} GB) -> "
                            "{:.2f} GB per GPU",
                            replicated_bytes / kGB, in_.num_ranks, routed_bytes / P / kGB, b.weight_bytes / kGB));
  }
  d.push_back(fmt::format("device left for KV per GPU = HBM {:.1f} GB - weights {:.2f} GB - activation reserve {:.1f}% "
                          "({:.2f} GB) = {:.2f} GB",
                          b.hbm_bytes / kGB, b.weight_bytes / kGB, 100 * in_.activation_reserve_fraction,
                          b.activation_bytes / kGB, b.device_kv_bytes / kGB));
  d.push_back(fmt::format("host per GPU = {:.0f} GB; per token: KV {} B ({} layers x {} B), index keys {} B", b.host_bytes / kGB,
                          kv_bytes_per_token(), kv_bytes_per_token() / m.kv_entry_bytes_per_layer,
                          m.kv_entry_bytes_per_layer, index_bytes_per_token()));
  return b;
}

Status CostModel::CheckCounts(const StepCounts& k) const {
  const std::pair<const char*, double> fields[] = {
      {"batch_total", k.batch_total},       {"batch_local", k.batch_local},   {"history_scored", k.history_scored},
      {"h2d_entries", k.h2d_entries},       {"d2h_entries", k.d2h_entries},   {"nvlink_entries", k.nvlink_entries},
      {"home_entries", k.home_entries},     {"distinct_entries", k.distinct_entries},
      {"arriving_host_bytes", k.arriving_host_bytes}, {"arriving_device_bytes", k.arriving_device_bytes}};
  for (const auto& [name, v] : fields) {
    if (!(v >= 0) || !std::isfinite(v)) {
      return MakeError(ErrorCode::kInvalidArgument, fmt::format("field '{}': must be finite and >= 0 (got {})", name, v));
    }
  }
  if (k.attention_at_home) {
    if (in_.mode != ParallelMode::kTp) {
      return MakeError(ErrorCode::kInvalidArgument, "field 'attention_at_home': TP mode only");
    }
    if (k.home_entries > k.distinct_entries) {
      return MakeError(ErrorCode::kInvalidArgument,
                       fmt::format("field 'home_entries': {} exceeds distinct_entries {}", k.home_entries, k.distinct_entries));
    }
    if (k.batch_local > 0 && !(k.distinct_entries > 0)) {
      return MakeError(ErrorCode::kInvalidArgument, "field 'distinct_entries': must be > 0 when requests decode");
    }
  }
  return Ok();
}

StepWork CostModel::Work(const StepCounts& k) const {
  const ModelConfig& m = in_.model;
  const ModelCostConfig& c = in_.costs;
  const WeightParams& p = params_;
  const double P = in_.num_ranks, wb = c.weight_bytes_per_param, eb = c.embedding_bytes_per_param;
  const double q = queries();
  const double passes = in_.mtp ? double(in_.draft_tokens) * m.mtp_layers : 0;  // MTP layer passes per step
  const double moe_layers = double(m.num_layers) - c.first_dense_layers;
  const double g_main = MainGroups(m);
  const bool tp = in_.mode == ParallelMode::kTp;
  StepWork w;
  w.layers = m.num_layers + static_cast<std::uint32_t>(passes);
  w.groups = MainGroups(m) + (in_.mtp ? m.mtp_layers : 0);

  // --- Dense (non-routed) GEMMs: read whole (TP: 1/P of the split part, the replicated part
  // whole). Routed experts: the expected fraction any token of the step was routed to, over
  // P ranks.
  auto routed_fraction = [&](double tokens) {
    return 1.0 - std::pow(1.0 - double(c.experts_per_token) / c.routed_experts, tokens);
  };
  const double tokens_main = k.batch_total * q, tokens_mtp = k.batch_total;  // per MTP pass
  const double non_routed_layer_main = m.num_layers * p.attention_per_layer + g_main * p.indexer_per_group +
                                       c.first_dense_layers * p.dense_mlp_per_layer +
                                       moe_layers * (c.shared_experts * p.expert + p.router_per_layer);
  const double non_routed_mtp = p.attention_per_layer + p.indexer_per_group + c.shared_experts * p.expert +
                                p.router_per_layer + p.mtp_extra;
  // Helix replicates q_b and W_UK as well (every GPU projects every head's query).
  const double qkv = k.redundant_qkv && tp ? RedundantQkvParamsPerLayer() : 0;
  const double rep_main = tp ? TpReplicatedParams(m, c, p, 0) + m.num_layers * qkv : 0;
  const double rep_mtp = tp ? TpReplicatedParams(m, c, p, 1) - TpReplicatedParams(m, c, p, 0) + qkv : 0;  // one MTP pass
  const double split_main = non_routed_layer_main - rep_main, split_mtp = non_routed_mtp - rep_mtp;
  const double split_div = tp ? P : 1.0;
  // Bytes: the MTP layer's weights are read once per pass.
  w.dense_bytes = ((split_main + passes * split_mtp) * wb + (1 + passes) * p.embedding * eb) / split_div +
                  (rep_main + passes * rep_mtp) * wb;
  w.expert_bytes = (moe_layers * routed_fraction(tokens_main) + passes * routed_fraction(tokens_mtp)) *
                   c.routed_experts * p.expert * wb / P;
  // FLOPs: 2 x params x tokens. TP: the split part's work over P, the replicated part on every
  // token on every GPU; DP: its own tokens. Routed: balanced over the P ranks in both modes.
  const double own_main = tp ? tokens_main : k.batch_local * q, own_mtp = tp ? tokens_mtp : k.batch_local;
  w.dense_flops = 2 * ((split_main + p.embedding) * own_main / split_div + rep_main * own_main +
                       passes * ((split_mtp + p.embedding) * own_mtp / split_div + rep_mtp * own_mtp));
  w.expert_flops = 2 * c.experts_per_token * p.expert * (moe_layers * tokens_main + passes * tokens_mtp) / P;

  // --- Attention: each query reads top-k entries of every layer (TP: every rank reads the
  // whole latent entry; heads split the FLOPs). At home: the GPU reads only the share of
  // the selections homed on it and computes every head over them, so its bytes are that
  // share of ordinary TP's and its FLOPs, H heads x share instead of H/P heads x all,
  // equal ordinary TP's when the share is 1/P.
  const double entry = m.kv_entry_bytes_per_layer;
  const double sel_main = k.batch_local * q * m.top_k, sel_mtp = k.batch_local * m.top_k;
  const double reads = sel_main * m.num_layers + sel_mtp * passes;
  const double share = !k.attention_at_home ? 1.0 : (k.distinct_entries > 0 ? k.home_entries / k.distinct_entries : 0.0);
  w.attention_bytes = share * reads * entry;
  // FLOPs as FlashMLA counts them (2 x (d_qk + d_v) per entry and head), with the query heads
  // of one call padded up to the kernel's head multiple: TP computes H/P heads per GPU, at
  // home and in DP all H.
  const double flops_per_entry_head = 2.0 * (m.kv_lora_rank + m.qk_rope_head_dim) + 2.0 * m.kv_lora_rank;
  const std::uint32_t heads_here =
      tp && !k.attention_at_home ? (m.attention_heads + in_.num_ranks - 1) / in_.num_ranks : m.attention_heads;
  w.attention_heads_per_call = PaddedHeads(heads_here);
  w.attention_flops = share * reads * w.attention_heads_per_call * flops_per_entry_head;

  // --- Indexer: every scored key is read once per indexer group per step and scored by
  // each query.
  const double key = m.index_key_bytes_per_layer;
  w.indexer_bytes = k.history_scored * (g_main + passes) * key;
  const double flops_per_key_query = 2.0 * m.index_heads * m.index_head_dim;
  w.indexer_flops = k.history_scored * (g_main * q + passes) * flops_per_key_query;
  // Each query's logits over the scored keys (fp32) are written by the logits kernel and
  // read back by the top-k: O(context) per query, like the scoring.
  w.indexer_bytes += 2.0 * k.history_scored * (g_main * q + passes) * double(in_.indexer_logit_bytes);

  // --- Transfers from the planners' counters (per group -> all groups in use).
  const double token_bytes = static_cast<double>(kv_bytes_per_token());
  w.h2d_bytes = k.h2d_entries * token_bytes;
  w.d2h_bytes = k.d2h_entries * token_bytes;
  w.nvlink_fetch_bytes = k.nvlink_entries * token_bytes;
  w.layers_per_group = std::max<std::uint32_t>(1, m.layers_per_group);
  w.h2d_critical = k.swap_in_per_layer;

  // --- Collectives on the critical path (bytes each GPU sends).
  const double h = c.hidden_size;
  if (tp) {  // two ring all-reduces of bf16 activations per layer pass
    w.collective_bytes += 2.0 * (P - 1) / P * 2.0 * (tokens_main * m.num_layers + tokens_mtp * passes) * h * 2.0;
    w.allreduce_calls += 2.0 * w.layers;
  } else {   // MoE all-to-all: fp8 dispatch + bf16 combine to ranks holding the experts
    w.collective_bytes += (P - 1) / P * c.experts_per_token * h * 3.0 * (k.batch_local * q * moe_layers + k.batch_local * passes);
    w.gather_calls += 2.0 * (moe_layers + passes);
  }
  if (k.striped_indexer) {  // every rank gathers the other ranks' top-k candidates per query
    w.collective_bytes += (P - 1) * m.top_k * double(in_.candidate_bytes) * k.batch_total * (g_main * q + passes);
    w.gather_calls += g_main + passes;  // one call per group pass, all queries of the batch in it
  }
  if (k.attention_at_home) {
    // Per layer pass and query token: (a) all-gather of the absorbed queries, each GPU
    // receives (and, in a ring, sends) the other ranks' (P-1)/P of H x (kv_lora + rope)
    // bf16 values; (b) the partials, reduce-scattered to the owners of their heads: each GPU
    // sends (P-1)/P of H x (kv_lora + 2) float32 values. The hidden-state all-reduces above
    // stay (the output projection is still split by head).
    const double query_passes = k.batch_local * q * m.num_layers + k.batch_local * passes;
    const double heads = m.attention_heads;
    const double query_gather =
        (P - 1) / P * heads * (m.kv_lora_rank + m.qk_rope_head_dim) * kQueryValueBytes * query_passes;
    switch (k.home_exchange) {
      case HomeExchange::kUlaCache:
        w.query_gather_bytes = query_gather;
        w.partial_exchange_bytes =
            (P - 1) / P * heads * (m.kv_lora_rank + kPartialExtraValues) * kPartialValueBytes * query_passes;
        w.gather_calls += 2.0 * w.layers;
        break;
      case HomeExchange::kDcp:
        // cp_lse_ag_out_rs: every GPU receives the other ranks' LSE of all heads, and
        // reduce-scatters its bf16 partial outputs of all heads to their owners.
        w.query_gather_bytes = query_gather;
        w.partial_exchange_bytes =
            ((P - 1) * heads * kLseBytes + (P - 1) / P * heads * m.kv_lora_rank * kOutputValueBytes) * query_passes;
        w.gather_calls += 3.0 * w.layers;
        break;
      case HomeExchange::kDcpPacked:
      case HomeExchange::kHelix: {
        // One all-to-all: to each head's owner, this GPU's partial output and LSE of that head
        // (SGLang's DCP after its query all-gather; Helix computes the queries itself).
        const bool gather = k.home_exchange == HomeExchange::kDcpPacked;
        w.query_gather_bytes = gather ? query_gather : 0;
        w.partial_exchange_bytes =
            (P - 1) / P * heads * (m.kv_lora_rank * kOutputValueBytes + kLseBytes) * query_passes;
        w.gather_calls += (gather ? 2.0 : 1.0) * w.layers;
        break;
      }
    }
    w.collective_bytes += w.query_gather_bytes + w.partial_exchange_bytes;
  }

  // --- Every byte over a link crosses HBM: host fetches and NVLink fetches are written,
  // swap victims and backups read; NVLink fetches are served symmetrically (this GPU's home
  // entries read for the others), and collectives are read on send and written on receipt.
  w.arriving_bytes = k.arriving_host_bytes + k.arriving_device_bytes;
  w.transfer_hbm_bytes = w.h2d_bytes + w.d2h_bytes + 2.0 * w.nvlink_fetch_bytes + 2.0 * w.collective_bytes +
                         k.arriving_device_bytes;

  // --- UlaCache's planner: planner_kernels_per_call kernels per group pass, over every
  // selection of the batch this GPU plans. HiSparse: one swap-in kernel per layer pass over
  // every selection of that layer.
  const double sel_per_group_pass_main = k.batch_local * q * m.top_k, sel_per_pass_mtp = k.batch_local * m.top_k;
  if (k.planner_per_group) {
    w.planner_kernels += double(in_.planner_kernels_per_call) * (g_main + passes);
    w.planner_selections += sel_per_group_pass_main * g_main + sel_per_pass_mtp * passes;
  }
  if (k.swap_in_per_layer) {
    w.planner_kernels += w.layers;
    w.planner_selections += sel_per_group_pass_main * m.num_layers + sel_per_pass_mtp * passes;
  }
  return w;
}

StepTime CostModel::Time(const StepWork& w) const {
  const HardwareConfig& hw = in_.hardware;
  const double hbm = hw.hbm_bandwidth_bytes_per_s;
  StepTime t;
  // GEMMs at their achieved rates: weight reads at gemm_hbm_efficiency of HBM peak, the
  // routed experts' grouped GEMMs compute-bound at grouped_gemm_flops.
  const double gemm_hbm = hbm * in_.rates.gemm_hbm_efficiency;
  const double grouped = in_.rates.grouped_gemm_flops > 0 ? in_.rates.grouped_gemm_flops : fp8_flops();
  t.dense = std::max(w.dense_bytes / gemm_hbm, w.dense_flops / fp8_flops());
  t.experts = std::max(w.expert_bytes / gemm_hbm, w.expert_flops / grouped);
  t.weights = t.dense + t.experts;
  t.attention = std::max(w.attention_bytes / hbm, w.attention_flops / in_.rates.sparse_decode_flops);
  t.indexer = std::max(w.indexer_bytes / hbm, w.indexer_flops / fp8_flops());
  t.hbm_copies = w.transfer_hbm_bytes / hbm;
  t.gpu = t.weights + t.attention + t.indexer + t.hbm_copies;
  // Host link: full duplex, each direction at the scattered-row rate. NVLink: the profile's
  // figure is bidirectional, so one direction gets half.
  const double scattered = in_.rates.host_link_scattered_bytes_per_s;
  const double h2d = w.h2d_bytes / scattered, d2h = w.d2h_bytes / scattered;
  // Arriving prefill KV: bulk writes at the link's own rate, in the host -> device direction.
  const double bulk = hw.host_link_bandwidth_bytes_per_s > 0 ? hw.host_link_bandwidth_bytes_per_s : scattered;
  t.arriving = w.arriving_bytes / bulk;
  t.host_link = std::max(h2d + t.arriving, d2h);
  const double nvlink_dir = hw.nvlink_bandwidth_bytes_per_s / 2;
  t.nvlink_fetch = w.nvlink_fetch_bytes / nvlink_dir;
  // Overlap only within a group: of each group's transfers the first layer's share is exposed,
  // the others arrive while the group's earlier layers compute. A critical-path host fetch
  // (HiSparse's per-layer swap-in) is exposed in full.
  // The arriving KV streams in the background: overlapped like the other transfers (HiSparse:
  // beside its critical-path fetch).
  const double tx = w.h2d_critical ? std::max({d2h, t.arriving, t.nvlink_fetch}) : std::max(t.host_link, t.nvlink_fetch);
  const double l = std::max<std::uint32_t>(w.layers_per_group, 1);
  const double pipelined = tx / l + t.gpu / l + (l - 1) / l * std::max(t.gpu, tx) + (w.h2d_critical ? h2d : 0.0);
  t.transfer_exposed = pipelined - t.gpu;
  t.collective_latency = w.allreduce_calls * AllReduceLatency() + w.gather_calls * GatherLatency();
  t.collectives = w.collective_bytes / nvlink_dir + t.collective_latency;
  t.planner = w.planner_kernels * in_.rates.kernel_launch_s + w.planner_selections * in_.rates.planner_s_per_selection;
  t.overhead = w.layers * in_.kernel_overhead_s_per_layer;
  t.total = pipelined + t.collectives + t.planner + t.overhead;
  return t;
}

}  // namespace ula
