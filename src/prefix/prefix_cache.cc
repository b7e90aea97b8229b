#include "ula/prefix_cache.h"

#include <fmt/format.h>

#include <algorithm>

#include "ula/check.h"
#include "ula/digest.h"

namespace ula {

const char* EvictionRuleName(EvictionRule rule) {
  return rule == EvictionRule::kNaive ? "naive" : "allocation_aware";
}

Status PrefixCacheConfig::Validate() const {
  if (page_tokens == 0) return MakeError(ErrorCode::kInvalidArgument, "prefix cache config: page_tokens must be > 0");
  if (!kv_kind.valid()) return MakeError(ErrorCode::kInvalidArgument, "prefix cache config: kv_kind must be set");
  if (!state_kind.valid()) return MakeError(ErrorCode::kInvalidArgument, "prefix cache config: state_kind must be set");
  return Ok();
}

PrefixCache::PrefixCache(const PrefixCacheConfig& config, HybridAllocator* allocator)
    : config_(config), allocator_(allocator) {
  nodes_.emplace_back();
  nodes_[0].live = true;
}

PrefixCache::~PrefixCache() {
  // Give every block back to the allocator.
  for (std::size_t i = 1; i < nodes_.size(); ++i) {
    Node& n = nodes_[i];
    if (!n.live) continue;
    for (std::uint32_t l = 0; l < n.locks; ++l) {
      (void)allocator_->Unpin(n.page);
      if (n.checkpoint.valid()) {
        (void)allocator_->Unpin(n.checkpoint.state);
        if (n.checkpoint.window.valid()) (void)allocator_->Unpin(n.checkpoint.window);
      }
    }
    (void)allocator_->Free(n.page);
    FreeCheckpoint(n.checkpoint);
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

void PrefixCache::FreeCheckpoint(const Checkpoint& c) {
  if (!c.valid()) return;
  ULA_CHECK(allocator_->Free(c.state).has_value());
  if (c.window.valid()) ULA_CHECK(allocator_->Free(c.window).has_value());
}

PrefixMatch PrefixCache::Match(std::span<const std::uint32_t> tokens, std::uint32_t max_length) {
  const std::uint32_t P = config_.page_tokens;
  PrefixMatch best;
  std::vector<std::uint32_t> path;
  std::vector<BlockId> pages;
  std::uint32_t node = 0;
  std::uint32_t pos = 0;
  ++clock_;
  auto record = [&](std::uint32_t id) {
    best.length = nodes_[id].end;
    best.pages = pages;
    best.path = path;
    best.checkpoint = nodes_[id].checkpoint;
  };
  while (true) {
    const Node& n = nodes_[node];
    const std::size_t left = tokens.size() - pos;
    // A partial page below this node (a leaf) that prefixes the rest and ends at a
    // checkpoint: the longest one is a candidate, beaten only by a checkpoint deeper down
    // the full-page path (which ends at pos + P or later).
    std::uint32_t best_partial = 0;
    for (const auto& [key, child] : n.children) {
      if (key.size() >= P || key.size() > left || !nodes_[child].checkpoint.valid()) continue;
      if (nodes_[child].end > max_length) continue;
      if (!std::equal(key.begin(), key.end(), tokens.begin() + pos)) continue;
      if (best_partial == 0 || key.size() > nodes_[best_partial].tokens.size()) best_partial = child;
    }
    if (best_partial != 0) {
      path.push_back(best_partial);
      pages.push_back(nodes_[best_partial].page);
      record(best_partial);
      path.pop_back();
      pages.pop_back();
    }
    std::uint32_t next = 0;
    if (left >= P && pos + P <= max_length) {
      std::vector<std::uint32_t> key(tokens.begin() + pos, tokens.begin() + pos + P);
      if (auto it = n.children.find(key); it != n.children.end()) next = it->second;
    }
    if (next == 0) break;
    node = next;
    pos = nodes_[node].end;
    path.push_back(node);
    pages.push_back(nodes_[node].page);
    if (nodes_[node].checkpoint.valid()) record(node);
  }
  for (std::uint32_t id : best.path) nodes_[id].last_use = clock_;
  return best;
}

bool PrefixCache::Holds(std::span<const std::uint32_t> tokens) const {
  const std::uint32_t P = config_.page_tokens;
  std::uint32_t node = 0;
  std::uint32_t pos = 0;
  while (pos < tokens.size()) {
    const std::size_t take = std::min<std::size_t>(P, tokens.size() - pos);
    std::vector<std::uint32_t> key(tokens.begin() + pos, tokens.begin() + pos + take);
    auto it = nodes_[node].children.find(key);
    if (it == nodes_[node].children.end()) return false;
    node = it->second;
    pos = nodes_[node].end;
  }
  return node != 0 && nodes_[node].checkpoint.valid();
}

Status PrefixCache::Lock(const PrefixMatch& match) {
  for (std::uint32_t id : match.path) {
    if (id == 0 || id >= nodes_.size() || !nodes_[id].live) {
      return MakeError(ErrorCode::kNotFound, fmt::format("prefix cache: node {} of the match is gone", id));
    }
  }
  for (std::uint32_t id : match.path) {
    Node& n = nodes_[id];
    ++n.locks;
    ULA_CHECK(allocator_->Pin(n.page).has_value());
    if (n.checkpoint.valid()) {
      ULA_CHECK(allocator_->Pin(n.checkpoint.state).has_value());
      if (n.checkpoint.window.valid()) ULA_CHECK(allocator_->Pin(n.checkpoint.window).has_value());
    }
  }
  ULA_EXPENSIVE_CHECK(*this);
  return Ok();
}

Status PrefixCache::Unlock(const PrefixMatch& match) {
  for (std::uint32_t id : match.path) {
    if (id == 0 || id >= nodes_.size() || !nodes_[id].live || nodes_[id].locks == 0) {
      return MakeError(ErrorCode::kFailedPrecondition, fmt::format("prefix cache: node {} of the match is not locked", id));
    }
  }
  for (std::uint32_t id : match.path) {
    Node& n = nodes_[id];
    --n.locks;
    ULA_CHECK(allocator_->Unpin(n.page).has_value());
    if (n.checkpoint.valid()) {
      ULA_CHECK(allocator_->Unpin(n.checkpoint.state).has_value());
      if (n.checkpoint.window.valid()) ULA_CHECK(allocator_->Unpin(n.checkpoint.window).has_value());
    }
  }
  ULA_EXPENSIVE_CHECK(*this);
  return Ok();
}

Status PrefixCache::Insert(std::span<const std::uint32_t> tokens, std::span<const BlockId> pages,
                           std::span<const PositionedCheckpoint> checkpoints) {
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
  for (const auto& c : checkpoints) {
    if (c.position == 0 || c.position > tokens.size() || !c.checkpoint.valid()) {
      return MakeError(ErrorCode::kInvalidArgument, fmt::format("prefix cache insert: bad checkpoint at {}", c.position));
    }
  }
  ++clock_;
  std::vector<std::uint32_t> path;
  std::uint32_t node = 0;
  for (std::size_t i = 0; i < pages.size(); ++i) {
    const std::size_t pos = i * P;
    const std::size_t take = std::min<std::size_t>(P, tokens.size() - pos);
    std::vector<std::uint32_t> key(tokens.begin() + pos, tokens.begin() + pos + take);
    auto it = nodes_[node].children.find(key);
    std::uint32_t child;
    if (it != nodes_[node].children.end()) {
      child = it->second;
      if (nodes_[child].page != pages[i]) ULA_CHECK(allocator_->Free(pages[i]).has_value());  // duplicate
    } else {
      child = NewNode();  // may reallocate nodes_
      Node& c = nodes_[child];
      c.parent = node;
      c.tokens = key;
      c.end = static_cast<std::uint32_t>(pos + take);
      c.page = pages[i];
      nodes_[node].children.emplace(std::move(key), child);
    }
    nodes_[child].last_use = clock_;
    path.push_back(child);
    node = child;
  }
  for (const auto& c : checkpoints) {
    auto it = std::find_if(path.begin(), path.end(), [&](std::uint32_t id) { return nodes_[id].end == c.position; });
    if (it != path.end() && !nodes_[*it].checkpoint.valid()) {
      Node& n = nodes_[*it];
      n.checkpoint = c.checkpoint;
      // A node locked by running requests keeps every block it owns pinned, as Lock would
      // have; Unlock unpins the checkpoint once per lock.
      for (std::uint32_t l = 0; l < n.locks; ++l) {
        ULA_CHECK(allocator_->Pin(c.checkpoint.state).has_value());
        if (c.checkpoint.window.valid()) ULA_CHECK(allocator_->Pin(c.checkpoint.window).has_value());
      }
    } else {
      FreeCheckpoint(c.checkpoint);  // duplicate, or not at a node boundary
    }
  }
  ULA_EXPENSIVE_CHECK(*this);
  return Ok();
}

bool PrefixCache::EvictOne(EvictionStats& stats) {
  std::uint32_t victim = 0;
  for (std::uint32_t id = 1; id < nodes_.size(); ++id) {
    const Node& n = nodes_[id];
    if (!n.live || n.locks > 0 || !n.children.empty()) continue;
    if (victim == 0 || n.last_use < nodes_[victim].last_use ||
        (n.last_use == nodes_[victim].last_use && n.end > nodes_[victim].end)) {
      victim = id;
    }
  }
  if (victim == 0) return false;
  Node& n = nodes_[victim];
  ULA_CHECK(allocator_->Free(n.page).has_value());
  ++stats.pages;
  if (n.checkpoint.valid()) ++stats.checkpoints;
  FreeCheckpoint(n.checkpoint);
  nodes_[n.parent].children.erase(n.tokens);
  n = Node{};
  free_nodes_.push_back(victim);
  ++stats.nodes;
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
  const std::uint32_t need_pages = demand.blocks[config_.kv_kind.value()];
  std::uint32_t counted_pages = rule == EvictionRule::kNaive ? FreeKvPages() : 0;
  while (true) {
    const bool kv_rule_met = rule == EvictionRule::kAllocationAware || counted_pages >= need_pages;
    if (kv_rule_met && allocator_->CanAllocate(demand)) break;
    if (!EvictOne(stats)) {
      return MakeError(ErrorCode::kResourceExhausted,
                       fmt::format("prefix cache: nothing left to evict and the demand still does not fit "
                                   "(evicted {} nodes)",
                                   stats.nodes));
    }
    ++counted_pages;  // naive: only the KV page of the leaf counts
  }
  ULA_EXPENSIVE_CHECK(*this);
  return stats;
}

std::size_t PrefixCache::num_nodes() const { return nodes_.size() - 1 - free_nodes_.size(); }

std::size_t PrefixCache::num_checkpoints() const {
  std::size_t n = 0;
  for (std::size_t i = 1; i < nodes_.size(); ++i) n += nodes_[i].live && nodes_[i].checkpoint.valid() ? 1 : 0;
  return n;
}

Status PrefixCache::CheckInvariants() const {
  const std::uint32_t P = config_.page_tokens;
  for (std::uint32_t id = 1; id < nodes_.size(); ++id) {
    const Node& n = nodes_[id];
    if (!n.live) continue;
    const Node& parent = nodes_[n.parent];
    if (!parent.live) return MakeError(ErrorCode::kInternal, fmt::format("prefix cache: node {} has a dead parent", id));
    auto it = parent.children.find(n.tokens);
    if (it == parent.children.end() || it->second != id) {
      return MakeError(ErrorCode::kInternal, fmt::format("prefix cache: node {} is not keyed by its parent", id));
    }
    if (n.tokens.empty() || n.tokens.size() > P || n.end != parent.end + n.tokens.size() ||
        (n.parent != 0 && parent.tokens.size() != P)) {
      return MakeError(ErrorCode::kInternal, fmt::format("prefix cache: node {} has a bad span", id));
    }
    auto kind = allocator_->KindOf(n.page);
    if (!kind || *kind != config_.kv_kind) {
      return MakeError(ErrorCode::kInternal, fmt::format("prefix cache: node {} owns no live KV page", id));
    }
    if (n.parent != 0 && parent.locks < n.locks) {
      return MakeError(ErrorCode::kInternal, fmt::format("prefix cache: node {} is locked more than its parent", id));
    }
  }
  return Ok();
}


std::uint64_t PrefixCache::DebugDigest() const {
  StateDigest d;
  for (const Node& n : nodes_) {
    d.Add(n.live);
    if (!n.live) continue;
    for (std::uint64_t v : {std::uint64_t{n.parent}, std::uint64_t{n.end}, std::uint64_t{n.page.value()},
                            std::uint64_t{n.checkpoint.state.value()}, std::uint64_t{n.checkpoint.window.value()},
                            std::uint64_t{n.locks}, n.last_use}) {
      d.Add(v);
    }
    d.AddAll(std::span<const std::uint32_t>(n.tokens));
    for (const auto& [key, child] : n.children) d.Add(child);
  }
  d.AddAll(std::span<const std::uint32_t>(free_nodes_));
  d.Add(clock_);
  return d.value();
}

}  // namespace ula
