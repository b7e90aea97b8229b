// SparsePrefixCache: a token-granular radix tree over logical addresses (docs/ARCHITECTURE.md "Shared
// prefixes"). Token ids -> runs of logical addresses of one sparse address space
// (DP: one rank of an AddressSpace; TP: a TpAddressSpace). Modelled on SGLang's RadixCache
// (match_prefix / insert / inc_lock_ref / dec_lock_ref / evict), with two differences:
// the KV it names never moves or copies (a node holds *references* on addresses, the
// entries stay in the exclusive tiers under the space's residency policy, so a cold cached
// prefix drifts to host through PB-LRU with no copy), and eviction is allocation-aware.
//
// Structure. Nodes in a vector (id 0 = root, ids reused through a free list, each with a
// generation so that a stale match is recognised). A non-root node covers the token span
// [start, end) of its edge (length >= 1) with one address per token; its children are
// keyed by their first token. Two sequences share a node up to the first token where they
// differ; Insert and Match split a node there (the upper half becomes a new parent, the
// node keeps its id and the lower half, so a match ending at it stays valid).
// Every address of every node carries one cache reference of the space (Retain), dropped
// (Release) when the node is evicted: the address is freed then only if no request holds
// it. A request that reuses a match adopts its addresses (space.ShareInto).
//
// Locks (SGLang's lock_ref). Lock(match) adds one lock to every node from the match's node
// up to the root; a locked node is never evicted. Splitting a locked node gives the new
// upper half the same count. Unlock removes one lock along the same path.
//
// Eviction. An ordered set of the unlocked leaves keyed by (last use, id) gives the LRU
// victim in O(log n). Evicting a leaf releases its addresses and removes it; a parent left
// childless and unlocked becomes a leaf (and a candidate). MakeRoom(n) is allocation-aware:
// it evicts LRU leaves only while the pending allocation of n entries does not fit the
// tiers of the cache's domain (DP: device + host free slots of its rank in every group;
// TP: the free shard entries of all ranks, as TpAddressSpace::Allocate counts them) and
// stops as soon as it fits. A leaf whose addresses requests still hold frees nothing;
// eviction goes on to the next. Evict(n) evicts by count (at least n cached tokens).
//
// Invariants (CheckInvariants): every live non-root node has a live parent that keys it
// by its first token, a non-empty span starting at its parent's end, one address per
// token, each live in the space with at least one cache reference (and, DP, on the cache's
// rank); a node's lock count is at most its parent's (the root excepted); the LRU set holds
// exactly the unlocked leaves with their current keys; cached_tokens is the sum of spans.
//
// Errors: bad input returns an error and changes nothing (DebugDigest of the cache and of
// the space equal before and after): Insert with tokens and addresses of different length
// or with an address that is not live (or, DP, of another rank); Lock of a stale match
// (kNotFound); Unlock of a match that is not locked (kFailedPrecondition); MakeRoom that
// cannot make room (kResourceExhausted: the one deliberate partial effect, as in
// PrefixCache::MakeRoom — what was evicted stays evicted, locked nodes keep everything).
//
// Thread-safety: none; the scheduler's thread drives the cache and its space. The cache
// holds the space by reference; the space outlives it (its destructor releases nothing).
#pragma once

#include <cstdint>
#include <memory>
#include <set>
#include <span>
#include <unordered_map>
#include <utility>
#include <vector>

#include "ula/address_space.h"
#include "ula/error.h"
#include "ula/ids.h"
#include "ula/tp_address_space.h"

namespace ula {

struct SparsePrefixMatch {
  std::uint32_t length = 0;        // cached tokens of the query's prefix
  std::vector<LogicalAddr> addrs;  // [length] their addresses, in token order
  std::uint32_t node = 0;          // the node ending at `length` (0: the root, empty match)
  std::uint32_t generation = 0;    // of that node, to recognise a stale match
};

struct SparseEvictionStats {
  std::uint32_t nodes = 0;     // nodes removed
  std::uint64_t tokens = 0;    // cached tokens released
  std::uint64_t freed = 0;     // of those, addresses freed (no request held them)
};

struct SparsePrefixCacheMetrics {
  std::uint64_t nodes = 0;           // root excluded
  std::uint64_t cached_tokens = 0;   // sum of the spans
  std::uint64_t locked_tokens = 0;   // of those, in locked nodes
  std::uint64_t evictable_leaves = 0;
};

class SparsePrefixCache {
 public:
  // DP: the cache of one rank (kOutOfRange for a rank past the space).
  static Result<std::unique_ptr<SparsePrefixCache>> Create(AddressSpace& space, Rank rank);
  // TP: one cache for the whole space (its addresses stay striped a mod P).
  static Result<std::unique_ptr<SparsePrefixCache>> Create(TpAddressSpace& space);
  ~SparsePrefixCache();
  SparsePrefixCache(const SparsePrefixCache&) = delete;
  SparsePrefixCache& operator=(const SparsePrefixCache&) = delete;

