// SparsePrefixCache's kinds mode (ula/sparse_prefix_cache.h, "Kinds mode"): nodes of one share
// unit, each a holder request made by AddressSpace::SharePrefix; eviction frees the holder and
// counts what it freed per kind; events name each kind's group.
#include <fmt/format.h>

#include <algorithm>
#include <limits>

#include "prefix/sparse_prefix_kinds.h"
#include "space/address_space_state.h"
#include "space/space_access.h"
#include "ula/check.h"

namespace ula {

Status SparsePrefixCacheConfig::Validate() const {
  if (!first_holder.valid() || max_holders == 0) {
    return MakeError(ErrorCode::kInvalidArgument, "SparsePrefixCacheConfig: first_holder must be valid, max_holders > 0");
  }
  if (first_holder.value() > RequestId::kInvalidValue - 1 - max_holders) {
    return MakeError(ErrorCode::kInvalidArgument,
                     fmt::format("SparsePrefixCacheConfig: holder ids [{}, {} + {}) overflow the request ids",
                                 first_holder.value(), first_holder.value(), max_holders));
  }
  return Ok();
}

Result<std::unique_ptr<SparsePrefixCache::Kinds>> MakeKinds(AddressSpace& space, Rank rank,
                                                             const SparsePrefixCacheConfig& config);

SparsePrefixCache::Walk SparsePrefixCache::WalkUnits(std::span<const std::uint32_t> tokens,
                                                     std::span<const std::int64_t> hashes) const {
  const std::uint32_t A = kinds_->unit;
  Walk w;
  for (std::size_t u = 0; u < hashes.size(); ++u) {
    const Node& cur = nodes_[w.node];
    auto it = cur.children.find(static_cast<std::uint64_t>(hashes[u]));
    if (it == cur.children.end()) break;
    const Node& child = nodes_[it->second];
    if (!std::equal(child.tokens.begin(), child.tokens.end(), tokens.begin() + u * A)) break;  // a hash collision
    w.node = it->second;
    w.length += A;
    w.in_node = A;
  }
  return w;
}

void SparsePrefixCache::RecordNode(std::uint32_t id, bool stored) {
  if (!kinds_->config.record_events) return;
  const Node& n = nodes_[id];
  const AddressSpace& space = kinds_->space;
  const auto& kinds = space.config().kinds;
  for (std::uint32_t k = 0; k < kinds.size(); ++k) {
    if (kinds_->group[k] < 0) continue;
    const bool ring = kinds[k].lifetime == KindLifetime::kRing;
    CacheEvent e;
    e.type = ring ? (stored ? CacheEvent::Type::kWindowStored : CacheEvent::Type::kWindowRemoved)
                  : (stored ? CacheEvent::Type::kPageStored : CacheEvent::Type::kPageRemoved);
    if (k == kinds_->sparse) {
      // The unit's page of addresses (its C4 entries, and their index keys).
      const std::span<const LogicalAddr> addrs = *space.AddressesOf(n.holder);
      e.block = BlockId(addrs.back().value() / space.config().page_tokens);
    } else {
      const KindPages p = *space.KindPagesOf(n.holder, k);  // the C128 block or window block of the unit's end
      if (!p.blocks.empty()) e.block = BlockId(p.blocks.back());
    }
    e.position = n.start;
    e.hash = n.hash;
    if (stored) {
      if (n.start > 0) e.parent_hash = n.parent_hash;
      e.tokens = n.tokens;
    }
    e.group = kinds_->group[k];
    e.spec_kind = ring ? "sliding_window_mla" : "mla_attention";
    e.spec_window = ring ? kinds[k].ring_tokens - kinds[k].ring_draft_tokens : 0;
    kinds_->events.push_back(std::move(e));
  }
}

Result<KindInsert> SparsePrefixCache::Insert(std::span<const std::uint32_t> tokens, RequestId source) {
  if (!kinds_) {
    return MakeError(ErrorCode::kFailedPrecondition,
                     "Insert(tokens, source): the cache's space has no kinds (Insert(tokens, addrs) caches addresses)");
  }
  AddressSpace& space = kinds_->space;
  const std::uint32_t A = kinds_->unit;
  auto rank = space.RankOf(source);
  if (!rank) return MakeError(ErrorCode::kNotFound, fmt::format("Insert: source request {} is unknown", source.value()));
  if (*rank != kinds_->rank) {
    return MakeError(ErrorCode::kInvalidArgument, fmt::format("Insert: source {} is on rank {}, the cache's is {}",
                                                              source.value(), rank->value(), kinds_->rank.value()));
  }
  const KindPages window = *space.KindPagesOf(source, kinds_->ring);
  if (tokens.size() > window.tokens) {
    return MakeError(ErrorCode::kOutOfRange, fmt::format("Insert: {} tokens but source {} holds {}", tokens.size(),
                                                         source.value(), window.tokens));
  }
  const std::uint32_t units = static_cast<std::uint32_t>(tokens.size()) / A;
  const std::vector<std::int64_t> hashes =
      BlockHashes(tokens.first(std::size_t{units} * A), A, kinds_->config.event_hash);
  const Walk w = WalkUnits(tokens, hashes);
  KindInsert out;
  out.matched = w.length;
  const std::uint32_t have = w.length / A;
  if (have == units) return out;
  // Everything SharePrefix would refuse, checked before any holder is made.
  ULA_RETURN_IF_ERROR(StateOf(space).dir.RefuseWhilePlanPending("SparsePrefixCache::Insert"));
  const KvKind& ring = space.config().kinds[kinds_->ring];
  const std::uint32_t first_end = (have + 1) * A;
  const std::uint32_t need = first_end > ring.ring_tokens ? first_end - ring.ring_tokens : 0;
  const std::uint32_t first = window.tokens - window.entries;
  if (first > need) {
    return MakeError(ErrorCode::kFailedPrecondition,
                     fmt::format("Insert: source {}'s window ring holds tokens [{}, {}): caching the unit ending at {} "
                                 "needs [{}, {}) (insert in the source's prefill round)",
                                 source.value(), first, window.tokens, first_end, need, first_end));
  }
  std::uint64_t live = 0;
  for (std::size_t id = 1; id < nodes_.size(); ++id) live += nodes_[id].live;
  if (live + (units - have) >= kinds_->config.max_holders) {
    return MakeError(ErrorCode::kResourceExhausted,
                     fmt::format("Insert: {} nodes and {} new exceed the cache's {} holder ids", live, units - have,
                                 kinds_->config.max_holders));
  }
  {  // the holder ids the new nodes take (NewNode: the free list's last first, then fresh ids)
    std::size_t fresh = nodes_.size();
    for (std::uint32_t i = 0; i < units - have; ++i) {
      const std::uint32_t id = i < free_nodes_.size() ? free_nodes_[free_nodes_.size() - 1 - i]
                                                      : static_cast<std::uint32_t>(fresh++);
      if (space.RankOf(kinds_->HolderOf(id))) {
        return MakeError(ErrorCode::kAlreadyExists,
                         fmt::format("Insert: request {} is the cache's holder id (its range starts at {})",
                                     kinds_->HolderOf(id).value(), kinds_->config.first_holder.value()));
      }
    }
  }
  std::uint32_t parent = w.node;
  const std::uint64_t use = ++clock_;
  for (std::uint32_t u = have; u < units; ++u) {
    const std::uint32_t id = NewNode();
    const RequestId holder = kinds_->HolderOf(id);
    ULA_CHECK(space.AddRequest(holder, kinds_->rank).has_value());
    auto share = space.SharePrefix(holder, source, (u + 1) * A);
    ULA_CHECK(share.has_value() && share->resume_from == (u + 1) * A);
    out.copies.insert(out.copies.end(), share->copies.begin(), share->copies.end());
    Node& n = nodes_[id];
    n.parent = parent;
    n.start = u * A;
    n.tokens.assign(tokens.begin() + std::size_t{u} * A, tokens.begin() + std::size_t{u + 1} * A);
    n.holder = holder;
    n.hash = hashes[u];
    n.parent_hash = u > 0 ? hashes[u - 1] : 0;
    n.last_use = use;
    nodes_[parent].children[KeyOf(n)] = id;
    SyncLru(parent);  // no longer a leaf
    SyncLru(id);
    cached_tokens_ += A;
    out.inserted += A;
    RecordNode(id, /*stored=*/true);
    parent = id;
  }
  ULA_EXPENSIVE_CHECK(*this);
  return out;
}

void SparsePrefixCache::EvictKindNode(std::uint32_t id, SparseEvictionStats& stats) {
  AddressSpace& space = kinds_->space;
  const KindEntries& entries = StateOf(space).kinds;
  const Node& n = nodes_[id];
  const std::uint32_t K = kinds_->num_kinds();
  if (stats.freed_per_kind.size() != K) stats.freed_per_kind.assign(K, 0);
  // What the holder alone holds is what its Free frees: C4 entries of its last reference (their
  // index keys with them), blocks of its last holder.
  std::uint64_t c4 = 0;
  const std::span<const LogicalAddr> addrs = *space.AddressesOf(n.holder);
  for (LogicalAddr a : addrs) c4 += space.RefCount(a) == 1;
  for (std::uint32_t k = 0; k < K; ++k) {
    std::uint64_t freed = 0;
    if (entries.addressed(k)) {
      freed = c4;
    } else if (space.config().kinds[k].lifetime != KindLifetime::kPerRequest) {
      const KindPages pages = *space.KindPagesOf(n.holder, k);
      for (std::uint32_t b : pages.blocks) freed += entries.HoldersOf(k, b) == 1;
    }
    stats.freed_per_kind[k] += freed;
    kinds_->evicted[k] += freed;
  }
  stats.freed += c4;
  RecordNode(id, /*stored=*/false);
  ULA_CHECK(space.Free(n.holder).has_value());
}

bool SparsePrefixCache::Fits(std::span<const std::uint64_t> demand) const {
  if (!kinds_ || demand.size() != kinds_->num_kinds()) return false;
  const KindEntries& entries = StateOf(kinds_->space).kinds;
  const auto& kinds = kinds_->space.config().kinds;
  const auto& cap = kinds_->config.kind_block_capacity;
  for (std::uint32_t k = 0; k < demand.size(); ++k) {
    if (k == kinds_->sparse) {
      if (Room() < demand[k]) return false;
    } else if (!entries.addressed(k) && kinds[k].lifetime != KindLifetime::kPerRequest && !cap.empty() &&
               cap[k] > 0) {
      const std::uint64_t used = entries.BlocksInUse(k);
      if ((cap[k] > used ? cap[k] - used : 0) < demand[k]) return false;
    }
  }
  return true;
}

Result<SparseEvictionStats> SparsePrefixCache::MakeRoom(std::span<const std::uint64_t> demand) {
  if (!kinds_) return MakeError(ErrorCode::kFailedPrecondition, "MakeRoom(demand): the cache's space has no kinds");
  if (demand.size() != kinds_->num_kinds()) {
    return MakeError(ErrorCode::kInvalidArgument,
                     fmt::format("MakeRoom: a demand of {} kinds, the space has {}", demand.size(), kinds_->num_kinds()));
  }
  SparseEvictionStats stats;
  stats.freed_per_kind.assign(kinds_->num_kinds(), 0);
  while (!Fits(demand)) {
    if (!EvictOne(stats)) {
      ULA_EXPENSIVE_CHECK(*this);
      return MakeError(ErrorCode::kResourceExhausted,
                       fmt::format("MakeRoom: the demand does not fit after evicting {} nodes ({} tokens); the rest "
                                   "of the cache is locked or held by requests",
                                   stats.nodes, stats.tokens));
    }
  }
  ULA_EXPENSIVE_CHECK(*this);
  return stats;
}

std::vector<CacheEvent> SparsePrefixCache::TakeEvents() {
  std::vector<CacheEvent> out;
  if (kinds_) out.swap(kinds_->events);
  return out;
}

Status SparsePrefixCache::CheckKindNode(std::uint32_t id) const {
  const Node& n = nodes_[id];
  const AddressSpace& space = kinds_->space;
  const std::uint32_t A = kinds_->unit;
  if (n.tokens.size() != A || n.start % A != 0 || !n.addrs.empty()) {
    return MakeError(ErrorCode::kInternal, fmt::format("node {}: {} tokens from {}, {} addresses (a unit of {})", id,
                                                       n.tokens.size(), n.start, n.addrs.size(), A));
  }
  if (n.holder != kinds_->HolderOf(id)) {
    return MakeError(ErrorCode::kInternal, fmt::format("node {}: holder {} is not its id", id, n.holder.value()));
  }
  auto rank = space.RankOf(n.holder);
  if (!rank || *rank != kinds_->rank) {
    return MakeError(ErrorCode::kInternal, fmt::format("node {}: holder {} is not live on the cache's rank", id,
                                                       n.holder.value()));
  }
  const std::uint32_t end = n.start + A;
  const KindEntries& entries = StateOf(space).kinds;
  if (*entries.TokensOf(n.holder) != end || *entries.SharedTokensOf(n.holder) != end) {
    return MakeError(ErrorCode::kInternal, fmt::format("node {}: holder {} holds {} tokens ({} shared), not {}", id,
                                                       n.holder.value(), *entries.TokensOf(n.holder),
                                                       *entries.SharedTokensOf(n.holder), end));
  }
  if (n.parent != 0 && nodes_[n.parent].hash != n.parent_hash) {
    return MakeError(ErrorCode::kInternal, fmt::format("node {}: its parent hash is not its parent's", id));
  }
  return Ok();
}

Result<std::unique_ptr<SparsePrefixCache::Kinds>> MakeKinds(AddressSpace& space, Rank rank,
                                                             const SparsePrefixCacheConfig& config) {
  ULA_RETURN_IF_ERROR(config.Validate());
  const auto& kinds = space.config().kinds;
  if (space.config().kind_frame_bytes != 0) {
    return MakeError(ErrorCode::kUnsupported,
                     "SparsePrefixCache: a space over kind frames cannot share a prefix (SharePrefix refuses it), so "
                     "no cache holds one");
  }
  if (!config.kind_block_capacity.empty() && config.kind_block_capacity.size() != kinds.size()) {
    return MakeError(ErrorCode::kInvalidArgument,
                     fmt::format("SparsePrefixCacheConfig: kind_block_capacity has {} kinds, the space {}",
                                 config.kind_block_capacity.size(), kinds.size()));
  }
  auto k = std::make_unique<SparsePrefixCache::Kinds>(space, rank, config);
  const KindEntries& entries = StateOf(space).kinds;
  k->unit = KindEntries::ShareUnit(kinds, space.config().page_tokens);
  k->sparse = entries.sparse_kind();
  k->group.assign(kinds.size(), -1);
  k->evicted.assign(kinds.size(), 0);
  std::int32_t next = 0;
  bool ring = false;
  for (std::uint32_t i = 0; i < kinds.size(); ++i) {
    const bool companion = kinds[i].companion_of != kNoCompanion;
    if (kinds[i].lifetime == KindLifetime::kRing && !ring) k->ring = i, ring = true;
    if (companion || kinds[i].lifetime == KindLifetime::kPerRequest) continue;  // a C4 page's, a request's
    k->group[i] = next++;
  }
  if (!ring) {
    return MakeError(ErrorCode::kUnsupported, "SparsePrefixCache: the space's kinds have no window ring");
  }
  return k;
}

}  // namespace ula
