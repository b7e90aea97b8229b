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
//
// Kinds mode (a DP space with kinds, AddressSpaceConfig::kinds; docs/ARCHITECTURE.md "Shared
// prefixes across kinds"). Create(space, rank) over a space with kinds makes this mode: the
// cache holds prefixes of every kind (C4 entries with their index keys, C128 blocks, window
// blocks) by holder requests, as AddressSpace::SharePrefix shares them, in whole share units
// A (KindEntries::ShareUnit: 256 tokens for V4 at 64 addresses a page).
//   Structure. The same tree, one node per unit: a non-root node covers the A tokens
//     [start, start + A) of its edge (start a multiple of A) and holds one holder, a request
//     of the cache's rank made by SharePrefix from an inserting source with the prefix
//     [0, start + A): so it holds the C4 entries of that prefix by address, its full C128
//     blocks by reference (its own partly filled last block, copied), and the window ring's
//     blocks of [start + A - ring_tokens, start + A); it never allocates. Children are keyed
//     by their unit's block hash (SGLang's chain, EventHash; one 256-token page per unit) and
//     a lookup also compares the tokens. Holder ids are the cache's own: request ids
//     [first_holder, first_holder + max_holders) of SparsePrefixCacheConfig, holder of node
//     n = first_holder + n; the engine must never use an id of that range.
//   Insert(tokens, source) caches the whole units of tokens the tree lacks, each a node whose
//     holder shares the source's prefix up to its end; tokens are the source's first tokens
//     (the cache cannot check that: the space has no token ids). It needs the source's window
//     ring to still hold the window of the first new unit's end (in its prefill's round, as
//     SGLang's cache_unfinished_req runs): else kFailedPrecondition, nothing changed. It
//     returns the copies of the holders' partly filled C128 blocks, for the engine to run.
//   Match(tokens) gives the longest cached unit-aligned prefix and its node's holder: the
//     request resuming there calls space.SharePrefix(request, match.holder, match.length) and
//     recomputes the rest of its prompt (SharePrefix's rule for a prefix inside a block).
//     Match never splits (nodes are units) and leaves match.addrs empty. Lock/Unlock as
//     above; the cache's destructor frees no holder (evict first: Evict(all)).
//   Eviction. LRU unlocked leaves, as above; evicting a node frees its holder (space.Free),
//     which frees what it alone held: its C4 entries (and so their index keys) whose last
//     reference it was, and its C128 and window blocks whose last holder it was
//     (KindEntries' block reference counts); a leaf whose blocks or entries running requests
//     still hold frees less, and eviction goes on. Each eviction counts what it freed per kind
//     (SparseEvictionStats::freed_per_kind; Metrics().evicted_per_kind in total).
//     MakeRoom(demand) is allocation-aware over every kind: demand[k] is the pending
//     allocation's C4 entries for the sparse kind, blocks for a C128 or window kind (the
//     companions and per-request kinds: ignored); it fits when the rank's free C4 slots
//     (device + host, every group) hold the sparse demand and every block kind with a
//     capacity (SparsePrefixCacheConfig::kind_block_capacity: the engine's pool of that kind)
//     has demand[k] blocks free; it evicts only while the demand does not fit and stops at
//     the first fit.
//   Events (record_events; TakeEvents). A new node stores, an evicted node removes, one block
//     per event kind: its C4 page (64 entries, the index keys with it: one address page), its
//     C128 entries (the two of its unit, in its holder's last C128 block) and its window
//     blocks (the ring's blocks of its end), each a CacheEvent with the unit's hash, the
//     parent unit's hash, the unit's tokens, and its kind's group (CacheEvent::group: vLLM's
//     group_idx and kv_cache_spec_kind, ula/prefix_events.h): groups numbered in the space's
//     kind order among the event kinds (V4: window 0, c4 1, c128 2). Every eviction's removals
//     follow it at once, all of a node's groups.
//   Invariants (CheckInvariants, besides the tree's): every live non-root node has a span of
//     exactly A tokens starting at a multiple of A, no addresses, and its holder is live in
//     the space, on the cache's rank, with start + A tokens and that shared prefix, holder id
//     first_holder + node; its key is its unit's hash.
//   Errors (nothing changed, DebugDigest of the cache and the space): Insert(tokens, source)
//     of an unknown source or one of another rank (kNotFound / kInvalidArgument), more tokens
//     than the source holds (kOutOfRange), the ring condition above (kFailedPrecondition),
//     more nodes than holder ids (kResourceExhausted), a holder id the engine uses
//     (kAlreadyExists); the address form of Insert or MakeRoom
//     in kinds mode and the kinds forms without kinds (kFailedPrecondition); a demand of the
//     wrong size (kInvalidArgument). Create refuses a TP space with kinds (kUnsupported:
//     SharePrefix, and so a holder, has no TP form) and a space over kind frames (kUnsupported:
//     SharePrefix refuses it), and a config whose holder range overflows (kInvalidArgument).
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
#include "ula/kv_kinds.h"
#include "ula/prefix_events.h"
#include "ula/tp_address_space.h"

