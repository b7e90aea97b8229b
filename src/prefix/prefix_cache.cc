#include "ula/prefix_cache.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <set>
#include <unordered_set>
#include <utility>
#include <vector>

#include "prefix/tree_util.h"
#include "ula/check.h"

namespace ula {

using internal::CeilDiv;
using internal::PathTo;

const char* EvictionRuleName(EvictionRule rule) {
  return rule == EvictionRule::kNaive ? "naive" : "allocation_aware";
}

Status PrefixCacheConfig::Validate() const {
  if (page_tokens == 0) return MakeError(ErrorCode::kInvalidArgument, "prefix cache config: page_tokens must be > 0");
  if (!kv_kind.valid()) return MakeError(ErrorCode::kInvalidArgument, "prefix cache config: kv_kind must be set");
  if (!state_kind.valid()) return MakeError(ErrorCode::kInvalidArgument, "prefix cache config: state_kind must be set");
  if (sliding_window > 0 && !window_kind.valid()) {
    return MakeError(ErrorCode::kInvalidArgument, "prefix cache config: sliding_window needs window_kind");
  }
  return Ok();
}

PrefixCache::PrefixCache(const PrefixCacheConfig& config, HybridAllocator* allocator)
    : config_(config), allocator_(allocator) {
  nodes_.emplace_back();
  nodes_[0].live = true;
}

PrefixCache::~PrefixCache() {
  // Give every block back to the allocator; pins come only from locks still held.
  for (BlockId b : owned_) {
    while (allocator_->Unpin(b).has_value()) {
    }
    (void)allocator_->Free(b);
  }
}

Result<std::unique_ptr<PrefixCache>> PrefixCache::Create(const PrefixCacheConfig& config, HybridAllocator* allocator) {
  ULA_RETURN_IF_ERROR(config.Validate());
  if (allocator == nullptr) return MakeError(ErrorCode::kInvalidArgument, "prefix cache: allocator must not be null");
  for (BlockKind k : {config.kv_kind, config.state_kind, config.window_kind}) {
    if (k.valid() && k.value() >= allocator->num_kinds()) {
      return MakeError(ErrorCode::kInvalidArgument, "prefix cache config: a kind is not one of the allocator's kinds");
    }
  }
  return std::unique_ptr<PrefixCache>(new PrefixCache(config, allocator));
}

Status PrefixCache::AttachHostTier(const HostTierConfig& config) {
  if (host_.backend != nullptr) return MakeError(ErrorCode::kFailedPrecondition, "prefix cache: a host tier is attached already");
  if (config.backend == nullptr || config.slots == 0) {
    return MakeError(ErrorCode::kInvalidArgument, "prefix cache host tier: needs a backend and at least one slot");
  }
  const std::uint64_t state = allocator_->kind_config(config_.state_kind).block_bytes;
  const std::uint64_t window = config_.window_kind.valid() ? allocator_->kind_config(config_.window_kind).block_bytes : 0;
  if (config.page_slots > 0 && config_.sliding_window > 0) {
    return MakeError(ErrorCode::kInvalidArgument, "prefix cache host tier: KV pages on the host are not supported with window pages");
  }
  const std::uint64_t page = allocator_->kind_config(config_.kv_kind).block_bytes;
  const std::uint64_t need = config.slots * (state + window) + std::uint64_t{config.page_slots} * page;
  auto device = config.backend->GetArena(config.device_arena);
  auto host = config.backend->GetArena(config.host_arena.id);
  if (!device || !host || host->tier != Tier::kHost || host->bytes < need) {
    return MakeError(ErrorCode::kInvalidArgument,
                     fmt::format("prefix cache host tier: unknown arenas, or a host arena under {} B", need));
  }
  host_ = config;
  host_.host_arena = *host;
  for (std::uint32_t s = config.slots; s > 0; --s) free_host_.push_back(s - 1);
  for (std::uint32_t s = config.page_slots; s > 0; --s) free_host_pages_.push_back(s - 1);
  return Ok();
}

Status PrefixCache::HostCopy(const Checkpoint& c, std::uint32_t slot, bool to_host) {
  const std::uint64_t state = allocator_->kind_config(config_.state_kind).block_bytes;
  struct Part {
    BlockId block;
    std::uint64_t host_offset, bytes;
  };
  std::vector<Part> parts = {{c.state, std::uint64_t{slot} * state, state}};
  if (c.window.valid()) {
    const std::uint64_t window = allocator_->kind_config(config_.window_kind).block_bytes;
    parts.push_back({c.window, std::uint64_t{host_.slots} * state + std::uint64_t{slot} * window, window});
  }
  // Copy, then publish: every batch waited on its own fence (ula/backend.h), the first
  // failure returned once nothing is in flight.
  std::vector<Fence> fences;
  Status status = Ok();
  for (const Part& p : parts) {
    auto device = allocator_->Offset(p.block);
    if (!device) {
      status = std::unexpected(std::move(device).error());
      break;
    }
    CopyBatch b;
    b.src = to_host ? host_.device_arena : host_.host_arena.id;
    b.dst = to_host ? host_.host_arena.id : host_.device_arena;
    b.bytes_per_move = static_cast<std::uint32_t>(p.bytes);
    b.moves = {to_host ? SlotMove{*device, p.host_offset} : SlotMove{p.host_offset, *device}};
    auto fence = host_.backend->Submit(std::move(b));
    if (!fence) {
      status = std::unexpected(std::move(fence).error());
      break;
    }
    fences.push_back(*fence);
  }
  for (Fence f : fences) {
    if (auto w = host_.backend->Wait(f); !w && status) status = std::unexpected(std::move(w).error());
  }
  return status;
}

bool PrefixCache::Offload(std::uint32_t id, EvictionStats& stats) {
  if (host_.backend == nullptr) return false;
  if (free_host_.empty() && !host_lru_.empty()) DropHost(std::get<2>(*host_lru_.begin()), stats);
  if (free_host_.empty()) return false;
  Node& n = nodes_[id];
  const Checkpoint c = n.checkpoint;
  const std::uint32_t slot = free_host_.back();
  for (BlockId b : {c.state, c.window}) {
    if (b.valid()) ULA_CHECK(allocator_->Pin(b).has_value());  // no move while copied
  }
  const Status copied = HostCopy(c, slot, true);
  for (BlockId b : {c.state, c.window}) {
    if (b.valid()) ULA_CHECK(allocator_->Unpin(b).has_value());
  }
  if (!copied) return false;
  free_host_.pop_back();
  Update(id, [&] {
    n.host = slot;
    n.host_window = c.window.valid();
    FreeCheckpoint(c, n.end);
    n.checkpoint = Checkpoint{};
  });
  return true;
}

void PrefixCache::DropHost(std::uint32_t id, EvictionStats& stats) {
  Node& n = nodes_[id];
  Update(id, [&] {
    free_host_.push_back(n.host);
    n.host = kNoSlot;
  });
  if (!n.children.empty() || n.kv_locks > 0 || n.checkpoint.valid()) return;
  if (!n.kv_on_host) {
    RemoveLeaf(id, stats);
    return;
  }
  DropHostLeaf(id, stats);
}

bool PrefixCache::HasDeviceChild(const Node& n) const {
  return std::any_of(n.children.begin(), n.children.end(), [&](const auto& c) { return !nodes_[c.second].kv_on_host; });
}

Status PrefixCache::HostPageCopy(std::span<const BlockId> blocks, std::span<const std::uint32_t> slots, bool to_host) {
  const std::uint64_t state = allocator_->kind_config(config_.state_kind).block_bytes;
  const std::uint64_t window = config_.window_kind.valid() ? allocator_->kind_config(config_.window_kind).block_bytes : 0;
  const std::uint64_t page = allocator_->kind_config(config_.kv_kind).block_bytes;
  const std::uint64_t base = std::uint64_t{host_.slots} * (state + window);
  CopyBatch b;
  b.src = to_host ? host_.device_arena : host_.host_arena.id;
  b.dst = to_host ? host_.host_arena.id : host_.device_arena;
  b.bytes_per_move = static_cast<std::uint32_t>(page);
  for (std::size_t i = 0; i < blocks.size(); ++i) {
    auto device = allocator_->Offset(blocks[i]);
    if (!device) return std::unexpected(std::move(device).error());
    const std::uint64_t h = base + std::uint64_t{slots[i]} * page;
    b.moves.push_back(to_host ? SlotMove{*device, h} : SlotMove{h, *device});
  }
  if (b.moves.empty()) return Ok();
  auto fence = host_.backend->Submit(std::move(b));
  if (!fence) return std::unexpected(std::move(fence).error());
  return host_.backend->Wait(*fence);  // copy, then publish: the caller publishes after this
}

bool PrefixCache::OffloadKv(std::uint32_t id, EvictionStats& stats) {
  if (host_.backend == nullptr || host_.page_slots == 0) return false;
  Node& n = nodes_[id];
  ULA_CHECK(!n.kv_on_host && n.kv_locks == 0 && !HasDeviceChild(n));
  // A node worth keeping: a checkpoint (moved to the host first) or host nodes below it.
  if (n.checkpoint.valid()) {
    if (!Offload(id, stats)) return false;
    ++stats.checkpoints;
    ++stats.offloaded;
  }
  if (n.host == kNoSlot && n.children.empty()) return false;  // a useless leaf: removed by the caller
  std::vector<BlockId> blocks = n.pages;
  if (n.head.valid()) blocks.push_back(n.head);
  // Room: drop least recently used host leaves, none below this node (a cascade from one
  // could reach it).
  auto below = [&](std::uint32_t x) {
    for (std::uint32_t a = nodes_[x].parent; a != 0; a = nodes_[a].parent) {
      if (a == id) return true;
    }
    return false;
  };
  while (free_host_pages_.size() < blocks.size()) {
    auto it = std::find_if(host_kv_lru_.begin(), host_kv_lru_.end(), [&](const LruKey& k) { return !below(std::get<2>(k)); });
    if (it == host_kv_lru_.end()) return false;
    DropHostLeaf(std::get<2>(*it), stats);
  }
  std::vector<std::uint32_t> slots(free_host_pages_.end() - static_cast<std::ptrdiff_t>(blocks.size()), free_host_pages_.end());
  for (BlockId b : blocks) ULA_CHECK(allocator_->Pin(b).has_value());  // no move while copied
  const Status copied = HostPageCopy(blocks, slots, true);
  for (BlockId b : blocks) ULA_CHECK(allocator_->Unpin(b).has_value());
  if (!copied) return false;  // nothing published: the caller evicts as without a host tier
  // Publish: the host slots are the node's, the device pages go.
  const std::uint32_t P = config_.page_tokens;
  free_host_pages_.resize(free_host_pages_.size() - blocks.size());
  Update(id, [&] {
    if (n.head.valid()) {
      FreePage(n.head, n.start / P);
      n.head = BlockId::Invalid();
      n.host_head = slots.back();
    }
    n.host_pages.assign(slots.begin(), slots.begin() + static_cast<std::ptrdiff_t>(n.pages.size()));
    for (std::size_t i = 0; i < n.pages.size(); ++i) {
      FreePage(n.pages[i], CeilDiv(n.start, P) + static_cast<std::uint32_t>(i));
      n.pages[i] = BlockId::Invalid();
    }
    n.kv_on_host = true;
  });
  Update(n.parent, [] {});
  stats.pages += static_cast<std::uint32_t>(blocks.size());
  stats.offloaded_pages += static_cast<std::uint32_t>(blocks.size());
  return true;
}

void PrefixCache::DropHostLeaf(std::uint32_t id, EvictionStats& stats) {
  const std::uint32_t parent = nodes_[id].parent;
  RemoveHostSubtree(id);
  const Node& p = nodes_[parent];
  if (parent != 0 && p.children.empty() && p.kv_locks == 0 && !p.checkpoint.valid() && p.host == kNoSlot) {
    if (p.kv_on_host) {
      DropHostLeaf(parent, stats);
    } else {
      RemoveLeaf(parent, stats);
    }
  }
}

void PrefixCache::RemoveHostSubtree(std::uint32_t id) {
  Node& n = nodes_[id];
  ULA_CHECK(n.kv_on_host && n.kv_locks == 0);
  while (!n.children.empty()) RemoveHostSubtree(n.children.begin()->second);
  const std::uint32_t parent = n.parent;
  Update(id, [&] {
    for (std::uint32_t s : n.host_pages) free_host_pages_.push_back(s);
    if (n.host_head != kNoSlot) free_host_pages_.push_back(n.host_head);
    if (n.host != kNoSlot) free_host_.push_back(n.host);
    Update(parent, [&] { nodes_[parent].children.erase(n.tokens.front()); });
    n = Node{};
  });
  free_nodes_.push_back(id);
}

Status PrefixCache::LoadBack(std::uint32_t id, EvictionRule rule) {
  ULA_CHECK(nodes_[id].host != kNoSlot && !nodes_[id].checkpoint.valid());
  const std::uint32_t P = config_.page_tokens;
  // The node's host copy is not droppable, and every node of its path (host ones included)
  // is KV-locked until the copies completed: not evicted, not dropped from the host.
  Update(id, [&] { loading_ = id; });
  for (std::uint32_t a = id; a != 0; a = nodes_[a].parent) Update(a, [&] { ++nodes_[a].kv_locks; });
  // The host part of the path (root side first) and its pages: the pages in order, then heads.
  std::vector<std::uint32_t> host_path;
  for (std::uint32_t a = id; a != 0 && nodes_[a].kv_on_host; a = nodes_[a].parent) host_path.push_back(a);
  std::reverse(host_path.begin(), host_path.end());
  std::vector<std::uint32_t> slots;
  for (std::uint32_t a : host_path) {
    slots.insert(slots.end(), nodes_[a].host_pages.begin(), nodes_[a].host_pages.end());
    if (nodes_[a].host_head != kNoSlot) slots.push_back(nodes_[a].host_head);
  }
  Demand d = Demand::Of(allocator_->num_kinds()).Add(config_.state_kind, 1);
  if (nodes_[id].host_window) d.Add(config_.window_kind, 1);
  d.Add(config_.kv_kind, static_cast<std::uint32_t>(slots.size()));
  Result<std::vector<BlockId>> ids = std::vector<BlockId>{};
  if (!allocator_->CanAllocate(d)) {
    if (auto s = MakeRoom(d, rule); !s) ids = std::unexpected(std::move(s).error());
  }
  if (ids) ids = allocator_->AllocateDemand(d);
  Checkpoint c;
  std::vector<BlockId> pages;
  Status copied = Ok();
  if (ids) {
    for (BlockId b : *ids) {
      const BlockKind k = *allocator_->KindOf(b);
      if (k == config_.kv_kind) pages.push_back(b);
      else (k == config_.state_kind ? c.state : c.window) = b;
    }
    for (BlockId b : *ids) ULA_CHECK(allocator_->Pin(b).has_value());
    copied = HostCopy(c, nodes_[id].host, false);
    if (copied) copied = HostPageCopy(pages, slots, false);
    for (BlockId b : *ids) ULA_CHECK(allocator_->Unpin(b).has_value());
    if (!copied) {
      for (BlockId b : *ids) ULA_CHECK(allocator_->Free(b).has_value());
    }
  }
  const bool publish = ids && copied;
  if (publish) {  // the host part of the path is on the device again, its host slots freed
    std::size_t next = 0;
    for (std::uint32_t a : host_path) {
      Node& h = nodes_[a];
      Update(a, [&] {
        for (std::size_t i = 0; i < h.pages.size(); ++i) {
          h.pages[i] = pages[next++];
          StorePage(h.pages[i], CeilDiv(h.start, P) + static_cast<std::uint32_t>(i));
          free_host_pages_.push_back(h.host_pages[i]);
        }
        if (h.host_head != kNoSlot) {
          h.head = pages[next++];
          StorePage(h.head, h.start / P);
          free_host_pages_.push_back(h.host_head);
          h.host_head = kNoSlot;
        }
        h.host_pages.clear();
        h.kv_on_host = false;
      });
    }
    host_page_hits_ += pages.size();
  }
  for (std::uint32_t a = id; a != 0; a = nodes_[a].parent) Update(a, [&] { --nodes_[a].kv_locks; });
  Node& n = nodes_[id];
  Update(id, [&] {
    loading_ = kNoSlot;
    if (ids && copied) {  // publish: the device copy replaces the host one
      free_host_.push_back(n.host);
      n.host = kNoSlot;
      n.checkpoint = c;
    }
  });
  if (!ids) return std::unexpected(std::move(ids).error());
  if (!copied) return copied;
  owned_.insert(c.state);
  if (c.window.valid()) owned_.insert(c.window);
  if (config_.record_events) events_.push_back({CacheEvent::Type::kStateStored, c.state, n.end});
  ++host_hits_;
  return Ok();
}

std::uint32_t PrefixCache::NodeAt(std::span<const std::uint32_t> tokens, std::uint32_t length) const {
  std::uint32_t node = 0;
  std::uint32_t pos = 0;
  while (pos < length) {
    auto it = nodes_[node].children.find(tokens[pos]);
    if (it == nodes_[node].children.end()) return 0;
    const Node& c = nodes_[it->second];
    if (c.end > length || !std::equal(c.tokens.begin(), c.tokens.end(), tokens.begin() + pos)) return 0;
    node = it->second;
    pos = c.end;
  }
  return node;
}

bool PrefixCache::HoldsOnHost(std::span<const std::uint32_t> tokens) const {
  const std::uint32_t id = NodeAt(tokens, static_cast<std::uint32_t>(tokens.size()));
  return id != 0 && nodes_[id].host != kNoSlot;
}

bool PrefixCache::KvOnHost(std::span<const std::uint32_t> tokens) const {
  const std::uint32_t id = NodeAt(tokens, static_cast<std::uint32_t>(tokens.size()));
  return id != 0 && nodes_[id].kv_on_host;
}

std::uint32_t PrefixCache::NewNode() {
  std::uint32_t id;
  if (!free_nodes_.empty()) {
    id = free_nodes_.back();
    free_nodes_.pop_back();
    nodes_[id] = Node{};
  } else {
    id = static_cast<std::uint32_t>(nodes_.size());
    nodes_.emplace_back();
  }
  nodes_[id].live = true;
  return id;
}

PrefixCache::LruKey PrefixCache::KeyOf(std::uint32_t id) const {
  return {nodes_[id].last_use, UINT32_MAX - nodes_[id].end, id};
}

template <class F>
void PrefixCache::Update(std::uint32_t id, F&& f) {
  if (id == 0) {
    f();
    return;
  }
  const LruKey old = KeyOf(id);
  kv_lru_.erase(old);
  state_lru_.erase(old);
  host_lru_.erase(old);
  window_lru_.erase(old);
  host_kv_lru_.erase(old);
  f();
  const Node& n = nodes_[id];
  if (!n.live) return;
  if (!n.kv_on_host && n.kv_locks == 0 && !HasDeviceChild(n)) kv_lru_.insert(KeyOf(id));
  if (n.kv_on_host && n.kv_locks == 0 && n.children.empty()) host_kv_lru_.insert(KeyOf(id));
  if (n.checkpoint.valid() && n.state_locks == 0) state_lru_.insert(KeyOf(id));
  if (n.host != kNoSlot && id != loading_) host_lru_.insert(KeyOf(id));
  const bool any_window = n.whead.valid() || std::any_of(n.wpages.begin(), n.wpages.end(), [](BlockId b) { return b.valid(); });
  if (any_window && n.window_locks == 0) window_lru_.insert(KeyOf(id));
}

void PrefixCache::Touch(std::uint32_t id, std::uint64_t clock) {
  Update(id, [&] { nodes_[id].last_use = clock; });
}

void PrefixCache::StorePage(BlockId page, std::uint32_t index) {
  owned_.insert(page);
  if (config_.record_events) events_.push_back({CacheEvent::Type::kPageStored, page, index * config_.page_tokens});
}

void PrefixCache::FreePage(BlockId page, std::uint32_t index) {
  owned_.erase(page);
  ULA_CHECK(allocator_->Free(page).has_value());
  if (config_.record_events) events_.push_back({CacheEvent::Type::kPageRemoved, page, index * config_.page_tokens});
}

void PrefixCache::FreeCheckpoint(const Checkpoint& c, std::uint32_t position) {
  if (!c.valid()) return;
  for (BlockId b : {c.state, c.window}) {
    if (!b.valid()) continue;
    owned_.erase(b);
    ULA_CHECK(allocator_->Free(b).has_value());
  }
  if (config_.record_events) events_.push_back({CacheEvent::Type::kStateRemoved, c.state, position});
}

std::uint32_t PrefixCache::Split(std::uint32_t id, std::uint32_t at) {
  const std::uint32_t P = config_.page_tokens;
  ULA_CHECK(!nodes_[id].kv_on_host);  // host nodes are never split
  const std::uint32_t upper = NewNode();  // may reallocate nodes_
  Node& n = nodes_[id];
  Node& m = nodes_[upper];
  ULA_CHECK(at > n.start && at < n.end);
  const std::uint32_t cut = at - n.start;
  m.parent = n.parent;
  m.start = n.start;
  m.end = at;
  m.tokens.assign(n.tokens.begin(), n.tokens.begin() + cut);
  const std::uint32_t upper_pages = CeilDiv(at, P) - CeilDiv(n.start, P);
  m.pages.assign(n.pages.begin(), n.pages.begin() + upper_pages);
  m.head = n.head;
  if (!n.wpages.empty()) m.wpages.assign(n.wpages.begin(), n.wpages.begin() + upper_pages);
  m.whead = n.whead;
  m.kv_locks = n.kv_locks;
  m.last_use = n.last_use;
  nodes_[n.parent].children[m.tokens.front()] = upper;
  // Window locks live on pages: each half counts those of its own pages.
  auto locks_of = [&](const Node& x) {
    std::uint32_t sum = 0;
    for (BlockId b : x.wpages) {
      if (auto it = window_locks_.find(b); b.valid() && it != window_locks_.end()) sum += it->second;
    }
    if (auto it = window_locks_.find(x.whead); x.whead.valid() && it != window_locks_.end()) sum += it->second;
    return sum;
  };
  Update(id, [&] {
    n.tokens.erase(n.tokens.begin(), n.tokens.begin() + cut);
    n.pages.erase(n.pages.begin(), n.pages.begin() + upper_pages);
    n.head = BlockId::Invalid();
    if (!n.wpages.empty()) n.wpages.erase(n.wpages.begin(), n.wpages.begin() + upper_pages);
    n.whead = BlockId::Invalid();
    n.start = at;
    n.parent = upper;
    n.window_locks = locks_of(n);
  });
  m.window_locks = locks_of(m);
  m.children.emplace(n.tokens.front(), id);
  Update(upper, [] {});
  return upper;
}

std::vector<BlockId> PrefixCache::PagesOfPath(const std::vector<std::uint32_t>& path, std::uint32_t length) const {
  const std::uint32_t P = config_.page_tokens;
  std::vector<BlockId> pages(CeilDiv(length, P));
  for (std::uint32_t id : path) {  // root first: deeper nodes overwrite
    const Node& n = nodes_[id];
    if (n.head.valid() && n.start / P < pages.size()) pages[n.start / P] = n.head;
    const std::uint32_t first = CeilDiv(n.start, P);
    for (std::size_t i = 0; i < n.pages.size() && first + i < pages.size(); ++i) pages[first + i] = n.pages[i];
  }
  return pages;
}

std::vector<PrefixCache::Provider> PrefixCache::ProvidersOfPath(const std::vector<std::uint32_t>& path,
                                                               std::uint32_t length) const {
  const std::uint32_t P = config_.page_tokens;
  std::vector<Provider> providers(CeilDiv(length, P));
  for (std::uint32_t id : path) {  // root first: deeper nodes overwrite
    const Node& n = nodes_[id];
    if (n.head.valid() && n.start / P < providers.size()) providers[n.start / P] = {id, true};
    const std::uint32_t first = CeilDiv(n.start, P);
    for (std::size_t i = 0; i < n.pages.size() && first + i < providers.size(); ++i) providers[first + i] = {id, false};
  }
  return providers;
}

BlockId& PrefixCache::WindowSlot(Provider p, std::uint32_t index) {
  Node& n = nodes_[p.node];
  return p.head ? n.whead : n.wpages[index - CeilDiv(n.start, config_.page_tokens)];
}

std::vector<BlockId> PrefixCache::WindowPagesOfPath(const std::vector<std::uint32_t>& path, std::uint32_t length) const {
  const std::uint32_t P = config_.page_tokens;
  std::vector<BlockId> pages(CeilDiv(length, P));
  for (std::uint32_t id : path) {  // as PagesOfPath, with the window pages
    const Node& n = nodes_[id];
    if (n.head.valid() && n.start / P < pages.size()) pages[n.start / P] = n.whead;
    const std::uint32_t first = CeilDiv(n.start, P);
    for (std::size_t i = 0; i < n.wpages.size() && first + i < pages.size(); ++i) pages[first + i] = n.wpages[i];
  }
  return pages;
}

std::uint32_t PrefixCache::WindowFirstPage(std::uint32_t length) const {
  const std::uint32_t need = config_.sliding_window - 1;  // tokens before `length` the next token attends to
  return length > need ? (length - need) / config_.page_tokens : 0;
}

bool PrefixCache::HasWindow(const std::vector<std::uint32_t>& path, std::uint32_t length) const {
  if (config_.sliding_window == 0) return true;
  const std::vector<BlockId> w = WindowPagesOfPath(path, length);
  for (std::size_t i = WindowFirstPage(length); i < w.size(); ++i) {
    if (!w[i].valid()) return false;
  }
  return true;
}

PrefixMatch PrefixCache::Match(std::span<const std::uint32_t> tokens, std::uint32_t max_length) {
  PrefixMatch best;
  std::vector<std::uint32_t> path;
  std::size_t best_depth = 0;
  std::uint32_t node = 0;
  std::uint32_t pos = 0;
  std::uint32_t kv_length = 0;
  bool on_device = true;
  while (pos < tokens.size()) {
    auto it = nodes_[node].children.find(tokens[pos]);
    if (it == nodes_[node].children.end()) break;
    const Node& c = nodes_[it->second];
    const std::size_t limit = std::min<std::size_t>(c.tokens.size(), tokens.size() - pos);
    std::size_t l = 0;
    while (l < limit && c.tokens[l] == tokens[pos + l]) ++l;
    if (l < c.tokens.size()) {
      pos += static_cast<std::uint32_t>(l);
      break;
    }
    node = it->second;
    pos = c.end;
    path.push_back(node);
    on_device = on_device && !c.kv_on_host;  // host nodes only below device ones
    const bool usable = c.end <= max_length && (c.checkpoint.valid() || c.host != kNoSlot) && HasWindow(path, c.end);
    if (usable && on_device && c.checkpoint.valid()) best_depth = path.size();
    if (usable) best.host_length = c.end;
  }
  kv_length = pos;
  ++clock_;
  path.resize(best_depth);
  for (std::uint32_t id : path) Touch(id, clock_);
  if (!path.empty()) {
    const Node& d = nodes_[path.back()];
    best.length = d.end;
    best.checkpoint = d.checkpoint;
    best.pages = PagesOfPath(path, d.end);
    if (config_.sliding_window > 0) {
      best.window_pages = WindowPagesOfPath(path, d.end);
      std::fill(best.window_pages.begin(), best.window_pages.begin() + WindowFirstPage(d.end), BlockId::Invalid());
    }
  }
  best.kv_length = kv_length;
  best.branch = kv_length > best.length ? kv_length : 0;
  best.path = std::move(path);
  return best;
}

bool PrefixCache::Holds(std::span<const std::uint32_t> tokens) const {
  std::uint32_t node = 0;
  std::size_t pos = 0;
  while (pos < tokens.size()) {
    auto it = nodes_[node].children.find(tokens[pos]);
    if (it == nodes_[node].children.end()) return false;
    const Node& c = nodes_[it->second];
    if (c.tokens.size() > tokens.size() - pos || !std::equal(c.tokens.begin(), c.tokens.end(), tokens.begin() + pos)) {
      return false;
    }
    node = it->second;
    pos = c.end;
  }
  return node != 0 && nodes_[node].checkpoint.valid();
}

Result<std::uint32_t> PrefixCache::LockedNode(const PrefixMatch& match, bool locking) const {
  if (match.length == 0) return 0u;
  const std::uint32_t id = match.path.empty() ? 0 : match.path.back();
  if (id == 0 || id >= nodes_.size() || !nodes_[id].live || nodes_[id].end != match.length ||
      nodes_[id].checkpoint.state != match.checkpoint.state) {
    return MakeError(locking ? ErrorCode::kNotFound : ErrorCode::kFailedPrecondition,
                     fmt::format("prefix cache: the matched node {} is gone", id));
  }
  if (!locking) {
    if (nodes_[id].state_locks == 0) {
      return MakeError(ErrorCode::kFailedPrecondition, fmt::format("prefix cache: node {} of the match is not locked", id));
    }
    for (std::uint32_t a = id; a != 0; a = nodes_[a].parent) {
      if (nodes_[a].kv_locks == 0) {
        return MakeError(ErrorCode::kFailedPrecondition, fmt::format("prefix cache: node {} of the match is not locked", a));
      }
    }
  } else if (nodes_[id].state_locks == UINT32_MAX) {
    return MakeError(ErrorCode::kFailedPrecondition, "prefix cache: lock count overflow");
  }
  return id;
}

void PrefixCache::PinMatch(std::uint32_t node, bool pin) {
  const Node& d = nodes_[node];
  std::vector<BlockId> blocks = PagesOfPath(PathTo(node, nodes_), d.end);
  blocks.push_back(d.checkpoint.state);
  if (d.checkpoint.window.valid()) blocks.push_back(d.checkpoint.window);
  for (BlockId b : blocks) ULA_CHECK((pin ? allocator_->Pin(b) : allocator_->Unpin(b)).has_value());
}

std::uint32_t PrefixCache::WindowOwner(std::uint32_t node, BlockId page) const {
  for (std::uint32_t a = node; a != 0; a = nodes_[a].parent) {
    const Node& n = nodes_[a];
    if (n.whead == page || std::find(n.wpages.begin(), n.wpages.end(), page) != n.wpages.end()) return a;
  }
  return 0;
}

Status PrefixCache::CheckWindowLocked(const PrefixMatch& match, std::uint32_t node) const {
  for (BlockId b : match.window_pages) {
    if (!b.valid()) continue;
    auto it = window_locks_.find(b);
    if (it == window_locks_.end() || it->second == 0 || WindowOwner(node, b) == 0) {
      return MakeError(ErrorCode::kFailedPrecondition,
                       fmt::format("prefix cache: window page {} of the match is not locked", b.value()));
    }
  }
  return Ok();
}

void PrefixCache::LockWindow(const PrefixMatch& match, std::uint32_t node, bool lock) {
  for (BlockId b : match.window_pages) {
    if (!b.valid()) continue;
    const std::uint32_t owner = WindowOwner(node, b);
    ULA_CHECK(owner != 0);
    ULA_CHECK((lock ? allocator_->Pin(b) : allocator_->Unpin(b)).has_value());
    Update(owner, [&] {
      if (lock) {
        ++window_locks_[b];
        ++nodes_[owner].window_locks;
      } else {
        if (--window_locks_[b] == 0) window_locks_.erase(b);
        --nodes_[owner].window_locks;
      }
    });
  }
}

Status PrefixCache::ReleaseWindow(PrefixMatch& match) {
  auto id = LockedNode(match, false);
  if (!id) return std::unexpected(std::move(id).error());
  if (*id == 0) return Ok();
  ULA_RETURN_IF_ERROR(CheckWindowLocked(match, *id));
  LockWindow(match, *id, false);
  match.window_pages.clear();
  ULA_EXPENSIVE_CHECK(*this);
  return Ok();
}

Status PrefixCache::Lock(const PrefixMatch& match) {
  auto id = LockedNode(match, true);
  if (!id) return std::unexpected(std::move(id).error());
  if (*id == 0) return Ok();
  for (BlockId b : match.window_pages) {  // present, on the path
    if (b.valid() && WindowOwner(*id, b) == 0) {
      return MakeError(ErrorCode::kNotFound, fmt::format("prefix cache: window page {} of the match is gone", b.value()));
    }
  }
  LockWindow(match, *id, true);
  PinMatch(*id, true);
  Update(*id, [&] { ++nodes_[*id].state_locks; });
  for (std::uint32_t a = *id; a != 0; a = nodes_[a].parent) Update(a, [&] { ++nodes_[a].kv_locks; });
  return Ok();
}

Status PrefixCache::Unlock(const PrefixMatch& match) {
  auto id = LockedNode(match, false);
  if (!id) return std::unexpected(std::move(id).error());
  if (*id == 0) return Ok();
  ULA_RETURN_IF_ERROR(CheckWindowLocked(match, *id));
  LockWindow(match, *id, false);
  PinMatch(*id, false);
  Update(*id, [&] { --nodes_[*id].state_locks; });
  for (std::uint32_t a = *id; a != 0; a = nodes_[a].parent) Update(a, [&] { --nodes_[a].kv_locks; });
  // A tombstoned leaf that only the lock kept is useless now.
  const Node& d = nodes_[*id];
  if (d.kv_locks == 0 && d.children.empty() && !d.checkpoint.valid() && d.host == kNoSlot) {
    EvictionStats ignored;
    RemoveLeaf(*id, ignored);
  }
  ULA_EXPENSIVE_CHECK(*this);
  return Ok();
}

Result<PrefixMatch> PrefixCache::MatchCopyOnWrite(std::span<const std::uint32_t> tokens, std::uint32_t max_length,
                                                  EvictionRule rule) {
  PrefixMatch m = Match(tokens, max_length);
  // A deeper checkpoint on the host tier: bring it back. When that fails (no room, a failed
  // copy), the request starts from the device match (host_length still says what it missed).
  if (m.host_length > m.length && LoadBack(NodeAt(tokens, m.host_length), rule)) m = Match(tokens, max_length);
  if (m.length == 0) return m;
  ULA_RETURN_IF_ERROR(Lock(m));
  Demand d = Demand::Of(allocator_->num_kinds()).Add(config_.state_kind, 1);
  if (m.checkpoint.window.valid()) d.Add(config_.window_kind, 1);
  if (!allocator_->CanAllocate(d)) {
    if (auto s = MakeRoom(d, rule); !s) {
      ULA_CHECK(Unlock(m).has_value());
      return std::unexpected(std::move(s).error());
    }
  }
  auto ids = allocator_->AllocateDemand(d);
  if (!ids) {
    ULA_CHECK(Unlock(m).has_value());
    return std::unexpected(std::move(ids).error());
  }
  for (BlockId id : *ids) (allocator_->KindOf(id) == config_.state_kind ? m.copy.state : m.copy.window) = id;
  if (Status copied = CopyCheckpoint(m.checkpoint, m.copy); !copied) {
    for (BlockId id : *ids) ULA_CHECK(allocator_->Free(id).has_value());
    ULA_CHECK(Unlock(m).has_value());
    return std::unexpected(Error(copied.error().code(),
                                 "prefix cache: copy-on-write of the checkpoint failed: " + copied.error().message()));
  }
  return m;
}

Status PrefixCache::AttachCopyBackend(Backend* backend, ArenaId device_arena) {
  if (mover_ != nullptr) return MakeError(ErrorCode::kFailedPrecondition, "prefix cache: a copy backend is attached already");
  if (backend == nullptr || !backend->GetArena(device_arena)) {
    return MakeError(ErrorCode::kInvalidArgument, "prefix cache copy backend: needs a backend that holds the device arena");
  }
  mover_ = backend;
  mover_arena_ = device_arena;
  return Ok();
}

Status PrefixCache::CopyCheckpoint(const Checkpoint& from, const Checkpoint& to) {
  const std::pair<BlockId, BlockId> parts[] = {{from.state, to.state}, {from.window, to.window}};
  if (mover_ == nullptr) {
    for (auto [src_id, dst_id] : parts) {
      if (!src_id.valid()) continue;
      auto src = allocator_->Bytes(src_id);
      auto dst = allocator_->Bytes(dst_id);
      ULA_CHECK(src.has_value() && dst.has_value() && src->size() == dst->size());
      if (!src->empty()) std::memcpy(dst->data(), src->data(), src->size());
    }
    return Ok();
  }
  // Both ends pinned (no move while copied), one batch per block, every fence waited on.
  std::vector<BlockId> pinned;
  std::vector<Fence> fences;
  Status status = Ok();
  for (auto [src_id, dst_id] : parts) {
    if (!src_id.valid()) continue;
    for (BlockId b : {src_id, dst_id}) {
      ULA_CHECK(allocator_->Pin(b).has_value());
      pinned.push_back(b);
    }
    CopyBatch b;
    b.src = b.dst = mover_arena_;
    b.bytes_per_move = static_cast<std::uint32_t>(allocator_->kind_config(*allocator_->KindOf(src_id)).block_bytes);
    b.moves = {SlotMove{*allocator_->Offset(src_id), *allocator_->Offset(dst_id)}};
    auto fence = mover_->Submit(std::move(b));
    if (!fence) {
      status = std::unexpected(std::move(fence).error());
      break;
    }
    fences.push_back(*fence);
  }
  for (Fence f : fences) {
    if (auto w = mover_->Wait(f); !w && status) status = std::unexpected(std::move(w).error());
  }
  for (BlockId b : pinned) ULA_CHECK(allocator_->Unpin(b).has_value());
  return status;
}

Status PrefixCache::Insert(std::span<const std::uint32_t> tokens, std::span<const BlockId> pages,
                           std::span<const PositionedCheckpoint> checkpoints, std::span<const BlockId> window_pages) {
  const std::uint32_t P = config_.page_tokens;
  const std::size_t want_pages = (tokens.size() + P - 1) / P;
  if (pages.size() != want_pages) {
    return MakeError(ErrorCode::kInvalidArgument,
                     fmt::format("prefix cache insert: {} tokens need {} pages, got {}", tokens.size(), want_pages, pages.size()));
  }
  for (BlockId p : pages) {
    auto kind = allocator_->KindOf(p);
    if (!kind) return std::unexpected(std::move(kind).error());
    if (*kind != config_.kv_kind) return MakeError(ErrorCode::kInvalidArgument, "prefix cache insert: a page is not a KV block");
  }
  std::unordered_set<BlockId> incoming(pages.begin(), pages.end());
  if (incoming.size() != pages.size()) return MakeError(ErrorCode::kInvalidArgument, "prefix cache insert: a page is given twice");
  const bool windowed = config_.sliding_window > 0;
  if (window_pages.size() != (windowed ? pages.size() : 0)) {
    return MakeError(ErrorCode::kInvalidArgument,
                     fmt::format("prefix cache insert: {} window pages for {} pages (sliding_window {})", window_pages.size(),
                                 pages.size(), config_.sliding_window));
  }
  for (BlockId w : window_pages) {
    if (!w.valid()) continue;
    auto kind = allocator_->KindOf(w);
    if (!kind) return std::unexpected(std::move(kind).error());
    if (*kind != config_.window_kind) {
      return MakeError(ErrorCode::kInvalidArgument, "prefix cache insert: a window page is not a window block");
    }
    if (!incoming.insert(w).second) return MakeError(ErrorCode::kInvalidArgument, "prefix cache insert: a window page is given twice");
  }
  std::map<std::uint32_t, Checkpoint> at;  // position -> checkpoint
  for (const auto& c : checkpoints) {
    if (c.position == 0 || c.position > tokens.size() || !c.checkpoint.valid() || at.contains(c.position)) {
      return MakeError(ErrorCode::kInvalidArgument, fmt::format("prefix cache insert: bad checkpoint at {}", c.position));
    }
    auto ks = allocator_->KindOf(c.checkpoint.state);
    if (!ks) return std::unexpected(std::move(ks).error());
    const bool window_ok = c.checkpoint.window.valid()
                               ? config_.window_kind.valid() && allocator_->KindOf(c.checkpoint.window) == config_.window_kind
                               : true;
    if (*ks != config_.state_kind || !window_ok || owned_.contains(c.checkpoint.state) ||
        (c.checkpoint.window.valid() && owned_.contains(c.checkpoint.window))) {
      return MakeError(ErrorCode::kInvalidArgument,
                       fmt::format("prefix cache insert: the checkpoint at {} has blocks of the wrong kind or the tree's",
                                   c.position));
    }
    if (!incoming.insert(c.checkpoint.state).second ||
        (c.checkpoint.window.valid() && !incoming.insert(c.checkpoint.window).second)) {
      return MakeError(ErrorCode::kInvalidArgument, "prefix cache insert: a checkpoint block is given twice");
    }
    at.emplace(c.position, c.checkpoint);
  }
  // KV past the last checkpoint is useless to a hybrid model: keep tokens [0, n).
  const std::uint32_t n = at.empty() ? 0 : at.rbegin()->first;
  // Read-only walk: how far the tree holds these tokens (s_all; s within [0, n)), and the
  // pages it has there (which the sequence may share).
  // A host node is not walked into: when the sequence goes on through it, that host subtree
  // is removed first (below) and the sequence's pages take its place.
  std::uint32_t s_all = 0;
  std::vector<std::uint32_t> walk;
  std::uint32_t host_child = 0;
  for (std::uint32_t node = 0; s_all < tokens.size();) {
    auto it = nodes_[node].children.find(tokens[s_all]);
    if (it == nodes_[node].children.end()) break;
    const Node& c = nodes_[it->second];
    if (c.kv_on_host) {
      host_child = it->second;
      break;
    }
    std::uint32_t l = 0;
    while (l < c.tokens.size() && s_all + l < tokens.size() && c.tokens[l] == tokens[s_all + l]) ++l;
    walk.push_back(it->second);
    s_all += l;
    if (l < c.tokens.size()) break;
    node = it->second;
  }
  const std::vector<BlockId> tree_pages = PagesOfPath(walk, s_all);  // providers of [0, ceil(s_all/P))
  const std::vector<BlockId> tree_wpages = windowed ? WindowPagesOfPath(walk, s_all) : std::vector<BlockId>{};
  const std::uint32_t s = std::min(s_all, n);
  const bool head_copy = s < n && s % P != 0;
  const std::uint32_t new_from = head_copy ? s / P : CeilDiv(s, P);  // incoming pages the tree takes
  const std::uint32_t new_to = CeilDiv(n, P);
  for (std::uint32_t i = 0; i < pages.size(); ++i) {
    const bool taken = i >= new_from && i < new_to;
    const bool shared = !taken && i < tree_pages.size() && pages[i] == tree_pages[i];
    if (owned_.contains(pages[i]) && !shared) {
      return MakeError(ErrorCode::kInvalidArgument,
                       fmt::format("prefix cache insert: page {} is the tree's own page of another position", i));
    }
    if (windowed && window_pages[i].valid() && owned_.contains(window_pages[i]) &&
        (taken || i >= tree_wpages.size() || window_pages[i] != tree_wpages[i])) {
      return MakeError(ErrorCode::kInvalidArgument,
                       fmt::format("prefix cache insert: window page {} is the tree's own of another position", i));
    }
  }
  // Mutation from here on: nothing below fails.
  if (host_child != 0 && s < n) RemoveHostSubtree(host_child);
  ++clock_;
  std::vector<std::uint32_t> path;
  std::uint32_t node = 0;
  std::uint32_t pos = 0;
  while (pos < s) {
    const std::uint32_t c = nodes_[node].children.at(tokens[pos]);
    std::uint32_t cut = std::min(nodes_[c].end, s);
    if (auto t = at.upper_bound(pos); t != at.end() && t->first < cut) cut = t->first;
    node = cut < nodes_[c].end ? Split(c, cut) : c;
    pos = cut;
    path.push_back(node);
  }
  // New nodes for [s, n), one per stretch between checkpoint positions.
  while (pos < n) {
    const std::uint32_t next = at.upper_bound(pos)->first;
    const std::uint32_t id = NewNode();
    Node& c = nodes_[id];
    c.parent = node;
    c.start = pos;
    c.end = next;
    c.tokens.assign(tokens.begin() + pos, tokens.begin() + next);
    if (pos == s && head_copy) {
      c.head = pages[s / P];
      StorePage(c.head, s / P);
      if (windowed) c.whead = window_pages[s / P];
    }
    for (std::uint32_t i = CeilDiv(pos, P); i < CeilDiv(next, P); ++i) {
      c.pages.push_back(pages[i]);
      StorePage(pages[i], i);
      if (windowed) c.wpages.push_back(window_pages[i]);
    }
    for (BlockId w : {c.whead}) {
      if (w.valid()) owned_.insert(w);
    }
    for (BlockId w : c.wpages) {
      if (w.valid()) owned_.insert(w);
    }
    Update(node, [&] { nodes_[node].children.emplace(tokens[pos], id); });
    Update(id, [] {});
    node = id;
    pos = next;
    path.push_back(id);
  }
  for (std::uint32_t i = 0; i < pages.size(); ++i) {
    const bool taken = i >= new_from && i < new_to;
    const bool shared = !taken && i < tree_pages.size() && pages[i] == tree_pages[i];
    if (!taken && !shared) ULA_CHECK(allocator_->Free(pages[i]).has_value());  // a duplicate, or past n
  }
  if (windowed) {
    // A window page the tree lacks over the shared prefix [0, s) is taken when its bytes
    // serve every path that reads the provider's page: a full page inside [0, s), or the
    // page of the node ending at s when no child of that node reads it (each child has its
    // own head copy). The rest not taken above is freed.
    const std::vector<Provider> providers = ProvidersOfPath(path, s);
    bool last_page_private = s > 0 && !path.empty() && nodes_[path.back()].end == s;
    if (last_page_private) {
      for (const auto& [token, child] : nodes_[path.back()].children) {
        last_page_private &= nodes_[child].start % P != 0 && nodes_[child].head.valid();
      }
    }
    for (std::uint32_t i = 0; i < pages.size(); ++i) {
      const BlockId w = window_pages[i];
      const bool taken = i >= new_from && i < new_to;
      if (!w.valid() || taken || (i < tree_wpages.size() && w == tree_wpages[i])) continue;
      const bool adoptable = (i + 1) * P <= s || (i + 1 == CeilDiv(s, P) && last_page_private);
      if (adoptable && i < providers.size() && providers[i].node != 0) {
        const std::uint32_t owner = providers[i].node;
        BlockId& slot = WindowSlot(providers[i], i);
        if (!slot.valid()) {
          Update(owner, [&] { slot = w; });
          owned_.insert(w);
          continue;
        }
      }
      ULA_CHECK(allocator_->Free(w).has_value());
    }
  }
  for (std::uint32_t id : path) {
    Node& c = nodes_[id];
    if (auto it = at.find(c.end); it != at.end() && !c.checkpoint.valid()) {
      Update(id, [&] {
        c.checkpoint = it->second;
        if (c.host != kNoSlot) free_host_.push_back(std::exchange(c.host, kNoSlot));  // the device copy wins
      });
      owned_.insert(it->second.state);
      if (it->second.window.valid()) owned_.insert(it->second.window);
      if (config_.record_events) events_.push_back({CacheEvent::Type::kStateStored, it->second.state, c.end});
      at.erase(it);
    }
  }
  for (const auto& [position, c] : at) {  // duplicates
    ULA_CHECK(allocator_->Free(c.state).has_value());
    if (c.window.valid()) ULA_CHECK(allocator_->Free(c.window).has_value());
  }
  for (std::uint32_t id : path) Touch(id, clock_);
  ULA_EXPENSIVE_CHECK(*this);
  return Ok();
}

Result<PrefixMatch> PrefixCache::InsertChunk(std::span<const std::uint32_t> tokens, std::span<const BlockId> pages,
                                             std::span<const PositionedCheckpoint> checkpoints, const PrefixMatch& held,
                                             std::span<const BlockId> window_pages) {
  if (config_.sliding_window > 0) {
    // The tree may lack window pages over a page it shares with another branch, which the
    // request would then lose (docs/ARCHITECTURE.md): not supported yet.
    return MakeError(ErrorCode::kInvalidArgument, "prefix cache insert chunk: not supported with window pages");
  }
  auto node = LockedNode(held, false);
  if (!node) return std::unexpected(std::move(node).error());
  if (checkpoints.empty() || std::none_of(checkpoints.begin(), checkpoints.end(),
                                          [&](const auto& c) { return c.position == tokens.size(); })) {
    return MakeError(ErrorCode::kInvalidArgument, "prefix cache insert chunk: no checkpoint at the chunk's end");
  }
  if (auto w = CheckWindowLocked(held, *node); !w) return std::unexpected(std::move(w).error());
  ULA_RETURN_IF_ERROR(Insert(tokens, pages, checkpoints, window_pages));
  PrefixMatch m = Match(tokens, static_cast<std::uint32_t>(tokens.size()));
  ULA_CHECK(m.length == tokens.size());
  ULA_CHECK(Lock(m).has_value());  // before Unlock(held): nothing of the path is freed meanwhile
  ULA_CHECK(Unlock(held).has_value());
  return m;
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
        FreePage(n.head, n.start / P);
        ++stats.pages;
      }
      for (std::size_t i = 0; i < n.pages.size(); ++i) FreePage(n.pages[i], CeilDiv(n.start, P) + static_cast<std::uint32_t>(i));
      stats.pages += static_cast<std::uint32_t>(n.pages.size());
      if (n.checkpoint.valid()) ++stats.checkpoints;
      FreeCheckpoint(n.checkpoint, n.end);
      if (n.host != kNoSlot) free_host_.push_back(n.host);
      stats.tokens += n.tokens.size();
      ++stats.nodes;
      Update(parent, [&] { nodes_[parent].children.erase(n.tokens.front()); });
      n = Node{};
    });
    free_nodes_.push_back(id);
    const Node& p = nodes_[parent];
    id = parent != 0 && p.children.empty() && p.kv_locks == 0 && !p.checkpoint.valid() && p.host == kNoSlot ? parent : 0;
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

