// ModelConfig: the KV-cache-relevant shape of a sparse-attention MLA model (DeepSeek-V3.2 /
// GLM-5 family), loaded from configs/models/<name>.json. No model constant lives in code.
//
// Layer groups. Main layers are grouped in order, `layers_per_group` to a group (the last
// group takes the remainder: GLM-5's 78 layers make 19 groups of 4 and one of 2); each MTP
// layer forms one more group of its own. All layers of a group share one top-k selection
// and their entries sit side by side in one group entry (DESIGN.md "entry").
//
// Invariants after Validate(): every count >= 1 where a zero makes no sense; the stated
// per-layer byte sizes equal the ones computed from their parts
// (kv_entry_bytes_per_layer = kv_lora_rank * kv_lora_bytes_per_value + kv_scale_bytes +
//  qk_rope_head_dim * rope_bytes_per_value; likewise for the indexer key).
//
// Thread-safety: plain values; loading functions are reentrant.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>

#include "ula/error.h"

namespace ula {

struct ModelConfig {
  std::string name;
  std::string source;                       // where the figures come from
  std::uint32_t num_layers = 0;             // main decoder layers
  std::uint32_t mtp_layers = 0;             // multi-token-prediction layers, one group each
  std::uint32_t layers_per_group = 1;       // layers sharing one selection (IndexShare)
  std::uint32_t attention_heads = 0;        // query heads of MLA attention
  std::uint32_t kv_lora_rank = 0;           // latent KV width
  std::uint32_t kv_lora_bytes_per_value = 1;
  std::uint32_t kv_scale_bytes = 0;         // quantization scales per entry per layer
  std::uint32_t qk_rope_head_dim = 0;
  std::uint32_t rope_bytes_per_value = 2;
  std::uint32_t kv_entry_bytes_per_layer = 0;
  std::uint32_t index_heads = 0;            // lightning-indexer query heads
  std::uint32_t index_head_dim = 0;
  std::uint32_t index_key_bytes_per_value = 1;
  std::uint32_t index_key_scale_bytes = 0;
  std::uint32_t index_key_bytes_per_layer = 0;
  std::uint32_t top_k = 0;                  // entries selected per query per group

  // Names the first bad field: "field 'top_k': must be >= 1".
  Status Validate() const;

  // Groups: ceil(num_layers / layers_per_group) + mtp_layers.
  std::uint32_t num_groups() const;
  // Layers in group g (REQUIRES g < num_groups()).
  std::uint32_t GroupLayers(std::uint32_t g) const;
  // Bytes of one group entry of the widest group (layers_per_group layers, or 1 for
  // models with a selection per layer) — the slot size an AddressSpace uses.
  std::uint32_t group_entry_bytes() const;
  // KV bytes of one token over all layers (main + MTP).
  std::uint64_t kv_bytes_per_token() const;
  // Indexer key bytes of one token: one key per group (one indexer per group).
  std::uint64_t index_key_bytes_per_token() const;
  // Whether entries are plain float32 (no scales): what the CPU reference attention reads.
  bool is_float32() const;
};

// Parses JSON text. `origin` names the text in errors (a file name). Every field is
// required, unknown fields are rejected, and an error names the field.
Result<ModelConfig> ParseModelConfig(std::string_view json_text, std::string_view origin = "model config");
Result<ModelConfig> LoadModelConfig(const std::filesystem::path& path);
// LoadModelConfig(config_dir / "models" / (name + ".json")).
Result<ModelConfig> LoadModelConfigByName(std::string_view name, const std::filesystem::path& config_dir);

// The configs/ directory: $ULA_CONFIG_DIR if set and non-empty, else the source tree's
// configs/ compiled in by CMake (so a fresh clone's build tree finds it).
std::filesystem::path DefaultConfigDir();

}  // namespace ula
