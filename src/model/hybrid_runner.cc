#include "ula/hybrid_runner.h"

#include <fmt/format.h>

#include <chrono>
#include <cstring>

namespace ula {

namespace {
void Add(EvictionStats& total, const EvictionStats& s) {
  total.nodes += s.nodes;
  total.pages += s.pages;
  total.checkpoints += s.checkpoints;
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

Status HybridRunner::Release(const SequenceBlocks& seq, std::size_t shared_pages) {
  for (std::size_t i = shared_pages; i < seq.pages.size(); ++i) ULA_RETURN_IF_ERROR(allocator_.Free(seq.pages[i]));
  if (seq.state.valid()) ULA_RETURN_IF_ERROR(allocator_.Free(seq.state));
  if (seq.window.valid()) ULA_RETURN_IF_ERROR(allocator_.Free(seq.window));
  return Ok();
}

Result<SequenceBlocks> HybridRunner::Reserve(std::uint32_t tokens, std::uint32_t chunk_tokens, EvictionRule rule,
                                             EvictionStats* evicted) {
  const std::uint32_t P = model_.config().page_tokens;
  const std::size_t kinds = allocator_.num_kinds();
  SequenceBlocks seq;
  EvictionStats stats;
  const std::uint32_t chunk = chunk_tokens == 0 ? tokens : chunk_tokens;
  for (std::uint32_t start = 0; start < tokens; start += chunk) {
    const std::uint32_t end = std::min(tokens, start + chunk);
    const auto pages = static_cast<std::uint32_t>((end + P - 1) / P - seq.pages.size());
    Demand d = Demand::Of(kinds).Add(kModelKvKind, pages);
    if (start == 0) {
      d.Add(kModelStateKind, 1);
      if (model_.has_window()) d.Add(kModelWindowKind, 1);
    }
    auto ids = Allocate(d, rule, stats);
    if (!ids) {
      (void)Release(seq);
      return std::unexpected(std::move(ids).error());
    }
    for (BlockId id : *ids) {
      const BlockKind k = *allocator_.KindOf(id);
      if (k == kModelKvKind) seq.pages.push_back(id);
      else if (k == kModelStateKind) seq.state = id;
      else seq.window = id;
    }
  }
  if (evicted) *evicted = stats;
  return seq;
}

Result<ServeResult> HybridRunner::Serve(std::span<const std::uint32_t> prompt, const ServeOptions& options) {
  if (prompt.empty()) return MakeError(ErrorCode::kInvalidArgument, "serve: empty prompt");
  if (options.max_new_tokens == 0) return MakeError(ErrorCode::kInvalidArgument, "serve: max_new_tokens must be >= 1");
  const std::uint32_t P = model_.config().page_tokens;
  if (options.checkpoint_interval % P != 0) {
    return MakeError(ErrorCode::kInvalidArgument,
                     fmt::format("serve: checkpoint_interval ({}) must be a multiple of page_tokens ({})",
                                 options.checkpoint_interval, P));
  }
  const auto len = static_cast<std::uint32_t>(prompt.size());
  const std::size_t kinds = allocator_.num_kinds();
  ServeResult result;

  PrefixMatch match;
  if (cache_ != nullptr) {
    match = cache_->Match(prompt, len - 1);  // at least one token left to compute
    ULA_RETURN_IF_ERROR(cache_->Lock(match));
  }
  const std::uint32_t m = match.length;
  const std::size_t shared = m / P;  // full cached pages used as they are
  auto fail = [&](Error e) -> Result<ServeResult> {
    if (cache_ != nullptr) (void)cache_->Unlock(match);
    return std::unexpected(std::move(e));
  };

  SequenceBlocks seq;
  std::vector<PositionedCheckpoint> checkpoints;
  {
    Demand d = Demand::Of(kinds).Add(kModelStateKind, 1).Add(kModelKvKind, static_cast<std::uint32_t>((len + P - 1) / P - shared));
    if (model_.has_window()) d.Add(kModelWindowKind, 1);
    auto ids = Allocate(d, options.rule, result.evicted);
    if (!ids) return fail(std::move(ids).error());
    seq.pages.assign(match.pages.begin(), match.pages.begin() + shared);
    for (BlockId id : *ids) {
      const BlockKind k = *allocator_.KindOf(id);
      if (k == kModelKvKind) seq.pages.push_back(id);
      else if (k == kModelStateKind) seq.state = id;
      else seq.window = id;
    }
  }
  auto release_all = [&] {
    (void)Release(seq, shared);
    for (const auto& c : checkpoints) {
      (void)allocator_.Free(c.checkpoint.state);
      if (c.checkpoint.window.valid()) (void)allocator_.Free(c.checkpoint.window);
    }
  };
  auto check = [&](Status s) -> bool {
    if (s) return true;
    release_all();
    return false;
  };
  if (m > 0) {
    Status s = CopyBlock(match.checkpoint.state, seq.state);
    if (s && model_.has_window()) s = CopyBlock(match.checkpoint.window, seq.window);
    if (s && m % P != 0) s = CopyBlock(match.pages[shared], seq.pages[shared]);  // copy-on-write partial page
    if (!check(s)) return fail(s.error());
  } else if (Status s = model_.ZeroSequenceState(allocator_, seq); !check(s)) {
    return fail(s.error());
  }
  seq.length = m;
  result.matched = m;
  result.recomputed = len - m;

  std::vector<float> logits(model_.config().vocab);
  auto save_checkpoint = [&]() -> Status {
    Demand d = Demand::Of(kinds).Add(kModelStateKind, 1);
    if (model_.has_window()) d.Add(kModelWindowKind, 1);
    auto ids = Allocate(d, options.rule, result.evicted);
    if (!ids) return std::unexpected(std::move(ids).error());
    Checkpoint c{(*ids)[0], model_.has_window() ? (*ids)[1] : BlockId::Invalid()};
    // Listed before the copies: if one fails, the request's failure path frees it too (it
    // is never inserted in the cache with bytes that did not arrive).
    checkpoints.push_back({seq.length, c});
    ULA_RETURN_IF_ERROR(CopyBlock(seq.state, c.state));
    if (c.window.valid()) ULA_RETURN_IF_ERROR(CopyBlock(seq.window, c.window));
    return Ok();
  };
  for (std::uint32_t p = m; p < len; ++p) {
    if (Status s = model_.Step(allocator_, seq, prompt[p], logits); !check(s)) return fail(s.error());
    if (options.checkpoint_interval > 0 && seq.length % options.checkpoint_interval == 0 && cache_ != nullptr) {
      if (Status s = save_checkpoint(); !check(s)) return fail(s.error());
    }
  }
  std::uint32_t next = HybridModel::Argmax(logits);
  result.output.push_back(next);
  for (std::uint32_t i = 1; i < options.max_new_tokens; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    if (seq.length / P >= seq.pages.size()) {
      auto page = Allocate(Demand::Of(kinds).Add(kModelKvKind, 1), options.rule, result.evicted);
      if (!page) {
        release_all();
        return fail(std::move(page).error());
      }
      seq.pages.push_back(page->front());
    }
    if (Status s = model_.Step(allocator_, seq, next, logits); !check(s)) return fail(s.error());
    next = HybridModel::Argmax(logits);
    result.output.push_back(next);
    result.token_us.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
  }
  result.last_logits = logits;

  if (cache_ != nullptr) ULA_RETURN_IF_ERROR(cache_->Unlock(match));
  if (cache_ != nullptr && options.insert_into_cache) {
    std::vector<std::uint32_t> fed(prompt.begin(), prompt.end());
    fed.insert(fed.end(), result.output.begin(), result.output.end() - 1);
    checkpoints.push_back({seq.length, Checkpoint{seq.state, seq.window}});
    ULA_RETURN_IF_ERROR(cache_->Insert(fed, seq.pages, checkpoints));
  } else {
    release_all();
  }
  return result;
}

}  // namespace ula
