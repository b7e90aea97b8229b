// Serving-comparison configs: the scenario that `ula compare` runs, the model
// dimensions that only the cost model needs (weights, FLOPs), and compute rates that the
// hardware profiles lack. Files:
//
//   configs/scenarios/<name>.json  ScenarioConfig: model, workload, the list of
//                                  (hardware, mode, mtp) configs, cost constants, the
//                                  selection model and what the simulation samples
//   configs/costs/<model>.json     ModelCostConfig (weights and FLOPs of a GLM-5-like MoE)
//   configs/costs/<hardware>.json  ComputeRates (dense BF16 / FP8 FLOP rates, the sparse MLA
//                                  decode kernel's achieved rate and head multiple, the
//                                  scattered-row host-link rate, collective latencies, kernel
//                                  launch and planner per-selection costs)
//
// Every number that is a physical or modelling constant is {"value", "source"}; the loaders
// require every field, reject unknown ones, and name the bad field in errors
// ("configs/scenarios/x.json: field 'num_ranks': must be >= 1, got 0").
//
// Thread-safety: plain values; loaders are reentrant.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "ula/error.h"
#include "workload/selection_model.h"

namespace ula {

enum class ParallelMode : std::uint8_t { kTp, kDp };
std::string_view ParallelModeName(ParallelMode mode);  // "tp" / "dp"

// Shapes of a DeepSeek-V3-style MoE with MLA that the KV-cache config does not carry.
struct ModelCostConfig {
  std::string name;
  std::uint32_t hidden_size = 0;
  std::uint32_t q_lora_rank = 0;
  std::uint32_t qk_nope_head_dim = 0;
  std::uint32_t v_head_dim = 0;
  std::uint32_t vocab_size = 0;
  std::uint32_t dense_intermediate_size = 0;
  std::uint32_t first_dense_layers = 0;  // the rest are MoE layers
  std::uint32_t moe_intermediate_size = 0;
  std::uint32_t routed_experts = 0;
  std::uint32_t shared_experts = 0;
  std::uint32_t experts_per_token = 0;
  double weight_bytes_per_param = 1;     // linear layers
  double embedding_bytes_per_param = 2;  // embedding, LM head

