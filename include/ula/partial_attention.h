// Partial sparse MLA attention and its exact-order merge: attention computed where the
// entries live (TpAttention::kAtHome, docs/ARCHITECTURE.md "TP attention at home").
//
// The selection of one query is split into disjoint parts (in TP mode: by home rank). For
// each part k and head h, PartialMlaAttention computes, over the part's entries in order
// (logits exactly as SparseMlaAttention, reference_attention.h):
//
//   m_k      = max_i logit_i
//   s_k      = sum_i exp(logit_i - m_k)
//   acc_k[d] = sum_i exp(logit_i - m_k) * c_i[d]
//
// stored as one flat record per head: [acc_k (kv_lora_rank values) | m_k | s_k]. An empty
// part has m = -inf, s = 0, acc = 0. MergeMlaPartials combines the parts in index order:
//
//   M = max_k m_k,  w_k = exp(m_k - M) (0 for an empty part),
//   out[h][d] = sum_k w_k acc_k[d] / sum_k w_k s_k
//
// which is softmax attention over the union. It equals SparseMlaAttention up to float
// rounding (the sums run in a different order), and it is a pure function of the partials
// in order: every process that merges the same partials gets bit-identical outputs.
//
// Thread-safety: reentrant.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "ula/error.h"
#include "ula/reference_attention.h"

namespace ula {

// Floats in one part's partial: num_heads x (kv_lora_rank + 2).
inline std::uint32_t PartialValues(const MlaShape& shape) { return shape.num_heads * (shape.kv_lora_rank + 2); }

// entries may be empty (a rank that holds none of the selection). partial: [PartialValues].
// kInvalidArgument for a bad shape, a null entry or wrong sizes.
Status PartialMlaAttention(const MlaShape& shape, std::span<const float> query,
                           std::span<const std::byte* const> entries, std::span<float> partial);

// partials: n_parts x PartialValues, in part order; out: [output_values()].
// kInvalidArgument for wrong sizes or when every part is empty.
Status MergeMlaPartials(const MlaShape& shape, std::span<const float> partials, std::span<float> out);

}  // namespace ula
