// The pieces shared by the reference attention (reference_attention.cc) and the partial
// attention (partial_attention.cc), so that both compute the same logits bit for bit.
#pragma once

#include <fmt/format.h>

#include <cmath>
#include <cstring>
#include <span>
#include <vector>

#include "ula/error.h"
#include "ula/reference_attention.h"

namespace ula::mla_internal {

// Loads the entries' float values into kv ([n][L + R] floats; entries may be unaligned). kInvalidArgument
// for a null entry (kv is then unspecified).
inline Status LoadEntries(const MlaShape& shape, std::span<const std::byte* const> entries, std::vector<float>& kv) {
  const std::uint32_t width = shape.kv_lora_rank + shape.rope_dim;
  kv.resize(entries.size() * width);
  for (std::size_t i = 0; i < entries.size(); ++i) {
    if (entries[i] == nullptr) {
      return MakeError(ErrorCode::kInvalidArgument, fmt::format("selected entry {} is null", i));
    }
    std::memcpy(kv.data() + i * width, entries[i], shape.entry_bytes());
  }
  return Ok();
}

// weights[i] = exp(logit_i - max) for one head's query q over the n gathered entries, sums
// in index order; returns the max logit (-inf when n == 0).
inline float SoftmaxWeights(const MlaShape& shape, const float* q, const std::vector<float>& kv,
                            std::vector<float>& weights) {
  const std::uint32_t width = shape.kv_lora_rank + shape.rope_dim;
  const std::size_t n = kv.size() / width;
  weights.resize(n);
  float max_logit = -INFINITY;
  for (std::size_t i = 0; i < n; ++i) {
    const float* e = kv.data() + i * width;
    float dot = 0.0f;
    for (std::uint32_t d = 0; d < width; ++d) dot += q[d] * e[d];
    weights[i] = shape.softmax_scale * dot;
    if (weights[i] > max_logit) max_logit = weights[i];
  }
  for (std::size_t i = 0; i < n; ++i) weights[i] = std::exp(weights[i] - max_logit);
  return max_logit;
}

}  // namespace ula::mla_internal
