// Randomized: the window-only prefix cache (no recurrent kind: SGLang's SWA
// radix cache) under inserts that share prefixes, matches, locks, early window releases and
// evictions by count and by demand. After every operation the cache's invariants hold; every
// match is a prefix some insert gave, is Holds(), and carries its window's pages; and every
// so often the counters are paid (in this mode too): evicting all that
// Metrics calls evictable frees exactly that, kind by kind, with matches still locked.
// Each window rule (WindowRecency: kCushion, kPath) runs every window.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <random>
#include <vector>

#include "prefix/event_hashes.h"
#include "test_seed.h"
#include "ula/prefix_cache.h"
#include "ula/unified_buffer.h"

namespace ula {
namespace {

constexpr BlockKind kKv(1), kSwa(2);
constexpr std::uint64_t kBlock = 64;
using Tokens = std::vector<std::uint32_t>;

std::uint32_t CommonPrefix(const Tokens& a, const Tokens& b) {
  std::uint32_t n = 0;
  while (n < a.size() && n < b.size() && a[n] == b[n]) ++n;
  return n;
}

class WindowOnlyRandom {
 public:
  WindowOnlyRandom(std::uint64_t seed, std::uint32_t window, WindowRecency recency) : rng_(seed), window_(window) {
    UnifiedBufferConfig c;
    c.alignment = 64;
    c.capacity_bytes = 96 * kBlock;  // a few dozen tokens' KV and window pages: inserts evict
    c.kinds = {{"state", kBlock, BufferEnd::kLow}, {"kv", kBlock, BufferEnd::kHigh}, {"swa", kBlock, BufferEnd::kLow}};
    c.padding_kind = kKv;
    c.padding_blocks = 0;
    buffer_ = UnifiedBuffer::Create(c).value();
    cache_ = PrefixCache::Create(PrefixCacheConfig{.page_tokens = 1, .state_kind = BlockKind::Invalid(),
                                                   .sliding_window = window, .record_events = true,
                                                   .window_recency = recency},
                                 buffer_.get())
                 .value();
  }

  void Run(int steps) {
    for (step_ = 0; step_ < steps && !::testing::Test::HasFatalFailure(); ++step_) {
      const std::uint32_t op = Uniform(0, 99);
      if (op < 30) {
        Insert();
      } else if (op < 55) {
        MatchAndCheck(Query());
      } else if (op < 70) {
        LockOne();
      } else if (op < 80) {
        UnlockOne();
      } else if (op < 86) {
        ReleaseWindowOne();
      } else if (op < 94) {
        const EvictionStats s = cache_->Evict(Uniform(0, 3), Uniform(0, 1), Uniform(0, 4));
        EXPECT_EQ(s.checkpoints, 0u) << "step " << step_;
      } else if (op < 96) {
        PayEverything();
      } else {
        UnlockOne();
      }
      const Status ok = cache_->CheckInvariants();
      ASSERT_TRUE(ok) << "step " << step_ << ": " << ok.error().ToString();
      ASSERT_EQ(event_hashes_.Take(*cache_), "") << "step " << step_;  // every event's hash against its store
      const PrefixCacheMetrics m = cache_->Metrics();
      ASSERT_EQ(m.state.evictable + m.state.protected_bytes, 0u) << "step " << step_;
    }
    std::printf("window-only random: %d steps, %d inserts (%d made room, %d refused for room), %d matches (%d "
                "non-empty), %d locks, %d window releases, %d payments\n",
                step_, inserts_, evicted_for_room_, no_room_, matches_, hits_, locks_, releases_, payments_);
    EXPECT_GT(hits_, steps / 20);
    EXPECT_GT(payments_, 5);
    EXPECT_GT(releases_, 5);
    EXPECT_GT(no_room_ + evicted_for_room_, 0);  // the buffer really filled up
    EXPECT_GT(event_hashes_.checked(), steps / 2);
    while (!held_.empty()) UnlockOne();
    ASSERT_TRUE(cache_->CheckInvariants());
  }

