// CostModel: the time of one decode step on one GPU of a P-GPU serving group, as a roofline
// per term (docs/COST_MODEL.md), and the memory budget every system gets.
//
// GPU terms, each max(bytes / HBM bandwidth, FLOPs / rate), summed:
//   dense      non-routed GEMMs (attention and indexer projections, dense MLP, shared experts,
//              routers, embedding / LM head; under TP the replicated ones whole), FP8 rate,
//              weights read at gemm_hbm_efficiency x HBM
//   experts    routed experts any token of the step was routed to, weights read at
//              gemm_hbm_efficiency x HBM, FLOPs at the grouped GEMMs' achieved rate
//              (grouped_gemm_flops): compute-bound once an expert gets enough tokens
//   attention  the selected entries of every query; FLOPs with the query heads of one call
//              padded up to the sparse decode kernel's head multiple, at that kernel's
//              published achieved rate
//   indexer    every index key of every request the GPU scores (the whole context, for
//              every query), FP8 rate, plus each query's fp32 logits written and read back
//              by the top-k
//   hbm copies every byte received or sent over PCIe / NVLink is written to or read from HBM
// Transfers, from the planners' counters: host link (scattered-row rate, max of the two
// directions) and NVLink fetches. A group's selection is known only after its own indexer,
// so only the layers of one group overlap: with L layers per group,
// t = t_x/L + t_gpu/L + (L-1)/L * max(t_gpu, t_x), t_x = max(host, nvlink) — the first
// layer's share of every group is exposed. SGLang HiSparse without its shared-index prefetch
// (swap_in_per_layer) swaps in per layer on the forward stream: its host fetch is on the
// critical path in full.
// Collectives (bandwidth + NCCL per-call latency), UlaCache's planner kernels (launch + per
// selection) and HiSparse's swap-in kernels, and a fixed per-layer overhead are on the
// critical path and added. No term depends on which system is running: systems differ only
// in the counts they hand in.
//
// Thread-safety: immutable after Create; all methods const.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ula/error.h"
#include "config/hardware_config.h"
#include "config/model_config.h"
#include "serving/serving_config.h"

