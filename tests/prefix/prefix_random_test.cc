// Randomized prefix-cache test with a fixed, printed seed (ULA_TEST_SEED overrides it):
// inserts of token sequences that diverge at any token (some sharing the tree's pages
// through a locked match, with a copied partial page), checkpoints at any position (KV past
// the last one is dropped), matches, copy-on-write matches, lock/unlock, chunked insertion
// with the lock moving, evictions by both rules for random demands, Evict by count,
// requests that allocate and free around the cache, and compaction. With a host tier,
// checkpoints and (4 page slots per checkpoint slot) whole leaves' KV pages move to the
// host and back; an insert through a host node replaces that host subtree. A second harness
// (PrefixWindowRandom, below) runs the cache with window pages (sliding_window > 0).
//
// The shadow model is token-level, independent of the tree's node layout: a map from each
// checkpointed prefix to its blocks, last use and state locks. Every KV slot and state
// block is filled with bytes derived from the token prefix it stands for, so a page copied,
// split or served from another branch is checked byte for byte. After every operation:
// CheckInvariants() of cache and buffer; Match length / kv_length / branch against the
// shadow; the bytes of every cached state and every matched KV slot; pinned (locked)
// blocks never move; block accounting (buffer blocks = cache blocks + running requests);
// metrics and the event stream against the shadow; LRU order of what eviction removed.
//
// Refusal is total: every call the cache refuses (bad inserts, stale or unlocked matches,
// malformed demands, a second host tier, a chunk without its checkpoint) is made on
// purpose, and PrefixCache::DebugDigest() (the whole state, the buffer's included) must be
// equal before and after. MakeRoom's one documented partial effect (kResourceExhausted keeps
// what it evicted) is checked exactly: afterwards every node is on a locked path (no
// evictable KV), with kAllocationAware no unlocked device checkpoint is left, the survivors
// are exactly the shadow's prediction, and a second call changes nothing.
//
// Minimal eviction (the watcher): MakeRoom(d, rule) calls the eviction observer just before
// it starts each victim (a checkpoint, or a leaf with the cleanup of the tombstoned leaves
// it leaves behind). At that moment the demand must not be satisfied yet, where satisfied
// means buffer.CanAllocate(d) and, for kNaive, that the KV pages free when the call began
// (the largest n with CanAllocate(n pages), found here by bisection) plus the KV pages freed
// since cover d's KV pages. Equivalently: after it returns, the last victim's room was
// needed: without it, d would not have been satisfied. The same watcher runs inside
// MatchCopyOnWrite (its copy's demand) and Evict by count (no victim after the count is met).
//
// Faults (FaultInjectingBackend, backend/fault_backend.h): the buffer's compaction moves, the
// checkpoint copies of MatchCopyOnWrite and the host tier's copies all go through one
// injecting backend (a seeded fraction fails, partly landed, completions delayed). The test
// counts faults injected and calls that failed (kIo), both > 0, and entries lost (a cached
// state or matched KV slot with wrong bytes, or a cached state gone without an eviction),
// early publishes (a copy handed out, or a checkpoint brought back from the host, whose
// bytes are not the checkpoint's) and mismatches (a match or a metric against the shadow),
// all three == 0.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <map>
#include <optional>
#include <random>
#include <set>

#include "prefix/event_hashes.h"
#include "test_seed.h"
#include "backend/fault_backend.h"
#include "ula/prefix_cache.h"
#include "ula/unified_buffer.h"

namespace ula {
namespace {

constexpr std::uint32_t kPage = 4;
constexpr std::uint32_t kSlot = 16;  // bytes per token in a 64-byte page
constexpr BlockKind kState(0), kKv(1), kSwa(2);
using Tokens = std::vector<std::uint32_t>;

Tokens Prefix(const Tokens& t, std::size_t n) { return Tokens(t.begin(), t.begin() + static_cast<std::ptrdiff_t>(n)); }


// The largest n with CanAllocate(n KV pages), by bisection.
std::uint32_t FreeKvPages(const UnifiedBuffer& buffer) {
  std::uint32_t lo = 0, hi = 1;
  auto fits = [&](std::uint32_t n) { return buffer.CanAllocate(Demand::Of(3).Add(kKv, n)); };
  while (fits(hi)) lo = hi, hi *= 2;
  while (hi - lo > 1) {
    const std::uint32_t mid = lo + (hi - lo) / 2;
    (fits(mid) ? lo : hi) = mid;
  }
  return lo;
}

// Insert's result as a Status (a refused call's error; the length it returns is checked
// where inserts succeed).
Status StatusOf(const Result<std::uint32_t>& r) {
  if (r) return Ok();
  return std::unexpected(r.error());
}

struct ShadowState {
  Checkpoint checkpoint;  // stale while on_host
  bool on_host = false;   // offloaded to the host tier
  bool kv_on_host = false;  // its node's KV too (as of the last Verify)
  std::uint64_t last_use = 0;
  // Its node may have been refreshed by a split the shadow cannot see (the lower half of a
  // split at an insert's divergence point, as SGLang's _split_node): no LRU-order check on
  // it until its next touch.
  bool order_unknown = false;
  std::uint32_t locks = 0;
  std::vector<std::uint64_t> pinned;  // offsets of state, ring while locked
};

struct Locked {
  PrefixMatch match;
  Tokens key;
  std::vector<std::uint64_t> page_offsets;
};

std::uint64_t Hash(const Tokens& t, std::size_t n, std::uint64_t salt) {
  std::uint64_t h = 1469598103934665603ull ^ salt;
  for (std::size_t i = 0; i < n; ++i) h = (h ^ t[i]) * 1099511628211ull;
  return h;
}

struct FaultCounts {
  std::uint64_t injected = 0, calls_failed = 0, lost = 0, early = 0, mismatches = 0;
};

class PrefixRandom {
 public:
  PrefixRandom(std::uint32_t seed, CompactionMode mode, std::uint32_t host_slots, double fault_rate = 0,
               UnalignedTail tail = UnalignedTail::kKeep)
      : rng_(seed), tail_(tail) {
    UnifiedBufferConfig c;
    c.alignment = 64;
    c.capacity_bytes = 160 * 64;
    c.kinds = {{"state", 192, BufferEnd::kLow}, {"kv", 64, BufferEnd::kHigh}, {"swa", 64, BufferEnd::kLow}};
    c.padding_kind = kKv;
    c.padding_blocks = 1;
    c.compaction = mode;
    backend_ = MakeCpuBackend(CpuBackendOptions{.copy_threads = 1});
    Backend* mover = backend_.get();
    if (fault_rate > 0) {  // every mover of the test goes through the injecting backend
      faulty_ = MakeFaultInjectingBackend(*backend_, FaultPlan{.seed = seed, .fail_fraction = fault_rate, .partial = true,
                                                               .delay = std::chrono::microseconds(1)})
                    .value();
      mover = faulty_.get();
    }
    const Arena device = mover->CreateArena(Tier::kDevice, Rank(0), c.capacity_bytes).value();
    buffer_ = fault_rate > 0 ? UnifiedBuffer::Create(c, device, *mover).value() : UnifiedBuffer::Create(c, device).value();
    cache_ = PrefixCache::Create(PrefixCacheConfig{.page_tokens = kPage, .record_events = true, .unaligned_tail = tail},
                                 buffer_.get())
                 .value();
    if (fault_rate > 0) {
      EXPECT_TRUE(cache_->AttachCopyBackend(mover, device.id));
    }
    if (host_slots > 0) {
      // Checkpoint slots, and 4 KV page slots per checkpoint slot: leaves go to the host whole.
      const Arena host = mover->CreateArena(Tier::kHost, Rank(0), host_slots * (192 + 64) + 4 * host_slots * 64).value();
      EXPECT_TRUE(cache_->AttachHostTier({mover, device.id, host, host_slots, 4 * host_slots}));
      host_ = true;
    }
    for (int s = 0; s < 4; ++s) {
      Tokens stem(24);
      for (auto& t : stem) t = Uniform(0, 49);
      stems_.push_back(stem);
    }
  }

  void Run(int steps) {
    for (int step = 0; step < steps; ++step) {
      step_ = step;
      const std::uint32_t op = Uniform(0, 99);
      if (op < 25) {
        Insert();
      } else if (op < 33) {
        InsertChunks();
      } else if (op < 43) {
        MatchAndCheck(RandomQuery());
      } else if (op < 50) {
        CopyOnWrite();
      } else if (op < 58) {
        LockRandom();
      } else if (op < 68) {
        UnlockRandom();
      } else if (op < 82) {
        MakeRoom();
      } else if (op < 87) {
        if (op == 86 && Uniform(0, 3) == 0) {
          PayEvictable();
        } else {
          EvictByCount();
        }
      } else if (op < 92) {
        FreeRunning();
      } else if (op < 96) {
        RefusedCall();
      } else {
        buffer_->Compact();
      }
      Verify();
      if (::testing::Test::HasFatalFailure() || broken_) break;
    }
    if (!::testing::Test::HasFatalFailure() && !broken_) {
      while (!locked_.empty()) UnlockRandom();
      Verify();
    }
    counts_.injected = faulty_ ? faulty_->stats().injected : 0;
    std::printf("  faults injected %llu, calls failed %llu, entries lost %llu, early publishes %llu, mismatches %llu; "
                "%d refused calls unchanged, %d victims watched, %d exhausted MakeRooms checked; %d copy-on-write "
                "copies failed, %d load-backs failed\n",
                static_cast<unsigned long long>(counts_.injected), static_cast<unsigned long long>(counts_.calls_failed),
                static_cast<unsigned long long>(counts_.lost), static_cast<unsigned long long>(counts_.early),
                static_cast<unsigned long long>(counts_.mismatches), refusals_checked_, victims_watched_,
                exhausted_checked_, cow_failed_, loads_failed_);
    EXPECT_EQ(counts_.lost, 0u);
    EXPECT_EQ(counts_.early, 0u);
    EXPECT_EQ(counts_.mismatches, 0u);
    EXPECT_EQ(minimality_violations_, 0);
    EXPECT_GT(refusals_checked_, 0);
    EXPECT_GT(victims_watched_, 0);
    if (faulty_) {
      EXPECT_GT(counts_.injected, 0u);
      EXPECT_GT(counts_.calls_failed, 0u);
      EXPECT_GT(cow_failed_, 0);  // the checkpoint copies did fail
    }
    if (::testing::Test::HasFatalFailure() || broken_) return;
    std::printf("  %d inserts (%d chunked), %d hits, %d evictions (%d refused), %llu states evicted (%llu tombstones, "
                "%llu offloaded, %llu loaded back), %llu bytes moved\n",
                inserts_, chunked_, hits_, evictions_, refused_, static_cast<unsigned long long>(evicted_states_),
                static_cast<unsigned long long>(tombstones_), static_cast<unsigned long long>(offloaded_),
                static_cast<unsigned long long>(loaded_), static_cast<unsigned long long>(buffer_->Stats().bytes_moved));
    EXPECT_GT(evicted_states_, 0u);
    EXPECT_GT(tombstones_, 0u);
    EXPECT_GT(hits_, 0);
    EXPECT_GT(paid_, 0);
    EXPECT_GT(chunked_, 0);
    EXPECT_GT(buffer_->Stats().blocks_moved, 0u);
    if (tail_ == UnalignedTail::kDrop) {
      std::printf("  %d unaligned checkpoints dropped by inserts\n", tails_dropped_);
      EXPECT_GT(tails_dropped_, 0);
    }
    if (host_) {
      EXPECT_GT(offloaded_, 0u);
      EXPECT_GT(loaded_, 0u);
      const PrefixCacheMetrics m = cache_->Metrics();
      std::printf("  host KV: %llu pages loaded back, %llu on the host at the end, %llu host states dropped by inserts\n",
                  static_cast<unsigned long long>(m.host_page_hits), static_cast<unsigned long long>(m.host_pages),
                  static_cast<unsigned long long>(host_dropped_by_insert_));
      if (!faulty_) {
        EXPECT_GT(m.host_page_hits, 0u);  // KV pages did go to the host and came back
      }
    }
  }