  Status Validate() const;
};

struct ComputeRates {
  std::string name;
  double dense_bf16_flops = 0;
  double dense_fp8_flops = 0;
  double sparse_decode_flops = 0;                // achieved rate of the sparse MLA decode kernel
  std::uint32_t sparse_decode_head_multiple = 1;  // query heads per call are padded up to a multiple
  double host_link_scattered_bytes_per_s = 0;    // one direction, 656-B rows read/written by GPU threads
  double collective_base_latency_s = 0;          // per collective call
  double collective_hop_latency_s = 0;           // per ring step of a call
  double kernel_launch_s = 0;                    // one small kernel under CUDA graphs
  double planner_s_per_selection = 0;            // lookup + dedup/touch of one selected entry
  // GEMMs below the roofline (docs/COST_MODEL.md "GEMMs at their achieved rates"): the
  // share of HBM peak that weight-bound decode GEMMs read at, and the FP8 rate the routed
  // experts' grouped GEMMs reach once compute-bound.
  double gemm_hbm_efficiency = 1;                // (0, 1], dense and routed-expert weight reads
  double grouped_gemm_flops = 0;                 // achieved, routed experts (0: dense_fp8_flops)
  // vLLM's default CUDA-graph capture ceiling on this GPU, in tokens (VllmConfig.
  // _set_cudagraph_sizes: 1024 on compute capability family 100, else 512); 0 = no limit.
  std::uint32_t vllm_max_cudagraph_capture_size = 0;
  Status Validate() const;
};

struct ScenarioEntry {
  std::string hardware;  // configs/hardware/<name>.json (and configs/costs/<name>.json)
  ParallelMode mode = ParallelMode::kTp;
  bool mtp = false;
};

// What the decode simulation samples (docs/COST_MODEL.md "What is simulated").
struct SamplingConfig {
  std::uint32_t warmup_steps = 2;   // steps after each batch-size change, not measured
  std::uint32_t measure_steps = 3;  // steps measured per batch size
  std::vector<std::uint32_t> batch_grid;  // ascending; the admission limit is added
  std::uint32_t max_requests = 4096;      // requests generated from the workload
  std::uint64_t seed = 1;                 // workload and MTP acceptance draws
};

struct ScenarioConfig {
  std::string name;
  std::string model;        // configs/models/<model>.json
  std::string model_costs;  // configs/costs/<model_costs>.json
  std::string workload;     // configs/workloads/<workload>.json
  std::uint32_t num_ranks = 8;
  std::vector<ScenarioEntry> configs;
  double activation_reserve_fraction = 0.1;  // of HBM, per GPU
  double mtp_acceptance_rate = 0.7;          // per draft token, sequential
  double kernel_overhead_s_per_layer = 0;
  std::uint32_t planner_kernels_per_call = 2;  // UlaCache planner kernels per group per step
  std::uint32_t candidate_bytes = 8;         // striped-indexer gather, per candidate
  // The indexer's logits (one per scored key and query, fp32) are written and read back by
  // its top-k: bytes per logit (0: not charged).
  std::uint32_t indexer_logit_bytes = 4;
  std::uint32_t hisparse_buffer_entries = 4096;            // per request per group
  double hisparse_host_to_device_ratio = 2;  // SGLang: host pool = ratio x device pool tokens
  // The seed's budget rule: HiSparse's ratio set so that its host pool uses the host
  // budget (or the largest its rules allow); false: hisparse_host_to_device_ratio as given.
  bool hisparse_match_host_budget = true;
  // SGLang HiSparse with IndexShare: the anchor layer of a group swaps in on the forward
  // stream, its shared layers' copies are prefetched on a side stream (overlapped within the
  // group, as every other system's copies); false: every layer's swap-in on the forward stream.
  bool hisparse_shared_index_prefetch = true;
  std::uint32_t helix_tokens_per_block = 64;     // Helix: tokens per KV block, the striping unit
  std::uint32_t vllm_hisparse_tail_entries = 128;  // vLLM HiSparse: newest tokens never reclaimed
  // vLLM HiSparse: its admission counts a request's resident pages up to the in-flight window
  // (apply_admission_cap; the tail included), VllmConfig.max_in_flight_tokens =
  // max_concurrent_batches x max_num_batched_tokens: VllmHiSparseAdmissionWindow.
  std::uint32_t vllm_max_num_batched_tokens = 8192;
  std::uint32_t vllm_max_concurrent_batches = 2;  // 2 with async scheduling (vLLM's default), 1 without
  // SGLang's CUDA-graph limit (cuda_graph_max_bs), in requests per engine instance (TP: the
  // node, DP: each GPU's rank); the curves stop there. 0 = no limit. vLLM's limit is in
  // tokens, per hardware (ComputeRates::vllm_max_cudagraph_capture_size): engine_limits.h.
  std::uint32_t cuda_graph_max_batch = 512;
  // TensorRT-LLM sparse KV offload: each request's GPU cache is gpu_cache_factor x the units
  // one decode step selects + 1, in pages of tokens_per_page.
  double trtllm_offload_gpu_cache_factor = 2.0;
  std::uint32_t trtllm_offload_tokens_per_page = 64;
  std::uint32_t tp_buffer_entries_per_request = 2048;      // UlaCache TP local buffer, MTP off
  std::uint32_t tp_buffer_entries_per_request_mtp = 3072;  // ... MTP on
  std::string selection_fit;        // configs/selection/<selection_fit>.json (selection_fit.h)
  std::uint64_t selection_seed = 1;  // this scenario's selection draws
  // The fit's parameters with selection_seed, set by ResolveScenarioSelection (and by
  // LoadScenarioConfig, RunComparison); top_k is taken from the model.
  SelectionModelParams selection;
  // Applied to the fit's parameters when they are read (ula compare --sensitivity: locality).
  std::function<void(SelectionModelParams&)> selection_adjust;
  SamplingConfig sampling;

  Status Validate() const;
};

// vLLM HiSparse's admission window in tokens: VllmConfig.max_in_flight_tokens =
// max_concurrent_batches x max_num_batched_tokens (docs/COST_MODEL.md, `vllm_hisparse`).
inline std::uint32_t VllmHiSparseAdmissionWindow(const ScenarioConfig& s) {
  return s.vllm_max_concurrent_batches * s.vllm_max_num_batched_tokens;
}

Result<ScenarioConfig> ParseScenarioConfig(std::string_view json_text, std::string_view origin = "scenario");
// Parses without reading other files: `selection` stays unset until ResolveScenarioSelection.
// LoadScenarioConfig parses and resolves the selection fit from config_dir.
Status ResolveScenarioSelection(ScenarioConfig& scenario, const std::filesystem::path& config_dir);
Result<ScenarioConfig> LoadScenarioConfig(const std::filesystem::path& path, const std::filesystem::path& config_dir);
Result<ModelCostConfig> ParseModelCostConfig(std::string_view json_text, std::string_view origin = "model costs");
Result<ModelCostConfig> LoadModelCostConfigByName(std::string_view name, const std::filesystem::path& config_dir);
Result<ComputeRates> ParseComputeRates(std::string_view json_text, std::string_view origin = "compute rates");
Result<ComputeRates> LoadComputeRatesByName(std::string_view name, const std::filesystem::path& config_dir);

}  // namespace ula
