// Model and config-directory loading (model_config.h). Range checks happen field by field
// while parsing; Validate() re-checks them and the cross-field byte-size identities, so a
// config built in code is held to the same rules as one read from a file.
#include "config/model_config.h"

#include <fmt/format.h>

#include <dlfcn.h>

#include <cstdlib>
#include <system_error>
#include <utility>

#include "config/json_fields.h"


namespace ula {
namespace {

Status FieldError(std::string_view field, std::string_view problem) {
  return MakeError(ErrorCode::kInvalidArgument, fmt::format("field '{}': {}", field, problem));
}

bool ValidValueBytes(std::uint32_t b) { return b == 1 || b == 2 || b == 4; }

bool PowerOfTwo(std::uint32_t v) { return v != 0 && (v & (v - 1)) == 0; }

// The layer-kind invariants of model_config.h (REQUIRES m.has_layer_kinds()).
Status ValidateLayerKinds(const ModelConfig& m) {
  const std::uint64_t layers = std::uint64_t{m.num_layers} + m.mtp_layers;
  if (m.compress_ratios.size() != layers) {
    return FieldError("compress_ratios", fmt::format("has {} entries but num_layers + mtp_layers = {}",
                                                     m.compress_ratios.size(), layers));
  }
  if (m.sliding_window < 1) return FieldError("sliding_window", "must be >= 1");
  if (!ValidValueBytes(m.compressor_state_bytes_per_value)) {
    return FieldError("compressor_state_bytes_per_value", "must be 1, 2 or 4");
  }
  if (m.compress_rate_csa < 2 || !PowerOfTwo(m.compress_rate_csa)) {
    return FieldError("compress_rate_csa", fmt::format("must be a power of two >= 2, got {}", m.compress_rate_csa));
  }
  if (m.compress_rate_hca <= m.compress_rate_csa || !PowerOfTwo(m.compress_rate_hca)) {
    return FieldError("compress_rate_hca", fmt::format("must be a power of two > compress_rate_csa = {}, got {}",
                                                       m.compress_rate_csa, m.compress_rate_hca));
  }
  for (std::size_t l = 0; l < m.compress_ratios.size(); ++l) {
    const std::uint32_t r = m.compress_ratios[l];
    if (r != 0 && r != m.compress_rate_csa && r != m.compress_rate_hca) {
      return FieldError("compress_ratios", fmt::format("[{}] is {}: must be 0, compress_rate_csa = {} or "
                                                       "compress_rate_hca = {}",
                                                       l, r, m.compress_rate_csa, m.compress_rate_hca));
    }
  }
  const std::uint64_t values = std::uint64_t{m.kv_lora_rank} + m.qk_rope_head_dim;
  if (m.kv_entry_bytes_fp8_uniform != values) {
    return FieldError("kv_entry_bytes_by_format.fp8_uniform",
                      fmt::format("is {} but kv_lora_rank + qk_rope_head_dim = {}", m.kv_entry_bytes_fp8_uniform,
                                  values));
  }
  if (m.kv_entry_bytes_bf16 != 2 * values) {
    return FieldError("kv_entry_bytes_by_format.bf16",
                      fmt::format("is {} but 2 * (kv_lora_rank + qk_rope_head_dim) = {}", m.kv_entry_bytes_bf16,
                                  2 * values));
  }
  if (m.index_head_dim % 32 != 0) {
    return FieldError("index_head_dim", fmt::format("must be a multiple of 32 for an FP4 index key, got {}",
                                                    m.index_head_dim));
  }
  const std::uint32_t fp4 = m.index_head_dim / 2 + m.index_head_dim / 32;
  if (m.index_key_bytes_fp4 != fp4) {
    return FieldError("index_key_bytes_by_format.fp4",
                      fmt::format("is {} but index_head_dim / 2 + index_head_dim / 32 = {}", m.index_key_bytes_fp4,
                                  fp4));
  }
  return Ok();
}

// The layer-kind fields of a model that has none: all zero / empty.
Status ValidateNoLayerKinds(const ModelConfig& m) {
  const std::pair<const char*, std::uint32_t> fields[] = {
      {"sliding_window", m.sliding_window},
      {"compress_rate_csa", m.compress_rate_csa},
      {"compress_rate_hca", m.compress_rate_hca},
      {"kv_entry_bytes_by_format.fp8_uniform", m.kv_entry_bytes_fp8_uniform},
      {"kv_entry_bytes_by_format.bf16", m.kv_entry_bytes_bf16},
      {"index_key_bytes_by_format.fp4", m.index_key_bytes_fp4},
      {"compressor_state_bytes_per_value", m.compressor_state_bytes_per_value},
  };
  for (const auto& [field, value] : fields) {
    if (value != 0) return FieldError(field, "is set but compress_ratios is not (the layer-kind fields come together)");
  }
  return Ok();
}

// The layer-kind group of a model JSON (model_config.h): all or none.
Status ParseLayerKinds(config_internal::JsonFields& f, ModelConfig& m) {
  static constexpr const char* kGroup[] = {"compress_ratios",   "sliding_window",           "compress_rate_csa",
                                           "compress_rate_hca", "kv_entry_bytes_by_format", "index_key_bytes_by_format",
                                           "compressor_state_bytes_per_value"};
  bool any = false;
  for (const char* field : kGroup) any = any || f.Has(field);
  if (!any) return Ok();
  if (!f.Has("compress_ratios")) {
    for (const char* field : kGroup) {
      if (f.Has(field)) {
        return std::unexpected(f.FieldError(field, "needs compress_ratios (the layer-kind fields come together)"));
      }
    }
  }
  constexpr std::uint64_t kMax32 = 0xffffffffu;
  auto ratios = f.UIntArray("compress_ratios", 0, kMax32);
  if (!ratios) return std::unexpected(ratios.error());
  m.compress_ratios.assign(ratios->begin(), ratios->end());
  const std::pair<const char*, std::uint32_t*> scalars[] = {
      {"sliding_window", &m.sliding_window},
      {"compress_rate_csa", &m.compress_rate_csa},
      {"compress_rate_hca", &m.compress_rate_hca},
      {"compressor_state_bytes_per_value", &m.compressor_state_bytes_per_value},
  };
  for (const auto& [field, out] : scalars) {
    auto v = f.UInt(field, 1, kMax32);
    if (!v) return std::unexpected(v.error());
    *out = static_cast<std::uint32_t>(*v);
  }
  auto kv = f.Object("kv_entry_bytes_by_format");
  if (!kv) return std::unexpected(kv.error());
  std::uint32_t fp8_packed = 0;
  const std::pair<const char*, std::uint32_t*> kv_formats[] = {
      {"fp8_packed", &fp8_packed}, {"fp8_uniform", &m.kv_entry_bytes_fp8_uniform}, {"bf16", &m.kv_entry_bytes_bf16}};
  for (const auto& [field, out] : kv_formats) {
    auto v = kv->UInt(field, 1, kMax32);
    if (!v) return std::unexpected(v.error());
    *out = static_cast<std::uint32_t>(*v);
  }
  ULA_RETURN_IF_ERROR(kv->CheckNoUnknownFields());
  if (fp8_packed != m.kv_entry_bytes_per_layer) {
    return std::unexpected(kv->FieldError("fp8_packed", fmt::format("is {} but kv_entry_bytes_per_layer = {}",
                                                                    fp8_packed, m.kv_entry_bytes_per_layer)));
  }
  auto ik = f.Object("index_key_bytes_by_format");
  if (!ik) return std::unexpected(ik.error());
  auto fp8 = ik->UInt("fp8", 1, kMax32);
  if (!fp8) return std::unexpected(fp8.error());
  auto fp4 = ik->UInt("fp4", 1, kMax32);
  if (!fp4) return std::unexpected(fp4.error());
  ULA_RETURN_IF_ERROR(ik->CheckNoUnknownFields());
  if (*fp8 != m.index_key_bytes_per_layer) {
    return std::unexpected(ik->FieldError("fp8", fmt::format("is {} but index_key_bytes_per_layer = {}", *fp8,
                                                             m.index_key_bytes_per_layer)));
  }
  m.index_key_bytes_fp4 = static_cast<std::uint32_t>(*fp4);
  return Ok();
}

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
  return has_layer_kinds() ? ValidateLayerKinds(*this) : ValidateNoLayerKinds(*this);
}

AttentionLayerType ModelConfig::layer_kind(std::uint32_t layer) const {
  const std::uint32_t r = compress_ratios.at(layer);
  if (r == 0) return AttentionLayerType::kSlidingWindow;
  return r == compress_rate_csa ? AttentionLayerType::kCompressedSparse : AttentionLayerType::kHeavilyCompressed;
}

std::uint32_t ModelConfig::num_layers_of_kind(AttentionLayerType kind) const {
  std::uint32_t n = 0;
  for (std::uint32_t l = 0; l < compress_ratios.size(); ++l) n += layer_kind(l) == kind ? 1 : 0;
  return n;
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
  ULA_RETURN_IF_ERROR(ParseLayerKinds(*fields, m));  // its errors name the origin
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

std::filesystem::path FindConfigDirAbove(const std::vector<std::filesystem::path>& starts) {
  std::error_code ec;
  for (const std::filesystem::path& start : starts) {
    if (start.empty()) continue;
    for (std::filesystem::path dir = start;; dir = dir.parent_path()) {
      if (std::filesystem::is_directory(dir / "configs" / "models", ec)) return dir / "configs";
      if (dir == dir.parent_path() || dir.empty()) break;
    }
  }
  return {};
}

std::filesystem::path DefaultConfigDir() {
  if (const char* env = std::getenv("ULA_CONFIG_DIR"); env != nullptr && *env != '\0') return env;
  std::vector<std::filesystem::path> starts;
  std::error_code ec;
  // The binary holding this function: the program it is linked into, or a shared object
  // (the Python extension module) wherever it was loaded from.
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&FindConfigDirAbove), &info) != 0 && info.dli_fname != nullptr) {
    const std::filesystem::path self = std::filesystem::weakly_canonical(info.dli_fname, ec);
    if (!ec) starts.push_back(self.parent_path());
  }
  if (const auto exe = std::filesystem::read_symlink("/proc/self/exe", ec); !ec) starts.push_back(exe.parent_path());
  if (const auto cwd = std::filesystem::current_path(ec); !ec) starts.push_back(cwd);
  if (auto found = FindConfigDirAbove(starts); !found.empty()) return found;
  return "configs";
}

}  // namespace ula