 private:
  std::uint32_t Uniform(std::uint32_t lo, std::uint32_t hi) {
    return std::uniform_int_distribution<std::uint32_t>(lo, hi)(rng_);
  }
  static bool IsPrefix(const Tokens& key, const Tokens& t) {
    return key.size() <= t.size() && std::equal(key.begin(), key.end(), t.begin());
  }

  // Slot j of page p of sequence t holds the KV of token p*kPage + j.
  void FillSlots(BlockId page, std::uint32_t index, const Tokens& t, std::uint32_t from, std::uint32_t to) {
    auto span = buffer_->Bytes(page).value();
    for (std::uint32_t pos = std::max(from, index * kPage); pos < std::min(to, (index + 1) * kPage); ++pos) {
      const std::uint64_t h = Hash(t, pos + 1, 0);
      std::memcpy(span.data() + (pos % kPage) * kSlot, &h, sizeof h);
    }
  }
  void Garbage(BlockId id) {
    const std::span<std::byte> span = buffer_->Bytes(id).value();
    for (auto& b : span) b = std::byte(rng_() & 0xff);
  }
  void FillState(const Checkpoint& c, const Tokens& t, std::size_t n) {
    const std::uint64_t hs = Hash(t, n, 1), hw = Hash(t, n, 2);
    std::memcpy(buffer_->Bytes(c.state)->data(), &hs, sizeof hs);
    std::memcpy(buffer_->Bytes(c.window)->data(), &hw, sizeof hw);
  }
  // Whether the checkpoint's blocks hold the bytes of the prefix t[0, n).
  bool StateBytesOk(const Checkpoint& c, const Tokens& t, std::size_t n) {
    auto s = buffer_->Bytes(c.state);
    auto w = buffer_->Bytes(c.window);
    if (!s || !w) return false;
    const std::uint64_t hs = Hash(t, n, 1), hw = Hash(t, n, 2);
    return std::memcmp(s->data(), &hs, sizeof hs) == 0 && std::memcmp(w->data(), &hw, sizeof hw) == 0;
  }
  // Whether every matched KV slot holds its token's bytes.
  bool KvBytesOk(const PrefixMatch& m, const Tokens& t) {
    for (std::uint32_t pos = 0; pos < m.length; ++pos) {
      auto span = buffer_->Bytes(m.pages[pos / kPage]);
      if (!span) return false;
      const std::uint64_t h = Hash(t, pos + 1, 0);
      if (std::memcmp(span->data() + (pos % kPage) * kSlot, &h, sizeof h) != 0) return false;
    }
    return true;
  }
  // Counted checks: a failure counts, is reported with its step and ends the run.
  void Lost(bool ok, const char* what) {
    if (ok) return;
    ++counts_.lost;
    broken_ = true;
    ADD_FAILURE() << "entry lost: " << what << " at step " << step_;
  }
  void Early(bool ok, const char* what) {
    if (ok) return;
    ++counts_.early;
    broken_ = true;
    ADD_FAILURE() << "early publish: " << what << " at step " << step_;
  }
  template <class A, class B>
  bool Same(const A& got, const B& want, const char* what) {
    if (got == static_cast<A>(want)) return true;
    ++counts_.mismatches;
    broken_ = true;
    ADD_FAILURE() << "mismatch: " << what << " is " << got << ", the shadow says " << want << " at step " << step_;
    return false;
  }
  // kIo from an injected fault (a failed call, counted); anything else is a failure.
  void FailedCall(const Error& e, const char* what) {
    if (faulty_ && e.code() == ErrorCode::kIo) {
      ++counts_.calls_failed;
      return;
    }
    ADD_FAILURE() << what << ": " << e.ToString() << " at step " << step_;
    broken_ = true;
  }

  Tokens RandomSequence() {
    const Tokens& stem = stems_[Uniform(0, static_cast<std::uint32_t>(stems_.size() - 1))];
    Tokens t = Prefix(stem, Uniform(0, 24));
    const std::uint32_t extra = Uniform(t.empty() ? 1 : 0, 8);
    for (std::uint32_t i = 0; i < extra; ++i) t.push_back(100 + Uniform(0, 2));
    return t;
  }
  Tokens RandomQuery() {
    if (states_.empty() || Uniform(0, 2) == 0) return RandomSequence();
    auto it = states_.begin();
    std::advance(it, Uniform(0, static_cast<std::uint32_t>(states_.size() - 1)));
    Tokens t = Prefix(it->first, Uniform(1, static_cast<std::uint32_t>(it->first.size())));
    for (std::uint32_t i = Uniform(0, 6); i > 0; --i) t.push_back(100 + Uniform(0, 2));
    return t;
  }

  // Match against the shadow: every KV node is a prefix of some checkpointed prefix.
  PrefixMatch MatchAndCheck(const Tokens& tokens, std::uint32_t max_length) {
    std::size_t want = 0, kv = 0, host_want = 0;
    for (const auto& [key, st] : states_) {
      if (key.size() <= max_length && IsPrefix(key, tokens)) {
        host_want = std::max(host_want, key.size());
        if (!st.on_host) want = std::max(want, key.size());
      }
      std::size_t l = 0;
      while (l < key.size() && l < tokens.size() && key[l] == tokens[l]) ++l;
      kv = std::max(kv, l);
    }
    PrefixMatch m = cache_->Match(tokens, max_length);
    ++clock_;
    Same(m.length, want, "match length");
    Same(m.kv_length, kv, "match kv_length");
    Same(m.host_length, host_want, "match host_length");
    Same(m.branch, kv > want ? kv : 0, "match branch");
    if (m.length != want) return m;
    Same(m.pages.size(), (want + kPage - 1) / kPage, "matched pages");
    if (want == 0) return m;
    ++hits_;
    Lost(KvBytesOk(m, tokens), "a matched KV slot");
    const Tokens key = Prefix(tokens, want);
    Same(m.checkpoint.state.value(), states_.at(key).checkpoint.state.value(), "matched state block");
    Lost(StateBytesOk(m.checkpoint, tokens, want), "a matched state");
    for (auto& [k, st] : states_) {
      if (IsPrefix(k, key)) st.last_use = clock_, st.order_unknown = false;
    }
    return m;
  }
  PrefixMatch MatchAndCheck(const Tokens& tokens) {
    return MatchAndCheck(tokens, Uniform(0, static_cast<std::uint32_t>(tokens.size())));
  }

  void LockShadow(const PrefixMatch& m, const Tokens& tokens) {
    Locked l{m, Prefix(tokens, m.length), {}};
    for (BlockId p : m.pages) l.page_offsets.push_back(buffer_->Offset(p).value());
    ShadowState& st = states_.at(l.key);
    if (st.locks++ == 0) {
      st.pinned = {buffer_->Offset(st.checkpoint.state).value(), buffer_->Offset(st.checkpoint.window).value()};
    }
    locked_.push_back(std::move(l));
  }
  void LockRandom() {
    const Tokens q = RandomQuery();
    PrefixMatch m = MatchAndCheck(q);
    if (m.length == 0) return;
    ASSERT_TRUE(cache_->Lock(m));
    LockShadow(m, q);
  }
  void UnlockAt(std::size_t i) {
    ASSERT_TRUE(cache_->Unlock(locked_[i].match));
    ShadowState& st = states_.at(locked_[i].key);
    if (--st.locks == 0) st.pinned.clear();
    locked_.erase(locked_.begin() + static_cast<std::ptrdiff_t>(i));
  }
  void UnlockRandom() {
    if (!locked_.empty()) UnlockAt(Uniform(0, static_cast<std::uint32_t>(locked_.size() - 1)));
  }

  void CopyOnWrite() {
    const Tokens q = RandomQuery();
    const std::uint32_t max_length = Uniform(0, static_cast<std::uint32_t>(q.size()));
    const PrefixMatch probe = MatchAndCheck(q, max_length);  // the shadow's expectation (touches alike)
    if (broken_) return;
    const EvictionRule rule = Uniform(0, 1) ? EvictionRule::kNaive : EvictionRule::kAllocationAware;
    // The copy's demand (a load-back's also has the host pages of its path: not watched).
    if (probe.host_length <= probe.length) Watch(Demand::Of(3).Add(kState, 1).Add(kSwa, 1), rule);
    auto m = cache_->MatchCopyOnWrite(q, max_length, rule);
    cache_->SetEvictionObserver(nullptr);
    ++clock_;
    // A MakeRoom may have run, with the match locked (when nothing came back from the host;
    // a load-back evicts with only the KV path locked, so the LRU order is not checked then).
    const bool loads = probe.host_length > probe.length;
    if (loads && cache_->Holds(Prefix(q, probe.host_length))) {  // back from the host, under a new block id
      const Tokens key = Prefix(q, probe.host_length);
      ShadowState& st = states_.at(key);
      EXPECT_TRUE(st.on_host);
      st.on_host = false;
      if (m) {
        st.checkpoint = m->checkpoint;
      } else {  // loaded back, but the request's own copy did not fit: look it up
        st.checkpoint = cache_->Match(key, probe.host_length).checkpoint;
        ++clock_;
        for (auto& [k, other] : states_) {
          if (IsPrefix(k, key)) other.last_use = clock_, other.order_unknown = false;
        }
      }
      Early(StateBytesOk(st.checkpoint, key, key.size()), "a checkpoint brought back from the host");
      ++loaded_;
    } else if (loads) {
      ++loads_failed_;  // no room, or a failed host -> device copy: the host copy stays
    }
    if (probe.length > 0 && !loads) ++states_.at(Prefix(q, probe.length)).locks;
    ObserveEvictions(!loads && !m && m.error().code() == ErrorCode::kResourceExhausted, rule, !loads);
    if (probe.length > 0 && !loads) --states_.at(Prefix(q, probe.length)).locks;
    if (!m) {
      if (m.error().code() != ErrorCode::kResourceExhausted) {
        FailedCall(m.error(), "MatchCopyOnWrite");
        cow_failed_ += m.error().message().find("copy-on-write") != std::string::npos;
      }
      return;
    }
    // The deepest device checkpoint now: the host one brought back, or (when that failed)
    // what the device still holds.
    std::size_t want = 0;
    for (const auto& [key, st] : states_) {
      if (!st.on_host && key.size() <= max_length && IsPrefix(key, q)) want = std::max(want, key.size());
    }
    Same(m->length, want, "copy-on-write match length");
    if (!loads || !cache_->HoldsOnHost(Prefix(q, probe.host_length))) {
      Same(m->length, probe.host_length, "copy-on-write match length against the host");
    }
    if (m->length == 0 || broken_) return;
    for (auto& [k, st] : states_) {
      if (IsPrefix(k, Prefix(q, m->length))) st.last_use = clock_, st.order_unknown = false;
    }
    ASSERT_TRUE(m->copy.valid());
    Early(StateBytesOk(m->copy, q, m->length), "the request's copy of the checkpoint");  // same bytes
    Garbage(m->copy.state);  // writing it leaves the cached checkpoint alone
    Lost(StateBytesOk(m->checkpoint, q, m->length), "the checkpoint after its copy was written");
    ASSERT_TRUE(cache_->Unlock(*m));
    ASSERT_TRUE(buffer_->Free(m->copy.state));
    ASSERT_TRUE(buffer_->Free(m->copy.window));
  }

