#include "ula/prefix_cache.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <numeric>

#include "ula/unified_buffer.h"

namespace ula {
namespace {

constexpr std::uint32_t kPage = 4;  // tokens per page
constexpr BlockKind kState(0), kKv(1), kSwa(2);

// Page = 1 unit of 64 B; checkpoint = state 3 units + ring 1 unit.
std::unique_ptr<UnifiedBuffer> Buffer(std::uint64_t units) {
  UnifiedBufferConfig c;
  c.alignment = 64;
  c.capacity_bytes = units * 64;
  c.kinds = {{"state", 192, BufferEnd::kLow}, {"kv", 64, BufferEnd::kHigh}, {"swa", 64, BufferEnd::kLow}};
  c.padding_kind = kKv;
  c.padding_blocks = 0;
  return UnifiedBuffer::Create(c).value();
}

std::unique_ptr<PrefixCache> Cache(HybridAllocator& a) {
  return PrefixCache::Create(PrefixCacheConfig{.page_tokens = kPage}, &a).value();
}

std::vector<std::uint32_t> Tokens(std::uint32_t first, std::size_t n) {
  std::vector<std::uint32_t> t(n);
  std::iota(t.begin(), t.end(), first);
  return t;
}

Checkpoint NewCheckpoint(HybridAllocator& a) {
  auto ids = a.AllocateDemand(Demand::Of(3).Add(kState, 1).Add(kSwa, 1)).value();
  return Checkpoint{ids[0], ids[1]};
}

// Inserts a finished sequence with checkpoints at the given positions (and its end).
void InsertSequence(PrefixCache& cache, HybridAllocator& a, const std::vector<std::uint32_t>& tokens,
                    std::vector<std::uint32_t> checkpoint_positions) {
  const auto pages = a.AllocateDemand(Demand::Of(3).Add(kKv, (tokens.size() + kPage - 1) / kPage)).value();
  std::vector<PositionedCheckpoint> cps;
  checkpoint_positions.push_back(static_cast<std::uint32_t>(tokens.size()));
  for (auto p : checkpoint_positions) cps.push_back({p, NewCheckpoint(a)});
  ASSERT_TRUE(cache.Insert(tokens, pages, cps));
}

TEST(PrefixCache, MatchReturnsTheDeepestCheckpointNotTheDeepestKv) {
  auto a = Buffer(256);
  auto cache = Cache(*a);
  InsertSequence(*cache, *a, Tokens(0, 22), {8});  // KV for 22 tokens, checkpoints at 8 and 22
  auto query = Tokens(0, 20);
  query.push_back(999);
  auto m = cache->Match(query, query.size() - 1);
  EXPECT_EQ(m.length, 8u);  // KV up to 20 exists, but no state past 8
  EXPECT_EQ(m.pages.size(), 2u);
  auto whole = Tokens(0, 22);
  whole.push_back(5);
  EXPECT_EQ(cache->Match(whole, whole.size() - 1).length, 22u);  // partial last page with end checkpoint
  EXPECT_EQ(cache->Match(Tokens(1, 10), 9).length, 0u);
  EXPECT_TRUE(cache->Holds(Tokens(0, 22)));
  EXPECT_FALSE(cache->Holds(Tokens(0, 12)));
  EXPECT_TRUE(cache->CheckInvariants());
}

TEST(PrefixCache, DuplicatesAreFreedOnInsert) {
  auto a = Buffer(256);
  auto cache = Cache(*a);
  InsertSequence(*cache, *a, Tokens(0, 16), {});
  const auto live = a->Stats().live_bytes;
  InsertSequence(*cache, *a, Tokens(0, 16), {});  // same tokens: its pages and checkpoint are duplicates
  EXPECT_EQ(a->Stats().live_bytes, live);
  EXPECT_EQ(cache->num_nodes(), 1u);  // one radix node: the edge is not cut at pages
}

TEST(PrefixCache, LockedNodesAreNeverEvictedAndTheirBlocksNeverMove) {
  auto a = Buffer(64);
  auto cache = Cache(*a);
  InsertSequence(*cache, *a, Tokens(0, 16), {});
  InsertSequence(*cache, *a, Tokens(100, 16), {});
  auto q = Tokens(0, 16);
  q.push_back(7);
  auto m = cache->Match(q, 16);
  ASSERT_EQ(m.length, 16u);
  ASSERT_TRUE(cache->Lock(m));
  std::vector<std::uint64_t> before(m.pages.size());
  ASSERT_TRUE(a->Translate(m.pages, before));
  // Ask for more than everything unlocked: evicts the other sequence, then gives up.
  auto r = cache->MakeRoom(Demand::Of(3).Add(kKv, 60), EvictionRule::kAllocationAware);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code(), ErrorCode::kResourceExhausted);
  EXPECT_TRUE(cache->Holds(Tokens(0, 16)));
  EXPECT_FALSE(cache->Holds(Tokens(100, 16)));
  a->Compact();
  std::vector<std::uint64_t> after(m.pages.size());
  ASSERT_TRUE(a->Translate(m.pages, after));
  EXPECT_EQ(before, after);
  ASSERT_TRUE(cache->Unlock(m));
  EXPECT_TRUE(cache->CheckInvariants());
}

TEST(PrefixCache, AllocationAwareEvictionStopsAsSoonAsTheDemandFits) {
  // Eight cached sequences of 8 tokens (2 pages + 2 checkpoints of 4 units each = 10 units).
  for (EvictionRule rule : {EvictionRule::kNaive, EvictionRule::kAllocationAware}) {
    auto a = Buffer(84);
    auto cache = Cache(*a);
    for (std::uint32_t s = 0; s < 8; ++s) InsertSequence(*cache, *a, Tokens(1000 * s, 8), {4});
    ASSERT_EQ(a->Stats().middle_bytes + a->Stats().hole_bytes, 4 * 64u);
    // A new request wants 14 pages: 10 more than free.
    const Demand d = Demand::Of(3).Add(kKv, 14);
    auto stats = cache->MakeRoom(d, rule);
    ASSERT_TRUE(stats);
    EXPECT_TRUE(a->CanAllocate(d));
    int retained = 0;
    for (std::uint32_t s = 0; s < 8; ++s) retained += cache->Holds(Tokens(1000 * s, 8)) ? 1 : 0;
    std::printf("rule %s: evicted %u nodes (%u pages, %u checkpoints), %d of 8 retained\n", EvictionRuleName(rule),
                stats->nodes, stats->pages, stats->checkpoints, retained);
    if (rule == EvictionRule::kAllocationAware) {
      // Each evicted sequence frees 10 units: one sequence is enough.
      EXPECT_EQ(stats->nodes, 2u);
      EXPECT_EQ(retained, 7);
    } else {
      // Counting only KV pages, 10 pages means 5 sequences.
      EXPECT_EQ(stats->pages, 10u);
      EXPECT_EQ(retained, 3);
    }
    EXPECT_TRUE(cache->CheckInvariants());
    EXPECT_TRUE(a->CheckInvariants());
  }
}

TEST(PrefixCache, LocksPinTheStateOnlyAtTheMatchedNodeSoAncestorStatesCanBeTombstoned) {
  auto a = Buffer(128);
  auto cache = Cache(*a);
  InsertSequence(*cache, *a, Tokens(0, 8), {4});  // checkpoints at 4 and 8
  auto q = Tokens(0, 8);
  q.push_back(1);
  auto m = cache->Match(q, 8);
  ASSERT_EQ(m.length, 8u);
  ASSERT_TRUE(cache->Lock(m));
  const auto before = cache->Metrics();
  EXPECT_EQ(before.state.protected_bytes, 192u);  // only the state at 8
  EXPECT_EQ(before.state.evictable, 192u);        // the state at 4
  EXPECT_EQ(before.kv.protected_bytes, 2 * 64u);  // KV of the whole path
  // Evicting one state tombstones the one at 4: its KV stays, the locked match is intact.
  const auto stats = cache->Evict(0, 1);
  EXPECT_EQ(stats.checkpoints, 1u);
  EXPECT_EQ(stats.tombstones, 1u);
  EXPECT_EQ(stats.pages, 0u);
  EXPECT_FALSE(cache->Holds(Tokens(0, 4)));
  EXPECT_TRUE(cache->Holds(Tokens(0, 8)));
  auto at5 = cache->Match(Tokens(0, 5), 5);
  EXPECT_EQ(at5.length, 0u);
  EXPECT_EQ(at5.kv_length, 5u);  // the KV is still cached past the tombstone
  EXPECT_EQ(at5.branch, 5u);
  EXPECT_EQ(cache->Metrics().tombstones, 1u);
  EXPECT_EQ(cache->Evict(0, 5).checkpoints, 0u);  // the locked state is not evictable
  ASSERT_TRUE(cache->Unlock(m));
  for (const auto& b : a->LiveBlocks()) EXPECT_EQ(b.pins, 0u);
  // Evicting the leaf also removes the tombstoned node above it (a stateless leaf).
  const auto leaf = cache->Evict(1, 0);
  EXPECT_EQ(leaf.nodes, 2u);
  EXPECT_EQ(leaf.pages, 2u);
  EXPECT_EQ(cache->num_nodes(), 0u);
  EXPECT_EQ(a->Stats().live_bytes, 0u);
  EXPECT_TRUE(cache->CheckInvariants());
}

TEST(PrefixCache, NodesSplitAtTheFirstDifferingTokenAndABranchInsideAPageGetsItsOwnCopy) {
  auto a = Buffer(256);
  auto cache = Cache(*a);
  const auto x = Tokens(0, 10);  // pages [0..3] [4..7] [8,9]
  InsertSequence(*cache, *a, x, {});
  auto y = Tokens(0, 6);  // shares 6 tokens: diverges inside page 1
  for (std::uint32_t t : {50u, 51u, 52u, 53u}) y.push_back(t);
  // Before y is cached: no state at 6, but the KV runs there: the branching point.
  auto probe = cache->Match(y, 9);
  EXPECT_EQ(probe.length, 0u);
  EXPECT_EQ(probe.kv_length, 6u);
  EXPECT_EQ(probe.branch, 6u);
  auto xm = cache->Match(x, 10);
  InsertSequence(*cache, *a, y, {6});
  EXPECT_EQ(cache->num_nodes(), 3u);  // [0,6) [6,10) [6,10)
  auto ym = cache->Match(y, 10);
  ASSERT_EQ(ym.length, 10u);
  ASSERT_EQ(ym.pages.size(), 3u);
  EXPECT_EQ(ym.pages[0], xm.pages[0]);  // shared full page
  EXPECT_NE(ym.pages[1], xm.pages[1]);  // y's own copy of the page it diverges in
  auto again = cache->Match(x, 10);
  EXPECT_EQ(again.pages, xm.pages);  // x still reads its own page 1
  auto at6 = cache->Match(Tokens(0, 7), 7);
  EXPECT_EQ(at6.length, 6u);  // a checkpoint at a position inside a page
  ASSERT_EQ(at6.pages.size(), 2u);
  EXPECT_EQ(at6.pages[1], xm.pages[1]);
  EXPECT_EQ(at6.kv_length, 7u);
  EXPECT_TRUE(cache->CheckInvariants());
  // Evicting y's branch frees its two pages (head copy included), x keeps everything.
  ASSERT_TRUE(cache->Lock(again));
  const auto ev = cache->Evict(1, 0);
  EXPECT_EQ(ev.pages, 2u);
  EXPECT_TRUE(cache->Holds(x));
  EXPECT_FALSE(cache->Holds(y));
  ASSERT_TRUE(cache->Unlock(again));
  EXPECT_TRUE(cache->CheckInvariants());
}

TEST(PrefixCache, MatchCopyOnWriteGivesTheRequestItsOwnStateEvictingWhileLocked) {
  // Room: 2 sequences of 8 tokens with one checkpoint each (2 pages + 4 units) = 12 units.
  auto a = Buffer(14);
  auto cache = Cache(*a);
  InsertSequence(*cache, *a, Tokens(0, 8), {});
  InsertSequence(*cache, *a, Tokens(100, 8), {});
  auto cp = cache->Match(Tokens(0, 8), 8).checkpoint;
  std::memset(a->Bytes(cp.state)->data(), 0x5a, 192);
  auto q = Tokens(0, 8);
  q.push_back(3);
  // The copy needs 4 units, 2 are free: the other sequence (least recently used) goes.
  auto m = cache->MatchCopyOnWrite(q, 8, EvictionRule::kAllocationAware);
  ASSERT_TRUE(m) << m.error().ToString();
  ASSERT_EQ(m->length, 8u);
  ASSERT_TRUE(m->copy.valid());
  EXPECT_NE(m->copy.state, m->checkpoint.state);
  EXPECT_EQ(std::memcmp(a->Bytes(m->copy.state)->data(), a->Bytes(cp.state)->data(), 192), 0);
  EXPECT_TRUE(cache->Holds(Tokens(0, 8)));
  EXPECT_FALSE(cache->Holds(Tokens(100, 8)));
  EXPECT_EQ(a->Free(m->checkpoint.state).error().code(), ErrorCode::kFailedPrecondition);  // locked: pinned
  // A running request takes the 4 free units; nothing else is evictable: the next
  // copy-on-write match fails and leaves its lock released.
  auto running = a->AllocateDemand(Demand::Of(3).Add(kKv, 4)).value();
  auto full = cache->MatchCopyOnWrite(q, 8, EvictionRule::kAllocationAware);
  ASSERT_FALSE(full);
  EXPECT_EQ(full.error().code(), ErrorCode::kResourceExhausted);
  ASSERT_TRUE(cache->Unlock(*m));
  EXPECT_EQ(cache->Unlock(*m).error().code(), ErrorCode::kFailedPrecondition);  // the failed call left no lock
  ASSERT_TRUE(a->Free(m->copy.state));
  ASSERT_TRUE(a->Free(m->copy.window));
  for (BlockId b : running) ASSERT_TRUE(a->Free(b));
  EXPECT_TRUE(cache->CheckInvariants());
}

TEST(PrefixCache, ChunkedPrefillInsertsEachChunkAndTheLockMovesWithIt) {
  auto a = Buffer(256);
  auto cache = Cache(*a);
  const auto t = Tokens(0, 14);
  // Chunk 1: tokens [0, 6) with a copy of the running state at 6.
  auto p1 = a->AllocateDemand(Demand::Of(3).Add(kKv, 2)).value();
  std::vector<PositionedCheckpoint> c1 = {{6, NewCheckpoint(*a)}};
  auto h1 = cache->InsertChunk(std::span(t).first(6), p1, c1, PrefixMatch{});
  ASSERT_TRUE(h1) << h1.error().ToString();
  EXPECT_EQ(h1->length, 6u);
  EXPECT_EQ(h1->pages, p1);
  // Chunk 2: [0, 14); page 1 was partial and now belongs to the tree: the request copied it.
  auto fresh = a->AllocateDemand(Demand::Of(3).Add(kKv, 3)).value();
  std::vector<BlockId> p2 = {p1[0], fresh[0], fresh[1], fresh[2]};
  std::vector<PositionedCheckpoint> c2 = {{14, NewCheckpoint(*a)}};
  auto h2 = cache->InsertChunk(t, p2, c2, *h1);
  ASSERT_TRUE(h2) << h2.error().ToString();
  EXPECT_EQ(h2->length, 14u);
  EXPECT_EQ(h2->pages, p2);
  EXPECT_EQ(cache->Unlock(*h1).error().code(), ErrorCode::kFailedPrecondition);  // the lock moved
  EXPECT_EQ(cache->Metrics().kv.evictable, 0u);  // every node is on the held path
  // Only the state at 6 is evictable (narrow locks): it becomes a tombstone.
  const auto ev = cache->Evict(1000, 1000);
  EXPECT_EQ(ev.nodes, 0u);
  EXPECT_EQ(ev.tombstones, 1u);
  EXPECT_FALSE(cache->Holds(std::span(t).first(6)));
  EXPECT_TRUE(cache->Holds(t));
  ASSERT_TRUE(cache->Unlock(*h2));
  EXPECT_EQ(cache->num_nodes(), 2u);
  // A chunk without a checkpoint at its end is refused and changes nothing.
  const auto blocks = a->LiveBlocks();
  auto p3 = a->AllocateDemand(Demand::Of(3).Add(kKv, 1)).value();
  EXPECT_EQ(cache->InsertChunk(Tokens(500, 4), p3, {}, PrefixMatch{}).error().code(), ErrorCode::kInvalidArgument);
  ASSERT_TRUE(a->Free(p3[0]));
  EXPECT_EQ(a->LiveBlocks(), blocks);
  EXPECT_TRUE(cache->CheckInvariants());
}

void FillBlock(HybridAllocator& a, BlockId id, std::uint8_t value) {
  auto span = a.Bytes(id).value();
  std::memset(span.data(), value, span.size());
}
bool BlockIs(HybridAllocator& a, BlockId id, std::uint8_t value) {
  auto span = a.Bytes(id).value();
  return std::all_of(span.begin(), span.end(), [&](std::byte b) { return b == std::byte(value); });
}

TEST(PrefixCache, TheHostTierTakesEvictedCheckpointsAndGivesThemBackExclusively) {
  auto backend = MakeCpuBackend(CpuBackendOptions{.copy_threads = 1});  // copies run asynchronously
  UnifiedBufferConfig c;
  c.alignment = 64;
  c.capacity_bytes = 256 * 64;
  c.kinds = {{"state", 192, BufferEnd::kLow}, {"kv", 64, BufferEnd::kHigh}, {"swa", 64, BufferEnd::kLow}};
  c.padding_kind = kKv;
  auto device = backend->CreateArena(Tier::kDevice, Rank(0), c.capacity_bytes).value();
  auto a = UnifiedBuffer::Create(c, device).value();
  auto host = backend->CreateArena(Tier::kHost, Rank(0), 2 * (192 + 64)).value();
  auto cache = Cache(*a);
  EXPECT_EQ(cache->AttachHostTier({backend.get(), device.id, host, 3}).error().code(), ErrorCode::kInvalidArgument);
  ASSERT_TRUE(cache->AttachHostTier({backend.get(), device.id, host, 2}));
  InsertSequence(*cache, *a, Tokens(0, 8), {4});
  const auto at8 = cache->Match(Tokens(0, 8), 8).checkpoint;
  FillBlock(*a, at8.state, 0x3c);
  FillBlock(*a, at8.window, 0x4d);
  (void)cache->Match(Tokens(0, 4), 4);  // the state at 4 is used more recently
  const auto live = a->Stats().live_bytes;
  auto ev = cache->Evict(0, 1);
  EXPECT_EQ(ev.offloaded, 1u);
  EXPECT_EQ(ev.pages, 0u);
  EXPECT_EQ(a->Stats().live_bytes, live - 256);  // exclusive: the device blocks are gone
  const auto junk_blocks = a->AllocateDemand(Demand::Of(3).Add(kState, 1).Add(kSwa, 1)).value();
  for (BlockId junk : junk_blocks) {
    FillBlock(*a, junk, 0xee);  // overwrite the bytes the checkpoint left behind
    ASSERT_TRUE(a->Free(junk));
  }
  EXPECT_FALSE(cache->Holds(Tokens(0, 8)));
  EXPECT_TRUE(cache->HoldsOnHost(Tokens(0, 8)));
  auto q = Tokens(0, 8);
  q.push_back(1);
  const auto probe = cache->Match(q, 8);
  EXPECT_EQ(probe.length, 4u);
  EXPECT_EQ(probe.host_length, 8u);  // a host hit
  // Copy-on-write brings it back first: the same bytes, on the device only.
  auto m = cache->MatchCopyOnWrite(q, 8, EvictionRule::kAllocationAware);
  ASSERT_TRUE(m) << m.error().ToString();
  EXPECT_EQ(m->length, 8u);
  EXPECT_TRUE(BlockIs(*a, m->checkpoint.state, 0x3c));
  EXPECT_TRUE(BlockIs(*a, m->checkpoint.window, 0x4d));
  EXPECT_TRUE(BlockIs(*a, m->copy.state, 0x3c));
  EXPECT_FALSE(cache->HoldsOnHost(Tokens(0, 8)));
  EXPECT_EQ(cache->Metrics().host_checkpoints, 0u);
  EXPECT_EQ(cache->Metrics().host_hits, 1u);
  ASSERT_TRUE(cache->Unlock(*m));
  ASSERT_TRUE(a->Free(m->copy.state));
  ASSERT_TRUE(a->Free(m->copy.window));
  // Three checkpoints for two host slots: the least recently used host copy is dropped, of
  // the path's two (used together) the root side's, 4, as SGLang orders a path (,
  // item 4); its node keeps its KV, a tombstone above the leaf whose state is on the host.
  InsertSequence(*cache, *a, Tokens(100, 4), {});
  ev = cache->Evict(0, 3);
  EXPECT_EQ(ev.offloaded, 3u);
  EXPECT_TRUE(cache->HoldsOnHost(Tokens(0, 8)));
  EXPECT_FALSE(cache->HoldsOnHost(Tokens(0, 4)));
  EXPECT_TRUE(cache->HoldsOnHost(Tokens(100, 4)));
  EXPECT_EQ(cache->Match(q, 8).kv_length, 8u);
  EXPECT_EQ(cache->Metrics().host_checkpoints, 2u);
  EXPECT_EQ(cache->num_checkpoints(), 0u);
  EXPECT_TRUE(cache->CheckInvariants());
  EXPECT_TRUE(a->CheckInvariants());
}

// Delegates to a real backend; refuses every Submit while `fail` is set.
class FailingBackend final : public Backend {
 public:
  explicit FailingBackend(std::unique_ptr<Backend> inner) : inner_(std::move(inner)) {}
  bool fail = false;
  int fail_after = -1;  // >= 0: that many more Submits succeed, then every one fails
  Result<Arena> CreateArena(Tier tier, Rank rank, std::uint64_t bytes) override {
    return inner_->CreateArena(tier, rank, bytes);
  }
  Status DestroyArena(ArenaId id) override { return inner_->DestroyArena(id); }
  Result<Arena> GetArena(ArenaId id) const override { return inner_->GetArena(id); }
  bool holds_bytes() const override { return inner_->holds_bytes(); }
  Result<Fence> Submit(CopyBatch batch) override {
    if (fail_after == 0) fail = true;
    if (fail_after > 0) --fail_after;
    if (fail) return MakeError(ErrorCode::kIo, "injected copy failure");
    return inner_->Submit(std::move(batch));
  }
  Status Wait(Fence fence) override { return inner_->Wait(fence); }
  void WaitAll() override { inner_->WaitAll(); }
  TransferCounters counters() const override { return inner_->counters(); }
  void ResetCounters() override { inner_->ResetCounters(); }

