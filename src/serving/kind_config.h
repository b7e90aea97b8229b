// KindCompareConfig: what the per-kind comparison (`ula compare --model deepseek_v4_flash`,
// kind_compare.h) needs beside the model's layer kinds (configs/models/<model>.json) and
// the scenario it borrows hardware, modes, workload and budgets from: the weight shapes the
// step is priced with, each engine's DSV4 pool constants and the C4 indexer workload whose
// run measures the selection turnover (kind_compare.h MeasureKindTurnover).
// File: configs/kinds/<model>.json; every constant {"value", "source"}.
//
// Invariants after Validate(): every count >= 1; 0 < swa_full_tokens_ratio <= 1;
// selection_workload non-empty; 0 < selection_sensitivity_query_keep <= 10; page and block sizes multiples of 128 (one C128 entry per
// 128 tokens, SGLang asserts page_size % 128 == 0); starvation_contexts non-empty, ascending.
//
// Thread-safety: plain values; loaders are reentrant.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include "ula/error.h"

namespace ula {

struct KindCompareConfig {
  std::string name;
  std::string model;     // configs/models/<model>.json (must have layer kinds)
  std::string scenario;  // configs/scenarios/<scenario>.json: hardware x mode x MTP, workload, budgets
  // Weight shapes (kind_step_cost.h).
  std::uint32_t hidden_size = 0, q_lora_rank = 0, o_lora_rank = 0, o_groups = 1, head_dim = 0;
  std::uint32_t routed_experts = 0, shared_experts = 0, experts_per_token = 0, moe_intermediate_size = 0;
  std::uint32_t vocab_size = 0;
  double expert_bytes_per_param = 1, linear_bytes_per_param = 1, embedding_bytes_per_param = 2;
  double compressor_params_per_compressed_layer = 0;
  // SGLang's DSV4PoolConfigurator.
  std::uint32_t sglang_page_size = 256;
  double sglang_swa_full_tokens_ratio = 0.1;
  std::uint32_t sglang_c4_state_ring = 8, sglang_c4_state_ring_mtp = 16;
  std::uint32_t sglang_c128_state_ring = 128, sglang_c128_state_ring_mtp = 256;
  std::uint32_t sglang_state_dtype_bytes = 4;
  std::uint32_t sglang_max_running_requests = 256;
  // vLLM's block pool.
  std::uint32_t vllm_block_tokens = 256;
  std::uint32_t vllm_page_alignment = 576;
  std::uint32_t vllm_window_blocks_extra = 1;
  // configs/workloads/<selection_workload>.json: the C4 indexer of `model` whose decode run
  // measures the share of a query's top-k its previous step did not select (the turnover).
  std::string selection_workload;
  // --sensitivity: the same run with the queries' drift at this query_keep.
  double selection_sensitivity_query_keep = 0.3;
  std::uint32_t starvation_requests = 4096;  // offered at each context of the sweep
  std::vector<std::uint32_t> starvation_contexts;

  Status Validate() const;
};

Result<KindCompareConfig> ParseKindCompareConfig(std::string_view json_text, std::string_view origin = "kind config");
// config_dir / "kinds" / (model + ".json"); kNotFound naming the models that have one.
Result<KindCompareConfig> LoadKindCompareConfigByName(std::string_view model, const std::filesystem::path& config_dir);

}  // namespace ula