  // The minimal-eviction watcher (see the file comment) for one call with demand d.
  void Watch(const Demand& d, EvictionRule rule) {
    const std::uint32_t need = d.blocks[kKv.value()];
    const std::uint32_t free_at_start = rule == EvictionRule::kNaive ? FreeKvPages(*buffer_) : 0;
    const std::uint64_t live_at_start = buffer_->Stats().live_blocks_per_kind[kKv.value()];
    cache_->SetEvictionObserver([this, d, rule, need, free_at_start, live_at_start] {
      ++victims_watched_;
      const std::uint64_t freed = live_at_start - buffer_->Stats().live_blocks_per_kind[kKv.value()];
      const bool satisfied =
          buffer_->CanAllocate(d) && (rule == EvictionRule::kAllocationAware || free_at_start + freed >= need);
      if (satisfied) {
        ++minimality_violations_;
        ADD_FAILURE() << "MakeRoom (" << EvictionRuleName(rule) << ") started another victim although the demand fit"
                      << " at step " << step_;
      }
    });
  }

  // Allocates a demand, evicting through the cache when needed; nullopt when it cannot.
  std::optional<std::vector<BlockId>> Allocate(const Demand& d) {
    if (!buffer_->CanAllocate(d)) {
      const EvictionRule rule = Uniform(0, 1) ? EvictionRule::kNaive : EvictionRule::kAllocationAware;
      Watch(d, rule);
      auto stats = cache_->MakeRoom(d, rule);
      cache_->SetEvictionObserver(nullptr);
      ++evictions_;
      ObserveEvictions(!stats, rule);
      if (!stats) {
        ++refused_;
        CheckExhausted(d, rule, stats.error());
        return std::nullopt;
      }
      EXPECT_TRUE(buffer_->CanAllocate(d));
    }
    auto ids = buffer_->AllocateDemand(d);
    if (!ids) {
      FailedCall(ids.error(), "AllocateDemand");  // a failed compaction move
      return std::nullopt;
    }
    return *ids;
  }

  // MakeRoom's documented partial effect on kResourceExhausted, exactly (after
  // ObserveEvictions has updated the shadow).
  void CheckExhausted(const Demand& d, EvictionRule rule, const Error& e) {
    ++exhausted_checked_;
    EXPECT_FALSE(buffer_->CanAllocate(d)) << EvictionRuleName(rule) << " refused a demand that fits at step " << step_;
    Same(static_cast<int>(e.code()), static_cast<int>(ErrorCode::kResourceExhausted), "MakeRoom's error code");
    const PrefixCacheMetrics m = cache_->Metrics();
    Same(m.kv.evictable, 0u, "evictable KV bytes after an exhausted MakeRoom");
    if (rule == EvictionRule::kAllocationAware) {
      Same(m.state.evictable, 0u, "evictable state bytes after an exhausted MakeRoom");
      Same(m.window.evictable, 0u, "evictable window bytes after an exhausted MakeRoom");
    }
    // The survivors: on a locked path (kNaive: any checkpoint there; kAllocationAware: only
    // the state-locked ones stay on the device).
    for (const auto& [key, st] : states_) {
      bool on_locked_path = false;
      for (const auto& l : locked_) on_locked_path |= IsPrefix(key, l.key);
      // With KV pages on the host, unlocked leaves go there whole rather than away.
      const bool may_stay = st.on_host ? on_locked_path || host_ : rule == EvictionRule::kNaive ? on_locked_path : st.locks > 0;
      if (!may_stay) {
        ++counts_.mismatches;
        broken_ = true;
        ADD_FAILURE() << "a state off every locked path survived an exhausted MakeRoom at step " << step_;
      }
      if (!st.on_host && st.locks > 0) Lost(StateBytesOk(st.checkpoint, key, key.size()), "a locked state");
    }
    // A fixed point: nothing is left to evict, so a second call is refused and changes nothing.
    const std::uint64_t digest = cache_->DebugDigest();
    const int victims = victims_watched_;
    Watch(d, rule);
    auto again = cache_->MakeRoom(d, rule);
    cache_->SetEvictionObserver(nullptr);
    EXPECT_FALSE(again) << EvictionRuleName(rule) << " refused a demand that fits at step " << step_;
    Same(victims_watched_, victims, "victims of a second exhausted MakeRoom");
    Same(cache_->DebugDigest(), digest, "the digest after a second exhausted MakeRoom");
  }

  // A call the cache must refuse, with the whole state (DebugDigest) unchanged.
  void RefusedCall() {
    std::optional<std::pair<Tokens, PrefixMatch>> cached;  // a cached prefix, matched in full
    std::vector<Tokens> keys;
    for (const auto& [key, st] : states_) {
      if (!st.on_host) keys.push_back(key);
    }
    if (!keys.empty()) {
      const Tokens key = keys[Uniform(0, static_cast<std::uint32_t>(keys.size() - 1))];
      PrefixMatch m = MatchAndCheck(key, static_cast<std::uint32_t>(key.size()));
      if (broken_) return;
      cached.emplace(key, std::move(m));
    }
    const std::uint32_t what = Uniform(0, cached ? 11 : 4);
    const std::uint64_t digest = cache_->DebugDigest();
    const std::uint64_t buffer_digest = buffer_->DebugDigest();
    Status status = Ok();
    switch (what) {
      case 0: {  // a page count that does not cover the tokens
        const Tokens t = RandomSequence();
        status = StatusOf(cache_->Insert(t, {}, {}));
        break;
      }
      case 1: {  // a forged match
        PrefixMatch f;
        f.length = 3;
        f.path = {0xfffffu};
        status = cache_->Lock(f);
        break;
      }
      case 2: {  // a malformed demand
        auto r = cache_->MakeRoom(Demand::Of(2).Add(kKv, 1), EvictionRule::kAllocationAware);
        if (!r) status = std::unexpected(r.error());
        break;
      }
      case 3:  // a second host tier, or one without a backend
        status = cache_->AttachHostTier({host_ ? backend_.get() : nullptr, ArenaId(0), Arena{}, 1});
        break;
      case 4:
        status = cache_->AttachCopyBackend(nullptr, ArenaId(0));
        break;
      default: {
        const auto& [key, m] = *cached;
        std::vector<BlockId> pages = m.pages;
        const std::vector<PositionedCheckpoint> own = {{static_cast<std::uint32_t>(key.size()), m.checkpoint}};
        switch (what) {
          case 5:  // a checkpoint at position 0
            status = StatusOf(cache_->Insert(key, pages, std::vector<PositionedCheckpoint>{{0, m.checkpoint}}));
            break;
          case 6:  // the tree's own checkpoint blocks
            status = StatusOf(cache_->Insert(key, pages, own));
            break;
          case 7:  // a page of the wrong kind
            pages[0] = m.checkpoint.state;
            status = StatusOf(cache_->Insert(key, pages, {}));
            break;
          case 8:  // the tree's pages at other positions (or one given twice)
            if (pages.size() >= 2) {
              std::swap(pages[0], pages[1]);
            } else {
              pages.push_back(pages[0]);
            }
            status = StatusOf(cache_->Insert(key, pages, {}));
            break;
          case 9: {  // a match whose state is not the node's
            PrefixMatch f = m;
            f.checkpoint.state = BlockId::Invalid();
            status = cache_->Lock(f);
            break;
          }
          case 10:  // unlock a match nobody locked (or a forged one when someone did)
            if (states_.at(key).locks == 0) {
              status = cache_->Unlock(m);
            } else {
              PrefixMatch f = m;
              f.checkpoint.state = BlockId::Invalid();
              status = cache_->Unlock(f);
            }
            break;
          default: {  // a chunk without a checkpoint at its end
            auto r = cache_->InsertChunk(key, pages, {}, PrefixMatch{});
            if (!r) status = std::unexpected(r.error());
            break;
          }
        }
      }
    }
    ++refusals_checked_;
    if (status) {
      ADD_FAILURE() << "bad call " << what << " was accepted at step " << step_;
      broken_ = true;
      return;
    }
    Same(cache_->DebugDigest(), digest, "the cache's digest after a refused call");
    Same(buffer_->DebugDigest(), buffer_digest, "the buffer's digest after a refused call");
  }