namespace ula {

// Parameter counts derived from ModelConfig + ModelCostConfig (formulas in COST_MODEL.md).
struct WeightParams {
  double attention_per_layer = 0;  // MLA projections
  double attention_a_per_layer = 0;  // q_a + kv_a (part of the above), replicated under TP
  double indexer_per_group = 0;    // lightning indexer projections, one per layer group
  double dense_mlp_per_layer = 0;
  double expert = 0;               // one routed or shared expert
  double router_per_layer = 0;
  double embedding = 0;            // vocab x hidden (input embedding; the LM head is another)
  double mtp_extra = 0;            // MTP layer's own projection (2h x h)
  double total = 0;                // main model + MTP layers
  double active_per_token = 0;     // main model, one token
};

struct CostModelInputs {
  ModelConfig model;
  ModelCostConfig costs;
  HardwareConfig hardware;
  ComputeRates rates;  // used where the hardware profile has 0 (unknown)
  ParallelMode mode = ParallelMode::kTp;
  bool mtp = false;
  std::uint32_t num_ranks = 8;
  std::uint32_t draft_tokens = 2;  // with mtp
  double kernel_overhead_s_per_layer = 0;
  std::uint32_t planner_kernels_per_call = 2;  // UlaCache planner, per group per step
  std::uint32_t candidate_bytes = 8;
  std::uint32_t indexer_logit_bytes = 0;  // per scored key and query, written + read by the top-k
  double activation_reserve_fraction = 0.1;
};

// Per-GPU memory left for KV (and index keys, buffers), identical for every system.
struct MemoryBudget {
  double hbm_bytes = 0;
  double weight_bytes = 0;      // this GPU's share of the weights in this mode
  double activation_bytes = 0;  // reserve
  double device_kv_bytes = 0;   // hbm - weights - activations
  double host_bytes = 0;
  std::vector<std::string> derivation;  // human-readable lines
};

// What the GPUs exchange per layer pass when attention runs at home (each GPU over the
// entries striped onto it, all heads):
//   kUlaCache  ulacache_home: all-gather of the absorbed queries (bf16), reduce-scatter of
//              the float32 partials of partial_attention.h to the owners of their heads
//   kDcp       vLLM's decode context parallel: all-gather of the queries (bf16), then
//              cp_lse_ag_out_rs: all-gather of the LSE (fp32) and reduce-scatter of the
//              partial outputs (bf16), three calls
//   kDcpPacked SGLang's: all-gather of the queries, then the partial outputs (bf16) and their
//              LSE (fp32) in one packed all-to-all, two calls
//   kHelix     TensorRT-LLM Helix: queries computed redundantly (no gather), one all-to-all
//              of the partial outputs (bf16) and their LSE (fp32)
enum class HomeExchange : std::uint8_t { kUlaCache, kDcp, kDcpPacked, kHelix };

// One decode step as seen by the busiest GPU. Entry counts are per layer group (the
// simulated representative group); the cost model scales them to every group.
struct StepCounts {
  double batch_total = 0;     // requests decoding on all GPUs (MoE routing, TP collectives)
  double batch_local = 0;     // requests whose attention this GPU computes
  double history_scored = 0;  // sum of history lengths whose index keys this GPU scores
  bool striped_indexer = false;  // candidates all-gathered (UlaCache TP)
  double h2d_entries = 0;     // host -> device, per group
  double d2h_entries = 0;     // device -> host (swaps out, write-back, new-token backup)
  double nvlink_entries = 0;  // fetched from other GPUs, per group
  // TP attention at home (TpAttention::kAtHome): the GPU computes all heads over the
  // selected entries homed on it, no KV crosses NVLink, the absorbed queries are
  // all-gathered and the partial outputs exchanged. home_entries / distinct_entries is its
  // share of the batch's selections (planner: hits + misses over distinct, StepStats).
  bool attention_at_home = false;
  HomeExchange home_exchange = HomeExchange::kUlaCache;
  double home_entries = 0;      // distinct selections homed on this GPU, per group
  double distinct_entries = 0;  // distinct selections of the batch, per group
  // Helix: every GPU projects every head's query (q_b and W_UK replicated, read whole and
  // applied to every token of the batch).
  bool redundant_qkv = false;
  // UlaCache: the planner (lookup, dedup, hit test, bucket update) runs per group per step
  // over every selection of the batch this GPU plans; vllm_hisparse: its residency resolver
  // and gather kernels (per index group, on a copy stream).
  bool planner_per_group = false;
  // HiSparse as SGLang runs it without its shared-index prefetch: one swap-in kernel per
  // layer on the forward stream, between the top-k and the attention, over every selection;
  // its host fetch is on the critical path. (With the prefetch it is planner_per_group.)
  bool swap_in_per_layer = false;
  // Prefill KV arriving (disaggregated serving: the decode server receives each new
  // request's KV and index keys from its prefill server), bytes per step landing on this
  // GPU's share: into host memory (host tiers) or into device memory. Both cross the
  // GPU's host link in the host -> device direction at its bulk rate (large RDMA writes,
  // not scattered rows) and share it with the step's own host fetches; device bytes are
  // also written to HBM.
  double arriving_host_bytes = 0, arriving_device_bytes = 0;
};

struct StepWork {
  double dense_bytes = 0, dense_flops = 0;    // non-routed GEMMs
  double expert_bytes = 0, expert_flops = 0;  // routed experts
  double attention_bytes = 0, attention_flops = 0;  // FLOPs with padded heads
  double attention_heads_per_call = 0;        // after padding
  double indexer_bytes = 0, indexer_flops = 0;
  double h2d_bytes = 0, d2h_bytes = 0, nvlink_fetch_bytes = 0;
  double collective_bytes = 0;  // sent per GPU on NVLink, on the critical path (all below included)
  double query_gather_bytes = 0;      // attention at home: all-gather of the absorbed queries
  double partial_exchange_bytes = 0;  // attention at home: partial outputs to their heads' owners
  double arriving_bytes = 0;      // prefill KV arriving over the host link (host + device landing)
  double transfer_hbm_bytes = 0;  // HBM side of every byte over PCIe / NVLink (received written, sent read)
  double allreduce_calls = 0;     // ring all-reduces per step
  double gather_calls = 0;        // all-gathers, reduce-scatters, all-to-alls per step
  double planner_kernels = 0;     // UlaCache planner / HiSparse swap-in kernels per step
  double planner_selections = 0;  // selections they process per step
  bool h2d_critical = false;      // host fetch on the critical path in full (HiSparse)
  std::uint32_t layers = 0;     // layer passes per step (main + MTP passes)
  std::uint32_t groups = 1;
  std::uint32_t layers_per_group = 1;  // pipeline depth for transfer overlap (within a group)
};

struct StepTime {
  double weights = 0;  // dense + experts
  double dense = 0, experts = 0, attention = 0, indexer = 0, hbm_copies = 0, gpu = 0;
  double host_link = 0, nvlink_fetch = 0;
  double arriving = 0;  // host-link time of the arriving prefill KV (part of host_link)
  double transfer_exposed = 0;  // total - gpu - collectives - planner - overhead
  double collectives = 0;       // bandwidth + per-call latency
  double collective_latency = 0;  // the latency part of collectives
  double planner = 0;           // UlaCache planner / HiSparse swap-in kernels
  double overhead = 0;
  double total = 0;
};

class CostModel {
 public:
  static Result<CostModel> Create(const CostModelInputs& inputs);