namespace ula {

struct SparsePrefixMatch {
  std::uint32_t length = 0;        // cached tokens of the query's prefix
  std::vector<LogicalAddr> addrs;  // [length] their addresses, in token order
  std::uint32_t node = 0;          // the node ending at `length` (0: the root, empty match)
  std::uint32_t generation = 0;    // of that node, to recognise a stale match
  // (kinds mode: addrs is empty; length is whole units)
  RequestId holder = RequestId::Invalid();  // kinds mode: the node's holder (SharePrefix from it)
};

// Kinds mode: what Insert(tokens, source) did.
struct KindInsert {
  std::uint32_t matched = 0;   // tokens the tree had already (whole units)
  std::uint32_t inserted = 0;  // tokens of the new nodes (whole units)
  std::vector<KindBlockCopy> copies;  // the holders' partly filled C128 blocks, for the engine to run
};

struct SparsePrefixCacheConfig {
  // Kinds mode: holder request ids [first_holder, first_holder + max_holders), the cache's.
  RequestId first_holder = RequestId(std::uint64_t{1} << 62);
  std::uint32_t max_holders = 1u << 24;
  // Kinds mode: blocks of each kind the engine's pools hold ([num_kinds]; empty or 0: no
  // bound), what MakeRoom's demand of a C128 or window kind is checked against.
  std::vector<std::uint64_t> kind_block_capacity;
  bool record_events = false;
  EventHash event_hash = EventHash::kSglang;
  Status Validate() const;
};

struct SparseEvictionStats {
  std::uint32_t nodes = 0;     // nodes removed
  std::uint64_t tokens = 0;    // cached tokens released
  std::uint64_t freed = 0;     // of those, addresses freed (no request held them)
  // Kinds mode: what the evictions freed per kind ([num_kinds]): entries of the sparse kind
  // and its companions, blocks of the C128 and window kinds (per-request kinds: 0).
  std::vector<std::uint64_t> freed_per_kind;
};

struct SparsePrefixCacheMetrics {
  std::uint64_t nodes = 0;           // root excluded
  std::uint64_t cached_tokens = 0;   // sum of the spans
  std::uint64_t locked_tokens = 0;   // of those, in locked nodes
  std::uint64_t evictable_leaves = 0;
  std::vector<std::uint64_t> evicted_per_kind;  // kinds mode: freed_per_kind summed over every eviction
};

class SparsePrefixCache {
 public:
  // DP: the cache of one rank (kOutOfRange for a rank past the space).
  // Over a space with kinds: the kinds mode (above); kUnsupported over kind frames,
  // kInvalidArgument for a bad config.
  static Result<std::unique_ptr<SparsePrefixCache>> Create(AddressSpace& space, Rank rank,
                                                           const SparsePrefixCacheConfig& config = {});
  // TP: one cache for the whole space (its addresses stay striped a mod P). kUnsupported for a
  // TP space with kinds (the kinds mode is DP only: SharePrefix has no TP form).
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
  // Kinds mode: caches the whole units of the source's first tokens (above).
  Result<KindInsert> Insert(std::span<const std::uint32_t> tokens, RequestId source);

  // Allocation-aware eviction (see above): evicts LRU unlocked leaves until an allocation
  // of n_entries fits the domain's tiers, and not one more.
  Result<SparseEvictionStats> MakeRoom(std::uint64_t n_entries);
  // Kinds mode: evicts LRU unlocked leaves until demand ([num_kinds], above) fits, and not
  // one more. kInvalidArgument (size), kResourceExhausted (as MakeRoom(n)).
  Result<SparseEvictionStats> MakeRoom(std::span<const std::uint64_t> demand);
  // Kinds mode: whether demand fits now.
  bool Fits(std::span<const std::uint64_t> demand) const;
  // The events since the last call (record_events; kinds mode), in order.
  std::vector<CacheEvent> TakeEvents();
  bool kinds_mode() const { return kinds_ != nullptr; }
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
  struct Kinds;   // internal: the kinds mode's space, config, event groups and counters

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
    RequestId holder = RequestId::Invalid();  // kinds mode
    std::int64_t hash = 0;                    // kinds mode: the unit's block hash (its key)
    std::int64_t parent_hash = 0;             // kinds mode: the parent unit's (root's children: 0)
    std::unordered_map<std::uint64_t, std::uint32_t> children;  // first token (kinds: unit hash) -> node
  };
  using LruKey = std::pair<std::uint64_t, std::uint32_t>;  // (last use, id)

  explicit SparsePrefixCache(std::unique_ptr<Domain> domain);
  std::uint64_t KeyOf(const Node& n) const { return kinds_ ? static_cast<std::uint64_t>(n.hash) : n.tokens[0]; }

  // Walks tokens: the deepest node reached, the tokens matched, and how many tokens of
  // that node's span matched (== its span when it ended on a node boundary).
  struct Walk {
    std::uint32_t node = 0;
    std::uint32_t length = 0;
    std::uint32_t in_node = 0;
  };
  Walk WalkTokens(std::span<const std::uint32_t> tokens) const;
  // Kinds mode (sparse_prefix_kinds.cc).
  Walk WalkUnits(std::span<const std::uint32_t> tokens, std::span<const std::int64_t> hashes) const;
  void EvictKindNode(std::uint32_t id, SparseEvictionStats& stats);
  void RecordNode(std::uint32_t id, bool stored);
  Status CheckKindNode(std::uint32_t id) const;
  std::uint32_t NewNode();
  std::uint32_t Split(std::uint32_t id, std::uint32_t at);
  bool IsLeaf(std::uint32_t id) const { return id != 0 && nodes_[id].children.empty(); }
  void SyncLru(std::uint32_t id);  // puts a node in / out of the LRU set as it now belongs
  void Unlist(std::uint32_t id);
  bool EvictOne(SparseEvictionStats& stats);
  Result<std::uint32_t> CheckedNode(const SparsePrefixMatch& match) const;

  std::unique_ptr<Domain> domain_;
  std::unique_ptr<Kinds> kinds_;  // null: addresses mode
  std::vector<Node> nodes_;  // [0] is the root
  std::vector<std::uint32_t> free_nodes_;
  std::set<LruKey> lru_;     // unlocked leaves
  std::uint64_t clock_ = 0;
  std::uint64_t cached_tokens_ = 0;
};

}  // namespace ula