  // Which shadow states left the device (freed or offloaded) or the host, checked against
  // LRU order and the locks.
  void ObserveEvictions(bool refused, EvictionRule rule, bool check_order = true) {
    std::vector<Tokens> gone, host_gone;
    std::uint64_t newest_gone = 0;
    for (const auto& [key, st] : states_) {
      if (st.on_host) {
        if (!cache_->HoldsOnHost(key)) host_gone.push_back(key);
        continue;
      }
      if (buffer_->KindOf(st.checkpoint.state)) continue;
      EXPECT_EQ(st.locks, 0u) << "a locked state was evicted at step " << step_;
      EXPECT_FALSE(buffer_->KindOf(st.checkpoint.window)) << "an evicted state kept its ring";
      gone.push_back(key);
      if (!st.order_unknown) newest_gone = std::max(newest_gone, st.last_use);
    }
    if (rule == EvictionRule::kNaive) {  // leaves whose state was on the host go by LRU too
      for (const auto& key : host_gone) {  // (not host nodes: they go with their device ancestor)
        const ShadowState& st = states_.at(key);
        if (!st.kv_on_host && !st.order_unknown) newest_gone = std::max(newest_gone, st.last_use);
      }
    }
    for (const auto& key : gone) {
      if (cache_->HoldsOnHost(key)) {
        states_.at(key).on_host = true;
        ++offloaded_;
        continue;
      }
      // A tombstone keeps its KV: some surviving state extends it.
      bool extended = false;
      for (const auto& [k, st] : states_) {
        extended |= k.size() > key.size() && IsPrefix(key, k) && (st.on_host || buffer_->KindOf(st.checkpoint.state));
      }
      tombstones_ += extended ? 1 : 0;
    }
    for (const auto& key : gone) {
      if (!states_.at(key).on_host) states_.erase(key);
    }
    for (const auto& key : host_gone) states_.erase(key);
    evicted_states_ += gone.size();
    const bool any = !gone.empty() || (rule == EvictionRule::kNaive && !host_gone.empty());
    for (const auto& [key, st] : states_) {
      if (st.locks > 0) continue;
      if (rule == EvictionRule::kNaive ? HasExtension(key) || cache_->KvOnHost(key) : st.on_host) continue;  // candidates
      if (check_order && any && !st.order_unknown) {
        EXPECT_LE(newest_gone, st.last_use) << EvictionRuleName(rule) << " evicted a more recently used state at step " << step_;
      }
      if (refused) {
        ADD_FAILURE() << EvictionRuleName(rule) << " refused while an unlocked candidate was left at step " << step_
                      << " (on host " << st.on_host << ", kv on host " << st.kv_on_host << " now "
                      << cache_->KvOnHost(key) << ", length " << key.size() << ")";
      }
    }
    RefreshKvOnHost();
  }
  // The kv_on_host flags, after every call that may move KV between the tiers.
  void RefreshKvOnHost() {
    for (auto& [key, st] : states_) st.kv_on_host = cache_->KvOnHost(key);
  }
  bool HasExtension(const Tokens& key) const {
    for (const auto& [k, st] : states_) {
      if (k.size() > key.size() && IsPrefix(key, k)) return true;
    }
    return false;
  }

  void MakeRoom() {
    Demand d = Demand::Of(3).Add(kKv, Uniform(0, 40));
    if (Uniform(0, 1)) d.Add(kState, 1).Add(kSwa, 1);
    const bool fit = buffer_->CanAllocate(d);
    const std::size_t before = states_.size();
    auto ids = Allocate(d);
    if (fit) {
      EXPECT_EQ(states_.size(), before) << "evicted although the demand fit";
    }
    if (!ids) return;
    if (Uniform(0, 1) == 0) {
      for (BlockId id : *ids) ASSERT_TRUE(buffer_->Free(id));
      return;
    }
    for (BlockId id : *ids) Garbage(id);
    running_.push_back(*ids);
  }
  // Every counter can be paid: evicting all that Metrics calls evictable
  // frees exactly those bytes, kind by kind, and leaves nothing evictable and the protected
  // bytes as they were.
  bool PaidExactly(const PrefixCacheMetrics& m, const std::vector<std::uint64_t>& live_before) {
    const std::vector<std::uint64_t> live = buffer_->Stats().live_blocks_per_kind;
    auto freed = [&](BlockKind k) { return (live_before[k.value()] - live[k.value()]) * buffer_->kind_config(k).block_bytes; };
    const PrefixCacheMetrics left = cache_->Metrics();
    return freed(kKv) == m.kv.evictable && freed(kState) == m.state.evictable && freed(kSwa) == m.window.evictable &&
           left.kv.evictable == 0 && left.state.evictable == 0 && left.window.evictable == 0 &&
           left.kv.protected_bytes == m.kv.protected_bytes && left.state.protected_bytes == m.state.protected_bytes &&
           left.window.protected_bytes == m.window.protected_bytes;
  }
  void PayEvictable() {
    const PrefixCacheMetrics m = cache_->Metrics();
    const std::vector<std::uint64_t> live = buffer_->Stats().live_blocks_per_kind;
    (void)cache_->Evict(UINT64_MAX, UINT32_MAX, UINT64_MAX);
    ++evictions_;
    ++paid_;
    ObserveEvictions(false, EvictionRule::kAllocationAware, /*check_order=*/false);
    Same(PaidExactly(m, live), true, "Evict of everything evictable paid Metrics' counters");
  }
  void EvictByCount() {
    const bool by_tokens = Uniform(0, 1);  // one kind per call, so that the LRU check knows which
    const std::uint64_t tokens = by_tokens ? Uniform(1, 12) : 0;
    const std::uint32_t states = by_tokens ? 0 : Uniform(1, 3);
    const auto unlocked = static_cast<std::uint32_t>(
        std::count_if(states_.begin(), states_.end(), [](const auto& kv) { return kv.second.locks == 0 && !kv.second.on_host; }));
    const auto stats = cache_->Evict(tokens, states);
    ++evictions_;
    ObserveEvictions(false, by_tokens ? EvictionRule::kNaive : EvictionRule::kAllocationAware);
    EXPECT_TRUE(stats.tokens >= tokens || cache_->Metrics().kv.evictable == 0) << "step " << step_;
    EXPECT_TRUE(stats.checkpoints >= states || stats.checkpoints == unlocked) << "step " << step_;
  }
  void FreeRunning() {
    if (running_.empty()) return;
    const std::size_t i = Uniform(0, static_cast<std::uint32_t>(running_.size() - 1));
    for (BlockId id : running_[i]) ASSERT_TRUE(buffer_->Free(id));
    running_.erase(running_.begin() + static_cast<std::ptrdiff_t>(i));
  }

  // Builds a request's pages for tokens [0, n): the matched full pages shared, a copy of a
  // matched partial page, fresh pages for the rest; checkpoints at `positions`.
  struct Built {
    std::vector<BlockId> pages;
    std::vector<PositionedCheckpoint> cps;
  };
  std::optional<Built> Build(const Tokens& t, std::uint32_t n, const PrefixMatch& m,
                             const std::vector<std::uint32_t>& positions) {
    const std::uint32_t num_pages = (n + kPage - 1) / kPage;
    const std::uint32_t shared = std::min(m.length / kPage, num_pages);
    const auto c = static_cast<std::uint32_t>(positions.size());
    auto ids = Allocate(Demand::Of(3).Add(kKv, num_pages - shared).Add(kState, c).Add(kSwa, c));
    if (!ids) return std::nullopt;
    Built b;
    b.pages.assign(m.pages.begin(), m.pages.begin() + shared);
    for (std::uint32_t i = 0; i < num_pages - shared; ++i) {  // ids: states, pages, rings
      const BlockId p = (*ids)[c + i];
      Garbage(p);
      const std::uint32_t index = shared + i;
      if (index * kPage < m.length) {  // copy-on-write of the matched partial page
        auto src = buffer_->Bytes(m.pages[index]).value();
        std::memcpy(buffer_->Bytes(p)->data(), src.data(), src.size());
        FillSlots(p, index, t, m.length, n);
      } else {
        FillSlots(p, index, t, 0, n);
      }
      b.pages.push_back(p);
    }
    for (std::uint32_t i = 0; i < c; ++i) {
      const Checkpoint cp{(*ids)[i], (*ids)[c + num_pages - shared + i]};
      FillState(cp, t, positions[i]);
      b.cps.push_back({positions[i], cp});
    }
    return b;
  }
  // Shadow of a successful Insert of t with these checkpoints.
  void ShadowInsert(const Tokens& t, const std::vector<PositionedCheckpoint>& cps) {
    ++clock_;
    std::uint32_t n = 0;
    for (const auto& c : cps) {
      n = std::max(n, c.position);
      const Tokens key = Prefix(t, c.position);
      if (states_.contains(key) && !states_.at(key).on_host) {
        EXPECT_FALSE(buffer_->KindOf(c.checkpoint.state)) << "a duplicate checkpoint was not freed at step " << step_;
      } else {
        states_[key] = ShadowState{c.checkpoint, false, false, 0, false, 0, {}};  // new, or replaces a host copy
      }
    }
    // The first state below each point where t leaves a cached path: its node may be the
    // lower half of a split there, which the split refreshed.
    std::map<Tokens, Tokens> first_below;  // the branch (up to its first token off t) -> its shortest state
    for (const auto& [k, st] : states_) {
      std::size_t c = 0;
      while (c < k.size() && c < t.size() && k[c] == t[c]) ++c;
      c = std::min<std::size_t>(c, n);
      if (c == 0 || c >= k.size()) continue;
      const Tokens branch = Prefix(k, c + 1);
      auto it = first_below.find(branch);
      if (it == first_below.end() || k.size() < it->second.size()) first_below[branch] = k;
    }
    for (const auto& [branch, k] : first_below) states_.at(k).order_unknown = true;
    for (auto& [k, st] : states_) {
      if (k.size() <= n && IsPrefix(k, t)) st.last_use = clock_, st.order_unknown = false;
    }
    // A host subtree the sequence went on through is gone (its pages took its place).
    std::vector<Tokens> dropped;
    for (const auto& [k, st] : states_) {
      if (st.on_host && !cache_->HoldsOnHost(k)) dropped.push_back(k);
    }
    for (const auto& k : dropped) states_.erase(k);
    host_dropped_by_insert_ += dropped.size();
    RefreshKvOnHost();
  }
  std::vector<std::uint32_t> RandomPositions(std::uint32_t from, std::uint32_t n, bool end) {
    std::set<std::uint32_t> p;
    if (end) p.insert(n);
    for (std::uint32_t i = Uniform(0, 3); i > 0; --i) p.insert(Uniform(from, n));
    return {p.begin(), p.end()};
  }

  void Insert() {
    const Tokens t = RandomSequence();
    const auto n = static_cast<std::uint32_t>(t.size());
    PrefixMatch m;
    if (Uniform(0, 1)) {  // shares the tree's pages through a locked match, as a runner does
      m = MatchAndCheck(t);
      if (m.length > 0) {
        ASSERT_TRUE(cache_->Lock(m));
        LockShadow(m, t);
      }
    }
    // Mostly a checkpoint at the end; otherwise the KV past the last one is dropped.
    auto built = Build(t, n, m, RandomPositions(1, n, Uniform(0, 4) != 0));
    if (m.length > 0) UnlockAt(locked_.size() - 1);
    if (!built) return;
    auto inserted = cache_->Insert(t, built->pages, built->cps);
    ASSERT_TRUE(inserted) << inserted.error().ToString() << " step " << step_;
    // kDrop (SGLang's finished request): a checkpoint off a page boundary is freed, and the
    // KV past the last one on a boundary with it.
    std::vector<PositionedCheckpoint> kept;
    for (const auto& c : built->cps) {
      if (tail_ == UnalignedTail::kKeep || c.position % kPage == 0) {
        kept.push_back(c);
      } else {
        ++tails_dropped_;
        EXPECT_FALSE(buffer_->KindOf(c.checkpoint.state)) << "an unaligned checkpoint was kept at step " << step_;
      }
    }
    ShadowInsert(t, kept);
    ++inserts_;
  }

