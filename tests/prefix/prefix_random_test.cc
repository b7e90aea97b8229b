// Randomized prefix-cache test with a fixed, printed seed: inserts of token sequences with
// shared prefixes (some sharing the tree's own pages through a locked match), matches,
// lock/unlock, evictions under both rules with random pending demands, requests that
// allocate and free around the cache, and compaction. A shadow model keeps the expected tree
// (token prefix -> page, checkpoint, bytes, LRU stamp, locks). After every operation:
// CheckInvariants() on the cache and the buffer, the shadow's matchable prefixes against
// Match/Holds, and the bytes of every cached page and checkpoint (and of every running
// request) against their shadow copies; pinned (locked) blocks never move.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <random>

#include "ula/prefix_cache.h"
#include "ula/unified_buffer.h"

namespace ula {
namespace {

constexpr std::uint32_t kPage = 4;
constexpr BlockKind kState(0), kKv(1), kSwa(2);
using Tokens = std::vector<std::uint32_t>;
using Bytes = std::vector<std::byte>;

struct ShadowNode {
  BlockId page;
  Bytes page_bytes;
  Checkpoint checkpoint;  // invalid: none
  Bytes state_bytes, window_bytes;
  std::uint64_t last_use = 0;
  std::uint32_t locks = 0;
  std::vector<std::uint64_t> pinned_offsets;  // page, state, window while locked
};

struct Running {
  std::vector<BlockId> ids;
  std::vector<Bytes> bytes;
};

// The cache's allocator, watched: while a demand is set (allocation-aware MakeRoom), the
// eviction of a node (the free of its KV page) while the demand already fits is counted —
// eviction must stop as soon as it fits (minimal). Everything else is forwarded.
class WatchingAllocator final : public HybridAllocator {
 public:
  explicit WatchingAllocator(HybridAllocator& inner) : inner_(inner) {}
  void Watch(const Demand* demand) { demand_ = demand; }
  int late_evictions() const { return late_evictions_; }

  std::size_t num_kinds() const override { return inner_.num_kinds(); }
  const KindConfig& kind_config(BlockKind kind) const override { return inner_.kind_config(kind); }
  Result<std::vector<BlockId>> AllocateDemand(const Demand& demand) override { return inner_.AllocateDemand(demand); }
  bool CanAllocate(const Demand& demand) const override { return inner_.CanAllocate(demand); }
  Status Free(BlockId id) override {
    if (demand_ != nullptr && inner_.KindOf(id).value_or(BlockKind()) == kKv && inner_.CanAllocate(*demand_)) {
      ++late_evictions_;
    }
    return inner_.Free(id);
  }
  Status Pin(BlockId id) override { return inner_.Pin(id); }
  Status Unpin(BlockId id) override { return inner_.Unpin(id); }
  Result<BlockKind> KindOf(BlockId id) const override { return inner_.KindOf(id); }
  Result<std::uint64_t> Offset(BlockId id) const override { return inner_.Offset(id); }
  Status Translate(std::span<const BlockId> ids, std::span<std::uint64_t> offsets) const override {
    return inner_.Translate(ids, offsets);
  }
  std::byte* base() override { return inner_.base(); }
  std::uint64_t Compact() override { return inner_.Compact(); }
  AllocatorStats Stats() const override { return inner_.Stats(); }
  std::vector<BlockInfo> LiveBlocks() const override { return inner_.LiveBlocks(); }
  Status CheckInvariants() const override { return inner_.CheckInvariants(); }

