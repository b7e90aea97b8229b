#include "indexer/striped_indexer.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <random>

#include "test_seed.h"

namespace ula {
namespace {

// Keys from a tiny value set make many exact score ties; the striped merge must still
// equal the single-rank top-k, order included.
TEST(StripedIndexer, MergedTopKEqualsSingleRankTopKWithTies) {
  ULA_TEST_SEEDED(seed, 5150);
  std::mt19937_64 rng(seed);
  for (std::uint32_t ranks : {1u, 2u, 3u, 4u, 8u}) {
    for (int trial = 0; trial < 20; ++trial) {
      const IndexerShape shape{.num_heads = 2, .head_dim = 4, .top_k = 1 + static_cast<std::uint32_t>(rng() % 40)};
      const std::uint32_t n = 1 + static_cast<std::uint32_t>(rng() % 300);
      std::vector<float> keys(n * shape.head_dim), query(shape.num_heads * shape.head_dim), weights(shape.num_heads);
      for (float& v : keys) v = static_cast<float>(static_cast<int>(rng() % 3) - 1);
      for (float& v : query) v = static_cast<float>(static_cast<int>(rng() % 3));
      for (float& v : weights) v = 0.5f;
      const IndexQuery q{query, weights};
      std::vector<float> scores(n);
      for (std::uint32_t i = 0; i < n; ++i) scores[i] = IndexScore(shape, q, keys.data() + i * shape.head_dim);
      std::vector<std::uint32_t> want;
      SelectTopK(scores, shape.top_k, want);
      // Stripe by address home: position i's address is a permutation-ish value.
      std::vector<IndexCandidate> gathered;
      for (std::uint32_t r = 0; r < ranks; ++r) {
        std::vector<float> local_keys;
        std::vector<std::uint32_t> local_pos;
        for (std::uint32_t i = 0; i < n; ++i) {
          const std::uint32_t addr = i * 7 + 3;
          if (addr % ranks != r) continue;
          local_pos.push_back(i);
          local_keys.insert(local_keys.end(), keys.begin() + i * shape.head_dim, keys.begin() + (i + 1) * shape.head_dim);
        }
        std::vector<IndexCandidate> c;
        ASSERT_TRUE(LocalCandidates(shape, q, local_keys, local_pos, c));
        PadCandidates(c, shape.top_k);
        gathered.insert(gathered.end(), c.begin(), c.end());
      }
      std::vector<std::uint32_t> got;
      MergeCandidates(gathered, shape.top_k, got);
      ASSERT_EQ(got, want) << "ranks " << ranks << " trial " << trial;
    }
  }
}

TEST(StripedIndexer, BadSizesAreRefused) {
  const IndexerShape shape{.num_heads = 2, .head_dim = 4, .top_k = 4};
  std::vector<float> query(8), weights(2), keys(12);
  std::vector<std::uint32_t> pos{0, 1};
  std::vector<IndexCandidate> out;
  EXPECT_EQ(LocalCandidates(shape, {query, weights}, keys, pos, out).error().code(), ErrorCode::kInvalidArgument);
  std::vector<float> short_query(7);
  pos.push_back(2);
  EXPECT_EQ(LocalCandidates(shape, {short_query, weights}, keys, pos, out).error().code(), ErrorCode::kInvalidArgument);
  EXPECT_TRUE(LocalCandidates(shape, {query, weights}, keys, pos, out));
}

}  // namespace
}  // namespace ula
