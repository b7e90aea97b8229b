// The prefix cache's events as a router consumes them (include/ula/prefix_events.h): SGLang's
// block hash by default, a medium per event (a host move is a device removal and a host
// store), typed kinds, and one AllBlocksCleared on Reset. Expected hashes were computed with
// Python's hashlib as SGLang's get_hash_str / hash_str_to_int64 do (tests/python has the same
// check against hashlib at run time).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <optional>
#include <span>
#include <vector>

#include "ula/backend.h"
#include "ula/prefix_cache.h"
#include "ula/unified_buffer.h"

namespace ula {
namespace {

constexpr BlockKind kState(0), kKv(1), kSwa(2);

std::vector<std::uint32_t> Iota(std::uint32_t first, std::size_t n) {
  std::vector<std::uint32_t> t(n);
  std::iota(t.begin(), t.end(), first);
  return t;
}

std::unique_ptr<UnifiedBuffer> Buffer(std::uint64_t units, std::optional<Arena> arena = std::nullopt) {
  UnifiedBufferConfig c;
  c.alignment = 64;
  c.capacity_bytes = units * 64;
  c.kinds = {{"state", 64, BufferEnd::kLow}, {"kv", 64, BufferEnd::kHigh}, {"swa", 64, BufferEnd::kLow}};
  c.padding_kind = kKv;
  c.padding_blocks = 0;
  return (arena ? UnifiedBuffer::Create(c, *arena) : UnifiedBuffer::Create(c)).value();
}

void InsertWithState(PrefixCache& cache, HybridAllocator& a, const std::vector<std::uint32_t>& tokens) {
  const auto P = cache.config().page_tokens;
  const auto n = static_cast<std::uint32_t>((tokens.size() + P - 1) / P);
  auto ids = a.AllocateDemand(Demand::Of(3).Add(kState, 1).Add(kKv, n)).value();
  const std::vector<BlockId> pages(ids.begin() + 1, ids.end());
  const std::vector<PositionedCheckpoint> cps = {{static_cast<std::uint32_t>(tokens.size()), {ids[0], BlockId::Invalid()}}};
  ASSERT_TRUE(cache.Insert(tokens, pages, cps));
}

std::vector<std::int64_t> HashesOf(const std::vector<CacheEvent>& events, CacheEvent::Type type, EventMedium medium) {
  std::vector<std::int64_t> out;
  for (const CacheEvent& e : events) {
    if (e.type == type && e.medium == medium) out.push_back(e.hash);
  }
  return out;
}

// SGLang's get_hash_str over [1..8] (then [9], a partial page) on 4-token pages, the first 8
// bytes of each SHA-256 as a signed int64 (hashlib: sha256(b"\x01\0\0\0...") etc.).
TEST(PrefixCacheEvents, BlockHashesAreSglangsByDefault) {
  const std::vector<std::int64_t> sglang = {-3488128144981237669LL, 5674439469042975057LL, 883607134226730776LL};
  EXPECT_EQ(BlockHashes(Iota(1, 9), 4), sglang);
  auto a = Buffer(64);
  auto cache = PrefixCache::Create(PrefixCacheConfig{.page_tokens = 4, .record_events = true}, a.get()).value();
  InsertWithState(*cache, *a, Iota(1, 9));
  std::vector<CacheEvent> pages;
  for (CacheEvent& e : cache->TakeEvents()) {
    if (e.type == CacheEvent::Type::kPageStored) pages.push_back(std::move(e));
  }
  ASSERT_EQ(pages.size(), 3u);
  for (std::size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(pages[i].hash, sglang[i]) << i;
    EXPECT_EQ(pages[i].medium, EventMedium::kDevice);
    EXPECT_TRUE(pages[i].kv() && pages[i].stored() && !pages[i].window() && !pages[i].state());
  }
  EXPECT_FALSE(pages[0].parent_hash.has_value());  // the root's page: no parent (SGLang's None)
  EXPECT_EQ(pages[1].parent_hash, sglang[0]);
  EXPECT_EQ(pages[2].tokens, std::vector<std::uint32_t>{9});
  // The debug hash is another chain, only behind the option.
  auto b = Buffer(64);
  auto debug = PrefixCache::Create(PrefixCacheConfig{.page_tokens = 4, .record_events = true, .event_hash = EventHash::kDebug},
                                   b.get())
                   .value();
  InsertWithState(*debug, *b, Iota(1, 9));
  const auto debug_hashes = HashesOf(debug->TakeEvents(), CacheEvent::Type::kPageStored, EventMedium::kDevice);
  EXPECT_EQ(debug_hashes, BlockHashes(Iota(1, 9), 4, EventHash::kDebug));
  EXPECT_NE(debug_hashes, sglang);
}

// SGLang's test_hicache_kv_events_track_gpu_cpu_transitions, for an exclusive host tier: the
// pages stored on the GPU move to the CPU (a GPU removal and a CPU store of the same hashes,
// where SGLang's write-through stores on the CPU first and removes from the GPU at
// eviction), come back (a CPU removal and a GPU store), and a host copy dropped is a CPU
// removal. The checkpoint moves the same way (state events, typed apart from the pages).
TEST(PrefixCacheEvents, HostMovesCarryTheirMedium) {
  auto backend = MakeCpuBackend(CpuBackendOptions{.copy_threads = 1});
  auto device = backend->CreateArena(Tier::kDevice, Rank(0), 32 * 64).value();
  auto host = backend->CreateArena(Tier::kHost, Rank(0), 2 * (64 + 64) + 4 * 64).value();  // 2 slots (state + ring), 4 pages
  auto a = Buffer(32, device);
  auto cache = PrefixCache::Create(PrefixCacheConfig{.page_tokens = 2, .record_events = true}, a.get()).value();
  ASSERT_TRUE(cache->AttachHostTier({backend.get(), device.id, host, 2, 4}));
  const auto seq = std::vector<std::uint32_t>{1, 2, 3, 4};
  InsertWithState(*cache, *a, seq);
  const auto stored = HashesOf(cache->TakeEvents(), CacheEvent::Type::kPageStored, EventMedium::kDevice);
  ASSERT_EQ(stored, BlockHashes(seq, 2));
  ASSERT_TRUE(cache->MakeRoom(Demand::Of(3).Add(kKv, 32), EvictionRule::kAllocationAware));  // to the host
  ASSERT_TRUE(cache->KvOnHost(seq));
  auto events = cache->TakeEvents();
  EXPECT_EQ(HashesOf(events, CacheEvent::Type::kPageRemoved, EventMedium::kDevice), stored);
  EXPECT_EQ(HashesOf(events, CacheEvent::Type::kPageStored, EventMedium::kHost), stored);
  EXPECT_EQ(std::count_if(events.begin(), events.end(), [](const CacheEvent& e) {
              return e.type == CacheEvent::Type::kStateStored && e.medium == EventMedium::kHost && e.position == 4;
            }),
            1);
  for (const CacheEvent& e : events) EXPECT_FALSE(e.medium == EventMedium::kHost && e.block.valid());
  const auto on_host = cache->StoredBlocks();
  ASSERT_EQ(on_host.size(), 2u);
  EXPECT_TRUE(std::all_of(on_host.begin(), on_host.end(), [](const CacheEvent& e) { return e.medium == EventMedium::kHost; }));
  // Load back.
  auto m = cache->MatchCopyOnWrite(seq, 4, EvictionRule::kAllocationAware);
  ASSERT_TRUE(m) << m.error().ToString();
  ASSERT_EQ(m->length, 4u);
  events = cache->TakeEvents();
  EXPECT_EQ(HashesOf(events, CacheEvent::Type::kPageRemoved, EventMedium::kHost), stored);
  EXPECT_EQ(HashesOf(events, CacheEvent::Type::kPageStored, EventMedium::kDevice), stored);
  ASSERT_TRUE(cache->Unlock(*m));
  ASSERT_TRUE(a->Free(m->copy.state));
  // Off to the host again, then a new sequence whose insert goes through the host node drops it.
  ASSERT_TRUE(cache->MakeRoom(Demand::Of(3).Add(kKv, 32), EvictionRule::kAllocationAware));
  (void)cache->TakeEvents();
  InsertWithState(*cache, *a, std::vector<std::uint32_t>{1, 2, 3, 4, 5, 6});
  events = cache->TakeEvents();
  EXPECT_EQ(HashesOf(events, CacheEvent::Type::kPageRemoved, EventMedium::kHost), stored);
  EXPECT_TRUE(cache->CheckInvariants()) << cache->CheckInvariants().error().ToString();
}

// SGLang's reset: one AllBlocksCleared, every block back to the allocator, the tree empty
// and usable; refused (nothing changed) while a match is locked.
TEST(PrefixCacheEvents, ResetClearsEverythingWithOneEvent) {
  auto a = Buffer(64);
  const auto empty = a->Stats().live_blocks_per_kind;
  auto cache = PrefixCache::Create(PrefixCacheConfig{.page_tokens = 2, .sliding_window = 3, .record_events = true}, a.get())
                   .value();
  auto ids = a->AllocateDemand(Demand::Of(3).Add(kState, 1).Add(kKv, 3).Add(kSwa, 3)).value();
  const std::vector<BlockId> pages(ids.begin() + 1, ids.begin() + 4), window(ids.begin() + 4, ids.end());
  const std::vector<PositionedCheckpoint> cps = {{6, {ids[0], BlockId::Invalid()}}};
  ASSERT_TRUE(cache->Insert(Iota(1, 6), pages, cps, window));
  (void)cache->TakeEvents();
  PrefixMatch m = cache->Match(Iota(1, 6), 6);
  ASSERT_TRUE(cache->Lock(m));
  const auto digest = cache->DebugDigest();
  EXPECT_EQ(cache->Reset().error().code(), ErrorCode::kFailedPrecondition);
  EXPECT_EQ(cache->DebugDigest(), digest);
  ASSERT_TRUE(cache->Unlock(m));
  EXPECT_EQ(cache->StoredBlocks().size(), 6u);  // 3 pages and their window pages
  ASSERT_TRUE(cache->Reset());
  const auto events = cache->TakeEvents();
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].type, CacheEvent::Type::kAllCleared);
  EXPECT_EQ(cache->num_nodes(), 0u);
  EXPECT_TRUE(cache->StoredBlocks().empty());
  EXPECT_EQ(a->Stats().live_blocks_per_kind, empty);
  EXPECT_TRUE(cache->CheckInvariants()) << cache->CheckInvariants().error().ToString();
  auto again = a->AllocateDemand(Demand::Of(3).Add(kState, 1).Add(kKv, 1).Add(kSwa, 1)).value();  // usable again
  const std::vector<PositionedCheckpoint> at2 = {{2, {again[0], BlockId::Invalid()}}};
  ASSERT_TRUE(cache->Insert(Iota(1, 2), std::span(again).subspan(1, 1), at2, std::span(again).subspan(2, 1)));
  EXPECT_EQ(cache->Match(Iota(1, 2), 2).length, 2u);
}

}  // namespace
}  // namespace ula
