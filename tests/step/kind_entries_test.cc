// KindEntries (src/space/kind_entries.h): the entries of DeepSeek-V4's kinds appear at their
// block boundaries, the window ring frees a block only once all its tokens are older than
// the ring, a rollback undoes what the rejected tokens made and is refused past the ring,
// and a randomized run against a per-token reference model (its own simulation, not the
// formulas of the class) agrees after every operation.
#include <gtest/gtest.h>

#include <algorithm>
#include <deque>
#include <map>
#include <random>
#include <set>

#include "space/kind_entries.h"
#include "test_seed.h"

namespace ula {
namespace {

constexpr std::uint32_t kWindow = 128, kDrafts = 3, kRing = kWindow + kDrafts;
enum : std::uint32_t { kWin = 0, kC4 = 1, kKey = 2, kC128 = 3, kS4 = 4, kS128 = 5, kNumKinds = 6 };

// DeepSeek-V4-Flash's kinds, in its order (config/model_kinds.h), one state per rate.
std::vector<KvKind> V4Kinds() {
  std::vector<KvKind> k = {
      {.name = "window", .tokens_per_entry = 1, .lifetime = KindLifetime::kRing, .ring_tokens = kRing,
       .ring_draft_tokens = kDrafts, .layers = 2, .row_bytes = 32},
      {.name = "c4", .tokens_per_entry = 4, .lifetime = KindLifetime::kAppend, .layers = 2, .row_bytes = 32,
       .placement = KindPlacement::kSparse},
      {.name = "key", .tokens_per_entry = 4, .lifetime = KindLifetime::kAppend, .layers = 2, .row_bytes = 8,
       .companion_of = 1},
      {.name = "c128", .tokens_per_entry = 128, .lifetime = KindLifetime::kAppend, .layers = 2, .row_bytes = 32},
      {.name = "c4_state", .tokens_per_entry = 4, .lifetime = KindLifetime::kPerRequest, .state_rows = 8,
       .layers = 2, .row_bytes = 64},
      {.name = "c128_state", .tokens_per_entry = 128, .lifetime = KindLifetime::kPerRequest, .state_rows = 128,
       .layers = 2, .row_bytes = 64},
  };
  EXPECT_TRUE(ValidateKinds(k));
  return k;
}

std::uint64_t Digest(const KindEntries& e) {
  StateDigest d;
  e.AddToDigest(d);
  return d.value();
}

KindPages Pages(const KindEntries& e, RequestId r, std::uint32_t k) {
  auto p = e.PagesOf(r, k);
  EXPECT_TRUE(p) << p.error().ToString();
  return p ? *p : KindPages{};
}

// The request's page tables of every kind that is not the addresses.
std::vector<KindPages> Tables(const KindEntries& e, RequestId r) {
  std::vector<KindPages> t;
  for (std::uint32_t k : {kWin, kC128, kS4, kS128}) t.push_back(Pages(e, r, k));
  return t;
}

// One request of the V4 kinds, registered.
class KindEntriesOfOneRequest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_TRUE(e.AddRequest(r)); }
  const std::vector<KvKind> kinds = V4Kinds();
  KindEntries e{kinds};
  const RequestId r{1};
};

TEST_F(KindEntriesOfOneRequest, TheCompressedEntriesAppearWhenTheirBlockCompletes) {
  auto three = e.CheckAppend(r, 3);
  ASSERT_TRUE(three);
  EXPECT_EQ(three->entries, 0u);  // three tokens make no C4 entry: they are the compressor state's
  e.Append(r, 3);
  EXPECT_EQ(*e.AddressedEntries(r), 0u);
  EXPECT_EQ(Pages(e, r, kS4).filling_tokens, 3u);
  EXPECT_EQ(Pages(e, r, kS4).entries, 1u);  // the state is there from the first Append
  EXPECT_EQ(e.CheckAppend(r, 1)->entries, 1u);       // the fourth token completes the block
  e.Append(r, 1);
  EXPECT_EQ(*e.AddressedEntries(r), 1u);
  EXPECT_EQ(Pages(e, r, kS4).filling_tokens, 0u);
  e.Append(r, 123);  // 127 tokens: no C128 entry yet
  EXPECT_EQ(Pages(e, r, kC128).entries, 0u);
  EXPECT_TRUE(Pages(e, r, kC128).blocks.empty());
  EXPECT_EQ(Pages(e, r, kS128).filling_tokens, 127u);
  e.Append(r, 1);
  EXPECT_EQ(Pages(e, r, kC128).entries, 1u);
  EXPECT_EQ(Pages(e, r, kC128).blocks.size(), 1u);
  EXPECT_EQ(Pages(e, r, kS128).filling_tokens, 0u);
  EXPECT_EQ(*e.AddressedEntries(r), 32u);
  // 64 C128 entries fill one block; the 65th opens the next.
  e.Append(r, 63 * 128);
  EXPECT_EQ(Pages(e, r, kC128).blocks.size(), 1u);
  e.Append(r, 128);
  EXPECT_EQ(Pages(e, r, kC128).blocks.size(), 2u);
  EXPECT_TRUE(e.CheckInvariants("test"));
}

