#include "ula/hybrid_allocator.h"

namespace ula {

Result<BlockId> HybridAllocator::Allocate(BlockKind kind) {
  if (!kind.valid() || kind.value() >= num_kinds()) {
    return MakeError(ErrorCode::kInvalidArgument, "allocate: unknown block kind");
  }
  auto ids = AllocateDemand(Demand::Of(num_kinds()).Add(kind, 1));
  if (!ids) return std::unexpected(std::move(ids).error());
  return ids->front();
}

Result<std::span<std::byte>> HybridAllocator::Bytes(BlockId id) {
  auto offset = Offset(id);
  if (!offset) return std::unexpected(std::move(offset).error());
  auto kind = KindOf(id);
  std::byte* b = base();
  if (b == nullptr) return std::span<std::byte>();
  return std::span<std::byte>(b + *offset, kind_config(*kind).block_bytes);
}

}  // namespace ula
