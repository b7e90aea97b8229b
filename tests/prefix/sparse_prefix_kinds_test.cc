// SparsePrefixCache's kinds mode over a DP space with DeepSeek-V4-Flash's kinds
// (ula/sparse_prefix_cache.h, "Kinds mode"): nodes of 256-token units held by holder
// requests (SharePrefix), resumes that read every kind as if they computed the prefix,
// allocation-aware eviction counting every kind, events naming each kind's group, refusals.
#include <gtest/gtest.h>

#include <algorithm>
#include <limits>
#include <random>

#include "kind_engine.h"
#include "space/address_space_state.h"
#include "space/space_access.h"
#include "test_seed.h"
#include "v4_flash.h"
#include "ula/kv_event_publisher.h"
#include "ula/sparse_prefix_cache.h"
#include "ula/tp_address_space.h"

namespace ula {
namespace {

using test::kUnit;
using Engine = test::KindEngine;

struct Fixture {
  Engine e;
  std::unique_ptr<SparsePrefixCache> cache;
  std::uint32_t next_id = 1;
  std::uint32_t c4_key = 0;  // the index key kind (c4's companion)
  std::mt19937_64 rng;

  Fixture(bool bytes, std::uint32_t device, std::uint32_t host, SparsePrefixCacheConfig config, std::uint64_t seed)
      : e(bytes, device, host), rng(seed) {
    auto c = SparsePrefixCache::Create(*e.space, Rank(0), config);
    EXPECT_TRUE(c) << c.error().ToString();
    cache = std::move(*c);
    for (std::uint32_t k = 0; k < e.space->config().kinds.size(); ++k) {
      if (e.space->config().kinds[k].name == "c4_index_key") c4_key = k;
    }
  }
  RequestId Make(std::vector<std::uint32_t> tokens) {
    const RequestId r(next_id++);
    EXPECT_TRUE(e.space->AddRequest(r, Rank(0)));
    e.seq[r.value()] = std::move(tokens);
    return r;
  }
  std::vector<std::uint32_t> Random(std::uint32_t n) {
    std::vector<std::uint32_t> t(n);
    for (auto& x : t) x = static_cast<std::uint32_t>(rng() % 129280);
    return t;
  }
  void Check(const char* where) const {
    const Status s = e.space->CheckInvariants();
    ASSERT_TRUE(s) << where << ": " << s.error().ToString();
    const Status c = cache->CheckInvariants();
    ASSERT_TRUE(c) << where << ": " << c.error().ToString();
  }
  // A source with `tokens` prefills in one round and is cached; the holders' copies run.
  RequestId Cache(const std::vector<std::uint32_t>& tokens) {
    const RequestId s = Make(tokens);
    e.Run(s, static_cast<std::uint32_t>(tokens.size()));
    auto in = cache->Insert(e.seq[s.value()], s);
    EXPECT_TRUE(in) << in.error().ToString();
    if (in) e.Copy(PrefixShare{0, in->copies});
    return s;
  }
  std::uint64_t Used(std::uint32_t k) const { return StateOf(*e.space).kinds.BlocksInUse(k); }
  std::uint64_t Digest() const { return cache->DebugDigest() ^ (e.space->DebugDigest() * 31); }
};

// System prompts of assorted lengths (multiples of 256, of 128 only, of 4 only, inside a 4-token
// block, past a full C128 block) are cached by sources that prefill them with their own
// suffixes; the sources decode on and go. Requests with those prompts and new suffixes match
// the longest cached whole-unit prefix, resume from its holder (SharePrefix), recompute the rest
// and decode: every window row, C4 entry, C128 entry and compressor-state row they read equals a
// twin's that computed its whole prompt. CheckInvariants after every operation; at the end the
// cache is emptied and nothing of any kind is left in the space.
TEST(SparsePrefixKinds, ResumedRequestsReadEveryKindAsIfTheyComputedThePrefix) {
  ULA_TEST_SEEDED(seed, 20261206);
  Fixture f(/*bytes=*/true, /*device=*/2048, /*host=*/8192, {}, seed);
  AddressSpace& s = *f.e.space;
  const std::uint32_t lengths[] = {768, 640, 1000, 1030, 8448 + 100};
  std::vector<std::vector<std::uint32_t>> prompts;
  std::vector<RequestId> sources;
  for (const std::uint32_t L : lengths) {
    prompts.push_back(f.Random(L));
    // Two sources per prompt, each with its own suffix: the second matches the first's units.
    for (int i = 0; i < 2; ++i) {
      std::vector<std::uint32_t> t = prompts.back();
      const std::vector<std::uint32_t> own = f.Random(60 + static_cast<std::uint32_t>(f.rng() % 300));
      t.insert(t.end(), own.begin(), own.end());
      const std::uint32_t before = f.cache->PeekLength(t);
      sources.push_back(f.Cache(t));
      EXPECT_EQ(before, i == 0 ? 0u : L / kUnit * kUnit) << L;
      EXPECT_EQ(f.cache->PeekLength(t), t.size() / kUnit * kUnit) << L;
      f.Check("insert");
    }
  }
  s.AdvanceRound();
  for (int step = 0; step < 3; ++step) {  // the sources decode on: their rings let go
    for (const RequestId r : sources) {
      f.e.seq[r.value()].push_back(static_cast<std::uint32_t>(f.rng() % 129280));
      f.e.Run(r, 1);
    }
    s.AdvanceRound();
  }
  std::shuffle(sources.begin(), sources.end(), f.rng);
  for (const RequestId r : sources) ASSERT_TRUE(s.Free(r));  // the holders keep every prefix
  f.Check("sources freed");
  for (std::size_t i = 0; i < prompts.size(); ++i) {
    SCOPED_TRACE(::testing::Message() << "system prompt of " << lengths[i] << " tokens");
    std::vector<std::uint32_t> prompt = prompts[i];
    const std::vector<std::uint32_t> own = f.Random(40 + static_cast<std::uint32_t>(f.rng() % 100));
    prompt.insert(prompt.end(), own.begin(), own.end());
    const SparsePrefixMatch m = f.cache->Match(prompt);
    ASSERT_EQ(m.length, lengths[i] / kUnit * kUnit);
    ASSERT_TRUE(f.cache->Lock(m));
    f.Check("match");
    const RequestId resumed = f.Make(prompt), twin = f.Make(prompt);
    auto share = s.SharePrefix(resumed, m.holder, m.length);
    ASSERT_TRUE(share) << share.error().ToString();
    ASSERT_EQ(share->resume_from, m.length);
    f.e.Copy(*share);
    f.e.Run(resumed, static_cast<std::uint32_t>(prompt.size()) - m.length);
    f.e.Run(twin, static_cast<std::uint32_t>(prompt.size()));
    s.AdvanceRound();
    f.Check("prefill");
    ASSERT_EQ(f.e.Reads(resumed), f.e.Reads(twin)) << "after the prefill";
    for (int step = 0; step < 4; ++step) {
      const std::uint32_t tok = static_cast<std::uint32_t>(f.rng() % 129280);
      f.e.seq[resumed.value()].push_back(tok);
      f.e.seq[twin.value()].push_back(tok);
      f.e.Run(resumed, 1);
      f.e.Run(twin, 1);
      s.AdvanceRound();
      ASSERT_EQ(f.e.Reads(resumed), f.e.Reads(twin)) << "decode step " << step;
    }
    ASSERT_TRUE(f.cache->Unlock(m));
    ASSERT_TRUE(s.Free(resumed));
    ASSERT_TRUE(s.Free(twin));
    f.Check("done");
  }
  const SparseEvictionStats all = f.cache->Evict(std::numeric_limits<std::uint64_t>::max());
  EXPECT_EQ(f.cache->cached_tokens(), 0u);
  EXPECT_GT(all.nodes, 0u);
  f.Check("emptied");
  EXPECT_EQ(s.num_requests(), 0u);
  EXPECT_EQ(s.num_live_addresses(), 0u);
  for (std::uint32_t k = 0; k < s.config().kinds.size(); ++k) EXPECT_EQ(f.Used(k), 0u) << k;
}

// MakeRoom under pressure: three cached prompts of two units each, C least recently used and
// still held by a running request that resumed from it. A demand of 64 C4 entries more than fit
// evicts C's two nodes (C's leaf frees no C4 entry and no window block: the request holds them;
// its own C128 block it frees), then A's leaf, whose 64 entries make it fit: it stops there.
// Every per-kind count equals the space's change. A window demand over the window pool's bound
// then evicts exactly until enough window blocks are free.
TEST(SparsePrefixKinds, MakeRoomCountsEveryKindAndStopsAtTheFirstFit) {
  SparsePrefixCacheConfig config;
  Fixture f(/*bytes=*/true, /*device=*/256, /*host=*/1024, config, 7);
  AddressSpace& s = *f.e.space;
  const std::uint32_t K = static_cast<std::uint32_t>(s.config().kinds.size());
  std::vector<std::vector<std::uint32_t>> p;
  for (int i = 0; i < 3; ++i) p.push_back(f.Random(2 * kUnit));  // C, A, B
  std::vector<RequestId> sources;
  for (const auto& t : p) sources.push_back(f.Cache(t));
  s.AdvanceRound();
  for (const RequestId r : sources) ASSERT_TRUE(s.Free(r));
  f.Check("cached");
  const SparsePrefixMatch c = f.cache->Match(p[0]);
  ASSERT_EQ(c.length, 2 * kUnit);
  const RequestId running = f.Make(p[0]);
  ASSERT_TRUE(s.SharePrefix(running, c.holder, c.length));
  ASSERT_EQ(f.cache->Match(p[1]).length, 2 * kUnit);  // A, then B, more recent than C
  ASSERT_EQ(f.cache->Match(p[2]).length, 2 * kUnit);
  f.Check("matched");

  auto snapshot = [&] {
    std::vector<std::uint64_t> v(K, 0);
    v[f.e.c4] = s.num_live_addresses();
    v[f.c4_key] = s.num_live_addresses();
    v[f.e.c128] = f.Used(f.e.c128);
    v[f.e.window] = f.Used(f.e.window);
    return v;
  };
  std::vector<std::uint64_t> demand(K, 0);
  demand[f.e.c4] = f.cache->Room() + 64;
  const std::vector<std::uint64_t> before = snapshot();
  auto got = f.cache->MakeRoom(demand);
  ASSERT_TRUE(got) << got.error().ToString();
  f.Check("make room");
  EXPECT_EQ(got->nodes, 3u);  // C's leaf, C's first unit, A's leaf: not one more
  EXPECT_TRUE(f.cache->Fits(demand));
  EXPECT_EQ(f.cache->Room(), demand[f.e.c4]);
  const std::vector<std::uint64_t> after = snapshot();
  ASSERT_EQ(got->freed_per_kind.size(), K);
  for (const std::uint32_t k : {f.e.c4, f.c4_key, f.e.c128, f.e.window}) {
    EXPECT_EQ(got->freed_per_kind[k], before[k] - after[k]) << s.config().kinds[k].name;
  }
  EXPECT_EQ(got->freed_per_kind[f.e.c4], 64u);  // A's leaf's unit only: C's entries the running request holds
  EXPECT_EQ(got->freed_per_kind[f.e.c128], 3u);  // each holder's own partly filled C128 block
  EXPECT_GT(got->freed_per_kind[f.e.window], 0u);
  // C's leaf freed none of the window blocks the running request adopted from it.
  for (const std::uint32_t b : f.e.Pages(running, f.e.window).blocks) {
    EXPECT_EQ(StateOf(s).kinds.HoldersOf(f.e.window, b), 1u);
  }
  EXPECT_EQ(f.cache->PeekLength(p[1]), kUnit);
  EXPECT_EQ(f.cache->PeekLength(p[2]), 2 * kUnit);
  EXPECT_EQ(f.cache->Metrics().evicted_per_kind, got->freed_per_kind);

  // A second cache whose window pool holds 2 blocks more than its prompt leaves in use (its two
  // holders' rings: 3 blocks each): a demand of 5 window blocks evicts one leaf (3) and stops.
  const std::uint64_t window_now = f.Used(f.e.window);
  SparsePrefixCacheConfig bounded;
  bounded.kind_block_capacity.assign(K, 0);
  bounded.kind_block_capacity[f.e.window] = window_now + 6 + 2;
  bounded.first_holder = RequestId(std::uint64_t{1} << 40);
  auto second = SparsePrefixCache::Create(s, Rank(0), bounded);
  ASSERT_TRUE(second) << second.error().ToString();
  const RequestId src = f.Make(f.Random(2 * kUnit));
  f.e.Run(src, 2 * kUnit);
  ASSERT_TRUE((*second)->Insert(f.e.seq[src.value()], src));
  ASSERT_TRUE(s.Free(src));
  ASSERT_EQ(f.Used(f.e.window), window_now + 6);
  std::fill(demand.begin(), demand.end(), 0);
  demand[f.e.window] = 5;
  EXPECT_FALSE((*second)->Fits(demand));
  const std::uint64_t window_before = f.Used(f.e.window);
  auto room = (*second)->MakeRoom(demand);
  ASSERT_TRUE(room) << room.error().ToString();
  EXPECT_EQ(room->nodes, 1u);  // one leaf's three window blocks make five free
  EXPECT_EQ(room->freed_per_kind[f.e.window], window_before - f.Used(f.e.window));
  EXPECT_EQ(room->freed_per_kind[f.e.window], 3u);
  ASSERT_TRUE((*second)->CheckInvariants());

  // What cannot fit: every leaf evicted, kResourceExhausted, the rest stays whole.
  std::fill(demand.begin(), demand.end(), 0);
  demand[f.e.c4] = 1u << 30;
  auto none = f.cache->MakeRoom(demand);
  ASSERT_FALSE(none);
  EXPECT_EQ(none.error().code(), ErrorCode::kResourceExhausted);
  EXPECT_EQ(f.cache->cached_tokens(), 0u);
  f.Check("exhausted");
  (*second)->Evict(std::numeric_limits<std::uint64_t>::max());
  ASSERT_TRUE(s.Free(running));
  EXPECT_EQ(s.num_live_addresses(), 0u);
  for (std::uint32_t k = 0; k < K; ++k) EXPECT_EQ(f.Used(k), 0u) << k;
}

// Events: every new node stores one block per kind group (window: group 0, "sliding_window_mla",
// window 128; C4 page: group 1, "mla_attention"; C128: group 2, "mla_attention"), with the
// unit's SGLang hash chained on its parent unit's; every eviction is followed at once by the
// removals of all its groups. The publisher sends each group's fields.
TEST(SparsePrefixKinds, EventsNameEachKindAndGroupAndARemovalFollowsEveryEviction) {
  SparsePrefixCacheConfig config;
  config.record_events = true;
  Fixture f(/*bytes=*/true, /*device=*/1024, /*host=*/1024, config, 11);
  AddressSpace& s = *f.e.space;
  const std::vector<std::uint32_t> a = f.Random(2 * kUnit + 70);
  std::vector<std::uint32_t> b(a.begin(), a.begin() + kUnit);
  const std::vector<std::uint32_t> tail = f.Random(kUnit + 5);
  b.insert(b.end(), tail.begin(), tail.end());
  const std::vector<std::int64_t> ha = BlockHashes(std::span(a).first(2 * kUnit), kUnit);
  const std::vector<std::int64_t> hb = BlockHashes(std::span(b).first(2 * kUnit), kUnit);
  struct Want {
    CacheEvent::Type type;
    std::int32_t group;
    const char* spec;
    std::uint32_t window;
  };
  // In the space's kind order: window, c4, c128.
  const Want stored[] = {{CacheEvent::Type::kWindowStored, 0, "sliding_window_mla", 128},
                         {CacheEvent::Type::kPageStored, 1, "mla_attention", 0},
                         {CacheEvent::Type::kPageStored, 2, "mla_attention", 0}};
  const Want removed[] = {{CacheEvent::Type::kWindowRemoved, 0, "sliding_window_mla", 128},
                          {CacheEvent::Type::kPageRemoved, 1, "mla_attention", 0},
                          {CacheEvent::Type::kPageRemoved, 2, "mla_attention", 0}};
  auto expect = [&](const std::vector<CacheEvent>& got, std::size_t at, const Want (&want)[3], std::int64_t hash,
                    std::optional<std::int64_t> parent, std::uint32_t position) {
    for (int g = 0; g < 3; ++g) {
      ASSERT_LT(at + g, got.size());
      const CacheEvent& e = got[at + g];
      EXPECT_EQ(e.type, want[g].type) << g;
      EXPECT_EQ(e.group, want[g].group);
      EXPECT_EQ(e.spec_kind, want[g].spec);
      EXPECT_EQ(e.spec_window, want[g].window);
      EXPECT_EQ(e.hash, hash);
      EXPECT_EQ(e.position, position);
      if (e.stored()) {
        EXPECT_EQ(e.parent_hash, parent);
        EXPECT_EQ(e.tokens.size(), kUnit);
      }
    }
  };
  const RequestId ra = f.Cache(a);
  std::vector<CacheEvent> ev = f.cache->TakeEvents();
  ASSERT_EQ(ev.size(), 6u);
  expect(ev, 0, stored, ha[0], std::nullopt, 0);
  expect(ev, 3, stored, ha[1], ha[0], kUnit);
  const RequestId rb = f.Cache(b);  // shares a's first unit: one new node
  ev = f.cache->TakeEvents();
  ASSERT_EQ(ev.size(), 3u);
  expect(ev, 0, stored, hb[1], hb[0], kUnit);
  EXPECT_EQ(hb[0], ha[0]);
  s.AdvanceRound();
  ASSERT_TRUE(s.Free(ra));
  ASSERT_TRUE(s.Free(rb));
  // The publisher's payload names each group's spec kind.
  auto pub = KvEventPublisher::Create({.endpoint = "inproc://sparse-kinds", .block_size = kUnit});
  ASSERT_TRUE(pub) << pub.error().ToString();
  const std::string wire = (*pub)->Encode(ev, 1.0);
  // msgpack: group_idx (a fixint), then kv_cache_spec_kind (a fixstr), then the window (uint8 128).
  EXPECT_NE(wire.find(std::string("\x00\xb2" "sliding_window_mla" "\xcc\x80", 22)), std::string::npos);
  EXPECT_NE(wire.find(std::string("\x01\xad" "mla_attention" "\xc0", 16)), std::string::npos);
  EXPECT_NE(wire.find(std::string("\x02\xad" "mla_attention" "\xc0", 16)), std::string::npos);
  // Evictions, one at a time (LRU: a's leaf, then b's, then the shared first unit).
  const std::int64_t order[] = {ha[1], hb[1], ha[0]};
  for (int i = 0; i < 3; ++i) {
    const SparseEvictionStats st = f.cache->Evict(1);
    ASSERT_EQ(st.nodes, 1u);
    ev = f.cache->TakeEvents();
    ASSERT_EQ(ev.size(), 3u) << "the eviction's removals, at once";
    expect(ev, 0, removed, order[i], std::nullopt, i == 2 ? 0 : kUnit);
    f.Check("evict");
  }
  EXPECT_TRUE(f.cache->TakeEvents().empty());
  EXPECT_EQ(s.num_live_addresses(), 0u);
}

// Bad input is refused and changes neither the cache nor the space.
TEST(SparsePrefixKinds, BadInputIsRefusedAndChangesNothing) {
  SparsePrefixCacheConfig config;
  config.first_holder = RequestId(1000);
  config.max_holders = 6;
  Fixture f(/*bytes=*/true, /*device=*/1024, /*host=*/4096, config, 13);
  AddressSpace& s = *f.e.space;
  const RequestId moved = f.Make(f.Random(600));
  f.e.Run(moved, 600);
  s.AdvanceRound();
  for (int i = 0; i < 4; ++i) f.e.seq[moved.value()].resize(600 + 64 * (i + 1)), f.e.Run(moved, 64), s.AdvanceRound();
  const RequestId src = f.Make(f.Random(600));  // in its prefill's round from here on
  f.e.Run(src, 600);
  ASSERT_TRUE(f.cache->Insert(std::span(f.e.seq[src.value()]).first(256), src));
  const SparsePrefixMatch stale = f.cache->Match(f.e.seq[src.value()]);
  ASSERT_EQ(stale.length, kUnit);
  const RequestId squatter(1000 + 2);  // the holder id the next node takes
  f.Check("setup");
  const std::uint64_t before = f.Digest();
  auto code = [&](auto got) { return got ? ErrorCode::kInternal : got.error().code(); };
  const std::vector<std::uint32_t>& tokens = f.e.seq[src.value()];
  EXPECT_EQ(code(f.cache->Insert(tokens, RequestId(77))), ErrorCode::kNotFound);  // unknown source
  std::vector<std::uint32_t> longer = tokens;
  longer.push_back(1);
  EXPECT_EQ(code(f.cache->Insert(longer, src)), ErrorCode::kOutOfRange);  // more than the source holds
  auto ring = f.cache->Insert(f.e.seq[moved.value()], moved);  // its ring moved on
  ASSERT_FALSE(ring);
  EXPECT_EQ(ring.error().code(), ErrorCode::kFailedPrecondition);
  EXPECT_NE(ring.error().message().find("ring"), std::string::npos) << ring.error().message();
  const std::vector<LogicalAddr> addrs(s.AddressesOf(src)->begin(), s.AddressesOf(src)->begin() + 4);
  EXPECT_EQ(code(f.cache->Insert(std::span(tokens).first(4), addrs)), ErrorCode::kFailedPrecondition);
  EXPECT_EQ(code(f.cache->MakeRoom(std::uint64_t{8})), ErrorCode::kFailedPrecondition);
  const std::vector<std::uint64_t> short_demand(2, 0);
  EXPECT_EQ(code(f.cache->MakeRoom(short_demand)), ErrorCode::kInvalidArgument);
  EXPECT_EQ(f.Digest(), before);
  ASSERT_TRUE(s.AddRequest(squatter, Rank(0)));
  const std::uint64_t squatted = f.Digest();
  EXPECT_EQ(code(f.cache->Insert(tokens, src)), ErrorCode::kAlreadyExists);  // an engine request in the holder range
  EXPECT_EQ(f.Digest(), squatted);
  ASSERT_TRUE(s.Free(squatter));
  // More nodes than holder ids.
  std::vector<std::uint32_t> big = f.Random(7 * kUnit);
  const RequestId huge = f.Make(big);
  f.e.Run(huge, 7 * kUnit);
  const std::uint64_t full = f.Digest();
  EXPECT_EQ(code(f.cache->Insert(big, huge)), ErrorCode::kResourceExhausted);
  EXPECT_EQ(f.Digest(), full);
  // A stale match.
  ASSERT_EQ(f.cache->Evict(1).nodes, 1u);
  EXPECT_EQ(code(f.cache->Lock(stale)), ErrorCode::kNotFound);
  f.Check("refusals");
  // The cache still caches.
  auto ok = f.cache->Insert(tokens, src);
  ASSERT_TRUE(ok) << ok.error().ToString();
  EXPECT_EQ(ok->inserted, 2 * kUnit);
  f.Check("insert");

  // Configs and spaces the kinds mode refuses.
  SparsePrefixCacheConfig bad;
  bad.kind_block_capacity.assign(3, 0);
  EXPECT_EQ(code(SparsePrefixCache::Create(s, Rank(0), bad)), ErrorCode::kInvalidArgument);
  bad = {};
  bad.first_holder = RequestId(std::numeric_limits<std::uint64_t>::max() - 3);
  EXPECT_EQ(code(SparsePrefixCache::Create(s, Rank(0), bad)), ErrorCode::kInvalidArgument);
  std::unique_ptr<Backend> counting = MakeCountingBackend();
  AddressSpaceConfig frames = test::FlashSpaceConfig(64, 4096, test::kDrafts);
  frames.kind_frame_bytes = kKindFrameBytes;
  frames.device_bytes_per_rank = 16 * kKindFrameBytes;
  auto fs = AddressSpace::Create(frames, *counting);
  ASSERT_TRUE(fs) << fs.error().ToString();
  EXPECT_EQ(code(SparsePrefixCache::Create(**fs, Rank(0))), ErrorCode::kUnsupported);
}

// The kinds mode is DP only: over a TP space with kinds, Create refuses, naming SharePrefix.
TEST(SparsePrefixKinds, ATpSpaceWithKindsIsRefusedAtCreation) {
  std::unique_ptr<Backend> backend = MakeCountingBackend();
  auto tp = TpAddressSpace::Create(test::FlashTpConfig(2, 256, 1024, test::kDrafts), *backend);
  ASSERT_TRUE(tp) << tp.error().ToString();
  auto c = SparsePrefixCache::Create(**tp);
  ASSERT_FALSE(c);
  EXPECT_EQ(c.error().code(), ErrorCode::kUnsupported);
  EXPECT_NE(c.error().message().find("SharePrefix"), std::string::npos) << c.error().message();
  EXPECT_NE(c.error().message().find("DP only"), std::string::npos) << c.error().message();
}

}  // namespace
}  // namespace ula
