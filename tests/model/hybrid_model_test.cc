#include "model/hybrid_model.h"

#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "unified/fixed_split_allocator.h"
#include "model/hybrid_runner.h"
#include "ula/unified_buffer.h"
#include "test_seed.h"

namespace ula {
namespace {

std::unique_ptr<HybridModel> SmallModel() { return HybridModel::Create(HybridModelConfig{}).value(); }

std::unique_ptr<UnifiedBuffer> Buffer(const HybridModel& model, std::uint64_t pages,
                                      CompactionMode mode = CompactionMode::kLazy) {
  UnifiedBufferConfig c;
  c.compaction = mode;
  c.alignment = 64;
  c.kinds = model.Kinds(64);
  c.capacity_bytes = pages * c.kinds[1].block_bytes;
  c.padding_kind = kModelKvKind;
  c.padding_blocks = 1;
  return UnifiedBuffer::Create(c).value();
}

std::unique_ptr<PrefixCache> Cache(const HybridModel& model, HybridAllocator& a) {
  PrefixCacheConfig c;
  c.page_tokens = model.config().page_tokens;
  return PrefixCache::Create(c, &a).value();
}

std::vector<std::uint32_t> RandomTokens(std::uint32_t seed, std::size_t n, std::uint32_t vocab) {
  static const std::uint64_t base = ::ula::testing::TestSeed(0);  // ULA_TEST_SEED varies every prompt
  std::mt19937 rng(static_cast<std::uint32_t>(base + seed));
  std::vector<std::uint32_t> t(n);
  for (auto& x : t) x = rng() % vocab;
  return t;
}

void ExpectBitIdentical(const ServeResult& a, const ServeResult& b) {
  EXPECT_EQ(a.output, b.output);
  ASSERT_EQ(a.last_logits.size(), b.last_logits.size());
  EXPECT_EQ(std::memcmp(a.last_logits.data(), b.last_logits.data(), a.last_logits.size() * sizeof(float)), 0)
      << "logits differ in their bits";
}

// Generating from scratch, on its own buffer, without a cache.
ServeResult FromScratch(const HybridModel& model, std::span<const std::uint32_t> prompt, std::uint32_t new_tokens) {
  auto buffer = Buffer(model, 512);
  HybridRunner runner(model, *buffer, nullptr);
  auto r = runner.Serve(prompt, ServeOptions{.max_new_tokens = new_tokens});
  EXPECT_TRUE(r) << r.error().ToString();
  EXPECT_EQ(buffer->Stats().live_bytes, 0u);  // everything given back
  return *r;
}

TEST(HybridModel, ReusingACachedPrefixAtAnIntervalCheckpointIsBitIdenticalToFromScratch) {
  auto model = SmallModel();
  const auto vocab = model->config().vocab;
  auto buffer = Buffer(*model, 512);
  auto cache = Cache(*model, *buffer);
  HybridRunner runner(*model, *buffer, cache.get());
  const auto a = RandomTokens(11, 100, vocab);
  // Checkpoints every 32 tokens (32, 64, 96) and at the end (103).
  ASSERT_TRUE(runner.Serve(a, ServeOptions{.max_new_tokens = 4, .checkpoint_interval = 32}));
  auto b = std::vector<std::uint32_t>(a.begin(), a.begin() + 80);
  const auto tail = RandomTokens(12, 30, vocab);
  b.insert(b.end(), tail.begin(), tail.end());
  auto reused = runner.Serve(b, ServeOptions{.max_new_tokens = 6, .checkpoint_interval = 32});
  ASSERT_TRUE(reused) << reused.error().ToString();
  EXPECT_EQ(reused->matched, 64u);  // shares 80 tokens; the last checkpoint within them is at 64
  EXPECT_EQ(reused->recomputed, b.size() - 64);
  ExpectBitIdentical(*reused, FromScratch(*model, b, 6));
  EXPECT_TRUE(cache->CheckInvariants());
  EXPECT_TRUE(buffer->CheckInvariants());
}

TEST(HybridModel, ReusingTheEndOfRequestCheckpointIsBitIdenticalToFromScratch) {
  auto model = SmallModel();
  const auto vocab = model->config().vocab;
  auto buffer = Buffer(*model, 512);
  auto cache = Cache(*model, *buffer);
  HybridRunner runner(*model, *buffer, cache.get());
  const auto a = RandomTokens(21, 90, vocab);
  auto first = runner.Serve(a, ServeOptions{.max_new_tokens = 5});
  ASSERT_TRUE(first);
  // A follow-up turn: the whole first conversation (prompt + its output) plus new tokens.
  // The cache holds 94 tokens: the reused last page is partial and gets copied, not written.
  std::vector<std::uint32_t> b = a;
  b.insert(b.end(), first->output.begin(), first->output.end() - 1);  // what the cache holds (94 tokens)
  const auto tail = RandomTokens(22, 20, vocab);
  b.insert(b.end(), tail.begin(), tail.end());
  auto reused = runner.Serve(b, ServeOptions{.max_new_tokens = 5});
  ASSERT_TRUE(reused);
  EXPECT_EQ(reused->matched, 94u);
  ExpectBitIdentical(*reused, FromScratch(*model, b, 5));
}

// A cache that drops a finished sequence's unaligned tail (SGLang's): the runner saves the
// state at the last page boundary the request reaches, and a follow-up turn resumes there,
// bit-identically. The boundary falls in the decode (94 tokens: 80) and in the prefill
// (81 + 3 - 1 = 83 tokens, prompt 81: 80).
TEST(HybridModel, DroppingTheUnalignedTailResumesAtTheLastPageBoundaryBitIdentically) {
  auto model = SmallModel();
  const auto vocab = model->config().vocab;
  const std::uint32_t P = model->config().page_tokens;
  for (const auto& [prompt_len, new_tokens] : {std::pair{90u, 5u}, std::pair{81u, 3u}}) {
    auto buffer = Buffer(*model, 512);
    auto cache = PrefixCache::Create(PrefixCacheConfig{.page_tokens = P, .unaligned_tail = UnalignedTail::kDrop},
                                     buffer.get()).value();
    HybridRunner runner(*model, *buffer, cache.get());
    const auto a = RandomTokens(23, prompt_len, vocab);
    auto first = runner.Serve(a, ServeOptions{.max_new_tokens = new_tokens});
    ASSERT_TRUE(first) << first.error().ToString();
    std::vector<std::uint32_t> b = a;
    b.insert(b.end(), first->output.begin(), first->output.end());
    const auto tail = RandomTokens(24, 20, vocab);
    b.insert(b.end(), tail.begin(), tail.end());
    const std::uint32_t fed = prompt_len + new_tokens - 1;
    ASSERT_NE(fed % P, 0u);
    auto reused = runner.Serve(b, ServeOptions{.max_new_tokens = 5});
    ASSERT_TRUE(reused) << reused.error().ToString();
    EXPECT_EQ(reused->matched, fed / P * P) << prompt_len;  // the tail is recomputed
    ExpectBitIdentical(*reused, FromScratch(*model, b, 5));
    EXPECT_TRUE(cache->CheckInvariants());
  }
}

TEST(HybridModel, KvPastTheLastCheckpointIsNotReused) {
  auto model = SmallModel();
  auto buffer = Buffer(*model, 512);
  auto cache = Cache(*model, *buffer);
  HybridRunner runner(*model, *buffer, cache.get());
  const auto a = RandomTokens(31, 100, model->config().vocab);
  ASSERT_TRUE(runner.Serve(a, ServeOptions{.max_new_tokens = 2, .checkpoint_interval = 48}));
  // Shares 70 tokens with a; KV exists up to 64 (4 full pages), the last checkpoint <= 70 is at 48.
  auto b = std::vector<std::uint32_t>(a.begin(), a.begin() + 70);
  b.push_back((a[70] + 1) % model->config().vocab);
  auto r = runner.Serve(b, ServeOptions{.max_new_tokens = 2});
  ASSERT_TRUE(r);
  EXPECT_EQ(r->matched, 48u);
  ExpectBitIdentical(*r, FromScratch(*model, b, 2));
}

std::vector<std::uint32_t> Join(std::span<const std::uint32_t> head, std::span<const std::uint32_t> tail) {
  std::vector<std::uint32_t> v(head.begin(), head.end());
  v.insert(v.end(), tail.begin(), tail.end());
  return v;
}

TEST(HybridModel, ATokenGranularMatchInsideAPageFromTheBranchingPointIsBitIdentical) {
  auto model = SmallModel();
  const auto vocab = model->config().vocab;
  auto buffer = Buffer(*model, 512);
  auto cache = Cache(*model, *buffer);
  HybridRunner runner(*model, *buffer, cache.get());
  const auto a = RandomTokens(51, 100, vocab);
  ASSERT_TRUE(runner.Serve(a, ServeOptions{.max_new_tokens = 3}));  // a checkpoint only at its end
  // b diverges from a at 70 (inside page 4): no state there yet, but the KV runs to 70,
  // so b saves a checkpoint at that branching point.
  const auto b = Join(std::span(a).first(70), RandomTokens(52, 20, vocab));
  auto rb = runner.Serve(b, ServeOptions{.max_new_tokens = 3, .branch_alignment = 1});
  ASSERT_TRUE(rb);
  EXPECT_EQ(rb->matched, 0u);
  EXPECT_EQ(rb->branch, 70u);
  ExpectBitIdentical(*rb, FromScratch(*model, b, 3));
  // c shares 75 tokens with a: it resumes at 70, copying the partial page 4 of the cache.
  const auto c = Join(std::span(a).first(75), RandomTokens(53, 20, vocab));
  for (int round = 0; round < 2; ++round) {  // twice: the first reuse wrote only its own copies
    auto rc = runner.Serve(c, ServeOptions{.max_new_tokens = 4, .insert_into_cache = false});
    ASSERT_TRUE(rc) << rc.error().ToString();
    EXPECT_EQ(rc->matched, 70u);
    ExpectBitIdentical(*rc, FromScratch(*model, c, 4));
  }
  EXPECT_TRUE(cache->CheckInvariants());
  EXPECT_TRUE(buffer->CheckInvariants());
}

TEST(HybridModel, ChunkedPrefillIsBitIdenticalAndItsChunksAreReusedAtOnce) {
  auto model = SmallModel();
  const auto vocab = model->config().vocab;
  auto buffer = Buffer(*model, 512);
  auto cache = Cache(*model, *buffer);
  HybridRunner runner(*model, *buffer, cache.get());
  const auto a = RandomTokens(61, 100, vocab);
  // Chunks of 40 tokens: inserted at 40 and 80, both inside a page (copied to continue).
  auto ra = runner.Serve(a, ServeOptions{.max_new_tokens = 4, .prefill_chunk = 40});
  ASSERT_TRUE(ra) << ra.error().ToString();
  EXPECT_EQ(ra->chunks_inserted, 2u);
  ExpectBitIdentical(*ra, FromScratch(*model, a, 4));
  const auto b = Join(std::span(a).first(85), RandomTokens(62, 10, vocab));
  auto rb = runner.Serve(b, ServeOptions{.max_new_tokens = 4, .prefill_chunk = 8});
  ASSERT_TRUE(rb) << rb.error().ToString();
  EXPECT_EQ(rb->matched, 80u);
  ExpectBitIdentical(*rb, FromScratch(*model, b, 4));
  EXPECT_TRUE(cache->CheckInvariants());
  EXPECT_TRUE(buffer->CheckInvariants());
}

TEST(HybridModel, ATombstonedStateIsRecomputedFromTheNearestStateBitIdentically) {
  auto model = SmallModel();
  const auto vocab = model->config().vocab;
  auto buffer = Buffer(*model, 512);
  auto cache = Cache(*model, *buffer);
  HybridRunner runner(*model, *buffer, cache.get());
  const auto a = RandomTokens(71, 100, vocab);
  auto ra = runner.Serve(a, ServeOptions{.max_new_tokens = 2, .checkpoint_interval = 32});  // 32, 64, 96, 101
  ASSERT_TRUE(ra);
  // A running request holds a's end; the states at 32 and 64 are evicted (tombstones: the
  // root side first, as SGLang).
  const auto fed = Join(a, std::span(ra->output).first(1));
  auto held = cache->Match(fed, static_cast<std::uint32_t>(fed.size()));
  ASSERT_EQ(held.length, 101u);
  ASSERT_TRUE(cache->Lock(held));
  const auto stats = cache->Evict(0, 2);
  EXPECT_EQ(stats.tombstones, 2u);
  EXPECT_EQ(stats.pages, 0u);
  ASSERT_TRUE(cache->Unlock(held));
  const auto b = Join(std::span(a).first(100), RandomTokens(72, 12, vocab));
  auto rb = runner.Serve(b, ServeOptions{.max_new_tokens = 3});
  ASSERT_TRUE(rb);
  EXPECT_EQ(rb->matched, 96u);   // the nearest state left
  EXPECT_EQ(rb->branch, 100u);   // the KV still runs to 100
  ExpectBitIdentical(*rb, FromScratch(*model, b, 3));
  EXPECT_TRUE(cache->CheckInvariants());
}

TEST(HybridModel, SpeculativeDecodingIsBitIdenticalForAcceptedPartlyAcceptedAndRejectedDrafts) {
  auto model = SmallModel();
  const auto vocab = model->config().vocab;
  const auto prompt = RandomTokens(81, 75, vocab);
  const std::uint32_t n = 14;
  const ServeResult reference = FromScratch(*model, prompt, n);
  // Drafters built from the reference continuation: right, right but every 3rd token, wrong.
  auto truth = [&](std::span<const std::uint32_t> context, std::uint32_t k, int mode) {
    std::vector<std::uint32_t> d;
    for (std::size_t i = context.size() - prompt.size(); i < reference.output.size() && d.size() < k; ++i) {
      const std::uint32_t t = reference.output[i];
      const bool wrong = mode == 2 || (mode == 1 && i % 3 == 0);
      d.push_back(wrong ? (t + 1) % vocab : t);
    }
    return d;
  };
  struct Case {
    int mode;
    const char* name;
  };
  for (const Case& c : {Case{0, "accepted"}, Case{1, "partly accepted"}, Case{2, "rejected"}}) {
    SCOPED_TRACE(c.name);
    auto buffer = Buffer(*model, 512);
    auto cache = Cache(*model, *buffer);
    HybridRunner runner(*model, *buffer, cache.get());
    ServeOptions o{.max_new_tokens = n, .draft_tokens = 4};
    o.drafter = [&](std::span<const std::uint32_t> context, std::uint32_t k) { return truth(context, k, c.mode); };
    auto r = runner.Serve(prompt, o);
    ASSERT_TRUE(r) << r.error().ToString();
    ExpectBitIdentical(*r, reference);
    EXPECT_GT(r->drafted, 0u);
    if (c.mode == 0) {
      EXPECT_EQ(r->accepted, r->drafted);
    } else if (c.mode == 1) {
      EXPECT_TRUE(r->accepted > 0 && r->accepted < r->drafted);
    } else {
      EXPECT_EQ(r->accepted, 0u);
    }
    // The committed state is the right one: a follow-up turn resumes from it bit-identically.
    auto next_turn = Join(Join(prompt, std::span(r->output).first(n - 1)), RandomTokens(82, 6, vocab));
    auto follow = runner.Serve(next_turn, ServeOptions{.max_new_tokens = 3});
    ASSERT_TRUE(follow);
    EXPECT_EQ(follow->matched, prompt.size() + n - 1);
    ExpectBitIdentical(*follow, FromScratch(*model, next_turn, 3));
    EXPECT_TRUE(buffer->CheckInvariants());
    EXPECT_TRUE(cache->CheckInvariants());
  }
}

TEST(HybridModel, CheckpointsRoundTrippedThroughTheHostTierAreBitIdentical) {
  auto model = SmallModel();
  const auto vocab = model->config().vocab;
  auto backend = MakeCpuBackend(CpuBackendOptions{.copy_threads = 1});
  UnifiedBufferConfig c;
  c.alignment = 64;
  c.kinds = model->Kinds(64);
  c.capacity_bytes = 512 * c.kinds[1].block_bytes;
  c.padding_kind = kModelKvKind;
  c.padding_blocks = 1;
  auto device = backend->CreateArena(Tier::kDevice, Rank(0), c.capacity_bytes).value();
  auto buffer = UnifiedBuffer::Create(c, device).value();
  auto host = backend->CreateArena(Tier::kHost, Rank(0), 8 * (c.kinds[0].block_bytes + c.kinds[2].block_bytes)).value();
  auto cache = Cache(*model, *buffer);
  ASSERT_TRUE(cache->AttachHostTier({backend.get(), device.id, host, 8}));
  HybridRunner runner(*model, *buffer, cache.get());
  const auto a = RandomTokens(91, 100, vocab);
  ASSERT_TRUE(runner.Serve(a, ServeOptions{.max_new_tokens = 4, .checkpoint_interval = 32}));  // 32, 64, 96, 103
  const auto stats = cache->Evict(0, 10);  // every state goes to the host tier, the KV stays
  EXPECT_EQ(stats.offloaded, 4u);
  EXPECT_EQ(stats.pages, 0u);
  EXPECT_EQ(cache->num_checkpoints(), 0u);
  EXPECT_EQ(cache->Metrics().host_checkpoints, 4u);
  const auto b = Join(std::span(a).first(100), RandomTokens(92, 12, vocab));
  auto rb = runner.Serve(b, ServeOptions{.max_new_tokens = 3});
  ASSERT_TRUE(rb) << rb.error().ToString();
  EXPECT_EQ(rb->matched, 96u);  // brought back from the host
  EXPECT_EQ(cache->Metrics().host_hits, 1u);
  ExpectBitIdentical(*rb, FromScratch(*model, b, 3));
  EXPECT_TRUE(cache->CheckInvariants());
  EXPECT_TRUE(buffer->CheckInvariants());
}

TEST(HybridModel, OutputDoesNotDependOnTheAllocatorOrOnCompaction) {
  auto model = SmallModel();
  const auto prompt = RandomTokens(41, 70, model->config().vocab);
  const ServeResult reference = FromScratch(*model, prompt, 4);
  // Fixed pools.
  FixedSplitConfig fc;
  fc.kinds = model->Kinds(64);
  fc.capacity_bytes = 256 * fc.kinds[1].block_bytes;
  fc.fractions = {0.3, 0.5, 0.2};
  fc.padding_kind = kModelKvKind;
  fc.padding_blocks = 1;
  auto fixed = FixedSplitAllocator::Create(fc).value();
  HybridRunner fixed_runner(*model, *fixed, nullptr);
  ExpectBitIdentical(*fixed_runner.Serve(prompt, ServeOptions{.max_new_tokens = 4}), reference);
  // A unified buffer whose blocks get moved by compaction between the request's prefill
  // and its reuse: the prompt's first 64 tokens are cached above other prefixes, those are
  // evicted (eager compaction moves the prompt's cached pages and checkpoints into their
  // holes), then the prompt is served again from the moved blocks.
  auto small = Buffer(*model, 96, CompactionMode::kEager);
  auto cache = Cache(*model, *small);
  HybridRunner runner(*model, *small, cache.get());
  std::vector<std::vector<std::uint32_t>> fillers;
  for (std::uint32_t s = 0; s < 2; ++s) {
    fillers.push_back(RandomTokens(100 + s, 40, model->config().vocab));
    ASSERT_TRUE(runner.Serve(fillers.back(), ServeOptions{.max_new_tokens = 2, .checkpoint_interval = 16}));
    fillers.back().resize(16);  // a prefix with a checkpoint at its end
    ASSERT_TRUE(cache->Holds(fillers.back()));
  }
  const std::vector<std::uint32_t> head(prompt.begin(), prompt.begin() + 64);
  ASSERT_TRUE(runner.Serve(head, ServeOptions{.max_new_tokens = 1, .checkpoint_interval = 16}));
  const std::vector<std::uint32_t> head48(prompt.begin(), prompt.begin() + 48);
  ASSERT_TRUE(cache->Holds(head48));
  const std::uint64_t moved_before = small->Stats().blocks_moved;
  // Evict the two older prefixes (least recently used), one page of demand more at a time,
  // and nothing of the prompt's.
  for (std::uint32_t pages = 1; pages < 64 && (cache->Holds(fillers[0]) || cache->Holds(fillers[1])); ++pages) {
    ASSERT_TRUE(cache->MakeRoom(Demand::Of(small->num_kinds()).Add(kModelKvKind, pages), EvictionRule::kAllocationAware));
  }
  ASSERT_FALSE(cache->Holds(fillers[0]) || cache->Holds(fillers[1]));
  ASSERT_TRUE(cache->Holds(head48));
  EXPECT_GT(small->Stats().blocks_moved, moved_before) << "no cached block moved: the test would show nothing";
  auto r = runner.Serve(prompt, ServeOptions{.max_new_tokens = 4});
  ASSERT_TRUE(r) << r.error().ToString();
  EXPECT_GE(r->matched, 48u);  // read from the moved pages and checkpoint
  ExpectBitIdentical(*r, reference);
  EXPECT_TRUE(small->CheckInvariants());
  EXPECT_TRUE(cache->CheckInvariants());
}

// Sliding-window KV as tokens: window pages in the tree, released outside the window.
std::unique_ptr<HybridModel> WindowPagesModel(std::uint32_t window) {
  HybridModelConfig c;
  c.window = window;
  c.window_in_pages = true;
  return HybridModel::Create(c).value();
}
std::unique_ptr<HybridModel> RingModel(std::uint32_t window) {
  HybridModelConfig c;
  c.window = window;
  return HybridModel::Create(c).value();
}
std::unique_ptr<PrefixCache> WindowCache(const HybridModel& model, HybridAllocator& a) {
  PrefixCacheConfig c;
  c.page_tokens = model.config().page_tokens;
  c.sliding_window = model.config().window;
  return PrefixCache::Create(c, &a).value();
}

TEST(HybridModel, WindowPagesGiveTheRingsOutputsAndReleaseWhatLeavesTheWindow) {
  auto model = WindowPagesModel(24);
  auto ring = RingModel(24);  // the same weights, the window kept in a ring
  const auto vocab = model->config().vocab;
  auto buffer = Buffer(*model, 512);
  auto cache = WindowCache(*model, *buffer);
  HybridRunner runner(*model, *buffer, cache.get());
  const auto a = RandomTokens(81, 100, vocab);
  auto ra = runner.Serve(a, ServeOptions{.max_new_tokens = 4});
  ASSERT_TRUE(ra) << ra.error().ToString();
  ExpectBitIdentical(*ra, FromScratch(*ring, a, 4));
  // The tree keeps a's KV pages, but only the window pages of its end's window: 103
  // tokens, window 24 -> tokens [80, 103), pages 5 and 6 of 7.
  const auto live = buffer->Stats().live_blocks_per_kind;
  EXPECT_EQ(live[kModelKvKind.value()], 7u);
  EXPECT_EQ(live[kModelWindowKind.value()], 2u);
  // b shares a's first 103 tokens (a's end checkpoint): it resumes there, with the window.
  const auto fed = Join(a, std::span(ra->output).first(3));
  const auto b = Join(fed, RandomTokens(82, 40, vocab));
  auto rb = runner.Serve(b, ServeOptions{.max_new_tokens = 5});
  ASSERT_TRUE(rb) << rb.error().ToString();
  EXPECT_EQ(rb->matched, 103u);
  EXPECT_EQ(rb->window_released, 1u);  // the match's window lock went early, 40 tokens later
  ExpectBitIdentical(*rb, FromScratch(*ring, b, 5));
  // c diverges at 90: the KV runs to 90, but no checkpoint there, so it starts from 0;
  // with a checkpoint every 32 tokens, the ones at 32 and 64 lack their window (released).
  const auto c = Join(std::span(a).first(90), RandomTokens(83, 10, vocab));
  auto rc = runner.Serve(c, ServeOptions{.max_new_tokens = 3, .checkpoint_interval = 32});
  ASSERT_TRUE(rc) << rc.error().ToString();
  EXPECT_EQ(rc->matched, 0u);
  ExpectBitIdentical(*rc, FromScratch(*ring, c, 3));
  // Its checkpoints at 32 and 64 kept their windows (a checkpoint still to be inserted keeps
  // the pages it needs), so d resumes at 64.
  const auto d = Join(std::span(c).first(70), RandomTokens(84, 10, vocab));
  auto rd = runner.Serve(d, ServeOptions{.max_new_tokens = 3});
  ASSERT_TRUE(rd) << rd.error().ToString();
  EXPECT_EQ(rd->matched, 64u);
  ExpectBitIdentical(*rd, FromScratch(*ring, d, 3));
  EXPECT_TRUE(cache->CheckInvariants());
  EXPECT_TRUE(buffer->CheckInvariants());
}

// Chunked prefill with window pages (SGLang's cache_unfinished_req with an
// SWA model): each chunk is inserted as it completes, its match locking only its end's
// window, and a later request resumes at a chunk boundary with the window it needs.
TEST(HybridModel, ChunkedPrefillWithWindowPagesIsBitIdenticalAndResumesAtAChunk) {
  auto model = WindowPagesModel(24);
  auto ring = RingModel(24);
  const auto vocab = model->config().vocab;
  auto buffer = Buffer(*model, 512);
  auto cache = WindowCache(*model, *buffer);
  HybridRunner runner(*model, *buffer, cache.get());
  const auto a = RandomTokens(86, 100, vocab);
  auto ra = runner.Serve(a, ServeOptions{.max_new_tokens = 4, .prefill_chunk = 40});  // chunks end at 40, 80
  ASSERT_TRUE(ra) << ra.error().ToString();
  EXPECT_EQ(ra->chunks_inserted, 2u);
  ExpectBitIdentical(*ra, FromScratch(*ring, a, 4));
  EXPECT_TRUE(cache->CheckInvariants());
  const auto b = Join(std::span(a).first(85), RandomTokens(87, 10, vocab));
  auto rb = runner.Serve(b, ServeOptions{.max_new_tokens = 4, .prefill_chunk = 8});
  ASSERT_TRUE(rb) << rb.error().ToString();
  EXPECT_EQ(rb->matched, 80u);  // the chunk at 80 kept its window [56, 80)
  ExpectBitIdentical(*rb, FromScratch(*ring, b, 4));
  EXPECT_TRUE(cache->CheckInvariants());
  EXPECT_TRUE(buffer->CheckInvariants());
}

TEST(HybridModel, AMatchNeedsItsWindowAndEvictedWindowPagesAreRecomputedBitIdentically) {
  auto model = WindowPagesModel(24);
  auto ring = RingModel(24);
  const auto vocab = model->config().vocab;
  auto buffer = Buffer(*model, 512);
  auto cache = WindowCache(*model, *buffer);
  HybridRunner runner(*model, *buffer, cache.get());
  const auto a = RandomTokens(91, 100, vocab);
  auto ra = runner.Serve(a, ServeOptions{.max_new_tokens = 2, .checkpoint_interval = 32});  // 32, 64, 96, 101
  ASSERT_TRUE(ra);
  const auto fed = Join(a, std::span(ra->output).first(1));
  auto m = cache->Match(fed, static_cast<std::uint32_t>(fed.size()));
  ASSERT_EQ(m.length, 101u);
  // A running request holds a's end, and has moved past its window (the early release).
  // Window tombstones: the window pages go, KV and states stay (the path is locked);
  // nothing matches then.
  // a kept every window page (its checkpoints at 32, 64, 96 needed them all).
  ASSERT_TRUE(cache->Lock(m));
  EXPECT_EQ(cache->Evict(0, 0, 1000).window_pages, 4u);  // pages 0-3; the match's window (4-6) is locked
  EXPECT_EQ(cache->Match(fed, static_cast<std::uint32_t>(fed.size())).length, 101u);
  const auto seventy = std::vector<std::uint32_t>(a.begin(), a.begin() + 70);
  EXPECT_EQ(cache->Match(seventy, 70).length, 0u);  // the states at 32 and 64 lost their windows
  EXPECT_EQ(cache->Match(seventy, 70).kv_length, 70u);
  ASSERT_TRUE(cache->ReleaseWindow(m));
  EXPECT_TRUE(m.window_pages.empty());
  const auto stats = cache->Evict(0, 0, 1000);
  EXPECT_EQ(stats.window_pages, 3u);  // pages 4-6
  EXPECT_EQ(stats.pages, 0u);
  EXPECT_EQ(stats.checkpoints, 0u);
  EXPECT_EQ(cache->Match(fed, static_cast<std::uint32_t>(fed.size())).length, 0u);
  EXPECT_EQ(cache->Metrics().window.evictable, 0u);
  ASSERT_TRUE(cache->Unlock(m));
  // Serving a again recomputes it and gives the tree its window pages back (taken over the
  // shared prefix), so its end matches again.
  auto again = runner.Serve(a, ServeOptions{.max_new_tokens = 2, .checkpoint_interval = 32});
  ASSERT_TRUE(again);
  EXPECT_EQ(again->matched, 0u);
  ExpectBitIdentical(*again, FromScratch(*ring, a, 2));
  EXPECT_EQ(cache->Match(fed, static_cast<std::uint32_t>(fed.size())).length, 101u);
  const auto b = Join(fed, RandomTokens(92, 8, vocab));
  auto rb = runner.Serve(b, ServeOptions{.max_new_tokens = 3});
  ASSERT_TRUE(rb);
  EXPECT_EQ(rb->matched, 101u);
  ExpectBitIdentical(*rb, FromScratch(*ring, b, 3));
  EXPECT_TRUE(cache->CheckInvariants());
}

TEST(HybridModel, WindowPagesUnderMemoryPressureStayBitIdentical) {
  auto model = WindowPagesModel(20);
  auto ring = RingModel(20);
  const auto vocab = model->config().vocab;
  auto buffer = Buffer(*model, 40);
  auto cache = WindowCache(*model, *buffer);
  HybridRunner runner(*model, *buffer, cache.get());
  std::vector<std::vector<std::uint32_t>> stems;
  for (std::uint32_t i = 0; i < 3; ++i) stems.push_back(RandomTokens(100 + i, 60, vocab));
  std::mt19937 rng(static_cast<std::uint32_t>(::ula::testing::TestSeed(7)));
  std::uint32_t reused = 0, released = 0, window_evicted = 0;
  for (int i = 0; i < 24; ++i) {
    const auto& stem = stems[rng() % stems.size()];
    const auto prompt = Join(std::span(stem).first(10 + rng() % 50), RandomTokens(200 + i, 5 + rng() % 20, vocab));
    ServeOptions o{.max_new_tokens = 3 + static_cast<std::uint32_t>(rng() % 4),
                   .checkpoint_interval = (i % 3 == 0) ? 16u : 0u};
    o.rule = i % 2 ? EvictionRule::kNaive : EvictionRule::kAllocationAware;
    auto r = runner.Serve(prompt, o);
    ASSERT_TRUE(r) << r.error().ToString() << " request " << i;
    reused += r->matched > 0;
    released += r->window_released;
    window_evicted += r->evicted.window_pages;
    ExpectBitIdentical(*r, FromScratch(*ring, prompt, o.max_new_tokens));
    ASSERT_TRUE(cache->CheckInvariants()) << cache->CheckInvariants().error().ToString();
    ASSERT_TRUE(buffer->CheckInvariants());
  }
  std::printf("window pages under pressure: %u of 24 requests reused a prefix, %u early window releases, %u window "
              "pages evicted\n", reused, released, window_evicted);
  // The pressure the test is named for: window pages were evicted (42-52 with
  // ULA_TEST_SEED = 1, 2, 3, 7), and prefixes were still reused (4-11 of 24 there).
  EXPECT_GT(window_evicted, 0u) << "no window page was evicted: the buffer was not under pressure";
  EXPECT_GE(reused, 3u);
  EXPECT_GT(released, 0u);
}

TEST(HybridModel, BadInputIsAnError) {
  auto model = SmallModel();
  auto buffer = Buffer(*model, 64);
  SequenceBlocks seq;
  std::vector<float> logits(model->config().vocab);
  EXPECT_EQ(model->Step(*buffer, seq, 0, logits).error().code(), ErrorCode::kFailedPrecondition);
  seq.pages.push_back(BlockId(5));
  EXPECT_EQ(model->Step(*buffer, seq, 0, logits).error().code(), ErrorCode::kNotFound);
  EXPECT_EQ(model->Step(*buffer, seq, 9999, logits).error().code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(seq.length, 0u);
  auto cache = Cache(*model, *buffer);
  HybridRunner runner(*model, *buffer, cache.get());
  const auto live = buffer->LiveBlocks();
  EXPECT_EQ(runner.Serve(RandomTokens(1, 20, 64), ServeOptions{.max_new_tokens = 0}).error().code(),
            ErrorCode::kInvalidArgument);
  EXPECT_EQ(runner.Serve({}, ServeOptions{}).error().code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(buffer->LiveBlocks(), live);
  EXPECT_EQ(cache->num_nodes(), 0u);
  HybridModelConfig c;
  c.layers = {LayerKind::kAttention};
  EXPECT_NE(HybridModel::Create(c).error().message().find("layers"), std::string::npos);
}

}  // namespace
}  // namespace ula
