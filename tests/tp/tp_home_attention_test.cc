// AttendAtHome: partial attention on every shard, records exchanged by head owner, merged
// in rank order — each rank's heads equal the reference attention over the whole selection.
#include "ula/tp_home_attention.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "tp/tp_fixture.h"
#include "test_seed.h"

namespace ula {
namespace {

using testing::SmallTpConfig;
using testing::TpFixture;

TEST(OwnedHeads, PartitionsTheHeadsContiguously) {
  for (std::uint32_t heads : {1u, 2u, 6u, 64u, 128u}) {
    for (std::uint32_t ranks : {1u, 2u, 3u, 4u, 8u}) {
      std::uint32_t next = 0, smallest = heads, largest = 0;
      for (std::uint32_t r = 0; r < ranks; ++r) {
        const HeadRange h = OwnedHeads(heads, ranks, Rank(static_cast<std::uint16_t>(r)));
        EXPECT_EQ(h.begin, next);
        next = h.end;
        smallest = std::min(smallest, h.count());
        largest = std::max(largest, h.count());
      }
      EXPECT_EQ(next, heads);
      EXPECT_LE(largest - smallest, 1u) << heads << " heads over " << ranks << " ranks";
    }
  }
}

// A TP space at home whose group entries hold two float32 layers of `shape`.
struct HomeCase {
  static constexpr std::uint32_t kLayers = 2;
  MlaShape shape{.num_heads = 5, .kv_lora_rank = 12, .rope_dim = 4, .softmax_scale = 0.25f};
  std::uint32_t ranks;
  TpFixture f;
  std::vector<LogicalAddr> addrs;
  std::map<std::uint32_t, std::vector<float>> values;  // address -> [layers][L + R]

