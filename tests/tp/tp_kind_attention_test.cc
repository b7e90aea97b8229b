// Attention at home per layer kind over a TP space with DeepSeek-V4-Flash's kinds
// (AttendKindsAtHome, include/ula/tp_home_attention.h; docs/ARCHITECTURE.md "Kinds under TP"):
// on a CSA layer each rank's partial covers its own selected C4 entries, on an HCA layer its
// own C128 stripe, and the request's window joins the partial of its window home alone (a
// window-only layer: the home alone); the partials merge in rank order. At P = 2 and 4 every
// owned head equals the single-rank dense reference over the same entries (SparseMlaAttention,
// the tolerance of AttendAtHome's test), and equals bit for bit the per-rank partials of the
// documented entries merged in rank order; the window's rows are read on its home alone.
// Bad input is refused with nothing changed.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <map>
#include <random>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "test_seed.h"
#include "tp/tp_fixture.h"
#include "v4_flash.h"
#include "ula/backend.h"
#include "ula/tp_home_attention.h"

namespace ula {
namespace {

constexpr std::uint32_t kDrafts = 3;
constexpr std::uint32_t kTopK = 16;
// One float32 MLA layer inside V4-Flash's 584-byte C4 row: 4 x (128 + 16) = 576 B.
constexpr MlaShape kShape{.num_heads = 6, .kv_lora_rank = 128, .rope_dim = 16, .softmax_scale = 0.1f};
constexpr std::uint32_t kWidth = kShape.kv_lora_rank + kShape.rope_dim;

TpConfig FlashTpConfig(std::uint32_t ranks) {
  return test::FlashTpConfig(ranks, 64, 2048, kDrafts);
}

std::uint32_t KindNamed(const TpConfig& c, const std::string& name) {
  for (std::uint32_t k = 0; k < c.kinds.size(); ++k) {
    if (c.kinds[k].name == name) return k;
  }
  ADD_FAILURE() << "no kind " << name;
  return 0;
}

// A layer's input without C4 (a CSA layer sets plan, group and bounds too).
KindLayerInput Input(KindLayer layer, std::span<const RequestId> requests) {
  KindLayerInput in;
  in.layer = layer;
  in.requests = requests;
  return in;
}

const std::byte* AsBytes(const std::vector<float>& v) { return reinterpret_cast<const std::byte*>(v.data()); }

// A V4-Flash TP space with requests of several lengths, the bytes of every entry attention
// reads: C4 entries in the space (group 0's layer), the window and C128 rows in the
// engine's store, indexed as KindPagesOf names them on each rank.
struct KindCase {
  std::uint32_t p;
  std::unique_ptr<Backend> backend = MakeCpuBackend({.copy_threads = 1});
  std::unique_ptr<TpAddressSpace> space;
  std::uint32_t window = 0, c128 = 0, window_tokens = 0;
  std::vector<RequestId> requests;
  std::vector<std::uint32_t> tokens;
  std::map<std::uint32_t, std::vector<float>> c4;                               // address -> row
  std::map<std::pair<std::uint64_t, std::uint32_t>, std::vector<float>> wrows;  // (request, token) -> row
  std::map<std::pair<std::uint64_t, std::uint32_t>, std::vector<float>> crows;  // (request, C128 entry) -> row
  // The engine's store: (rank, kind, block, row) -> the row it holds there.
  std::map<std::tuple<std::uint32_t, std::uint32_t, std::uint32_t, std::uint32_t>, const std::vector<float>*> store;
  std::set<std::tuple<std::uint32_t, std::uint32_t, std::uint64_t>> asked;  // (rank, kind, block << 8 | row)

