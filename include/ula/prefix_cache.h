// PrefixCache: a token-granular radix tree for hybrid models (full-attention KV pages plus
// recurrent-state checkpoints), whose nodes own blocks of a HybridAllocator (normally the
// unified buffer). Modelled on SGLang's mamba radix cache; docs/ARCHITECTURE.md says where
// it still differs.
//
// Structure. A node covers the token span [start, end) of its edge (any length >= 1); its
// children are keyed by their first token, so two sequences share a node up to the first
// token where they differ, and Insert splits a node there (or at a checkpoint position, or
// at the window boundary of the sequence's end: see Locks).
// KV stays page-aligned (page p holds tokens [p*T, (p+1)*T), T = page_tokens):
//   * a node owns the pages that START inside its span: indices [ceil(start/T), ceil(end/T));
//   * a node whose start is not page-aligned may also own a "head copy" of page
//     floor(start/T): its own copy of the page it shares with its parent, holding the
//     parent's tokens before `start` and its own after. The node produced by splitting a
//     node keeps using the page its upper half owns (no copy); a branch added later at an
//     unaligned position brings its own copy. So the unaligned tail is COPIED (the engine's
//     partial page), not dropped as SGLang does with page_size > 1 (config.unaligned_tail
//     kDrop does that for Insert).
//   * The page with index p on a path is provided by the deepest node of the path that
//     owns index p; its bytes are valid for every token of the path in that page.
// A node may hold a checkpoint (a state block, and a window ring when the model keeps its
// sliding-window KV in a ring) saved at its end position.
//
// Sliding-window KV as tokens (config.sliding_window = W > 0, SGLang's SWA radix cache):
// the window layers' KV lives in window pages (window_kind), one per KV page index, owned
// exactly like the KV pages (a node's `wpages` parallel to its `pages`, a head copy beside
// its head copy). A window page may be absent (released): the request freed it once it fell
// out of its window, or eviction dropped it (a window tombstone: the node keeps its KV and
// state). A checkpoint at L is usable only when the window pages of tokens [L - (W - 1), L)
// (what the token at L attends to) are present on its path; Match stops at the deepest
// such checkpoint. Lock takes a window lock (pins, not evictable) only on the window pages
// of the match's window (match.window_pages), and ReleaseWindow gives it back early, when
// the request's own position has moved past them. InsertChunk moves that lock with the chunk:
// the window pages the request left behind become evictable as it advances.
// No recurrent kind (state_kind invalid, window pages only: a pure SWA model, SGLang's SWA
// radix cache): no checkpoints, every token's KV is kept, and a match ends at any node
// boundary whose window is present (Holds too), and a match that ends inside a node (the
// query diverges there, or max_length) splits it there when that point's window is present,
// as SGLang's SWA match does; the match locks the node it ends at (its state lock, no state). No host tier then (it holds checkpoints). Insert splits a node at any checkpoint position, so
// checkpoints live at any token position the caller chose. A node without one is a
// tombstone (its state was evicted, or it was never saved there).
//
// Match. Walks the tokens and reports: `length`, the deepest node end <= max_length with a
// checkpoint (a hybrid model can resume only there); `pages` covering [0, length);
// `kv_length`, how many tokens of the query the tree holds KV for; `branch`, the position
// where a new checkpoint should be saved because the cached KV runs past the deepest state
// (kv_length when kv_length > length, else 0). Without a recurrent kind a match may end
// inside a node, which it splits there (see above). MatchCopyOnWrite also locks the match and
// gives the request its own state block (and ring), copied from the checkpoint in the same
// call, evicting (with the match locked) if it must.
//
// Locks (as narrow as correctness allows). Lock(match) takes a KV lock on every node of
// the path (they are not evicted, their pages are pinned: they never move) and a state
// lock only on the matched node (its checkpoint is pinned; the states of the ancestors stay
// evictable). Splitting a locked node copies the KV lock count to both halves; the state
// lock stays with the node that keeps the checkpoint (the lower half). With window pages,
// Insert also cuts the path at WindowCut(n), the first token of the window of its end n
// rounded down to a page (SGLang's split of a leaf at the window on insert), so a lock at n
// window-locks a node holding only that window rounded up to pages; the window pages
// before it stay evictable (window tombstones).
//
// Eviction by kind. Ordered sets, keyed by (last use, the root side first), give O(1)
// victims. Every touch covers a whole path (the window set: as config.window_recency says),
// and a split refreshes its lower half, so on a path a child is never older than its parent: state and window evictions tombstone the
// root side first, as SGLang's LRU lists do:
//   kv_lru_     unlocked leaves (KV evictable as a whole node);
//   state_lru_  unlocked checkpoints (state-lock count 0);
//   window_lru_ nodes with a window page present and none of them window-locked (evicting
//               one drops its window pages; an unlocked leaf goes whole, as in SGLang).
// Evicting a leaf frees its pages and checkpoint. Evicting the checkpoint of an interior
// node tombstones it: the state goes, the KV stays. A leaf left without a usable checkpoint
// (a tombstoned leaf, or one whose window pages are gone) is useless to a hybrid model and
// is removed at once, cascading upward (SGLang's _iteratively_delete_tombstone_leaf); a
// locked one is removed when its last lock goes. Evict evicts by count per kind (below).
// MakeRoom evicts until a demand fits, by rule:
//   kNaive            LRU leaves only; stops once the KV kind alone has the requested pages
//                     (KV pages free at the start plus pages freed since);
//   kAllocationAware  the LRU checkpoint first (to the host tier when there is one; else
//                     its whole node when a leaf, a tombstone otherwise), then the LRU
//                     window pages, then LRU leaves, stopping once
//                     allocator.CanAllocate(demand) holds, counting every kind and what
//                     compaction recovers.
//
// Host tier (AttachHostTier, optional). Checkpoints only: a checkpoint evicted from the
// device goes to a host slot instead of being freed (the node keeps its KV; a leaf whose
// state went to the host stays a leaf), copied through the Backend interface and published
// (the host slot recorded, the device blocks freed) only after the copy's fence completed.
// Match counts host hits (`host_length`: the deepest checkpoint on either tier);
// MatchCopyOnWrite brings a deeper host checkpoint back first (device blocks allocated,
// evicting with the path locked, host -> device copy, fence, then published and the host
// slot freed: exclusive, never on both tiers); if that fails, it matches on the device.
// A full host drops its least recently used checkpoint. Copies are waited for inside the
// call, so no node is ever seen mid-copy.
// KV pages too (HostTierConfig::page_slots > 0, not with window pages): under the
// allocation-aware rule, a leaf evicted from the device whose checkpoint is on the host (or
// none: a tombstone is removed) moves whole to host page slots instead of being freed
// (copy, fence, then publish: the host slots recorded, the device pages freed). Such a
// host node has only host nodes below it; a device leaf is a node without device children.
// Match walks into host nodes (kv_length and host_length count them: host hits);
// MatchCopyOnWrite brings the whole host part of the path back with the checkpoint, every
// node of it KV-locked until its copy completed (exclusive: the host slots are freed on
// publish). A full host drops its least recently used host leaf. Insert through a host node
// removes that host subtree first (the sequence brings the path's KV on the device).
//
// Events and metrics. With record_events, every page, window page and checkpoint that enters
// or leaves the tree, on either medium, is queued as a CacheEvent (TakeEvents drains them) for
// external routers (ula/prefix_events.h): pages and window pages with their chained hash, a
// store with its parent's hash and tokens; Reset queues one kAllCleared.
// Metrics() gives evictable and protected (locked) bytes per kind; every evictable count can
// be paid: Evict of everything frees exactly those bytes (a node's window pages are
// protected while any one of them is window-locked, as window eviction takes them together;
// the window cut keeps that to the locked window of an insert's end).
//
// Invariants (CheckInvariants): every live non-root node has a live parent that keys it by
// its first token, a non-empty span starting at its parent's end, exactly the pages its span
// starts (plus at most a head copy when its start is unaligned), all live KV blocks; every
// page index of its span is provided on its path; its checkpoint blocks are live and of the
// state (and window) kinds; an unlocked leaf has a checkpoint on some tier, never on both;
// a node's KV-lock count is at most its parent's (unless the parent is the root); state
// locks only on checkpoints; kv_lru_ holds exactly the unlocked leaves, state_lru_ the
// unlocked checkpoints and host_lru_ the host copies (but the one being loaded back), with
// their current keys; the owned-block set holds exactly the nodes' blocks; every host slot
// is either free or held by one node. Window pages: parallel to the pages, live blocks of
// window_kind, a node's window-lock count is the sum of its pages' and needs a KV lock,
// window_lru_ holds exactly the nodes with a window page and no window lock. Host nodes:
// no device blocks, one host page slot per page (and head), only host children, never in a
// device LRU set, host_kv_lru_ holds exactly the unlocked host leaves, every host page slot
// free or held by one node; kv_lru_ holds the unlocked device nodes without device children.
// Thread-safety: none; callers serialize (and own the allocator's thread).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <span>
#include <tuple>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "ula/backend.h"
#include "ula/hybrid_allocator.h"
#include "ula/prefix_events.h"