 private:
  std::uint32_t Uniform(std::uint32_t lo, std::uint32_t hi) { return std::uniform_int_distribution<std::uint32_t>(lo, hi)(rng_); }

  // A prefix of something inserted (or nothing) and a random tail over a small alphabet.
  Tokens Query() {
    Tokens t;
    if (!inserted_.empty() && Uniform(0, 3) != 0) {
      const Tokens& base = inserted_[Uniform(0, static_cast<std::uint32_t>(inserted_.size() - 1))];
      t.assign(base.begin(), base.begin() + Uniform(0, static_cast<std::uint32_t>(base.size())));
    }
    const std::uint32_t tail = Uniform(0, 8);
    for (std::uint32_t i = 0; i < tail; ++i) t.push_back(Uniform(1, 6));
    return t;
  }
  std::uint32_t LongestInserted(const Tokens& q) const {
    std::uint32_t best = 0;
    for (const Tokens& t : inserted_) best = std::max(best, CommonPrefix(q, t));
    return best;
  }

  void Insert() {
    Tokens t = Query();
    if (t.empty()) t.push_back(Uniform(1, 4));
    if (t.size() > 24) t.resize(24);
    const auto n = static_cast<std::uint32_t>(t.size());
    const Demand d = Demand::Of(3).Add(kKv, n).Add(kSwa, n);
    if (!buffer_->CanAllocate(d)) {
      auto room = cache_->MakeRoom(d, Uniform(0, 1) ? EvictionRule::kNaive : EvictionRule::kAllocationAware);
      if (!room) {
        ASSERT_EQ(room.error().code(), ErrorCode::kResourceExhausted) << room.error().ToString();
        ++no_room_;
        return;
      }
      ++evicted_for_room_;
    }
    auto ids = buffer_->AllocateDemand(d);
    ASSERT_TRUE(ids) << ids.error().ToString();
    std::vector<BlockId> pages(ids->begin(), ids->begin() + n), window(ids->begin() + n, ids->end());
    // The request released the window pages that fell out of its window (positions before
    // n - (W - 1)), sometimes: the tree takes what it lacks only inside a window it keeps.
    if (Uniform(0, 1)) {
      for (std::uint32_t i = 0; i + (window_ - 1) < n; ++i) {
        ASSERT_TRUE(buffer_->Free(window[i]));
        window[i] = BlockId::Invalid();
      }
    }
    const std::uint32_t longest = LongestInserted(t);
    auto cached = cache_->Insert(t, pages, {}, window);
    ASSERT_TRUE(cached) << "step " << step_ << ": " << cached.error().ToString();
    EXPECT_LE(*cached, std::min(n, longest)) << "step " << step_ << ": Insert reported more cached than was inserted";
    inserted_.push_back(t);
    ++inserts_;
  }

  PrefixMatch MatchAndCheck(const Tokens& q) {
    const auto max_length = Uniform(0, static_cast<std::uint32_t>(q.size()));
    PrefixMatch m = cache_->Match(q, max_length);
    ++matches_;
    EXPECT_LE(m.length, max_length) << "step " << step_;
    EXPECT_LE(m.length, LongestInserted(q)) << "step " << step_ << ": a match longer than anything inserted";
    EXPECT_FALSE(m.checkpoint.valid()) << "step " << step_ << ": a checkpoint without a state kind";
    EXPECT_GE(m.kv_length, m.length) << "step " << step_;
    EXPECT_EQ(m.pages.size(), m.length) << "step " << step_;
    if (m.length == 0) return m;
    ++hits_;
    const Tokens prefix(q.begin(), q.begin() + m.length);
    EXPECT_TRUE(cache_->Holds(prefix)) << "step " << step_ << ": a match that Holds denies";
    EXPECT_EQ(m.window_pages.size(), m.length) << "step " << step_;
    const std::uint32_t from = m.length > window_ - 1 ? m.length - (window_ - 1) : 0;
    for (std::uint32_t i = from; i < m.length && i < m.window_pages.size(); ++i) {
      EXPECT_TRUE(m.window_pages[i].valid()) << "step " << step_ << ": the match's window lacks position " << i;
    }
    return m;
  }