  KindCase(std::uint32_t ranks, std::mt19937_64& rng, std::vector<std::uint32_t> lengths = {700, 1000, 90})
      : p(ranks) {
    auto s = TpAddressSpace::Create(FlashTpConfig(ranks), *backend);
    EXPECT_TRUE(s) << s.error().ToString();
    space = std::move(*s);
    const TpConfig& c = space->config();
    window = KindNamed(c, "window");
    c128 = KindNamed(c, "c128");
    window_tokens = c.kinds[window].ring_tokens - c.kinds[window].ring_draft_tokens;
    std::uniform_real_distribution<float> v(-1.0f, 1.0f);
    auto row = [&] {
      std::vector<float> r(kWidth);
      for (float& x : r) x = v(rng);
      return r;
    };
    for (const std::uint32_t t : lengths) {  // the default's last: a window shorter than 128 tokens
      const RequestId id(static_cast<std::uint64_t>(requests.size() + 1));
      EXPECT_TRUE(space->AddRequest(id));
      auto addrs = space->Allocate(id, t);
      EXPECT_TRUE(addrs) << addrs.error().ToString();
      for (LogicalAddr a : *addrs) {
        c4[a.value()] = row();
        std::vector<std::byte> bytes(c.entry_bytes);
        std::memcpy(bytes.data(), c4[a.value()].data(), kShape.entry_bytes());
        EXPECT_TRUE(space->Write(a, GroupId(0), bytes));
      }
      for (std::uint32_t k = 0; k < t; ++k) wrows[{id.value(), k}] = row();
      for (std::uint32_t j = 0; j < t / 128; ++j) crows[{id.value(), j}] = row();
      requests.push_back(id);
      tokens.push_back(t);
    }
    space->AdvanceRound();
    // The engine's store, as its kernels index each kind on each rank.
    for (std::size_t b = 0; b < requests.size(); ++b) {
      const std::uint64_t id = requests[b].value();
      for (std::uint32_t r = 0; r < p; ++r) {
        const Rank rank(static_cast<std::uint16_t>(r));
        const KindPages w = space->KindPagesOf(requests[b], window, rank).value();
        for (std::uint32_t i = 0; i < w.entries; ++i) {  // ring entry i: token T - entries + i
          const std::uint32_t pos = w.first_offset + i;
          store[{r, window, w.blocks[pos / w.entries_per_block], pos % w.entries_per_block}] =
              &wrows.at({id, w.tokens - w.entries + i});
        }
        const KindPages h = space->KindPagesOf(requests[b], c128, rank).value();
        for (std::uint32_t i = 0; i < h.entries; ++i) {  // local entry i: entry i * P + r
          store[{r, c128, h.blocks[i / h.entries_per_block], i % h.entries_per_block}] = &crows.at({id, i * p + r});
        }
      }
    }
  }
  KindRowBytes Rows() {
    return [this](Rank rank, std::uint32_t kind, std::uint32_t block, std::uint32_t row) -> const std::byte* {
      asked.insert({rank.value(), kind, (std::uint64_t{block} << 8) | row});
      auto it = store.find({rank.value(), kind, block, row});
      return it == store.end() ? nullptr : AsBytes(*it->second);
    };
  }
  std::uint32_t Home(std::size_t b) const { return space->WindowHomeOf(requests[b]).value().value(); }
  // The window query b reads: its last min(window, ring) tokens, oldest first.
  std::vector<const std::byte*> Window(std::size_t b) const {
    const KindPages w = space->KindPagesOf(requests[b], window, Rank(static_cast<std::uint16_t>(Home(b)))).value();
    std::vector<const std::byte*> out;
    const std::uint32_t n = std::min(window_tokens, w.entries);
    for (std::uint32_t t = tokens[b] - n; t < tokens[b]; ++t) {
      out.push_back(AsBytes(wrows.at({requests[b].value(), t})));
    }
    return out;
  }
};

// Checks every hosted rank's owned heads against the dense reference over all[j] (within
// AttendAtHome's tolerance) and, bit for bit, against the per-rank parts mine[r][j] merged
// in rank order.
void ExpectMerged(const TpHomeAttention& att, std::uint32_t p, const std::vector<float>& queries,
                  const std::vector<std::vector<const std::byte*>>& all,
                  const std::vector<std::vector<std::vector<const std::byte*>>>& mine, const std::string& what) {
  SCOPED_TRACE(what);
  const std::size_t qv = kShape.query_values(), pv = PartialValues(kShape), rec = kShape.kv_lora_rank + 2;
  const MlaShape one{.num_heads = 1, .kv_lora_rank = kShape.kv_lora_rank, .rope_dim = kShape.rope_dim,
                     .softmax_scale = kShape.softmax_scale};
  ASSERT_EQ(att.ranks.size(), p);
  for (std::size_t j = 0; j < all.size(); ++j) {
    const auto q = std::span(queries).subspan(j * qv, qv);
    std::vector<float> want(kShape.output_values());
    ASSERT_TRUE(SparseMlaAttention(kShape, q, all[j], want));
    std::vector<float> parts(std::size_t{p} * pv);
    for (std::uint32_t r = 0; r < p; ++r) {
      ASSERT_TRUE(PartialMlaAttention(kShape, q, mine[r][j], std::span(parts).subspan(r * pv, pv)));
    }
    for (std::uint32_t h = 0; h < p; ++h) {
      const HeadRange heads = att.heads[h];
      for (std::uint32_t k = 0; k < heads.count(); ++k) {
        std::vector<float> per_head(std::size_t{p} * rec), merged(kShape.kv_lora_rank);
        for (std::uint32_t r = 0; r < p; ++r) {
          std::copy_n(parts.begin() + std::ptrdiff_t(r * pv + (heads.begin + k) * rec), rec,
                      per_head.begin() + std::ptrdiff_t(r * rec));
        }
        ASSERT_TRUE(MergeMlaPartials(one, per_head, merged));
        const float* got = att.outputs[h].data() + (j * heads.count() + k) * kShape.kv_lora_rank;
        EXPECT_EQ(std::memcmp(got, merged.data(), merged.size() * sizeof(float)), 0)
            << "query " << j << " head " << heads.begin + k << ": not the rank-order merge of the ranks' parts";
        for (std::uint32_t d = 0; d < kShape.kv_lora_rank; ++d) {
          const float ref = want[(heads.begin + k) * kShape.kv_lora_rank + d];
          ASSERT_LE(std::abs(got[d] - ref), 1e-5f * (1.0f + std::abs(ref)))
              << "query " << j << ", head " << heads.begin + k << ", dim " << d;
        }
      }
    }
  }
}

TEST(TpKindAttention, EachLayerKindMergesTheRanksPartsInRankOrderWithTheWindowAtHome) {
  ULA_TEST_SEEDED(seed, 20261206);
  for (const std::uint32_t p : {2u, 4u}) {
    SCOPED_TRACE("P = " + std::to_string(p));
    std::mt19937_64 rng(seed + p);
    KindCase c(p, rng);
    const std::size_t n = c.requests.size(), qv = kShape.query_values();
    std::vector<float> queries(n * qv);
    std::uniform_real_distribution<float> v(-1.0f, 1.0f);
    for (float& x : queries) x = v(rng);
    // CSA: the indexer's top-k of each request's C4 entries through the step (group 0).
    std::vector<LogicalAddr> sel;
    std::vector<SelectionRun> runs;
    std::vector<std::size_t> bounds{0};
    for (std::size_t b = 0; b < n; ++b) {
      auto list = c.space->AddressesOf(c.requests[b]).value();
      std::vector<LogicalAddr> pool(list.begin(), list.end());
      const std::size_t k = std::min<std::size_t>(kTopK, pool.size());
      for (std::size_t i = 0; i < k; ++i) std::swap(pool[i], pool[i + rng() % (pool.size() - i)]);
      sel.insert(sel.end(), pool.begin(), pool.begin() + std::ptrdiff_t(k));
      runs.push_back({c.requests[b], static_cast<std::uint32_t>(k)});
      bounds.push_back(sel.size());
    }
    TpStepPlanner planner(*c.space);
    auto plan = planner.Step(GroupId(0), sel, runs);
    ASSERT_TRUE(plan) << plan.error().ToString();
    const std::uint64_t digest = c.space->DebugDigest();

    for (const KindLayer layer : {KindLayer::kCsa, KindLayer::kHca, KindLayer::kWindowOnly}) {
      const std::string name = layer == KindLayer::kCsa ? "CSA" : layer == KindLayer::kHca ? "HCA" : "window-only";
      // What each rank reads, in the documented order, and the union.
      std::vector<std::vector<const std::byte*>> all(n);
      std::vector<std::vector<std::vector<const std::byte*>>> mine(p, std::vector<std::vector<const std::byte*>>(n));
      std::uint64_t reads = 0;
      for (std::size_t b = 0; b < n; ++b) {
        for (std::uint32_t r = 0; r < p; ++r) {
          if (layer == KindLayer::kCsa) {
            for (std::size_t i = bounds[b]; i < bounds[b + 1]; ++i) {
              if (sel[i].value() % p == r) mine[r][b].push_back(AsBytes(c.c4.at(sel[i].value())));
            }
          } else if (layer == KindLayer::kHca) {
            for (std::uint32_t j = r; j < c.tokens[b] / 128; j += p) {
              mine[r][b].push_back(AsBytes(c.crows.at({c.requests[b].value(), j})));
            }
          }
          if (r == c.Home(b)) {
            for (const std::byte* w : c.Window(b)) mine[r][b].push_back(w);
          }
          reads += mine[r][b].size();
        }
        if (layer == KindLayer::kCsa) {
          for (std::size_t i = bounds[b]; i < bounds[b + 1]; ++i) all[b].push_back(AsBytes(c.c4.at(sel[i].value())));
        } else if (layer == KindLayer::kHca) {
          for (std::uint32_t j = 0; j < c.tokens[b] / 128; ++j) {
            all[b].push_back(AsBytes(c.crows.at({c.requests[b].value(), j})));
          }
        }
        for (const std::byte* w : c.Window(b)) all[b].push_back(w);
      }
      KindLayerInput in = Input(layer, c.requests);
      if (layer == KindLayer::kCsa) {
        in.plan = &*plan;
        in.group = GroupId(0);
        in.bounds = bounds;
      }
      c.asked.clear();
      auto att = AttendKindsAtHome(*c.space, in, kShape, queries, c.Rows());
      ASSERT_TRUE(att) << name << ": " << att.error().ToString();
      EXPECT_EQ(att->entries_read, reads) << name << ": every entry read once, where it lives";
      for (const auto& [rank, kind, where] : c.asked) {  // the window's rows asked of its homes only
        EXPECT_TRUE(layer == KindLayer::kHca || kind != c.c128) << name << ": a C128 row read on a layer without C128";
        if (kind != c.window) continue;
        bool a_home = false;
        for (std::size_t b = 0; b < n; ++b) a_home = a_home || rank == c.Home(b);
        EXPECT_TRUE(a_home) << name << ": a window row read on rank " << rank << ", no request's window home";
      }
      ExpectMerged(*att, p, queries, all, mine, name);
      EXPECT_EQ(c.space->DebugDigest(), digest) << name << ": attention changed the space";
    }
    ASSERT_TRUE(c.space->CheckInvariants());
  }
}

// MTP: a request's q_len = 1 + kDrafts queries at its last tokens, each reading the window up to
// its own token, the C128 entries complete by it and its own causal selection. The request of
// 1,024 tokens has its eighth C128 entry completed by the last draft alone.
TEST(TpKindAttention, DraftQueriesReadTheWindowAndC128UpToTheirOwnToken) {
  ULA_TEST_SEEDED(seed, 20261207);
  for (const std::uint32_t p : {2u, 4u}) {
    SCOPED_TRACE("P = " + std::to_string(p));
    std::mt19937_64 rng(seed + p);
    KindCase c(p, rng, {1024, 700, 90});
    const std::uint32_t w = c.window_tokens;
    // The queries: request b's tokens T - 1 - kDrafts .. T - 1, in order.
    std::vector<RequestId> qreq;
    std::vector<std::uint32_t> qpos;
    std::vector<std::size_t> qb;  // the query's request index
    for (std::size_t b = 0; b < c.requests.size(); ++b) {
      for (std::uint32_t d = 0; d <= kDrafts; ++d) {
        qreq.push_back(c.requests[b]);
        qpos.push_back(c.tokens[b] - 1 - kDrafts + d);
        qb.push_back(b);
      }
    }
    const std::size_t n = qreq.size(), qv = kShape.query_values();
    std::vector<float> queries(n * qv);
    std::uniform_real_distribution<float> v(-1.0f, 1.0f);
    for (float& x : queries) x = v(rng);
    // Each query's causal top-k (6 here: the step brings every query's selections to the
    // homes' device pools of 64 at once): C4 entries complete by its token.
    std::vector<LogicalAddr> sel;
    std::vector<SelectionRun> runs;
    std::vector<std::size_t> bounds{0};
    for (std::size_t j = 0; j < n; ++j) {
      auto list = c.space->AddressesOf(qreq[j]).value();
      std::vector<LogicalAddr> pool(list.begin(), list.begin() + (qpos[j] + 1) / 4);
      const std::size_t k = std::min<std::size_t>(6, pool.size());
      for (std::size_t i = 0; i < k; ++i) std::swap(pool[i], pool[i + rng() % (pool.size() - i)]);
      sel.insert(sel.end(), pool.begin(), pool.begin() + std::ptrdiff_t(k));
      runs.push_back({qreq[j], static_cast<std::uint32_t>(k)});
      bounds.push_back(sel.size());
    }
    TpStepPlanner planner(*c.space);
    auto plan = planner.Step(GroupId(0), sel, runs);
    ASSERT_TRUE(plan) << plan.error().ToString();
    const std::uint64_t digest = c.space->DebugDigest();
    std::uint64_t c128_last_draft_only = 0;
    for (const KindLayer layer : {KindLayer::kCsa, KindLayer::kHca, KindLayer::kWindowOnly}) {
      const std::string name = layer == KindLayer::kCsa ? "CSA" : layer == KindLayer::kHca ? "HCA" : "window-only";
      std::vector<std::vector<const std::byte*>> all(n);
      std::vector<std::vector<std::vector<const std::byte*>>> mine(p, std::vector<std::vector<const std::byte*>>(n));
      std::uint64_t reads = 0;
      for (std::size_t j = 0; j < n; ++j) {
        const std::size_t b = qb[j];
        const std::uint64_t id = c.requests[b].value();
        const std::uint32_t upto = qpos[j] + 1, complete = upto / 128;
        std::vector<const std::byte*> window;
        for (std::uint32_t t = upto - std::min(w, upto); t < upto; ++t) window.push_back(AsBytes(c.wrows.at({id, t})));
        for (std::uint32_t r = 0; r < p; ++r) {
          if (layer == KindLayer::kCsa) {
            for (std::size_t i = bounds[j]; i < bounds[j + 1]; ++i) {
              if (sel[i].value() % p == r) mine[r][j].push_back(AsBytes(c.c4.at(sel[i].value())));
            }
          } else if (layer == KindLayer::kHca) {
            for (std::uint32_t e = r; e < complete; e += p) mine[r][j].push_back(AsBytes(c.crows.at({id, e})));
          }
          if (r == c.Home(b)) mine[r][j].insert(mine[r][j].end(), window.begin(), window.end());
          reads += mine[r][j].size();
        }
        if (layer == KindLayer::kCsa) {
          for (std::size_t i = bounds[j]; i < bounds[j + 1]; ++i) all[j].push_back(AsBytes(c.c4.at(sel[i].value())));
        } else if (layer == KindLayer::kHca) {
          for (std::uint32_t e = 0; e < complete; ++e) all[j].push_back(AsBytes(c.crows.at({id, e})));
          if (complete > (upto - 1) / 128) c128_last_draft_only += upto == c.tokens[b];
        }
        all[j].insert(all[j].end(), window.begin(), window.end());
      }
      KindLayerInput in = Input(layer, qreq);
      in.positions = qpos;
      if (layer == KindLayer::kCsa) {
        in.plan = &*plan;
        in.group = GroupId(0);
        in.bounds = bounds;
      }
      auto att = AttendKindsAtHome(*c.space, in, kShape, queries, c.Rows());
      ASSERT_TRUE(att) << name << ": " << att.error().ToString();
      EXPECT_EQ(att->entries_read, reads) << name << ": every entry read once, up to its query's token";
      ExpectMerged(*att, p, queries, all, mine, name);
      EXPECT_EQ(c.space->DebugDigest(), digest) << name << ": attention changed the space";
    }
    EXPECT_EQ(c128_last_draft_only, 1u) << "the 1,024-token request's last draft completes a C128 entry";
  }
}

TEST(TpKindAttention, BadInputIsRefusedWithNothingChanged) {
  ULA_TEST_SEEDED(seed, 20261206);
  std::mt19937_64 rng(seed);
  KindCase c(2, rng);
  const std::uint64_t digest = c.space->DebugDigest();
  std::vector<float> queries(c.requests.size() * kShape.query_values(), 0.25f);
  const KindLayerInput hca = Input(KindLayer::kHca, c.requests);
  ASSERT_TRUE(AttendKindsAtHome(*c.space, hca, kShape, queries, c.Rows()));
  // The refusal's code (kInternal stands for no refusal: none of these may succeed).
  auto code = [](const Result<TpHomeAttention>& r) { return r ? ErrorCode::kInternal : r.error().code(); };
  // A CSA layer without its plan; an HCA layer with bounds.
  EXPECT_EQ(code(AttendKindsAtHome(*c.space, Input(KindLayer::kCsa, c.requests), kShape, queries,
                                   c.Rows())),
            ErrorCode::kInvalidArgument);
  const std::vector<std::size_t> bounds{0, 1, 2, 3};
  KindLayerInput with_bounds = hca;
  with_bounds.bounds = bounds;
  EXPECT_EQ(code(AttendKindsAtHome(*c.space, with_bounds, kShape, queries, c.Rows())),
            ErrorCode::kInvalidArgument);
  // Queries of the wrong size; a layer wider than the kinds' rows; an unknown request.
  EXPECT_EQ(code(AttendKindsAtHome(*c.space, hca, kShape, std::span(queries).subspan(1), c.Rows())),
            ErrorCode::kInvalidArgument);
  const MlaShape wide{.num_heads = 1, .kv_lora_rank = 144, .rope_dim = 8, .softmax_scale = 1.0f};  // 608 B > 584
  std::vector<float> wq(c.requests.size() * wide.query_values(), 0.25f);
  EXPECT_EQ(code(AttendKindsAtHome(*c.space, hca, wide, wq, c.Rows())), ErrorCode::kInvalidArgument);
  const std::vector<RequestId> unknown = {RequestId(99)};
  EXPECT_EQ(code(AttendKindsAtHome(*c.space, Input(KindLayer::kWindowOnly, unknown), kShape,
                                   std::span(queries).first(kShape.query_values()), c.Rows())),
            ErrorCode::kNotFound);
  // Positions: not one per query; at or past the request's tokens; a window the ring no
  // longer holds (token 0 of a 700-token request).
  KindLayerInput at = hca;
  const std::vector<std::uint32_t> two = {1, 2}, past = {700, 999, 89}, gone = {0, 999, 89};
  at.positions = two;
  EXPECT_EQ(code(AttendKindsAtHome(*c.space, at, kShape, queries, c.Rows())), ErrorCode::kInvalidArgument);
  at.positions = past;
  EXPECT_EQ(code(AttendKindsAtHome(*c.space, at, kShape, queries, c.Rows())), ErrorCode::kOutOfRange);
  at.positions = gone;
  EXPECT_EQ(code(AttendKindsAtHome(*c.space, at, kShape, queries, c.Rows())), ErrorCode::kOutOfRange);
  // Rows the engine does not hold.
  const KindRowBytes none = [](Rank, std::uint32_t, std::uint32_t, std::uint32_t) -> const std::byte* {
    return nullptr;
  };
  auto missing = AttendKindsAtHome(*c.space, hca, kShape, queries, none);
  ASSERT_FALSE(missing);
  EXPECT_EQ(missing.error().code(), ErrorCode::kFailedPrecondition);
  EXPECT_NE(missing.error().message().find("holds no row"), std::string::npos) << missing.error().ToString();
  // A space without kinds.
  testing::TpFixture plain([] {
    TpConfig t = testing::SmallTpConfig(2, 8, 8, 0);
    t.attention = TpAttention::kAtHome;
    return t;
  }());
  EXPECT_TRUE(plain.space->AddRequest(RequestId(1)));
  const std::vector<RequestId> one = {RequestId(1)};
  EXPECT_EQ(code(AttendKindsAtHome(*plain.space, Input(KindLayer::kWindowOnly, one), kShape,
                                   std::span(queries).first(kShape.query_values()), c.Rows())),
            ErrorCode::kFailedPrecondition);
  EXPECT_EQ(c.space->DebugDigest(), digest);
  EXPECT_TRUE(c.space->CheckInvariants());
}

}  // namespace
}  // namespace ula