namespace ula {

enum class EvictionRule : std::uint8_t { kNaive, kAllocationAware };
// What refreshes a node's window pages in the window LRU (docs/ARCHITECTURE.md compares them):
//   kPath     every touch of the node (a match or insert through it): one clock for all kinds;
//   kCushion  SGLang's: a match refreshes only the nodes of its window cushion (the last
//             W - 1 + page_tokens tokens, SGLang's sliding_window_size + page_size), an
//             insert only the nodes it creates (its walk down refreshes no ancestor).
enum class WindowRecency : std::uint8_t { kPath, kCushion };
// What Insert keeps of a finished sequence past its last page boundary (docs/ARCHITECTURE.md
// measures both; InsertChunk always keeps what it is given, the request goes on from there):
//   kKeep  ours: KV up to the last checkpoint, wherever it is; its partial last page stays in
//          the tree, so a returning request that extends the sequence resumes at its end
//          (copying that page) and a branch there brings its own head copy;
//   kDrop  SGLang's (cache_finished_req with page_size > 1): only checkpoints at multiples of
//          page_tokens are kept (the engine saves the state at its last page boundary, as
//          SGLang's mamba track buffer does); the others, and the KV past the last kept one,
//          are freed: no partial page is cached. Without a recurrent kind, KV up to the last
//          page boundary.
enum class UnalignedTail : std::uint8_t { kKeep, kDrop };
const char* EvictionRuleName(EvictionRule rule);

struct PrefixCacheConfig {
  std::uint32_t page_tokens = 16;
  BlockKind kv_kind = BlockKind(1);
  BlockKind state_kind = BlockKind(0);   // invalid: no recurrent kind (needs sliding_window > 0)
  BlockKind window_kind = BlockKind(2);  // invalid: the model has no sliding-window layer
  // 0: window KV (if any) is a ring in each checkpoint; W > 0: window pages (see above),
  // W being the model's window (the token itself and W - 1 before it): SGLang's
  // sliding_window_size W - 1 (its window counts the tokens before the token).
  std::uint32_t sliding_window = 0;
  bool record_events = false;
  EventHash event_hash = EventHash::kSglang;  // the events' block hash (ula/prefix_events.h)
  WindowRecency window_recency = WindowRecency::kCushion;  // sliding_window > 0: the window LRU's touches
  UnalignedTail unaligned_tail = UnalignedTail::kKeep;      // Insert: a finished sequence's partial last page

