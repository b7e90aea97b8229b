// CostModel: the time of one decode step on one GPU of a P-GPU serving group, as a roofline
// per term (docs/COST_MODEL.md), and the memory budget every system gets.
//
// Terms, each max(bytes / HBM bandwidth, FLOPs / FLOP rate) on the GPU:
//   weights    linear layers read once per step (MoE experts: only those any token routed
//              to), FLOPs 2 x params x tokens, FP8 rate
//   attention  the selected entries of every query (top-k x layers x entry bytes), sparse
//              MLA FLOPs, BF16 rate
//   indexer    every index key of every request the GPU scores, FP8 rate
// Transfers, from the planners' counters: host link (max of the two directions) and NVLink
// fetches; they overlap the GPU work of other layer groups (prefetch pipeline): with G
// groups, t = t_x/G + t_gpu/G + (G-1)/G * max(t_gpu, t_x), t_x = max(host, nvlink).
// Collectives (TP all-reduce, DP MoE all-to-all, striped-indexer gather; TP attention at
// home: the all-gather of the absorbed queries and the exchange of the partial outputs) and
// a fixed per-layer overhead are on the critical path and added. No term depends on which system
// is running: systems differ only in the counts they hand in.
//
// Thread-safety: immutable after Create; all methods const.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ula/error.h"
#include "ula/hardware_config.h"
#include "ula/model_config.h"
#include "ula/serving_config.h"

namespace ula {

// Parameter counts derived from ModelConfig + ModelCostConfig (formulas in COST_MODEL.md).
struct WeightParams {
  double attention_per_layer = 0;  // MLA projections
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
  std::uint32_t candidate_bytes = 8;
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
  // share of the batch's selections (planner: home_hits + home_misses over distinct).
  bool attention_at_home = false;
  double home_entries = 0;      // distinct selections homed on this GPU, per group
  double distinct_entries = 0;  // distinct selections of the batch, per group
};

struct StepWork {
  double weight_bytes = 0, weight_flops = 0;
  double attention_bytes = 0, attention_flops = 0;
  double indexer_bytes = 0, indexer_flops = 0;
  double h2d_bytes = 0, d2h_bytes = 0, nvlink_fetch_bytes = 0;
  double collective_bytes = 0;  // sent per GPU on NVLink, on the critical path (all below included)
  double query_gather_bytes = 0;      // attention at home: all-gather of the absorbed queries
  double partial_exchange_bytes = 0;  // attention at home: partial outputs to their heads' owners
  std::uint32_t layers = 0;     // layer passes per step (main + MTP passes)
  std::uint32_t groups = 1;     // pipeline depth for transfer overlap
};

struct StepTime {
  double weights = 0, attention = 0, indexer = 0, gpu = 0;
  double host_link = 0, nvlink_fetch = 0, transfer_exposed = 0;  // exposed = total - gpu - collectives - overhead
  double collectives = 0, overhead = 0;
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

}  // namespace ula
