// DeepSeek-V4's C4 index keys as a striped indexer sees them, for the tests
// (tests/tp/striped_c4_indexer_test.cc, tests/tp/tp_mpi_test.cc): a request of T tokens has
// floor(T / 4) C4 entries, each with one index key at the entry's logical address; under TP
// the key lives with its entry on rank (address mod P), and its position is the request's
// C4 entry index. Shapes come from the model configs (V4-Flash top-k 512, V4-Pro 1024).
//
// The workload: three requests whose C4 entries are interleaved in the address space in
// chunks (no request's addresses are contiguous): fewer entries than k, exactly k, and 3k.
// Each request's keys carry a planted tie group of 17 equal keys at positions whose address
// parity alternates (consecutive members on different ranks for every even P); where the
// request has more than k entries the group straddles the k boundary, members on both
// sides (ExpectC4TiesStraddle checks it of the data).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <random>
#include <set>
#include <vector>

#include "config/model_config.h"
#include "indexer/striped_indexer.h"
#include "test_seed.h"  // the callers seed the engine they pass

namespace ula::test {

static_assert(sizeof(IndexCandidate) == 8, "the gather payload is k x 8 B per rank");

inline constexpr std::uint32_t kTokensPerC4Entry = 4;
inline constexpr std::uint32_t kTieGroup = 17;  // the planted key and 16 copies

struct C4Request {
  std::uint32_t tokens = 0;
  std::vector<std::uint32_t> addrs;  // [entries] logical address of C4 entry j
  std::vector<float> keys;           // [entries * head_dim]
  std::vector<std::uint32_t> tie;    // the planted tie group's positions, ascending
  std::uint32_t entries() const { return static_cast<std::uint32_t>(addrs.size()); }
};

struct C4Workload {
  IndexerShape shape;
  std::vector<float> query;    // [num_heads * head_dim]
  std::vector<float> weights;  // [num_heads]
  std::vector<C4Request> requests;
  IndexQuery q() const { return {query, weights}; }
};

inline IndexerShape IndexerShapeOfModel(const char* model) {
  auto m = LoadModelConfigByName(model, DefaultConfigDir());
  EXPECT_TRUE(m) << m.error().ToString();
  EXPECT_TRUE(m->has_layer_kinds());
  return m->indexer_shape();
}

inline std::vector<float> C4Scores(const C4Workload& w, const C4Request& r) {
  std::vector<float> s(r.entries());
  for (std::uint32_t j = 0; j < r.entries(); ++j) {
    s[j] = IndexScore(w.shape, w.q(), r.keys.data() + std::size_t{j} * w.shape.head_dim);
  }
  return s;
}

// Requests of k - 37, k and 3k C4 entries (their tokens leave 2, 3 and 1 token filling),
// interleaved in chunks of 1..9 entries from address 5 on.
inline C4Workload MakeC4Workload(const IndexerShape& shape, std::mt19937_64& rng) {
  C4Workload w;
  w.shape = shape;
  const std::uint32_t k = shape.top_k, dim = shape.head_dim;
  w.query.resize(std::size_t{shape.num_heads} * dim);
  w.weights.resize(shape.num_heads);
  for (float& v : w.query) v = static_cast<float>(static_cast<int>(rng() % 4) - 1);
  for (float& v : w.weights) v = 0.25f * static_cast<float>(1 + rng() % 4);
  for (std::uint32_t tokens : {4 * (k - 37) + 2, 4 * k + 3, 4 * (3 * k) + 1}) w.requests.emplace_back().tokens = tokens;
  std::uint32_t next = 5;
  for (;;) {
    std::vector<std::size_t> open;
    for (std::size_t i = 0; i < w.requests.size(); ++i) {
      if (w.requests[i].entries() < w.requests[i].tokens / kTokensPerC4Entry) open.push_back(i);
    }
    if (open.empty()) break;
    C4Request& r = w.requests[open[rng() % open.size()]];
    const std::uint32_t chunk = std::min<std::uint32_t>(1 + rng() % 9, r.tokens / kTokensPerC4Entry - r.entries());
    for (std::uint32_t c = 0; c < chunk; ++c) r.addrs.push_back(next++);
  }
  for (C4Request& r : w.requests) {
    r.keys.resize(std::size_t{r.entries()} * dim);
    for (float& v : r.keys) v = static_cast<float>(static_cast<int>(rng() % 5) - 2);
    // The planted key: the one at the k boundary of the order (the middle when all are
    // selected), copied to 16 positions whose address parity alternates.
    std::vector<std::uint32_t> order;
    SelectTopK(C4Scores(w, r), r.entries(), order);
    const std::uint32_t planted = order[r.entries() > k ? k - 1 : r.entries() / 2];
    std::set<std::uint32_t> tie{planted};
    std::uint32_t j = static_cast<std::uint32_t>(rng() % (r.entries() / 4));
    std::uint32_t last_parity = r.addrs[j] % 2 + 1;  // none yet
    while (tie.size() < kTieGroup) {
      j = (j + 1 + static_cast<std::uint32_t>(rng() % (r.entries() / (2 * kTieGroup)))) % r.entries();
      if (tie.count(j) != 0 || r.addrs[j] % 2 == last_parity) continue;
      last_parity = r.addrs[j] % 2;
      tie.insert(j);
      std::copy_n(r.keys.begin() + std::size_t{planted} * dim, dim, r.keys.begin() + std::size_t{j} * dim);
    }
    r.tie.assign(tie.begin(), tie.end());
  }
  return w;
}

// The test data's own precondition: the tie group is in the top-k and out of it (more
// entries than k), members on both sides on both ranks of P = 2.
inline void ExpectC4TiesStraddle(const C4Workload& w, const C4Request& r) {
  const std::vector<float> s = C4Scores(w, r);
  const float tie_score = s[r.tie[0]];
  for (std::uint32_t p : r.tie) ASSERT_EQ(s[p], tie_score);
  std::uint32_t above = 0;
  for (float v : s) above += v > tie_score ? 1 : 0;
  if (r.entries() <= w.shape.top_k) return;
  const std::uint32_t inside = w.shape.top_k - above;  // the tie's lowest positions
  ASSERT_GE(inside, 2u);
  ASSERT_LE(inside + 2, kTieGroup);
  std::set<std::uint32_t> in_parity, out_parity;
  for (std::uint32_t i = 0; i < kTieGroup; ++i) (i < inside ? in_parity : out_parity).insert(r.addrs[r.tie[i]] % 2);
  ASSERT_EQ(in_parity.size(), 2u);
  ASSERT_EQ(out_parity.size(), 2u);
  std::printf("[ ties ] %u entries, k %u: %u strictly above, tie group of %u: %u in the top-k, %u out\n",
              r.entries(), w.shape.top_k, above, kTieGroup, inside, kTieGroup - inside);
}

// Rank `rank`'s keys of request r and their positions (a key lives where its entry does).
inline void C4LocalKeys(const C4Workload& w, const C4Request& r, std::uint32_t ranks, std::uint32_t rank,
             std::vector<float>& keys, std::vector<std::uint32_t>& positions) {
  keys.clear();
  positions.clear();
  const std::uint32_t dim = w.shape.head_dim;
  for (std::uint32_t j = 0; j < r.entries(); ++j) {
    if (r.addrs[j] % ranks != rank) continue;
    positions.push_back(j);
    keys.insert(keys.end(), r.keys.begin() + std::size_t{j} * dim, r.keys.begin() + std::size_t{j + 1} * dim);
  }
}

inline std::vector<std::uint32_t> C4SingleRankTopK(const C4Workload& w, const C4Request& r) {
  std::vector<std::uint32_t> want;
  SelectTopK(C4Scores(w, r), w.shape.top_k, want);
  EXPECT_EQ(want.size(), std::min(w.shape.top_k, r.entries()));
  return want;
}

}  // namespace ula::test
