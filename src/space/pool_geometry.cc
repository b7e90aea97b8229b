#include "space/pool_geometry.h"

#include <fmt/format.h>

#include <limits>

namespace ula {

Status ValidatePoolGeometry(std::string_view config, std::uint32_t num_ranks, std::uint32_t num_groups,
                            std::uint32_t entry_bytes, std::uint64_t device_bytes_per_rank) {
  auto bad = [&](std::string msg) {
    return MakeError(ErrorCode::kInvalidArgument, fmt::format("{}.{}", config, msg));
  };
  constexpr std::uint32_t kMax = std::numeric_limits<std::uint16_t>::max() - 1;
  if (num_ranks == 0 || num_ranks > kMax) return bad(fmt::format("num_ranks = {}: must be in [1, {}]", num_ranks, kMax));
  if (num_groups == 0 || num_groups > kMax) {
    return bad(fmt::format("num_groups = {}: must be in [1, {}]", num_groups, kMax));
  }
  if (entry_bytes == 0) return bad("entry_bytes = 0: must be > 0");
  if (SlotsPerGroup(device_bytes_per_rank, entry_bytes, num_groups) == 0) {
    return bad(fmt::format("device_bytes_per_rank = {}: holds no entry of {} B in each of {} groups",
                           device_bytes_per_rank, entry_bytes, num_groups));
  }
  return Ok();
}

}  // namespace ula