 private:
  HybridAllocator& inner_;
  const Demand* demand_ = nullptr;
  int late_evictions_ = 0;
};

class PrefixRandom {
 public:
  PrefixRandom(std::uint32_t seed, CompactionMode mode) : rng_(seed) {
    UnifiedBufferConfig c;
    c.alignment = 64;
    c.capacity_bytes = 160 * 64;
    c.kinds = {{"state", 192, BufferEnd::kLow}, {"kv", 64, BufferEnd::kHigh}, {"swa", 64, BufferEnd::kLow}};
    c.padding_kind = kKv;
    c.padding_blocks = 1;
    c.compaction = mode;
    buffer_ = UnifiedBuffer::Create(c).value();
    watcher_ = std::make_unique<WatchingAllocator>(*buffer_);
    cache_ = PrefixCache::Create(PrefixCacheConfig{.page_tokens = kPage}, watcher_.get()).value();
    for (int s = 0; s < 5; ++s) {
      Tokens stem(24);
      for (auto& t : stem) t = Uniform(0, 49);
      stems_.push_back(stem);
    }
  }

  void Run(int steps) {
    for (int step = 0; step < steps; ++step) {
      step_ = step;
      const std::uint32_t op = Uniform(0, 99);
      if (op < 30) {
        Insert();
      } else if (op < 45) {
        MatchAndCheck(RandomQuery());
      } else if (op < 55) {
        LockRandom();
      } else if (op < 65) {
        UnlockRandom();
      } else if (op < 82) {
        Evict();
      } else if (op < 90) {
        FreeRunning();
      } else if (op < 92) {
        RefusedCalls();
      } else {
        buffer_->Compact();
      }
      Verify();
      if (::testing::Test::HasFatalFailure()) return;
    }
    while (!locked_.empty()) UnlockRandom();
    Verify();
    std::printf("  %d inserts, %d matches with a hit, %d evictions (%d refused), %llu nodes evicted, %llu bytes moved\n",
                inserts_, hits_, evictions_, refused_, static_cast<unsigned long long>(evicted_nodes_),
                static_cast<unsigned long long>(buffer_->Stats().bytes_moved));
    EXPECT_GT(evicted_nodes_, 0u);
    EXPECT_GT(hits_, 0);
    EXPECT_GT(buffer_->Stats().blocks_moved, 0u);
  }

 private:
  std::uint32_t Uniform(std::uint32_t lo, std::uint32_t hi) {
    return std::uniform_int_distribution<std::uint32_t>(lo, hi)(rng_);
  }
  Bytes Fill(BlockId id) {
    auto span = buffer_->Bytes(id).value();
    Bytes b(span.size());
    for (auto& x : b) x = std::byte(rng_() & 0xff);
    std::memcpy(span.data(), b.data(), b.size());
    return b;
  }
  static Tokens Prefix(const Tokens& t, std::size_t n) { return Tokens(t.begin(), t.begin() + n); }
  static Tokens ParentKey(const Tokens& key) { return Prefix(key, (key.size() - 1) / kPage * kPage); }
  // Keys of the nodes covering tokens [0, length).
  static std::vector<Tokens> PathKeys(const Tokens& tokens, std::size_t length) {
    std::vector<Tokens> keys;
    for (std::size_t end = kPage; end < length + kPage; end += kPage) keys.push_back(Prefix(tokens, std::min(end, length)));
    return keys;
  }

  Tokens RandomSequence() {
    const Tokens& stem = stems_[Uniform(0, static_cast<std::uint32_t>(stems_.size() - 1))];
    Tokens t = Prefix(stem, Uniform(0, 24));
    const std::uint32_t extra = Uniform(t.empty() ? 1 : 0, 8);
    for (std::uint32_t i = 0; i < extra; ++i) t.push_back(100 + Uniform(0, 2));
    return t;
  }
  Tokens RandomQuery() {
    if (tree_.empty() || Uniform(0, 2) == 0) return RandomSequence();
    auto it = tree_.begin();
    std::advance(it, Uniform(0, static_cast<std::uint32_t>(tree_.size() - 1)));
    Tokens t = it->first;
    for (std::uint32_t i = Uniform(0, 6); i > 0; --i) t.push_back(100 + Uniform(0, 2));
    return t;
  }

