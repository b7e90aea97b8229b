// The CPU lightning indexer: scores follow the documented formula, top-k equals a
// brute-force full sort under the documented tie order, and the speculative union keeps
// first appearances.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <numeric>
#include <random>

#include "indexer/indexer.h"
#include "test_seed.h"

namespace ula {
namespace {

// ULA_TEST_SEED replaces it (tests/test_seed.h); printed when the test program starts.
const std::uint64_t kSeed = ::ula::testing::TestSeed(20250901);

std::vector<float> RandomVector(std::mt19937_64& rng, std::size_t n, float lo = -1, float hi = 1) {
  std::uniform_real_distribution<float> u(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = u(rng);
  return v;
}

std::vector<std::uint32_t> BruteForceTopK(const std::vector<float>& scores, std::uint32_t k) {
  std::vector<std::uint32_t> all(scores.size());
  std::iota(all.begin(), all.end(), 0u);
  std::stable_sort(all.begin(), all.end(), [&](std::uint32_t a, std::uint32_t b) { return scores[a] > scores[b]; });
  all.resize(std::min<std::size_t>(k, all.size()));
  return all;
}

TEST(Indexer, ScoreIsWeightedSumOfReluDots) {
  const IndexerShape shape{2, 3, 1};
  const std::vector<float> q = {1, 2, 3, -1, -1, -1};
  const std::vector<float> w = {0.5f, 2.0f};
  const float key[3] = {1, 1, 1};
  // head 0: dot 6 -> 0.5 * 6; head 1: dot -3 -> ReLU 0.
  EXPECT_EQ(IndexScore(shape, {q, w}, key), 3.0f);
}

TEST(Indexer, TopKMatchesBruteForceSortIncludingTies) {
  std::printf("seed %llu\n", static_cast<unsigned long long>(kSeed));
  std::mt19937_64 rng(kSeed);
  for (int trial = 0; trial < 50; ++trial) {
    const std::uint32_t n = 1 + static_cast<std::uint32_t>(rng() % 3000);
    const std::uint32_t k = 1 + static_cast<std::uint32_t>(rng() % 600);
    // Quantized scores: many ties, so the tie order is exercised.
    std::vector<float> scores(n);
    for (float& s : scores) s = static_cast<float>(rng() % 50) * 0.25f;
    std::vector<std::uint32_t> got;
    SelectTopK(scores, k, got);
    EXPECT_EQ(got, BruteForceTopK(scores, k)) << "trial " << trial << " n " << n << " k " << k;
  }
}

TEST(Indexer, TieOrderIsHigherScoreThenLowerPosition) {
  const std::vector<float> scores = {1, 3, 3, 2, 3};
  std::vector<std::uint32_t> got;
  SelectTopK(scores, 4, got);
  EXPECT_EQ(got, (std::vector<std::uint32_t>{1, 2, 4, 3}));
  SelectTopK(scores, 10, got);  // k > n returns all n
  EXPECT_EQ(got, (std::vector<std::uint32_t>{1, 2, 4, 3, 0}));
}

TEST(Indexer, SelectEqualsScoreThenBruteForce) {
  std::mt19937_64 rng(kSeed + 1);
  const IndexerShape shape{4, 16, 64};
  auto indexer = Indexer::Create(shape);
  ASSERT_TRUE(indexer);
  const auto keys = RandomVector(rng, 2000 * 16);
  const auto q = RandomVector(rng, 4 * 16);
  const auto w = RandomVector(rng, 4, 0, 1);
  std::vector<float> scores;
  ASSERT_TRUE(indexer->Score({q, w}, keys, scores));
  std::vector<std::uint32_t> got;
  ASSERT_TRUE(indexer->Select({q, w}, keys, got));
  EXPECT_EQ(got, BruteForceTopK(scores, 64));
}

TEST(Indexer, SpeculativeUnionKeepsFirstAppearance) {
  std::mt19937_64 rng(kSeed + 2);
  const IndexerShape shape{4, 16, 100};
  auto indexer = Indexer::Create(shape);
  ASSERT_TRUE(indexer);
  const auto keys = RandomVector(rng, 1500 * 16);
  std::vector<std::vector<float>> qs;
  for (int i = 0; i < 3; ++i) qs.push_back(RandomVector(rng, 4 * 16));
  const auto w = RandomVector(rng, 4, 0, 1);
  std::vector<IndexQuery> queries;
  for (const auto& q : qs) queries.push_back({q, w});
  std::vector<std::vector<std::uint32_t>> per_query;
  std::vector<std::uint32_t> uni;
  ASSERT_TRUE(indexer->SelectUnion(queries, keys, per_query, uni));
  ASSERT_EQ(per_query.size(), 3u);
  // Expected: query 0's list, then unseen positions of query 1, then of query 2.
  std::vector<std::uint32_t> expected;
  for (const auto& list : per_query) {
    EXPECT_EQ(list.size(), 100u);
    for (std::uint32_t p : list) {
      if (std::find(expected.begin(), expected.end(), p) == expected.end()) expected.push_back(p);
    }
  }
  EXPECT_EQ(uni, expected);
  EXPECT_GE(uni.size(), 100u);
  EXPECT_LE(uni.size(), 300u);
}

TEST(Indexer, RejectsBadShapesAndSizes) {
  EXPECT_FALSE(Indexer::Create({0, 16, 4}));
  EXPECT_FALSE(Indexer::Create({4, 0, 4}));
  EXPECT_FALSE(Indexer::Create({4, 16, 0}));
  auto indexer = Indexer::Create({2, 4, 2});
  ASSERT_TRUE(indexer);
  std::vector<float> q(8), w(2), keys(12), bad_keys(13);
  std::vector<std::uint32_t> out;
  EXPECT_TRUE(indexer->Select({q, w}, keys, out));
  EXPECT_FALSE(indexer->Select({std::span<const float>(q).first(7), w}, keys, out));
  EXPECT_FALSE(indexer->Select({q, std::span<const float>(w).first(1)}, keys, out));
  EXPECT_FALSE(indexer->Select({q, w}, bad_keys, out));
}

}  // namespace
}  // namespace ula