  // A request prefilled in two or three chunks, each inserted as it completes.
  void InsertChunks() {
    const Tokens t = RandomSequence();
    const auto n = static_cast<std::uint32_t>(t.size());
    if (n < 2) return;
    std::vector<std::uint32_t> ends = RandomPositions(1, n - 1, false);
    ends.push_back(n);
    PrefixMatch held;
    std::uint32_t done = 0;
    for (std::uint32_t end : ends) {
      std::vector<std::uint32_t> positions = {end};
      if (Uniform(0, 2) == 0 && end - done > 1) positions.insert(positions.begin(), Uniform(done + 1, end - 1));
      // The request's pages so far: the tree's (held), then its own.
      auto built = Build(t, end, held, positions);
      if (!built) break;
      auto next = cache_->InsertChunk(Prefix(t, end), built->pages, built->cps, held);
      ASSERT_TRUE(next) << next.error().ToString() << " at step " << step_;
      ShadowInsert(t, built->cps);
      ++clock_;  // InsertChunk's match touches the path
      for (auto& [k, st] : states_) {
        if (k.size() <= end && IsPrefix(k, t)) st.last_use = clock_, st.order_unknown = false;
      }
      Same(next->length, end, "chunk match length");
      Lost(KvBytesOk(*next, t), "a chunk's KV slot");
      if (held.length > 0) {  // the lock moved: drop the previous one from the shadow
        ShadowState& old = states_.at(locked_.back().key);
        if (--old.locks == 0) old.pinned.clear();
        locked_.pop_back();
      }
      held = *next;
      LockShadow(held, t);  // locked_.back() until the request ends
      done = end;
    }
    if (held.length > 0) UnlockAt(locked_.size() - 1);
    ++chunked_;
    ++inserts_;
  }

  void Verify() {
    ASSERT_TRUE(cache_->CheckInvariants()) << cache_->CheckInvariants().error().ToString();
    ASSERT_TRUE(buffer_->CheckInvariants()) << buffer_->CheckInvariants().error().ToString();
    std::size_t on_device = 0, on_host = 0;
    for (const auto& [key, st] : states_) (st.on_host ? on_host : on_device) += 1;
    ASSERT_EQ(cache_->num_checkpoints(), on_device) << "step " << step_;
    ASSERT_EQ(cache_->Metrics().host_checkpoints, on_host) << "step " << step_;
    std::uint64_t state_evictable = 0, state_protected = 0;
    for (auto& [key, st] : states_) {
      ASSERT_EQ(cache_->HoldsOnHost(key), st.on_host) << "step " << step_;
      st.kv_on_host = cache_->KvOnHost(key);
      if (st.kv_on_host) {
        ASSERT_TRUE(st.on_host) << "a host node with its checkpoint on the device at step " << step_;
      }
      if (st.on_host) continue;
      Lost(StateBytesOk(st.checkpoint, key, key.size()) && cache_->Holds(key), "a cached state");
      if (broken_) return;
      (st.locks > 0 ? state_protected : state_evictable) += 192;
      if (st.locks > 0) {
        const std::vector<std::uint64_t> now = {buffer_->Offset(st.checkpoint.state).value(),
                                                buffer_->Offset(st.checkpoint.window).value()};
        ASSERT_EQ(now, st.pinned) << "a locked state moved at step " << step_;
      }
    }
    for (const auto& l : locked_) {
      std::vector<std::uint64_t> now;
      for (BlockId p : l.match.pages) now.push_back(buffer_->Offset(p).value());
      ASSERT_EQ(now, l.page_offsets) << "a locked page moved at step " << step_;
    }
    const PrefixCacheMetrics m = cache_->Metrics();
    ASSERT_EQ(m.state.evictable, state_evictable);
    ASSERT_EQ(m.state.protected_bytes, state_protected);
    // Block accounting: every live block is the cache's or a running request's.
    std::uint64_t running_pages = 0, running_states = 0;
    for (const auto& r : running_) {
      for (BlockId id : r) {
        const BlockKind k = buffer_->KindOf(id).value();
        running_pages += k == kKv;
        running_states += k == kState;
      }
    }
    const auto live = buffer_->Stats().live_blocks_per_kind;
    ASSERT_EQ(live[kKv.value()], (m.kv.evictable + m.kv.protected_bytes) / 64 + running_pages) << "step " << step_;
    ASSERT_EQ(live[kState.value()], on_device + running_states) << "step " << step_;
    // The event stream replays to the cache's blocks, per medium: device blocks by id (a
    // removal carries the hash its store did), host pages by hash, host checkpoints by position.
    const std::vector<CacheEvent> events = cache_->TakeEvents();
    ASSERT_EQ(event_hashes_.Replay(events, kPage), "") << "step " << step_;
    for (const auto& e : events) {
      ASSERT_FALSE(e.window()) << "a window event without window pages at step " << step_;
      if (e.medium == EventMedium::kHost) {
        ASSERT_FALSE(e.block.valid()) << "a host event with a device block at step " << step_;
        if (e.kv()) {
          if (e.stored()) {
            host_event_pages_.insert(e.hash);
          } else {
            auto it = host_event_pages_.find(e.hash);
            ASSERT_NE(it, host_event_pages_.end()) << "a host page removed without being stored at step " << step_;
            host_event_pages_.erase(it);
          }
        } else if (e.stored()) {
          host_event_states_.insert(e.position);
        } else {
          auto it = host_event_states_.find(e.position);
          ASSERT_NE(it, host_event_states_.end()) << "a host state removed without being stored at step " << step_;
          host_event_states_.erase(it);
        }
        continue;
      }
      auto& set = e.kv() ? event_pages_ : event_states_;
      if (e.stored()) {
        ASSERT_TRUE(set.insert(e.block).second) << "stored twice at step " << step_;
        if (e.kv()) stored_hash_[e.block] = e.hash;
      } else {
        ASSERT_EQ(set.erase(e.block), 1u) << "removed without being stored at step " << step_;
        if (e.kv()) {
          ASSERT_EQ(e.hash, stored_hash_.at(e.block)) << "a removal's hash is not its store's at step " << step_;
        }
      }
    }
    ASSERT_EQ(event_pages_.size() * 64, m.kv.evictable + m.kv.protected_bytes);
    ASSERT_EQ(event_states_.size(), on_device);
    ASSERT_EQ(host_event_pages_.size(), m.host_pages) << "step " << step_;
    ASSERT_EQ(host_event_states_.size(), m.host_checkpoints) << "step " << step_;
  }

  std::mt19937 rng_;
  std::unique_ptr<Backend> backend_;  // holds the device arena (and the host arena)
  std::unique_ptr<FaultInjectingBackend> faulty_;  // over backend_: all movers, when faults are injected
  std::unique_ptr<UnifiedBuffer> buffer_;
  std::unique_ptr<PrefixCache> cache_;
  std::vector<Tokens> stems_;
  std::map<Tokens, ShadowState> states_;  // key: the tokens [0, position)
  std::vector<Locked> locked_;
  std::vector<std::vector<BlockId>> running_;
  std::set<BlockId> event_pages_, event_states_;
  std::map<BlockId, std::int64_t> stored_hash_;   // device page -> the hash its store carried
  EventHashes event_hashes_;                       // every event's hash against its path and store
  std::multiset<std::int64_t> host_event_pages_;  // host pages by hash
  std::multiset<std::uint32_t> host_event_states_;  // host checkpoints by position
  std::uint64_t clock_ = 0;
  int step_ = 0;
  int inserts_ = 0, chunked_ = 0, hits_ = 0, evictions_ = 0, refused_ = 0;
  UnalignedTail tail_;
  int tails_dropped_ = 0;  // kDrop: checkpoints off a page boundary Insert freed
  std::uint64_t evicted_states_ = 0, tombstones_ = 0, offloaded_ = 0, loaded_ = 0;
  bool host_ = false;
  FaultCounts counts_;
  bool broken_ = false;  // a counted check failed: the run stops
  int refusals_checked_ = 0, victims_watched_ = 0, exhausted_checked_ = 0, minimality_violations_ = 0;
  int cow_failed_ = 0, loads_failed_ = 0;
  int paid_ = 0;  // PayEvictable calls
  std::uint64_t host_dropped_by_insert_ = 0;
};

// Window-pages mode (sliding_window = W > 0): the same kind of shadow, for the window
// pages. The request (this test, as the runner does) allocates a window page beside each of
// its own KV pages, fills both with bytes derived from the token prefix, releases some (always
// allowed: a released window page only makes the checkpoints that need it unusable) and passes
// the tree's window pages for the pages it shares. After every operation, besides the checks
// of the ring-mode test (invariants, states' bytes, matched KV bytes, locked blocks pinned,
// block accounting, refused calls leave DebugDigest unchanged):
//   * a match is sound: its length is a cached checkpoint no deeper than the ring-mode match,
//     its window_pages are invalid before the window and, over [L - (W - 1), L), present
//     window blocks whose bytes are the query's;
//   * it is complete where the shadow knows the window is there: right after an insert whose
//     whole window at its end is the request's own (present), the end matches;
//   * locked matches keep their pages and (until ReleaseWindow) their window pages live,
//     unmoved and with their bytes; window.protected_bytes counts exactly those window pages;
//   * MakeRoom starts no victim (a window tombstone included) once the demand is satisfied,
//     an exhausted one is a fixed point, and Evict by window tokens stops short only when
//     nothing is left to evict.
class PrefixWindowRandom {
 public:
  // window: W (the token and W - 1 before it), on pages of kPage = 4 tokens.
  PrefixWindowRandom(std::uint32_t seed, std::uint32_t window, WindowRecency recency)
      : rng_(seed), window_(window) {
    UnifiedBufferConfig c;
    c.alignment = 64;
    c.capacity_bytes = 160 * 64;
    c.kinds = {{"state", 192, BufferEnd::kLow}, {"kv", 64, BufferEnd::kHigh}, {"swa", 64, BufferEnd::kLow}};
    c.padding_kind = kKv;
    c.padding_blocks = 1;
    c.compaction = CompactionMode::kLazy;
    backend_ = MakeCpuBackend(CpuBackendOptions{.copy_threads = 1});
    const Arena device = backend_->CreateArena(Tier::kDevice, Rank(0), c.capacity_bytes).value();
    buffer_ = UnifiedBuffer::Create(c, device).value();
    cache_ = PrefixCache::Create(
                 PrefixCacheConfig{.page_tokens = kPage, .window_kind = kSwa, .sliding_window = window, .record_events = true,
                                   .window_recency = recency},
                 buffer_.get())
                 .value();
    for (int s = 0; s < 4; ++s) {
      Tokens stem(24);
      for (auto& t : stem) t = Uniform(0, 49);
      stems_.push_back(stem);
    }
  }