  // Expected length of Match(tokens, max_length): the longest checkpointed prefix.
  std::size_t ExpectedMatch(const Tokens& tokens, std::size_t max_length) const {
    std::size_t best = 0;
    for (const auto& [key, node] : tree_) {
      if (!node.checkpoint.valid() || key.size() > max_length || key.size() > tokens.size()) continue;
      if (std::equal(key.begin(), key.end(), tokens.begin()) && key.size() > best) best = key.size();
    }
    return best;
  }

  PrefixMatch MatchAndCheck(const Tokens& tokens) {
    const auto max_length = static_cast<std::uint32_t>(Uniform(0, static_cast<std::uint32_t>(tokens.size())));
    const std::size_t want = ExpectedMatch(tokens, max_length);
    PrefixMatch m = cache_->Match(tokens, max_length);
    ++clock_;
    EXPECT_EQ(m.length, want) << "step " << step_;
    if (m.length != want) return m;
    if (want == 0) {
      EXPECT_TRUE(m.pages.empty());
      return m;
    }
    ++hits_;
    const auto keys = PathKeys(tokens, want);
    EXPECT_EQ(m.pages.size(), keys.size());
    EXPECT_EQ(m.path.size(), keys.size());
    for (std::size_t i = 0; i < keys.size() && i < m.pages.size(); ++i) {
      ShadowNode& node = tree_.at(keys[i]);
      EXPECT_EQ(m.pages[i], node.page) << "step " << step_;
      node.last_use = clock_;
    }
    EXPECT_EQ(m.checkpoint.state, tree_.at(keys.back()).checkpoint.state);
    EXPECT_EQ(m.checkpoint.window, tree_.at(keys.back()).checkpoint.window);
    return m;
  }

  void LockRandom() {
    PrefixMatch m = MatchAndCheck(RandomQuery());
    if (m.length == 0) return;
    ASSERT_TRUE(cache_->Lock(m));
    LockShadow(m, +1);
    locked_.push_back(std::move(m));
  }
  void UnlockRandom() {
    if (locked_.empty()) return;
    const std::size_t i = Uniform(0, static_cast<std::uint32_t>(locked_.size() - 1));
    ASSERT_TRUE(cache_->Unlock(locked_[i]));
    LockShadow(locked_[i], -1);
    locked_.erase(locked_.begin() + static_cast<std::ptrdiff_t>(i));
  }
  ShadowNode& NodeOfPage(BlockId page) {
    for (auto& [key, node] : tree_) {
      if (node.page == page) return node;
    }
    ADD_FAILURE() << "page not in the shadow tree";
    return tree_.begin()->second;
  }
  void LockShadow(const PrefixMatch& m, int delta) {
    for (BlockId page : m.pages) {
      ShadowNode& node = NodeOfPage(page);
      if (delta > 0 && node.locks++ == 0) {
        node.pinned_offsets = {buffer_->Offset(node.page).value()};
        if (node.checkpoint.valid()) {
          node.pinned_offsets.push_back(buffer_->Offset(node.checkpoint.state).value());
          node.pinned_offsets.push_back(buffer_->Offset(node.checkpoint.window).value());
        }
      } else if (delta < 0) {
        ASSERT_GT(node.locks, 0u);
        if (--node.locks == 0) node.pinned_offsets.clear();
      }
    }
  }