  Status Validate() const;
};

struct Checkpoint {
  BlockId state;
  BlockId window;  // invalid when the model has no window ring
  bool valid() const { return state.valid(); }
};

struct PositionedCheckpoint {
  std::uint32_t position = 0;  // tokens computed when it was saved
  Checkpoint checkpoint;
};

struct PrefixMatch {
  std::uint32_t length = 0;        // reusable tokens (0: nothing reusable)
  std::vector<BlockId> pages;      // [ceil(length / page_tokens)] cached pages covering them
  Checkpoint checkpoint;           // state at `length` (invalid when length == 0)
  std::uint32_t kv_length = 0;     // tokens of the query whose KV the tree holds
  std::uint32_t branch = 0;        // where to save a checkpoint: kv_length when > length, else 0
  std::uint32_t host_length = 0;   // the deepest checkpoint counting the host tier's (>= length)
  std::vector<std::uint32_t> path; // node ids root-exclusive, for Lock/Unlock
  Checkpoint copy;                 // MatchCopyOnWrite: the request's own copy (caller owns it)
  // sliding_window > 0: [pages.size()] the window pages of the match's window (what Lock
  // window-locks), invalid before it. Empty after ReleaseWindow.
  std::vector<BlockId> window_pages;
};

struct EvictionStats {
  std::uint32_t nodes = 0;        // nodes removed
  std::uint32_t pages = 0;        // KV pages freed
  std::uint32_t checkpoints = 0;  // checkpoints freed (with their node or as tombstones)
  std::uint32_t tombstones = 0;   // of which: interior nodes that kept their KV
  std::uint64_t tokens = 0;       // tokens of the removed nodes' spans
  std::uint32_t offloaded = 0;    // of the checkpoints: moved to the host tier
  std::uint32_t window_pages = 0; // window pages freed (with their node or as window tombstones)
  std::uint32_t offloaded_pages = 0;  // of the pages: moved to the host tier (their node kept)
};

struct HostTierConfig {
  Backend* backend = nullptr;  // holds both arenas
  ArenaId device_arena;        // the allocator's arena (block offsets are offsets in it)
  Arena host_arena;            // Tier::kHost, >= slots * (state + window block bytes) + page_slots * page bytes
  std::uint32_t slots = 0;     // checkpoints the host tier holds
  std::uint32_t page_slots = 0;  // KV pages the host tier holds (0: checkpoints only)
};

struct KindBytes {
  std::uint64_t evictable = 0;
  std::uint64_t protected_bytes = 0;  // locked (window pages: of a node with a window lock)
};
struct PrefixCacheMetrics {
  KindBytes kv, state, window;
  std::uint64_t nodes = 0, checkpoints = 0, tombstones = 0;
  std::uint64_t host_checkpoints = 0, host_hits = 0;  // host hits: checkpoints loaded back
  std::uint64_t host_pages = 0, host_page_hits = 0;   // KV pages on the host; loaded back
};

class PrefixCache {
 public:
  static Result<std::unique_ptr<PrefixCache>> Create(const PrefixCacheConfig& config, HybridAllocator* allocator);
  ~PrefixCache();
  // kInvalidArgument for a null backend, unknown arenas or a host arena too small.
  Status AttachHostTier(const HostTierConfig& config);