  void Run(int steps) {
    for (int step = 0; step < steps; ++step) {
      step_ = step;
      const std::uint32_t op = Uniform(0, 99);
      if (op < 28) {
        Insert();
      } else if (op < 40) {
        MatchAndCheck(RandomQuery());
      } else if (op < 50) {
        LockRandom();
      } else if (op < 60) {
        UnlockRandom();
      } else if (op < 68) {
        ReleaseWindowRandom();
      } else if (op < 82) {
        MakeRoom();
      } else if (op < 88) {
        if (op == 87 && Uniform(0, 3) == 0) {
          PayEvictable();
        } else {
          EvictByCount();
        }
      } else if (op < 92) {
        FreeRunning();
      } else if (op < 97) {
        RefusedCall();
      } else {
        buffer_->Compact();
      }
      Verify();
      if (::testing::Test::HasFatalFailure() || broken_) break;
    }
    if (!::testing::Test::HasFatalFailure() && !broken_) {
      while (!locked_.empty()) UnlockAt(locked_.size() - 1);
      Verify();
    }
    std::printf("  window pages: %d inserts, %d hits, %d matches stopped short by a missing window, %d complete-window "
                "matches checked, %d window releases, %llu window pages evicted, %d evictions (%d refused), %llu states "
                "evicted, %d victims watched, %d refused calls unchanged; mismatches %d\n",
                inserts_, hits_, window_stops_, complete_checked_, releases_,
                static_cast<unsigned long long>(window_evicted_), evictions_, refused_,
                static_cast<unsigned long long>(evicted_states_), victims_watched_, refusals_checked_, mismatches_);
    EXPECT_EQ(mismatches_, 0);
    if (::testing::Test::HasFatalFailure() || broken_) return;
    EXPECT_GT(hits_, 0);
    EXPECT_GT(paid_, 0);
    EXPECT_GT(window_stops_, 0);  // the window did decide some matches
    EXPECT_GT(complete_checked_, 0);
    std::printf("  %d chunked inserts' windows checked, %d event hashes checked\n", chunks_checked_, event_hashes_.checked());
    EXPECT_GT(chunks_checked_, 0);
    EXPECT_GT(event_hashes_.checked(), 0);
    EXPECT_GT(releases_, 0);
    EXPECT_GT(window_evicted_, 0u);
    EXPECT_GT(evicted_states_, 0u);
    EXPECT_GT(refusals_checked_, 0);
    EXPECT_GT(victims_watched_, 0);
    EXPECT_GT(buffer_->Stats().blocks_moved, 0u);
  }

 private:
  struct State {
    BlockId block;
    std::uint32_t locks = 0;
    std::uint64_t pinned = 0;  // its offset while locked
  };
  struct Held {
    PrefixMatch match;
    Tokens key;
    std::vector<std::uint64_t> page_offsets, window_offsets;  // window: of its valid window pages
  };

  std::uint32_t Uniform(std::uint32_t lo, std::uint32_t hi) {
    return std::uniform_int_distribution<std::uint32_t>(lo, hi)(rng_);
  }
  static bool IsPrefix(const Tokens& key, const Tokens& t) {
    return key.size() <= t.size() && std::equal(key.begin(), key.end(), t.begin());
  }
  // The first page of the window a checkpoint at `length` needs (tokens [length - (W - 1), length)).
  std::uint32_t FirstWindowPage(std::uint32_t length) const {
    return length > window_ - 1 ? (length - (window_ - 1)) / kPage : 0;
  }
  void Mismatch(bool ok, const std::string& what) {
    if (ok) return;
    ++mismatches_;
    broken_ = true;
    ADD_FAILURE() << what << " at step " << step_;
  }

  // Slot j of page (or window page, salt 3) p holds the bytes of token p*kPage + j.
  void Fill(BlockId page, std::uint32_t index, const Tokens& t, std::uint32_t n, std::uint64_t salt) {
    auto span = buffer_->Bytes(page).value();
    for (auto& b : span) b = std::byte(rng_() & 0xff);
    for (std::uint32_t pos = index * kPage; pos < std::min(n, (index + 1) * kPage); ++pos) {
      const std::uint64_t h = Hash(t, pos + 1, salt);
      std::memcpy(span.data() + (pos % kPage) * kSlot, &h, sizeof h);
    }
  }
  bool SlotsOk(BlockId page, std::uint32_t index, const Tokens& t, std::uint32_t n, std::uint64_t salt) {
    auto span = buffer_->Bytes(page);
    if (!span) return false;
    for (std::uint32_t pos = index * kPage; pos < std::min(n, (index + 1) * kPage); ++pos) {
      const std::uint64_t h = Hash(t, pos + 1, salt);
      if (std::memcmp(span->data() + (pos % kPage) * kSlot, &h, sizeof h) != 0) return false;
    }
    return true;
  }
  bool StateOk(BlockId state, const Tokens& key) {
    auto s = buffer_->Bytes(state);
    const std::uint64_t h = Hash(key, key.size(), 1);
    return s && std::memcmp(s->data(), &h, sizeof h) == 0;
  }
  // Every KV page of the match and every window page it reports hold the query's bytes; the
  // window pages are exactly those of the window.
  bool MatchBytesOk(const PrefixMatch& m, const Tokens& q, bool window) {
    if (m.pages.size() != (m.length + kPage - 1) / kPage) return false;
    for (std::uint32_t i = 0; i < m.pages.size(); ++i) {
      if (!SlotsOk(m.pages[i], i, q, m.length, 0)) return false;
    }
    if (!window) return true;
    if (m.window_pages.size() != m.pages.size()) return false;
    for (std::uint32_t i = 0; i < m.window_pages.size(); ++i) {
      const BlockId w = m.window_pages[i];
      if (i < FirstWindowPage(m.length)) {
        if (w.valid()) return false;
        continue;
      }
      auto kind = buffer_->KindOf(w);
      if (!w.valid() || !kind || *kind != kSwa || !SlotsOk(w, i, q, m.length, 3)) return false;
    }
    return true;
  }

  Tokens RandomSequence() {
    const Tokens& stem = stems_[Uniform(0, static_cast<std::uint32_t>(stems_.size() - 1))];
    Tokens t = Prefix(stem, Uniform(0, 24));
    const std::uint32_t extra = Uniform(t.empty() ? 1 : 0, 8);
    for (std::uint32_t i = 0; i < extra; ++i) t.push_back(100 + Uniform(0, 2));
    return t;
  }
  Tokens RandomQuery() {
    if (states_.empty() || Uniform(0, 2) == 0) return RandomSequence();
    auto it = states_.begin();
    std::advance(it, Uniform(0, static_cast<std::uint32_t>(states_.size() - 1)));
    Tokens t = Prefix(it->first, Uniform(1, static_cast<std::uint32_t>(it->first.size())));
    for (std::uint32_t i = Uniform(0, 6); i > 0; --i) t.push_back(100 + Uniform(0, 2));
    return t;
  }
  // The longest common prefix of tokens with any cached state (the KV the tree holds).
  std::size_t KvLength(const Tokens& tokens) const {
    std::size_t kv = 0;
    for (const auto& [key, st] : states_) {
      std::size_t l = 0;
      while (l < key.size() && l < tokens.size() && key[l] == tokens[l]) ++l;
      kv = std::max(kv, l);
    }
    return kv;
  }

  PrefixMatch MatchAndCheck(const Tokens& tokens, std::uint32_t max_length) {
    std::size_t deepest = 0;  // the ring-mode match: an upper bound here
    for (const auto& [key, st] : states_) {
      if (key.size() <= max_length && IsPrefix(key, tokens)) deepest = std::max(deepest, key.size());
    }
    const std::size_t kv = KvLength(tokens);
    PrefixMatch m = cache_->Match(tokens, max_length);
    Mismatch(m.kv_length == kv, "match kv_length " + std::to_string(m.kv_length) + ", shadow " + std::to_string(kv));
    Mismatch(m.branch == (m.kv_length > m.length ? m.kv_length : 0), "match branch");
    Mismatch(m.length <= deepest, "match deeper than any cached state");
    Mismatch(!m.checkpoint.window.valid(), "a window ring with window pages");
    if (broken_) return m;
    if (m.length == 0) {
      Mismatch(m.pages.empty() && m.window_pages.empty(), "an empty match's pages");
      if (deepest > 0) ++window_stops_;
      return m;
    }
    if (m.length < deepest) ++window_stops_;
    const Tokens key = Prefix(tokens, m.length);
    auto it = states_.find(key);
    Mismatch(it != states_.end() && it->second.block == m.checkpoint.state, "the matched state is not the shadow's");
    if (broken_) return m;
    Mismatch(StateOk(m.checkpoint.state, key), "a matched state's bytes");
    Mismatch(MatchBytesOk(m, tokens, true), "a matched KV page or window page");
    ++hits_;
    return m;
  }
  PrefixMatch MatchAndCheck(const Tokens& tokens) {
    return MatchAndCheck(tokens, Uniform(0, static_cast<std::uint32_t>(tokens.size())));
  }

  void Hold(const PrefixMatch& m, const Tokens& tokens) {
    Held h{m, Prefix(tokens, m.length), {}, {}};
    for (BlockId p : m.pages) h.page_offsets.push_back(buffer_->Offset(p).value());
    for (BlockId w : m.window_pages) {
      if (w.valid()) h.window_offsets.push_back(buffer_->Offset(w).value());
    }
    State& st = states_.at(h.key);
    if (st.locks++ == 0) st.pinned = buffer_->Offset(st.block).value();
    locked_.push_back(std::move(h));
  }
  void LockRandom() {
    const Tokens q = RandomQuery();
    PrefixMatch m = MatchAndCheck(q);
    if (m.length == 0 || broken_) return;
    ASSERT_TRUE(cache_->Lock(m));
    Hold(m, q);
  }
  void UnlockAt(std::size_t i) {
    ASSERT_TRUE(cache_->Unlock(locked_[i].match)) << "step " << step_;
    --states_.at(locked_[i].key).locks;
    locked_.erase(locked_.begin() + static_cast<std::ptrdiff_t>(i));
    // A window tombstone that only the lock kept is a useless leaf now: it goes (,
    // item 2), with the useless leaves above it.
    ObserveEvictions(EvictionStats{});
  }
  void UnlockRandom() {
    if (!locked_.empty()) UnlockAt(Uniform(0, static_cast<std::uint32_t>(locked_.size() - 1)));
  }
  void ReleaseWindowRandom() {
    std::vector<std::size_t> with;
    for (std::size_t i = 0; i < locked_.size(); ++i) {
      if (!locked_[i].match.window_pages.empty()) with.push_back(i);
    }
    if (with.empty()) return;
    Held& h = locked_[with[Uniform(0, static_cast<std::uint32_t>(with.size() - 1))]];
    ASSERT_TRUE(cache_->ReleaseWindow(h.match)) << "step " << step_;
    Mismatch(h.match.window_pages.empty(), "ReleaseWindow left the match's window pages");
    h.window_offsets.clear();
    ++releases_;
  }

