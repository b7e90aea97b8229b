// Hardware profile loading (hardware_config.h): every quantity needs a value and a source.
#include "config/hardware_config.h"

#include <fmt/format.h>

#include "config/json_fields.h"

namespace ula {
namespace {

Status FieldError(std::string_view field, std::string_view problem) {
  return MakeError(ErrorCode::kInvalidArgument, fmt::format("field '{}': {}", field, problem));
}

}  // namespace

Status HardwareConfig::Validate() const {
  if (name.empty()) return FieldError("name", "must not be empty");
  if (device_memory_bytes == 0) return FieldError("device_memory_bytes", "must be > 0");
  if (!(hbm_bandwidth_bytes_per_s > 0)) return FieldError("hbm_bandwidth_bytes_per_s", "must be > 0");
  if (!(nvlink_bandwidth_bytes_per_s > 0)) return FieldError("nvlink_bandwidth_bytes_per_s", "must be > 0");
  if (!(host_link_bandwidth_bytes_per_s > 0)) return FieldError("host_link_bandwidth_bytes_per_s", "must be > 0");
  if (host_link_bandwidth_bytes_per_s > hbm_bandwidth_bytes_per_s) {
    return FieldError("host_link_bandwidth_bytes_per_s", "must not exceed hbm_bandwidth_bytes_per_s");
  }
  if (gpus_per_node == 0) return FieldError("gpus_per_node", "must be >= 1");
  if (dense_bf16_flops < 0) return FieldError("dense_bf16_flops", "must be >= 0");
  if (dense_fp8_flops < 0) return FieldError("dense_fp8_flops", "must be >= 0");
  return Ok();
}

Result<HardwareConfig> ParseHardwareConfig(std::string_view json_text, std::string_view origin) {
  auto fields = config_internal::JsonFields::Parse(json_text, std::string(origin));
  if (!fields) return std::unexpected(fields.error());
  HardwareConfig h;
  constexpr double kBig = 1e18;
  auto name = fields->String("name");
  if (!name) return std::unexpected(name.error());
  h.name = *name;
  struct Field {
    const char* name;
    double* out;
    double min;
  };
  double device_memory = 0, host_memory = 0, gpus = 0;
  const Field quantities[] = {
      {"device_memory_bytes", &device_memory, 1},
      {"hbm_bandwidth_bytes_per_s", &h.hbm_bandwidth_bytes_per_s, 1},
      {"nvlink_bandwidth_bytes_per_s", &h.nvlink_bandwidth_bytes_per_s, 1},
      {"host_link_bandwidth_bytes_per_s", &h.host_link_bandwidth_bytes_per_s, 1},
      {"host_memory_bytes_per_gpu", &host_memory, 0},
      {"gpus_per_node", &gpus, 1},
      {"dense_bf16_flops", &h.dense_bf16_flops, 0},
      {"dense_fp8_flops", &h.dense_fp8_flops, 0},
  };
  for (const Field& f : quantities) {
    auto v = fields->SourcedDouble(f.name, f.min, kBig);
    if (!v) return std::unexpected(v.error());
    *f.out = *v;
  }
  if (gpus != static_cast<double>(static_cast<std::uint32_t>(gpus))) {
    return std::unexpected(fields->FieldError("gpus_per_node", "must be an integer"));
  }
  h.device_memory_bytes = static_cast<std::uint64_t>(device_memory);
  h.host_memory_bytes_per_gpu = static_cast<std::uint64_t>(host_memory);
  h.gpus_per_node = static_cast<std::uint32_t>(gpus);
  ULA_RETURN_IF_ERROR(fields->CheckNoUnknownFields());
  if (auto st = h.Validate(); !st) {
    return MakeError(ErrorCode::kInvalidArgument, fmt::format("{}: {}", origin, st.error().message()));
  }
  return h;
}

Result<HardwareConfig> LoadHardwareConfig(const std::filesystem::path& path) {
  auto text = config_internal::ReadTextFile(path.string());
  if (!text) return std::unexpected(text.error());
  return ParseHardwareConfig(*text, path.string());
}

Result<HardwareConfig> LoadHardwareConfigByName(std::string_view name, const std::filesystem::path& config_dir) {
  return LoadHardwareConfig(config_dir / "hardware" / (std::string(name) + ".json"));
}

}  // namespace ula
