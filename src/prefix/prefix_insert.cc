// PrefixCache: Insert (the tree takes a sequence's blocks) and InsertChunk (chunked prefill;
// see include/ula/prefix_cache.h).
#include "ula/prefix_cache.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "prefix/prefix_cache_update.h"
#include "prefix/tree_util.h"
#include "ula/check.h"

namespace ula {

using internal::CeilDiv;

Result<std::unordered_set<BlockId>> PrefixCache::CheckInsertBlocks(std::span<const BlockId> pages,
                                                                     std::span<const BlockId> window_pages) const {
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
  return incoming;
}

Result<std::map<std::uint32_t, Checkpoint>> PrefixCache::CheckInsertCheckpoints(
    std::size_t tokens, std::span<const PositionedCheckpoint> checkpoints, std::unordered_set<BlockId>& incoming) const {
  std::map<std::uint32_t, Checkpoint> at;  // position -> checkpoint
  if (stateless() && !checkpoints.empty()) {
    return MakeError(ErrorCode::kInvalidArgument, "prefix cache insert: checkpoints given to a cache without a state kind");
  }
  for (const auto& c : checkpoints) {
    if (c.position == 0 || c.position > tokens || !c.checkpoint.valid() || at.contains(c.position)) {
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
  return at;
}

Result<PrefixCache::InsertPlan> PrefixCache::PlanInsert(std::span<const std::uint32_t> tokens,
                                                        std::span<const BlockId> pages,
                                                        std::span<const PositionedCheckpoint> checkpoints,
                                                        std::span<const BlockId> window_pages,
                                                        bool drop_tail) const {
  const std::uint32_t P = config_.page_tokens;
  auto incoming = CheckInsertBlocks(pages, window_pages);
  if (!incoming) return std::unexpected(std::move(incoming).error());
  auto at = CheckInsertCheckpoints(tokens.size(), checkpoints, *incoming);
  if (!at) return std::unexpected(std::move(at).error());
  const bool windowed = config_.sliding_window > 0;
  InsertPlan plan;
  plan.at = std::move(*at);
  if (drop_tail) {  // SGLang's finished request: no checkpoint, hence no KV, off a page boundary
    for (auto it = plan.at.begin(); it != plan.at.end();) {
      if (it->first % P == 0) {
        ++it;
        continue;
      }
      plan.dropped.push_back(it->second);
      it = plan.at.erase(it);
    }
  }
  // KV past the last checkpoint is useless to a hybrid model: keep tokens [0, n). Without a
  // recurrent kind every token is kept (a match may end at any node boundary), up to the
  // last page boundary with drop_tail.
  const auto all = static_cast<std::uint32_t>(tokens.size());
  plan.n = stateless() ? (drop_tail ? all / P * P : all) : plan.at.empty() ? 0 : plan.at.rbegin()->first;
  // Read-only walk: how far the tree holds these tokens (s_all; s within [0, n)), and the
  // pages it has there (which the sequence may share).
  // A host node is not walked into: when the sequence goes on through it, that host subtree
  // is removed first (Insert) and the sequence's pages take its place.
  std::uint32_t s_all = 0;
  std::vector<std::uint32_t> walk;
  for (std::uint32_t node = 0; s_all < tokens.size();) {
    auto it = nodes_[node].children.find(tokens[s_all]);
    if (it == nodes_[node].children.end()) break;
    const Node& c = nodes_[it->second];
    if (c.kv_on_host) {
      plan.host_child = it->second;
      break;
    }
    std::uint32_t l = 0;
    while (l < c.tokens.size() && s_all + l < tokens.size() && c.tokens[l] == tokens[s_all + l]) ++l;
    walk.push_back(it->second);
    s_all += l;
    if (l < c.tokens.size()) break;
    node = it->second;
  }
  plan.tree_pages = PagesOfPath(walk, s_all);  // providers of [0, ceil(s_all/P))
  if (windowed) plan.tree_wpages = WindowPagesOfPath(walk, s_all);
  plan.s = std::min(s_all, plan.n);
  plan.head_copy = plan.s < plan.n && plan.s % P != 0;
  for (std::uint32_t id : walk) {  // the node whose span ends the shared prefix
    const Node& c = nodes_[id];
    if (plan.s == 0 || c.start >= plan.s || c.end < plan.s) continue;
    plan.last_page_private = c.end == plan.s;  // a split at s leaves the lower half reading the page
    for (const auto& [token, child] : c.children) {
      plan.last_page_private &= nodes_[child].start % P != 0 && nodes_[child].head.valid();
    }
  }
  plan.new_from = plan.head_copy ? plan.s / P : CeilDiv(plan.s, P);
  plan.new_to = CeilDiv(plan.n, P);
  for (std::uint32_t i = 0; i < pages.size(); ++i) {
    if (owned_.contains(pages[i]) && !plan.Shared(i, pages[i])) {
      return MakeError(ErrorCode::kInvalidArgument,
                       fmt::format("prefix cache insert: page {} is the tree's own page of another position", i));
    }
    if (windowed && window_pages[i].valid() && owned_.contains(window_pages[i]) &&
        (plan.Taken(i) || i >= plan.tree_wpages.size() || window_pages[i] != plan.tree_wpages[i])) {
      return MakeError(ErrorCode::kInvalidArgument,
                       fmt::format("prefix cache insert: window page {} is the tree's own of another position", i));
    }
  }
  return plan;
}

std::vector<std::uint32_t> PrefixCache::InsertPath(std::span<const std::uint32_t> tokens, std::span<const BlockId> pages,
                                                   std::span<const BlockId> window_pages, const InsertPlan& plan) {
  const std::uint32_t P = config_.page_tokens;
  const bool windowed = config_.sliding_window > 0;
  std::vector<std::uint32_t> path;
  std::uint32_t node = 0;
  std::uint32_t pos = 0;
  // record_events: the chained page hashes of tokens [0, n) and each page's tokens.
  const std::vector<std::uint64_t> hashes =
      config_.record_events ? internal::PageHashes(tokens.first(plan.n), P, config_.event_hash) : std::vector<std::uint64_t>{};
  auto hash = [&](std::uint32_t i) { return i < hashes.size() ? hashes[i] : 0; };
  auto parent = [&](std::uint32_t i) { return i > 0 ? ParentHash(hash(i - 1)) : std::nullopt; };
  auto page_tokens = [&](std::uint32_t i) { return tokens.subspan(i * P, std::min(P, plan.n - i * P)); };
  auto store = [&](BlockId page, BlockId window, std::uint32_t i) {
    StorePage(page, i, hash(i), parent(i), page_tokens(i));
    if (window.valid()) RecordStored(CacheEvent::Type::kWindowStored, window, i, hash(i), parent(i), page_tokens(i));
  };
  // The window boundary of the sequence's end (0: none) is a cut too, so that a lock at n
  // window-locks a node holding only the pages of its window (SGLang's split of a leaf at the
  // window on insert): the window pages before it stay evictable (window tombstones).
  const std::uint32_t window_cut = WindowCut(plan.n);
  auto cut_before = [&](std::uint32_t from, std::uint32_t end) {
    std::uint32_t cut = end;
    if (auto t = plan.at.upper_bound(from); t != plan.at.end() && t->first < cut) cut = t->first;
    if (window_cut > from && window_cut < cut) cut = window_cut;
    return cut;
  };
  while (pos < plan.s) {  // down the shared prefix, splitting at its end, checkpoints and the window
    const std::uint32_t c = nodes_[node].children.at(tokens[pos]);
    const std::uint32_t cut = cut_before(pos, std::min(nodes_[c].end, plan.s));
    node = cut < nodes_[c].end ? Split(c, cut) : c;
    pos = cut;
    path.push_back(node);
  }
  // New nodes for [s, n), one per stretch between cuts (checkpoint positions, the window's).
  while (pos < plan.n) {
    const std::uint32_t next = cut_before(pos, plan.n);
    const std::uint32_t id = NewNode();
    Node& c = nodes_[id];
    c.parent = node;
    c.start = pos;
    c.end = next;
    c.tokens.assign(tokens.begin() + pos, tokens.begin() + next);
    if (pos == plan.s && plan.head_copy) {
      c.head = pages[plan.s / P];
      if (windowed) c.whead = window_pages[plan.s / P];
      store(c.head, c.whead, plan.s / P);
      if (config_.record_events) c.head_hash = hash(plan.s / P);
    }
    for (std::uint32_t i = CeilDiv(pos, P); i < CeilDiv(next, P); ++i) {
      c.pages.push_back(pages[i]);
      if (windowed) c.wpages.push_back(window_pages[i]);
      store(pages[i], windowed ? window_pages[i] : BlockId::Invalid(), i);
      if (config_.record_events) c.hashes.push_back(hash(i));
    }
    if (config_.record_events && ProvidesLastPage(c)) {  // the page holds tokens past `next` (the next node's)
      c.tail.assign(tokens.begin() + next, tokens.begin() + std::min(CeilDiv(next, P) * P, plan.n));
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
  return path;
}

void PrefixCache::AdoptWindowPages(const std::vector<std::uint32_t>& path, std::span<const std::uint32_t> tokens,
                                   std::span<const BlockId> window_pages, const InsertPlan& plan) {
  // A window page the tree lacks over the shared prefix [0, s) is taken when its bytes
  // serve every path that reads the provider's page: a full page inside [0, s), or the
  // page of the node ending at s when no child of that node reads it (each child has its
  // own head copy). The rest not taken by InsertPath is freed.
  const std::uint32_t P = config_.page_tokens;
  const std::vector<Provider> providers = ProvidersOfPath(path, plan.s);
  for (std::uint32_t i = 0; i < window_pages.size(); ++i) {
    const BlockId w = window_pages[i];
    if (!w.valid() || plan.Taken(i) || (i < plan.tree_wpages.size() && w == plan.tree_wpages[i])) continue;
    if (plan.Adoptable(i, P) && i < providers.size() && providers[i].node != 0) {
      const std::uint32_t owner = providers[i].node;
      BlockId& slot = WindowSlot(providers[i], i);
      if (!slot.valid()) {
        Update(owner, [&] { slot = w; });
        owned_.insert(w);
        if (config_.record_events) {  // the KV page's hash, over the tokens that page holds
          RecordStored(CacheEvent::Type::kWindowStored, w, i, PageHashOnPath(owner, i), ParentHashOnPath(owner, i),
                       PageTokens(owner, i));
        }
        continue;
      }
    }
    ULA_CHECK(allocator_->Free(w).has_value());
  }
}

void PrefixCache::AttachCheckpoints(const std::vector<std::uint32_t>& path, std::map<std::uint32_t, Checkpoint>& at) {
  for (std::uint32_t id : path) {
    Node& c = nodes_[id];
    if (auto it = at.find(c.end); it != at.end() && !c.checkpoint.valid()) {
      Update(id, [&] {
        c.checkpoint = it->second;
        if (c.host != kNoSlot) {  // the device copy wins
          RecordState(CacheEvent::Type::kStateRemoved, BlockId::Invalid(), c.end, EventMedium::kHost);
          free_host_.push_back(std::exchange(c.host, kNoSlot));
        }
      });
      owned_.insert(it->second.state);
      if (it->second.window.valid()) owned_.insert(it->second.window);
      RecordState(CacheEvent::Type::kStateStored, it->second.state, c.end, EventMedium::kDevice);
      at.erase(it);
    }
  }
  for (const auto& [position, c] : at) {  // duplicates
    ULA_CHECK(allocator_->Free(c.state).has_value());
    if (c.window.valid()) ULA_CHECK(allocator_->Free(c.window).has_value());
  }
}

Result<std::uint32_t> PrefixCache::Insert(std::span<const std::uint32_t> tokens, std::span<const BlockId> pages,
                                          std::span<const PositionedCheckpoint> checkpoints,
                                          std::span<const BlockId> window_pages) {
  return InsertSequence(tokens, pages, checkpoints, window_pages, config_.unaligned_tail == UnalignedTail::kDrop);
}

Result<std::uint32_t> PrefixCache::InsertSequence(std::span<const std::uint32_t> tokens, std::span<const BlockId> pages,
                                                  std::span<const PositionedCheckpoint> checkpoints,
                                                  std::span<const BlockId> window_pages, bool drop_tail) {
  const std::uint32_t P = config_.page_tokens;
  const std::size_t want_pages = (tokens.size() + P - 1) / P;
  if (pages.size() != want_pages) {
    return MakeError(ErrorCode::kInvalidArgument,
                     fmt::format("prefix cache insert: {} tokens need {} pages, got {}", tokens.size(), want_pages, pages.size()));
  }
  auto plan = PlanInsert(tokens, pages, checkpoints, window_pages, drop_tail);
  if (!plan) return std::unexpected(std::move(plan).error());
  // Mutation from here on: nothing below fails.
  if (plan->host_child != 0 && plan->s < plan->n) RemoveHostSubtree(plan->host_child);
  ++clock_;
  const std::vector<std::uint32_t> path = InsertPath(tokens, pages, window_pages, *plan);
  for (std::uint32_t i = 0; i < pages.size(); ++i) {
    if (!plan->Taken(i) && !plan->Shared(i, pages[i])) ULA_CHECK(allocator_->Free(pages[i]).has_value());  // a duplicate, or past n
  }
  if (config_.sliding_window > 0) AdoptWindowPages(path, tokens, window_pages, *plan);
  AttachCheckpoints(path, plan->at);
  for (const Checkpoint& c : plan->dropped) {  // drop_tail: off a page boundary
    ULA_CHECK(allocator_->Free(c.state).has_value());
    if (c.window.valid()) ULA_CHECK(allocator_->Free(c.window).has_value());
  }
  for (std::uint32_t id : path) {
    Touch(id, clock_);
    // SGLang's window LRU: the walk down refreshes no ancestor, the nodes it adds are new.
    if (config_.window_recency == WindowRecency::kCushion && nodes_[id].start >= plan->s) {
      Update(id, [&] { nodes_[id].window_use = clock_; });
    }
  }
  ULA_EXPENSIVE_CHECK(*this);
  return plan->s;
}

Status PrefixCache::CheckChunkWindow(std::span<const std::uint32_t> tokens, std::span<const BlockId> pages,
                                     std::span<const PositionedCheckpoint> checkpoints,
                                     std::span<const BlockId> window_pages) const {
  if (pages.size() != CeilDiv(static_cast<std::uint32_t>(tokens.size()), config_.page_tokens)) return Ok();  // Insert refuses it
  auto plan = PlanInsert(tokens, pages, checkpoints, window_pages, false);
  if (!plan) return std::unexpected(std::move(plan).error());
  // The request resumes at the chunk's end: every window page it attends to from there must
  // be the tree's after the insert (its own taken or adopted, or the tree's already).
  const auto n = static_cast<std::uint32_t>(tokens.size());
  for (std::uint32_t i = WindowFirstPage(n); i < pages.size(); ++i) {
    const bool own = window_pages[i].valid();
    const bool tree_has = !plan->Taken(i) && i < plan->tree_wpages.size() && plan->tree_wpages[i].valid();
    if (tree_has || (own && (plan->Taken(i) || plan->Adoptable(i, config_.page_tokens)))) continue;
    if (!own) {
      return MakeError(ErrorCode::kInvalidArgument,
                       fmt::format("prefix cache insert chunk: window page {} is in the window of the chunk's end "
                                   "and was released",
                                   i));
    }
    return MakeError(ErrorCode::kFailedPrecondition,
                     fmt::format("prefix cache insert chunk: the tree lacks window page {}, a page it shares with "
                                 "another branch (the request's copy cannot serve both)",
                                 i));
  }
  return Ok();
}

Result<PrefixMatch> PrefixCache::InsertChunk(std::span<const std::uint32_t> tokens, std::span<const BlockId> pages,
                                             std::span<const PositionedCheckpoint> checkpoints, const PrefixMatch& held,
                                             std::span<const BlockId> window_pages) {
  auto node = LockedNode(held, false);
  if (!node) return std::unexpected(std::move(node).error());
  if (!stateless() && (checkpoints.empty() || std::none_of(checkpoints.begin(), checkpoints.end(),
                                                            [&](const auto& c) { return c.position == tokens.size(); }))) {
    return MakeError(ErrorCode::kInvalidArgument, "prefix cache insert chunk: no checkpoint at the chunk's end");
  }
  if (auto w = CheckWindowLocked(held, *node); !w) return std::unexpected(std::move(w).error());
  if (config_.sliding_window > 0) ULA_RETURN_IF_ERROR(CheckChunkWindow(tokens, pages, checkpoints, window_pages));
  ULA_RETURN_IF_ERROR(InsertSequence(tokens, pages, checkpoints, window_pages, false));  // a chunk keeps its tail
  PrefixMatch m = Match(tokens, static_cast<std::uint32_t>(tokens.size()));
  ULA_CHECK(m.length == tokens.size());
  ULA_CHECK(Lock(m).has_value());  // before Unlock(held): nothing of the path is freed meanwhile
  ULA_CHECK(Unlock(held).has_value());
  return m;
}

}  // namespace ula
