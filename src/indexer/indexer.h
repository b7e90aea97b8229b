// Indexer: a CPU lightning indexer (DeepSeek-V3.2 DSA style). Each token of a request has
// one index key k[head_dim]; a query has one vector per indexer head q[h][head_dim] and a
// weight per head w[h]. The score of a key is
//
//   score(k) = sum over h = 0..H-1, in order, of  w[h] * max(0, dot(q[h], k))
//   dot(q[h], k) = sum over d = 0..D-1, in order, of q[h][d] * k[d]
//
// computed in float32 in exactly that order (no reassociation: the library is built
// without -ffast-math), so any implementation that follows it — e.g. a striped top-k where
// each rank scores its own keys — gets bit-identical scores.
//
// Top-k tie order (the contract a striped, merged top-k must reproduce exactly):
//   a precedes b  iff  score(a) > score(b), or score(a) == score(b) and position(a) < position(b).
// The top-k is the first min(k, n) positions of that total order, returned in that order.
// REQUIRES: scores are not NaN (finite queries and keys never produce NaN).
//
// Speculative decoding verifies 1 + draft tokens per step: each query gets its own top-k;
// the step's selection is their union in first-appearance order (query 0's top-k in its
// order, then the positions of query 1 not yet seen, ...).
//
// Thread-safety: free functions are reentrant; an Indexer object holds scratch buffers and
// must not be shared between threads.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "ula/error.h"

namespace ula {

struct IndexerShape {
  std::uint32_t num_heads = 0;
  std::uint32_t head_dim = 0;
  std::uint32_t top_k = 0;
  Status Validate() const;  // names the bad field
};

// One query of the indexer. query: [num_heads * head_dim]; weights: [num_heads].
struct IndexQuery {
  std::span<const float> query;
  std::span<const float> weights;
};

// The score of one key (key: [head_dim]).
float IndexScore(const IndexerShape& shape, const IndexQuery& q, const float* key) noexcept;

// True iff (score_a, pos_a) precedes (score_b, pos_b) in the top-k order.
constexpr bool IndexOrderBefore(float score_a, std::uint32_t pos_a, float score_b, std::uint32_t pos_b) noexcept {
  return score_a > score_b || (score_a == score_b && pos_a < pos_b);
}

// Positions of the top min(k, scores.size()) scores, in top-k order, into `out` (replaced).
void SelectTopK(std::span<const float> scores, std::uint32_t k, std::vector<std::uint32_t>& out);

// Appends to `out` (replaced) every position of every list, first appearance kept.
// `universe` bounds the positions (all < universe).
void UnionSelections(std::span<const std::vector<std::uint32_t>> lists, std::uint32_t universe,
                     std::vector<std::uint32_t>& out);

class Indexer {
 public:
  static Result<Indexer> Create(const IndexerShape& shape);

  // Scores keys [n * head_dim] into scores [n] (resized).
  // kInvalidArgument if the query, weights or keys have the wrong size.
  Status Score(const IndexQuery& q, std::span<const float> keys, std::vector<float>& scores) const;
  // The top-k positions of the query over keys [n * head_dim], in top-k order.
  Status Select(const IndexQuery& q, std::span<const float> keys, std::vector<std::uint32_t>& out);
  // One top-k per query (per_query resized to queries.size()) and their union.
  Status SelectUnion(std::span<const IndexQuery> queries, std::span<const float> keys,
                     std::vector<std::vector<std::uint32_t>>& per_query, std::vector<std::uint32_t>& union_out);

  const IndexerShape& shape() const { return shape_; }

 private:
  explicit Indexer(const IndexerShape& shape) : shape_(shape) {}
  Status CheckQuery(const IndexQuery& q, std::span<const float> keys) const;

  IndexerShape shape_;
  std::vector<float> scores_;  // [n] scratch
};

}  // namespace ula
