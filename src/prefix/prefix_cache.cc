// PrefixCache: the tree (nodes, spans, splits, the pages a path provides) and Match (see
// include/ula/prefix_cache.h).
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

const char* EvictionRuleName(EvictionRule rule) {
  return rule == EvictionRule::kNaive ? "naive" : "allocation_aware";
}

Status PrefixCacheConfig::Validate() const {
  if (page_tokens == 0) return MakeError(ErrorCode::kInvalidArgument, "prefix cache config: page_tokens must be > 0");
  if (!kv_kind.valid()) return MakeError(ErrorCode::kInvalidArgument, "prefix cache config: kv_kind must be set");
  if (!state_kind.valid() && sliding_window == 0) {
    return MakeError(ErrorCode::kInvalidArgument,
                     "prefix cache config: state_kind must be set (unset only with window pages: no recurrent layer)");
  }
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

// On a path (one touch, one clock) ties go to the root side, as SGLang's LRU lists order a
// path (a child is more recent than its parent): internal states and windows are tombstoned
// before the leaf's.
PrefixCache::LruKey PrefixCache::KeyOf(std::uint32_t id) const {
  return {nodes_[id].last_use, nodes_[id].end, id};  // on a tie, the root side first (as SGLang)
}

PrefixCache::LruKey PrefixCache::WindowKeyOf(std::uint32_t id) const {
  return {nodes_[id].window_use, nodes_[id].end, id};
}

void PrefixCache::Touch(std::uint32_t id, std::uint64_t clock) {
  Update(id, [&] {
    nodes_[id].last_use = clock;
    if (config_.window_recency == WindowRecency::kPath) nodes_[id].window_use = clock;
  });
}

void PrefixCache::TouchWindowCushion(const std::vector<std::uint32_t>& path, std::uint64_t clock) {
  if (config_.sliding_window == 0 || config_.window_recency != WindowRecency::kCushion) return;
  const std::uint64_t cushion = std::uint64_t{config_.sliding_window} - 1 + config_.page_tokens;
  std::uint64_t covered = 0;
  for (auto it = path.rbegin(); it != path.rend() && covered < cushion; ++it) {
    Update(*it, [&] { nodes_[*it].window_use = clock; });
    covered += nodes_[*it].tokens.size();
  }
}

void PrefixCache::RecordStored(CacheEvent::Type type, BlockId block, std::uint32_t index, std::uint64_t hash,
                               ParentHash parent, std::span<const std::uint32_t> tokens, EventMedium medium) {
  if (!config_.record_events) return;
  CacheEvent e{.type = type, .block = medium == EventMedium::kDevice ? block : BlockId::Invalid(),
               .position = index * config_.page_tokens, .hash = static_cast<std::int64_t>(hash)};
  if (parent) e.parent_hash = static_cast<std::int64_t>(*parent);
  e.tokens.assign(tokens.begin(), tokens.end());
  e.medium = medium;
  events_.push_back(std::move(e));
}

void PrefixCache::RecordRemoved(CacheEvent::Type type, BlockId block, std::uint32_t index, std::uint64_t hash,
                                EventMedium medium) {
  if (!config_.record_events) return;
  CacheEvent e{.type = type, .block = medium == EventMedium::kDevice ? block : BlockId::Invalid(),
               .position = index * config_.page_tokens, .hash = static_cast<std::int64_t>(hash)};
  e.medium = medium;
  events_.push_back(std::move(e));
}

void PrefixCache::RecordState(CacheEvent::Type type, BlockId state, std::uint32_t position, EventMedium medium) {
  if (!config_.record_events) return;
  CacheEvent e{.type = type, .block = medium == EventMedium::kDevice ? state : BlockId::Invalid(), .position = position};
  e.medium = medium;
  events_.push_back(std::move(e));
}

void PrefixCache::StorePage(BlockId page, std::uint32_t index, std::uint64_t hash, ParentHash parent,
                            std::span<const std::uint32_t> tokens) {
  owned_.insert(page);
  RecordStored(CacheEvent::Type::kPageStored, page, index, hash, parent, tokens);
}

void PrefixCache::FreePage(BlockId page, std::uint32_t index, std::uint64_t hash) {
  owned_.erase(page);
  ULA_CHECK(allocator_->Free(page).has_value());
  RecordRemoved(CacheEvent::Type::kPageRemoved, page, index, hash);
}

std::uint64_t PrefixCache::PageHashOnPath(std::uint32_t node, std::uint32_t index) const {
  const std::uint32_t P = config_.page_tokens;
  for (std::uint32_t a = node; a != 0; a = nodes_[a].parent) {  // the deepest provider first
    const Node& n = nodes_[a];
    const std::uint32_t first = CeilDiv(n.start, P);
    if (index >= first && index - first < n.hashes.size()) return n.hashes[index - first];
    if (index == n.start / P && n.start % P != 0 && (n.head.valid() || n.host_head != kNoSlot)) return n.head_hash;
  }
  return 0;
}

PrefixCache::ParentHash PrefixCache::ParentHashOnPath(std::uint32_t node, std::uint32_t index) const {
  if (index == 0) return std::nullopt;
  return PageHashOnPath(node, index - 1);
}

std::vector<std::uint32_t> PrefixCache::PageTokens(std::uint32_t node, std::uint32_t index) const {
  const std::uint32_t P = config_.page_tokens;
  const Node& n = nodes_[node];
  std::vector<std::uint32_t> tokens = PathTokens(node);
  if (n.end % P != 0 && index == (n.end - 1) / P) tokens.insert(tokens.end(), n.tail.begin(), n.tail.end());
  const std::size_t from = std::min<std::size_t>(tokens.size(), std::size_t{index} * P);
  return {tokens.begin() + static_cast<std::ptrdiff_t>(from),
          tokens.begin() + static_cast<std::ptrdiff_t>(std::min<std::size_t>(tokens.size(), from + P))};
}

bool PrefixCache::ProvidesLastPage(const Node& n) const {
  const std::uint32_t P = config_.page_tokens;
  if (n.end % P == 0) return false;
  const std::uint32_t last = (n.end - 1) / P;
  return (!n.pages.empty() && CeilDiv(n.start, P) + n.pages.size() - 1 == last) ||
         ((n.head.valid() || n.host_head != kNoSlot) && n.start / P == last);
}

std::vector<std::uint32_t> PrefixCache::PathTokens(std::uint32_t node) const {
  std::vector<std::uint32_t> tokens;
  for (std::uint32_t id : internal::PathTo(node, nodes_)) tokens.insert(tokens.end(), nodes_[id].tokens.begin(), nodes_[id].tokens.end());
  return tokens;
}

void PrefixCache::FreeCheckpoint(const Checkpoint& c, std::uint32_t position) {
  if (!c.valid()) return;
  for (BlockId b : {c.state, c.window}) {
    if (!b.valid()) continue;
    owned_.erase(b);
    ULA_CHECK(allocator_->Free(b).has_value());
  }
  RecordState(CacheEvent::Type::kStateRemoved, c.state, position, EventMedium::kDevice);
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
  m.head_hash = n.head_hash;
  if (!n.hashes.empty()) m.hashes.assign(n.hashes.begin(), n.hashes.begin() + upper_pages);
  if (!n.wpages.empty()) m.wpages.assign(n.wpages.begin(), n.wpages.begin() + upper_pages);
  m.whead = n.whead;
  m.kv_locks = n.kv_locks;
  m.last_use = n.last_use;
  m.window_use = n.window_use;
  if (config_.record_events && ProvidesLastPage(m)) {  // the page the cut leaves the upper half holds the rest
    const std::uint32_t page_end = CeilDiv(at, P) * P;
    m.tail.assign(n.tokens.begin() + cut, n.tokens.begin() + (std::min(page_end, n.end) - n.start));
    if (page_end > n.end) m.tail.insert(m.tail.end(), n.tail.begin(), n.tail.end());
  }
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
    if (!n.hashes.empty()) n.hashes.erase(n.hashes.begin(), n.hashes.begin() + upper_pages);
    n.head = BlockId::Invalid();
    n.head_hash = 0;
    if (!n.wpages.empty()) n.wpages.erase(n.wpages.begin(), n.wpages.begin() + upper_pages);
    n.whead = BlockId::Invalid();
    n.start = at;
    n.parent = upper;
    n.last_use = clock_;  // the lower half is refreshed (SGLang's _split_node)
    n.window_use = clock_;
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

PrefixMatch PrefixCache::Match(std::span<const std::uint32_t> tokens, std::uint32_t max_length) {
  PrefixMatch best;
  std::vector<std::uint32_t> path;
  std::size_t best_depth = 0;
  std::uint32_t node = 0;
  std::uint32_t pos = 0;
  std::uint32_t kv_length = 0;
  bool on_device = true;
  std::uint32_t partial = 0;  // the node the walk ended inside (0: none)
  while (pos < tokens.size()) {
    auto it = nodes_[node].children.find(tokens[pos]);
    if (it == nodes_[node].children.end()) break;
    const Node& c = nodes_[it->second];
    const std::size_t limit = std::min<std::size_t>(c.tokens.size(), tokens.size() - pos);
    std::size_t l = 0;
    while (l < limit && c.tokens[l] == tokens[pos + l]) ++l;
    if (l < c.tokens.size()) {
      pos += static_cast<std::uint32_t>(l);
      if (l > 0 && on_device && !c.kv_on_host) partial = it->second;
      break;
    }
    node = it->second;
    pos = c.end;
    path.push_back(node);
    on_device = on_device && !c.kv_on_host;  // host nodes only below device ones
    // Without a recurrent kind any node boundary whose window is present is reusable.
    const bool resumable = c.checkpoint.valid() || stateless();
    const bool usable = c.end <= max_length && (resumable || c.host != kNoSlot) && HasWindow(path, c.end);
    if (usable && on_device && resumable) best_depth = path.size();
    if (usable) best.host_length = c.end;
  }
  kv_length = pos;
  // Without a recurrent kind a match may end inside a node (where the query diverges, or at
  // max_length): when the window of that point is present, the node is split there and the
  // match ends at the split (SGLang's _match_prefix_helper). With one, a split would give a
  // tombstone (no checkpoint there), so nothing is split.
  if (stateless()) {
    const std::uint32_t e = std::min(kv_length, max_length);
    std::size_t depth = 0;
    while (depth < path.size() && nodes_[path[depth]].end <= e) ++depth;
    const std::uint32_t x = depth < path.size() ? path[depth] : partial;
    if (x != 0 && nodes_[x].start < e && e < nodes_[x].end && !nodes_[x].kv_on_host) {
      std::vector<std::uint32_t> upto(path.begin(), path.begin() + static_cast<std::ptrdiff_t>(depth));
      upto.push_back(x);
      if (HasWindow(upto, e)) {
        upto.back() = Split(x, e);
        path = std::move(upto);
        best_depth = path.size();
        best.host_length = std::max(best.host_length, e);
      }
    }
  }
  ++clock_;
  path.resize(best_depth);
  for (std::uint32_t id : path) Touch(id, clock_);
  TouchWindowCushion(path, clock_);
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
  if (node == 0) return false;
  return stateless() ? HasWindow(internal::PathTo(node, nodes_), nodes_[node].end) : nodes_[node].checkpoint.valid();
}

}  // namespace ula