TEST_F(KindEntriesOfOneRequest, TheRingFreesABlockOnlyWhenAllItsTokensAreOlderThanTheRing) {
  e.Append(r, 64 + kRing - 1);  // one round: its tokens stay until it ends
  EXPECT_EQ(Pages(e, r, kWin).entries, 64 + kRing - 1);
  e.EndRound();  // live [63, 194): token 63 still holds block 0
  KindPages w = Pages(e, r, kWin);
  EXPECT_EQ(w.entries, kRing);
  EXPECT_EQ(w.first_offset, 63u);
  ASSERT_EQ(w.blocks.size(), 4u);  // blocks 0..3
  const std::uint32_t block0 = w.blocks[0];
  e.Append(r, 1);  // live [64, 195): block 0 is wholly older
  w = Pages(e, r, kWin);
  EXPECT_EQ(w.first_offset, 0u);
  ASSERT_EQ(w.blocks.size(), 3u);
  EXPECT_EQ(std::count(w.blocks.begin(), w.blocks.end(), block0), 0);
  EXPECT_EQ(e.BlocksInUse(kWin), 3u);
  // Steady state: the footprint stays at most ceil(131 / 64) + 1 = 4 blocks, the lowest
  // freed id is reused.
  for (int i = 0; i < 2000; ++i) {
    e.Append(r, 1);
    ASSERT_LE(Pages(e, r, kWin).blocks.size(), 4u);
    ASSERT_EQ(Pages(e, r, kWin).entries, kRing);
  }
  EXPECT_LE(e.BlockExtent(kWin), 4u);
  EXPECT_TRUE(e.CheckInvariants("test"));
}

TEST_F(KindEntriesOfOneRequest, ARollbackUndoesWhatTheRejectedTokensMade) {
  e.Append(r, 126);
  const std::vector<KindPages> at126 = Tables(e, r);
  e.Append(r, 3);  // 129: the 32nd C4 entry and the first C128 entry
  EXPECT_EQ(Pages(e, r, kC128).entries, 1u);
  auto keep = e.CheckTruncate(r, 126);
  ASSERT_TRUE(keep) << keep.error().ToString();
  EXPECT_EQ(*keep, 31u);
  e.Truncate(r, 126);
  EXPECT_EQ(Pages(e, r, kC128).entries, 0u);
  EXPECT_EQ(Pages(e, r, kS4).filling_tokens, 2u);
  EXPECT_EQ(Pages(e, r, kS128).filling_tokens, 126u);
  EXPECT_EQ(Tables(e, r), at126);  // as if the drafts were never made (the ids they took are free)
  EXPECT_EQ(e.BlocksInUse(kC128), 0u);
  EXPECT_EQ(e.BlocksInUse(kWin), 2u);
  EXPECT_TRUE(e.CheckInvariants("test"));
  // A full ring restores the window after a rollback of ring_draft_tokens.
  e.Append(r, 1000);
  e.EndRound();
  const std::uint32_t t = 1126;
  ASSERT_TRUE(e.CheckTruncate(r, t - kDrafts));
  e.Truncate(r, t - kDrafts);
  const KindPages w = Pages(e, r, kWin);
  EXPECT_EQ(w.entries, kRing - kDrafts);  // the window of the new length, all live
  EXPECT_TRUE(e.CheckInvariants("test"));
}