 private:
  std::unique_ptr<Backend> inner_;
};

TEST(PrefixCache, AFailedHostCopyPublishesNothing) {
  FailingBackend backend(MakeCpuBackend(CpuBackendOptions{.copy_threads = 1}));
  UnifiedBufferConfig c;
  c.alignment = 64;
  c.capacity_bytes = 256 * 64;
  c.kinds = {{"state", 192, BufferEnd::kLow}, {"kv", 64, BufferEnd::kHigh}, {"swa", 64, BufferEnd::kLow}};
  c.padding_kind = kKv;
  auto device = backend.CreateArena(Tier::kDevice, Rank(0), c.capacity_bytes).value();
  auto a = UnifiedBuffer::Create(c, device).value();
  auto host = backend.CreateArena(Tier::kHost, Rank(0), 4 * (192 + 64)).value();
  auto cache = Cache(*a);
  ASSERT_TRUE(cache->AttachHostTier({&backend, device.id, host, 4}));
  InsertSequence(*cache, *a, Tokens(0, 8), {4});
  (void)cache->Match(Tokens(0, 4), 4);  // the state at 4 is used more recently
  // Offloading fails: the LRU checkpoint (8, a leaf) is evicted as without a host tier.
  backend.fail = true;
  auto ev = cache->Evict(0, 1);
  EXPECT_EQ(ev.offloaded, 0u);
  EXPECT_EQ(ev.nodes, 1u);
  EXPECT_FALSE(cache->HoldsOnHost(Tokens(0, 8)));
  EXPECT_EQ(cache->Metrics().host_checkpoints, 0u);
  // Cached again, the state at 8 goes to the host; bringing it back fails and publishes
  // nothing: the request gets the device match, the buffer and the host copy stay as they were.
  backend.fail = false;
  InsertSequence(*cache, *a, Tokens(0, 8), {});
  (void)cache->Match(Tokens(0, 4), 4);
  ev = cache->Evict(0, 1);
  ASSERT_EQ(ev.offloaded, 1u);
  backend.fail = true;
  const auto blocks = a->LiveBlocks();
  auto q = Tokens(0, 8);
  q.push_back(2);
  auto m = cache->MatchCopyOnWrite(q, 8, EvictionRule::kAllocationAware);
  ASSERT_TRUE(m);
  EXPECT_EQ(m->length, 4u);  // the request starts from the device match instead
  EXPECT_EQ(m->host_length, 8u);
  ASSERT_TRUE(cache->Unlock(*m));
  ASSERT_TRUE(a->Free(m->copy.state));
  ASSERT_TRUE(a->Free(m->copy.window));
  EXPECT_EQ(a->LiveBlocks(), blocks);
  EXPECT_TRUE(cache->HoldsOnHost(Tokens(0, 8)));
  EXPECT_TRUE(cache->CheckInvariants());
  // Once copies work again, the same call brings it back.
  backend.fail = false;
  m = cache->MatchCopyOnWrite(q, 8, EvictionRule::kAllocationAware);
  ASSERT_TRUE(m) << m.error().ToString();
  EXPECT_EQ(m->length, 8u);
  ASSERT_TRUE(cache->Unlock(*m));
  ASSERT_TRUE(a->Free(m->copy.state));
  ASSERT_TRUE(a->Free(m->copy.window));
  EXPECT_TRUE(cache->CheckInvariants());
}

// KV pages on the host: an evicted leaf whose checkpoint went to the host
// goes there whole, and comes back with its path, copied then published; failed copies
// publish nothing.
TEST(PrefixCache, KvPagesGoToTheHostWithTheirLeafAndComeBackExclusively) {
  FailingBackend backend(MakeCpuBackend(CpuBackendOptions{.copy_threads = 1}));
  UnifiedBufferConfig c;
  c.alignment = 64;
  c.capacity_bytes = 256 * 64;
  c.kinds = {{"state", 192, BufferEnd::kLow}, {"kv", 64, BufferEnd::kHigh}, {"swa", 64, BufferEnd::kLow}};
  c.padding_kind = kKv;
  auto device = backend.CreateArena(Tier::kDevice, Rank(0), c.capacity_bytes).value();
  auto a = UnifiedBuffer::Create(c, device).value();
  auto host = backend.CreateArena(Tier::kHost, Rank(0), 2 * (192 + 64) + 8 * 64).value();
  auto cache = Cache(*a);
  EXPECT_EQ(cache->AttachHostTier({&backend, device.id, host, 2, 9}).error().code(), ErrorCode::kInvalidArgument);
  ASSERT_TRUE(cache->AttachHostTier({&backend, device.id, host, 2, 8}));
  InsertSequence(*cache, *a, Tokens(0, 8), {4});  // nodes [0, 4) and [4, 8), one page each
  auto q = Tokens(0, 8);
  q.push_back(3);
  auto full = cache->Match(q, 8);
  ASSERT_EQ(full.length, 8u);
  FillBlock(*a, full.pages[1], 0x5a);
  FillBlock(*a, full.checkpoint.state, 0x6b);
  // 255 pages: both checkpoints go to the host (8 units), then the leaf [4, 8) with its page.
  const Demand big = Demand::Of(3).Add(kKv, 255);
  auto ev = cache->MakeRoom(big, EvictionRule::kAllocationAware);
  ASSERT_TRUE(ev) << ev.error().ToString();
  EXPECT_EQ(ev->offloaded, 2u);
  EXPECT_EQ(ev->offloaded_pages, 1u);
  EXPECT_EQ(ev->nodes, 0u);
  EXPECT_TRUE(cache->KvOnHost(Tokens(0, 8)));
  EXPECT_FALSE(cache->KvOnHost(Tokens(0, 4)));
  EXPECT_EQ(cache->Metrics().host_pages, 1u);
  EXPECT_TRUE(cache->CheckInvariants()) << cache->CheckInvariants().error().ToString();
  auto junk = a->AllocateDemand(big).value();
  for (BlockId j : junk) FillBlock(*a, j, 0xee);  // overwrite what the leaf left behind
  for (BlockId j : junk) ASSERT_TRUE(a->Free(j));
  const auto probe = cache->Match(q, 8);
  EXPECT_EQ(probe.length, 0u);       // no device checkpoint
  EXPECT_EQ(probe.kv_length, 8u);    // the host node counts
  EXPECT_EQ(probe.host_length, 8u);  // a host hit
  // A failed host -> device copy publishes nothing: the device match, the host copies stay.
  // First every copy fails, then only the pages' (the checkpoint's state and ring landed).
  const auto blocks = a->LiveBlocks();
  for (int after : {0, 2}) {
    backend.fail_after = after;
    auto m = cache->MatchCopyOnWrite(q, 8, EvictionRule::kAllocationAware);
    backend.fail = false;
    backend.fail_after = -1;
    ASSERT_TRUE(m);
    EXPECT_EQ(m->length, 0u) << after;
    EXPECT_EQ(a->LiveBlocks(), blocks) << after;
    EXPECT_TRUE(cache->KvOnHost(Tokens(0, 8))) << after;
    EXPECT_TRUE(cache->HoldsOnHost(Tokens(0, 8))) << after;
  }
  // Copies work again: the page and the checkpoint come back with their bytes, exclusively.
  auto m = cache->MatchCopyOnWrite(q, 8, EvictionRule::kAllocationAware);
  ASSERT_TRUE(m) << m.error().ToString();
  EXPECT_EQ(m->length, 8u);
  EXPECT_TRUE(BlockIs(*a, m->pages[1], 0x5a));
  EXPECT_TRUE(BlockIs(*a, m->checkpoint.state, 0x6b));
  EXPECT_FALSE(cache->KvOnHost(Tokens(0, 8)));
  EXPECT_EQ(cache->Metrics().host_pages, 0u);
  EXPECT_EQ(cache->Metrics().host_page_hits, 1u);
  ASSERT_TRUE(cache->Unlock(*m));
  ASSERT_TRUE(a->Free(m->copy.state));
  ASSERT_TRUE(a->Free(m->copy.window));
  EXPECT_TRUE(cache->CheckInvariants()) << cache->CheckInvariants().error().ToString();
  // A failed device -> host copy of the pages: the leaf is evicted as without a host tier.
  ASSERT_EQ(cache->Evict(0, 1).offloaded, 1u);  // the checkpoint at 8 to the host again (4's is there)
  backend.fail = true;
  ev = cache->MakeRoom(Demand::Of(3).Add(kKv, 255), EvictionRule::kAllocationAware);
  ASSERT_TRUE(ev) << ev.error().ToString();
  EXPECT_EQ(ev->offloaded_pages, 0u);
  EXPECT_EQ(ev->nodes, 1u);
  EXPECT_FALSE(cache->HoldsOnHost(Tokens(0, 8)));
  EXPECT_EQ(cache->Metrics().host_pages, 0u);
  // Inserting the same tokens through a host node replaces it with the device pages.
  backend.fail = false;
  ASSERT_TRUE(cache->MakeRoom(Demand::Of(3).Add(kKv, 256), EvictionRule::kAllocationAware));
  EXPECT_TRUE(cache->KvOnHost(Tokens(0, 4)));
  InsertSequence(*cache, *a, Tokens(0, 8), {});
  EXPECT_FALSE(cache->KvOnHost(Tokens(0, 4)));
  EXPECT_FALSE(cache->HoldsOnHost(Tokens(0, 4)));
  EXPECT_TRUE(cache->Holds(Tokens(0, 8)));
  EXPECT_TRUE(cache->CheckInvariants()) << cache->CheckInvariants().error().ToString();
}

// a host node under the root that is being loaded back holds LoadBack's KV
// lock while its parent, the root, holds none (the root is never locked). The invariant
// check took that for "a host node locked more than its parent", so any eviction LoadBack
// needed for room failed the whole-structure check; SGLang's eviction order (root side first)
// offloads root children's KV more often, which is how the ASan tree found it.
TEST(PrefixCache, AHostNodeUnderTheRootIsLoadedBackWhileEvicting) {
  auto backend = MakeCpuBackend(CpuBackendOptions{.copy_threads = 1});
  UnifiedBufferConfig c;
  c.alignment = 64;
  c.capacity_bytes = 32 * 64;
  c.kinds = {{"state", 192, BufferEnd::kLow}, {"kv", 64, BufferEnd::kHigh}, {"swa", 64, BufferEnd::kLow}};
  c.padding_kind = kKv;
  auto device = backend->CreateArena(Tier::kDevice, Rank(0), c.capacity_bytes).value();
  auto a = UnifiedBuffer::Create(c, device).value();
  auto host = backend->CreateArena(Tier::kHost, Rank(0), 2 * (192 + 64) + 4 * 64).value();
  auto cache = Cache(*a);
  ASSERT_TRUE(cache->AttachHostTier({backend.get(), device.id, host, 2, 4}));
  InsertSequence(*cache, *a, Tokens(0, 4), {});  // one node under the root: a page and a checkpoint
  ASSERT_TRUE(cache->MakeRoom(Demand::Of(3).Add(kKv, 32), EvictionRule::kAllocationAware));
  ASSERT_TRUE(cache->KvOnHost(Tokens(0, 4)));  // its checkpoint and its page on the host
  InsertSequence(*cache, *a, Tokens(100, 8), {4});  // device checkpoints to evict for the load and its copy
  const auto junk = a->AllocateDemand(Demand::Of(3).Add(kKv, 32 - 10 - 4)).value();  // 4 units left
  Status during = Ok();
  int victims = 0;
  cache->SetEvictionObserver([&] {
    ++victims;
    if (during) during = cache->CheckInvariants();
  });
  auto q = Tokens(0, 4);
  q.push_back(7);
  auto m = cache->MatchCopyOnWrite(q, 4, EvictionRule::kAllocationAware);
  ASSERT_TRUE(m) << m.error().ToString();
  EXPECT_EQ(m->length, 4u);  // loaded back, device checkpoints evicted for it
  EXPECT_GE(victims, 1);
  EXPECT_TRUE(during) << during.error().ToString();
  EXPECT_FALSE(cache->KvOnHost(Tokens(0, 4)));
  ASSERT_TRUE(cache->Unlock(*m));
  ASSERT_TRUE(a->Free(m->copy.state));
  ASSERT_TRUE(a->Free(m->copy.window));
  for (BlockId j : junk) ASSERT_TRUE(a->Free(j));
  EXPECT_TRUE(cache->CheckInvariants()) << cache->CheckInvariants().error().ToString();
}

TEST(PrefixCache, EventsReportEveryStoredAndRemovedBlockOnce) {
  auto a = Buffer(256);
  auto cache = PrefixCache::Create(PrefixCacheConfig{.page_tokens = kPage, .record_events = true}, a.get()).value();
  InsertSequence(*cache, *a, Tokens(0, 10), {5});
  InsertSequence(*cache, *a, Tokens(0, 10), {});  // duplicates: no events
  std::map<std::uint32_t, int> live;              // block -> stored - removed
  int pages = 0, states = 0;
  for (const auto& e : cache->TakeEvents()) {
    const bool stored = e.type == CacheEvent::Type::kPageStored || e.type == CacheEvent::Type::kStateStored;
    live[e.block.value()] += stored ? 1 : -1;
    pages += e.type == CacheEvent::Type::kPageStored;
    states += e.type == CacheEvent::Type::kStateStored;
  }
  EXPECT_EQ(pages, 3);
  EXPECT_EQ(states, 2);
  EXPECT_TRUE(cache->TakeEvents().empty());
  (void)cache->Evict(1000, 1000);
  for (const auto& e : cache->TakeEvents()) {
    const bool stored = e.type == CacheEvent::Type::kPageStored || e.type == CacheEvent::Type::kStateStored;
    live[e.block.value()] += stored ? 1 : -1;
  }
  for (const auto& [block, n] : live) EXPECT_EQ(n, 0) << "block " << block;
  EXPECT_EQ(live.size(), 5u);
}

TEST(PrefixCache, BadInputIsAnErrorThatChangesNothing) {
  auto a = Buffer(128);
  auto cache = Cache(*a);
  InsertSequence(*cache, *a, Tokens(0, 8), {});
  const auto blocks = a->LiveBlocks();
  const auto nodes = cache->num_nodes();
  auto q = Tokens(0, 8);
  q.push_back(1);
  auto m = cache->Match(q, 8);
  ASSERT_EQ(m.length, 8u);
  EXPECT_EQ(cache->Unlock(m).error().code(), ErrorCode::kFailedPrecondition);  // unlock without lock
  auto page = a->Allocate(kKv).value();
  std::vector<BlockId> pages = {page};
  EXPECT_EQ(cache->Insert(Tokens(50, 8), pages, {}).error().code(), ErrorCode::kInvalidArgument);  // 1 page for 8 tokens
  std::vector<BlockId> wrong = {page, BlockId(999)};
  EXPECT_EQ(cache->Insert(Tokens(50, 8), wrong, {}).error().code(), ErrorCode::kNotFound);
  ASSERT_TRUE(a->Free(page));
  EXPECT_EQ(a->LiveBlocks(), blocks);
  EXPECT_EQ(cache->num_nodes(), nodes);
  EXPECT_EQ(cache->MakeRoom(Demand::Of(2), EvictionRule::kNaive).error().code(), ErrorCode::kInvalidArgument);
  // A page given twice, a page of the tree at another position, a checkpoint of the wrong kind.
  auto two = a->AllocateDemand(Demand::Of(3).Add(kKv, 2)).value();
  std::vector<BlockId> twice = {two[0], two[0]};
  auto cp = NewCheckpoint(*a);
  std::vector<PositionedCheckpoint> at8 = {{8, cp}};
  EXPECT_EQ(cache->Insert(Tokens(50, 8), twice, at8).error().code(), ErrorCode::kInvalidArgument);
  std::vector<BlockId> stolen = {m.pages[1], two[1]};
  EXPECT_EQ(cache->Insert(Tokens(50, 8), stolen, at8).error().code(), ErrorCode::kInvalidArgument);
  std::vector<PositionedCheckpoint> wrong_kind = {{8, Checkpoint{two[1], BlockId::Invalid()}}};
  EXPECT_EQ(cache->Insert(Tokens(50, 8), two, wrong_kind).error().code(), ErrorCode::kInvalidArgument);
  std::vector<PositionedCheckpoint> same_pos = {{8, cp}, {8, cp}};
  EXPECT_EQ(cache->Insert(Tokens(50, 8), two, same_pos).error().code(), ErrorCode::kInvalidArgument);
  for (BlockId b : {two[0], two[1], cp.state, cp.window}) ASSERT_TRUE(a->Free(b));
  EXPECT_EQ(a->LiveBlocks(), blocks);
  EXPECT_EQ(cache->num_nodes(), nodes);
  EXPECT_EQ(PrefixCache::Create(PrefixCacheConfig{.page_tokens = 0}, a.get()).error().code(), ErrorCode::kInvalidArgument);
  EXPECT_TRUE(cache->CheckInvariants());
}

// Window pages (sliding_window 6 on 4-token pages): a checkpoint at L needs the window
// pages of tokens [L - 5, L).
struct WindowSequence {
  std::vector<BlockId> pages, window;
  Checkpoint checkpoint;
};
WindowSequence NewWindowSequence(HybridAllocator& a, std::size_t tokens) {
  const auto n = static_cast<std::uint32_t>((tokens + kPage - 1) / kPage);
  auto ids = a.AllocateDemand(Demand::Of(3).Add(kState, 1).Add(kKv, n).Add(kSwa, n)).value();
  WindowSequence w;
  w.checkpoint = Checkpoint{ids[0], BlockId::Invalid()};
  w.pages.assign(ids.begin() + 1, ids.begin() + 1 + n);
  w.window.assign(ids.begin() + 1 + n, ids.end());
  return w;
}

TEST(PrefixCache, WindowPagesMatchOnlyWithTheirWindowAndLockOnlyIt) {
  auto a = Buffer(256);
  auto cache = PrefixCache::Create(PrefixCacheConfig{.page_tokens = kPage, .sliding_window = 6}, a.get()).value();
  const auto t = Tokens(0, 20);
  auto s = NewWindowSequence(*a, 20);
  ASSERT_TRUE(a->Free(s.window[0]));  // released by the request: outside every window it needs
  s.window[0] = BlockId::Invalid();
  const auto cp8 = a->Allocate(kState).value();
  ASSERT_TRUE(cache->Insert(t, s.pages, std::vector<PositionedCheckpoint>{{8, {cp8, BlockId::Invalid()}}, {20, s.checkpoint}},
                            s.window));
  EXPECT_TRUE(cache->CheckInvariants()) << cache->CheckInvariants().error().ToString();
  auto q = Tokens(0, 20);
  q.push_back(77);
  auto m = cache->Match(q, 20);
  ASSERT_EQ(m.length, 20u);
  ASSERT_EQ(m.window_pages.size(), 5u);
  for (std::size_t i = 0; i < 5; ++i) EXPECT_EQ(m.window_pages[i].valid(), i >= 3) << i;  // tokens [15, 20)
  // The lock takes the window pages of the window only.
  ASSERT_TRUE(cache->Lock(m));
  // Protected: the window pages 3-4 of the node [12, 20) (Insert cut the path at 12, the
  // window of 20 rounded down to a page), as window eviction takes a node's together.
  EXPECT_EQ(cache->Metrics().window.protected_bytes, 2u * 64);
  // The state at 8 needs window pages 0 and 1 ([3, 8)): page 0 was released, so no match there.
  EXPECT_EQ(cache->Match(Tokens(0, 9), 8).length, 0u);
  EXPECT_EQ(cache->Match(Tokens(0, 9), 8).kv_length, 9u);
  // Evicting window pages spares the locked window (by node, as SGLang) and only it.
  EXPECT_EQ(cache->Evict(0, 0, 100).window_pages, 2u);  // page 1 of [0, 8), page 2 of [8, 12)
  EXPECT_EQ(cache->Match(q, 20).length, 20u);
  // Early release: the window pages become evictable, KV and state stay locked.
  const std::uint64_t before = cache->DebugDigest();
  PrefixMatch unlocked = cache->Match(Tokens(0, 9), 9);
  EXPECT_FALSE(cache->ReleaseWindow(unlocked).has_value() && unlocked.length > 0);
  m = cache->Match(q, 20);
  PrefixMatch held = m;
  ASSERT_TRUE(cache->Lock(held));
  ASSERT_TRUE(cache->Unlock(held));
  ASSERT_TRUE(cache->ReleaseWindow(m));
  EXPECT_TRUE(m.window_pages.empty());
  EXPECT_EQ(cache->Metrics().window.protected_bytes, 0u);
  EXPECT_EQ(cache->Evict(0, 0, 100).window_pages, 2u);  // pages 3-4
  EXPECT_EQ(cache->Match(q, 20).length, 0u);  // the window is gone: a window tombstone
  EXPECT_EQ(cache->Metrics().kv.protected_bytes, 5u * 64);  // the KV lock stays
  // The same tokens again (while the lock keeps the window tombstone) give the tree its
  // window pages back over the shared prefix.
  auto again = NewWindowSequence(*a, 20);
  ASSERT_TRUE(cache->Insert(t, again.pages, std::vector<PositionedCheckpoint>{{20, again.checkpoint}}, again.window));
  ASSERT_TRUE(cache->Unlock(m));
  EXPECT_NE(cache->DebugDigest(), before);
  EXPECT_EQ(cache->Match(q, 20).length, 20u);
  EXPECT_EQ(cache->Match(Tokens(0, 9), 8).length, 8u);
  EXPECT_TRUE(cache->CheckInvariants()) << cache->CheckInvariants().error().ToString();
}

// events carry what KV-aware routers read (SGLang's BlockStored: the block's
// hash, its parent block's hash, its tokens; BlockRemoved: the hashes), window pages too.
// Hashes chain over the path's tokens, so two caches that store the same prefix agree, a
// sequence that differs from token 5 shares page 0's hash only, and a removal repeats the
// hash its store carried (also for pages that a later split moved to another node).
TEST(PrefixCache, EventsCarryChainedBlockHashesParentsAndTokens) {
  auto a = Buffer(256);
  auto b = Buffer(256);
  const PrefixCacheConfig config{.page_tokens = kPage, .sliding_window = 6, .record_events = true};
  auto cache = PrefixCache::Create(config, a.get()).value();
  auto other = PrefixCache::Create(config, b.get()).value();
  auto insert = [](PrefixCache& c, HybridAllocator& alloc, const std::vector<std::uint32_t>& t) {
    auto s = NewWindowSequence(alloc, t.size());
    ASSERT_TRUE(c.Insert(t, s.pages, std::vector<PositionedCheckpoint>{{static_cast<std::uint32_t>(t.size()), s.checkpoint}},
                         s.window));
  };
  insert(*cache, *a, Tokens(0, 10));  // pages [0..3] [4..7] [8, 9]
  std::vector<CacheEvent> stored;
  std::map<std::uint32_t, std::int64_t> hash_of;  // block -> stored hash
  for (auto& e : cache->TakeEvents()) {
    if (e.type == CacheEvent::Type::kPageStored) stored.push_back(e);
    if (e.type == CacheEvent::Type::kPageStored || e.type == CacheEvent::Type::kWindowStored) hash_of[e.block.value()] = e.hash;
  }
  ASSERT_EQ(stored.size(), 3u);
  EXPECT_FALSE(stored[0].parent_hash.has_value());  // the first page: no parent (none, as SGLang)
  EXPECT_EQ(stored[1].parent_hash, stored[0].hash);
  EXPECT_EQ(stored[2].parent_hash, stored[1].hash);
  EXPECT_EQ(stored[1].tokens, Tokens(4, 4));
  EXPECT_EQ(stored[2].tokens, Tokens(8, 2));  // a partial page: the tokens it holds
  EXPECT_NE(stored[0].hash, stored[1].hash);
  auto forked = Tokens(0, 8);
  forked[5] = 99;
  insert(*other, *b, forked);
  std::vector<CacheEvent> theirs;
  int windows = 0;
  for (auto& e : other->TakeEvents()) {
    if (e.type == CacheEvent::Type::kPageStored) theirs.push_back(e);
    if (e.type == CacheEvent::Type::kWindowStored) {
      ++windows;
      EXPECT_EQ(e.hash, theirs.back().hash);  // a window page has its KV page's hash
      EXPECT_EQ(e.parent_hash, theirs.back().parent_hash);
    }
  }
  ASSERT_EQ(theirs.size(), 2u);
  EXPECT_EQ(windows, 2);
  EXPECT_EQ(theirs[0].hash, stored[0].hash);  // the same tokens in another cache
  EXPECT_NE(theirs[1].hash, stored[1].hash);
  // A branch at 6 splits [4..9]; evicting everything removes each page with its stored hash.
  auto branch = Tokens(0, 6);
  branch.push_back(50);
  insert(*cache, *a, branch);
  for (auto& e : cache->TakeEvents()) {
    if (e.type == CacheEvent::Type::kPageStored || e.type == CacheEvent::Type::kWindowStored) hash_of[e.block.value()] = e.hash;
  }
  (void)cache->Evict(1000, 1000, 1000);
  int removed = 0, window_removed = 0;
  for (auto& e : cache->TakeEvents()) {
    if (e.type != CacheEvent::Type::kPageRemoved && e.type != CacheEvent::Type::kWindowRemoved) continue;
    ++(e.type == CacheEvent::Type::kPageRemoved ? removed : window_removed);
    ASSERT_TRUE(hash_of.contains(e.block.value())) << e.block.value();
    EXPECT_EQ(e.hash, hash_of[e.block.value()]) << e.block.value();
  }
  EXPECT_EQ(removed, 4);         // three pages and the branch's head copy
  EXPECT_GE(window_removed, 2);  // window pages go with their nodes or as tombstones first
  EXPECT_EQ(cache->num_nodes(), 0u);
}

TEST(PrefixCache, BadWindowInputIsAnErrorThatChangesNothing) {
  auto a = Buffer(256);
  auto cache = PrefixCache::Create(PrefixCacheConfig{.page_tokens = kPage, .sliding_window = 6}, a.get()).value();
  const auto t = Tokens(0, 8);
  auto s = NewWindowSequence(*a, 8);
  const std::uint64_t digest = cache->DebugDigest();
  const std::vector<PositionedCheckpoint> end = {{8, s.checkpoint}};
  // No window pages, too few, a KV page as a window page, a window page twice.
  EXPECT_EQ(cache->Insert(t, s.pages, end).error().code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(cache->Insert(t, s.pages, end, std::vector<BlockId>{s.window[0]}).error().code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(cache->Insert(t, s.pages, end, std::vector<BlockId>{s.window[0], s.pages[0]}).error().code(),
            ErrorCode::kInvalidArgument);
  EXPECT_EQ(cache->Insert(t, s.pages, end, std::vector<BlockId>{s.window[0], s.window[0]}).error().code(),
            ErrorCode::kInvalidArgument);
  // A chunk whose end's window (tokens [3, 8): pages 0 and 1) lacks a released page.
  std::vector<BlockId> released = s.window;
  released[0] = BlockId::Invalid();
  EXPECT_EQ(cache->InsertChunk(t, s.pages, end, PrefixMatch{}, released).error().code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(cache->DebugDigest(), digest);
  ASSERT_TRUE(cache->Insert(t, s.pages, end, s.window));
  // Unlock / ReleaseWindow of a match that is not locked; Lock of a match with a window page
  // that is not on its path.
  auto q = Tokens(0, 8);
  q.push_back(5);
  PrefixMatch m = cache->Match(q, 8);
  ASSERT_EQ(m.length, 8u);
  const std::uint64_t after = cache->DebugDigest();
  EXPECT_EQ(cache->ReleaseWindow(m).error().code(), ErrorCode::kFailedPrecondition);
  EXPECT_EQ(cache->Unlock(m).error().code(), ErrorCode::kFailedPrecondition);
  PrefixMatch forged = m;
  forged.window_pages[0] = forged.pages[0];
  EXPECT_EQ(cache->Lock(forged).error().code(), ErrorCode::kNotFound);
  EXPECT_EQ(cache->DebugDigest(), after);
  EXPECT_FALSE(PrefixCache::Create(PrefixCacheConfig{.page_tokens = kPage, .window_kind = BlockKind::Invalid(),
                                                     .sliding_window = 6},
                                   a.get()));
  EXPECT_TRUE(cache->CheckInvariants());
}

}  // namespace
}  // namespace ula
