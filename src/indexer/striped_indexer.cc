// Striped top-k: local candidates, fixed-size gather, merge (indexer/striped_indexer.h).
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <cstring>

#include "indexer/striped_indexer.h"
#include "ula/tp_fabric.h"

namespace ula {
namespace {
bool Before(const IndexCandidate& a, const IndexCandidate& b) {
  return IndexOrderBefore(a.score, a.position, b.score, b.position);
}
}  // namespace

Status LocalCandidates(const IndexerShape& shape, const IndexQuery& q, std::span<const float> local_keys,
                       std::span<const std::uint32_t> local_positions, std::vector<IndexCandidate>& out) {
  ULA_RETURN_IF_ERROR(shape.Validate());
  if (q.query.size() != std::size_t{shape.num_heads} * shape.head_dim || q.weights.size() != shape.num_heads) {
    return MakeError(ErrorCode::kInvalidArgument, "striped indexer: query or weights do not match the shape");
  }
  if (local_keys.size() != local_positions.size() * shape.head_dim) {
    return MakeError(ErrorCode::kInvalidArgument,
                     fmt::format("striped indexer: {} key values for {} positions of {} dims", local_keys.size(),
                                 local_positions.size(), shape.head_dim));
  }
  for (std::size_t i = 0; i < local_positions.size(); ++i) {
    if (local_positions[i] == IndexCandidate::kNoPosition) {
      return MakeError(ErrorCode::kInvalidArgument,
                       fmt::format("striped indexer: local position {} is 2^32 - 1, which is reserved", i));
    }
  }
  out.resize(local_positions.size());
  for (std::size_t i = 0; i < local_positions.size(); ++i) {
    out[i] = IndexCandidate{IndexScore(shape, q, local_keys.data() + i * shape.head_dim), local_positions[i]};
  }
  const std::size_t k = std::min<std::size_t>(shape.top_k, out.size());
  std::partial_sort(out.begin(), out.begin() + static_cast<std::ptrdiff_t>(k), out.end(), Before);
  out.resize(k);
  return Ok();
}

void PadCandidates(std::vector<IndexCandidate>& candidates, std::uint32_t k) {
  candidates.resize(k, IndexCandidate{0.0f, IndexCandidate::kNoPosition});
}

void MergeCandidates(std::span<const IndexCandidate> gathered, std::uint32_t k, std::vector<std::uint32_t>& out) {
  std::vector<IndexCandidate> all;
  all.reserve(gathered.size());
  for (const IndexCandidate& c : gathered) {
    if (c.position != IndexCandidate::kNoPosition) all.push_back(c);
  }
  const std::size_t n = std::min<std::size_t>(k, all.size());
  std::partial_sort(all.begin(), all.begin() + static_cast<std::ptrdiff_t>(n), all.end(), Before);
  out.resize(n);
  for (std::size_t i = 0; i < n; ++i) out[i] = all[i].position;
}

Status StripedSelect(const IndexerShape& shape, const IndexQuery& q, std::span<const float> local_keys,
                     std::span<const std::uint32_t> local_positions, TpFabric* fabric, std::vector<std::uint32_t>& out) {
  std::vector<IndexCandidate> mine;
  Status local = LocalCandidates(shape, q, local_keys, local_positions, mine);
  if (fabric == nullptr) {
    ULA_RETURN_IF_ERROR(local);
    MergeCandidates(mine, shape.top_k, out);
    return Ok();
  }
  // The shape and the query are the same on every rank, so every rank refuses them alike
  // before the collective; the local sizes are this rank's own, so a rank that refuses them
  // still joins the gather with a refusal block, and every rank returns the error.
  ULA_RETURN_IF_ERROR(shape.Validate());
  if (!local) mine.assign(1, IndexCandidate{std::numeric_limits<float>::quiet_NaN(), IndexCandidate::kNoPosition});
  PadCandidates(mine, shape.top_k);
  std::vector<IndexCandidate> all(std::size_t{shape.top_k} * fabric->num_ranks());
  ULA_RETURN_IF_ERROR(fabric->AllGather(std::as_bytes(std::span(mine)), std::as_writable_bytes(std::span(all))));
  if (!local) return local;
  for (std::uint32_t r = 0; r < fabric->num_ranks(); ++r) {
    const IndexCandidate& head = all[std::size_t{r} * shape.top_k];
    if (head.position == IndexCandidate::kNoPosition && std::isnan(head.score)) {
      return MakeError(ErrorCode::kInvalidArgument,
                       fmt::format("striped indexer: rank {} refused its local keys", r));
    }
  }
  MergeCandidates(all, shape.top_k, out);
  return Ok();
}

}  // namespace ula
