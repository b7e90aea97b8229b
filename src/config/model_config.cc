// Model and config-directory loading (model_config.h). Range checks happen field by field
// while parsing; Validate() re-checks them and the cross-field byte-size identities, so a
// config built in code is held to the same rules as one read from a file.
#include "config/model_config.h"

#include <fmt/format.h>

#include <cstdlib>

#include "config/json_fields.h"

#ifndef ULA_SOURCE_CONFIG_DIR
#define ULA_SOURCE_CONFIG_DIR "configs"
#endif

namespace ula {
namespace {

Status FieldError(std::string_view field, std::string_view problem) {
  return MakeError(ErrorCode::kInvalidArgument, fmt::format("field '{}': {}", field, problem));
}

bool ValidValueBytes(std::uint32_t b) { return b == 1 || b == 2 || b == 4; }

}  // namespace

Status ModelConfig::Validate() const {
  if (name.empty()) return FieldError("name", "must not be empty");
  if (num_layers < 1) return FieldError("num_layers", "must be >= 1");
  if (layers_per_group < 1 || layers_per_group > num_layers) {
    return FieldError("layers_per_group", fmt::format("must be in [1, num_layers = {}], got {}", num_layers,
                                                      layers_per_group));
  }
  if (attention_heads < 1) return FieldError("attention_heads", "must be >= 1");
  if (kv_lora_rank < 1) return FieldError("kv_lora_rank", "must be >= 1");
  if (!ValidValueBytes(kv_lora_bytes_per_value)) return FieldError("kv_lora_bytes_per_value", "must be 1, 2 or 4");
  if (!ValidValueBytes(rope_bytes_per_value)) return FieldError("rope_bytes_per_value", "must be 1, 2 or 4");
  const std::uint64_t kv = std::uint64_t{kv_lora_rank} * kv_lora_bytes_per_value + kv_scale_bytes +
                           std::uint64_t{qk_rope_head_dim} * rope_bytes_per_value;
  if (kv_entry_bytes_per_layer != kv) {
    return FieldError("kv_entry_bytes_per_layer",
                      fmt::format("is {} but kv_lora_rank * kv_lora_bytes_per_value + kv_scale_bytes + "
                                  "qk_rope_head_dim * rope_bytes_per_value = {}",
                                  kv_entry_bytes_per_layer, kv));
  }
  if (index_heads < 1) return FieldError("index_heads", "must be >= 1");
  if (index_head_dim < 1) return FieldError("index_head_dim", "must be >= 1");
  if (!ValidValueBytes(index_key_bytes_per_value)) {
    return FieldError("index_key_bytes_per_value", "must be 1, 2 or 4");
  }
  const std::uint64_t ik = std::uint64_t{index_head_dim} * index_key_bytes_per_value + index_key_scale_bytes;
  if (index_key_bytes_per_layer != ik) {
    return FieldError("index_key_bytes_per_layer",
                      fmt::format("is {} but index_head_dim * index_key_bytes_per_value + "
                                  "index_key_scale_bytes = {}",
                                  index_key_bytes_per_layer, ik));
  }
  if (top_k < 1) return FieldError("top_k", "must be >= 1");
  if (std::uint64_t{group_entry_bytes()} > (std::uint64_t{1} << 31)) {
    return FieldError("kv_entry_bytes_per_layer", "group entry larger than 2 GiB");
  }
  return Ok();
}

std::uint32_t ModelConfig::num_groups() const {
  return (num_layers + layers_per_group - 1) / layers_per_group + mtp_layers;
}

std::uint32_t ModelConfig::GroupLayers(std::uint32_t g) const {
  const std::uint32_t main_groups = (num_layers + layers_per_group - 1) / layers_per_group;
  if (g >= main_groups) return 1;  // an MTP layer
  const std::uint32_t first = g * layers_per_group;
  return std::min(layers_per_group, num_layers - first);
}

std::uint32_t ModelConfig::group_entry_bytes() const { return layers_per_group * kv_entry_bytes_per_layer; }

std::uint64_t ModelConfig::kv_bytes_per_token() const {
  return std::uint64_t{num_layers + mtp_layers} * kv_entry_bytes_per_layer;
}

std::uint64_t ModelConfig::index_key_bytes_per_token() const {
  return std::uint64_t{num_groups()} * index_key_bytes_per_layer;
}

bool ModelConfig::is_float32() const {
  return kv_lora_bytes_per_value == 4 && rope_bytes_per_value == 4 && kv_scale_bytes == 0 &&
         index_key_bytes_per_value == 4 && index_key_scale_bytes == 0;
}

Result<ModelConfig> ParseModelConfig(std::string_view json_text, std::string_view origin) {
  auto fields = config_internal::JsonFields::Parse(json_text, std::string(origin));
  if (!fields) return std::unexpected(fields.error());
  ModelConfig m;
  constexpr std::uint64_t kMax32 = 0xffffffffu;
  struct U32Field {
    const char* name;
    std::uint32_t* out;
    std::uint64_t min;
  };
  const U32Field u32_fields[] = {
      {"num_layers", &m.num_layers, 1},
      {"mtp_layers", &m.mtp_layers, 0},
      {"layers_per_group", &m.layers_per_group, 1},
      {"attention_heads", &m.attention_heads, 1},
      {"kv_lora_rank", &m.kv_lora_rank, 1},
      {"kv_lora_bytes_per_value", &m.kv_lora_bytes_per_value, 1},
      {"kv_scale_bytes", &m.kv_scale_bytes, 0},
      {"qk_rope_head_dim", &m.qk_rope_head_dim, 0},
      {"rope_bytes_per_value", &m.rope_bytes_per_value, 1},
      {"kv_entry_bytes_per_layer", &m.kv_entry_bytes_per_layer, 1},
      {"index_heads", &m.index_heads, 1},
      {"index_head_dim", &m.index_head_dim, 1},
      {"index_key_bytes_per_value", &m.index_key_bytes_per_value, 1},
      {"index_key_scale_bytes", &m.index_key_scale_bytes, 0},
      {"index_key_bytes_per_layer", &m.index_key_bytes_per_layer, 1},
      {"top_k", &m.top_k, 1},
  };
  auto name = fields->String("name");
  if (!name) return std::unexpected(name.error());
  m.name = *name;
  auto source = fields->String("source");
  if (!source) return std::unexpected(source.error());
  m.source = *source;
  for (const U32Field& f : u32_fields) {
    auto v = fields->UInt(f.name, f.min, kMax32);
    if (!v) return std::unexpected(v.error());
    *f.out = static_cast<std::uint32_t>(*v);
  }
  ULA_RETURN_IF_ERROR(fields->CheckNoUnknownFields());
  if (auto st = m.Validate(); !st) {
    return MakeError(ErrorCode::kInvalidArgument, fmt::format("{}: {}", origin, st.error().message()));
  }
  return m;
}

Result<ModelConfig> LoadModelConfig(const std::filesystem::path& path) {
  auto text = config_internal::ReadTextFile(path.string());
  if (!text) return std::unexpected(text.error());
  return ParseModelConfig(*text, path.string());
}

Result<ModelConfig> LoadModelConfigByName(std::string_view name, const std::filesystem::path& config_dir) {
  return LoadModelConfig(config_dir / "models" / (std::string(name) + ".json"));
}

std::filesystem::path DefaultConfigDir() {
  if (const char* env = std::getenv("ULA_CONFIG_DIR"); env != nullptr && *env != '\0') return env;
  return ULA_SOURCE_CONFIG_DIR;
}

}  // namespace ula
