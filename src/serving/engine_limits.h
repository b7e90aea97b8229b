// The engines' CUDA-graph limits, each in its engine's own unit (docs/COST_MODEL.md "Prefill
// KV arriving, and the CUDA-graph limit"). A decode batch past the limit runs without graphs
// in both engines (vLLM's CUDA-graph dispatcher, SGLang's CUDA-graph runner); the model does
// not price that eager step: each engine instance (TP: the node; DP: each GPU's rank) decodes
// at most the requests the limit allows, and the curve stops there.
//
//   vLLM (engine "vLLM": dcp, vllm_hisparse): tokens. VllmConfig._set_cudagraph_sizes
//     captures up to max_cudagraph_capture_size tokens (1024 on compute capability family
//     100, else 512: ComputeRates::vllm_max_cudagraph_capture_size) and a decode step of a
//     request is 1 + num_speculative_tokens tokens (uniform_decode_query_len), so
//     requests x queries <= capture: floor(capture / queries) requests (512 with two drafts:
//     170).
//   SGLang and every other engine: requests, cuda_graph_max_bs (ScenarioConfig::
//     cuda_graph_max_batch), whatever the drafts. UlaCache runs under this form.
//
// Thread-safety: pure functions.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string_view>

namespace ula {

// True where the engine counts its CUDA-graph limit in tokens (vLLM).
inline bool CudaGraphLimitInTokens(std::string_view engine) { return engine == "vLLM"; }

// Requests one engine instance decodes under CUDA graphs; 0 = no limit. `queries` = 1, or
// 1 + draft tokens with MTP; `requests_limit` = SGLang's cuda_graph_max_bs; `capture_tokens`
// = vLLM's max_cudagraph_capture_size on this GPU.
inline std::uint32_t CudaGraphRequestsPerInstance(std::string_view engine, std::uint32_t requests_limit,
                                                  std::uint32_t capture_tokens, std::uint32_t queries) {
  if (!CudaGraphLimitInTokens(engine)) return requests_limit;
  if (capture_tokens == 0) return 0;
  return std::max<std::uint32_t>(1, capture_tokens / std::max<std::uint32_t>(1, queries));
}

}  // namespace ula
