// ModelConfig: the KV-cache-relevant shape of a sparse-attention MLA model (DeepSeek-V3.2 /
// GLM-5 family), loaded from configs/models/<name>.json. No model constant lives in code.
//
// Layer groups. Main layers are grouped in order, `layers_per_group` to a group (the last
// group takes the remainder: GLM-5's 78 layers make 19 groups of 4 and one of 2); each MTP
// layer forms one more group of its own. All layers of a group share one top-k selection
// and their entries sit side by side in one group entry (docs/ARCHITECTURE.md, "Kinds").
//
// Invariants after Validate(): every count >= 1 where a zero makes no sense; the stated
// per-layer byte sizes equal the ones computed from their parts
// (kv_entry_bytes_per_layer = kv_lora_rank * kv_lora_bytes_per_value + kv_scale_bytes +
//  qk_rope_head_dim * rope_bytes_per_value; likewise for the indexer key).
//
// Layer kinds (the DeepSeek-V4 family; docs/ARCHITECTURE.md "kinds"). A model whose JSON has
// `compress_ratios` lists one ratio per layer, main layers then MTP layers (Hugging Face's
// DeepseekV4Config layout): 0 = sliding-window attention only, compress_rate_csa =
// compressed sparse attention (one compressed entry per csa tokens, its index key, top-k
// selected), compress_rate_hca = heavily compressed attention (one entry per hca tokens,
// all read). Every layer, whatever its kind, also keeps the window KV of the last
// `sliding_window` tokens. The fields come all together or not at all; without them the
// model has one kind (a token entry per token and layer group, V3.2 / GLM-5).
// Invariants after Validate() for such a model: compress_ratios.size() = num_layers +
// mtp_layers, every ratio is 0, csa or hca; 2 <= csa < hca, both powers of two;
// sliding_window >= 1; compressor_state_bytes_per_value 1, 2 or 4; the per-format byte sizes equal their layouts' formulas:
//   fp8_packed  = kv_entry_bytes_per_layer (nope FP8 + scales + rope BF16)
//   fp8_uniform = kv_lora_rank + qk_rope_head_dim (every value e4m3, no scale)
//   bf16        = 2 * (kv_lora_rank + qk_rope_head_dim)
//   index fp8   = index_key_bytes_per_layer;  index fp4 = index_head_dim / 2 + index_head_dim / 32
//
// Thread-safety: plain values; loading functions are reentrant.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include "indexer/indexer.h"
#include "ula/error.h"

namespace ula {

enum class AttentionLayerType : std::uint8_t {
  kSlidingWindow = 0,       // window KV only
  kCompressedSparse = 1,    // + one compressed entry per compress_rate_csa tokens, indexed
  kHeavilyCompressed = 2,   // + one compressed entry per compress_rate_hca tokens, all read
};

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

  // DeepSeek-V4 layer kinds (see above); empty / 0 for a single-kind model.
  std::vector<std::uint32_t> compress_ratios;  // [num_layers + mtp_layers]
  std::uint32_t sliding_window = 0;            // window KV tokens kept by every layer
  std::uint32_t compress_rate_csa = 0;         // tokens per compressed-sparse entry (4)
  std::uint32_t compress_rate_hca = 0;         // tokens per heavily-compressed entry (128)
  std::uint32_t kv_entry_bytes_fp8_uniform = 0;
  std::uint32_t kv_entry_bytes_bf16 = 0;
  std::uint32_t index_key_bytes_fp4 = 0;
  // Bytes of one value of the compressors' partial state (the block still filling): FP32 in
  // SGLang's DSV4 state pools.
  std::uint32_t compressor_state_bytes_per_value = 0;

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

  // Whether the model has layer kinds (compress_ratios given).
  bool has_layer_kinds() const { return !compress_ratios.empty(); }
  // Kind of layer l (REQUIRES has_layer_kinds(), l < compress_ratios.size()).
  AttentionLayerType layer_kind(std::uint32_t layer) const;
  // Layers of a kind, MTP layers included (0 for a single-kind model).
  std::uint32_t num_layers_of_kind(AttentionLayerType kind) const;

  // The lightning indexer's shape: index_heads query heads of index_head_dim values, top_k
  // positions per query. A model with layer kinds indexes its C4 entries (one key per
  // compress_rate_csa tokens): its top_k counts C4 entries (V4-Flash 512, V4-Pro 1024).
  // A validated config gives a valid shape.
  IndexerShape indexer_shape() const { return {.num_heads = index_heads, .head_dim = index_head_dim, .top_k = top_k}; }
};

// Parses JSON text. `origin` names the text in errors (a file name). Every field is
// required except the layer-kind group (compress_ratios, sliding_window, compress_rate_csa,
// compress_rate_hca, kv_entry_bytes_by_format, index_key_bytes_by_format,
// compressor_state_bytes_per_value), which comes whole
// or not at all; unknown fields are rejected, and an error names the field.
Result<ModelConfig> ParseModelConfig(std::string_view json_text, std::string_view origin = "model config");
Result<ModelConfig> LoadModelConfig(const std::filesystem::path& path);
// LoadModelConfig(config_dir / "models" / (name + ".json")).
Result<ModelConfig> LoadModelConfigByName(std::string_view name, const std::filesystem::path& config_dir);

// The configs/ directory: $ULA_CONFIG_DIR if set and non-empty; else the first folder
// holding `configs/models/` found walking up from the binary that contains this code (the
// program, or the Python extension module), then from the working directory; else the
// relative path "configs". Found at run time, never compiled in: a build tree inside any
// clone, or a prebuilt folder moved into another working tree (scripts/gpu-check.sh), finds
// its own configs/, and no absolute path enters the compile line (the compiler cache then
// serves every clone, docs/BENCHMARKS.md, "The test loop").
std::filesystem::path DefaultConfigDir();

// The search of DefaultConfigDir() without the environment: the first of `starts` (and each
// one's ancestors, in order) that holds `configs/models/`, as `<that folder>/configs`; empty
// when none does. Exposed for its test.
std::filesystem::path FindConfigDirAbove(const std::vector<std::filesystem::path>& starts);

}  // namespace ula
