#include "model/hybrid_model.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>

namespace ula {

namespace {

// A fixed, portable generator (splitmix64): same weights on every platform and library.
class WeightRng {
 public:
  explicit WeightRng(std::uint64_t seed) : s_(seed) {}
  float Uniform(float scale) {
    std::uint64_t z = (s_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    return scale * (static_cast<float>(z >> 40) / static_cast<float>(1ull << 24) * 2.0f - 1.0f);
  }

 private:
  std::uint64_t s_;
};

std::vector<float> RandomMatrix(WeightRng& rng, std::size_t rows, std::size_t cols) {
  std::vector<float> m(rows * cols);
  const float scale = 1.0f / std::sqrt(static_cast<float>(cols));
  for (auto& v : m) v = rng.Uniform(scale);
  return m;
}

// out[r] = sum_c m[r][c] * x[c]
void MatVec(const std::vector<float>& m, const float* x, std::size_t rows, std::size_t cols, float* out) {
  for (std::size_t r = 0; r < rows; ++r) {
    const float* row = m.data() + r * cols;
    float acc = 0;
    for (std::size_t c = 0; c < cols; ++c) acc += row[c] * x[c];
    out[r] = acc;
  }
}

void RmsNorm(const float* x, std::size_t n, float* out) {
  float ss = 0;
  for (std::size_t i = 0; i < n; ++i) ss += x[i] * x[i];
  const float inv = 1.0f / std::sqrt(ss / static_cast<float>(n) + 1e-6f);
  for (std::size_t i = 0; i < n; ++i) out[i] = x[i] * inv;
}

float* AsFloats(std::byte* p) { return reinterpret_cast<float*>(p); }

}  // namespace

Status HybridModelConfig::Validate() const {
  if (vocab < 2) return MakeError(ErrorCode::kInvalidArgument, "hybrid model config: vocab must be >= 2");
  if (d_model == 0) return MakeError(ErrorCode::kInvalidArgument, "hybrid model config: d_model must be > 0");
  if (key_dim == 0) return MakeError(ErrorCode::kInvalidArgument, "hybrid model config: key_dim must be > 0");
  if (page_tokens == 0) return MakeError(ErrorCode::kInvalidArgument, "hybrid model config: page_tokens must be > 0");
  if (layers.empty()) return MakeError(ErrorCode::kInvalidArgument, "hybrid model config: layers must not be empty");
  const auto count = [&](LayerKind k) { return std::count(layers.begin(), layers.end(), k); };
  if (count(LayerKind::kRecurrent) == 0) {
    return MakeError(ErrorCode::kInvalidArgument, "hybrid model config: layers need at least one recurrent layer");
  }
  if (count(LayerKind::kAttention) == 0) {
    return MakeError(ErrorCode::kInvalidArgument, "hybrid model config: layers need at least one attention layer");
  }
  if (count(LayerKind::kSlidingWindow) > 0 && window == 0) {
    return MakeError(ErrorCode::kInvalidArgument, "hybrid model config: window must be > 0");
  }
  return Ok();
}

HybridModel::HybridModel(const HybridModelConfig& config) : config_(config) {
  WeightRng rng(config.seed);
  const std::size_t d = config.d_model;
  embed_ = RandomMatrix(rng, config.vocab, d);
  for (auto& v : embed_) v *= std::sqrt(static_cast<float>(d));
  unembed_ = RandomMatrix(rng, config.vocab, d);
  for (LayerKind kind : config.layers) {
    LayerWeights w;
    const std::size_t q_dim = kind == LayerKind::kRecurrent ? config.key_dim : d;
    w.wq = RandomMatrix(rng, q_dim, d);
    w.wk = RandomMatrix(rng, q_dim, d);
    w.wv = RandomMatrix(rng, d, d);
    w.wo = RandomMatrix(rng, d, d);
    if (kind == LayerKind::kRecurrent) w.wg = RandomMatrix(rng, 1, d);
    std::uint32_t& n = kind == LayerKind::kRecurrent   ? num_recurrent_
                       : kind == LayerKind::kAttention ? num_attention_
                                                       : num_window_;
    layer_slot_.push_back(n++);
    weights_.push_back(std::move(w));
  }
  page_layout_ = PageEnvelopeLayout{.page_tokens = config.page_tokens, .num_layers = num_attention_,
                                    .k_bytes_per_token = static_cast<std::uint32_t>(4 * d),
                                    .v_bytes_per_token = static_cast<std::uint32_t>(4 * d)};
}

Result<std::unique_ptr<HybridModel>> HybridModel::Create(const HybridModelConfig& config) {
  ULA_RETURN_IF_ERROR(config.Validate());
  return std::unique_ptr<HybridModel>(new HybridModel(config));
}

std::uint64_t HybridModel::state_bytes() const {
  return std::uint64_t{num_recurrent_} * config_.key_dim * config_.d_model * sizeof(float);
}
std::uint64_t HybridModel::window_bytes() const {
  const std::uint32_t slots = config_.window_in_pages ? config_.page_tokens : config_.window;
  return std::uint64_t{num_window_} * slots * 2 * config_.d_model * sizeof(float);
}

std::vector<KindConfig> HybridModel::Kinds(std::uint64_t alignment) const {
  auto align = [&](std::uint64_t b) { return std::max<std::uint64_t>(alignment, (b + alignment - 1) / alignment * alignment); };
  return {{"state", align(state_bytes()), BufferEnd::kLow},
          {"kv", page_layout_.AlignedEnvelopeBytes(alignment), BufferEnd::kHigh},
          {"swa", align(window_bytes()), BufferEnd::kLow}};
}

Status HybridModel::ZeroSequenceState(HybridAllocator& allocator, const SequenceBlocks& seq) const {
  auto state = allocator.Bytes(seq.state);
  if (!state) return std::unexpected(std::move(state).error());
  std::memset(state->data(), 0, state->size());
  if (window_ring()) {  // window pages need no zeroing: every position is written before it is read
    auto ring = allocator.Bytes(seq.window);
    if (!ring) return std::unexpected(std::move(ring).error());
    std::memset(ring->data(), 0, ring->size());
  }
  return Ok();
}

std::uint32_t HybridModel::Argmax(std::span<const float> logits) {
  return static_cast<std::uint32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
}

Status HybridModel::Step(HybridAllocator& allocator, SequenceBlocks& seq, std::uint32_t token,
                         std::span<float> logits) const {
  const std::uint32_t d = config_.d_model;
  const std::uint32_t pos = seq.length;
  const std::uint32_t P = config_.page_tokens;
  if (token >= config_.vocab) return MakeError(ErrorCode::kInvalidArgument, "hybrid model: token out of vocab");
  if (logits.size() != config_.vocab) return MakeError(ErrorCode::kInvalidArgument, "hybrid model: logits size != vocab");
  if (pos / P >= seq.pages.size()) {
    return MakeError(ErrorCode::kFailedPrecondition, fmt::format("hybrid model: no page for position {}", pos));
  }
  // One batched lookup of the page table; pin everything this step touches.
  const std::size_t used_pages = pos / P + 1;
  std::vector<std::uint64_t> page_offsets(used_pages);
  ULA_RETURN_IF_ERROR(allocator.Translate(std::span(seq.pages).first(used_pages), page_offsets));
  std::vector<BlockId> pinned(seq.pages.begin(), seq.pages.begin() + used_pages);
  pinned.push_back(seq.state);
  if (window_ring()) pinned.push_back(seq.window);
  // Window pages: those of positions [first_window, pos].
  const std::uint32_t first_window = pos + 1 > config_.window ? pos + 1 - config_.window : 0;
  std::vector<std::uint64_t> window_offsets;
  if (window_pages()) {
    if (seq.window_pages.size() <= pos / P) {
      return MakeError(ErrorCode::kFailedPrecondition, fmt::format("hybrid model: no window page for position {}", pos));
    }
    const auto window_ids = std::span(seq.window_pages).subspan(first_window / P, pos / P - first_window / P + 1);
    for (BlockId b : window_ids) {
      if (!b.valid()) {
        return MakeError(ErrorCode::kFailedPrecondition,
                         fmt::format("hybrid model: a window page of position {}'s window was released", pos));
      }
    }
    window_offsets.resize(window_ids.size());
    ULA_RETURN_IF_ERROR(allocator.Translate(window_ids, window_offsets));
    pinned.insert(pinned.end(), window_ids.begin(), window_ids.end());
  }
  for (std::size_t i = 0; i < pinned.size(); ++i) {
    if (auto s = allocator.Pin(pinned[i]); !s) {
      for (std::size_t j = 0; j < i; ++j) (void)allocator.Unpin(pinned[j]);
      return s;
    }
  }
  std::byte* base = allocator.base();
  float* state = AsFloats(allocator.Bytes(seq.state)->data());
  float* ring = window_ring() ? AsFloats(allocator.Bytes(seq.window)->data()) : nullptr;

  std::vector<float> x(embed_.begin() + std::size_t{token} * d, embed_.begin() + std::size_t{token + 1} * d);
  std::vector<float> h(d), q(std::max(d, config_.key_dim)), k(std::max(d, config_.key_dim)), v(d), y(d), o(d);
  std::vector<float> scores(pos + 1);
  const float inv_sqrt_d = 1.0f / std::sqrt(static_cast<float>(d));
  for (std::size_t l = 0; l < config_.layers.size(); ++l) {
    const LayerWeights& w = weights_[l];
    const LayerKind kind = config_.layers[l];
    RmsNorm(x.data(), d, h.data());
    if (kind == LayerKind::kRecurrent) {
      const std::uint32_t kd = config_.key_dim;
      MatVec(w.wq, h.data(), kd, d, q.data());
      MatVec(w.wk, h.data(), kd, d, k.data());
      MatVec(w.wv, h.data(), d, d, v.data());
      float g_logit = 0;
      for (std::uint32_t i = 0; i < d; ++i) g_logit += w.wg[i] * h[i];
      const float g = 1.0f / (1.0f + std::exp(-g_logit - 2.0f));  // mostly remember
      float* S = state + std::size_t{layer_slot_[l]} * kd * d;   // [kd][d]
      const float kscale = 1.0f / std::sqrt(static_cast<float>(kd));
      for (std::uint32_t i = 0; i < kd; ++i) {
        for (std::uint32_t j = 0; j < d; ++j) S[i * d + j] = g * S[i * d + j] + kscale * k[i] * v[j];
      }
      for (std::uint32_t j = 0; j < d; ++j) {
        float acc = 0;
        for (std::uint32_t i = 0; i < kd; ++i) acc += q[i] * S[i * d + j];
        y[j] = acc * kscale;
      }
    } else {
      MatVec(w.wq, h.data(), d, d, q.data());
      MatVec(w.wk, h.data(), d, d, k.data());
      MatVec(w.wv, h.data(), d, d, v.data());
      std::uint32_t first = 0;
      auto key_at = [&](std::uint32_t p) -> const float* {
        if (kind == LayerKind::kAttention) {
          LayerView view = ViewLayer(page_layout_, base + page_offsets[p / P], layer_slot_[l]);
          return AsFloats(view.K(p % P));
        }
        if (ring == nullptr) {  // window pages, page-major: [window layer][slot][K, V]
          float* page = AsFloats(base + window_offsets[p / P - first_window / P]);
          return page + (std::size_t{layer_slot_[l]} * P + p % P) * 2 * d;
        }
        return ring + (std::size_t{layer_slot_[l]} * config_.window + p % config_.window) * 2 * d;
      };
      auto value_at = [&](std::uint32_t p) -> const float* {
        if (kind == LayerKind::kAttention) {
          LayerView view = ViewLayer(page_layout_, base + page_offsets[p / P], layer_slot_[l]);
          return AsFloats(view.V(p % P));
        }
        return key_at(p) + d;
      };
      // Write this token's K and V, then attend.
      std::memcpy(const_cast<float*>(key_at(pos)), k.data(), d * sizeof(float));
      std::memcpy(const_cast<float*>(value_at(pos)), v.data(), d * sizeof(float));
      if (kind == LayerKind::kSlidingWindow && pos + 1 > config_.window) first = pos + 1 - config_.window;
      float max_score = -INFINITY;
      for (std::uint32_t p = first; p <= pos; ++p) {
        const float* kp = key_at(p);
        float s = 0;
        for (std::uint32_t i = 0; i < d; ++i) s += q[i] * kp[i];
        scores[p] = s * inv_sqrt_d;
        max_score = std::max(max_score, scores[p]);
      }
      float sum = 0;
      for (std::uint32_t p = first; p <= pos; ++p) sum += scores[p] = std::exp(scores[p] - max_score);
      std::fill(y.begin(), y.end(), 0.0f);
      for (std::uint32_t p = first; p <= pos; ++p) {
        const float* vp = value_at(p);
        const float a = scores[p] / sum;
        for (std::uint32_t j = 0; j < d; ++j) y[j] += a * vp[j];
      }
    }
    MatVec(w.wo, y.data(), d, d, o.data());
    for (std::uint32_t j = 0; j < d; ++j) x[j] += o[j];
  }
  RmsNorm(x.data(), d, h.data());
  MatVec(unembed_, h.data(), config_.vocab, d, logits.data());
  for (BlockId id : pinned) (void)allocator.Unpin(id);
  ++seq.length;
  return Ok();
}

}  // namespace ula