  // The longest cached prefix of tokens; splits the node where the match ends inside an
  // edge and touches the path (SGLang's match_prefix).
  SparsePrefixMatch Match(std::span<const std::uint32_t> tokens);
  // The length Match would return, without touching or splitting (a router's probe). O(len).
  std::uint32_t PeekLength(std::span<const std::uint32_t> tokens) const;
  Status Lock(const SparsePrefixMatch& match);
  Status Unlock(const SparsePrefixMatch& match);

  // Caches tokens[i] -> addrs[i]: the part the tree already has keeps the tree's addresses
  // (the caller's own ones for it are duplicates, freed with their request); the rest
  // becomes a new leaf holding a cache reference on each of its addresses. Returns the
  // length of the part that was cached already. kInvalidArgument (sizes differ, an address
  // of another rank), kNotFound (an address not live): nothing changes.
  Result<std::uint32_t> Insert(std::span<const std::uint32_t> tokens, std::span<const LogicalAddr> addrs);

  // Allocation-aware eviction (see above): evicts LRU unlocked leaves until an allocation
  // of n_entries fits the domain's tiers, and not one more.
  Result<SparseEvictionStats> MakeRoom(std::uint64_t n_entries);
  // Evicts LRU unlocked leaves until at least n_tokens cached tokens went (or none is left).
  SparseEvictionStats Evict(std::uint64_t n_tokens);
  // Entries an allocation can take now in the domain (DP: min over groups of the rank's
  // free device + host slots; TP: the free shard entries of all ranks).
  std::uint64_t Room() const;

  SparsePrefixCacheMetrics Metrics() const;
  std::uint64_t cached_tokens() const { return cached_tokens_; }
  Status CheckInvariants() const;
  // A hash of the tree (nodes, spans, addresses, locks, use stamps, LRU set). For tests.
  std::uint64_t DebugDigest() const;

  struct Domain;  // internal: the space behind the cache (a DP rank or the TP space)

 private:
  struct Node {
    std::uint32_t parent = 0;
    std::uint32_t start = 0;            // tokens before the span
    std::vector<std::uint32_t> tokens;  // the span
    std::vector<LogicalAddr> addrs;     // [tokens.size()]
    std::uint32_t locks = 0;
    std::uint64_t last_use = 0;
    std::uint32_t generation = 0;
    bool live = false;
    std::unordered_map<std::uint32_t, std::uint32_t> children;  // first token -> node
  };
  using LruKey = std::pair<std::uint64_t, std::uint32_t>;  // (last use, id)

  explicit SparsePrefixCache(std::unique_ptr<Domain> domain);

  // Walks tokens: the deepest node reached, the tokens matched, and how many tokens of
  // that node's span matched (== its span when it ended on a node boundary).
  struct Walk {
    std::uint32_t node = 0;
    std::uint32_t length = 0;
    std::uint32_t in_node = 0;
  };
  Walk WalkTokens(std::span<const std::uint32_t> tokens) const;
  std::uint32_t NewNode();
  std::uint32_t Split(std::uint32_t id, std::uint32_t at);
  bool IsLeaf(std::uint32_t id) const { return id != 0 && nodes_[id].children.empty(); }
  void SyncLru(std::uint32_t id);  // puts a node in / out of the LRU set as it now belongs
  void Unlist(std::uint32_t id);
  bool EvictOne(SparseEvictionStats& stats);
  Result<std::uint32_t> CheckedNode(const SparsePrefixMatch& match) const;

  std::unique_ptr<Domain> domain_;
  std::vector<Node> nodes_;  // [0] is the root
  std::vector<std::uint32_t> free_nodes_;
  std::set<LruKey> lru_;     // unlocked leaves
  std::uint64_t clock_ = 0;
  std::uint64_t cached_tokens_ = 0;
};

}  // namespace ula
