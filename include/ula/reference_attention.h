// Reference MLA-style sparse attention on the CPU (float32, small dims), the oracle that
// checks that reading entries through UlaCache's device slots gives exactly what a dense,
// never-moving store gives.
//
// Absorbed MLA decode for one layer and one query token. An entry of one layer is float32
// [kv_lora_rank latent c | rope_dim rope k_r] (kv_entry_bytes_per_layer = 4 * (L + R), no
// scales: ModelConfig::is_float32()). The query is [num_heads][L + R] (q_nope already
// absorbed into the latent space, then q_rope). For each head h:
//
//   logit_i = softmax_scale * (sum_d q[h][d] * c_i[d]  +  sum_r q[h][L + r] * k_r_i[r])
//   p_i     = exp(logit_i - max_j logit_j) / sum_j exp(logit_j - max_j logit_j)
//   out[h][d] = sum_i p_i * c_i[d]                                  (values = latent)
//
// with every sum taken in index order, so the output is a pure function of the query and
// the bytes of the selected entries, in selection order: two stores holding equal bytes
// give bit-identical outputs.
//
// Thread-safety: reentrant (each call owns its scratch).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "ula/error.h"

namespace ula {

struct MlaShape {
  std::uint32_t num_heads = 0;
  std::uint32_t kv_lora_rank = 0;  // L
  std::uint32_t rope_dim = 0;      // R
  float softmax_scale = 1.0f;

  Status Validate() const;
  std::uint32_t query_values() const { return num_heads * (kv_lora_rank + rope_dim); }
  std::uint32_t output_values() const { return num_heads * kv_lora_rank; }
  std::uint32_t entry_bytes() const { return 4 * (kv_lora_rank + rope_dim); }
};

// entries[i]: the layer's bytes of the i-th selected entry (entry_bytes() bytes; any
// alignment). query: [query_values()]; out: [output_values()].
// kInvalidArgument for no entries, a null entry, or wrong sizes.
Status SparseMlaAttention(const MlaShape& shape, std::span<const float> query,
                          std::span<const std::byte* const> entries, std::span<float> out);

}  // namespace ula
