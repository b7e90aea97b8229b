// HybridRunner: serves requests of a HybridModel on a HybridAllocator, with an optional
// PrefixCache — the small engine loop used by the tests and by `ula bench prefix`.
//
// One request: match the longest reusable prefix (KV pages + a checkpoint at exactly that
// position) with copy-on-write (the match is locked and the request gets its own copy of
// the checkpoint's state and ring), allocate the rest (the pages still needed; a cached
// partial last page is copied, never written), compute the remaining prompt tokens one at
// a time (saving a checkpoint every `checkpoint_interval` positions and at the match's
// branching point), decode greedily, then hand everything to the cache (or free it).
// With `prefill_chunk`, the prompt is computed in chunks and each chunk is inserted into
// the cache with a copy of the running state (chunked prefill), the lock moving with it.
// Whenever an allocation does not fit, the cache evicts by the configured rule first.
// With window pages (HybridModelConfig::window_in_pages) every KV page comes with its window
// page; window pages that no position still to be computed reads and no checkpoint still to
// be inserted needs are released as the request advances (its own freed, the tree's window
// lock given back early: PrefixCache::ReleaseWindow).
// A cache that drops a finished sequence's unaligned tail (PrefixCacheConfig::unaligned_tail
// kDrop) also gets a checkpoint at the last page boundary the request reaches, saved on the
// way (SGLang's mamba track buffer); not with speculative decoding (no exact stop there).
// Thread-safety: none; one runner per allocator.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "ula/hybrid_allocator.h"
#include "model/hybrid_model.h"
#include "ula/prefix_cache.h"

namespace ula {

struct ServeOptions {
  std::uint32_t max_new_tokens = 8;   // >= 1
  // 0: only the end-of-request checkpoint; else one every so many tokens (any position).
  std::uint32_t checkpoint_interval = 0;
  // Also save a checkpoint at the match's branching point (where cached KV ran past the
  // deepest state) rounded down to a multiple of this (as SGLang aligns it to its chunk
  // size), when that lies past the match; 0: never. Rounding keeps a chance collision of a
  // few tokens from costing a checkpoint.
  std::uint32_t branch_alignment = 16;
  // 0: no chunked prefill; else insert every chunk of this many prompt tokens as it is done.
  std::uint32_t prefill_chunk = 0;
  // Speculative decoding: each round, `drafter(tokens so far, n)` proposes up to n <=
  // draft_tokens tokens; the target feeds them all, saving the state (and ring) after each
  // into its own slot (draft_tokens + 1 state blocks in the allocator), keeps the longest
  // prefix it agrees with plus its own next token, and rolls the state back to the slot of
  // the last accepted token. Greedy outputs are those of plain decoding. 0: off.
  std::uint32_t draft_tokens = 0;
  std::function<std::vector<std::uint32_t>(std::span<const std::uint32_t>, std::uint32_t)> drafter = nullptr;
  EvictionRule rule = EvictionRule::kAllocationAware;
  bool insert_into_cache = true;
};

struct ServeResult {
  std::vector<std::uint32_t> output;  // [max_new_tokens]
  std::vector<float> last_logits;     // [vocab] logits that chose the last output token
  std::uint32_t matched = 0;          // prompt tokens reused from the cache
  std::uint32_t recomputed = 0;       // prompt tokens computed
  std::uint32_t branch = 0;           // the match's branching point (0: none)
  std::uint32_t chunks_inserted = 0;  // chunked prefill: chunks handed to the cache early
  std::uint32_t drafted = 0, accepted = 0;  // speculative decoding: draft tokens proposed, kept
  std::uint32_t window_released = 0;  // window pages: early releases of the match's window lock
  EvictionStats evicted;
  std::vector<double> token_us;       // time of each decode step after the first output
};

class HybridRunner {
 public:
  // `cache` may be null (no prefix caching). The allocator must use the model's kinds.
  HybridRunner(const HybridModel& model, HybridAllocator& allocator, PrefixCache* cache)
      : model_(model), allocator_(allocator), cache_(cache) {}

  // REQUIRES: prompt not empty.
  Result<ServeResult> Serve(std::span<const std::uint32_t> prompt, const ServeOptions& options);

  // Allocates the memory of a request of `tokens` tokens without computing it, in chunks of
  // `chunk_tokens` (0: all at once), evicting by `rule` as needed; `per_chunk` (optional)
  // gets what each chunk's allocation evicted.
  Result<SequenceBlocks> Reserve(std::uint32_t tokens, std::uint32_t chunk_tokens, EvictionRule rule,
                                 EvictionStats* evicted, std::vector<EvictionStats>* per_chunk = nullptr);
  // Frees a sequence's own blocks (pages shared with the cache excluded: `shared_pages`).
  Status Release(const SequenceBlocks& seq, std::size_t shared_pages = 0);

 private:
  Result<std::vector<BlockId>> Allocate(const Demand& demand, EvictionRule rule, EvictionStats& evicted);
  Status CopyBlock(BlockId from, BlockId to);
  // Appends one KV page (and, with window pages, its window page) to the sequence.
  Status AddPage(SequenceBlocks& seq, EvictionRule rule, EvictionStats& evicted);
  // Speculative rounds until max_new_tokens outputs (result.output holds the first one).
  Status DecodeSpeculative(std::span<const std::uint32_t> prompt, const ServeOptions& options, SequenceBlocks& seq,
                           std::vector<float>& logits, ServeResult& result);

  struct ServeCall;  // one Serve call's state and its phases (hybrid_runner.cc)

  const HybridModel& model_;
  HybridAllocator& allocator_;
  PrefixCache* cache_;
};

}  // namespace ula