  static TpConfig Config(std::uint32_t ranks, const MlaShape& shape) {
    TpConfig c = SmallTpConfig(ranks, 32, 64, 0, /*groups=*/1, kLayers * shape.entry_bytes());
    c.attention = TpAttention::kAtHome;
    return c;
  }
  explicit HomeCase(std::uint32_t p) : ranks(p), f(Config(p, shape)) {
    std::mt19937_64 rng(::ula::testing::TestSeed(0) + p);
    std::uniform_real_distribution<float> v(-1.0f, 1.0f);
    EXPECT_TRUE(f.space->AddRequest(RequestId(1)));
    f.requests.push_back(RequestId(1));
    addrs = f.space->Allocate(RequestId(1), 40 * p).value();
    for (LogicalAddr a : addrs) {
      auto& vals = values[a.value()];
      vals.resize(kLayers * shape.entry_bytes() / 4);
      for (float& x : vals) x = v(rng);
      EXPECT_TRUE(f.space->Write(a, GroupId(0), std::as_bytes(std::span(vals))));
    }
    f.space->AdvanceRound();
  }
  const std::byte* Bytes(LogicalAddr a, std::uint32_t layer) const {
    return reinterpret_cast<const std::byte*>(values.at(a.value()).data()) + layer * shape.entry_bytes();
  }
};

TEST(AttendAtHome, EveryRanksHeadsEqualTheReferenceAndOnlyOwnHeadsAreSent) {
  ULA_TEST_SEEDED(seed, 7);
  for (std::uint32_t p : {1u, 2u, 3u, 4u, 8u}) {
    HomeCase c(p);
    std::mt19937_64 rng(seed + p);
    // Three queries with selections of different lengths (one with a duplicate).
    std::vector<LogicalAddr> sel;
    std::vector<std::size_t> bounds{0};
    for (std::size_t len : {7u, 1u, 20u}) {
      for (std::size_t i = 0; i < len; ++i) sel.push_back(c.addrs[rng() % c.addrs.size()]);
      if (len > 2) sel.push_back(sel[bounds.back()]);
      bounds.push_back(sel.size());
    }
    const std::size_t n_queries = bounds.size() - 1, qv = c.shape.query_values();
    std::vector<float> queries(n_queries * qv);
    std::uniform_real_distribution<float> v(-1.0f, 1.0f);
    for (float& x : queries) x = v(rng);
    auto plan = c.f.planner.Step(GroupId(0), sel, testing::TpRuns(RequestId(1), sel.size())).value();
    for (std::uint32_t layer = 0; layer < HomeCase::kLayers; ++layer) {
      auto att = AttendAtHome(*c.f.space, plan, GroupId(0), c.shape, queries, bounds, nullptr,
                              layer * c.shape.entry_bytes());
      ASSERT_TRUE(att) << att.error().ToString();
      ASSERT_EQ(att->ranks.size(), p);
      EXPECT_EQ(att->entries_read, sel.size());  // every selection read once, on its home
      std::uint64_t sent = 0;
      for (std::uint32_t r = 0; r < p; ++r) {
        sent += std::uint64_t{c.shape.num_heads - att->heads[r].count()} * (c.shape.kv_lora_rank + 2) * 4 * n_queries;
      }
      EXPECT_EQ(att->bytes_sent, sent);
      std::vector<float> want(c.shape.output_values());
      for (std::size_t j = 0; j < n_queries; ++j) {
        std::vector<const std::byte*> entries;
        for (std::size_t i = bounds[j]; i < bounds[j + 1]; ++i) entries.push_back(c.Bytes(sel[i], layer));
        ASSERT_TRUE(SparseMlaAttention(c.shape, std::span(queries).subspan(j * qv, qv), entries, want));
        for (std::size_t h = 0; h < p; ++h) {
          const HeadRange heads = att->heads[h];
          ASSERT_EQ(heads, OwnedHeads(c.shape.num_heads, p, att->ranks[h]));
          for (std::uint32_t k = 0; k < heads.count(); ++k) {
            for (std::uint32_t d = 0; d < c.shape.kv_lora_rank; ++d) {
              const float got = att->outputs[h][(j * heads.count() + k) * c.shape.kv_lora_rank + d];
              const float ref = want[(heads.begin + k) * c.shape.kv_lora_rank + d];
              ASSERT_LE(std::abs(got - ref), 1e-5f * (1.0f + std::abs(ref)))
                  << p << " ranks, layer " << layer << ", query " << j << ", head " << heads.begin + k;
            }
          }
        }
      }
    }
    EXPECT_TRUE(c.f.space->CheckInvariants());
  }
}

TEST(AttendAtHome, BadInputIsRefused) {
  HomeCase c(4);
  std::vector<LogicalAddr> sel(c.addrs.begin(), c.addrs.begin() + 10);
  auto plan = c.f.planner.Step(GroupId(0), sel, testing::TpRuns(RequestId(1), sel.size())).value();
  const std::size_t qv = c.shape.query_values();
  std::vector<float> queries(2 * qv, 0.5f);
  const std::vector<std::size_t> bounds{0, 4, 10};
  ASSERT_TRUE(AttendAtHome(*c.f.space, plan, GroupId(0), c.shape, queries, bounds));
  auto code = [&](auto r) { return r.error().code(); };
  EXPECT_EQ(code(AttendAtHome(*c.f.space, plan, GroupId(1), c.shape, queries, bounds)), ErrorCode::kInvalidArgument);
  const std::vector<std::size_t> empty_query{0, 4, 4, 10};
  std::vector<float> three(3 * qv, 0.5f);
  EXPECT_EQ(code(AttendAtHome(*c.f.space, plan, GroupId(0), c.shape, three, empty_query)), ErrorCode::kInvalidArgument);
  const std::vector<std::size_t> short_bounds{0, 4, 9};
  EXPECT_EQ(code(AttendAtHome(*c.f.space, plan, GroupId(0), c.shape, queries, short_bounds)),
            ErrorCode::kInvalidArgument);
  EXPECT_EQ(code(AttendAtHome(*c.f.space, plan, GroupId(0), c.shape, std::span(queries).subspan(1), bounds)),
            ErrorCode::kInvalidArgument);
  EXPECT_EQ(code(AttendAtHome(*c.f.space, plan, GroupId(0), c.shape, queries, bounds, nullptr,
                              HomeCase::kLayers * c.shape.entry_bytes() - 4)),
            ErrorCode::kInvalidArgument);  // the layer would overrun the entry
  TpStepPlan other = plan;
  other.ranks.pop_back();
  other.refs.pop_back();
  EXPECT_EQ(code(AttendAtHome(*c.f.space, other, GroupId(0), c.shape, queries, bounds)), ErrorCode::kFailedPrecondition);
  // A space with local buffers has no partial attention at home.
  TpFixture buffered(SmallTpConfig(2, 8, 8, 8));
  auto a = buffered.AddFilled(RequestId(1), 8);
  auto bplan = buffered.planner.Step(GroupId(0), std::span(a).first(4), testing::TpRuns(RequestId(1), 4)).value();
  MlaShape tiny{.num_heads = 1, .kv_lora_rank = 4, .rope_dim = 4, .softmax_scale = 1.0f};
  std::vector<float> q(tiny.query_values(), 0.0f);
  const std::vector<std::size_t> b4{0, 4};
  EXPECT_EQ(code(AttendAtHome(*buffered.space, bplan, GroupId(0), tiny, q, b4)), ErrorCode::kFailedPrecondition);
  EXPECT_TRUE(c.f.space->CheckInvariants());
}

}  // namespace
}  // namespace ula
