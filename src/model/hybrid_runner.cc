#include "model/hybrid_runner.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstring>

namespace ula {

namespace {
void Add(EvictionStats& total, const EvictionStats& s) {
  total.nodes += s.nodes;
  total.pages += s.pages;
  total.checkpoints += s.checkpoints;
  total.window_pages += s.window_pages;
  total.offloaded_pages += s.offloaded_pages;
  total.offloaded += s.offloaded;
}
}  // namespace

Result<std::vector<BlockId>> HybridRunner::Allocate(const Demand& demand, EvictionRule rule, EvictionStats& evicted) {
  if (!allocator_.CanAllocate(demand) && cache_ != nullptr) {
    auto stats = cache_->MakeRoom(demand, rule);
    if (!stats) return std::unexpected(std::move(stats).error());
    Add(evicted, *stats);
  }
  return allocator_.AllocateDemand(demand);
}

Status HybridRunner::CopyBlock(BlockId from, BlockId to) {
  auto src = allocator_.Bytes(from);
  if (!src) return std::unexpected(std::move(src).error());
  auto dst = allocator_.Bytes(to);
  if (!dst) return std::unexpected(std::move(dst).error());
  if (src->size() != dst->size()) return MakeError(ErrorCode::kInternal, "copy between blocks of different sizes");
  std::memcpy(dst->data(), src->data(), src->size());
  return Ok();
}

Status HybridRunner::AddPage(SequenceBlocks& seq, EvictionRule rule, EvictionStats& evicted) {
  Demand d = Demand::Of(allocator_.num_kinds()).Add(kModelKvKind, 1);
  if (model_.window_pages()) d.Add(kModelWindowKind, 1);
  auto ids = Allocate(d, rule, evicted);
  if (!ids) return std::unexpected(std::move(ids).error());
  seq.pages.push_back(ids->front());
  if (model_.window_pages()) seq.window_pages.push_back(ids->back());
  return Ok();
}

Status HybridRunner::Release(const SequenceBlocks& seq, std::size_t shared_pages) {
  for (std::size_t i = shared_pages; i < seq.pages.size(); ++i) ULA_RETURN_IF_ERROR(allocator_.Free(seq.pages[i]));
  for (std::size_t i = shared_pages; i < seq.window_pages.size(); ++i) {
    if (seq.window_pages[i].valid()) ULA_RETURN_IF_ERROR(allocator_.Free(seq.window_pages[i]));
  }
  if (seq.state.valid()) ULA_RETURN_IF_ERROR(allocator_.Free(seq.state));
  if (seq.window.valid()) ULA_RETURN_IF_ERROR(allocator_.Free(seq.window));
  return Ok();
}

Result<SequenceBlocks> HybridRunner::Reserve(std::uint32_t tokens, std::uint32_t chunk_tokens, EvictionRule rule,
                                             EvictionStats* evicted, std::vector<EvictionStats>* per_chunk) {
  const std::uint32_t P = model_.config().page_tokens;
  const std::size_t kinds = allocator_.num_kinds();
  SequenceBlocks seq;
  EvictionStats stats;
  const std::uint32_t chunk = chunk_tokens == 0 ? tokens : chunk_tokens;
  for (std::uint32_t start = 0; start < tokens; start += chunk) {
    const std::uint32_t end = std::min(tokens, start + chunk);
    const auto pages = static_cast<std::uint32_t>((end + P - 1) / P - seq.pages.size());
    Demand d = Demand::Of(kinds).Add(kModelKvKind, pages);
    if (model_.window_pages()) d.Add(kModelWindowKind, pages);
    if (start == 0) {
      d.Add(kModelStateKind, 1);
      if (model_.window_ring()) d.Add(kModelWindowKind, 1);
    }
    EvictionStats chunk_stats;
    auto ids = Allocate(d, rule, chunk_stats);
    Add(stats, chunk_stats);
    if (per_chunk) per_chunk->push_back(chunk_stats);
    if (!ids) {
      (void)Release(seq);
      return std::unexpected(std::move(ids).error());
    }
    for (BlockId id : *ids) {
      const BlockKind k = *allocator_.KindOf(id);
      if (k == kModelKvKind) seq.pages.push_back(id);
      else if (k == kModelStateKind) seq.state = id;
      else if (model_.window_pages()) seq.window_pages.push_back(id);
      else seq.window = id;
    }
  }
  if (evicted) *evicted = stats;
  return seq;
}

Status HybridRunner::DecodeSpeculative(std::span<const std::uint32_t> prompt, const ServeOptions& options,
                                       SequenceBlocks& seq, std::vector<float>& logits, ServeResult& result) {
  const std::uint32_t P = model_.config().page_tokens;
  const std::size_t kinds = allocator_.num_kinds();
  const std::uint32_t D = options.draft_tokens;
  // One slot per position a round feeds: the state (and ring) after it.
  Demand d = Demand::Of(kinds).Add(kModelStateKind, D + 1);
  if (model_.window_ring()) d.Add(kModelWindowKind, D + 1);
  auto ids = Allocate(d, options.rule, result.evicted);
  if (!ids) return std::unexpected(std::move(ids).error());
  std::vector<Checkpoint> slots(D + 1);
  std::size_t num_states = 0, num_windows = 0;
  for (BlockId id : *ids) {
    if (*allocator_.KindOf(id) == kModelStateKind) slots[num_states++].state = id;
    else slots[num_windows++].window = id;
  }
  auto round = [&]() -> Status {
    std::vector<std::uint32_t> context(prompt.begin(), prompt.end());
    context.insert(context.end(), result.output.begin(), result.output.end());
    std::vector<std::vector<float>> round_logits(D + 1, std::vector<float>(logits.size()));
    while (result.output.size() < options.max_new_tokens) {
      const auto k = static_cast<std::uint32_t>(std::min<std::size_t>(D, options.max_new_tokens - result.output.size() - 1));
      std::vector<std::uint32_t> feed = {result.output.back()};
      if (k > 0 && options.drafter) {
        auto drafts = options.drafter(context, k);
        feed.insert(feed.end(), drafts.begin(), drafts.begin() + std::min<std::size_t>(drafts.size(), k));
      }
      // Verification: feed the last output and every draft, saving the state after each.
      const std::uint32_t start = seq.length;
      for (std::size_t i = 0; i < feed.size(); ++i) {
        if (seq.length / P >= seq.pages.size()) ULA_RETURN_IF_ERROR(AddPage(seq, options.rule, result.evicted));
        ULA_RETURN_IF_ERROR(model_.Step(allocator_, seq, feed[i], round_logits[i]));
        ULA_RETURN_IF_ERROR(CopyBlock(seq.state, slots[i].state));
        if (seq.window.valid()) ULA_RETURN_IF_ERROR(CopyBlock(seq.window, slots[i].window));
      }
      // Commit the drafts the target agrees with; roll back past the first it does not.
      std::size_t a = 0;
      while (a + 1 < feed.size() && feed[a + 1] == HybridModel::Argmax(round_logits[a])) ++a;
      if (a + 1 < feed.size()) {
        ULA_RETURN_IF_ERROR(CopyBlock(slots[a].state, seq.state));
        if (seq.window.valid()) ULA_RETURN_IF_ERROR(CopyBlock(slots[a].window, seq.window));
        seq.length = start + static_cast<std::uint32_t>(a) + 1;
      }
      for (std::size_t j = 1; j <= a; ++j) {
        result.output.push_back(feed[j]);
        context.push_back(feed[j]);
      }
      const std::uint32_t next = HybridModel::Argmax(round_logits[a]);
      result.output.push_back(next);
      context.push_back(next);
      logits = round_logits[a];
      result.drafted += static_cast<std::uint32_t>(feed.size() - 1);
      result.accepted += static_cast<std::uint32_t>(a);
    }
    return Ok();
  };
  Status status = round();
  for (const Checkpoint& c : slots) {
    (void)allocator_.Free(c.state);
    if (c.window.valid()) (void)allocator_.Free(c.window);
  }
  return status;
}

// One Serve call: the request's sequence, the lock it holds on the cache and the checkpoints
// it has not handed to the cache yet, with one method per phase. Every phase but Match and
// Finish leaves, on an error, a state that Abandon releases whole.
struct HybridRunner::ServeCall {
  ServeCall(HybridRunner& runner, std::span<const std::uint32_t> prompt, const ServeOptions& options)
      : r(runner),
        prompt(prompt),
        options(options),
        P(runner.model_.config().page_tokens),
        W(runner.model_.config().window),
        len(static_cast<std::uint32_t>(prompt.size())),
        kinds(runner.allocator_.num_kinds()),
        windowed(runner.model_.window_pages()),
        logits(runner.model_.config().vocab) {}

