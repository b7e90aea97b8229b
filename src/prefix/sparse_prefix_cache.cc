#include "ula/sparse_prefix_cache.h"

#include <fmt/format.h>

#include <algorithm>
#include <limits>

#include "prefix/sparse_prefix_kinds.h"
#include "prefix/tree_util.h"
#include "ula/check.h"
#include "core/digest.h"

namespace ula {

// The space behind the cache: references, liveness and the room an allocation can take.
struct SparsePrefixCache::Domain {
  virtual ~Domain() = default;
  virtual Status Retain(std::span<const LogicalAddr> addrs) = 0;
  virtual Status Release(std::span<const LogicalAddr> addrs) = 0;
  virtual std::uint32_t RefCount(LogicalAddr a) const = 0;
  // Ok when the address is live and belongs to the domain.
  virtual Status Check(LogicalAddr a) const = 0;
  virtual std::uint64_t Room() const = 0;
};

namespace {

struct DpDomain final : SparsePrefixCache::Domain {
  DpDomain(AddressSpace& s, Rank r) : space(s), rank(r) {}
  Status Retain(std::span<const LogicalAddr> addrs) override { return space.Retain(addrs); }
  Status Release(std::span<const LogicalAddr> addrs) override { return space.Release(addrs); }
  std::uint32_t RefCount(LogicalAddr a) const override { return space.RefCount(a); }
  Status Check(LogicalAddr a) const override {
    auto loc = space.Lookup(a, GroupId(0));
    if (!loc) return std::unexpected(loc.error());
    if (loc->rank() != rank) {
      return MakeError(ErrorCode::kInvalidArgument, fmt::format("address {} lives on rank {}, not the cache's rank {}",
                                                                a.value(), loc->rank().value(), rank.value()));
    }
    return Ok();
  }
  std::uint64_t Room() const override {
    std::uint64_t room = std::numeric_limits<std::uint64_t>::max();
    for (std::uint32_t g = 0; g < space.config().num_groups; ++g) {
      const GroupId group(static_cast<std::uint16_t>(g));
      room = std::min<std::uint64_t>(room, std::uint64_t{space.NumFree(rank, group, Tier::kDevice)} +
                                               space.NumFree(rank, group, Tier::kHost));
    }
    return room;
  }
  AddressSpace& space;
  Rank rank;
};

struct TpDomain final : SparsePrefixCache::Domain {
  explicit TpDomain(TpAddressSpace& s) : space(s) {}
  Status Retain(std::span<const LogicalAddr> addrs) override { return space.Retain(addrs); }
  Status Release(std::span<const LogicalAddr> addrs) override { return space.Release(addrs); }
  std::uint32_t RefCount(LogicalAddr a) const override { return space.RefCount(a); }
  Status Check(LogicalAddr a) const override {
    if (!space.IsLive(a)) return MakeError(ErrorCode::kNotFound, fmt::format("logical address {} is not live", a.value()));
    return Ok();
  }
  std::uint64_t Room() const override {
    const std::uint64_t cap = space.config().shard_slots_per_group();
    std::uint64_t room = 0;
    for (std::uint32_t r = 0; r < space.config().num_ranks; ++r) room += cap - space.NumHomed(Rank(static_cast<std::uint16_t>(r)));
    return room;
  }
  TpAddressSpace& space;
};

}  // namespace

SparsePrefixCache::SparsePrefixCache(std::unique_ptr<Domain> domain) : domain_(std::move(domain)) {
  nodes_.emplace_back();
  nodes_[0].live = true;
}

SparsePrefixCache::~SparsePrefixCache() = default;

Result<std::unique_ptr<SparsePrefixCache::Kinds>> MakeKinds(AddressSpace& space, Rank rank,
                                                             const SparsePrefixCacheConfig& config);

Result<std::unique_ptr<SparsePrefixCache>> SparsePrefixCache::Create(AddressSpace& space, Rank rank,
                                                                     const SparsePrefixCacheConfig& config) {
  if (rank.value() >= space.config().num_ranks) {
    return MakeError(ErrorCode::kOutOfRange,
                     fmt::format("rank {} is out of range ({} ranks)", rank.value(), space.config().num_ranks));
  }
  std::unique_ptr<Kinds> kinds;
  if (!space.config().kinds.empty()) {
    auto k = MakeKinds(space, rank, config);
    if (!k) return std::unexpected(k.error());
    kinds = std::move(*k);
  }
  auto cache = std::unique_ptr<SparsePrefixCache>(new SparsePrefixCache(std::make_unique<DpDomain>(space, rank)));
  cache->kinds_ = std::move(kinds);
  return cache;
}

Result<std::unique_ptr<SparsePrefixCache>> SparsePrefixCache::Create(TpAddressSpace& space) {
  if (!space.config().kinds.empty()) {  // DP only
    return MakeError(ErrorCode::kUnsupported,
                     "SparsePrefixCache over a TP space with kinds: the kinds mode holds a prefix by a holder request "
                     "made by SharePrefix, which has no TP form (DP only; docs/ARCHITECTURE.md \"Shared prefixes "
                     "across kinds\")");
  }
  return std::unique_ptr<SparsePrefixCache>(new SparsePrefixCache(std::make_unique<TpDomain>(space)));
}

SparsePrefixCache::Walk SparsePrefixCache::WalkTokens(std::span<const std::uint32_t> tokens) const {
  Walk w;
  std::size_t pos = 0;
  while (pos < tokens.size()) {
    const Node& cur = nodes_[w.node];
    auto it = cur.children.find(tokens[pos]);
    if (it == cur.children.end()) break;
    const Node& child = nodes_[it->second];
    const std::size_t n = std::min(child.tokens.size(), tokens.size() - pos);
    std::size_t k = 0;
    while (k < n && child.tokens[k] == tokens[pos + k]) ++k;
    w.node = it->second;
    w.in_node = static_cast<std::uint32_t>(k);
    pos += k;
    if (k < child.tokens.size()) break;  // ends inside this edge
  }
  w.length = static_cast<std::uint32_t>(pos);
  if (w.node != 0 && w.in_node == 0) w.in_node = static_cast<std::uint32_t>(nodes_[w.node].tokens.size());
  return w;
}

std::uint32_t SparsePrefixCache::PeekLength(std::span<const std::uint32_t> tokens) const {
  if (kinds_) {
    const std::size_t units = tokens.size() / kinds_->unit;
    return WalkUnits(tokens, BlockHashes(tokens.first(units * kinds_->unit), kinds_->unit, kinds_->config.event_hash))
        .length;
  }
  return WalkTokens(tokens).length;
}

std::uint32_t SparsePrefixCache::NewNode() {
  std::uint32_t id;
  if (!free_nodes_.empty()) {
    id = free_nodes_.back();
    free_nodes_.pop_back();
  } else {
    id = static_cast<std::uint32_t>(nodes_.size());
    nodes_.emplace_back();
  }
  Node& n = nodes_[id];
  const std::uint32_t gen = n.generation + 1;
  n = Node{};
  n.generation = gen;
  n.live = true;
  return id;
}

void SparsePrefixCache::Unlist(std::uint32_t id) { lru_.erase({nodes_[id].last_use, id}); }

void SparsePrefixCache::SyncLru(std::uint32_t id) {
  if (id == 0) return;
  const Node& n = nodes_[id];
  if (n.live && n.locks == 0 && n.children.empty()) {
    lru_.insert({n.last_use, id});
  } else {
    lru_.erase({n.last_use, id});
  }
}

// Splits node `id` after `at` tokens (0 < at < span): a new upper node takes [start,
// start + at) and the node keeps the rest (and its id, children and lock count).
std::uint32_t SparsePrefixCache::Split(std::uint32_t id, std::uint32_t at) {
  const std::uint32_t up = NewNode();
  Node& upper = nodes_[up];
  Node& lower = nodes_[id];
  ULA_CHECK(at > 0 && at < lower.tokens.size());
  upper.parent = lower.parent;
  upper.start = lower.start;
  upper.tokens.assign(lower.tokens.begin(), lower.tokens.begin() + at);
  upper.addrs.assign(lower.addrs.begin(), lower.addrs.begin() + at);
  upper.locks = lower.locks;
  upper.last_use = lower.last_use;
  nodes_[upper.parent].children[KeyOf(upper)] = up;
  lower.tokens.erase(lower.tokens.begin(), lower.tokens.begin() + at);
  lower.addrs.erase(lower.addrs.begin(), lower.addrs.begin() + at);
  lower.start += at;
  lower.parent = up;
  upper.children[KeyOf(lower)] = id;
  return up;  // the lower node's LRU key (last_use, id) is unchanged; the upper has a child
}

SparsePrefixMatch SparsePrefixCache::Match(std::span<const std::uint32_t> tokens) {
  Walk w;
  if (kinds_) {  // whole units; a node is one unit, so the match ends on a node
    const std::size_t units = tokens.size() / kinds_->unit;
    w = WalkUnits(tokens, BlockHashes(tokens.first(units * kinds_->unit), kinds_->unit, kinds_->config.event_hash));
  } else {
    w = WalkTokens(tokens);
  }
  SparsePrefixMatch m;
  if (w.length == 0) return m;
  std::uint32_t node = w.node;
  if (w.in_node < nodes_[node].tokens.size()) node = Split(node, w.in_node);  // ends inside the edge
  ++clock_;
  const auto path = internal::PathTo(node, nodes_);
  m.addrs.reserve(w.length);
  for (std::uint32_t id : path) {
    Unlist(id);
    nodes_[id].last_use = clock_;
    SyncLru(id);
    m.addrs.insert(m.addrs.end(), nodes_[id].addrs.begin(), nodes_[id].addrs.end());
  }
  m.length = w.length;
  m.node = node;
  m.generation = nodes_[node].generation;
  m.holder = nodes_[node].holder;
  ULA_EXPENSIVE_CHECK(*this);
  return m;
}

Result<std::uint32_t> SparsePrefixCache::CheckedNode(const SparsePrefixMatch& match) const {
  if (match.node == 0) return 0u;
  if (match.node >= nodes_.size() || !nodes_[match.node].live || nodes_[match.node].generation != match.generation) {
    return MakeError(ErrorCode::kNotFound,
                     fmt::format("the match's node {} was evicted (a stale match): match again", match.node));
  }
  const Node& n = nodes_[match.node];
  if (n.start + n.tokens.size() != match.length) {
    return MakeError(ErrorCode::kInvalidArgument,
                     fmt::format("the match's length {} does not end at its node ({})", match.length,
                                 n.start + n.tokens.size()));
  }
  return match.node;
}

Status SparsePrefixCache::Lock(const SparsePrefixMatch& match) {
  auto node = CheckedNode(match);
  if (!node) return std::unexpected(node.error());
  for (std::uint32_t id = *node; id != 0; id = nodes_[id].parent) {
    ++nodes_[id].locks;
    SyncLru(id);
  }
  ULA_EXPENSIVE_CHECK(*this);
  return Ok();
}

Status SparsePrefixCache::Unlock(const SparsePrefixMatch& match) {
  auto node = CheckedNode(match);
  if (!node) return std::unexpected(node.error());
  if (*node != 0 && nodes_[*node].locks == 0) {
    return MakeError(ErrorCode::kFailedPrecondition, fmt::format("node {} is not locked: Unlock without Lock", *node));
  }
  for (std::uint32_t id = *node; id != 0; id = nodes_[id].parent) {
    --nodes_[id].locks;
    SyncLru(id);
  }
  ULA_EXPENSIVE_CHECK(*this);
  return Ok();
}

Result<std::uint32_t> SparsePrefixCache::Insert(std::span<const std::uint32_t> tokens,
                                                std::span<const LogicalAddr> addrs) {
  if (kinds_) {
    return MakeError(ErrorCode::kFailedPrecondition,
                     "Insert(tokens, addrs): the cache's space has kinds: Insert(tokens, source) caches a prefix by "
                     "a holder (SharePrefix)");
  }
  if (tokens.size() != addrs.size()) {
    return MakeError(ErrorCode::kInvalidArgument,
                     fmt::format("Insert: {} tokens but {} addresses", tokens.size(), addrs.size()));
  }
  if (tokens.size() > std::numeric_limits<std::uint32_t>::max()) {
    return MakeError(ErrorCode::kInvalidArgument, "Insert: more than 2^32 - 1 tokens");
  }
  const Walk w = WalkTokens(tokens);
  const auto rest = addrs.subspan(w.length);
  for (LogicalAddr a : rest) ULA_RETURN_IF_ERROR(domain_->Check(a));
  if (rest.empty()) return w.length;
  ULA_RETURN_IF_ERROR(domain_->Retain(rest));  // also refuses an address listed twice; nothing changed then
  std::uint32_t parent = w.node;
  if (parent != 0 && w.in_node < nodes_[parent].tokens.size()) parent = Split(parent, w.in_node);
  const std::uint32_t id = NewNode();
  Node& leaf = nodes_[id];
  leaf.parent = parent;
  leaf.start = w.length;
  leaf.tokens.assign(tokens.begin() + w.length, tokens.end());
  leaf.addrs.assign(rest.begin(), rest.end());
  leaf.last_use = ++clock_;
  nodes_[parent].children[KeyOf(leaf)] = id;
  SyncLru(parent);  // no longer a leaf
  SyncLru(id);
  cached_tokens_ += rest.size();
  ULA_EXPENSIVE_CHECK(*this);
  return w.length;
}

bool SparsePrefixCache::EvictOne(SparseEvictionStats& stats) {
  if (lru_.empty()) return false;
  const std::uint32_t id = lru_.begin()->second;
  lru_.erase(lru_.begin());
  if (kinds_) {
    EvictKindNode(id, stats);  // frees its holder, counting each kind
  } else {
    for (LogicalAddr a : nodes_[id].addrs) stats.freed += domain_->RefCount(a) == 1;
    ULA_CHECK(domain_->Release(nodes_[id].addrs).has_value());
  }
  Node& n = nodes_[id];
  stats.tokens += n.tokens.size();
  ++stats.nodes;
  cached_tokens_ -= n.tokens.size();
  const std::uint32_t parent = n.parent;
  nodes_[parent].children.erase(KeyOf(n));
  n.live = false;
  n.tokens.clear();
  n.addrs.clear();
  n.children.clear();
  n.holder = RequestId::Invalid();
  free_nodes_.push_back(id);
  SyncLru(parent);
  return true;
}

Result<SparseEvictionStats> SparsePrefixCache::MakeRoom(std::uint64_t n_entries) {
  if (kinds_) {
    return MakeError(ErrorCode::kFailedPrecondition,
                     "MakeRoom(n): the cache's space has kinds: MakeRoom(demand) counts every kind");
  }
  SparseEvictionStats stats;
  while (domain_->Room() < n_entries) {
    if (!EvictOne(stats)) {
      ULA_EXPENSIVE_CHECK(*this);
      return MakeError(ErrorCode::kResourceExhausted,
                       fmt::format("MakeRoom: {} entries do not fit: {} free after evicting {} nodes ({} tokens, {} "
                                   "freed); the rest of the cache is locked or held by requests",
                                   n_entries, domain_->Room(), stats.nodes, stats.tokens, stats.freed));
    }
  }
  ULA_EXPENSIVE_CHECK(*this);
  return stats;
}

SparseEvictionStats SparsePrefixCache::Evict(std::uint64_t n_tokens) {
  SparseEvictionStats stats;
  while (stats.tokens < n_tokens && EvictOne(stats)) {
  }
  ULA_EXPENSIVE_CHECK(*this);
  return stats;
}

std::uint64_t SparsePrefixCache::Room() const { return domain_->Room(); }

SparsePrefixCacheMetrics SparsePrefixCache::Metrics() const {
  SparsePrefixCacheMetrics m;
  for (std::size_t id = 1; id < nodes_.size(); ++id) {
    const Node& n = nodes_[id];
    if (!n.live) continue;
    ++m.nodes;
    m.cached_tokens += n.tokens.size();
    if (n.locks > 0) m.locked_tokens += n.tokens.size();
  }
  m.evictable_leaves = lru_.size();
  if (kinds_) m.evicted_per_kind = kinds_->evicted;
  return m;
}

Status SparsePrefixCache::CheckInvariants() const {
  auto fail = [](std::string msg) { return MakeError(ErrorCode::kInternal, "SparsePrefixCache: " + std::move(msg)); };
  std::uint64_t tokens = 0;
  std::size_t leaves = 0;
  for (std::uint32_t id = 1; id < nodes_.size(); ++id) {
    const Node& n = nodes_[id];
    if (!n.live) {
      if (lru_.contains({n.last_use, id})) return fail(fmt::format("dead node {} is in the LRU set", id));
      continue;
    }
    if (kinds_) {
      if (auto s = CheckKindNode(id); !s) return fail(s.error().message());
    } else if (n.tokens.empty() || n.tokens.size() != n.addrs.size()) {
      return fail(fmt::format("node {}: {} tokens, {} addresses", id, n.tokens.size(), n.addrs.size()));
    }
    if (n.parent >= nodes_.size() || !nodes_[n.parent].live) return fail(fmt::format("node {} has a dead parent", id));
    const Node& p = nodes_[n.parent];
    auto key = p.children.find(KeyOf(n));
    if (key == p.children.end() || key->second != id) return fail(fmt::format("node {} is not keyed by its parent", id));
    const std::uint32_t parent_end = n.parent == 0 ? 0 : p.start + static_cast<std::uint32_t>(p.tokens.size());
    if (n.start != parent_end) return fail(fmt::format("node {} starts at {}, its parent ends at {}", id, n.start, parent_end));
    if (n.parent != 0 && n.locks > p.locks) return fail(fmt::format("node {} has more locks than its parent", id));
    for (LogicalAddr a : n.addrs) {
      if (auto s = domain_->Check(a); !s) return fail(fmt::format("node {}: {}", id, s.error().message()));
      if (domain_->RefCount(a) == 0) return fail(fmt::format("node {}: address {} has no reference", id, a.value()));
    }
    for (const auto& [tok, child] : n.children) {
      if (child >= nodes_.size() || !nodes_[child].live || nodes_[child].parent != id || KeyOf(nodes_[child]) != tok) {
        return fail(fmt::format("node {}: child {} is keyed wrongly", id, child));
      }
    }
    const bool evictable = n.locks == 0 && n.children.empty();
    if (evictable != lru_.contains({n.last_use, id})) {
      return fail(fmt::format("node {}: evictable {} but {} the LRU set", id, evictable, evictable ? "not in" : "in"));
    }
    leaves += evictable;
    tokens += n.tokens.size();
  }
  if (leaves != lru_.size()) return fail(fmt::format("{} evictable leaves but {} in the LRU set", leaves, lru_.size()));
  if (tokens != cached_tokens_) return fail(fmt::format("{} cached tokens, counter says {}", tokens, cached_tokens_));
  for (const auto& [tok, child] : nodes_[0].children) {
    if (child >= nodes_.size() || !nodes_[child].live || nodes_[child].parent != 0) return fail("a root child is dead");
  }
  return Ok();
}

std::uint64_t SparsePrefixCache::DebugDigest() const {
  StateDigest d;
  for (std::uint32_t id = 0; id < nodes_.size(); ++id) {
    const Node& n = nodes_[id];
    d.Add(n.live);
    d.Add(n.generation);
    if (!n.live) continue;
    d.Add(n.parent);
    d.Add(n.start);
    d.AddAll(std::span<const std::uint32_t>(n.tokens));
    for (LogicalAddr a : n.addrs) d.Add(a.value());
    d.Add(n.locks);
    d.Add(n.last_use);
    d.Add(n.holder.value());
    d.Add(n.hash);
    d.Add(n.parent_hash);
    std::uint64_t children = 0;
    for (const auto& [t, c] : n.children) children += StateDigest::Mix(t, c);
    d.Add(children);
  }
  d.Add(lru_.size());
  for (const auto& [use, id] : lru_) d.Add(StateDigest::Mix(use, id));
  d.AddAll(std::span<const std::uint32_t>(free_nodes_));
  d.Add(clock_);
  d.Add(cached_tokens_);
  if (kinds_) {
    d.AddAll(std::span<const std::uint64_t>(kinds_->evicted));
    d.Add(kinds_->events.size());
  }
  return d.value();
}

}  // namespace ula