  void LockOne() {
    PrefixMatch m = MatchAndCheck(Query());
    if (m.length == 0) return;
    ASSERT_TRUE(cache_->Lock(m)) << "step " << step_;
    held_.push_back(std::move(m));
    ++locks_;
  }
  void UnlockOne() {
    if (held_.empty()) return;
    const std::size_t i = Uniform(0, static_cast<std::uint32_t>(held_.size() - 1));
    ASSERT_TRUE(cache_->Unlock(held_[i])) << "step " << step_;
    held_.erase(held_.begin() + static_cast<std::ptrdiff_t>(i));
  }
  void ReleaseWindowOne() {
    for (PrefixMatch& m : held_) {
      if (m.window_pages.empty()) continue;
      ASSERT_TRUE(cache_->ReleaseWindow(m)) << "step " << step_;
      const auto digest = cache_->DebugDigest();  // a second release has nothing left to give back
      EXPECT_TRUE(cache_->ReleaseWindow(m)) << "step " << step_;
      EXPECT_EQ(cache_->DebugDigest(), digest) << "step " << step_ << ": a second early release changed the cache";
      ++releases_;
      return;
    }
  }

  // Every counter can be paid: Evict of everything frees what Metrics called evictable, kind
  // by kind, and leaves nothing evictable; locked matches keep what they protect.
  void PayEverything() {
    const PrefixCacheMetrics before = cache_->Metrics();
    const auto live = buffer_->Stats().live_blocks_per_kind;
    (void)cache_->Evict(1u << 30, 1u << 30, 1u << 30);
    const auto after = buffer_->Stats().live_blocks_per_kind;
    const PrefixCacheMetrics left = cache_->Metrics();
    EXPECT_EQ((live[kKv.value()] - after[kKv.value()]) * kBlock, before.kv.evictable) << "step " << step_;
    EXPECT_EQ((live[kSwa.value()] - after[kSwa.value()]) * kBlock, before.window.evictable) << "step " << step_;
    EXPECT_EQ(left.kv.evictable, 0u) << "step " << step_;
    EXPECT_EQ(left.window.evictable, 0u) << "step " << step_;
    EXPECT_EQ(left.kv.protected_bytes, before.kv.protected_bytes) << "step " << step_;
    EXPECT_EQ(left.window.protected_bytes, before.window.protected_bytes) << "step " << step_;
    ++payments_;
  }

  std::mt19937_64 rng_;
  std::uint32_t window_;
  std::unique_ptr<UnifiedBuffer> buffer_;
  std::unique_ptr<PrefixCache> cache_;
  std::vector<Tokens> inserted_;
  std::vector<PrefixMatch> held_;
  EventHashes event_hashes_;
  int step_ = 0, inserts_ = 0, no_room_ = 0, evicted_for_room_ = 0, matches_ = 0, hits_ = 0, locks_ = 0;
  int releases_ = 0, payments_ = 0;
};

// Both window rules (WindowRecency), each window under each, half the steps apiece.
TEST(PrefixCacheRandom, WindowOnlyCacheMatchesWhatWasInsertedAndPaysItsCounters) {
  ULA_TEST_SEEDED(seed, 20261203);
  for (WindowRecency recency : {WindowRecency::kCushion, WindowRecency::kPath}) {
    const char* rule = recency == WindowRecency::kCushion ? "cushion" : "path";
    for (std::uint32_t window : {2u, 5u}) {
      SCOPED_TRACE("window " + std::to_string(window) + ", " + rule + " recency");
      std::printf("seed=%llu window=%u recency=%s\n", static_cast<unsigned long long>(seed), window, rule);
      WindowOnlyRandom(seed + window, window, recency).Run(2000);
      if (::testing::Test::HasFatalFailure()) return;
    }
  }
}

}  // namespace
}  // namespace ula
