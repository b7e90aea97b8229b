// The kinds of a layer-kind model (DeepSeek-V4) as a space holds them, and the DP space
// config that holds them (ula/kv_kinds.h; docs/ARCHITECTURE.md, "Kinds").
//
// From a model with layer kinds (model_config.h), in the storage formats chosen:
//   0 window          1 token per entry, ring of sliding_window + max_draft_tokens tokens,
//                     every layer (MTP included), resident: attention reads it every step.
//   1 c4              compress_rate_csa tokens per entry, append, the compressed-sparse
//                     layers, sparse: the indexer's top-k selects among them.
//   2 c4_index_key    companion of c4 (its logical address and lifetime), index-key rows,
//                     resident: the indexer scores every key every step.
//   3 c128            compress_rate_hca tokens per entry, append, the heavily-compressed
//                     layers, resident: read whole every step.
//   4 c4_state        per request: the CSA compressors' block still filling,
//                     csa * 2 rows of 2 * 2 * (kv_lora_rank + qk_rope_head_dim) values
//                     (the compressed-sparse compressor overlaps two blocks);
//   5 c4_index_state  the same for the indexer's keys, index_head_dim wide;
//   6 c128_state      hca rows of 2 * (kv_lora_rank + qk_rope_head_dim) values.
// State values are compressor_state_bytes_per_value bytes (SGLang's DSV4 state pools:
// shape [ratio * (1 + overlap), 2 * (1 + overlap) * head_dim]; model config's source).
// A kind with no layers (a model without HCA layers) is left out.
//
// Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <vector>

#include "config/kind_bytes.h"
#include "config/model_config.h"
#include "ula/address_space.h"
#include "ula/kv_kinds.h"

namespace ula {

struct ModelKindsOptions {
  KvStorageFormat kv_format = KvStorageFormat::kFp8Packed;
  IndexKeyFormat index_format = IndexKeyFormat::kFp8;
  // The most draft tokens one round may roll back: the window ring keeps them too.
  std::uint32_t max_draft_tokens = 0;
};

// kFailedPrecondition for a model without layer kinds; kInvalidArgument for a model that
// fails Validate() or a ring longer than 2^31 tokens.
Result<std::vector<KvKind>> KindsOfModel(const ModelConfig& model, const ModelKindsOptions& options);

// A DP space config holding the model's kinds: one group per compressed-sparse layer
// (layers_per_group of them, the MTP layers' CSA layers one each), row_bytes the c4 row;
// ranks, budgets and modes as in `base` (its kinds and group fields are replaced).
Result<AddressSpaceConfig> SpaceConfigOfModel(const ModelConfig& model, const ModelKindsOptions& options,
                                              const AddressSpaceConfig& base);

}  // namespace ula