TEST_F(KindEntriesOfOneRequest, BadInputIsRefusedAndChangesNothing) {
  e.Append(r, 1000);
  e.EndRound();
  const std::uint64_t before = Digest(e);
  auto past_ring = e.CheckTruncate(r, 1000 - kDrafts - 1);
  ASSERT_FALSE(past_ring);
  EXPECT_EQ(past_ring.error().code(), ErrorCode::kFailedPrecondition);
  EXPECT_NE(past_ring.error().message().find("reaches past the ring of 'window'"), std::string::npos)
      << past_ring.error().message();
  // Two rollbacks within the drafts each, past them together: the second is refused.
  ASSERT_TRUE(e.CheckTruncate(r, 998));
  e.Truncate(r, 998);
  const std::uint64_t at998 = Digest(e);
  auto second = e.CheckTruncate(r, 996);
  ASSERT_FALSE(second);
  EXPECT_EQ(second.error().code(), ErrorCode::kFailedPrecondition);
  EXPECT_EQ(Digest(e), at998);
  e.Append(r, 2);
  EXPECT_EQ(Digest(e), before);
  auto longer = e.CheckTruncate(r, 1001);
  ASSERT_FALSE(longer);
  EXPECT_EQ(longer.error().code(), ErrorCode::kOutOfRange);
  auto unknown = e.CheckAppend(RequestId(9), 1);
  ASSERT_FALSE(unknown);
  EXPECT_EQ(unknown.error().code(), ErrorCode::kNotFound);
  auto overflow = e.CheckAppend(r, 0xffffffffu);
  ASSERT_FALSE(overflow);
  EXPECT_EQ(overflow.error().code(), ErrorCode::kOutOfRange);
  EXPECT_EQ(e.PagesOf(r, kC4).error().code(), ErrorCode::kInvalidArgument);  // the addresses
  EXPECT_EQ(e.PagesOf(r, kKey).error().code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(e.PagesOf(r, kNumKinds).error().code(), ErrorCode::kOutOfRange);
  EXPECT_EQ(e.PagesOf(RequestId(9), kWin).error().code(), ErrorCode::kNotFound);
  EXPECT_EQ(e.AddRequest(r).error().code(), ErrorCode::kAlreadyExists);
  EXPECT_EQ(e.Free(RequestId(9)).error().code(), ErrorCode::kNotFound);
  EXPECT_EQ(Digest(e), before);
  ASSERT_TRUE(e.Free(r));
  for (std::uint32_t k : {kWin, kC128, kS4, kS128}) EXPECT_EQ(e.BlocksInUse(k), 0u) << k;
  EXPECT_TRUE(e.CheckInvariants("test"));
}

// The reference: one request simulated token by token.
struct Model {
  std::uint32_t tokens = 0, most = 0;
  std::deque<std::uint32_t> ring;  // live window tokens
  std::uint32_t c4 = 0, c128 = 0;
  bool appended = false;

  // Drops the ring's tokens that token `reader` and a rollback of kDrafts before it never read.
  void Drop(std::uint32_t reader) {
    while (!ring.empty() && ring.front() + kWindow + kDrafts <= reader) ring.pop_front();
  }
  void Add(std::uint32_t n) {
    const std::uint32_t first = tokens;  // the round's first token
    for (std::uint32_t i = 0; i < n; ++i, ++tokens) {
      ring.push_back(tokens);
      if ((tokens + 1) % 4 == 0) ++c4;
      if ((tokens + 1) % 128 == 0) ++c128;
    }
    if (n > 0) Drop(first);
    most = std::max(most, tokens);
    appended = true;
  }
  void EndRound() {
    if (most > 0) Drop(most - 1);
  }
  // Whether the window of `length` is within what a rollback restores: the window of
  // most - kDrafts tokens and later.
  bool CanTruncate(std::uint32_t length) const {
    if (length == tokens) return true;
    const std::uint32_t need = length > kWindow ? length - kWindow : 0;
    return need + kRing >= most;
  }
  void Cut(std::uint32_t length) {
    while (!ring.empty() && ring.back() >= length) ring.pop_back();
    while (tokens > length) {
      --tokens;
      if ((tokens + 1) % 4 == 0) --c4;
      if ((tokens + 1) % 128 == 0) --c128;
    }
  }
  std::set<std::uint32_t> RingBlocks() const {
    std::set<std::uint32_t> b;
    for (std::uint32_t t : ring) b.insert(t / 64);
    return b;
  }
};

TEST(KindEntries, RandomOperationsAgreeWithAPerTokenModel) {
  ULA_TEST_SEEDED(seed, 20261205);
  std::mt19937_64 rng(seed);
  const auto kinds = V4Kinds();
  KindEntries e(kinds);
  std::map<std::uint32_t, Model> models;
  // Ids seen per (request, kind, request's block index): a kept block keeps its id.
  std::map<std::tuple<std::uint32_t, std::uint32_t, std::uint32_t>, std::uint32_t> ids;
  auto pick = [&](std::uint32_t n) { return static_cast<std::uint32_t>(rng() % n); };
  for (int op = 0; op < 4000; ++op) {
    const std::uint32_t id = pick(6);
    const RequestId r(id);
    auto it = models.find(id);
    const std::uint64_t before = Digest(e);
    if (it == models.end()) {
      ASSERT_TRUE(e.AddRequest(r));
      models[id];
    } else if (pick(40) == 0) {
      ASSERT_TRUE(e.Free(r));
      models.erase(it);
      std::erase_if(ids, [id](const auto& kv) { return std::get<0>(kv.first) == id; });
    } else if (pick(8) == 0) {
      e.EndRound();
      for (auto& [rid, m] : models) m.EndRound();
    } else if (pick(3) == 0 && it->second.tokens > 0) {
      const std::uint32_t back = std::min(it->second.tokens, pick(kDrafts + 3));
      const std::uint32_t length = it->second.tokens - back;
      auto keep = e.CheckTruncate(r, length);
      ASSERT_EQ(keep.has_value(), it->second.CanTruncate(length)) << "op " << op << " truncate to " << length;
      if (keep) {
        e.Truncate(r, length);
        it->second.Cut(length);
        EXPECT_EQ(*keep, it->second.c4);
      } else {
        ASSERT_EQ(Digest(e), before);
      }
    } else {
      const std::uint32_t n = pick(10) == 0 ? pick(3000) : 1 + pick(4);
      auto made = e.CheckAppend(r, n);
      ASSERT_TRUE(made);
      const std::uint32_t c4 = it->second.c4;
      e.Append(r, n);
      it->second.Add(n);
      EXPECT_EQ(made->entries, it->second.c4 - c4);
    }
    // Every request against its model; block ids owned once per kind, stable while kept.
    std::map<std::uint32_t, std::set<std::uint32_t>> owned;  // kind -> ids
    std::map<std::uint32_t, std::uint32_t> counted;
    for (const auto& [rid, m] : models) {
      const RequestId q(rid);
      ASSERT_EQ(*e.TokensOf(q), m.tokens);
      ASSERT_EQ(*e.AddressedEntries(q), m.c4) << "op " << op;
      const KindPages w = Pages(e, q, kWin);
      ASSERT_EQ(w.entries, m.ring.size()) << "op " << op;
      const std::set<std::uint32_t> rb = m.RingBlocks();
      ASSERT_EQ(w.blocks.size(), rb.size()) << "op " << op;
      if (!m.ring.empty()) {
        ASSERT_EQ(w.first_offset, m.ring.front() % 64);
      }
      std::uint32_t i = 0;
      for (std::uint32_t b : rb) {
        auto [pos, fresh] = ids.try_emplace({rid, kWin, b}, w.blocks[i]);
        ASSERT_EQ(pos->second, w.blocks[i]) << "op " << op << ": a kept window block changed its id";
        ++i;
      }
      const KindPages c = Pages(e, q, kC128);
      ASSERT_EQ(c.entries, m.c128);
      ASSERT_EQ(c.blocks.size(), (m.c128 + 63) / 64);
      for (std::uint32_t b = 0; b < c.blocks.size(); ++b) {
        auto [pos, fresh] = ids.try_emplace({rid, kC128, b}, c.blocks[b]);
        ASSERT_EQ(pos->second, c.blocks[b]) << "op " << op << ": a kept c128 block changed its id";
      }
      for (auto [k, rate] : {std::pair{kS4, 4u}, std::pair{kS128, 128u}}) {
        const KindPages s = Pages(e, q, k);
        ASSERT_EQ(s.entries, m.appended ? 1u : 0u);
        ASSERT_EQ(s.filling_tokens, m.tokens % rate);
        ASSERT_EQ(s.blocks.size(), s.entries);
        for (std::uint32_t b : s.blocks) ASSERT_TRUE(owned[k].insert(b).second) << "state id owned twice";
        counted[k] += s.blocks.size();
      }
      for (std::uint32_t b : w.blocks) ASSERT_TRUE(owned[kWin].insert(b).second) << "op " << op;
      for (std::uint32_t b : c.blocks) ASSERT_TRUE(owned[kC128].insert(b).second) << "op " << op;
      counted[kWin] += w.blocks.size();
      counted[kC128] += c.blocks.size();
    }
    // Forget the ids of blocks no longer held, so a reused block index may get a new id.
    std::erase_if(ids, [&](const auto& kv) {
      const auto [rid, k, b] = kv.first;
      const Model& m = models.at(rid);
      return k == kWin ? !m.RingBlocks().contains(b) : b >= (m.c128 + 63) / 64;
    });
    for (std::uint32_t k : {kWin, kC128, kS4, kS128}) {
      ASSERT_EQ(e.BlocksInUse(k), counted[k]) << "kind " << k << " op " << op;
      if (!owned[k].empty()) {
        ASSERT_LT(*owned[k].rbegin(), e.BlockExtent(k));
      }
    }
    ASSERT_TRUE(e.CheckInvariants("test")) << e.CheckInvariants("test").error().ToString();
  }
}

}  // namespace
}  // namespace ula
