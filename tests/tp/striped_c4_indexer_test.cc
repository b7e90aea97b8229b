// The striped indexer over DeepSeek-V4's C4 index keys (indexer/striped_indexer.h): the
// merged per-rank candidates must be the single-rank SelectTopK exactly, order and ties
// included, at V4's shapes from the model configs (V4-Flash top-k 512, V4-Pro 1024), over
// the workload of tp/c4_keys.h (interleaved requests of fewer than k, k and 3k C4 entries,
// planted ties straddling k and the ranks), P = 1, 2, 4, 8.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <random>
#include <set>
#include <thread>
#include <vector>

#include "indexer/striped_indexer.h"
#include "test_seed.h"
#include "tp/c4_keys.h"
#include "tp/thread_fabric.h"

namespace ula {
namespace {

using namespace ::ula::test;  // NOLINT: the C4 workload (tp/c4_keys.h)

TEST(StripedC4Indexer, ShapesComeFromTheModelConfigs) {
  const IndexerShape flash = IndexerShapeOfModel("deepseek_v4_flash"), pro = IndexerShapeOfModel("deepseek_v4_pro");
  EXPECT_EQ(flash.num_heads, 64u);
  EXPECT_EQ(flash.head_dim, 128u);
  EXPECT_EQ(flash.top_k, 512u);
  EXPECT_EQ(pro.num_heads, 64u);
  EXPECT_EQ(pro.head_dim, 128u);
  EXPECT_EQ(pro.top_k, 1024u);
}

// The pure functions: each rank's LocalCandidates (exactly min(k, its keys)), padded to k,
// concatenated in rank order, merged.
TEST(StripedC4Indexer, MergedCandidatesEqualSingleRankTopKWithPlantedTies) {
  ULA_TEST_SEEDED(seed, 20261206);
  std::mt19937_64 rng(seed);
  for (const char* model : {"deepseek_v4_flash", "deepseek_v4_pro"}) {
    const C4Workload w = MakeC4Workload(IndexerShapeOfModel(model), rng);
    const std::uint32_t k = w.shape.top_k;
    for (const C4Request& r : w.requests) {
      ASSERT_NO_FATAL_FAILURE(ExpectC4TiesStraddle(w, r));
      const std::vector<std::uint32_t> want = C4SingleRankTopK(w, r);
      for (std::uint32_t ranks : {1u, 2u, 4u, 8u}) {
        std::vector<IndexCandidate> gathered;
        for (std::uint32_t rank = 0; rank < ranks; ++rank) {
          std::vector<float> keys;
          std::vector<std::uint32_t> positions;
          C4LocalKeys(w, r, ranks, rank, keys, positions);
          std::vector<IndexCandidate> mine;
          ASSERT_TRUE(LocalCandidates(w.shape, w.q(), keys, positions, mine));
          ASSERT_EQ(mine.size(), std::min<std::size_t>(k, positions.size()));
          PadCandidates(mine, k);
          ASSERT_EQ(mine.size() * sizeof(IndexCandidate), std::size_t{k} * 8);
          gathered.insert(gathered.end(), mine.begin(), mine.end());
        }
        std::vector<std::uint32_t> got;
        MergeCandidates(gathered, k, got);
        ASSERT_EQ(got, want) << model << ": " << r.entries() << " C4 entries of " << r.tokens << " tokens, P " << ranks;
      }
    }
  }
}

// Runs StripedSelect on P threads over a ThreadFabric (the fabric's AllGather), one call per
// request per rank; results[rank][request].
std::vector<std::vector<std::vector<std::uint32_t>>> RunOnFabric(const C4Workload& w, std::uint32_t ranks) {
  testing::ThreadFabricHub hub(ranks);
  using PerRequest = std::vector<std::vector<std::uint32_t>>;
  std::vector<PerRequest> results(ranks, PerRequest(w.requests.size()));
  std::vector<char> ok(ranks, 1);
  {
    std::vector<std::jthread> threads;
    for (std::uint32_t rank = 0; rank < ranks; ++rank) {
      threads.emplace_back([&, rank] {
        testing::ThreadFabric fabric(hub, Rank(static_cast<std::uint16_t>(rank)));
        std::vector<float> keys;
        std::vector<std::uint32_t> positions;
        for (std::size_t i = 0; i < w.requests.size(); ++i) {
          C4LocalKeys(w, w.requests[i], ranks, rank, keys, positions);
          if (!StripedSelect(w.shape, w.q(), keys, positions, &fabric, results[rank][i])) ok[rank] = 0;
        }
      });
    }
  }
  for (std::uint32_t rank = 0; rank < ranks; ++rank) EXPECT_TRUE(ok[rank]) << "rank " << rank;
  return results;
}

TEST(StripedC4Indexer, StripedSelectOverAFabricOfPThreadsEqualsSingleRankTopK) {
  ULA_TEST_SEEDED(seed, 20261207);
  std::mt19937_64 rng(seed);
  for (const char* model : {"deepseek_v4_flash", "deepseek_v4_pro"}) {
    const C4Workload w = MakeC4Workload(IndexerShapeOfModel(model), rng);
    std::vector<std::vector<std::uint32_t>> want;
    for (const C4Request& r : w.requests) {
      ASSERT_NO_FATAL_FAILURE(ExpectC4TiesStraddle(w, r));
      want.push_back(C4SingleRankTopK(w, r));
    }
    for (std::uint32_t ranks : {1u, 2u, 4u, 8u}) {
      const auto got = RunOnFabric(w, ranks);
      for (std::uint32_t rank = 0; rank < ranks; ++rank) {
        for (std::size_t i = 0; i < w.requests.size(); ++i) {
          ASSERT_EQ(got[rank][i], want[i]) << model << ": request " << i << " (" << w.requests[i].entries()
                                           << " C4 entries), P " << ranks << ", rank " << rank;
        }
      }
    }
    std::printf("[ payload ] %s: k %u, %zu B per rank per query\n", model, w.shape.top_k,
                std::size_t{w.shape.top_k} * sizeof(IndexCandidate));
  }
}

// Every key equal: every score ties, so the top-k is the k lowest positions, wherever their
// keys live (a merge that broke ties by rank would take rank 0's first).
TEST(StripedC4Indexer, AllScoresEqualSelectTheLowestPositionsAcrossRanks) {
  ULA_TEST_SEEDED(seed, 20261208);
  std::mt19937_64 rng(seed);
  C4Workload w = MakeC4Workload(IndexerShapeOfModel("deepseek_v4_flash"), rng);
  for (C4Request& r : w.requests) {
    for (std::uint32_t j = 1; j < r.entries(); ++j) {
      std::copy_n(r.keys.begin(), w.shape.head_dim, r.keys.begin() + std::size_t{j} * w.shape.head_dim);
    }
  }
  for (std::uint32_t ranks : {2u, 8u}) {
    const auto got = RunOnFabric(w, ranks);
    for (std::size_t i = 0; i < w.requests.size(); ++i) {
      std::vector<std::uint32_t> lowest(std::min(w.shape.top_k, w.requests[i].entries()));
      for (std::uint32_t p = 0; p < lowest.size(); ++p) lowest[p] = p;
      ASSERT_EQ(C4SingleRankTopK(w, w.requests[i]), lowest);
      for (std::uint32_t rank = 0; rank < ranks; ++rank) {
        ASSERT_EQ(got[rank][i], lowest) << "P " << ranks << " request " << i;
      }
    }
  }
}

TEST(StripedC4Indexer, BadInputIsRefusedAndChangesNothing) {
  const IndexerShape shape = IndexerShapeOfModel("deepseek_v4_flash");
  const std::uint32_t dim = shape.head_dim;
  std::vector<float> query(std::size_t{shape.num_heads} * dim, 1.0f), weights(shape.num_heads, 0.5f);
  std::vector<float> keys(3 * dim, 1.0f);
  std::vector<std::uint32_t> positions{0, 4, 8};
  const std::vector<IndexCandidate> kept_candidates{{1.5f, 7}};
  const std::vector<std::uint32_t> kept_positions{42};
  const std::vector<float> short_keys(keys.begin(), keys.end() - 1), short_query(query.begin(), query.end() - 1);
  const std::vector<float> short_weights(weights.begin(), weights.end() - 1);
  const std::vector<std::uint32_t> reserved{0, IndexCandidate::kNoPosition, 8};
  IndexerShape no_k = shape;
  no_k.top_k = 0;
  struct Bad {
    const char* what;
    IndexerShape shape;
    std::span<const float> query, weights, keys;
    std::span<const std::uint32_t> positions;
    const char* message;
  } bad[] = {
      {"keys one value short", shape, query, weights, short_keys, positions, "key values"},
      {"query one value short", shape, short_query, weights, keys, positions, "query"},
      {"weights one short", shape, query, short_weights, keys, positions, "weights"},
      {"top_k 0", no_k, query, weights, keys, positions, "top_k"},
      {"a reserved position", shape, query, weights, keys, reserved, "reserved"},
  };
  for (const Bad& b : bad) {
    SCOPED_TRACE(b.what);
    std::vector<IndexCandidate> candidates = kept_candidates;
    Status s = LocalCandidates(b.shape, {b.query, b.weights}, b.keys, b.positions, candidates);
    ASSERT_FALSE(s);
    EXPECT_EQ(s.error().code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(s.error().message().find(b.message), std::string::npos) << s.error().message();
    EXPECT_EQ(candidates, kept_candidates);
    std::vector<std::uint32_t> out = kept_positions;
    s = StripedSelect(b.shape, {b.query, b.weights}, b.keys, b.positions, nullptr, out);
    ASSERT_FALSE(s);
    EXPECT_EQ(s.error().code(), ErrorCode::kInvalidArgument);
    EXPECT_EQ(out, kept_positions);
  }
  // Over the fabric: one rank's bad local keys (rank 2), or k = 0 on every rank; every rank
  // returns the error, none is left in the collective, no output changes.
  for (bool one_rank : {true, false}) {
    constexpr std::uint32_t kRanks = 4;
    testing::ThreadFabricHub hub(kRanks);
    std::vector<std::vector<std::uint32_t>> outs(kRanks, kept_positions);
    std::vector<Status> status(kRanks, Ok());
    {
      std::vector<std::jthread> threads;
      for (std::uint32_t rank = 0; rank < kRanks; ++rank) {
        threads.emplace_back([&, rank] {
          testing::ThreadFabric fabric(hub, Rank(static_cast<std::uint16_t>(rank)));
          const bool bad_keys = one_rank && rank == 2;
          status[rank] = StripedSelect(one_rank ? shape : no_k, {query, weights},
                                       bad_keys ? std::span<const float>(short_keys) : std::span<const float>(keys),
                                       positions, &fabric, outs[rank]);
        });
      }
    }
    for (std::uint32_t rank = 0; rank < kRanks; ++rank) {
      SCOPED_TRACE(::testing::Message() << (one_rank ? "rank 2's keys" : "k = 0") << ", rank " << rank);
      ASSERT_FALSE(status[rank]);
      EXPECT_EQ(status[rank].error().code(), ErrorCode::kInvalidArgument);
      const std::string m = status[rank].error().message();
      EXPECT_NE(m.find(one_rank ? (rank == 2 ? "key values" : "rank 2") : "top_k"), std::string::npos) << m;
      EXPECT_EQ(outs[rank], kept_positions);
    }
  }
  // The same input with the right sizes is taken (the refusals above are about the sizes).
  std::vector<std::uint32_t> out;
  ASSERT_TRUE(StripedSelect(shape, {query, weights}, keys, positions, nullptr, out));
  EXPECT_EQ(out, (std::vector<std::uint32_t>{0, 4, 8}));
}

}  // namespace
}  // namespace ula