void PrefixCache::FreeWindowPages(std::uint32_t id, EvictionStats& stats) {
  Node& n = nodes_[id];
  ULA_CHECK(n.window_locks == 0);
  auto drop = [&](BlockId& b) {
    if (!b.valid()) return;
    owned_.erase(b);
    ULA_CHECK(allocator_->Free(b).has_value());
    b = BlockId::Invalid();
    ++stats.window_pages;
  };
  Update(id, [&] {
    drop(n.whead);
    for (BlockId& b : n.wpages) drop(b);
  });
}

bool PrefixCache::EvictWindow(EvictionStats& stats) {
  if (window_lru_.empty()) return false;
  if (observer_) observer_();
  const std::uint32_t id = std::get<2>(*window_lru_.begin());
  const Node& n = nodes_[id];
  if (n.children.empty() && n.kv_locks == 0) {
    RemoveLeaf(id, stats);  // a leaf without its window is useless: it goes whole
  } else {
    FreeWindowPages(id, stats);  // a window tombstone: KV and state stay
  }
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
  while (stats.checkpoints < states && EvictState(stats)) {
  }
  while (std::uint64_t{stats.window_pages} * config_.page_tokens < window_tokens && EvictWindow(stats)) {
  }
  ULA_EXPENSIVE_CHECK(*this);
  return stats;
}

}  // namespace ula