  // Evicts for `demand` by a random rule and checks what went against the shadow.
  bool MakeRoomAndCheck(const Demand& demand) {
    const EvictionRule rule = Uniform(0, 1) ? EvictionRule::kNaive : EvictionRule::kAllocationAware;
    const bool fit_before = buffer_->CanAllocate(demand);
    if (rule == EvictionRule::kAllocationAware) watcher_->Watch(&demand);
    auto stats = cache_->MakeRoom(demand, rule);
    watcher_->Watch(nullptr);
    EXPECT_EQ(watcher_->late_evictions(), 0) << "evicted a node after the demand already fit at step " << step_;
    ++evictions_;
    // Which shadow nodes lost their page (ids carry generations: a freed id stays refused).
    std::vector<Tokens> gone;
    std::uint64_t max_evicted_use = 0;
    EvictionStats want;
    for (const auto& [key, node] : tree_) {
      if (buffer_->KindOf(node.page)) continue;
      gone.push_back(key);
      EXPECT_EQ(node.locks, 0u) << "a locked node was evicted at step " << step_;
      ++want.nodes;
      ++want.pages;
      if (node.checkpoint.valid()) {
        ++want.checkpoints;
        EXPECT_FALSE(buffer_->KindOf(node.checkpoint.state)) << "evicted node kept its checkpoint";
        EXPECT_FALSE(buffer_->KindOf(node.checkpoint.window));
      }
      max_evicted_use = std::max(max_evicted_use, node.last_use);
    }
    for (const auto& key : gone) tree_.erase(key);
    evicted_nodes_ += gone.size();
    for (const auto& [key, node] : tree_) {
      if (key.size() > kPage) {
        EXPECT_TRUE(tree_.contains(ParentKey(key))) << "an evicted node left a child behind";
      }
    }
    if (fit_before) {
      EXPECT_TRUE(gone.empty()) << "evicted although the demand fit";
    }
    // LRU: nothing evicted was used more recently than a remaining unlocked leaf.
    if (!gone.empty()) {
      for (const auto& [key, node] : tree_) {
        if (node.locks > 0 || HasChild(key)) continue;
        EXPECT_LE(max_evicted_use, node.last_use) << "evicted a more recently used leaf at step " << step_;
      }
    }
    if (!stats) {
      EXPECT_EQ(stats.error().code(), ErrorCode::kResourceExhausted);
      ++refused_;
      for (const auto& [key, node] : tree_) {
        if (!HasChild(key)) {
          EXPECT_GT(node.locks, 0u) << "refused while an unlocked leaf was left";
        }
      }
      return false;
    }
    EXPECT_EQ(stats->nodes, want.nodes);
    EXPECT_EQ(stats->pages, want.pages);
    EXPECT_EQ(stats->checkpoints, want.checkpoints);
    EXPECT_TRUE(buffer_->CanAllocate(demand));
    return true;
  }
  bool HasChild(const Tokens& key) const {
    for (const auto& [k, node] : tree_) {
      if (k.size() > key.size() && ParentKey(k) == key) return true;
    }
    return false;
  }

  void Evict() {
    Demand d = Demand::Of(3).Add(kKv, Uniform(0, 40));
    if (Uniform(0, 1)) d.Add(kState, 1).Add(kSwa, 1);
    if (!MakeRoomAndCheck(d) || Uniform(0, 1) == 0) return;
    // Admit the pending request: it holds its blocks until FreeRunning.
    auto ids = buffer_->AllocateDemand(d);
    ASSERT_TRUE(ids) << ids.error().ToString();
    Running r;
    for (BlockId id : *ids) {
      r.ids.push_back(id);
      r.bytes.push_back(Fill(id));
    }
    running_.push_back(std::move(r));
  }
  // Refused calls change nothing, down to what no accessor shows (LRU stamps, free-node
  // order, the buffer's free-id order): full-state digests before and after.
  void RefusedCalls() {
    const std::uint64_t cache_before = cache_->DebugDigest(), buffer_before = buffer_->DebugDigest();
    auto wrong_shape = cache_->MakeRoom(Demand::Of(2).Add(kKv, 1), EvictionRule::kAllocationAware);
    ASSERT_FALSE(wrong_shape);
    EXPECT_EQ(wrong_shape.error().code(), ErrorCode::kInvalidArgument);
    const Tokens tokens = RandomSequence();
    auto short_pages = cache_->Insert(tokens, {}, {});
    EXPECT_FALSE(short_pages);
    PrefixMatch stale;
    stale.path = {static_cast<std::uint32_t>(1000000)};
    EXPECT_FALSE(cache_->Lock(stale));
    EXPECT_FALSE(cache_->Unlock(stale));
    EXPECT_EQ(cache_->DebugDigest(), cache_before) << "a refused call changed the cache at step " << step_;
    EXPECT_EQ(buffer_->DebugDigest(), buffer_before) << "a refused call changed the buffer at step " << step_;
  }
  void FreeRunning() {
    if (running_.empty()) return;
    const std::size_t i = Uniform(0, static_cast<std::uint32_t>(running_.size() - 1));
    for (BlockId id : running_[i].ids) ASSERT_TRUE(buffer_->Free(id));
    running_.erase(running_.begin() + static_cast<std::ptrdiff_t>(i));
  }

