#include "space/space_kinds.h"

#include <fmt/format.h>

#include "space/kind_frames.h"
#include "ula/kv_kinds.h"

namespace ula {

namespace {
// The kind frames' fields (AddressSpaceConfig::kind_frame_bytes), after the kinds'.
Status ValidateKindFrames(const AddressSpaceConfig& config) {
  auto bad = [](std::string msg) { return MakeError(ErrorCode::kInvalidArgument, "AddressSpaceConfig." + msg); };
  if (config.num_ranks != 1) {
    return bad(fmt::format("num_ranks = {}: a space with kind frames holds one rank's budget; run one space per DP "
                           "rank, as the engines' DP schedulers do", config.num_ranks));
  }
  if (config.host_shadows) {
    return bad("host_shadows: a frame a kind takes from the C4 share moves its C4 entries, and the shadows' path is "
               "not built for that move");
  }
  KindFramesConfig frames{config.kinds, config.device_bytes_per_rank, config.kind_frame_bytes};
  if (Status ok = frames.Validate(); !ok) {
    return MakeError(ErrorCode::kInvalidArgument, fmt::format("AddressSpaceConfig.kind_frame_bytes = {}: {}",
                                                              config.kind_frame_bytes, ok.error().message()));
  }
  const std::uint64_t slots = config.device_slots_per_group();
  if (slots == 0 || slots >= SlotId::kInvalidValue) {
    return bad(fmt::format("device_bytes_per_rank = {}: {} C4 slots per group, must be in [1, 2^32 - 2]",
                           config.device_bytes_per_rank, slots));
  }
  return Ok();
}
}  // namespace

Status ValidateSpaceKinds(const AddressSpaceConfig& config) {
  if (config.kinds.empty()) {
    if (config.kind_frame_bytes == 0) return Ok();
    return MakeError(ErrorCode::kInvalidArgument,
                     fmt::format("AddressSpaceConfig.kind_frame_bytes = {}: the space has no kinds to carve from "
                                 "frames", config.kind_frame_bytes));
  }
  ULA_RETURN_IF_ERROR(ValidateKinds(config.kinds));
  auto bad = [](std::string msg) { return MakeError(ErrorCode::kInvalidArgument, "AddressSpaceConfig." + msg); };
  const std::size_t s = SparseKindIndex(config.kinds);
  if (s == config.kinds.size()) {
    return bad("kinds: no sparse kind; a space's groups are the selections of its sparse kind");
  }
  const KvKind& sparse = config.kinds[s];
  if (config.row() != sparse.row_bytes) {
    return bad(fmt::format("row_bytes = {}: the groups hold the sparse kind '{}', whose row is {} B", config.row(),
                           sparse.name, sparse.row_bytes));
  }
  std::uint64_t layers = 0;
  for (std::uint32_t g = 0; g < config.num_groups; ++g) layers += config.layers_of(GroupId(g));
  if (layers != sparse.layers) {
    return bad(fmt::format("num_groups = {}: the groups hold {} layers, the sparse kind '{}' has {}",
                           config.num_groups, layers, sparse.name, sparse.layers));
  }
  if (config.kind_frame_bytes != 0) return ValidateKindFrames(config);
  return Ok();
}

}  // namespace ula
