// CPU lightning indexer (indexer.h): scoring in the documented float order, top-k by
// partial selection on the documented total order, union in first-appearance order.
#include "indexer/indexer.h"

#include <fmt/format.h>

#include <algorithm>
#include <numeric>

#include "ula/check.h"

namespace ula {

Status IndexerShape::Validate() const {
  if (num_heads == 0) return MakeError(ErrorCode::kInvalidArgument, "field 'num_heads': must be >= 1");
  if (head_dim == 0) return MakeError(ErrorCode::kInvalidArgument, "field 'head_dim': must be >= 1");
  if (top_k == 0) return MakeError(ErrorCode::kInvalidArgument, "field 'top_k': must be >= 1");
  return Ok();
}

float IndexScore(const IndexerShape& shape, const IndexQuery& q, const float* key) noexcept {
  const std::uint32_t dim = shape.head_dim;
  float score = 0.0f;
  for (std::uint32_t h = 0; h < shape.num_heads; ++h) {
    const float* qh = q.query.data() + std::size_t{h} * dim;
    float dot = 0.0f;
    for (std::uint32_t d = 0; d < dim; ++d) dot += qh[d] * key[d];
    score += q.weights[h] * (dot > 0.0f ? dot : 0.0f);
  }
  return score;
}

void SelectTopK(std::span<const float> scores, std::uint32_t k, std::vector<std::uint32_t>& out) {
  const std::uint32_t n = static_cast<std::uint32_t>(scores.size());
  const std::uint32_t take = std::min(k, n);
  out.resize(n);
  std::iota(out.begin(), out.end(), 0u);
  auto before = [&](std::uint32_t a, std::uint32_t b) { return IndexOrderBefore(scores[a], a, scores[b], b); };
  if (take < n) {
    std::nth_element(out.begin(), out.begin() + take, out.end(), before);
    out.resize(take);
  }
  std::sort(out.begin(), out.end(), before);
}

void UnionSelections(std::span<const std::vector<std::uint32_t>> lists, std::uint32_t universe,
                     std::vector<std::uint32_t>& out) {
  out.clear();
  std::vector<bool> seen(universe, false);
  for (const auto& list : lists) {
    for (std::uint32_t p : list) {
      ULA_CHECK(p < universe);
      if (!seen[p]) {
        seen[p] = true;
        out.push_back(p);
      }
    }
  }
}

Result<Indexer> Indexer::Create(const IndexerShape& shape) {
  ULA_RETURN_IF_ERROR(shape.Validate());
  return Indexer(shape);
}

Status Indexer::CheckQuery(const IndexQuery& q, std::span<const float> keys) const {
  if (q.query.size() != std::size_t{shape_.num_heads} * shape_.head_dim) {
    return MakeError(ErrorCode::kInvalidArgument,
                     fmt::format("query has {} values, expected num_heads * head_dim = {}", q.query.size(),
                                 std::size_t{shape_.num_heads} * shape_.head_dim));
  }
  if (q.weights.size() != shape_.num_heads) {
    return MakeError(ErrorCode::kInvalidArgument,
                     fmt::format("weights has {} values, expected num_heads = {}", q.weights.size(), shape_.num_heads));
  }
  if (keys.size() % shape_.head_dim != 0) {
    return MakeError(ErrorCode::kInvalidArgument,
                     fmt::format("keys has {} values, not a multiple of head_dim = {}", keys.size(), shape_.head_dim));
  }
  return Ok();
}

Status Indexer::Score(const IndexQuery& q, std::span<const float> keys, std::vector<float>& scores) const {
  ULA_RETURN_IF_ERROR(CheckQuery(q, keys));
  const std::size_t n = keys.size() / shape_.head_dim;
  scores.resize(n);
  for (std::size_t i = 0; i < n; ++i) scores[i] = IndexScore(shape_, q, keys.data() + i * shape_.head_dim);
  return Ok();
}

Status Indexer::Select(const IndexQuery& q, std::span<const float> keys, std::vector<std::uint32_t>& out) {
  ULA_RETURN_IF_ERROR(Score(q, keys, scores_));
  SelectTopK(scores_, shape_.top_k, out);
  return Ok();
}

Status Indexer::SelectUnion(std::span<const IndexQuery> queries, std::span<const float> keys,
                            std::vector<std::vector<std::uint32_t>>& per_query,
                            std::vector<std::uint32_t>& union_out) {
  for (const IndexQuery& q : queries) ULA_RETURN_IF_ERROR(CheckQuery(q, keys));
  per_query.resize(queries.size());
  for (std::size_t i = 0; i < queries.size(); ++i) ULA_RETURN_IF_ERROR(Select(queries[i], keys, per_query[i]));
  UnionSelections(per_query, static_cast<std::uint32_t>(keys.size() / shape_.head_dim), union_out);
  return Ok();
}

}  // namespace ula
