// HardwareConfig: one GPU of a serving node, from configs/hardware/<name>.json.
// Every quantity in the file is {"value": number, "source": "public specification"}; the
// loader requires both, so no figure enters without a stated source. Bytes and bytes/s are
// decimal (GB = 1e9), as vendors state them. A FLOP rate of 0 means "unknown".
//
// Thread-safety: plain values; loading functions are reentrant.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>

#include "ula/error.h"

namespace ula {

struct HardwareConfig {
  std::string name;
  std::uint64_t device_memory_bytes = 0;        // HBM per GPU
  double hbm_bandwidth_bytes_per_s = 0;
  double nvlink_bandwidth_bytes_per_s = 0;      // per GPU
  double host_link_bandwidth_bytes_per_s = 0;   // achievable host<->device, one GPU
  std::uint64_t host_memory_bytes_per_gpu = 0;  // pinned host memory attached to one GPU
  std::uint32_t gpus_per_node = 0;
  double dense_bf16_flops = 0;                  // 0 = unknown
  double dense_fp8_flops = 0;                   // 0 = unknown

  // Names the first bad field.
  Status Validate() const;
};

Result<HardwareConfig> ParseHardwareConfig(std::string_view json_text,
                                           std::string_view origin = "hardware config");
Result<HardwareConfig> LoadHardwareConfig(const std::filesystem::path& path);
// LoadHardwareConfig(config_dir / "hardware" / (name + ".json")).
Result<HardwareConfig> LoadHardwareConfigByName(std::string_view name,
                                                const std::filesystem::path& config_dir);

}  // namespace ula