  // The longest reusable prefix of tokens not longer than max_length; touches its path.
  PrefixMatch Match(std::span<const std::uint32_t> tokens, std::uint32_t max_length);
  // Match (after bringing a deeper host checkpoint back, when it can) + Lock + the request's
  // own copy of the checkpoint in match.copy (when length > 0), allocated (evicting by
  // `rule` with the match locked if needed) and copied now. On error the match is unlocked
  // again and the copy's blocks freed; what was evicted stays evicted (MakeRoom) and a
  // checkpoint brought back from the host stays on the device. A failed copy (kIo, from the
  // copy backend or from compaction) hands out no copy: nothing is published before its
  // bytes arrived.
  Result<PrefixMatch> MatchCopyOnWrite(std::span<const std::uint32_t> tokens, std::uint32_t max_length,
                                       EvictionRule rule);
  // kNotFound when a node of the match is gone.
  Status Lock(const PrefixMatch& match);
  // kFailedPrecondition when the match is not locked.
  Status Unlock(const PrefixMatch& match);

  // Takes ownership of a sequence's blocks: pages[i] covers tokens [i * T, ...) of
  // `tokens`; each checkpoint attaches at its position (splitting a node there). KV past the
  // last checkpoint is useless to a hybrid model and is not kept (those pages are freed).
  // A page or checkpoint the tree already has is freed (a duplicate), except the tree's own
  // pages, which the sequence shared through a match. REQUIRES: pages cover tokens exactly;
  // positions distinct. With sliding_window > 0, window_pages[i] is page i's window page
  // (invalid: released) and is taken, shared or freed as pages[i] is; a window page the tree
  // lacks (released or evicted) over a full page of the shared prefix is taken too.
  // Returns the prefix length the tree held already (KV of tokens [0, s) with s up to the
  // last checkpoint: SGLang's InsertResult.prefix_len), whose duplicate pages were freed.
  // With unaligned_tail kDrop, checkpoints off a page boundary are freed too, and KV is kept
  // only up to the last checkpoint on one (see UnalignedTail).
  Result<std::uint32_t> Insert(std::span<const std::uint32_t> tokens, std::span<const BlockId> pages,
                               std::span<const PositionedCheckpoint> checkpoints,
                               std::span<const BlockId> window_pages = {});
  // Chunked prefill (SGLang's cache_unfinished_req): inserts the chunks computed so far
  // (as Insert; the last checkpoint should be a copy of the running state at tokens.size()),
  // releases `held` (the request's previous lock, or an unlocked empty match) and returns the
  // new match of tokens, locked. The request continues with the returned pages (a duplicate
  // page of its own was freed); a partial last page now belongs to the tree and must be
  // copied before it is written again. With window pages (invalid: released by the request),
  // the new match window-locks only the window of tokens.size() and the held one's lock goes,
  // so the earlier window pages turn evictable (a window eviction tombstones them, as SGLang);
  // kInvalidArgument when a page of that window is released and the tree lacks it,
  // kFailedPrecondition when the tree lacks it over a page shared with another branch (the
  // request's copy cannot serve both): nothing changed. No recurrent kind: no checkpoints.
  Result<PrefixMatch> InsertChunk(std::span<const std::uint32_t> tokens, std::span<const BlockId> pages,
                                  std::span<const PositionedCheckpoint> checkpoints, const PrefixMatch& held,
                                  std::span<const BlockId> window_pages = {});
  // Early release of the window lock of a locked match (its window pages become evictable;
  // the KV and state locks stay): clears match.window_pages, so Unlock later leaves them.
  // kFailedPrecondition when the match's window pages are not locked: nothing changed.
  Status ReleaseWindow(PrefixMatch& match);