  // Which cached states are gone (freed by an eviction); none of them may be locked.
  void ObserveEvictions(const EvictionStats& stats) {
    window_evicted_ += stats.window_pages;
    std::vector<Tokens> gone;
    for (const auto& [key, st] : states_) {
      if (buffer_->KindOf(st.block)) continue;
      Mismatch(st.locks == 0, "a locked state was evicted");
      gone.push_back(key);
    }
    for (const auto& key : gone) states_.erase(key);
    evicted_states_ += gone.size();
  }
  std::optional<std::vector<BlockId>> Allocate(const Demand& d) {
    if (!buffer_->CanAllocate(d)) {
      const EvictionRule rule = Uniform(0, 1) ? EvictionRule::kNaive : EvictionRule::kAllocationAware;
      // Minimal eviction, as in the ring-mode test: no victim (a window tombstone included)
      // is started once the demand is satisfied.
      const std::uint32_t need = d.blocks[kKv.value()];
      const std::uint32_t free_at_start = rule == EvictionRule::kNaive ? FreeKvPages(*buffer_) : 0;
      const std::uint64_t live_at_start = buffer_->Stats().live_blocks_per_kind[kKv.value()];
      cache_->SetEvictionObserver([this, d, rule, need, free_at_start, live_at_start] {
        ++victims_watched_;
        const std::uint64_t freed = live_at_start - buffer_->Stats().live_blocks_per_kind[kKv.value()];
        Mismatch(!buffer_->CanAllocate(d) || (rule == EvictionRule::kNaive && free_at_start + freed < need),
                 std::string("MakeRoom (") + EvictionRuleName(rule) + ") started a victim although the demand fit");
      });
      auto stats = cache_->MakeRoom(d, rule);
      cache_->SetEvictionObserver(nullptr);
      ++evictions_;
      ObserveEvictions(stats ? *stats : EvictionStats{});
      if (!stats) {
        ++refused_;
        Mismatch(stats.error().code() == ErrorCode::kResourceExhausted, "MakeRoom's error code");
        const PrefixCacheMetrics m = cache_->Metrics();
        Mismatch(m.kv.evictable == 0, "evictable KV after an exhausted MakeRoom");
        if (rule == EvictionRule::kAllocationAware) {
          // (Window pages may stay evictable in metrics: eviction takes them per node, and a
          // node with one window-locked page keeps all its window pages.)
          Mismatch(m.state.evictable == 0, "evictable states after an exhausted MakeRoom: " +
                                               std::to_string(m.state.evictable) + " bytes");
        }
        const std::uint64_t digest = cache_->DebugDigest();  // a fixed point
        Mismatch(!cache_->MakeRoom(d, rule) && cache_->DebugDigest() == digest, "a second exhausted MakeRoom changed the cache");
        return std::nullopt;
      }
      Mismatch(buffer_->CanAllocate(d), "MakeRoom succeeded but the demand does not fit");
    }
    auto ids = buffer_->AllocateDemand(d);
    EXPECT_TRUE(ids) << "step " << step_;
    if (!ids) return std::nullopt;
    return *ids;
  }
  void MakeRoom() {
    Demand d = Demand::Of(3).Add(kKv, Uniform(0, 30)).Add(kSwa, Uniform(0, 12));
    if (Uniform(0, 1)) d.Add(kState, 1);
    auto ids = Allocate(d);
    if (!ids) return;
    if (Uniform(0, 1) == 0) {
      for (BlockId id : *ids) ASSERT_TRUE(buffer_->Free(id));
      return;
    }
    running_.push_back(*ids);
  }
  // Every counter can be paid: evicting all that Metrics calls evictable
  // frees exactly those bytes, kind by kind, and leaves nothing evictable and the protected
  // bytes as they were.
  bool PaidExactly(const PrefixCacheMetrics& m, const std::vector<std::uint64_t>& live_before) {
    const std::vector<std::uint64_t> live = buffer_->Stats().live_blocks_per_kind;
    auto freed = [&](BlockKind k) { return (live_before[k.value()] - live[k.value()]) * buffer_->kind_config(k).block_bytes; };
    const PrefixCacheMetrics left = cache_->Metrics();
    return freed(kKv) == m.kv.evictable && freed(kState) == m.state.evictable && freed(kSwa) == m.window.evictable &&
           left.kv.evictable == 0 && left.state.evictable == 0 && left.window.evictable == 0 &&
           left.kv.protected_bytes == m.kv.protected_bytes && left.state.protected_bytes == m.state.protected_bytes &&
           left.window.protected_bytes == m.window.protected_bytes;
  }
  void PayEvictable() {
    const PrefixCacheMetrics m = cache_->Metrics();
    const std::vector<std::uint64_t> live = buffer_->Stats().live_blocks_per_kind;
    const auto stats = cache_->Evict(UINT64_MAX, UINT32_MAX, UINT64_MAX);
    ++evictions_;
    ++paid_;
    ObserveEvictions(stats);
    Mismatch(PaidExactly(m, live), "Evict of everything evictable did not pay Metrics' counters");
  }
  void EvictByCount() {
    const std::uint32_t kind = Uniform(0, 2);
    const std::uint64_t window_tokens = kind == 2 ? Uniform(1, 16) : 0;
    const auto stats = cache_->Evict(kind == 0 ? Uniform(1, 12) : 0, kind == 1 ? Uniform(1, 3) : 0, window_tokens);
    ++evictions_;
    ObserveEvictions(stats);
    if (std::uint64_t{stats.window_pages} * kPage < window_tokens) {  // stopped early: nothing was left
      const std::uint64_t digest = cache_->DebugDigest();
      Mismatch(cache_->Evict(0, 0, 1).window_pages == 0 && cache_->DebugDigest() == digest,
               "Evict by window tokens stopped while window pages were evictable");
    }
  }
  void FreeRunning() {
    if (running_.empty()) return;
    const std::size_t i = Uniform(0, static_cast<std::uint32_t>(running_.size() - 1));
    for (BlockId id : running_[i]) ASSERT_TRUE(buffer_->Free(id));
    running_.erase(running_.begin() + static_cast<std::ptrdiff_t>(i));
  }

  // A request of t: shares the full pages of a locked match (and the tree's window pages
  // there), computes the rest (KV and window pages), releases some window pages and inserts.
  void Insert() {
    const Tokens t = Uniform(0, 1) ? RandomSequence() : RandomQuery();  // also a cached prefix recomputed
    const auto n = static_cast<std::uint32_t>(t.size());
    PrefixMatch m;
    if (Uniform(0, 1)) {
      m = MatchAndCheck(t);
      if (broken_) return;
      if (m.length > 0) {
        ASSERT_TRUE(cache_->Lock(m));
        Hold(m, t);
      }
    }
    std::set<std::uint32_t> at;
    if (Uniform(0, 4) != 0) at.insert(n);
    for (std::uint32_t i = Uniform(0, 3); i > 0; --i) at.insert(Uniform(1, n));
    const std::uint32_t num_pages = (n + kPage - 1) / kPage;
    const std::uint32_t shared = std::min(m.length / kPage, num_pages);
    const auto c = static_cast<std::uint32_t>(at.size());
    auto ids = Allocate(Demand::Of(3).Add(kState, c).Add(kKv, num_pages - shared).Add(kSwa, num_pages - shared));
    if (m.length > 0) UnlockAt(locked_.size() - 1);
    if (!ids) return;
    std::vector<BlockId> pages(m.pages.begin(), m.pages.begin() + shared);
    std::vector<BlockId> window(num_pages);
    for (std::uint32_t i = 0; i < shared; ++i) {
      if (Uniform(0, 3) != 0) window[i] = m.window_pages[i];  // the tree's (invalid outside the match's window)
    }
    std::uint32_t below_every_window = UINT32_MAX;  // pages no checkpoint of this request needs
    for (std::uint32_t p : at) below_every_window = std::min(below_every_window, FirstWindowPage(p));
    bool own_window = true;  // whether the window at n is all the request's own, present
    for (std::uint32_t i = shared; i < num_pages; ++i) {
      const BlockId p = (*ids)[c + i - shared];
      const BlockId w = (*ids)[c + num_pages + i - 2 * shared];
      Fill(p, i, t, n, 0);
      Fill(w, i, t, n, 3);
      pages.push_back(p);
      const bool release = i < below_every_window ? Uniform(0, 1) == 0 : Uniform(0, 5) == 0;
      if (release) {
        ASSERT_TRUE(buffer_->Free(w));
        if (i >= FirstWindowPage(n)) own_window = false;
      } else {
        window[i] = w;
      }
    }
    std::vector<PositionedCheckpoint> cps;
    for (std::uint32_t p : at) {
      const BlockId s = (*ids)[cps.size()];
      const std::uint64_t h = Hash(t, p, 1);
      std::memcpy(buffer_->Bytes(s)->data(), &h, sizeof h);
      cps.push_back({p, Checkpoint{s, BlockId::Invalid()}});
    }
    const std::size_t tree_kv = KvLength(t);  // how far the tree held t before
    // Sometimes as a chunk of an unfinished request (InsertChunk): every window page the
    // request attends to at n afterwards is the tree's and holds the query's bytes.
    if (at.contains(n) && Uniform(0, 2) == 0) {
      auto chunk = cache_->InsertChunk(t, pages, cps, PrefixMatch{}, window);
      if (chunk) {
        ++chunks_checked_;
        Mismatch(chunk->length == n, "a chunk's match does not end at the chunk");
        Mismatch(MatchBytesOk(*chunk, t, true), "a window page the chunk attends to is not the query's");
        ASSERT_TRUE(cache_->Unlock(*chunk));
        ++inserts_;
        for (const auto& cp : cps) {
          const Tokens key = Prefix(t, cp.position);
          if (states_.contains(key)) {
            Mismatch(!buffer_->KindOf(cp.checkpoint.state), "a duplicate checkpoint was not freed");
          } else {
            states_[key] = State{cp.checkpoint.state};
          }
        }
        return;
      }
      ASSERT_TRUE(chunk.error().code() == ErrorCode::kInvalidArgument ||
                  chunk.error().code() == ErrorCode::kFailedPrecondition)
          << chunk.error().ToString();  // refused, nothing changed: inserted whole below
    }
    auto inserted = cache_->Insert(t, pages, cps, window);
    ASSERT_TRUE(inserted) << inserted.error().ToString() << " step " << step_;
    ++inserts_;
    for (const auto& cp : cps) {
      const Tokens key = Prefix(t, cp.position);
      if (states_.contains(key)) {
        Mismatch(!buffer_->KindOf(cp.checkpoint.state), "a duplicate checkpoint was not freed");
      } else {
        states_[key] = State{cp.checkpoint.state};
      }
    }
    // The whole window at n lies in pages the request brought (those from floor(tree_kv / P)
    // on are its own, the head copy included): the end must match now.
    if (at.contains(n) && own_window && tree_kv < n && FirstWindowPage(n) >= tree_kv / kPage) {
      ++complete_checked_;
      const PrefixMatch full = MatchAndCheck(t, n);
      Mismatch(full.length == n, "no match at the end of a fresh insert with its whole window (got " +
                                     std::to_string(full.length) + " of " + std::to_string(n) + ")");
    }
  }

