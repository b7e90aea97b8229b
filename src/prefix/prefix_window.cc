// PrefixCache: sliding-window pages (a checkpoint's window, window locks, ReleaseWindow and
// window eviction; see include/ula/prefix_cache.h).
#include "ula/prefix_cache.h"

#include <fmt/format.h>

#include <algorithm>
#include <vector>

#include "prefix/prefix_cache_update.h"
#include "prefix/tree_util.h"
#include "ula/check.h"

namespace ula {

std::uint32_t PrefixCache::WindowFirstPage(std::uint32_t length) const {
  const std::uint32_t need = config_.sliding_window - 1;  // tokens before `length` the next token attends to
  return length > need ? (length - need) / config_.page_tokens : 0;
}

std::uint32_t PrefixCache::WindowCut(std::uint32_t length) const {
  if (config_.sliding_window == 0) return 0;
  const std::uint32_t cut = WindowFirstPage(length) * config_.page_tokens;
  return cut < length ? cut : 0;
}

bool PrefixCache::HasWindow(const std::vector<std::uint32_t>& path, std::uint32_t length) const {
  if (config_.sliding_window == 0) return true;
  const std::vector<BlockId> w = WindowPagesOfPath(path, length);
  for (std::size_t i = WindowFirstPage(length); i < w.size(); ++i) {
    if (!w[i].valid()) return false;
  }
  return true;
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

void PrefixCache::FreeWindowPages(std::uint32_t id, EvictionStats& stats) {
  Node& n = nodes_[id];
  ULA_CHECK(n.window_locks == 0);
  const std::uint32_t P = config_.page_tokens;
  auto drop = [&](BlockId& b, std::uint32_t index, std::uint64_t hash) {
    if (!b.valid()) return;
    owned_.erase(b);
    ULA_CHECK(allocator_->Free(b).has_value());
    RecordRemoved(CacheEvent::Type::kWindowRemoved, b, index, hash);
    b = BlockId::Invalid();
    ++stats.window_pages;
  };
  Update(id, [&] {
    drop(n.whead, n.start / P, n.head_hash);
    for (std::size_t i = 0; i < n.wpages.size(); ++i) {
      drop(n.wpages[i], internal::CeilDiv(n.start, P) + static_cast<std::uint32_t>(i), n.hashes.empty() ? 0 : n.hashes[i]);
    }
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

}  // namespace ula
