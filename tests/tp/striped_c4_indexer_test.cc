// The striped indexer over DeepSeek-V4's C4 index keys (indexer/striped_indexer.h): a
// request of T tokens has floor(T / 4) C4 entries, each with one index key at the entry's
// logical address; under TP the keys live with their entries on rank (address mod P), each
// rank scores its own, and the merged per-rank candidates must be the single-rank
// SelectTopK exactly, order and ties included, at V4's shapes from the model configs
// (V4-Flash top-k 512, V4-Pro 1024).
//
// The workload: three requests whose C4 entries are interleaved in the address space in
// chunks (no request's addresses are contiguous): fewer entries than k, exactly k, and 3k.
// Each request's keys carry a planted tie group of 17 equal keys at positions whose address
// parity alternates (consecutive members on different ranks for every even P); where the
// request has more than k entries the group straddles the k boundary, members on both
// sides.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <random>
#include <set>
#include <thread>
#include <vector>

#include "config/model_config.h"
#include "indexer/striped_indexer.h"
#include "test_seed.h"
#include "tp/thread_fabric.h"

namespace ula {
namespace {

static_assert(sizeof(IndexCandidate) == 8, "the gather payload is k x 8 B per rank");

constexpr std::uint32_t kTokensPerC4Entry = 4;
constexpr std::uint32_t kTieGroup = 17;  // the planted key and 16 copies

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

IndexerShape ShapeOf(const char* model) {
  auto m = LoadModelConfigByName(model, DefaultConfigDir());
  EXPECT_TRUE(m) << m.error().ToString();
  EXPECT_TRUE(m->has_layer_kinds());
  return m->indexer_shape();
}

std::vector<float> Scores(const C4Workload& w, const C4Request& r) {
  std::vector<float> s(r.entries());
  for (std::uint32_t j = 0; j < r.entries(); ++j) {
    s[j] = IndexScore(w.shape, w.q(), r.keys.data() + std::size_t{j} * w.shape.head_dim);
  }
  return s;
}

// Requests of k - 37, k and 3k C4 entries (their tokens leave 2, 3 and 1 token filling),
// interleaved in chunks of 1..9 entries from address 5 on.
C4Workload MakeWorkload(const IndexerShape& shape, std::mt19937_64& rng) {
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
    SelectTopK(Scores(w, r), r.entries(), order);
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
void ExpectTiesStraddle(const C4Workload& w, const C4Request& r) {
  const std::vector<float> s = Scores(w, r);
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
void LocalOf(const C4Workload& w, const C4Request& r, std::uint32_t ranks, std::uint32_t rank,
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

std::vector<std::uint32_t> SingleRank(const C4Workload& w, const C4Request& r) {
  std::vector<std::uint32_t> want;
  SelectTopK(Scores(w, r), w.shape.top_k, want);
  EXPECT_EQ(want.size(), std::min(w.shape.top_k, r.entries()));
  return want;
}

TEST(StripedC4Indexer, ShapesComeFromTheModelConfigs) {
  const IndexerShape flash = ShapeOf("deepseek_v4_flash"), pro = ShapeOf("deepseek_v4_pro");
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
    const C4Workload w = MakeWorkload(ShapeOf(model), rng);
    const std::uint32_t k = w.shape.top_k;
    for (const C4Request& r : w.requests) {
      ASSERT_NO_FATAL_FAILURE(ExpectTiesStraddle(w, r));
      const std::vector<std::uint32_t> want = SingleRank(w, r);
      for (std::uint32_t ranks : {1u, 2u, 4u, 8u}) {
        std::vector<IndexCandidate> gathered;
        for (std::uint32_t rank = 0; rank < ranks; ++rank) {
          std::vector<float> keys;
          std::vector<std::uint32_t> positions;
          LocalOf(w, r, ranks, rank, keys, positions);
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
          LocalOf(w, w.requests[i], ranks, rank, keys, positions);
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
    const C4Workload w = MakeWorkload(ShapeOf(model), rng);
    std::vector<std::vector<std::uint32_t>> want;
    for (const C4Request& r : w.requests) {
      ASSERT_NO_FATAL_FAILURE(ExpectTiesStraddle(w, r));
      want.push_back(SingleRank(w, r));
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
  C4Workload w = MakeWorkload(ShapeOf("deepseek_v4_flash"), rng);
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
      ASSERT_EQ(SingleRank(w, w.requests[i]), lowest);
      for (std::uint32_t rank = 0; rank < ranks; ++rank) {
        ASSERT_EQ(got[rank][i], lowest) << "P " << ranks << " request " << i;
      }
    }
  }
}

TEST(StripedC4Indexer, BadInputIsRefusedAndChangesNothing) {
  const IndexerShape shape = ShapeOf("deepseek_v4_flash");
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
