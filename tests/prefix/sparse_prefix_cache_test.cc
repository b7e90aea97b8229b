// SparsePrefixCache: a radix tree over logical addresses, DP and TP.
#include "ula/sparse_prefix_cache.h"

#include <gtest/gtest.h>

#include <map>
#include <numeric>
#include <random>

#include "test_seed.h"
#include "ula/address_space.h"
#include "ula/backend.h"
#include "prefix/prefix_router.h"
#include "ula/step_planner.h"
#include "ula/tp_address_space.h"

namespace ula {
namespace {

AddressSpaceConfig Dp(std::uint32_t device, std::uint32_t host, std::uint32_t ranks = 1) {
  AddressSpaceConfig c;
  c.num_ranks = ranks;
  c.num_groups = 2;
  c.entry_bytes = 16;
  c.device_bytes_per_rank = std::uint64_t{device} * 16 * 2;
  c.host_bytes_per_rank = std::uint64_t{host} * 16 * 2;
  return c;
}

std::vector<std::byte> Bytes(LogicalAddr a, std::uint32_t g) {
  std::vector<std::byte> v(16);
  for (std::uint32_t i = 0; i < 16; ++i) v[i] = std::byte((a.value() * 29 + g * 7 + i) & 0xff);
  return v;
}

std::vector<std::uint32_t> Seq(std::uint32_t first, std::uint32_t n) {
  std::vector<std::uint32_t> v(n);
  std::iota(v.begin(), v.end(), first);
  return v;
}

struct DpCache {
  explicit DpCache(const AddressSpaceConfig& c, Rank rank = Rank(0))
      : backend(MakeCpuBackend({})), space(AddressSpace::Create(c, *backend).value()),
        cache(SparsePrefixCache::Create(*space, rank).value()) {}
  // A request that reuses the cache's longest prefix of tokens, allocates the rest and
  // writes it; returns its addresses.
  std::vector<LogicalAddr> Serve(RequestId r, const std::vector<std::uint32_t>& tokens, Rank rank = Rank(0)) {
    EXPECT_TRUE(space->AddRequest(r, rank));
    SparsePrefixMatch m;
    if (rank == Rank(0)) m = cache->Match(tokens);  // the cache of rank 0
    EXPECT_TRUE(space->ShareInto(r, m.addrs));
    auto own = space->Allocate(r, static_cast<std::uint32_t>(tokens.size() - m.length)).value();
    for (LogicalAddr a : own) {
      for (std::uint32_t g = 0; g < 2; ++g) EXPECT_TRUE(space->Write(a, GroupId(g), Bytes(a, g)));
    }
    return std::vector<LogicalAddr>(space->AddressesOf(r).value().begin(), space->AddressesOf(r).value().end());
  }
  void ExpectReads(std::span<const LogicalAddr> addrs) {
    for (LogicalAddr a : addrs) {
      for (std::uint32_t g = 0; g < 2; ++g) {
        std::vector<std::byte> out(16);
        ASSERT_TRUE(space->Read(a, GroupId(g), out)) << a.value();
        ASSERT_EQ(out, Bytes(a, g)) << a.value();
      }
    }
  }
  std::unique_ptr<Backend> backend;
  std::unique_ptr<AddressSpace> space;
  std::unique_ptr<SparsePrefixCache> cache;
};

TEST(SparsePrefixCache, MatchInsertAndSplitShareAddressesWithoutCopies) {
  DpCache f(Dp(32, 32));
  const auto doc = Seq(100, 10);
  auto a = f.Serve(RequestId(1), doc);
  ASSERT_EQ(f.cache->Insert(doc, a).value(), 0u);
  ASSERT_TRUE(f.space->Free(RequestId(1)));  // finished: its KV stays, held by the cache
  EXPECT_EQ(f.space->num_live_addresses(), 10u);
  // A second question about the first 6 tokens, then its own 3.
  auto q2 = Seq(100, 6);
  q2.insert(q2.end(), {7, 8, 9});
  std::vector<Location> where;
  for (LogicalAddr x : a) where.push_back(f.space->Lookup(x, GroupId(1)).value());
  auto b = f.Serve(RequestId(2), q2);
  EXPECT_EQ(f.space->num_live_addresses(), 13u);  // 10 cached + 3 own: the 6 shared stored once
  EXPECT_TRUE(std::equal(a.begin(), a.begin() + 6, b.begin()));
  EXPECT_EQ(f.cache->Metrics().nodes, 2u);  // the match split the document's node at 6
  ASSERT_EQ(f.cache->Insert(q2, b).value(), 6u);
  EXPECT_EQ(f.cache->Metrics().nodes, 3u);
  EXPECT_EQ(f.cache->Metrics().cached_tokens, 13u);
  for (std::size_t i = 0; i < a.size(); ++i) EXPECT_EQ(f.space->Lookup(a[i], GroupId(1)).value(), where[i]);
  f.ExpectReads(a);
  f.ExpectReads(b);
  EXPECT_EQ(f.cache->PeekLength(doc), 10u);
  EXPECT_EQ(f.cache->PeekLength(q2), 9u);
  EXPECT_EQ(f.cache->PeekLength(Seq(100, 3)), 3u);
  EXPECT_EQ(f.cache->PeekLength(Seq(5, 3)), 0u);
  EXPECT_TRUE(f.cache->CheckInvariants());
  EXPECT_TRUE(f.space->CheckInvariants());
}

TEST(SparsePrefixCache, EvictionNeverDropsALockedNodeAndFreesOnlyUnheldAddresses) {
  DpCache f(Dp(8, 8));
  auto a = f.Serve(RequestId(1), Seq(0, 6));
  ASSERT_TRUE(f.cache->Insert(Seq(0, 6), a));
  auto b = f.Serve(RequestId(2), Seq(50, 4));
  ASSERT_TRUE(f.cache->Insert(Seq(50, 4), b));
  ASSERT_TRUE(f.space->Free(RequestId(1)));
  // Request 3 matches the first document and locks it while it runs.
  ASSERT_TRUE(f.space->AddRequest(RequestId(3), Rank(0)));
  auto m = f.cache->Match(Seq(0, 6));
  ASSERT_TRUE(f.cache->Lock(m));
  ASSERT_TRUE(f.space->ShareInto(RequestId(3), m.addrs));
  const auto evicted = f.cache->Evict(1000);
  EXPECT_EQ(evicted.nodes, 1u);  // the other document only
  EXPECT_EQ(evicted.tokens, 4u);
  EXPECT_EQ(evicted.freed, 0u);  // request 2 still holds it
  EXPECT_EQ(f.cache->PeekLength(Seq(0, 6)), 6u);
  f.ExpectReads(a);
  f.ExpectReads(b);
  auto refused = f.cache->MakeRoom(f.cache->Room() + 1);
  ASSERT_FALSE(refused);
  EXPECT_EQ(refused.error().code(), ErrorCode::kResourceExhausted);
  EXPECT_EQ(f.cache->PeekLength(Seq(0, 6)), 6u);
  ASSERT_TRUE(f.cache->Unlock(m));
  ASSERT_TRUE(f.space->Free(RequestId(3)));
  const auto second = f.cache->Evict(1);
  EXPECT_EQ(second.nodes, 1u);
  EXPECT_EQ(second.freed, 6u);  // now the cache was the last holder
  EXPECT_EQ(f.space->num_live_addresses(), 4u);
  EXPECT_TRUE(f.cache->CheckInvariants());
  EXPECT_TRUE(f.space->CheckInvariants());
}

// Allocation-aware: evicts LRU leaves only while the pending allocation does not fit the
// rank's tiers, and stops as soon as it fits.
TEST(SparsePrefixCache, MakeRoomStopsAsSoonAsThePendingAllocationFits) {
  DpCache f(Dp(8, 8));  // 16 entries per group
  std::vector<std::vector<std::uint32_t>> docs;
  for (std::uint32_t d = 0; d < 4; ++d) {
    docs.push_back(Seq(1000 * (d + 1), 3));
    auto a = f.Serve(RequestId(d + 1), docs.back());
    ASSERT_TRUE(f.cache->Insert(docs.back(), a));
    ASSERT_TRUE(f.space->Free(RequestId(d + 1)));
  }
  (void)f.cache->Match(docs[0]);  // document 0 is now the most recently used
  EXPECT_EQ(f.cache->Room(), 4u);
  EXPECT_TRUE(f.cache->MakeRoom(4).value().nodes == 0);  // fits already: nothing goes
  auto st = f.cache->MakeRoom(8).value();                 // needs 4 more: two documents of 3
  EXPECT_EQ(st.nodes, 2u);
  EXPECT_EQ(st.freed, 6u);
  EXPECT_EQ(f.cache->Room(), 10u);
  EXPECT_EQ(f.cache->PeekLength(docs[1]), 0u);  // LRU first
  EXPECT_EQ(f.cache->PeekLength(docs[2]), 0u);
  EXPECT_EQ(f.cache->PeekLength(docs[3]), 3u);  // not needed: kept
  EXPECT_EQ(f.cache->PeekLength(docs[0]), 3u);
  EXPECT_TRUE(f.cache->CheckInvariants());
}

TEST(SparsePrefixCache, BadCallsAreRefusedAndChangeNothing) {
  DpCache f(Dp(8, 8, 2));
  auto a = f.Serve(RequestId(1), Seq(0, 4));
  ASSERT_TRUE(f.cache->Insert(Seq(0, 4), a));
  auto other = f.Serve(RequestId(2), Seq(0, 2), Rank(1));  // rank 1's addresses
  auto gone = f.Serve(RequestId(3), Seq(70, 1));
  ASSERT_TRUE(f.space->Free(RequestId(3)));
  const auto before = std::pair(f.cache->DebugDigest(), f.space->DebugDigest());
  auto same = [&] { return std::pair(f.cache->DebugDigest(), f.space->DebugDigest()) == before; };
  const auto t = Seq(0, 6);
  const std::vector<LogicalAddr> mixed{a[0], a[1], a[2], a[3], other[0], other[1]};
  const std::vector<LogicalAddr> freed{a[0], a[1], a[2], a[3], a[0], gone[0]};
  const std::vector<LogicalAddr> twice{a[0], a[1], a[2], a[3], a[2], a[2]};
  EXPECT_EQ(f.cache->Insert(t, std::span(a).first(3)).error().code(), ErrorCode::kInvalidArgument);
  EXPECT_TRUE(same());
  EXPECT_EQ(f.cache->Insert(Seq(0, 6), mixed).error().code(), ErrorCode::kInvalidArgument);
  EXPECT_TRUE(same());
  EXPECT_EQ(f.cache->Insert(Seq(0, 6), freed).error().code(), ErrorCode::kNotFound);
  EXPECT_TRUE(same());
  EXPECT_EQ(f.cache->Insert(Seq(0, 6), twice).error().code(), ErrorCode::kInvalidArgument);
  EXPECT_TRUE(same());
  auto m = f.cache->Match(Seq(0, 4));
  const auto before2 = std::pair(f.cache->DebugDigest(), f.space->DebugDigest());
  EXPECT_EQ(f.cache->Unlock(m).error().code(), ErrorCode::kFailedPrecondition);
  EXPECT_EQ(std::pair(f.cache->DebugDigest(), f.space->DebugDigest()), before2);
  ASSERT_TRUE(f.space->Free(RequestId(1)));
  (void)f.cache->Evict(100);
  const auto before3 = std::pair(f.cache->DebugDigest(), f.space->DebugDigest());
  EXPECT_EQ(f.cache->Lock(m).error().code(), ErrorCode::kNotFound);  // evicted: a stale match
  EXPECT_EQ(std::pair(f.cache->DebugDigest(), f.space->DebugDigest()), before3);
  EXPECT_EQ(SparsePrefixCache::Create(*f.space, Rank(2)).error().code(), ErrorCode::kOutOfRange);
  EXPECT_TRUE(f.cache->CheckInvariants());
}

// TP: the cached prefix stays striped a mod P, stored once in the node.
TEST(SparsePrefixCache, TpCachedPrefixStaysStripedAndIsStoredOnce) {
  auto backend = MakeCpuBackend({});
  TpConfig c;
  c.num_ranks = 4;
  c.num_groups = 1;
  c.entry_bytes = 16;
  c.attention = TpAttention::kAtHome;
  c.device_bytes_per_rank = 16 * 4;
  c.host_bytes_per_rank = 16 * 4;
  auto space = TpAddressSpace::Create(c, *backend).value();
  auto cache = SparsePrefixCache::Create(*space).value();
  const auto prompt = Seq(0, 16);
  ASSERT_TRUE(space->AddRequest(RequestId(1)));
  auto a = space->Allocate(RequestId(1), 16).value();
  ASSERT_TRUE(cache->Insert(prompt, a));
  ASSERT_TRUE(space->Free(RequestId(1)));
  for (std::uint64_t r = 2; r <= 5; ++r) {
    ASSERT_TRUE(space->AddRequest(RequestId(r)));
    auto m = cache->Match(prompt);
    ASSERT_EQ(m.length, 16u);
    ASSERT_TRUE(space->ShareInto(RequestId(r), m.addrs));
    ASSERT_TRUE(space->Allocate(RequestId(r), 2));
  }
  EXPECT_EQ(space->num_live_addresses(), 16u + 4 * 2);
  // The prefix: 4 per rank. Each request's 2 new tokens sit at positions 16 and 17 of a fresh
  // 64-token page (tp_address_space.h "Pages": a token's rank is its address's, a mod P): ranks
  // 0 and 1, 4 more each.
  for (std::uint16_t r = 0; r < 4; ++r) EXPECT_EQ(space->NumHomed(Rank(r)), r < 2 ? 8u : 4u);
  for (LogicalAddr x : a) EXPECT_EQ(space->Lookup(x, GroupId(0)).value().rank(), space->HomeOf(x));
  EXPECT_EQ(cache->Room(), 32u - 24);
  // Room for 12: the prompt is still held by the requests: evicting frees nothing, refused.
  EXPECT_EQ(cache->MakeRoom(12).error().code(), ErrorCode::kResourceExhausted);
  for (std::uint64_t r = 2; r <= 5; ++r) ASSERT_TRUE(space->Free(RequestId(r)));
  EXPECT_EQ(space->num_live_addresses(), 0u);  // the cache node was evicted above
  EXPECT_TRUE(cache->CheckInvariants());
  EXPECT_TRUE(space->CheckInvariants());
}

// Randomized: requests match, adopt, lock, extend, insert, finish; evictions run by count
// and by room. Every locked match stays fully cached with the same addresses and bytes;
// every cached address is live; the tree, the space and their invariants agree.
TEST(SparsePrefixCache, RandomServingKeepsLockedPrefixesAndSharedBytes) {
  ULA_TEST_SEEDED(seed, 20261202);
  std::mt19937_64 rng(seed);
  DpCache f(Dp(48, 48));
  struct Running {
    std::vector<std::uint32_t> tokens;
    SparsePrefixMatch match;
  };
  std::map<std::uint64_t, Running> running;
  std::uint64_t next = 1;
  auto tokens_of = [&] {  // 3 documents x few questions: lots of sharing
    std::vector<std::uint32_t> t = Seq(1000 * static_cast<std::uint32_t>(rng() % 3), 4 + static_cast<std::uint32_t>(rng() % 8));
    const std::uint32_t q = static_cast<std::uint32_t>(rng() % 4), n = 1 + static_cast<std::uint32_t>(rng() % 3);
    for (std::uint32_t i = 0; i < n; ++i) t.push_back(50 + q * 10 + i);
    return t;
  };
  for (int op = 0; op < 800; ++op) {
    const int kind = static_cast<int>(rng() % 4);
    if (kind <= 1 && running.size() < 6) {
      auto t = tokens_of();
      auto m = f.cache->Match(t);
      const std::uint64_t need = t.size() - m.length;
      ASSERT_TRUE(f.cache->Lock(m));
      if (!f.cache->MakeRoom(need)) {
        ASSERT_TRUE(f.cache->Unlock(m));
        continue;
      }
      const RequestId id(next++);
      ASSERT_TRUE(f.space->AddRequest(id, Rank(0)));
      ASSERT_TRUE(f.space->ShareInto(id, m.addrs));
      auto own = f.space->Allocate(id, static_cast<std::uint32_t>(need));
      ASSERT_TRUE(own) << own.error().ToString();
      for (LogicalAddr a : *own) {
        for (std::uint32_t g = 0; g < 2; ++g) ASSERT_TRUE(f.space->Write(a, GroupId(g), Bytes(a, g)));
      }
      running[id.value()] = {t, m};
    } else if (kind == 2 && !running.empty()) {  // a request finishes: cache it, unlock, free
      auto it = running.begin();
      std::advance(it, rng() % running.size());
      const RequestId id(it->first);
      auto addrs = f.space->AddressesOf(id).value();
      ASSERT_TRUE(f.cache->Insert(it->second.tokens, std::vector<LogicalAddr>(addrs.begin(), addrs.end())));
      ASSERT_TRUE(f.cache->Unlock(it->second.match));
      ASSERT_TRUE(f.space->Free(id));
      running.erase(it);
    } else {
      (void)f.cache->Evict(1 + rng() % 8);
    }
    for (const auto& [id, r] : running) {
      ASSERT_GE(f.cache->PeekLength(r.tokens), r.match.length) << "a locked prefix was evicted, op " << op;
      auto held = f.space->AddressesOf(RequestId(id)).value();
      f.ExpectReads(held);
      ASSERT_TRUE(std::equal(r.match.addrs.begin(), r.match.addrs.end(), held.begin()));
    }
    if (op % 40 == 0) {
      auto inv = f.cache->CheckInvariants();
      ASSERT_TRUE(inv) << inv.error().ToString();
      auto sinv = f.space->CheckInvariants();
      ASSERT_TRUE(sinv) << sinv.error().ToString();
    }
  }
  EXPECT_TRUE(f.cache->CheckInvariants());
}


// A finished request's cached KV stays in the exclusive tiers under the residency policy:
// when other requests' selections need the device, the cold cached prefix drifts to host
// (a swap, as any cold entry), stored once, and a later match reads it back from there.
TEST(SparsePrefixCache, ColdCachedPrefixDriftsToHostWithNoCopy) {
  DpCache f(Dp(4, 12));
  auto doc = f.Serve(RequestId(1), Seq(0, 4));  // fills the device
  ASSERT_TRUE(f.cache->Insert(Seq(0, 4), doc));
  ASSERT_TRUE(f.space->Free(RequestId(1)));
  for (LogicalAddr a : doc) EXPECT_EQ(f.space->Lookup(a, GroupId(0)).value().tier(), Tier::kDevice);
  auto other = f.Serve(RequestId(2), Seq(100, 4));  // on host: the device is full
  f.space->AdvanceRound();
  StepPlanner planner(*f.space);
  std::vector<SlotId> slots(4);
  for (std::uint16_t g = 0; g < 2; ++g) {
    auto st = planner.Step({Rank(0), GroupId(g), other, {{SelectionRun{RequestId(2), 4}}}}, slots);
    ASSERT_TRUE(st) << st.error().ToString();
    EXPECT_EQ(st->evictions, 4u);  // the cold cached entries were the victims
  }
  for (LogicalAddr a : doc) {
    EXPECT_EQ(f.space->Lookup(a, GroupId(0)).value().tier(), Tier::kHost);
    EXPECT_EQ(f.space->RefCount(a), 1u);  // the cache's reference only
  }
  EXPECT_EQ(f.space->num_live_addresses(), 8u);  // stored once: no copy on either tier
  EXPECT_EQ(f.space->NumUsed(Rank(0), GroupId(0), Tier::kDevice) + f.space->NumUsed(Rank(0), GroupId(0), Tier::kHost), 8u);
  f.ExpectReads(doc);
  // A new question about the document adopts the host-resident prefix and reads it.
  auto again = f.Serve(RequestId(3), Seq(0, 4));
  EXPECT_TRUE(std::equal(doc.begin(), doc.end(), again.begin()));
  f.space->AdvanceRound();
  auto st = planner.Step({Rank(0), GroupId(0), doc, {{SelectionRun{RequestId(3), 4}}}}, slots);
  ASSERT_TRUE(st) << st.error().ToString();
  for (std::size_t i = 0; i < 4; ++i) {
    const std::byte* p = f.space->DeviceSlotData(Rank(0), GroupId(0), slots[i]);
    ASSERT_NE(p, nullptr);
    const auto want = Bytes(doc[i], 0);
    EXPECT_TRUE(std::equal(want.begin(), want.end(), p));
  }
  EXPECT_TRUE(f.space->CheckInvariants());
}

// Cache-aware routing (DP): the rank holding the longest prefix, unless the loads are
// imbalanced or the match is too short; then the least loaded / the emptiest cache.
TEST(PrefixRouter, RoutesToTheLongestPrefixUnlessImbalancedOrTooShort) {
  auto backend = MakeCpuBackend({});
  auto space = AddressSpace::Create(Dp(64, 64, 3), *backend).value();
  std::vector<std::unique_ptr<SparsePrefixCache>> owned;
  std::vector<const SparsePrefixCache*> caches;
  for (std::uint16_t r = 0; r < 3; ++r) {
    owned.push_back(SparsePrefixCache::Create(*space, Rank(r)).value());
    caches.push_back(owned.back().get());
  }
  auto cache_doc = [&](std::uint16_t r, const std::vector<std::uint32_t>& t, std::uint64_t id) {
    ASSERT_TRUE(space->AddRequest(RequestId(id), Rank(r)));
    auto a = space->Allocate(RequestId(id), static_cast<std::uint32_t>(t.size())).value();
    ASSERT_TRUE(owned[r]->Insert(t, a));
    ASSERT_TRUE(space->Free(RequestId(id)));
  };
  cache_doc(1, Seq(0, 20), 1);
  cache_doc(0, Seq(500, 4), 2);
  cache_doc(2, Seq(900, 2), 3);
  auto q = Seq(0, 20);
  q.push_back(7);
  const std::vector<std::uint64_t> even{3, 3, 3};
  auto d = RouteByPrefix(caches, even, q).value();
  EXPECT_EQ(d.rank, Rank(1));
  EXPECT_EQ(d.matched, 20u);
  EXPECT_EQ(d.why, RouteDecision::Why::kPrefix);
  // A prefix of 5 of 21 tokens (< 0.3): to the cache with the fewest tokens (rank 2).
  auto short_match = Seq(0, 5);
  for (std::uint32_t i = 0; i < 16; ++i) short_match.push_back(10000 + i);
  d = RouteByPrefix(caches, even, short_match).value();
  EXPECT_EQ(d.rank, Rank(2));
  EXPECT_EQ(d.why, RouteDecision::Why::kRoom);
  // Imbalanced loads (100 vs 10: > 64 apart and > 1.5x): the least loaded, prefix or not.
  const std::vector<std::uint64_t> skewed{10, 100, 50};
  d = RouteByPrefix(caches, skewed, q).value();
  EXPECT_EQ(d.rank, Rank(0));
  EXPECT_EQ(d.why, RouteDecision::Why::kImbalance);
  EXPECT_EQ(d.matched, 0u);
  // Bad input.
  const std::vector<std::uint64_t> two{1, 1};
  EXPECT_EQ(RouteByPrefix(caches, two, q).error().code(), ErrorCode::kInvalidArgument);
  std::vector<const SparsePrefixCache*> with_null{caches[0], nullptr};
  EXPECT_EQ(RouteByPrefix(with_null, two, q).error().code(), ErrorCode::kInvalidArgument);
}

}  // namespace
}  // namespace ula
