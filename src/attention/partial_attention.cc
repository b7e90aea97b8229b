// Partial sparse MLA attention and the log-sum-exp merge (partial_attention.h).
#include "ula/partial_attention.h"

#include "attention/mla_math.h"

#include <fmt/format.h>

#include <cmath>
#include <cstring>
#include <vector>

namespace ula {

Status PartialMlaAttention(const MlaShape& shape, std::span<const float> query,
                           std::span<const std::byte* const> entries, std::span<float> partial) {
  ULA_RETURN_IF_ERROR(shape.Validate());
  if (query.size() != shape.query_values()) {
    return MakeError(ErrorCode::kInvalidArgument,
                     fmt::format("query has {} values, expected {}", query.size(), shape.query_values()));
  }
  if (partial.size() != PartialValues(shape)) {
    return MakeError(ErrorCode::kInvalidArgument,
                     fmt::format("partial has {} values, expected {}", partial.size(), PartialValues(shape)));
  }
  const std::uint32_t width = shape.kv_lora_rank + shape.rope_dim;
  const std::uint32_t record = shape.kv_lora_rank + 2;
  std::vector<float> kv, weights;  // [n][L + R], [n]
  ULA_RETURN_IF_ERROR(mla_internal::LoadEntries(shape, entries, kv));
  for (std::uint32_t h = 0; h < shape.num_heads; ++h) {
    float* acc = partial.data() + std::size_t{h} * record;
    const float max_logit = mla_internal::SoftmaxWeights(shape, query.data() + std::size_t{h} * width, kv, weights);
    float sum = 0.0f;
    for (float w : weights) sum += w;
    for (std::uint32_t d = 0; d < shape.kv_lora_rank; ++d) acc[d] = 0.0f;
    for (std::size_t i = 0; i < weights.size(); ++i) {
      const float* c = kv.data() + i * width;
      for (std::uint32_t d = 0; d < shape.kv_lora_rank; ++d) acc[d] += weights[i] * c[d];
    }
    acc[shape.kv_lora_rank] = max_logit;
    acc[shape.kv_lora_rank + 1] = sum;
  }
  return Ok();
}

Status MergeMlaPartials(const MlaShape& shape, std::span<const float> partials, std::span<float> out) {
  ULA_RETURN_IF_ERROR(shape.Validate());
  const std::size_t per_part = PartialValues(shape);
  if (partials.empty() || partials.size() % per_part != 0) {
    return MakeError(ErrorCode::kInvalidArgument,
                     fmt::format("partials hold {} values, not a positive multiple of {}", partials.size(), per_part));
  }
  if (out.size() != shape.output_values()) {
    return MakeError(ErrorCode::kInvalidArgument,
                     fmt::format("out has {} values, expected {}", out.size(), shape.output_values()));
  }
  const std::size_t parts = partials.size() / per_part;
  const std::uint32_t l = shape.kv_lora_rank;
  const std::uint32_t record = l + 2;
  auto head_max = [&](std::uint32_t h) {
    float m = -INFINITY;
    for (std::size_t k = 0; k < parts; ++k) {
      const float* r = partials.data() + k * per_part + std::size_t{h} * record;
      if (r[l + 1] > 0.0f && r[l] > m) m = r[l];
    }
    return m;
  };
  for (std::uint32_t h = 0; h < shape.num_heads; ++h) {  // validate before writing out
    if (head_max(h) == -INFINITY) {
      return MakeError(ErrorCode::kInvalidArgument, fmt::format("head {}: every partial is empty", h));
    }
  }
  for (std::uint32_t h = 0; h < shape.num_heads; ++h) {
    auto part = [&](std::size_t k) { return partials.data() + k * per_part + std::size_t{h} * record; };
    const float m = head_max(h);
    float* o = out.data() + std::size_t{h} * l;
    for (std::uint32_t d = 0; d < l; ++d) o[d] = 0.0f;
    float denom = 0.0f;
    for (std::size_t k = 0; k < parts; ++k) {
      const float* acc = part(k);
      if (!(acc[l + 1] > 0.0f)) continue;  // empty part
      const float w = std::exp(acc[l] - m);
      denom += w * acc[l + 1];
      for (std::uint32_t d = 0; d < l; ++d) o[d] += w * acc[d];
    }
    for (std::uint32_t d = 0; d < l; ++d) o[d] /= denom;
  }
  return Ok();
}

}  // namespace ula
