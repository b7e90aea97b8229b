// SGLang's mamba and SWA radix cache scenarios on ula::PrefixCache. Mapping:
// page size 1 is page_tokens 1; SGLang's window w is our sliding_window w + 1; a mamba value
// is a checkpoint at the end of each insert; cow_mamba is MatchCopyOnWrite. Each test names
// the result SGLang gives (python/sglang/srt/mem_cache/mamba_radix_cache.py,
// swa_radix_cache.py) and checks ours against it.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <vector>

#include "ula/prefix_cache.h"
#include "ula/unified_buffer.h"

namespace ula {
namespace {

constexpr BlockKind kState(0), kKv(1), kSwa(2);
constexpr std::uint64_t kBlock = 64;  // every kind: one 64 B block

std::unique_ptr<UnifiedBuffer> Buffer(std::uint64_t blocks = 256) {
  UnifiedBufferConfig c;
  c.alignment = 64;
  c.capacity_bytes = blocks * kBlock;
  c.kinds = {{"state", kBlock, BufferEnd::kLow}, {"kv", kBlock, BufferEnd::kHigh}, {"swa", kBlock, BufferEnd::kLow}};
  c.padding_kind = kKv;
  c.padding_blocks = 0;
  return UnifiedBuffer::Create(c).value();
}

std::unique_ptr<PrefixCache> Cache(HybridAllocator& a, std::uint32_t sliding_window = 0) {
  return PrefixCache::Create(PrefixCacheConfig{.page_tokens = 1, .sliding_window = sliding_window}, &a).value();
}

std::vector<std::uint32_t> Range(std::uint32_t first, std::uint32_t last) {  // [first, last]
  std::vector<std::uint32_t> t(last - first + 1);
  std::iota(t.begin(), t.end(), first);
  return t;
}

std::vector<std::uint32_t> Concat(std::vector<std::uint32_t> a, const std::vector<std::uint32_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// SGLang's insert(key, value, mamba_value): one page per token, a state at the end (and a
// window page per token when the cache has window pages). Returns what Insert returned.
Result<std::uint32_t> InsertWithState(PrefixCache& cache, HybridAllocator& a, const std::vector<std::uint32_t>& tokens,
                                      bool windowed = false) {
  const auto n = static_cast<std::uint32_t>(tokens.size());
  auto ids = a.AllocateDemand(Demand::Of(3).Add(kState, 1).Add(kKv, n).Add(kSwa, windowed ? n : 0)).value();
  const std::vector<BlockId> pages(ids.begin() + 1, ids.begin() + 1 + n);
  const std::vector<BlockId> window(ids.begin() + 1 + n, ids.end());
  const std::vector<PositionedCheckpoint> cps = {{n, Checkpoint{ids[0], BlockId::Invalid()}}};
  return cache.Insert(tokens, pages, cps, window);
}

std::uint32_t Matched(PrefixCache& cache, const std::vector<std::uint32_t>& tokens) {
  return cache.Match(tokens, static_cast<std::uint32_t>(tokens.size())).length;
}

// The window's evictable counter is what Evict frees. SGLang (window 1, its leaf split at the
// window on insert): a locked match protects only its window page (token 4); the 3 pages
// before it, a node of their own, are evictable, and window eviction takes just them.
TEST(PrefixCacheSglang, TheWindowEvictableCounterIsPayable) {
  auto a = Buffer();
  auto cache = Cache(*a, 2);
  ASSERT_TRUE(InsertWithState(*cache, *a, Range(1, 4), true));
  PrefixMatch m = cache->Match(Range(1, 4), 4);
  ASSERT_EQ(m.length, 4u);
  ASSERT_TRUE(cache->Lock(m));
  const PrefixCacheMetrics before = cache->Metrics();
  EXPECT_EQ(before.window.evictable, 3 * kBlock);
  EXPECT_EQ(before.window.protected_bytes, 1 * kBlock);  // the locked window page 3
  const auto live = a->Stats().live_blocks_per_kind[kSwa.value()];
  EXPECT_EQ(cache->Evict(0, 0, 1000).window_pages, 3u);
  EXPECT_EQ(a->Stats().live_blocks_per_kind[kSwa.value()], live - 3);
  EXPECT_EQ(cache->Metrics().window.evictable, 0u);
  ASSERT_TRUE(cache->Unlock(m));
  EXPECT_EQ(cache->Metrics().window.evictable, 1 * kBlock);
  EXPECT_EQ(cache->Evict(0, 0, 1000).window_pages, 1u);  // an unlocked leaf: it goes whole
  EXPECT_EQ(cache->num_nodes(), 0u);
  EXPECT_TRUE(cache->CheckInvariants());
}

// Item 2: a leaf whose window was evicted is useless and goes at once (SGLang's
// _iteratively_delete_tombstone_leaf deletes it). The inserts were cut at their windows
// ([1..3] [4] [5..9] [10]); window eviction takes [1..3]'s and [4]'s, so after the leaf [10]
// and the tombstone [5..9] go, [4] (its window gone) and [1..3] follow: 10 tokens.
TEST(PrefixCacheSglang, AWindowTombstonedLeafIsRemoved) {
  auto a = Buffer();
  auto cache = Cache(*a, 2);
  ASSERT_TRUE(InsertWithState(*cache, *a, Range(1, 4), true));
  ASSERT_TRUE(InsertWithState(*cache, *a, Range(1, 10), true));
  PrefixMatch m = cache->Match(Range(1, 10), 10);
  ASSERT_EQ(m.length, 10u);
  ASSERT_TRUE(cache->Lock(m));
  EXPECT_EQ(cache->Evict(0, 0, 4).window_pages, 4u);  // [1..3] and [4]: window tombstones
  ASSERT_TRUE(cache->Unlock(m));
  const EvictionStats stats = cache->Evict(1, 0, 0);
  EXPECT_EQ(stats.tokens, 10u);
  EXPECT_EQ(stats.nodes, 4u);
  EXPECT_EQ(cache->num_nodes(), 0u);
  EXPECT_EQ(Matched(*cache, Range(1, 4)), 0u);
  EXPECT_TRUE(cache->CheckInvariants()) << cache->CheckInvariants().error().ToString();
}

// Item 3: a split refreshes its lower half (SGLang's _split_node gives the child a new
// access time), so the untouched [10, 11, 12] is the LRU leaf, not [6, 7].
TEST(PrefixCacheSglang, ASplitRefreshesTheLowerHalf) {
  auto a = Buffer();
  auto cache = Cache(*a);
  ASSERT_TRUE(InsertWithState(*cache, *a, Range(1, 7)));
  ASSERT_TRUE(InsertWithState(*cache, *a, Range(10, 12)));
  ASSERT_TRUE(InsertWithState(*cache, *a, Concat(Range(1, 5), {60, 70})));
  const EvictionStats stats = cache->Evict(1, 0);
  EXPECT_EQ(stats.tokens, 3u);
  EXPECT_FALSE(cache->Holds(Range(10, 12)));
  EXPECT_TRUE(cache->Holds(Range(1, 7)));
  EXPECT_TRUE(cache->Holds(Concat(Range(1, 5), {60, 70})));
  EXPECT_TRUE(cache->CheckInvariants());
}

// Item 4: on one path, the root side is older (SGLang's reset_node_and_parents_mru: a
// child is more recent than its parent), so a state eviction tombstones the internal state
// at 3 and [1..7] still matches 7.
TEST(PrefixCacheSglang, StateEvictionTombstonesTheRootSideFirst) {
  auto a = Buffer();
  auto cache = Cache(*a);
  ASSERT_TRUE(InsertWithState(*cache, *a, Range(1, 3)));
  ASSERT_TRUE(InsertWithState(*cache, *a, Range(1, 7)));
  ASSERT_EQ(Matched(*cache, Range(1, 7)), 7u);
  const EvictionStats stats = cache->Evict(0, 1);
  EXPECT_EQ(stats.checkpoints, 1u);
  EXPECT_EQ(stats.tombstones, 1u);
  EXPECT_EQ(Matched(*cache, Range(1, 7)), 7u);
  EXPECT_EQ(Matched(*cache, Range(1, 3)), 0u);
  EXPECT_TRUE(cache->CheckInvariants());
}

// The same order for window pages (SGLang's SWA LRU list): the root side's go first. The
// inserts were cut at their windows: [1, 2] [3] [4..6] [7].
TEST(PrefixCacheSglang, WindowEvictionTakesTheRootSideFirst) {
  auto a = Buffer();
  auto cache = Cache(*a, 2);
  ASSERT_TRUE(InsertWithState(*cache, *a, Range(1, 3), true));
  ASSERT_TRUE(InsertWithState(*cache, *a, Range(1, 7), true));
  EXPECT_EQ(cache->Evict(0, 0, 1).window_pages, 2u);  // the node [1, 2]: a window tombstone
  EXPECT_EQ(cache->Evict(0, 0, 1).window_pages, 1u);  // then [3]'s
  EXPECT_EQ(Matched(*cache, Range(1, 7)), 7u);         // its window [6, 7) is in [7]
  EXPECT_EQ(Matched(*cache, Range(1, 3)), 0u);
  EXPECT_TRUE(cache->CheckInvariants());
}

// Item 5: Evict(kv_tokens, states) counts each kind by what its own phase evicted (SGLang's
// evict_full, then evict_mamba): the leaf [4..7] goes for the token, its state with it, and
// then one more state ([1..3], a leaf by then, goes whole): two states freed.
TEST(PrefixCacheSglang, EvictCountsStatesByTheStatePhase) {
  auto a = Buffer();
  auto cache = Cache(*a);
  ASSERT_TRUE(InsertWithState(*cache, *a, Range(1, 3)));
  ASSERT_TRUE(InsertWithState(*cache, *a, Range(1, 7)));
  ASSERT_TRUE(InsertWithState(*cache, *a, Range(20, 21)));
  const EvictionStats stats = cache->Evict(1, 1);
  EXPECT_EQ(stats.checkpoints, 2u);
  EXPECT_EQ(stats.tokens, 7u);
  EXPECT_EQ(cache->num_checkpoints(), 1u);
  EXPECT_TRUE(cache->Holds(Range(20, 21)));
  EXPECT_TRUE(cache->CheckInvariants());
}

// Item 9: Insert returns the prefix length the tree held already (SGLang's
// InsertResult.prefix_len), which a scheduler uses to free its duplicate KV.
TEST(PrefixCacheSglang, InsertReturnsTheLengthAlreadyCached) {
  auto a = Buffer();
  auto cache = Cache(*a);
  EXPECT_EQ(InsertWithState(*cache, *a, Range(1, 7)).value(), 0u);
  EXPECT_EQ(InsertWithState(*cache, *a, Concat(Range(1, 5), {60, 70})).value(), 5u);
  EXPECT_EQ(InsertWithState(*cache, *a, Range(1, 7)).value(), 7u);  // all of it: a duplicate
  EXPECT_EQ(InsertWithState(*cache, *a, Range(1, 9)).value(), 7u);
  EXPECT_TRUE(cache->CheckInvariants());
}

// A cache with window pages and no recurrent kind (SGLang's SWA radix cache, items 6 and 7):
// no state kind, no checkpoints; one KV page and one window page per token.
std::unique_ptr<PrefixCache> SwaCache(HybridAllocator& a, std::uint32_t sliding_window, bool events = false) {
  return PrefixCache::Create(PrefixCacheConfig{.page_tokens = 1, .state_kind = BlockKind::Invalid(),
                                               .sliding_window = sliding_window, .record_events = events},
                             &a)
      .value();
}

struct Blocks {
  std::vector<BlockId> pages, window;
};
Blocks Allocate(HybridAllocator& a, std::uint32_t n) {
  auto ids = a.AllocateDemand(Demand::Of(3).Add(kKv, n).Add(kSwa, n)).value();
  return {{ids.begin(), ids.begin() + n}, {ids.begin() + n, ids.end()}};
}

Result<std::uint32_t> InsertSwa(PrefixCache& cache, HybridAllocator& a, const std::vector<std::uint32_t>& tokens) {
  Blocks b = Allocate(a, static_cast<std::uint32_t>(tokens.size()));
  return cache.Insert(tokens, b.pages, {}, b.window);
}

// Ours: window eviction takes a node's window pages together (SGLang evicts by node), so a
// node with any window page locked protects all of them, and Metrics must count them so: a
// match that ends inside a node whose window reaches back into its parent locks only the
// parent's last pages, and the parent's other window pages are protected too. Window 5 on
// 1-token pages: [1..12] is cut at its window, N0 = [0, 8) and N1 = [8, 12); a match of 10
// splits N1 at 10 and locks pages 6-9 (N0's last two, and [8, 10)), so N0's eight pages and
// [8, 10)'s two are protected and only [10, 12)'s two evictable, which Evict then frees.
TEST(PrefixCacheSglang, AWindowLockProtectsEveryWindowPageOfItsNode) {
  auto a = Buffer();
  auto cache = SwaCache(*a, 5);
  ASSERT_EQ(InsertSwa(*cache, *a, Range(1, 12)).value(), 0u);
  const PrefixCacheMetrics before = cache->Metrics();
  ASSERT_EQ(before.window.protected_bytes, 0u);
  ASSERT_GT(before.window.evictable, 0u);
  ASSERT_EQ(before.window.evictable % 12, 0u);
  const std::uint64_t page = before.window.evictable / 12;  // one window page's bytes
  PrefixMatch m = cache->Match(Range(1, 10), 10);
  ASSERT_EQ(m.length, 10u);
  ASSERT_TRUE(cache->Lock(m));
  EXPECT_TRUE(cache->CheckInvariants()) << cache->CheckInvariants().error().ToString();
  const PrefixCacheMetrics locked = cache->Metrics();
  EXPECT_EQ(locked.window.protected_bytes, 10 * page) << "N0's eight window pages and [8, 10)'s two";
  EXPECT_EQ(locked.window.evictable, 2 * page) << "only [10, 12)'s";
  EXPECT_EQ(cache->Evict(0, 0, 1000).window_pages * page, locked.window.evictable)
      << "what the counter calls evictable is what eviction frees";
  ASSERT_TRUE(cache->Unlock(m));
  EXPECT_TRUE(cache->CheckInvariants()) << cache->CheckInvariants().error().ToString();
}

// Item 7: without a recurrent kind a match ends at any node boundary whose window is there.
// SGLang (test_swa_radix_cache_1's tree, window 4) matches [1..5] whole; with a state per
// insert (the dummy blocks a pure SWA model needed before) nothing ends at 5.
TEST(PrefixCacheSglang, AWindowOnlyCacheMatchesAtANodeBoundaryWithoutAState) {
  auto a = Buffer();
  auto cache = SwaCache(*a, 5);
  ASSERT_EQ(InsertSwa(*cache, *a, Range(1, 7)).value(), 0u);
  ASSERT_EQ(InsertSwa(*cache, *a, Concat(Range(1, 5), {60, 70})).value(), 5u);
  PrefixMatch m = cache->Match(Range(1, 5), 5);
  EXPECT_EQ(m.length, 5u);  // the split point, no state there
  EXPECT_FALSE(m.checkpoint.valid());
  EXPECT_EQ(m.window_pages.size(), 5u);
  EXPECT_FALSE(m.window_pages[0].valid());  // outside the window of 5 (4 tokens before it)
  EXPECT_TRUE(m.window_pages[1].valid());
  EXPECT_TRUE(cache->Holds(Range(1, 5)));
  EXPECT_EQ(cache->num_checkpoints(), 0u);
  ASSERT_TRUE(cache->Lock(m));
  EXPECT_EQ(cache->Evict(1000, 0, 1000).nodes, 2u);  // [6, 7] and [60, 70]: the locked [1..5] stays
  ASSERT_TRUE(cache->Unlock(m));
  EXPECT_TRUE(cache->CheckInvariants()) << cache->CheckInvariants().error().ToString();
  auto b = Buffer();
  auto with_states = Cache(*b, 5);
  ASSERT_TRUE(InsertWithState(*with_states, *b, Range(1, 7), true));
  ASSERT_TRUE(InsertWithState(*with_states, *b, Concat(Range(1, 5), {60, 70}), true));
  EXPECT_EQ(Matched(*with_states, Range(1, 5)), 0u);
  // A checkpoint given to a cache without a state kind is refused.
  auto ids = a->AllocateDemand(Demand::Of(3).Add(kState, 1).Add(kKv, 1).Add(kSwa, 1)).value();
  const std::vector<PositionedCheckpoint> cps = {{1, Checkpoint{ids[0], BlockId::Invalid()}}};
  const std::vector<std::uint32_t> one = {99};
  const auto digest = cache->DebugDigest();
  EXPECT_EQ(cache->Insert(one, std::span(ids).subspan(1, 1), cps, std::span(ids).subspan(2, 1)).error().code(),
            ErrorCode::kInvalidArgument);
  EXPECT_EQ(cache->DebugDigest(), digest);
}

// SGLang's test_swa_radix_cache_1 (window 4: ours 5), with no state kind: the LRU leaf goes
// for one token, then one window token tombstones the root side ([1, 2, 3], internal), then
// one more token takes the LRU leaf [6, 7] with its window (which counts for the window's 2).
// [1..5] no longer has its window (3 of its 4 tokens are tombstoned); [1..5, 60, 70] does.
TEST(PrefixCacheSglang, SwaRadixCacheScenarioWithoutStates) {
  auto a = Buffer();
  auto cache = SwaCache(*a, 5);
  EXPECT_EQ(InsertSwa(*cache, *a, Range(1, 3)).value(), 0u);
  EXPECT_EQ(InsertSwa(*cache, *a, Range(1, 7)).value(), 3u);
  EXPECT_EQ(InsertSwa(*cache, *a, Range(10, 12)).value(), 0u);
  EXPECT_EQ(InsertSwa(*cache, *a, Concat(Range(1, 5), {60, 70})).value(), 5u);
  EvictionStats s = cache->Evict(1, 0);
  EXPECT_EQ(s.tokens, 3u);
  EXPECT_FALSE(cache->Holds(Range(10, 12)));
  s = cache->Evict(0, 0, 1);
  EXPECT_EQ(s.window_pages, 3u);
  EXPECT_EQ(s.nodes, 0u);  // a window tombstone: [1, 2, 3] keeps its KV
  s = cache->Evict(1, 0, 2);
  EXPECT_EQ(s.tokens, 2u);
  EXPECT_EQ(s.window_pages, 2u);
  EXPECT_FALSE(cache->Holds(Range(1, 7)));
  EXPECT_EQ(Matched(*cache, Range(1, 5)), 0u);
  const PrefixMatch m = cache->Match(Concat(Range(1, 5), {60, 70}), 7);
  EXPECT_EQ(m.length, 7u);
  EXPECT_EQ(m.path.size(), 3u);  // [1, 2, 3] [4, 5] [60, 70]
  EXPECT_TRUE(cache->CheckInvariants()) << cache->CheckInvariants().error().ToString();
  // The counters can be paid without a state kind too: evicting everything frees what
  // Metrics called evictable, and no state bytes.
  const PrefixCacheMetrics before = cache->Metrics();
  EXPECT_EQ(before.state.evictable + before.state.protected_bytes, 0u);
  const auto live = a->Stats().live_blocks_per_kind;
  const EvictionStats all = cache->Evict(1000, 1000, 1000);
  const auto after = a->Stats().live_blocks_per_kind;
  EXPECT_EQ(before.kv.evictable, (live[kKv.value()] - after[kKv.value()]) * kBlock);
  EXPECT_EQ(before.window.evictable, (live[kSwa.value()] - after[kSwa.value()]) * kBlock);
  EXPECT_EQ(all.pages, 7u);  // [1, 2, 3] [4, 5] [60, 70]
  EXPECT_EQ(cache->num_nodes(), 0u);
}

// Item 6, SGLang's test_swa_unfinished_req_preserves_existing_eviction_boundary (window 4:
// ours 5): cache_unfinished_req of 8 tokens whose first 4 window tokens the request released
// leaves them window tombstones, and the 8 still match (their window is [4, 8)).
TEST(PrefixCacheSglang, AChunkKeepsTheWindowBoundaryTheRequestReleasedUpTo) {
  auto a = Buffer();
  auto cache = SwaCache(*a, 5);
  Blocks b = Allocate(*a, 8);
  for (int i = 0; i < 4; ++i) {
    ASSERT_TRUE(a->Free(b.window[i]));
    b.window[i] = BlockId::Invalid();  // released by the request
  }
  auto m = cache->InsertChunk(Range(1, 8), b.pages, {}, PrefixMatch{}, b.window);
  ASSERT_TRUE(m) << m.error().ToString();
  EXPECT_EQ(m->length, 8u);
  EXPECT_EQ(m->pages, b.pages);
  const PrefixCacheMetrics metrics = cache->Metrics();
  EXPECT_EQ(metrics.window.protected_bytes, 4 * kBlock);  // the window of 8, locked
  EXPECT_EQ(metrics.window.evictable, 0u);
  EXPECT_EQ(Matched(*cache, Range(1, 8)), 8u);
  ASSERT_TRUE(cache->Unlock(*m));
  EXPECT_TRUE(cache->CheckInvariants()) << cache->CheckInvariants().error().ToString();
}

// Item 6: chunked prefill with window pages. Each chunk's match locks only the window of its
// end, so the window pages the request left behind become evictable as it advances, and a
// window eviction tombstones the earlier chunk's node (SGLang's _tombstone_internal_node)
// while the prefix still matches at the new end.
TEST(PrefixCacheSglang, ChunkedPrefillWithWindowPagesReleasesTheWindowItLeaves) {
  auto a = Buffer();
  auto cache = SwaCache(*a, 5);
  Blocks c1 = Allocate(*a, 4);
  auto m1 = cache->InsertChunk(Range(1, 4), c1.pages, {}, PrefixMatch{}, c1.window);
  ASSERT_TRUE(m1) << m1.error().ToString();
  EXPECT_EQ(m1->length, 4u);
  EXPECT_EQ(cache->Metrics().window.protected_bytes, 4 * kBlock);
  Blocks c2 = Allocate(*a, 4);
  std::vector<BlockId> pages = m1->pages, window(4, BlockId::Invalid());  // released: out of the window of 8
  pages.insert(pages.end(), c2.pages.begin(), c2.pages.end());
  window.insert(window.end(), c2.window.begin(), c2.window.end());
  auto m2 = cache->InsertChunk(Range(1, 8), pages, {}, *m1, window);
  ASSERT_TRUE(m2) << m2.error().ToString();
  EXPECT_EQ(m2->length, 8u);
  PrefixCacheMetrics metrics = cache->Metrics();
  EXPECT_EQ(metrics.window.evictable, 4 * kBlock);  // chunk 1's window pages, released
  EXPECT_EQ(metrics.window.protected_bytes, 4 * kBlock);
  EvictionStats s = cache->Evict(0, 0, 1);
  EXPECT_EQ(s.window_pages, 4u);
  EXPECT_EQ(s.nodes, 0u);
  EXPECT_EQ(cache->Match(Range(1, 8), 8).length, 8u);
  EXPECT_EQ(Matched(*cache, Range(1, 4)), 0u);
  // A chunk whose end's window was released is refused, and nothing changes.
  Blocks c3 = Allocate(*a, 1);
  pages = m2->pages;
  pages.push_back(c3.pages[0]);
  window.assign(9, BlockId::Invalid());
  ASSERT_TRUE(a->Free(c3.window[0]));
  const auto digest = cache->DebugDigest();
  EXPECT_EQ(cache->InsertChunk(Range(1, 9), pages, {}, *m2, window).error().code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(cache->DebugDigest(), digest);
  ASSERT_TRUE(a->Free(c3.pages[0]));
  ASSERT_TRUE(cache->Unlock(*m2));
  EXPECT_TRUE(cache->CheckInvariants()) << cache->CheckInvariants().error().ToString();
}

// SGLang's TestSWASplitLeafOnInsert (SGLANG_OPT_SWA_SPLIT_LEAF_ON_INSERT on; its window w
// is our w + 1): an inserted leaf is cut at the window boundary of its end, rounded down to a
// page, so a lock at its end protects only the last window rounded up to pages
// (test_flag_on_caps_protection_at_window, test_flag_on_no_split_when_leaf_within_window),
// the whole chain still matches (test_match_prefix_returns_full_chain_after_split) and
// Unlock balances every counter to 0 (test_dec_lock_ref_after_split_balances_to_zero).
struct SplitCase {
  std::uint32_t window, page, leaf, tail;  // SGLang's window, page size, leaf length; protected tail
};
void CheckSplitAtWindow(const SplitCase& c) {
  SCOPED_TRACE(testing::Message() << "window " << c.window << " page " << c.page << " leaf " << c.leaf);
  auto a = Buffer();
  auto cache = PrefixCache::Create(PrefixCacheConfig{.page_tokens = c.page, .state_kind = BlockKind::Invalid(),
                                                     .sliding_window = c.window + 1},
                                   a.get())
                   .value();
  const std::vector<std::uint32_t> tokens = Range(0, c.leaf - 1);
  const std::uint32_t pages = (c.leaf + c.page - 1) / c.page;
  Blocks b = Allocate(*a, pages);
  ASSERT_TRUE(cache->Insert(tokens, b.pages, {}, b.window));
  PrefixMatch m = cache->Match(tokens, c.leaf);
  ASSERT_EQ(m.length, c.leaf);
  EXPECT_EQ(m.pages, b.pages);  // the full chain
  EXPECT_EQ(m.path.size(), c.leaf > c.tail ? 2u : 1u);
  ASSERT_TRUE(cache->Lock(m));
  const std::uint32_t tail_pages = std::min(pages, c.tail / c.page);
  EXPECT_EQ(cache->Metrics().window.protected_bytes, tail_pages * kBlock);
  EXPECT_EQ(cache->Metrics().window.evictable, (pages - tail_pages) * kBlock);
  EXPECT_EQ(cache->Metrics().kv.protected_bytes, pages * kBlock);
  ASSERT_TRUE(cache->Unlock(m));
  EXPECT_EQ(cache->Metrics().window.protected_bytes, 0u);
  EXPECT_EQ(cache->Metrics().kv.protected_bytes, 0u);
  ASSERT_TRUE(cache->Lock(m));
  EXPECT_EQ(cache->Evict(0, 0, 1000).window_pages, pages - tail_pages);  // what was evictable
  EXPECT_EQ(cache->Match(tokens, c.leaf).length, c.leaf);                 // its window is the tail
  ASSERT_TRUE(cache->Unlock(m));
  EXPECT_TRUE(cache->CheckInvariants()) << cache->CheckInvariants().error().ToString();
}

TEST(PrefixCacheSglang, ALockProtectsOnlyTheLastWindowRoundedUpToPages) {
  for (const SplitCase& c : {SplitCase{4, 1, 12, 4}, {4, 1, 5, 4}, {1, 1, 5, 1}, {4, 2, 12, 4}, {8, 2, 12, 8},
                             {4, 4, 12, 4}, {3, 2, 12, 4}, {5, 4, 12, 8}, {3, 4, 12, 4}}) {
    CheckSplitAtWindow(c);
  }
}

TEST(PrefixCacheSglang, ALeafWithinItsWindowIsNotSplit) {
  for (const SplitCase& c : {SplitCase{4, 1, 4, 4}, {4, 1, 3, 4}, {4, 2, 4, 4}, {3, 2, 4, 4}, {8, 2, 4, 8},
                             {4, 4, 4, 4}}) {
    CheckSplitAtWindow(c);
  }
}

// With a recurrent kind too: a 12-token leaf locked, window 4 (ours 5);
// Evict(0, 0, 1000) frees the 8 window pages outside the window, and the locked match
// still resumes at 12 (its checkpoint and window stay).
TEST(PrefixCacheSglang, EvictFreesTheWindowPagesOutsideALockedWindow) {
  auto a = Buffer();
  auto cache = Cache(*a, 5);
  ASSERT_TRUE(InsertWithState(*cache, *a, Range(1, 12), true));
  PrefixMatch m = cache->Match(Range(1, 12), 12);
  ASSERT_EQ(m.length, 12u);
  ASSERT_TRUE(cache->Lock(m));
  EXPECT_EQ(cache->Metrics().window.protected_bytes, 4 * kBlock);
  EXPECT_EQ(cache->Evict(0, 0, 1000).window_pages, 8u);
  EXPECT_EQ(cache->Match(Range(1, 12), 12).length, 12u);
  ASSERT_TRUE(cache->Unlock(m));
  EXPECT_EQ(cache->Metrics().window.protected_bytes + cache->Metrics().kv.protected_bytes +
                cache->Metrics().state.protected_bytes,
            0u);
  EXPECT_TRUE(cache->CheckInvariants()) << cache->CheckInvariants().error().ToString();
}

// A match that ends inside a node splits it there and returns the whole matched length with
// its pages, when the window of that point is present (SGLang's SWA _match_prefix_helper).
// [1..8] with window 4 (ours 5), the query [1..6, 99] matches 6, not 0.
TEST(PrefixCacheSglang, AMatchEndingInsideANodeSplitsIt) {
  auto a = Buffer();
  auto cache = SwaCache(*a, 5);
  Blocks b = Allocate(*a, 8);
  ASSERT_TRUE(cache->Insert(Range(1, 8), b.pages, {}, b.window));
  const auto live = a->Stats().live_blocks_per_kind;
  PrefixMatch m = cache->Match(Concat(Range(1, 6), {99}), 7);
  EXPECT_EQ(m.length, 6u);
  EXPECT_EQ(m.kv_length, 6u);
  EXPECT_EQ(m.pages, std::vector<BlockId>(b.pages.begin(), b.pages.begin() + 6));
  ASSERT_EQ(m.window_pages.size(), 6u);
  EXPECT_EQ(m.window_pages[2], b.window[2]);  // the window of 6: tokens [2, 6)
  EXPECT_FALSE(m.window_pages[1].valid());
  EXPECT_TRUE(cache->Holds(Range(1, 6)));
  EXPECT_EQ(a->Stats().live_blocks_per_kind, live);  // a split moves no block
  // max_length inside a node splits there too.
  EXPECT_EQ(cache->Match(Range(1, 8), 5).length, 5u);
  ASSERT_TRUE(cache->Lock(m));
  ASSERT_TRUE(cache->Unlock(m));
  EXPECT_TRUE(cache->CheckInvariants()) << cache->CheckInvariants().error().ToString();
  // Without the window of that point (the request released tokens [0, 4)'s), nothing is
  // split: the match stays at the boundary before it, whose window is gone too.
  auto released = SwaCache(*a, 5);
  Blocks r = Allocate(*a, 8);
  for (int i = 0; i < 4; ++i) {
    ASSERT_TRUE(a->Free(r.window[i]));
    r.window[i] = BlockId::Invalid();
  }
  ASSERT_TRUE(released->Insert(Range(1, 8), r.pages, {}, r.window));
  const std::size_t nodes = released->num_nodes();
  EXPECT_EQ(released->Match(Concat(Range(1, 6), {99}), 7).length, 0u);
  EXPECT_EQ(released->num_nodes(), nodes);
  EXPECT_TRUE(released->CheckInvariants()) << released->CheckInvariants().error().ToString();
}

// SGLang's test_radix_cache_unit.py test_advanced_prefix_match_with_node_splits (page sizes 1
// and 2): a full-attention model is window pages with a window longer than every sequence.
// Matches that end inside a node return that many tokens' pages and change no data.
TEST(PrefixCacheSglang, AdvancedPrefixMatchWithNodeSplits) {
  for (std::uint32_t page : {1u, 2u}) {
    SCOPED_TRACE(testing::Message() << "page " << page);
    auto a = Buffer();
    auto cache = PrefixCache::Create(PrefixCacheConfig{.page_tokens = page, .state_kind = BlockKind::Invalid(),
                                                       .sliding_window = 64},
                                     a.get())
                     .value();
    const std::vector<std::uint32_t> seq1 = Range(1, 8), seq2 = {1, 2, 9, 10};
    Blocks b1 = Allocate(*a, 8 / page), b2 = Allocate(*a, 4 / page);
    ASSERT_TRUE(cache->Insert(seq1, b1.pages, {}, b1.window));
    ASSERT_EQ(cache->Insert(seq2, b2.pages, {}, b2.window).value(), 2u);
    const auto total = a->Stats().live_blocks_per_kind[kKv.value()];
    EXPECT_EQ(total * page, 10u);  // 8 + 2 tokens
    auto pages_of = [&](std::uint32_t tokens) {
      return std::vector<BlockId>(b1.pages.begin(), b1.pages.begin() + tokens / page);
    };
    PrefixMatch m = cache->Match(std::vector<std::uint32_t>{1, 2, 3, 4, 999, 1000}, 6);
    EXPECT_EQ(m.length, 4u);
    EXPECT_EQ(m.pages, pages_of(4));
    EXPECT_EQ(a->Stats().live_blocks_per_kind[kKv.value()], total);
    EXPECT_EQ(cache->Match(seq1, 8).pages, pages_of(8));
    m = cache->Match(std::vector<std::uint32_t>{1, 2, 3, 4, 5, 6, 777, 888}, 8);
    EXPECT_EQ(m.length, 6u);
    EXPECT_EQ(m.pages, pages_of(6));
    EXPECT_EQ(a->Stats().live_blocks_per_kind[kKv.value()], total);
    std::vector<BlockId> branch = pages_of(2);
    branch.insert(branch.end(), b2.pages.begin() + 2 / page, b2.pages.end());
    EXPECT_EQ(cache->Match(seq2, 4).pages, branch);
    EXPECT_TRUE(cache->CheckInvariants()) << cache->CheckInvariants().error().ToString();
  }
}

// SGLang's window LRU (its unified radix cache, SWA without mamba; window 4 is our 5, page 1,
// so its cushion is 5 tokens): segments A, B, C of 8 tokens inserted as one chain, then a
// 5-token side branch; each insert is cut at its window ([4 + 4] per segment, [1 + 4] for the
// side). Window eviction order then shows what each rule refreshed.
struct WindowLruChain {
  std::unique_ptr<UnifiedBuffer> a = Buffer();
  std::unique_ptr<PrefixCache> cache;
  std::vector<std::uint32_t> abc = Range(1, 24), side = Range(900, 904);
  explicit WindowLruChain(WindowRecency rule) {
    cache = PrefixCache::Create(PrefixCacheConfig{.page_tokens = 1, .state_kind = BlockKind::Invalid(),
                                                  .sliding_window = 5, .window_recency = rule},
                                a.get())
                .value();
    for (std::uint32_t n : {8u, 16u, 24u}) EXPECT_TRUE(InsertSwa(*cache, *a, Range(1, n)));
    EXPECT_TRUE(InsertSwa(*cache, *a, side));
  }
};

// test_swa_lru_match_only_refreshes_window_cushion and
// test_swa_lru_old_ancestors_evict_first_under_pressure: a match of A+B+C refreshes only C's
// two nodes (its cushion), so window eviction takes A's and B's window pages (root side
// first) before the side branch's, which still matches whole.
TEST(PrefixCacheSglang, AMatchRefreshesOnlyTheWindowCushion) {
  WindowLruChain t(WindowRecency::kCushion);
  ASSERT_EQ(t.cache->Match(t.abc, 24).length, 24u);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(t.cache->Evict(0, 0, 1).window_pages, 4u) << i;  // A, then B: 4 pages each
  EXPECT_EQ(t.cache->Match(t.side, 5).length, 5u);  // its window pages all there
  EXPECT_EQ(t.cache->Match(t.abc, 24).length, 24u);  // C's window is the cushion
  EXPECT_TRUE(t.cache->CheckInvariants()) << t.cache->CheckInvariants().error().ToString();
  // Today's rule (one clock per path) refreshed A and B too: the side branch goes first.
  WindowLruChain path(WindowRecency::kPath);
  ASSERT_EQ(path.cache->Match(path.abc, 24).length, 24u);
  EXPECT_EQ(path.cache->Evict(0, 0, 1).window_pages, 1u);  // the side's [900]
}

// test_swa_lru_walk_down_does_not_refresh_ancestors_during_insert: inserting A+B+C+D
// refreshes none of A, B, C in the window LRU (only D's new nodes), so they stay older than
// the side branch.
TEST(PrefixCacheSglang, AnInsertsWalkDownRefreshesNoAncestor) {
  WindowLruChain t(WindowRecency::kCushion);
  ASSERT_EQ(InsertSwa(*t.cache, *t.a, Range(1, 32)).value(), 24u);
  for (int i = 0; i < 6; ++i) EXPECT_EQ(t.cache->Evict(0, 0, 1).window_pages, 4u) << i;  // A, B, C before the side
  EXPECT_EQ(t.cache->Match(t.side, 5).length, 5u);
  EXPECT_TRUE(t.cache->CheckInvariants()) << t.cache->CheckInvariants().error().ToString();
  WindowLruChain path(WindowRecency::kPath);
  ASSERT_TRUE(InsertSwa(*path.cache, *path.a, Range(1, 32)));
  EXPECT_EQ(path.cache->Evict(0, 0, 1).window_pages, 1u);  // the side's [900]
}

// Ours (no SGLang test pins it): the cushion's far end. On 4-token pages with W = 5 a match's
// window is its last page and its cushion (W - 1 + page_tokens = 8 tokens) its last two: a
// chain inserted a page at a time, N1..N4 (one node per page), then a one-page side branch.
// A match of the chain refreshes N3 (the furthest-back node inside the cushion, holding the
// window of a match one page shorter) as well as N4, so window eviction takes N1, N2, then
// the side branch, and N3's window outlives it: [1..12] still matches whole.
TEST(PrefixCacheSglang, AMatchRefreshesTheCushionsFurthestBackNode) {
  auto a = Buffer();
  auto cache = PrefixCache::Create(PrefixCacheConfig{.page_tokens = 4, .state_kind = BlockKind::Invalid(),
                                                     .sliding_window = 5, .window_recency = WindowRecency::kCushion},
                                   a.get())
                   .value();
  auto insert = [&](const std::vector<std::uint32_t>& tokens) {
    const auto pages = static_cast<std::uint32_t>(tokens.size() / 4);
    Blocks b = Allocate(*a, pages);
    return cache->Insert(tokens, b.pages, {}, b.window);
  };
  for (std::uint32_t n : {4u, 8u, 12u, 16u}) ASSERT_EQ(insert(Range(1, n)).value(), n - 4);
  const std::vector<std::uint32_t> side = Range(900, 903);
  ASSERT_EQ(insert(side).value(), 0u);
  ASSERT_EQ(cache->Match(Range(1, 16), 16).length, 16u);
  for (int i = 0; i < 2; ++i) EXPECT_EQ(cache->Evict(0, 0, 1).window_pages, 1u) << i;  // N1, N2
  EXPECT_EQ(cache->Evict(0, 0, 1).window_pages, 1u);  // the side's, not N3's (no match between: a match refreshes)
  EXPECT_EQ(cache->Match(side, 4).length, 0u);
  EXPECT_EQ(cache->Match(Range(1, 12), 12).length, 12u);  // N3: the cushion's far end
  EXPECT_EQ(cache->Match(Range(1, 16), 16).length, 16u);
  EXPECT_TRUE(cache->CheckInvariants()) << cache->CheckInvariants().error().ToString();
}

// test_paged_cache_finished_unaligned_tail_freed (mamba, page 4): a finished request of 6
// tokens (one page and a 2-token tail). SGLang frees the tail and the aligned 4 tokens match;
// its engine tracks the state at the last page boundary (the mamba track buffer), which is
// the checkpoint at 4 here. Both rules side by side (UnalignedTail; docs/ARCHITECTURE.md,
// "The hybrid prefix cache, against SGLang's mamba radix cache", says why kKeep is the default).
struct TailCase {
  explicit TailCase(UnalignedTail rule) {
    a = Buffer();
    cache = PrefixCache::Create(PrefixCacheConfig{.page_tokens = 4, .unaligned_tail = rule}, a.get()).value();
  }
  // Inserts [1..6] with its 2 pages, the state at 6 and, when `tracked`, the state at 4.
  std::uint32_t InsertFinished(bool tracked) {
    auto ids = a->AllocateDemand(Demand::Of(3).Add(kState, 2).Add(kKv, 2)).value();
    std::vector<PositionedCheckpoint> cps = {{6, Checkpoint{ids[1], BlockId::Invalid()}}};
    if (tracked) cps.insert(cps.begin(), {4, Checkpoint{ids[0], BlockId::Invalid()}});
    else EXPECT_TRUE(a->Free(ids[0]));
    return cache->Insert(Range(1, 6), std::vector<BlockId>{ids[2], ids[3]}, cps).value();
  }
  std::uint64_t Live(BlockKind k) const { return a->Stats().live_blocks_per_kind[k.value()]; }
  std::unique_ptr<UnifiedBuffer> a;
  std::unique_ptr<PrefixCache> cache;
};

TEST(PrefixCacheSglang, DropFreesAFinishedRequestsUnalignedTailAndTheAlignedPrefixMatches) {
  TailCase t(UnalignedTail::kDrop);
  const auto kv = t.Live(kKv);
  EXPECT_EQ(t.InsertFinished(true), 0u);
  EXPECT_EQ(t.Live(kKv), kv + 1);          // the tail's page went back (SGLang: 2 tokens)
  EXPECT_EQ(t.Live(kState), 1u);           // the state at 6 too: off a page boundary
  EXPECT_EQ(t.cache->Match(Range(1, 4), 4).length, 4u);  // SGLang's: the aligned 4 tokens
  PrefixMatch whole = t.cache->Match(Concat(Range(1, 6), {99}), 7);
  EXPECT_EQ(whole.length, 4u);             // a returning request recomputes the tail
  EXPECT_EQ(whole.kv_length, 4u);
  EXPECT_EQ(whole.pages.size(), 1u);
  EXPECT_TRUE(t.cache->CheckInvariants()) << t.cache->CheckInvariants().error().ToString();
}

TEST(PrefixCacheSglang, DropKeepsNothingOfAFinishedRequestWithoutAnAlignedState) {
  TailCase t(UnalignedTail::kDrop);
  const auto kv = t.Live(kKv);
  EXPECT_EQ(t.InsertFinished(false), 0u);
  EXPECT_EQ(t.Live(kKv), kv);  // both pages freed: no checkpoint on a page boundary
  EXPECT_EQ(t.Live(kState), 0u);
  EXPECT_EQ(t.cache->num_nodes(), 0u);
}

// Ours (kKeep): the partial page stays, so the 4 aligned tokens alone match nothing (no state
// at 4), but a returning request that extends the finished one resumes at its end, 6.
TEST(PrefixCacheSglang, KeepCachesTheUnalignedTailAndAReturnResumesAtItsEnd) {
  TailCase t(UnalignedTail::kKeep);
  const auto kv = t.Live(kKv);
  EXPECT_EQ(t.InsertFinished(false), 0u);
  EXPECT_EQ(t.Live(kKv), kv + 2);
  EXPECT_EQ(t.cache->Match(Range(1, 4), 4).length, 0u);
  PrefixMatch whole = t.cache->Match(Concat(Range(1, 6), {99}), 7);
  EXPECT_EQ(whole.length, 6u);
  EXPECT_EQ(whole.pages.size(), 2u);
  EXPECT_TRUE(t.cache->CheckInvariants()) << t.cache->CheckInvariants().error().ToString();
}

// A chunk is never the finished request: InsertChunk keeps its unaligned end under kDrop too
// (the request goes on from there, SGLang's cache_unfinished_req).
TEST(PrefixCacheSglang, DropLeavesAChunksUnalignedEndCached) {
  TailCase t(UnalignedTail::kDrop);
  auto ids = t.a->AllocateDemand(Demand::Of(3).Add(kState, 1).Add(kKv, 2)).value();
  const std::vector<PositionedCheckpoint> cps = {{6, Checkpoint{ids[0], BlockId::Invalid()}}};
  auto m = t.cache->InsertChunk(Range(1, 6), std::vector<BlockId>{ids[1], ids[2]}, cps, PrefixMatch{});
  ASSERT_TRUE(m) << m.error().ToString();
  EXPECT_EQ(m->length, 6u);
  ASSERT_TRUE(t.cache->Unlock(*m));
}

}  // namespace
}  // namespace ula
