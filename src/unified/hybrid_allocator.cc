#include "ula/hybrid_allocator.h"

#include "core/digest.h"

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

std::uint64_t HybridAllocator::DebugDigest() const {
  StateDigest d;
  for (const BlockInfo& b : LiveBlocks()) {
    for (std::uint64_t v : {std::uint64_t{b.id.value()}, std::uint64_t{b.kind.value()}, b.offset, std::uint64_t{b.pins}}) {
      d.Add(v);
    }
  }
  const AllocatorStats s = Stats();
  for (std::uint64_t v : {s.live_bytes, s.hole_bytes, s.middle_bytes, s.bytes_freed, s.bytes_moved, s.blocks_moved}) d.Add(v);
  return d.value();
}

}  // namespace ula