  const CostModelInputs& inputs() const { return in_; }
  const WeightParams& params() const { return params_; }
  MemoryBudget Budget() const;
  // KV bytes of one token over the layers in use (main, plus MTP when mtp).
  std::uint64_t kv_bytes_per_token() const;
  // Index-key bytes of one token (one key per indexer group in use).
  std::uint64_t index_bytes_per_token() const;
  // Queries per request per step of the main model: 1, or 1 + draft_tokens with mtp.
  std::uint32_t queries() const;
  // Expected output tokens per request per step: 1, or 1 + a + a^2 + ... with mtp.
  double ExpectedTokensPerStep(double acceptance) const;
  // Effective rates: hardware value, or the cost file's where the hardware has 0.
  double fp8_flops() const;
  double bf16_flops() const;
  // Query heads of one sparse-decode call after padding to the kernel's head multiple.
  std::uint32_t PaddedHeads(std::uint32_t heads) const;
  // Per-call latency of a ring all-reduce / of an all-gather, reduce-scatter or all-to-all.
  double AllReduceLatency() const;
  double GatherLatency() const;
  // Helix's redundant QKV: parameters per attention layer that every GPU holds whole (q_b and
  // the W_UK half of kv_b), and the bytes they add per GPU over ordinary TP (the layers in
  // use; 0 for P = 1).
  double RedundantQkvParamsPerLayer() const;
  double RedundantQkvExtraWeightBytes() const;

  // kInvalidArgument (naming the field) for counts Work cannot price: a negative or
  // non-finite count, attention at home outside TP mode, home_entries > distinct_entries,
  // or at home with requests but no distinct selections.
  Status CheckCounts(const StepCounts& c) const;
  // REQUIRES: CheckCounts(c) is ok.
  StepWork Work(const StepCounts& c) const;
  StepTime Time(const StepWork& w) const;

 private:
  CostModelInputs in_;
  WeightParams params_;
};

// Derives parameter counts (no validation beyond the configs' own).
WeightParams DeriveWeightParams(const ModelConfig& model, const ModelCostConfig& costs);
// Non-routed parameters that engines replicate on every GPU under TP: q_a and kv_a of every
// layer, the indexer projections, the routers and, per loaded MTP layer, its eh projection.
double TpReplicatedParams(const ModelConfig& model, const ModelCostConfig& costs, const WeightParams& p,
                          double mtp_layers_loaded);

}  // namespace ula
