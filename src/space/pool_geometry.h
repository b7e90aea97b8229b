// Validation and slot arithmetic shared by the sparse address spaces (DP and TP): both
// split per-rank tier bytes equally over the layer groups into slots of entry_bytes.
#pragma once

#include <cstdint>
#include <string_view>

#include "ula/error.h"

namespace ula {

// Checks num_ranks and num_groups in [1, 65534], entry_bytes > 0, and that the device
// tier holds at least one entry per group. Errors read "<config>.<field> = <value>: ...".
Status ValidatePoolGeometry(std::string_view config, std::uint32_t num_ranks, std::uint32_t num_groups,
                            std::uint32_t entry_bytes, std::uint64_t device_bytes_per_rank);

// Slots of one group's pool on a tier of `bytes_per_rank` bytes.
inline std::uint64_t SlotsPerGroup(std::uint64_t bytes_per_rank, std::uint32_t entry_bytes, std::uint32_t num_groups) {
  return bytes_per_rank / (std::uint64_t{entry_bytes} * num_groups);
}

}  // namespace ula