  void Insert() {
    const Tokens tokens = RandomSequence();
    const std::size_t num_pages = (tokens.size() + kPage - 1) / kPage;
    // Half the inserts share the tree's full pages through a locked match, as a runner does.
    PrefixMatch m;
    if (Uniform(0, 1)) {
      m = MatchAndCheck(tokens);
      ASSERT_TRUE(cache_->Lock(m));
      LockShadow(m, +1);
    }
    const std::size_t shared = m.length / kPage;
    std::vector<std::uint32_t> positions = {static_cast<std::uint32_t>(tokens.size())};
    for (std::uint32_t p = kPage; p < tokens.size(); p += kPage) {
      if (Uniform(0, 2) == 0) positions.push_back(p);
    }
    if (Uniform(0, 4) == 0) positions.push_back(Uniform(1, static_cast<std::uint32_t>(tokens.size())));  // off-boundary
    Demand d = Demand::Of(3)
                   .Add(kKv, static_cast<std::uint32_t>(num_pages - shared))
                   .Add(kState, static_cast<std::uint32_t>(positions.size()))
                   .Add(kSwa, static_cast<std::uint32_t>(positions.size()));
    const bool fits = buffer_->CanAllocate(d) || MakeRoomAndCheck(d);
    if (m.length > 0) {
      ASSERT_TRUE(cache_->Unlock(m));
      LockShadow(m, -1);
    }
    if (!fits) return;
    auto ids = buffer_->AllocateDemand(d);
    ASSERT_TRUE(ids) << ids.error().ToString();
    // ids: states, then KV pages, then rings (grouped by kind in kind order).
    const std::size_t c = positions.size();
    std::vector<BlockId> pages(m.pages.begin(), m.pages.begin() + static_cast<std::ptrdiff_t>(shared));
    std::vector<Bytes> fresh_bytes;
    for (std::size_t i = 0; i < num_pages - shared; ++i) {
      pages.push_back((*ids)[c + i]);
      fresh_bytes.push_back(Fill(pages.back()));
    }
    std::vector<PositionedCheckpoint> cps;
    std::vector<std::pair<Bytes, Bytes>> cp_bytes;
    for (std::size_t i = 0; i < c; ++i) {
      const Checkpoint cp{(*ids)[i], (*ids)[c + num_pages - shared + i]};
      cps.push_back({positions[i], cp});
      Bytes s = Fill(cp.state);
      cp_bytes.emplace_back(std::move(s), Fill(cp.window));
    }
    ASSERT_TRUE(cache_->Insert(tokens, pages, cps));
    ++inserts_;
    // Shadow of Insert.
    ++clock_;
    const auto keys = PathKeys(tokens, tokens.size());
    for (std::size_t i = 0; i < keys.size(); ++i) {
      auto it = tree_.find(keys[i]);
      if (it == tree_.end()) {
        ASSERT_GE(i, shared);
        ShadowNode node;
        node.page = pages[i];
        node.page_bytes = fresh_bytes[i - shared];
        it = tree_.emplace(keys[i], std::move(node)).first;
      } else if (i >= shared) {
        EXPECT_FALSE(buffer_->KindOf(pages[i])) << "a duplicate page was not freed";
      }
      it->second.last_use = clock_;
    }
    for (std::size_t i = 0; i < c; ++i) {
      auto key = std::find_if(keys.begin(), keys.end(), [&](const Tokens& k) { return k.size() == positions[i]; });
      if (key != keys.end() && !tree_.at(*key).checkpoint.valid()) {
        ShadowNode& node = tree_.at(*key);
        node.checkpoint = cps[i].checkpoint;
        node.state_bytes = cp_bytes[i].first;
        node.window_bytes = cp_bytes[i].second;
        if (node.locks > 0) {  // attached to a locked node: pinned from now on
          node.pinned_offsets.push_back(buffer_->Offset(node.checkpoint.state).value());
          node.pinned_offsets.push_back(buffer_->Offset(node.checkpoint.window).value());
        }
      } else {
        EXPECT_FALSE(buffer_->KindOf(cps[i].checkpoint.state)) << "a duplicate checkpoint was not freed";
      }
    }
  }