  // Evicts LRU unlocked leaves / checkpoints until `demand` can be allocated (see above),
  // and no further: it never starts evicting a victim (a checkpoint, or a leaf with the
  // cleanup of the tombstoned leaves it leaves behind) once the demand fits (kNaive: once
  // it fits and the KV pages free at the start plus those freed cover the KV demand).
  // kInvalidArgument (a demand of the wrong shape): nothing changed.
  // kResourceExhausted when nothing evictable is left and it still does not fit: the one
  // deliberate partial effect of the cache — eviction cannot be undone (freed blocks may be
  // reused or compacted over), so what was evicted stays evicted. Exactly: no unlocked leaf
  // is left (every remaining node is on a locked path), with kAllocationAware no unlocked
  // device checkpoint either (each went to the host tier or was freed), and locked nodes keep
  // their blocks, pins, offsets and bytes; calling it again with the same demand then
  // changes nothing (DebugDigest equal).
  // A failed host-tier copy (kIo from the backend) evicts as without a host tier: no
  // checkpoint is published on host before its bytes arrived.
  Result<EvictionStats> MakeRoom(const Demand& demand, EvictionRule rule);
  // Evicts by count, kind by kind (SGLang's evict: evict_full, then evict_mamba): LRU leaves
  // until at least kv_tokens tokens of KV are freed, then LRU checkpoints until at least
  // `states` more are freed by that phase (those freed with the leaves do not count; stats
  // counts all), then LRU window pages until at least window_tokens tokens of window KV
  // (page_tokens per page) are freed in all (as SGLang's SWA evict counts the leaves').
  // Stops early when nothing evictable is left.
  EvictionStats Evict(std::uint64_t kv_tokens, std::uint32_t states, std::uint64_t window_tokens = 0);

  const PrefixCacheConfig& config() const { return config_; }
  std::size_t num_nodes() const;  // root excluded
  std::size_t num_checkpoints() const;
  // Whether a prefix of exactly these tokens is fully reusable now (checkpoint at its end).
  bool Holds(std::span<const std::uint32_t> tokens) const;
  // Whether the checkpoint at exactly these tokens is on the host tier.
  bool HoldsOnHost(std::span<const std::uint32_t> tokens) const;
  // Whether the node ending at exactly these tokens has its KV on the host tier.
  bool KvOnHost(std::span<const std::uint32_t> tokens) const;
  PrefixCacheMetrics Metrics() const;
  std::vector<CacheEvent> TakeEvents();
  // With record_events: the store events that rebuild the blocks the tree holds now (every
  // page and window page, on its medium, root side first), for a router joining late and for
  // tests that compare a subscriber's view with the cache's. Empty without record_events.
  std::vector<CacheEvent> StoredBlocks() const;
  // Frees every block (both tiers) and empties the tree, queueing one kAllCleared event
  // (SGLang's reset) in place of the removals. kFailedPrecondition while a match is locked
  // (nothing changed).
  Status Reset();
  Status CheckInvariants() const;
  // A hash of the whole state (core/digest.h): every node (span, tokens, pages, checkpoint,
  // host slot, lock counts, last use, children), the free-node list in order, the five LRU
  // sets in order (KV, state, host, window, host KV), the free host slots in order, the host tier's bytes, the owned-block set,
  // the pending events, the clock and counters, and the allocator's DebugDigest. Equal
  // before and after a refused call. For tests; O(state).
  std::uint64_t DebugDigest() const;

  // Checkpoint copies (MatchCopyOnWrite's copy of the state and ring) go as copy batches of
  // `backend` inside `device_arena` (the allocator's arena), waited on before the copy is
  // handed out; without a copy backend they are memcpy. kInvalidArgument for a null backend
  // or an arena it does not know, kFailedPrecondition when one is attached already.
  Status AttachCopyBackend(Backend* backend, ArenaId device_arena);
  // Called just before MakeRoom or Evict starts evicting one victim (for tests and tracing:
  // the randomized test checks there that the demand does not fit yet). Null: none.
  void SetEvictionObserver(std::function<void()> observer) { observer_ = std::move(observer); }

