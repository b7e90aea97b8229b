// PrefixCache: counts, metrics and the invariant check (see include/ula/prefix_cache.h).
#include <fmt/format.h>

#include <algorithm>
#include <set>
#include <utility>

#include "prefix/tree_util.h"
#include "core/digest.h"
#include "ula/check.h"
#include "ula/prefix_cache.h"

namespace ula {

using internal::CeilDiv;
using internal::PathTo;

std::size_t PrefixCache::num_nodes() const { return nodes_.size() - 1 - free_nodes_.size(); }

std::size_t PrefixCache::num_checkpoints() const {
  std::size_t n = 0;
  for (std::size_t i = 1; i < nodes_.size(); ++i) n += nodes_[i].live && nodes_[i].checkpoint.valid() ? 1 : 0;
  return n;
}

std::vector<CacheEvent> PrefixCache::TakeEvents() { return std::exchange(events_, {}); }

std::vector<CacheEvent> PrefixCache::StoredBlocks() const {
  std::vector<CacheEvent> out;
  if (!config_.record_events) return out;
  const std::uint32_t P = config_.page_tokens;
  std::vector<std::uint32_t> stack = {0};  // root side first: a parent's stores before its children's
  while (!stack.empty()) {
    const std::uint32_t id = stack.back();
    stack.pop_back();
    const Node& n = nodes_[id];
    for (const auto& [token, child] : n.children) stack.push_back(child);
    if (id == 0) continue;
    const EventMedium medium = n.kv_on_host ? EventMedium::kHost : EventMedium::kDevice;
    auto add = [&](CacheEvent::Type type, BlockId b, std::uint32_t index, std::uint64_t hash) {
      CacheEvent e{.type = type, .block = medium == EventMedium::kDevice ? b : BlockId::Invalid(), .position = index * P,
                   .hash = static_cast<std::int64_t>(hash)};
      if (auto parent = ParentHashOnPath(id, index)) e.parent_hash = static_cast<std::int64_t>(*parent);
      e.tokens = PageTokens(id, index);
      e.medium = medium;
      out.push_back(std::move(e));
    };
    if (n.start % P != 0 && (n.head.valid() || n.host_head != kNoSlot)) {
      add(CacheEvent::Type::kPageStored, n.head, n.start / P, n.head_hash);
      if (n.whead.valid()) add(CacheEvent::Type::kWindowStored, n.whead, n.start / P, n.head_hash);
    }
    for (std::size_t i = 0; i < n.hashes.size(); ++i) {
      const auto index = CeilDiv(n.start, P) + static_cast<std::uint32_t>(i);
      add(CacheEvent::Type::kPageStored, n.pages[i], index, n.hashes[i]);
      if (i < n.wpages.size() && n.wpages[i].valid()) add(CacheEvent::Type::kWindowStored, n.wpages[i], index, n.hashes[i]);
    }
  }
  return out;
}

Status PrefixCache::Reset() {
  for (std::uint32_t id = 1; id < nodes_.size(); ++id) {
    if (nodes_[id].live && nodes_[id].kv_locks > 0) {
      return MakeError(ErrorCode::kFailedPrecondition, fmt::format("prefix cache reset: node {} is locked", id));
    }
  }
  for (BlockId b : owned_) ULA_CHECK(allocator_->Free(b).has_value());  // unlocked: nothing is pinned
  owned_.clear();
  nodes_.resize(1);
  nodes_[0] = Node{};
  nodes_[0].live = true;
  free_nodes_.clear();
  for (auto* set : {&kv_lru_, &state_lru_, &host_lru_, &window_lru_, &host_kv_lru_}) set->clear();
  window_locks_.clear();
  free_host_.clear();
  for (std::uint32_t s = host_.slots; s > 0; --s) free_host_.push_back(s - 1);
  free_host_pages_.clear();
  for (std::uint32_t s = host_.page_slots; s > 0; --s) free_host_pages_.push_back(s - 1);
  if (config_.record_events) events_.push_back(CacheEvent{.type = CacheEvent::Type::kAllCleared, .block = BlockId::Invalid()});
  ULA_EXPENSIVE_CHECK(*this);
  return Ok();
}

PrefixCacheMetrics PrefixCache::Metrics() const {
  PrefixCacheMetrics m;
  const std::uint64_t page = allocator_->kind_config(config_.kv_kind).block_bytes;
  const std::uint64_t state = stateless() ? 0 : allocator_->kind_config(config_.state_kind).block_bytes;
  const std::uint64_t window = config_.window_kind.valid() ? allocator_->kind_config(config_.window_kind).block_bytes : 0;
  for (std::size_t i = 1; i < nodes_.size(); ++i) {
    const Node& n = nodes_[i];
    if (!n.live) continue;
    ++m.nodes;
    const std::uint64_t kv = n.kv_on_host ? 0 : (n.pages.size() + (n.head.valid() ? 1 : 0)) * page;
    m.host_pages += n.host_pages.size() + (n.host_head != kNoSlot ? 1 : 0);
    (n.kv_locks > 0 ? m.kv.protected_bytes : m.kv.evictable) += kv;
    // Window eviction takes a node's window pages together, and only from a node without a
    // window lock (window_lru_): its pages are protected while any one of them is locked.
    auto window_page = [&](BlockId b) {
      if (b.valid()) (n.window_locks > 0 ? m.window.protected_bytes : m.window.evictable) += window;
    };
    window_page(n.whead);
    for (BlockId b : n.wpages) window_page(b);
    m.host_checkpoints += n.host != kNoSlot ? 1 : 0;
    if (!n.checkpoint.valid()) {
      m.tombstones += n.host == kNoSlot && !stateless() ? 1 : 0;
      continue;
    }
    ++m.checkpoints;
    (n.state_locks > 0 ? m.state.protected_bytes : m.state.evictable) += state;
    if (n.checkpoint.window.valid()) (n.state_locks > 0 ? m.window.protected_bytes : m.window.evictable) += window;
  }
  m.host_hits = host_hits_;
  m.host_page_hits = host_page_hits_;
  return m;
}

Status PrefixCache::CheckInvariants() const {
  const std::uint32_t P = config_.page_tokens;
  auto bad = [](std::uint32_t id, const char* what) {
    return MakeError(ErrorCode::kInternal, fmt::format("prefix cache: node {} {}", id, what));
  };
  std::size_t blocks = 0, in_kv = 0, in_state = 0, in_host = 0, in_window = 0;
  std::size_t window_locked = 0, in_host_kv = 0;
  std::set<std::uint32_t> page_slots(free_host_pages_.begin(), free_host_pages_.end());
  if (page_slots.size() != free_host_pages_.size()) return MakeError(ErrorCode::kInternal, "prefix cache: a free host page slot twice");
  const bool windowed = config_.sliding_window > 0;
  std::set<std::uint32_t> host_slots(free_host_.begin(), free_host_.end());
  if (host_slots.size() != free_host_.size()) return MakeError(ErrorCode::kInternal, "prefix cache: a free host slot twice");
  for (std::uint32_t id = 1; id < nodes_.size(); ++id) {
    const Node& n = nodes_[id];
    if (!n.live) continue;
    const Node& parent = nodes_[n.parent];
    if (!parent.live) return bad(id, "has a dead parent");
    if (n.tokens.empty() || n.start != parent.end || n.end != n.start + n.tokens.size()) return bad(id, "has a bad span");
    auto it = parent.children.find(n.tokens.front());
    if (it == parent.children.end() || it->second != id) return bad(id, "is not keyed by its parent");
    if (n.pages.size() != CeilDiv(n.end, P) - CeilDiv(n.start, P)) return bad(id, "owns the wrong number of pages");
    if (n.head.valid() && n.start % P == 0) return bad(id, "has a head copy at an aligned start");
    if (n.hashes.size() != (config_.record_events ? n.pages.size() : 0)) return bad(id, "has no event hash per page");
    if (n.kv_on_host) {
      // The root holds no locks: a host node under it may hold LoadBack's (as a device node may).
      if (n.parent != 0 && !parent.kv_on_host && parent.kv_locks < n.kv_locks) {
        return bad(id, "is a host node locked more than its parent");
      }
      if (n.head.valid() || n.checkpoint.valid() || n.host_pages.size() != n.pages.size() ||
          std::any_of(n.pages.begin(), n.pages.end(), [](BlockId b) { return b.valid(); }) ||
          (n.host_head != kNoSlot && n.start % P == 0)) {
        return bad(id, "is a host node with device blocks or the wrong host pages");
      }
      std::vector<std::uint32_t> mine = n.host_pages;
      if (n.host_head != kNoSlot) mine.push_back(n.host_head);
      for (std::uint32_t slot : mine) {
        if (slot >= host_.page_slots || !page_slots.insert(slot).second) return bad(id, "has a host page slot out of range or shared");
      }
      for (const auto& [token, child] : n.children) {
        if (child < nodes_.size() && !nodes_[child].kv_on_host) return bad(id, "is a host node with a device child");
      }
      if (kv_lru_.contains(KeyOf(id)) || state_lru_.contains(KeyOf(id)) || window_lru_.contains(WindowKeyOf(id))) {
        return bad(id, "is a host node in a device LRU set");
      }
      const bool want = n.kv_locks == 0 && n.children.empty();
      if (want != host_kv_lru_.contains(KeyOf(id))) return bad(id, "is misplaced in the host KV LRU set");
      in_host_kv += want;
      if (n.children.empty() && n.kv_locks == 0 && n.host == kNoSlot) return bad(id, "is an unlocked host leaf without a checkpoint");
      if (n.host != kNoSlot) {
        if (n.host >= host_.slots || !host_slots.insert(n.host).second) return bad(id, "has a host slot out of range or shared");
        if ((id != loading_) != host_lru_.contains(KeyOf(id))) return bad(id, "is misplaced in the host LRU set");
        ++in_host;
      }
      for (const auto& [token, child] : n.children) {
        if (child >= nodes_.size() || !nodes_[child].live || nodes_[child].parent != id) return bad(id, "has a stale child");
      }
      continue;
    }
    if (!n.host_pages.empty() || n.host_head != kNoSlot) return bad(id, "is a device node with host pages");
    std::vector<BlockId> own = n.pages;
    if (n.head.valid()) own.push_back(n.head);
    for (BlockId b : own) {
      auto kind = allocator_->KindOf(b);
      if (!kind || *kind != config_.kv_kind || !owned_.contains(b)) return bad(id, "owns a page that is not a live KV block");
    }
    blocks += own.size();
    if (n.wpages.size() != (windowed ? n.pages.size() : 0) || (n.whead.valid() && !n.head.valid())) {
      return bad(id, "has window pages that do not match its pages");
    }
    std::uint32_t locks = 0;
    bool any_window = false;
    std::vector<BlockId> wown = n.wpages;
    wown.push_back(n.whead);
    for (BlockId b : wown) {
      if (!b.valid()) continue;
      auto kind = allocator_->KindOf(b);
      if (!kind || *kind != config_.window_kind || !owned_.contains(b)) return bad(id, "owns a dead window page");
      ++blocks;
      any_window = true;
      if (auto it = window_locks_.find(b); it != window_locks_.end()) {
        locks += it->second;
        ++window_locked;
      }
    }
    if (locks != n.window_locks) return bad(id, "has a window-lock count that is not its pages' sum");
    if (n.window_locks > 0 && n.kv_locks == 0) return bad(id, "is window-locked without a KV lock");
    const bool want_window = any_window && n.window_locks == 0;
    if (want_window != window_lru_.contains(WindowKeyOf(id))) return bad(id, "is misplaced in the window LRU set");
    in_window += want_window;
    const auto path_pages = PagesOfPath(PathTo(id, nodes_), n.end);
    for (BlockId b : path_pages) {
      if (!b.valid()) return bad(id, "has a page index no node of its path provides");
    }
    if (n.checkpoint.valid()) {
      auto ks = allocator_->KindOf(n.checkpoint.state);
      if (!ks || *ks != config_.state_kind || !owned_.contains(n.checkpoint.state)) return bad(id, "has a dead state block");
      ++blocks;
      if (n.checkpoint.window.valid()) {
        auto kw = allocator_->KindOf(n.checkpoint.window);
        if (!kw || *kw != config_.window_kind || !owned_.contains(n.checkpoint.window)) return bad(id, "has a dead window ring");
        ++blocks;
      }
    } else {
      // Without a recurrent kind a match locks (state lock) the node it ends at, with no state.
      if (n.state_locks > 0 && !stateless()) return bad(id, "is state-locked without a checkpoint");
      if (n.children.empty() && n.kv_locks == 0 && n.host == kNoSlot && !stateless()) {
        return bad(id, "is an unlocked leaf without a checkpoint");
      }
    }
    if (n.host != kNoSlot) {
      if (n.checkpoint.valid() || n.host >= host_.slots || !host_slots.insert(n.host).second) {
        return bad(id, "has a host slot that is out of range, shared, or beside a device checkpoint");
      }
      if ((id != loading_) != host_lru_.contains(KeyOf(id))) return bad(id, "is misplaced in the host LRU set");
      ++in_host;
    }
    if (n.state_locks > n.kv_locks) return bad(id, "has more state locks than KV locks");
    if (n.parent != 0 && parent.kv_locks < n.kv_locks) return bad(id, "is locked more than its parent");
    const bool want_kv = n.kv_locks == 0 && !HasDeviceChild(n);
    const bool want_state = n.checkpoint.valid() && n.state_locks == 0;
    if (want_kv != kv_lru_.contains(KeyOf(id))) return bad(id, "is misplaced in the KV LRU set");
    if (want_state != state_lru_.contains(KeyOf(id))) return bad(id, "is misplaced in the state LRU set");
    in_kv += want_kv;
    in_state += want_state;
    for (const auto& [token, child] : n.children) {
      if (child >= nodes_.size() || !nodes_[child].live || nodes_[child].parent != id) return bad(id, "has a stale child");
    }
  }
  if (host_slots.size() != host_.slots) return MakeError(ErrorCode::kInternal, "prefix cache: a host slot is lost");
  if (page_slots.size() != host_.page_slots) return MakeError(ErrorCode::kInternal, "prefix cache: a host page slot is lost");
  if (in_host_kv != host_kv_lru_.size()) return MakeError(ErrorCode::kInternal, "prefix cache: the host KV LRU set is off");
  if (window_locked != window_locks_.size()) {
    return MakeError(ErrorCode::kInternal, "prefix cache: a window lock is held on a page no node owns");
  }
  if (in_kv != kv_lru_.size() || in_state != state_lru_.size() || in_window != window_lru_.size() ||
      in_host - (loading_ != kNoSlot) != host_lru_.size()) {
    return MakeError(ErrorCode::kInternal, "prefix cache: an LRU set holds a node that does not belong there");
  }
  if (blocks != owned_.size()) return MakeError(ErrorCode::kInternal, "prefix cache: the owned-block set disagrees with the nodes");
  return Ok();
}

std::uint64_t PrefixCache::DebugDigest() const {
  StateDigest d;
  auto add_block = [&](BlockId b) { d.Add(b.value()); };
  d.Add(nodes_.size());
  for (const Node& n : nodes_) {
    for (std::uint64_t v : {std::uint64_t{n.live}, std::uint64_t{n.parent}, std::uint64_t{n.start}, std::uint64_t{n.end},
                            std::uint64_t{n.host}, std::uint64_t{n.host_window}, std::uint64_t{n.kv_locks},
                            std::uint64_t{n.state_locks}, n.last_use, n.window_use}) {
      d.Add(v);
    }
    d.AddAll(std::span<const std::uint32_t>(n.tokens));
    add_block(n.head);
    d.Add(n.pages.size());
    for (BlockId b : n.pages) add_block(b);
    d.AddAll(std::span<const std::uint64_t>(n.hashes));
    d.Add(n.head_hash);
    d.AddAll(std::span<const std::uint32_t>(n.tail));
    add_block(n.whead);
    d.Add(n.wpages.size());
    for (BlockId b : n.wpages) add_block(b);
    d.Add(n.window_locks);
    d.Add(n.kv_on_host);
    d.AddAll(std::span<const std::uint32_t>(n.host_pages));
    d.Add(n.host_head);
    add_block(n.checkpoint.state);
    add_block(n.checkpoint.window);
    std::uint64_t children = 0;  // an unordered map: an order-free sum
    for (const auto& [token, child] : n.children) children += StateDigest::Mix(token, child);
    d.Add(n.children.size());
    d.Add(children);
  }
  d.AddAll(std::span<const std::uint32_t>(free_nodes_));
  std::uint64_t window_locks = 0;
  for (const auto& [b, count] : window_locks_) window_locks += StateDigest::Mix(b.value(), count);
  d.Add(window_locks_.size());
  d.Add(window_locks);
  d.AddAll(std::span<const std::uint32_t>(free_host_pages_));
  d.Add(host_page_hits_);
  for (const auto* set : {&kv_lru_, &state_lru_, &host_lru_, &window_lru_, &host_kv_lru_}) {
    d.Add(set->size());
    for (const auto& [use, depth, id] : *set) {
      d.Add(use);
      d.Add(depth);
      d.Add(id);
    }
  }
  d.AddAll(std::span<const std::uint32_t>(free_host_));
  if (host_.backend != nullptr && host_.host_arena.data != nullptr) {
    const std::byte* p = host_.host_arena.data;
    for (std::uint64_t i = 0; i < host_.host_arena.bytes; ++i) d.Add(static_cast<std::uint64_t>(p[i]));
  }
  std::uint64_t owned = 0;
  for (BlockId b : owned_) owned += StateDigest::Mix(b.value(), 1);
  d.Add(owned_.size());
  d.Add(owned);
  d.Add(events_.size());
  for (const CacheEvent& e : events_) {
    d.Add(static_cast<std::uint64_t>(e.type));
    add_block(e.block);
    d.Add(e.position);
    d.Add(static_cast<std::uint64_t>(e.hash));
    d.Add(e.parent_hash ? static_cast<std::uint64_t>(*e.parent_hash) : 0);
    d.Add(e.parent_hash.has_value());
    d.Add(static_cast<std::uint64_t>(e.medium));
    d.AddAll(std::span<const std::uint32_t>(e.tokens));
  }
  for (std::uint64_t v : {clock_, host_hits_, std::uint64_t{loading_}}) d.Add(v);
  d.Add(allocator_->DebugDigest());
  return d.value();
}

}  // namespace ula
