// KindStepCost: the time of one decode step on the busiest GPU for a model with layer kinds
// (DeepSeek-V4), as a roofline per term (docs/COST_MODEL.md "Kinds"). Weights come from
// the kind config's shapes (kind_config.h); rates from the hardware profile and
// configs/costs/<hardware>.json, as the GLM-5 cost model (cost_model.h) uses them.
//
//   weights     non-expert weights (attention, indexer, compressor, shared experts, routers,
//               LM head) read once per step, routed experts any token was routed to
//               (E (1 - (1 - k/E)^T) per layer); at gemm_hbm_efficiency x HBM, or their FLOPs
//               at the FP8 / grouped-GEMM rate, whichever is longer. TP: each GPU 1/P of
//               all; DP: non-expert whole, experts 1/P (expert parallel).
//   attention   per query: the window (min(ctx, window) entries) in every layer, the top-k
//               C4 entries in each CSA layer, every C128 entry in each HCA layer; bytes at HBM
//               rate or 4 x head_dim FLOPs per entry and padded head at the sparse decode
//               kernel's rate. TP: every GPU reads every request's entries (replicated KV,
//               heads split and padded); at home (dcp, ulacache TP): 1/P of them, all heads.
//   indexer     per query and CSA layer every C4 index key (FP8) plus its fp32 logit written
//               and read back; 2 x index heads x index dim FLOPs per key at the FP8 rate.
//               Striped (dcp, ulacache TP): 1/P of the keys per GPU.
//   host link   C4 entries fetched from host per step, at the scattered-row rate; one layer
//               per selection, so nothing hides it: added in full.
//   collectives TP: two all-reduces of the hidden state per layer (+ at home: the query
//               all-gather and the partial-output exchange); DP: MoE dispatch (FP8) and
//               combine (BF16) all-to-alls per layer. Ring bandwidth + per-call latency.
//   overhead    kernel_overhead_s_per_layer per layer pass (main layers + one MTP pass per draft).
//
// Thread-safety: pure functions.
#pragma once

#include <cstdint>

#include "config/hardware_config.h"
#include "serving/kind_config.h"
#include "serving/kind_pools.h"
#include "serving/serving_config.h"
#include "ula/error.h"

namespace ula {

struct KindStepInputs {
  KindShape shape;            // MakeKindShape(model, mtp)
  std::uint32_t main_layers = 0, attention_heads = 0, index_heads = 0;
  KindCompareConfig kinds;
  HardwareConfig hardware;
  ComputeRates rates;
  ParallelMode mode = ParallelMode::kTp;
  std::uint32_t num_ranks = 8;
  bool mtp = false;
  std::uint32_t draft_tokens = 0;  // MTP passes per step with mtp
  double kernel_overhead_s_per_layer = 0;
  std::uint32_t indexer_logit_bytes = 4;
};

struct KindWeights {
  double non_expert_params = 0, routed_params = 0, expert_params = 0;  // expert: one expert of one layer
  double moe_layers = 0;
  double bytes_per_gpu = 0;  // resident weights of one GPU in the mode
};
KindWeights DeriveKindWeights(const KindStepInputs& in);

struct KindStepCounts {
  double batch_total = 0;   // requests decoding on all GPUs
  double batch_local = 0;   // requests whose attention this GPU computes
  double context = 0;       // mean context length of those requests
  bool at_home = false;     // attention over 1/P of every kind, all heads (dcp, ulacache TP)
  double home_partial_bytes = 4;  // at home: bytes per partial-output value exchanged (ulacache fp32, dcp bf16)
  bool striped_indexer = false;
  double host_fetch_entries = 0;  // C4 entries fetched from host per step by this GPU
};

struct KindStepTime {
  double weights = 0, attention = 0, indexer = 0, host_link = 0, collectives = 0, overhead = 0, total = 0;
};

// kInvalidArgument for negative or non-finite counts, or at_home outside TP.
Result<KindStepTime> PriceKindStep(const KindStepInputs& in, const KindStepCounts& c);

// Expected output tokens per request per step: 1, or 1 + a + ... + a^draft with MTP.
double KindTokensPerStep(const KindStepInputs& in, double acceptance);

}  // namespace ula