 private:
  struct Node {
    std::uint32_t parent = 0;
    std::vector<std::uint32_t> tokens;  // the span [start, end)
    std::uint32_t start = 0, end = 0;
    BlockId head;                       // head copy of page floor(start / T), or invalid
    std::vector<BlockId> pages;         // pages [ceil(start/T), ceil(end/T))
    std::vector<std::uint64_t> hashes;  // record_events: [pages.size()] each page's event hash
    std::uint64_t head_hash = 0;        // record_events: the head copy's
    // record_events: the tokens after `end` that its last (partial) page holds, when it
    // provides that page: a split's lower half, or the next node of the insert, wrote them.
    std::vector<std::uint32_t> tail;
    BlockId whead;                      // sliding_window > 0: the head copy's window page
    std::vector<BlockId> wpages;        // sliding_window > 0: [pages.size()] (invalid: absent)
    std::uint32_t window_locks = 0;     // window locks on its window pages, summed
    Checkpoint checkpoint;
    std::uint32_t host = kNoSlot;  // host slot of an offloaded checkpoint
    bool host_window = false;      // whether that slot holds a window ring too
    bool kv_on_host = false;       // its KV is on host page slots (pages and head invalid)
    std::vector<std::uint32_t> host_pages;  // kv_on_host: [pages.size()] host page slots
    std::uint32_t host_head = kNoSlot;      // kv_on_host: the head copy's host page slot
    std::uint32_t kv_locks = 0, state_locks = 0;
    std::uint64_t last_use = 0;
    std::uint64_t window_use = 0;  // the window LRU's last use (WindowRecency)
    bool live = false;
    std::unordered_map<std::uint32_t, std::uint32_t> children;  // first token -> node
  };
  // (last use, end, id): begin() is the victim; on ties the root side first (SGLang's
  // order: on a path, a child is more recent than its parent).
  using LruKey = std::tuple<std::uint64_t, std::uint32_t, std::uint32_t>;

  static constexpr std::uint32_t kNoSlot = UINT32_MAX;

  PrefixCache(const PrefixCacheConfig& config, HybridAllocator* allocator);
  // Copies a checkpoint between its device blocks and a host slot and waits for it.
  Status HostCopy(const Checkpoint& c, std::uint32_t slot, bool to_host);
  // Moves the node's checkpoint to the host tier; false when there is no tier or no slot.
  bool Offload(std::uint32_t id, EvictionStats& stats);
  // Frees the node's host slot (removing a leaf left with no checkpoint at all).
  void DropHost(std::uint32_t id, EvictionStats& stats);
  Status LoadBack(std::uint32_t id, EvictionRule rule);
  // Copies pages between device blocks and host page slots (to_host) and waits.
  Status HostPageCopy(std::span<const BlockId> blocks, std::span<const std::uint32_t> slots, bool to_host);
  // Moves an unlocked device leaf's KV (its checkpoint already on the host) to host page
  // slots; false when there is no room (nothing changed).
  bool OffloadKv(std::uint32_t id, EvictionStats& stats);
  bool HasDeviceChild(const Node& n) const;
  // Removes a host node and everything below it (host slots freed).
  void RemoveHostSubtree(std::uint32_t id);
  // RemoveHostSubtree, then the ancestors it leaves useless (no checkpoint, no child).
  void DropHostLeaf(std::uint32_t id, EvictionStats& stats);
  // The node that ends exactly at `length` along tokens (0: none).
  std::uint32_t NodeAt(std::span<const std::uint32_t> tokens, std::uint32_t length) const;