  // Locks the longest cached match (>= 1 token left to compute) and adopts its leading full pages.
  Status Match();
  // Allocates the pages of the rest of the prompt (and, with no match, the state and ring).
  Status ReservePrompt();
  // The start state: a copy of the match's partial page (copy-on-write), or a zeroed state.
  Status StartState();
  // Computes the prompt past the match: checkpoints, chunk insertions, window releases.
  Status Prefill();
  // The output tokens after the first: speculative rounds, then one token per step.
  Status Decode();
  // Unlocks the cache and hands it the sequence (insert_into_cache), or frees it.
  Status Finish();
  // On an error of ReservePrompt .. Decode: frees the request's own blocks and checkpoints
  // and unlocks the cache.
  void Abandon();

  // Saves the state (and ring) at seq.length as a checkpoint, once per position.
  Status SaveCheckpoint();
  // Chunked prefill: the tree takes the chunks computed so far, with a copy of the state.
  Status InsertChunk();
  // Releases the window pages no position still to be computed reads (see below).
  Status ReleaseWindow();
  void FreeCheckpoint(const Checkpoint& c) {
    (void)r.allocator_.Free(c.state);
    if (c.window.valid()) (void)r.allocator_.Free(c.window);
  }
  std::uint32_t WindowStart(std::uint32_t p) const { return p + 1 > W ? p + 1 - W : 0; }

