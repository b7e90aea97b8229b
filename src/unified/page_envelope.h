// PageEnvelope: the byte layout of one KV page that stores every layer of a kind (e.g. all
// full-attention layers) for `page_tokens` tokens in one contiguous block (page-major), so
// that freeing or moving a page frees or moves exactly one range of the unified buffer.
//
// Layout of one envelope, layer by layer ([num_layers] sections of layer_stride bytes):
//
//   layer l: [ K: page_tokens x k_bytes_per_token | V: page_tokens x v_bytes_per_token ]
//
// A kernel reads layer l of a page through a strided view:
//   K(token t) = base(page) + l * layer_stride + t * k_bytes_per_token
//   V(token t) = base(page) + l * layer_stride + page_tokens * k_bytes_per_token + t * v_bytes_per_token
// K and V sizes may differ (e.g. MLA-like or different head dims).
// Thread-safety: values only.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "ula/error.h"

namespace ula {

struct PageEnvelopeLayout {
  std::uint32_t page_tokens = 16;
  std::uint32_t num_layers = 1;
  std::uint32_t k_bytes_per_token = 0;  // one layer, all heads
  std::uint32_t v_bytes_per_token = 0;

  Status Validate() const;
  std::uint64_t layer_stride() const {
    return std::uint64_t{page_tokens} * (std::uint64_t{k_bytes_per_token} + v_bytes_per_token);
  }
  // Bytes of one envelope (the KV kind's block_bytes before alignment).
  std::uint64_t envelope_bytes() const { return layer_stride() * num_layers; }
  // envelope_bytes rounded up to a multiple of alignment.
  std::uint64_t AlignedEnvelopeBytes(std::uint64_t alignment) const {
    return (envelope_bytes() + alignment - 1) / alignment * alignment;
  }
};

// One layer of one page as a kernel sees it.
struct LayerView {
  std::byte* k = nullptr;  // [page_tokens][k_bytes_per_token]
  std::byte* v = nullptr;  // [page_tokens][v_bytes_per_token]
  std::uint32_t k_bytes_per_token = 0;
  std::uint32_t v_bytes_per_token = 0;

  std::byte* K(std::uint32_t token) const { return k + std::uint64_t{token} * k_bytes_per_token; }
  std::byte* V(std::uint32_t token) const { return v + std::uint64_t{token} * v_bytes_per_token; }
};

// The view of `layer` inside the envelope that starts at `page_base`.
// REQUIRES: layer < layout.num_layers; page_base points at envelope_bytes() bytes.
inline LayerView ViewLayer(const PageEnvelopeLayout& layout, std::byte* page_base, std::uint32_t layer) {
  std::byte* l = page_base + std::uint64_t{layer} * layout.layer_stride();
  return LayerView{l, l + std::uint64_t{layout.page_tokens} * layout.k_bytes_per_token, layout.k_bytes_per_token,
                   layout.v_bytes_per_token};
}

}  // namespace ula
