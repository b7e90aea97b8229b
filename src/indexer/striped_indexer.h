// Striped indexer (TP mode): the indexer keys are striped like the entries — the key of the
// token with logical address a lives on rank a mod P — so each rank scores only its own
// keys. Each rank keeps its best k (score, position) candidates in the indexer's top-k
// order (indexer/indexer.h: higher score first, equal scores by lower position); the per-rank
// candidates are gathered (an all-gather) and merged into the global top-k.
//
// Exactness: the top-k order is a total order on (score, position) and scores are
// computed bit-identically by IndexScore wherever a key lives, so each of the global top-k
// is among its own rank's top-k, and the merge (the same order, first k) equals the
// single-rank SelectTopK exactly, ties included.
//
// Gather payload: exactly k candidates per rank (PadCandidates fills with kNoPosition
// entries, which the merge ignores), so the all-gather has a fixed size: k x 8 B per rank
// (DeepSeek-V4-Flash's k = 512 C4 entries: 4 KiB; V4-Pro's 1024: 8 KiB).
//
// DeepSeek-V4: the keys are the C4 entries' index keys (one per compress_rate_csa tokens),
// each at its entry's logical address, so they are striped with their entries (a mod P)
// and a position is the request's C4 entry index; nothing else changes.
// Thread-safety: reentrant.
#pragma once

#include <cstdint>
#include <limits>
#include <span>
#include <vector>

#include "ula/error.h"
#include "indexer/indexer.h"

namespace ula {

class TpFabric;

struct IndexCandidate {
  float score = 0;
  std::uint32_t position = 0;
  static constexpr std::uint32_t kNoPosition = std::numeric_limits<std::uint32_t>::max();
  bool operator==(const IndexCandidate&) const = default;
};

// The best min(k, m) candidates among this rank's keys, in top-k order.
// local_keys: [m * head_dim]; local_positions: [m] the request positions of those keys.
// kInvalidArgument for sizes that disagree with the shape.
Status LocalCandidates(const IndexerShape& shape, const IndexQuery& q, std::span<const float> local_keys,
                       std::span<const std::uint32_t> local_positions, std::vector<IndexCandidate>& out);
// Resizes to exactly k entries, filling with kNoPosition candidates.
void PadCandidates(std::vector<IndexCandidate>& candidates, std::uint32_t k);
// The first k positions of the gathered candidates (any ranks' lists concatenated, padding
// ignored) in top-k order, into out (replaced).
void MergeCandidates(std::span<const IndexCandidate> gathered, std::uint32_t k, std::vector<std::uint32_t>& out);
// LocalCandidates -> pad -> fabric->AllGather (collective) -> merge. With fabric ==
// nullptr the local keys are all keys (one rank). Every rank passes the same shape and
// query. kInvalidArgument, `out` unchanged: a bad shape on every rank before the
// collective; a rank's local keys that disagree with the shape (or the query's size) make
// that rank send a refusal block of the same size, and every rank returns the error after
// the gather (no rank is left waiting in the collective).
Status StripedSelect(const IndexerShape& shape, const IndexQuery& q, std::span<const float> local_keys,
                     std::span<const std::uint32_t> local_positions, TpFabric* fabric, std::vector<std::uint32_t>& out);

}  // namespace ula
