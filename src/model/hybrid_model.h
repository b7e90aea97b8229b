// HybridModel: a small hybrid language model that really computes on the CPU, used to test
// and measure the unified buffer and the prefix cache. Random weights from a fixed seed,
// float32, one token at a time (so a resumed sequence performs exactly the same arithmetic
// as one computed from scratch). Three layer kinds:
//
//   kRecurrent      gated linear attention: S = g * S + k v^T, y = q^T S / key_dim; the
//                   fixed-size state S [key_dim x d_model] of every recurrent layer lives in
//                   the request's state block, overwritten in place.
//   kAttention      causal softmax attention over all earlier tokens; K and V of every
//                   attention layer live in the request's KV page envelopes (page-major).
//   kSlidingWindow  softmax attention over the last `window` tokens (the token itself and
//                   the window - 1 before it). K and V live either in the request's window
//                   ring block (slot = position % window), or, with window_in_pages, in
//                   window pages (kind kModelWindowKind, one per KV page index, page-major
//                   like the KV pages): the position p is in window_pages[p / page_tokens],
//                   and only the pages of the last window tokens need to be present.
//
// The model reads all its KV and state through a HybridAllocator: it translates the page
// table once per step (one batched lookup) and pins every block it touches while it runs.
// Thread-safety: a const model may run several sequences from different threads on
// different allocators; one allocator is single-threaded.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "ula/hybrid_allocator.h"
#include "unified/page_envelope.h"

namespace ula {

enum class LayerKind : std::uint8_t { kRecurrent, kAttention, kSlidingWindow };

struct HybridModelConfig {
  std::uint32_t vocab = 64;
  std::uint32_t d_model = 32;
  std::uint32_t key_dim = 64;  // recurrent key size (state is key_dim x d_model floats per layer)
  std::vector<LayerKind> layers = {LayerKind::kRecurrent, LayerKind::kRecurrent, LayerKind::kAttention,
                                   LayerKind::kRecurrent, LayerKind::kRecurrent, LayerKind::kSlidingWindow,
                                   LayerKind::kRecurrent, LayerKind::kAttention};
  std::uint32_t window = 64;
  // false: the window layers' KV is a per-request ring; true: window pages (tokens).
  bool window_in_pages = false;
  std::uint32_t page_tokens = 16;
  std::uint64_t seed = 1234;

  Status Validate() const;
};

// Kind indices the model expects in its allocator (see HybridModel::Kinds).
inline constexpr BlockKind kModelStateKind(0);
inline constexpr BlockKind kModelKvKind(1);
inline constexpr BlockKind kModelWindowKind(2);

// The blocks of one sequence. pages[i] holds positions [i * page_tokens, (i + 1) * page_tokens).
struct SequenceBlocks {
  BlockId state;
  BlockId window;              // the ring; invalid without a sliding-window layer or with window pages
  std::vector<BlockId> pages;
  // window_in_pages: [pages.size()] window pages; an invalid entry was released (all its
  // positions lie before the window of every position still to be computed).
  std::vector<BlockId> window_pages;
  std::uint32_t length = 0;    // tokens already computed
};

class HybridModel {
 public:
  static Result<std::unique_ptr<HybridModel>> Create(const HybridModelConfig& config);

  const HybridModelConfig& config() const { return config_; }
  // The three block kinds, in the order of kModel*Kind, sized for `alignment`.
  std::vector<KindConfig> Kinds(std::uint64_t alignment) const;
  const PageEnvelopeLayout& page_layout() const { return page_layout_; }
  std::uint64_t state_bytes() const;
  // The ring (or, with window pages, one window page) of the sliding-window layers.
  std::uint64_t window_bytes() const;
  bool has_window() const { return num_window_ > 0; }
  // A per-request window ring (a window layer, window_in_pages false).
  bool window_ring() const { return has_window() && !config_.window_in_pages; }
  // Window pages (a window layer, window_in_pages true).
  bool window_pages() const { return has_window() && config_.window_in_pages; }

  // Computes the token at position seq.length, writing its KV and updating the state;
  // fills logits [vocab] and advances seq.length. kFailedPrecondition when no page covers
  // the position (or, with window pages, no window page for a position of its window);
  // errors from the allocator for unknown blocks. A new sequence's state and
  // ring blocks must be zeroed by the caller (ZeroSequenceState).
  Status Step(HybridAllocator& allocator, SequenceBlocks& seq, std::uint32_t token, std::span<float> logits) const;
  Status ZeroSequenceState(HybridAllocator& allocator, const SequenceBlocks& seq) const;
  // Greedy next token.
  static std::uint32_t Argmax(std::span<const float> logits);

 private:
  explicit HybridModel(const HybridModelConfig& config);

  HybridModelConfig config_;
  PageEnvelopeLayout page_layout_;
  std::uint32_t num_recurrent_ = 0, num_attention_ = 0, num_window_ = 0;
  std::vector<std::uint32_t> layer_slot_;  // [layers] index among layers of the same kind
  // Weights, row-major.
  std::vector<float> embed_;   // [vocab][d]
  std::vector<float> unembed_; // [vocab][d]
  struct LayerWeights {
    std::vector<float> wq, wk, wv, wo;  // [q_dim][d], [q_dim][d], [d][d], [d][d]
    std::vector<float> wg;              // [d] gate (recurrent only)
  };
  std::vector<LayerWeights> weights_;  // [layers]
};

}  // namespace ula