  HybridRunner& r;
  const std::span<const std::uint32_t> prompt;
  const ServeOptions& options;
  const std::uint32_t P, W;  // page tokens, window tokens
  const std::uint32_t len;
  const std::size_t kinds;
  const bool windowed;
  ServeResult result;
  PrefixMatch held;  // the lock the request holds on the cache: its match, later its last inserted chunk
  std::uint32_t m = 0;       // matched tokens
  std::size_t shared = 0;    // leading pages that belong to the cache, used as they are
  std::uint32_t branch = 0;  // where to save a checkpoint for the branching point (0: none)
  // A cache that drops a finished sequence's unaligned tail (UnalignedTail::kDrop) keeps only
  // checkpoints on page boundaries: the state at the last one the request reaches (SGLang's
  // mamba track buffer), saved on the way (0: none needed).
  std::uint32_t tail_at = 0;
  std::size_t released = 0;  // window pages [0, released) are decided
  SequenceBlocks seq;
  std::vector<PositionedCheckpoint> checkpoints;
  std::vector<float> logits;  // [vocab]
};

Status HybridRunner::ServeCall::Match() {
  if (r.cache_ != nullptr) {
    auto match = r.cache_->MatchCopyOnWrite(prompt, len - 1, options.rule);
    if (!match) return std::unexpected(std::move(match).error());
    held = std::move(*match);
  }
  m = held.length;
  shared = m / P;
  seq.state = held.copy.state;  // the request's own copy (copy-on-write match)
  seq.window = held.copy.window;
  seq.pages.assign(held.pages.begin(), held.pages.begin() + static_cast<std::ptrdiff_t>(shared));
  if (windowed) {  // the tree's window pages over the match's window (invalid before it)
    seq.window_pages.assign(shared, BlockId::Invalid());
    for (std::size_t i = 0; i < shared && i < held.window_pages.size(); ++i) seq.window_pages[i] = held.window_pages[i];
  }
  return Ok();
}

Status HybridRunner::ServeCall::ReservePrompt() {
  const auto new_pages = static_cast<std::uint32_t>((len + P - 1) / P - shared);
  Demand d = Demand::Of(kinds).Add(kModelKvKind, new_pages);
  if (windowed) d.Add(kModelWindowKind, new_pages);
  if (m == 0) {
    d.Add(kModelStateKind, 1);
    if (r.model_.window_ring()) d.Add(kModelWindowKind, 1);
  }
  auto ids = r.Allocate(d, options.rule, result.evicted);
  if (!ids) return std::unexpected(std::move(ids).error());
  for (BlockId id : *ids) {
    const BlockKind k = *r.allocator_.KindOf(id);
    if (k == kModelKvKind) seq.pages.push_back(id);
    else if (k == kModelStateKind) seq.state = id;
    else if (windowed) seq.window_pages.push_back(id);
    else seq.window = id;
  }
  return Ok();
}

Status HybridRunner::ServeCall::StartState() {
  if (m > 0) {
    if (m % P != 0) {  // copy-on-write partial page
      ULA_RETURN_IF_ERROR(r.CopyBlock(held.pages[shared], seq.pages[shared]));
      if (windowed) ULA_RETURN_IF_ERROR(r.CopyBlock(held.window_pages[shared], seq.window_pages[shared]));
    }
  } else {
    ULA_RETURN_IF_ERROR(r.model_.ZeroSequenceState(r.allocator_, seq));
  }
  seq.length = m;
  result.matched = m;
  result.recomputed = len - m;
  result.branch = held.branch;
  // held changes with chunks: the branch is the match's.
  branch = options.branch_alignment == 0 ? 0 : held.branch / options.branch_alignment * options.branch_alignment;
  if (r.cache_ != nullptr && options.insert_into_cache && r.cache_->config().unaligned_tail == UnalignedTail::kDrop &&
      options.draft_tokens == 0) {
    const std::uint32_t fed = len + options.max_new_tokens - 1;  // what Finish inserts
    if (fed % P != 0 && fed / P * P > m) tail_at = fed / P * P;
  }
  return Ok();
}

Status HybridRunner::ServeCall::SaveCheckpoint() {
  if (!checkpoints.empty() && checkpoints.back().position == seq.length) return Ok();
  Demand d = Demand::Of(kinds).Add(kModelStateKind, 1);
  if (r.model_.window_ring()) d.Add(kModelWindowKind, 1);
  auto ids = r.Allocate(d, options.rule, result.evicted);
  if (!ids) return std::unexpected(std::move(ids).error());
  Checkpoint c;
  for (BlockId id : *ids) (*r.allocator_.KindOf(id) == kModelStateKind ? c.state : c.window) = id;
  checkpoints.push_back({seq.length, c});
  ULA_RETURN_IF_ERROR(r.CopyBlock(seq.state, c.state));
  if (c.window.valid()) ULA_RETURN_IF_ERROR(r.CopyBlock(seq.window, c.window));
  return Ok();
}

Status HybridRunner::ServeCall::InsertChunk() {
  ULA_RETURN_IF_ERROR(SaveCheckpoint());
  const std::uint32_t L = seq.length;
  const std::size_t num_pages = (L + P - 1) / P;
  const auto window_span = windowed ? std::span<const BlockId>(seq.window_pages).first(num_pages)
                                    : std::span<const BlockId>();
  auto next = r.cache_->InsertChunk(prompt.first(L), std::span<const BlockId>(seq.pages).first(num_pages), checkpoints,
                                    held, window_span);
  if (!next) return std::unexpected(std::move(next).error());
  checkpoints.clear();  // the tree's now (attached or freed as duplicates)
  held = std::move(*next);
  std::copy(held.pages.begin(), held.pages.end(), seq.pages.begin());  // the tree's pages from now on
  for (std::size_t i = 0; windowed && i < num_pages; ++i) {
    seq.window_pages[i] = i < held.window_pages.size() ? held.window_pages[i] : BlockId::Invalid();
  }
  shared = num_pages;
  ++result.chunks_inserted;
  if (L % P == 0) return Ok();
  // The partial last page is the tree's now: continue on a copy.
  Demand d = Demand::Of(kinds).Add(kModelKvKind, 1);
  if (windowed) d.Add(kModelWindowKind, 1);
  auto page = r.Allocate(d, options.rule, result.evicted);
  if (!page) return std::unexpected(std::move(page).error());
  ULA_RETURN_IF_ERROR(r.CopyBlock(seq.pages[L / P], page->front()));
  seq.pages[L / P] = page->front();
  if (windowed) {
    ULA_RETURN_IF_ERROR(r.CopyBlock(seq.window_pages[L / P], page->back()));
    seq.window_pages[L / P] = page->back();
  }
  shared = L / P;
  return Ok();
}

// Window pages: once no position still to be computed reads a window page (the next
// token at seq.length attends to [seq.length + 1 - W, seq.length]), it is released unless
// a checkpoint still to be inserted needs it (one at c needs [c + 1 - W, c)): the
// request's own pages are freed, the tree's are dropped from the sequence, and once all of
// the match's window pages are behind, the match's window lock goes (the early release).
// A checkpoint saved later needs only pages of the window then, so each page is decided
// once, as the window passes it.
Status HybridRunner::ServeCall::ReleaseWindow() {
  if (!windowed) return Ok();
  for (; released < WindowStart(seq.length) / P && released < seq.window_pages.size(); ++released) {
    BlockId& b = seq.window_pages[released];
    const bool needed = std::any_of(checkpoints.begin(), checkpoints.end(), [&](const PositionedCheckpoint& c) {
      return released >= WindowStart(c.position) / P && released < (c.position + P - 1) / P;
    });
    if (released < shared) {
      b = BlockId::Invalid();  // the tree's: not read any more
    } else if (!needed && b.valid()) {
      ULA_RETURN_IF_ERROR(r.allocator_.Free(b));
      b = BlockId::Invalid();
    }
  }
  if (r.cache_ != nullptr && !held.window_pages.empty() && released >= held.window_pages.size()) {
    ULA_RETURN_IF_ERROR(r.cache_->ReleaseWindow(held));
    ++result.window_released;
  }
  return Ok();
}

Status HybridRunner::ServeCall::Prefill() {
  for (std::uint32_t p = m; p < len; ++p) {
    ULA_RETURN_IF_ERROR(r.model_.Step(r.allocator_, seq, prompt[p], logits));
    if (r.cache_ == nullptr) continue;
    const bool at_interval = options.checkpoint_interval > 0 && seq.length % options.checkpoint_interval == 0;
    const bool at_branch = branch > m && seq.length == branch;
    if (at_interval || at_branch || seq.length == tail_at) ULA_RETURN_IF_ERROR(SaveCheckpoint());
    if (options.prefill_chunk > 0 && seq.length < len && (seq.length - m) % options.prefill_chunk == 0) {
      ULA_RETURN_IF_ERROR(InsertChunk());
    }
    ULA_RETURN_IF_ERROR(ReleaseWindow());
  }
  return Ok();
}

Status HybridRunner::ServeCall::Decode() {
  std::uint32_t next = HybridModel::Argmax(logits);
  result.output.push_back(next);
  if (options.draft_tokens > 0) {
    ULA_RETURN_IF_ERROR(r.DecodeSpeculative(prompt, options, seq, logits, result));
    // Pages written by rejected drafts past the sequence's end are not the cache's business.
    while (seq.pages.size() > (seq.length + P - 1) / P) {
      ULA_RETURN_IF_ERROR(r.allocator_.Free(seq.pages.back()));
      seq.pages.pop_back();
      if (windowed) {
        ULA_RETURN_IF_ERROR(r.allocator_.Free(seq.window_pages.back()));
        seq.window_pages.pop_back();
      }
    }
  }
  for (auto i = static_cast<std::uint32_t>(result.output.size()); i < options.max_new_tokens; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    if (seq.length / P >= seq.pages.size()) ULA_RETURN_IF_ERROR(r.AddPage(seq, options.rule, result.evicted));
    ULA_RETURN_IF_ERROR(r.model_.Step(r.allocator_, seq, next, logits));
    if (seq.length == tail_at) ULA_RETURN_IF_ERROR(SaveCheckpoint());
    ULA_RETURN_IF_ERROR(ReleaseWindow());
    next = HybridModel::Argmax(logits);
    result.output.push_back(next);
    result.token_us.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
  }
  result.last_logits = logits;
  return Ok();
}

Status HybridRunner::ServeCall::Finish() {
  if (r.cache_ != nullptr) ULA_RETURN_IF_ERROR(r.cache_->Unlock(held));
  if (r.cache_ != nullptr && options.insert_into_cache) {
    std::vector<std::uint32_t> fed(prompt.begin(), prompt.end());
    fed.insert(fed.end(), result.output.begin(), result.output.end() - 1);
    if (!checkpoints.empty() && checkpoints.back().position == seq.length) {
      FreeCheckpoint(checkpoints.back().checkpoint);
      checkpoints.pop_back();
    }
    checkpoints.push_back({seq.length, Checkpoint{seq.state, seq.window}});
    auto cached = r.cache_->Insert(fed, seq.pages, checkpoints,
                                   windowed ? std::span<const BlockId>(seq.window_pages) : std::span<const BlockId>());
    if (!cached) return std::unexpected(std::move(cached).error());
    return Ok();
  }
  (void)r.Release(seq, shared);
  for (const auto& c : checkpoints) FreeCheckpoint(c.checkpoint);
  return Ok();
}

void HybridRunner::ServeCall::Abandon() {
  (void)r.Release(seq, shared);
  for (const auto& c : checkpoints) FreeCheckpoint(c.checkpoint);
  if (r.cache_ != nullptr) (void)r.cache_->Unlock(held);
}

Result<ServeResult> HybridRunner::Serve(std::span<const std::uint32_t> prompt, const ServeOptions& options) {
  if (prompt.empty()) return MakeError(ErrorCode::kInvalidArgument, "serve: empty prompt");
  if (options.max_new_tokens == 0) return MakeError(ErrorCode::kInvalidArgument, "serve: max_new_tokens must be >= 1");
  ServeCall call(*this, prompt, options);
  ULA_RETURN_IF_ERROR(call.Match());
  Status s = call.ReservePrompt();
  if (s) s = call.StartState();
  if (s) s = call.Prefill();
  if (s) s = call.Decode();
  if (!s) {
    call.Abandon();
    return std::unexpected(std::move(s).error());
  }
  ULA_RETURN_IF_ERROR(call.Finish());
  return std::move(call.result);
}

}  // namespace ula
