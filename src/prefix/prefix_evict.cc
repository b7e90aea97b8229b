// PrefixCache: eviction (leaves, checkpoints as tombstones, the cascade of useless leaves,
// MakeRoom's rules and Evict by count; see include/ula/prefix_cache.h).
#include "ula/prefix_cache.h"

#include <fmt/format.h>

#include <cstdint>

#include "prefix/prefix_cache_update.h"
#include "prefix/tree_util.h"
#include "ula/check.h"

namespace ula {

using internal::CeilDiv;
using internal::PathTo;

bool PrefixCache::Useless(std::uint32_t id) const {
  const Node& n = nodes_[id];
  if (id == 0 || n.kv_on_host || !n.children.empty() || n.kv_locks > 0) return false;
  if (!n.checkpoint.valid() && n.host == kNoSlot && !stateless()) return true;
  // A window tombstone at a leaf can never be matched again (SGLang deletes such leaves).
  return config_.sliding_window > 0 && !HasWindow(PathTo(id, nodes_), n.end);
}

void PrefixCache::RemoveLeaf(std::uint32_t id, EvictionStats& stats) {
  const std::uint32_t P = config_.page_tokens;
  while (id != 0) {
    Node& n = nodes_[id];
    ULA_CHECK(n.children.empty() && n.kv_locks == 0);
    const std::uint32_t parent = n.parent;
    FreeWindowPages(id, stats);
    Update(id, [&] {
      if (n.head.valid()) {
        FreePage(n.head, n.start / P, n.head_hash);
        ++stats.pages;
      }
      for (std::size_t i = 0; i < n.pages.size(); ++i) {
        FreePage(n.pages[i], CeilDiv(n.start, P) + static_cast<std::uint32_t>(i), n.hashes.empty() ? 0 : n.hashes[i]);
      }
      stats.pages += static_cast<std::uint32_t>(n.pages.size());
      if (n.checkpoint.valid()) ++stats.checkpoints;
      FreeCheckpoint(n.checkpoint, n.end);
      if (n.host != kNoSlot) {
        RecordState(CacheEvent::Type::kStateRemoved, BlockId::Invalid(), n.end, EventMedium::kHost);
        free_host_.push_back(n.host);
      }
      stats.tokens += n.tokens.size();
      ++stats.nodes;
      Update(parent, [&] { nodes_[parent].children.erase(n.tokens.front()); });
      n = Node{};
    });
    free_nodes_.push_back(id);
    id = Useless(parent) ? parent : 0;
  }
}

void PrefixCache::DropCheckpoint(std::uint32_t id, EvictionStats& stats) {
  Node& n = nodes_[id];
  ULA_CHECK(n.checkpoint.valid() && n.state_locks == 0);
  if (Offload(id, stats)) {  // the state goes to the host tier; the node keeps its KV
    ++stats.checkpoints;
    ++stats.offloaded;
    return;
  }
  if (n.children.empty() && n.kv_locks == 0) {
    RemoveLeaf(id, stats);
    return;
  }
  Update(id, [&] {
    FreeCheckpoint(n.checkpoint, n.end);
    n.checkpoint = Checkpoint{};
  });
  ++stats.checkpoints;
  ++stats.tombstones;
}

bool PrefixCache::EvictLeaf(EvictionStats& stats) {
  if (kv_lru_.empty()) return false;
  if (observer_) observer_();
  const std::uint32_t id = std::get<2>(*kv_lru_.begin());
  if (offload_kv_ && OffloadKv(id, stats)) return true;  // its KV goes to the host
  while (!nodes_[id].children.empty()) RemoveHostSubtree(nodes_[id].children.begin()->second);
  if (!nodes_[id].children.empty() || nodes_[id].kv_locks > 0) return true;
  RemoveLeaf(id, stats);
  return true;
}

bool PrefixCache::EvictState(EvictionStats& stats) {
  if (state_lru_.empty()) return false;
  if (observer_) observer_();
  DropCheckpoint(std::get<2>(*state_lru_.begin()), stats);
  return true;
}

std::uint32_t PrefixCache::FreeKvPages() const {
  // The largest n with CanAllocate(n pages): what the KV kind alone sees as free.
  std::uint32_t lo = 0, hi = 1;
  auto fits = [&](std::uint32_t n) {
    return allocator_->CanAllocate(Demand::Of(allocator_->num_kinds()).Add(config_.kv_kind, n));
  };
  while (fits(hi) && hi < (1u << 30)) {
    lo = hi;
    hi *= 2;
  }
  while (hi - lo > 1) {
    const std::uint32_t mid = lo + (hi - lo) / 2;
    (fits(mid) ? lo : hi) = mid;
  }
  return lo;
}

Result<EvictionStats> PrefixCache::MakeRoom(const Demand& demand, EvictionRule rule) {
  if (demand.blocks.size() != allocator_->num_kinds()) {
    return MakeError(ErrorCode::kInvalidArgument, "prefix cache: demand does not match the allocator's kinds");
  }
  EvictionStats stats;
  if (allocator_->CanAllocate(demand)) return stats;
  struct Restore {  // KV to the host only under the allocation-aware rule (nested calls restore)
    bool& flag;
    bool saved;
    ~Restore() { flag = saved; }
  } restore{offload_kv_, offload_kv_};
  offload_kv_ = rule == EvictionRule::kAllocationAware;
  const std::uint32_t need_pages = demand.blocks[config_.kv_kind.value()];
  const std::uint32_t free_pages = rule == EvictionRule::kNaive ? FreeKvPages() : 0;
  while (true) {
    // Naive: only the KV pages freed count, whatever else was freed.
    const bool kv_rule_met = rule == EvictionRule::kAllocationAware || free_pages + stats.pages >= need_pages;
    if (kv_rule_met && allocator_->CanAllocate(demand)) break;
    const bool evicted =
        rule == EvictionRule::kNaive ? EvictLeaf(stats) : (EvictState(stats) || EvictWindow(stats) || EvictLeaf(stats));
    // Naive's KV count can fall short of a demand that fits (what evicting states freed in
    // the middle serves KV too): nothing left to evict then is a success, not a refusal.
    if (!evicted && allocator_->CanAllocate(demand)) break;
    if (!evicted) {
      return MakeError(ErrorCode::kResourceExhausted,
                       fmt::format("prefix cache: nothing left to evict and the demand still does not fit "
                                   "(evicted {} nodes)",
                                   stats.nodes));
    }
  }
  ULA_EXPENSIVE_CHECK(*this);
  return stats;
}

EvictionStats PrefixCache::Evict(std::uint64_t kv_tokens, std::uint32_t states, std::uint64_t window_tokens) {
  EvictionStats stats;
  while (stats.tokens < kv_tokens && EvictLeaf(stats)) {
  }
  const std::uint32_t with_leaves = stats.checkpoints;  // freed with the leaves: not counted (as SGLang)
  while (stats.checkpoints - with_leaves < states && EvictState(stats)) {
  }
  while (std::uint64_t{stats.window_pages} * config_.page_tokens < window_tokens && EvictWindow(stats)) {
  }
  ULA_EXPENSIVE_CHECK(*this);
  return stats;
}

}  // namespace ula