  void ExpectBytes(BlockId id, const Bytes& want, const char* what) {
    auto got = buffer_->Bytes(id);
    ASSERT_TRUE(got) << what << " is gone at step " << step_;
    ASSERT_EQ(got->size(), want.size());
    ASSERT_EQ(std::memcmp(got->data(), want.data(), want.size()), 0) << what << " lost its bytes at step " << step_;
  }

  void Verify() {
    ASSERT_TRUE(cache_->CheckInvariants()) << cache_->CheckInvariants().error().ToString();
    ASSERT_TRUE(buffer_->CheckInvariants()) << buffer_->CheckInvariants().error().ToString();
    ASSERT_EQ(cache_->num_nodes(), tree_.size()) << "step " << step_;
    std::size_t checkpoints = 0;
    for (const auto& [key, node] : tree_) {
      ExpectBytes(node.page, node.page_bytes, "a cached page");
      if (node.checkpoint.valid()) {
        ++checkpoints;
        ExpectBytes(node.checkpoint.state, node.state_bytes, "a checkpoint state");
        ExpectBytes(node.checkpoint.window, node.window_bytes, "a checkpoint ring");
      }
      ASSERT_EQ(cache_->Holds(key), node.checkpoint.valid()) << "step " << step_;
      if (node.locks > 0) {
        std::vector<std::uint64_t> now = {buffer_->Offset(node.page).value()};
        if (node.checkpoint.valid()) {
          now.push_back(buffer_->Offset(node.checkpoint.state).value());
          now.push_back(buffer_->Offset(node.checkpoint.window).value());
        }
        ASSERT_EQ(now, node.pinned_offsets) << "a locked block moved at step " << step_;
      }
    }
    ASSERT_EQ(cache_->num_checkpoints(), checkpoints);
    for (const auto& r : running_) {
      for (std::size_t i = 0; i < r.ids.size(); ++i) ExpectBytes(r.ids[i], r.bytes[i], "a running request's block");
    }
  }

  std::mt19937 rng_;
  std::unique_ptr<UnifiedBuffer> buffer_;
  std::unique_ptr<WatchingAllocator> watcher_;  // the cache's allocator: buffer_, watched
  std::unique_ptr<PrefixCache> cache_;
  std::vector<Tokens> stems_;
  std::map<Tokens, ShadowNode> tree_;  // key: the tokens [0, node end)
  std::vector<PrefixMatch> locked_;
  std::vector<Running> running_;
  std::uint64_t clock_ = 0;
  int step_ = 0;
  int inserts_ = 0, hits_ = 0, evictions_ = 0, refused_ = 0;
  std::uint64_t evicted_nodes_ = 0;
};

void RunPrefixRandom(std::uint32_t seed, CompactionMode mode, int steps) {
  std::printf("prefix random test: seed=%u mode=%s steps=%d\n", seed, mode == CompactionMode::kEager ? "eager" : "lazy",
              steps);
  PrefixRandom(seed, mode).Run(steps);
}

TEST(PrefixCacheRandom, LazyBufferMatchesTheShadowTreeAndKeepsEveryCachedByte) {
  RunPrefixRandom(20250301u, CompactionMode::kLazy, 2500);
}

TEST(PrefixCacheRandom, EagerBufferMatchesTheShadowTreeAndKeepsEveryCachedByte) {
  RunPrefixRandom(99u, CompactionMode::kEager, 2500);
}

}  // namespace
}  // namespace ula
