// PrefixCache: a radix tree over token ids for hybrid models, whose nodes own blocks of a
// HybridAllocator (normally the unified buffer).
//
// Structure: the radix is one KV page. Every node but the root owns the KV page envelope of
// the `page_tokens` (or fewer, for a last partial page) tokens on its edge; its children are
// keyed by the tokens of their page. A node may own a recurrent-state checkpoint (a state
// block and a window-ring block, copies) saved at its end position. A hybrid model can reuse
// a prefix only up to a position where a checkpoint exists, so Match returns the deepest
// node with a checkpoint (the KV past it is useless without its state).
//
// Locks: Lock(match) pins the blocks of every node on the matched path and counts a lock on
// each node; locked nodes are never evicted and their blocks never move or get freed. A
// checkpoint that Insert attaches to a node while it is locked is pinned once per lock too.
//
// Eviction: least-recently-used unlocked leaves first (ties: the deepest), freeing the page
// and the checkpoint of the leaf. MakeRoom stops, by rule:
//   kNaive            once the KV kind alone has the requested pages: the KV pages free at
//                     the start plus the pages freed since, ignoring checkpoint bytes freed;
//   kAllocationAware  once allocator.CanAllocate(demand) says the whole pending demand fits,
//                     counting what every kind freed and what compaction recovers.
//
// Invariants (CheckInvariants): each live non-root node has a live parent that keys it by
// its tokens; its page is a live KV block; page spans grow by page_tokens along a path and
// only leaves have partial pages; a locked node's ancestors are locked at least as often.
// Thread-safety: none; callers serialize (and own the allocator's thread).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <vector>

#include "ula/hybrid_allocator.h"

namespace ula {

enum class EvictionRule : std::uint8_t { kNaive, kAllocationAware };
const char* EvictionRuleName(EvictionRule rule);

struct PrefixCacheConfig {
  std::uint32_t page_tokens = 16;
  BlockKind kv_kind = BlockKind(1);
  BlockKind state_kind = BlockKind(0);
  BlockKind window_kind = BlockKind(2);  // invalid: the model has no sliding-window layer

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
  std::vector<std::uint32_t> path; // node ids root-exclusive, for Lock/Unlock
};

struct EvictionStats {
  std::uint32_t nodes = 0;
  std::uint32_t pages = 0;
  std::uint32_t checkpoints = 0;
};

class PrefixCache {
 public:
  static Result<std::unique_ptr<PrefixCache>> Create(const PrefixCacheConfig& config, HybridAllocator* allocator);
  ~PrefixCache();

  // The longest reusable prefix of tokens not longer than max_length; touches its path.
  PrefixMatch Match(std::span<const std::uint32_t> tokens, std::uint32_t max_length);
  Status Lock(const PrefixMatch& match);
  // kFailedPrecondition when the match is not locked.
  Status Unlock(const PrefixMatch& match);

  // Takes ownership of a finished sequence's blocks: pages[i] covers tokens
  // [i * page_tokens, ...) of `tokens`; checkpoints attach to the node ending at their
  // position. A page or checkpoint the tree already has is freed (a duplicate), except the
  // tree's own pages, which the sequence shared. REQUIRES: pages cover tokens exactly.
  Status Insert(std::span<const std::uint32_t> tokens, std::span<const BlockId> pages,
                std::span<const PositionedCheckpoint> checkpoints);

  // Evicts LRU unlocked leaves until `demand` can be allocated (see the rules above); under
  // kAllocationAware it stops at the first leaf after which the demand fits (minimal).
  // kInvalidArgument (a demand of the wrong shape): nothing changed.
  // kResourceExhausted when nothing evictable is left and it still does not fit: the one
  // deliberate partial effect of the cache — eviction cannot be undone (freed blocks may
  // be reused or compacted over), so what was evicted stays evicted: afterwards no unlocked
  // leaf is left, every locked node keeps its blocks, pins and offsets, and the message
  // names how many nodes went (tests/prefix/prefix_random_test.cc checks exactly that).
  // Eviction only frees blocks (no bytes move), so a failed transfer cannot lose anything
  // here.
  Result<EvictionStats> MakeRoom(const Demand& demand, EvictionRule rule);

  std::size_t num_nodes() const;  // root excluded
  std::size_t num_checkpoints() const;
  // Whether a prefix of exactly these tokens is fully reusable now (checkpoint at its end).
  bool Holds(std::span<const std::uint32_t> tokens) const;
  Status CheckInvariants() const;
  // A hash of the whole tree (nodes with their blocks, locks and LRU stamps, the free-node
  // list in order, the clock): equal before and after a refused call. For tests; O(nodes).
  std::uint64_t DebugDigest() const;

 private:
  struct Node {
    std::uint32_t parent = 0;
    std::vector<std::uint32_t> tokens;  // this node's page span
    std::uint32_t end = 0;              // position after the span
    BlockId page;
    Checkpoint checkpoint;
    std::uint32_t locks = 0;
    std::uint64_t last_use = 0;
    bool live = false;
    std::map<std::vector<std::uint32_t>, std::uint32_t> children;
  };

  PrefixCache(const PrefixCacheConfig& config, HybridAllocator* allocator);
  std::uint32_t NewNode();
  void FreeCheckpoint(const Checkpoint& c);
  // Evicts the LRU unlocked leaf; false when none.
  bool EvictOne(EvictionStats& stats);
  std::uint32_t FreeKvPages() const;

  PrefixCacheConfig config_;
  HybridAllocator* allocator_;
  std::vector<Node> nodes_;  // [0] is the root
  std::vector<std::uint32_t> free_nodes_;
  std::uint64_t clock_ = 0;
};

}  // namespace ula