  // Insert, in steps: the checks and the read-only walk (nothing changes), then the path
  // (splits and new nodes), the window pages adopted, the checkpoints attached.
  struct InsertPlan {
    std::map<std::uint32_t, Checkpoint> at;  // position -> checkpoint (those left are duplicates)
    std::vector<Checkpoint> dropped;         // drop_tail: checkpoints off a page boundary (freed)
    std::uint32_t n = 0;                     // tokens kept: [0, n), up to the last checkpoint
    std::uint32_t s = 0;                     // of them, the tokens the tree holds already
    bool head_copy = false;                  // the first new node brings a head copy
    // Whether the page at s (s unaligned) is read by no other path once inserted: the node
    // ending at s exists and every child of it has its own head copy.
    bool last_page_private = false;
    std::uint32_t new_from = 0, new_to = 0;  // incoming page indices the tree takes
    std::uint32_t host_child = 0;            // a host node the sequence goes on through (0: none)
    std::vector<BlockId> tree_pages, tree_wpages;  // the tree's pages over the walked prefix
    bool Taken(std::uint32_t i) const { return i >= new_from && i < new_to; }
    bool Shared(std::uint32_t i, BlockId page) const {
      return !Taken(i) && i < tree_pages.size() && page == tree_pages[i];
    }
    // Whether a window page the tree lacks at page i (of the shared prefix) can be adopted:
    // a full page of [0, s), or the page at s when no other path reads it.
    bool Adoptable(std::uint32_t i, std::uint32_t T) const {
      return (i + 1) * T <= s || ((i + 1) == (s + T - 1) / T && last_page_private);
    }
  };
  Result<std::unordered_set<BlockId>> CheckInsertBlocks(std::span<const BlockId> pages,
                                                        std::span<const BlockId> window_pages) const;
  Result<std::map<std::uint32_t, Checkpoint>> CheckInsertCheckpoints(std::size_t tokens,
                                                                     std::span<const PositionedCheckpoint> checkpoints,
                                                                     std::unordered_set<BlockId>& incoming) const;
  // drop_tail: UnalignedTail::kDrop applies (Insert's; never a chunk's).
  Result<InsertPlan> PlanInsert(std::span<const std::uint32_t> tokens, std::span<const BlockId> pages,
                                std::span<const PositionedCheckpoint> checkpoints,
                                std::span<const BlockId> window_pages, bool drop_tail) const;
  Result<std::uint32_t> InsertSequence(std::span<const std::uint32_t> tokens, std::span<const BlockId> pages,
                                       std::span<const PositionedCheckpoint> checkpoints,
                                       std::span<const BlockId> window_pages, bool drop_tail);
  std::vector<std::uint32_t> InsertPath(std::span<const std::uint32_t> tokens, std::span<const BlockId> pages,
                                        std::span<const BlockId> window_pages, const InsertPlan& plan);
  void AdoptWindowPages(const std::vector<std::uint32_t>& path, std::span<const std::uint32_t> tokens,
                        std::span<const BlockId> window_pages, const InsertPlan& plan);
  void AttachCheckpoints(const std::vector<std::uint32_t>& path, std::map<std::uint32_t, Checkpoint>& at);
  // InsertChunk with window pages: whether the window of the chunk's end will be the tree's.
  Status CheckChunkWindow(std::span<const std::uint32_t> tokens, std::span<const BlockId> pages,
                          std::span<const PositionedCheckpoint> checkpoints, std::span<const BlockId> window_pages) const;
  std::uint32_t NewNode();
  // No recurrent kind (state_kind invalid, window pages only): no checkpoints, a match ends at
  // any node boundary whose window is present.
  bool stateless() const { return !config_.state_kind.valid(); }
  LruKey KeyOf(std::uint32_t id) const;
  LruKey WindowKeyOf(std::uint32_t id) const;  // window_lru_'s: (window_use, end, id)
  // Refreshes the window LRU's use of the window cushion of a match ending at path.back().
  void TouchWindowCushion(const std::vector<std::uint32_t>& path, std::uint64_t clock);
  // Removes the node from both LRU sets, calls f, puts it back where it belongs.
  template <class F>
  void Update(std::uint32_t id, F&& f);
  void Touch(std::uint32_t id, std::uint64_t clock);
  std::uint32_t Split(std::uint32_t id, std::uint32_t at);
  void FreeCheckpoint(const Checkpoint& c, std::uint32_t position);
  // Events (record_events): a page's store (hash, the previous page's hash or none, its
  // tokens) or removal, and a checkpoint's, on a medium.
  using ParentHash = std::optional<std::uint64_t>;
  void RecordStored(CacheEvent::Type type, BlockId block, std::uint32_t index, std::uint64_t hash, ParentHash parent,
                    std::span<const std::uint32_t> tokens, EventMedium medium = EventMedium::kDevice);
  void RecordRemoved(CacheEvent::Type type, BlockId block, std::uint32_t index, std::uint64_t hash,
                     EventMedium medium = EventMedium::kDevice);
  void RecordState(CacheEvent::Type type, BlockId state, std::uint32_t position, EventMedium medium);
  // The node's KV pages (and head copy) as events of one type on one medium (host moves).
  void RecordNodePages(std::uint32_t id, CacheEvent::Type type, EventMedium medium);
  void FreePage(BlockId page, std::uint32_t index, std::uint64_t hash);
  void StorePage(BlockId page, std::uint32_t index, std::uint64_t hash, ParentHash parent,
                 std::span<const std::uint32_t> tokens);
  // The event hash of page `index` on the path to `node` (its deepest provider; 0: none).
  std::uint64_t PageHashOnPath(std::uint32_t node, std::uint32_t index) const;
  // Page index - 1's hash on that path (none for page 0).
  ParentHash ParentHashOnPath(std::uint32_t node, std::uint32_t index) const;
  // The path's tokens [0, nodes_[node].end).
  std::vector<std::uint32_t> PathTokens(std::uint32_t node) const;
  // The tokens page `index` (one the node provides) holds: what its store hashed, the
  // node's tail included.
  std::vector<std::uint32_t> PageTokens(std::uint32_t node, std::uint32_t index) const;
  // Whether the node provides the page of its last token and that page runs past its end.
  bool ProvidesLastPage(const Node& n) const;
  // Whether a node is a useless leaf: childless, unlocked, on the device, and without a
  // usable checkpoint (none on either tier, or its window pages gone: a window tombstone).
  bool Useless(std::uint32_t id) const;
  // Removes a leaf and its blocks, then every useless leaf above it.
  void RemoveLeaf(std::uint32_t id, EvictionStats& stats);
  void DropCheckpoint(std::uint32_t id, EvictionStats& stats);
  bool EvictLeaf(EvictionStats& stats);
  bool EvictState(EvictionStats& stats);
  std::uint32_t FreeKvPages() const;
  std::vector<BlockId> PagesOfPath(const std::vector<std::uint32_t>& path, std::uint32_t length) const;
  // For each page index of [0, length): the node providing it on the path, and whether as
  // its head copy (node 0: none).
  struct Provider {
    std::uint32_t node = 0;
    bool head = false;
  };
  std::vector<Provider> ProvidersOfPath(const std::vector<std::uint32_t>& path, std::uint32_t length) const;
  BlockId& WindowSlot(Provider p, std::uint32_t index);
  std::vector<BlockId> WindowPagesOfPath(const std::vector<std::uint32_t>& path, std::uint32_t length) const;
  // The first page index of the window a checkpoint at `length` needs.
  std::uint32_t WindowFirstPage(std::uint32_t length) const;
  // Where Insert of [0, length) cuts the path so the window of `length` starts a node: the
  // first token of WindowFirstPage(length) (0: no window pages, or the window is all of it).
  std::uint32_t WindowCut(std::uint32_t length) const;
  // Whether a checkpoint at the end of path (a prefix of a root path) has its window.
  bool HasWindow(const std::vector<std::uint32_t>& path, std::uint32_t length) const;
  // The window page `page` on the path to `node`: its owner node (0: not on the path).
  std::uint32_t WindowOwner(std::uint32_t node, BlockId page) const;
  Status CheckWindowLocked(const PrefixMatch& match, std::uint32_t node) const;
  void LockWindow(const PrefixMatch& match, std::uint32_t node, bool lock);
  bool EvictWindow(EvictionStats& stats);
  void FreeWindowPages(std::uint32_t id, EvictionStats& stats);
  // Validates a match for Lock (locking) or Unlock; returns its node (0: empty match).
  Result<std::uint32_t> LockedNode(const PrefixMatch& match, bool locking) const;
  void PinMatch(std::uint32_t node, bool pin);
  // Copies a checkpoint's blocks into another's (the copy backend or memcpy), waited for.
  Status CopyCheckpoint(const Checkpoint& from, const Checkpoint& to);

