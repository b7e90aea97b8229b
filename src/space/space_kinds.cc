#include "space/space_kinds.h"

#include <fmt/format.h>

#include "ula/kv_kinds.h"

namespace ula {

Status ValidateSpaceKinds(const AddressSpaceConfig& config) {
  if (config.kinds.empty()) return Ok();
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
  return Ok();
}

}  // namespace ula
