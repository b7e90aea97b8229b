// Reference sparse MLA attention (reference_attention.h). Entries are copied once into a
// float scratch matrix (memcpy: entry bytes may be unaligned), then each head runs the
// softmax in index order.
#include "ula/reference_attention.h"

#include "attention/mla_math.h"

#include <fmt/format.h>

#include <cmath>
#include <cstring>

namespace ula {

Status MlaShape::Validate() const {
  if (num_heads == 0) return MakeError(ErrorCode::kInvalidArgument, "field 'num_heads': must be >= 1");
  if (kv_lora_rank == 0) return MakeError(ErrorCode::kInvalidArgument, "field 'kv_lora_rank': must be >= 1");
  if (!(softmax_scale > 0.0f) || !std::isfinite(softmax_scale)) {
    return MakeError(ErrorCode::kInvalidArgument, "field 'softmax_scale': must be finite and > 0");
  }
  return Ok();
}

Status SparseMlaAttention(const MlaShape& shape, std::span<const float> query,
                          std::span<const std::byte* const> entries, std::span<float> out) {
  ULA_RETURN_IF_ERROR(shape.Validate());
  if (entries.empty()) return MakeError(ErrorCode::kInvalidArgument, "no selected entries");
  if (query.size() != shape.query_values()) {
    return MakeError(ErrorCode::kInvalidArgument,
                     fmt::format("query has {} values, expected {}", query.size(), shape.query_values()));
  }
  if (out.size() != shape.output_values()) {
    return MakeError(ErrorCode::kInvalidArgument,
                     fmt::format("out has {} values, expected {}", out.size(), shape.output_values()));
  }
  const std::uint32_t width = shape.kv_lora_rank + shape.rope_dim;
  std::vector<float> kv, weights;  // [n][L + R], [n]
  ULA_RETURN_IF_ERROR(mla_internal::LoadEntries(shape, entries, kv));
  for (std::uint32_t h = 0; h < shape.num_heads; ++h) {
    mla_internal::SoftmaxWeights(shape, query.data() + std::size_t{h} * width, kv, weights);
    float denom = 0.0f;
    for (float w : weights) denom += w;
    float* o = out.data() + std::size_t{h} * shape.kv_lora_rank;
    for (std::uint32_t d = 0; d < shape.kv_lora_rank; ++d) o[d] = 0.0f;
    for (std::size_t i = 0; i < weights.size(); ++i) {
      const float p = weights[i] / denom;
      const float* c = kv.data() + i * width;
      for (std::uint32_t d = 0; d < shape.kv_lora_rank; ++d) o[d] += p * c[d];
    }
  }
  return Ok();
}

}  // namespace ula