  PrefixCacheConfig config_;
  HybridAllocator* allocator_;
  std::vector<Node> nodes_;  // [0] is the root
  std::vector<std::uint32_t> free_nodes_;
  std::set<LruKey> kv_lru_, state_lru_, host_lru_, window_lru_;
  std::set<LruKey> host_kv_lru_;  // unlocked host leaves (KV on the host, no children)
  std::vector<std::uint32_t> free_host_pages_;
  std::uint64_t host_page_hits_ = 0;
  bool offload_kv_ = false;  // MakeRoom's allocation-aware rule is running (EvictLeaf may offload)
  std::unordered_map<BlockId, std::uint32_t> window_locks_;  // window page -> locks
  HostTierConfig host_;  // host_.backend == nullptr: no host tier
  std::vector<std::uint32_t> free_host_;
  std::uint64_t host_hits_ = 0;
  std::uint32_t loading_ = kNoSlot;  // the node LoadBack is bringing back (not droppable)
  std::vector<CacheEvent> events_;
  std::unordered_set<BlockId> owned_;  // every block the tree holds
  std::uint64_t clock_ = 0;
  Backend* mover_ = nullptr;  // checkpoint copies (null: memcpy)
  ArenaId mover_arena_;
  std::function<void()> observer_;
};

}  // namespace ula