  // A call the cache must refuse, with the whole state (DebugDigest) unchanged.
  void RefusedCall() {
    std::vector<Tokens> keys;
    for (const auto& [key, st] : states_) keys.push_back(key);
    std::optional<std::pair<Tokens, PrefixMatch>> cached;  // a cached prefix, matched in full
    if (!keys.empty()) {
      const Tokens key = keys[Uniform(0, static_cast<std::uint32_t>(keys.size() - 1))];
      PrefixMatch m = MatchAndCheck(key, static_cast<std::uint32_t>(key.size()));
      if (broken_) return;
      if (m.length == key.size()) cached.emplace(key, std::move(m));
    }
    // A double unlock: a held match unlocked for real, then again (when nobody else holds it).
    std::optional<PrefixMatch> unlocked;
    if (!locked_.empty() && Uniform(0, 2) == 0) {
      const std::size_t i = Uniform(0, static_cast<std::uint32_t>(locked_.size() - 1));
      const PrefixMatch m = locked_[i].match;
      const Tokens key = locked_[i].key;
      UnlockAt(i);
      if (states_.contains(key) && states_.at(key).locks == 0) unlocked = m;
    }
    const std::uint32_t what = Uniform(0, cached ? 9 : 3);
    const std::uint64_t digest = cache_->DebugDigest();
    const std::uint64_t buffer_digest = buffer_->DebugDigest();
    Status status = Ok();
    switch (what) {
      case 0:  // pages that do not cover the tokens
        status = StatusOf(cache_->Insert(RandomSequence(), {}, {}, {}));
        break;
      case 1: {  // a forged match
        PrefixMatch f;
        f.length = 3;
        f.path = {0xfffffu};
        status = cache_->Lock(f);
        break;
      }
      case 2: {  // a malformed demand
        auto r = cache_->MakeRoom(Demand::Of(2).Add(kKv, 1), EvictionRule::kAllocationAware);
        if (!r) status = std::unexpected(r.error());
        break;
      }
      case 3:  // a double unlock, or an unlock of a forged match
        if (unlocked) {
          status = cache_->Unlock(*unlocked);
        } else {
          PrefixMatch f;
          f.length = 5;
          f.path = {0xffffeu};
          status = cache_->Unlock(f);
        }
        break;
      default: {
        const auto& [key, m] = *cached;
        const auto held = states_.at(key).locks;
        std::vector<BlockId> pages = m.pages;
        std::vector<BlockId> window = m.window_pages;
        switch (what) {
          case 4:  // one window page short
            window.pop_back();
            status = StatusOf(cache_->Insert(key, pages, {}, window));
            break;
          case 5:  // oversize: a page more than the tokens need
            pages.push_back(pages[0]);
            window.push_back(BlockId::Invalid());
            status = StatusOf(cache_->Insert(key, pages, {}, window));
            break;
          case 6:  // a KV page as a window page
            window.back() = pages.back();
            status = StatusOf(cache_->Insert(key, pages, {}, window));
            break;
          case 7: {  // Lock with a window page that is not on the path
            PrefixMatch f = m;
            f.window_pages.back() = f.pages.back();
            status = cache_->Lock(f);
            break;
          }
          case 8: {  // ReleaseWindow of a match nobody locked (or a forged one when someone did)
            PrefixMatch f = m;
            if (held > 0) f.checkpoint.state = BlockId::Invalid();
            status = cache_->ReleaseWindow(f);
            break;
          }
          default:  // a chunk without a checkpoint at its end (with window pages)
            auto r = cache_->InsertChunk(key, pages, {}, PrefixMatch{}, window);
            if (!r) status = std::unexpected(r.error());
            break;
        }
      }
    }
    ++refusals_checked_;
    Mismatch(!status, "bad call " + std::to_string(what) + " was accepted");
    Mismatch(cache_->DebugDigest() == digest, "the cache's digest after refused call " + std::to_string(what));
    Mismatch(buffer_->DebugDigest() == buffer_digest, "the buffer's digest after refused call " + std::to_string(what));
  }

  void Verify() {
    ASSERT_TRUE(cache_->CheckInvariants()) << cache_->CheckInvariants().error().ToString() << " step " << step_;
    ASSERT_TRUE(buffer_->CheckInvariants()) << buffer_->CheckInvariants().error().ToString() << " step " << step_;
    ASSERT_EQ(cache_->num_checkpoints(), states_.size()) << "step " << step_;
    const std::string events = event_hashes_.Take(*cache_);
    ASSERT_EQ(events, "") << "step " << step_;
    std::uint64_t state_protected = 0;
    for (const auto& [key, st] : states_) {
      Mismatch(cache_->Holds(key) && StateOk(st.block, key), "a cached state lost");
      if (st.locks > 0) {
        state_protected += 192;
        Mismatch(buffer_->Offset(st.block).value() == st.pinned, "a locked state moved");
      }
    }
    std::set<BlockId> window_locked;
    for (const auto& h : locked_) {
      std::vector<std::uint64_t> pages, window;
      for (BlockId p : h.match.pages) pages.push_back(buffer_->Offset(p).value_or(UINT64_MAX));
      for (BlockId w : h.match.window_pages) {
        if (!w.valid()) continue;
        window.push_back(buffer_->Offset(w).value_or(UINT64_MAX));
        window_locked.insert(w);
      }
      Mismatch(pages == h.page_offsets, "a locked page was freed or moved");
      Mismatch(window == h.window_offsets, "a window-locked page was freed or moved");
      if (broken_) return;
      Mismatch(MatchBytesOk(h.match, h.key, !h.match.window_pages.empty()), "a locked page's or window page's bytes");
    }
    const PrefixCacheMetrics m = cache_->Metrics();
    Mismatch(m.state.protected_bytes == state_protected, "protected state bytes");
    // Protected: at least the locked window pages (all the window pages of a node with one
    // locked, which window eviction takes together: PayEvictable checks that exactly).
    Mismatch(m.window.protected_bytes >= window_locked.size() * 64 && (window_locked.empty() || m.window.protected_bytes > 0),
             "protected window bytes " + std::to_string(m.window.protected_bytes));
    // Block accounting: every live block is the cache's or a running request's.
    std::uint64_t running[3] = {0, 0, 0};
    for (const auto& r : running_) {
      for (BlockId id : r) ++running[buffer_->KindOf(id).value().value()];
    }
    const auto live = buffer_->Stats().live_blocks_per_kind;
    Mismatch(live[kState.value()] == states_.size() + running[kState.value()], "live state blocks");
    Mismatch(live[kKv.value()] == (m.kv.evictable + m.kv.protected_bytes) / 64 + running[kKv.value()], "live KV blocks");
    Mismatch(live[kSwa.value()] == (m.window.evictable + m.window.protected_bytes) / 64 + running[kSwa.value()],
             "live window blocks");
  }

  std::mt19937 rng_;
  std::uint32_t window_;
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<UnifiedBuffer> buffer_;
  std::unique_ptr<PrefixCache> cache_;
  std::vector<Tokens> stems_;
  std::map<Tokens, State> states_;  // key: the tokens [0, position)
  std::vector<Held> locked_;
  std::vector<std::vector<BlockId>> running_;
  int step_ = 0;
  bool broken_ = false;
  int inserts_ = 0, hits_ = 0, window_stops_ = 0, complete_checked_ = 0, releases_ = 0, evictions_ = 0, refused_ = 0;
  EventHashes event_hashes_;  // every event's hash against its store
  int chunks_checked_ = 0;     // chunked inserts whose window was checked
  int refusals_checked_ = 0, mismatches_ = 0, victims_watched_ = 0;
  int paid_ = 0;  // PayEvictable calls
  std::uint64_t window_evicted_ = 0, evicted_states_ = 0;
};

// Each window rule (WindowRecency) runs half of `steps` from the same seed: the checks above
// hold whichever nodes a touch refreshes in the window LRU.
void RunWindowRandom(std::uint32_t default_seed, std::uint32_t window, int steps) {
  ULA_TEST_SEEDED(seed64, default_seed);
  const auto seed = static_cast<std::uint32_t>(seed64);
  for (WindowRecency recency : {WindowRecency::kCushion, WindowRecency::kPath}) {
    const char* rule = recency == WindowRecency::kCushion ? "cushion" : "path";
    SCOPED_TRACE(std::string("window recency ") + rule);
    std::printf("prefix random test, window pages (W = %u on %u-token pages, %s recency): seed=%u steps=%d\n", window,
                kPage, rule, seed, steps / 2);
    PrefixWindowRandom(seed, window, recency).Run(steps / 2);
    if (::testing::Test::HasFatalFailure()) return;
  }
}

// W = 6: a window of one or two pages.
TEST(PrefixCacheRandom, WindowPagesMatchOnlyWithTheirWindowAndKeepLockedWindows) { RunWindowRandom(20261201u, 6, 20000); }

// W = 3, shorter than a page: a window of one page, or two across a page boundary.
TEST(PrefixCacheRandom, WindowPagesShorterThanAPageKeepTheirBytes) { RunWindowRandom(20261202u, 3, 10000); }

void RunPrefixRandom(std::uint32_t default_seed, CompactionMode mode, int steps, std::uint32_t host_slots = 0,
                     double fault_rate = 0, UnalignedTail tail = UnalignedTail::kKeep) {
  ULA_TEST_SEEDED(seed64, default_seed);
  const auto seed = static_cast<std::uint32_t>(seed64);
  std::printf("prefix random test: seed=%u mode=%s steps=%d host slots=%u fault rate=%.2f tail=%s\n", seed,
              mode == CompactionMode::kEager ? "eager" : "lazy", steps, host_slots, fault_rate,
              tail == UnalignedTail::kDrop ? "drop" : "keep");
  PrefixRandom(seed, mode, host_slots, fault_rate, tail).Run(steps);
}

TEST(PrefixCacheRandom, LazyBufferMatchesTheShadowAndKeepsEveryCachedByte) {
  RunPrefixRandom(20250301u, CompactionMode::kLazy, 2500);
}

TEST(PrefixCacheRandom, EagerBufferMatchesTheShadowAndKeepsEveryCachedByte) {
  RunPrefixRandom(99u, CompactionMode::kEager, 2500);
}

TEST(PrefixCacheRandom, WithAHostTierCheckpointsMoveBetweenTiersAndStayExclusive) {
  RunPrefixRandom(4242u, CompactionMode::kLazy, 2500, 6);
}

// Faults in compaction moves, checkpoint copies and host-tier copies: nothing lost, nothing
// published early.
TEST(PrefixCacheRandom, InjectedFaultsLoseNothingAndPublishNothingEarly) {
  RunPrefixRandom(777u, CompactionMode::kLazy, 2500, 6, 0.2);
}

TEST(PrefixCacheRandom, InjectedFaultsWithEagerCompactionLoseNothing) {
  RunPrefixRandom(5150u, CompactionMode::kEager, 2000, 4, 0.2);
}

// SGLang's finished request (UnalignedTail::kDrop): inserts free their checkpoints off a page
// boundary and the KV past the last one on a boundary; the rest of the shadow as above.
TEST(PrefixCacheRandom, DroppingUnalignedTailsMatchesTheShadow) {
  RunPrefixRandom(20261203u, CompactionMode::kLazy, 2500, 0, 0, UnalignedTail::kDrop);
}

TEST(PrefixCacheRandom, DroppingUnalignedTailsWithAHostTierAndEagerCompaction) {
  RunPrefixRandom(20261204u, CompactionMode::kEager, 2500, 6, 0, UnalignedTail::kDrop);
}

}  // namespace
}  // namespace ula
