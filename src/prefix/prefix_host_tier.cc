// PrefixCache: the host tier (checkpoints and KV pages offloaded to host slots, and brought
// back), copy first, publish after the fence (see include/ula/prefix_cache.h).
#include "ula/prefix_cache.h"

#include <fmt/format.h>

#include <algorithm>
#include <utility>
#include <vector>

#include "prefix/prefix_cache_update.h"
#include "prefix/tree_util.h"
#include "ula/check.h"

namespace ula {

using internal::CeilDiv;

Status PrefixCache::AttachHostTier(const HostTierConfig& config) {
  if (host_.backend != nullptr) return MakeError(ErrorCode::kFailedPrecondition, "prefix cache: a host tier is attached already");
  if (config.backend == nullptr || config.slots == 0) {
    return MakeError(ErrorCode::kInvalidArgument, "prefix cache host tier: needs a backend and at least one slot");
  }
  if (stateless()) return MakeError(ErrorCode::kInvalidArgument, "prefix cache host tier: holds checkpoints, and the cache has no state kind");
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
  if (!copied) return false;  // nothing published: the checkpoint stays on device
  free_host_.pop_back();
  Update(id, [&] {
    n.host = slot;
    n.host_window = c.window.valid();
    FreeCheckpoint(c, n.end);
    n.checkpoint = Checkpoint{};
  });
  RecordState(CacheEvent::Type::kStateStored, BlockId::Invalid(), n.end, EventMedium::kHost);
  return true;
}

void PrefixCache::DropHost(std::uint32_t id, EvictionStats& stats) {
  Node& n = nodes_[id];
  RecordState(CacheEvent::Type::kStateRemoved, BlockId::Invalid(), n.end, EventMedium::kHost);
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
      FreePage(n.head, n.start / P, n.head_hash);
      n.head = BlockId::Invalid();
      n.host_head = slots.back();
    }
    n.host_pages.assign(slots.begin(), slots.begin() + static_cast<std::ptrdiff_t>(n.pages.size()));
    for (std::size_t i = 0; i < n.pages.size(); ++i) {
      FreePage(n.pages[i], CeilDiv(n.start, P) + static_cast<std::uint32_t>(i), n.hashes.empty() ? 0 : n.hashes[i]);
      n.pages[i] = BlockId::Invalid();
    }
    n.kv_on_host = true;
  });
  RecordNodePages(id, CacheEvent::Type::kPageStored, EventMedium::kHost);
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
  RecordNodePages(id, CacheEvent::Type::kPageRemoved, EventMedium::kHost);
  if (n.host != kNoSlot) RecordState(CacheEvent::Type::kStateRemoved, BlockId::Invalid(), n.end, EventMedium::kHost);
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
    auto store = [&](std::uint32_t a, BlockId page, std::uint32_t index, std::uint64_t hash) {
      StorePage(page, index, hash, ParentHashOnPath(a, index),
                config_.record_events ? PageTokens(a, index) : std::vector<std::uint32_t>{});
    };
    for (std::uint32_t a : host_path) {
      Node& h = nodes_[a];
      RecordNodePages(a, CacheEvent::Type::kPageRemoved, EventMedium::kHost);
      Update(a, [&] {
        for (std::size_t i = 0; i < h.pages.size(); ++i) {
          h.pages[i] = pages[next++];
          store(a, h.pages[i], CeilDiv(h.start, P) + static_cast<std::uint32_t>(i), h.hashes.empty() ? 0 : h.hashes[i]);
          free_host_pages_.push_back(h.host_pages[i]);
        }
        if (h.host_head != kNoSlot) {
          h.head = pages[next++];
          store(a, h.head, h.start / P, h.head_hash);
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
  RecordState(CacheEvent::Type::kStateRemoved, BlockId::Invalid(), n.end, EventMedium::kHost);
  RecordState(CacheEvent::Type::kStateStored, c.state, n.end, EventMedium::kDevice);
  ++host_hits_;
  return Ok();
}

void PrefixCache::RecordNodePages(std::uint32_t id, CacheEvent::Type type, EventMedium medium) {
  if (!config_.record_events) return;
  const Node& n = nodes_[id];
  const std::uint32_t P = config_.page_tokens;
  const bool store = type == CacheEvent::Type::kPageStored;
  auto one = [&](BlockId b, std::uint32_t index, std::uint64_t hash) {
    if (store) {
      RecordStored(type, b, index, hash, ParentHashOnPath(id, index), PageTokens(id, index), medium);
    } else {
      RecordRemoved(type, b, index, hash, medium);
    }
  };
  if (n.start % P != 0 && (n.head.valid() || n.host_head != kNoSlot)) one(n.head, n.start / P, n.head_hash);
  for (std::size_t i = 0; i < n.hashes.size(); ++i) {
    one(i < n.pages.size() ? n.pages[i] : BlockId::Invalid(), CeilDiv(n.start, P) + static_cast<std::uint32_t>(i), n.hashes[i]);
  }
}

bool PrefixCache::HoldsOnHost(std::span<const std::uint32_t> tokens) const {
  const std::uint32_t id = NodeAt(tokens, static_cast<std::uint32_t>(tokens.size()));
  return id != 0 && nodes_[id].host != kNoSlot;
}

bool PrefixCache::KvOnHost(std::span<const std::uint32_t> tokens) const {
  const std::uint32_t id = NodeAt(tokens, static_cast<std::uint32_t>(tokens.size()));
  return id != 0 && nodes_[id].kv_on_host;
}

}  // namespace ula
