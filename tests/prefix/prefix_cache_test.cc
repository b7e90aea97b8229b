#include "ula/prefix_cache.h"

#include <gtest/gtest.h>

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
  EXPECT_EQ(cache->num_nodes(), 4u);
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

TEST(PrefixCache, ACheckpointAttachedToALockedNodeIsPinnedUntilUnlock) {
  auto a = Buffer(128);
  auto cache = Cache(*a);
  InsertSequence(*cache, *a, Tokens(0, 8), {});  // checkpoint only at 8
  auto q = Tokens(0, 8);
  q.push_back(1);
  auto m = cache->Match(q, 8);
  ASSERT_EQ(m.length, 8u);
  ASSERT_TRUE(cache->Lock(m));
  InsertSequence(*cache, *a, Tokens(0, 8), {4});  // attaches a checkpoint at 4 to a locked node
  auto at4 = cache->Match(Tokens(0, 5), 4);
  ASSERT_EQ(at4.length, 4u);
  EXPECT_EQ(a->Free(at4.checkpoint.state).error().code(), ErrorCode::kFailedPrecondition);  // pinned
  ASSERT_TRUE(cache->Unlock(m));
  EXPECT_TRUE(a->CheckInvariants());
  for (const auto& b : a->LiveBlocks()) EXPECT_EQ(b.pins, 0u);
  EXPECT_TRUE(cache->CheckInvariants());
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
  EXPECT_EQ(PrefixCache::Create(PrefixCacheConfig{.page_tokens = 0}, a.get()).error().code(), ErrorCode::kInvalidArgument);
  EXPECT_TRUE(cache->CheckInvariants());
}

}  // namespace
}  // namespace ula
