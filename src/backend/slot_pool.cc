#include "backend/slot_pool.h"

#include <fmt/format.h>

namespace ula {

Result<SlotPool> SlotPool::Create(const Arena& arena, std::uint32_t slot_bytes, std::uint32_t capacity,
                                  SlotBlocks blocks) {
  if (slot_bytes == 0) return MakeError(ErrorCode::kInvalidArgument, "slot pool: slot_bytes must be > 0");
  if (capacity == SlotId::kInvalidValue) {
    return MakeError(ErrorCode::kInvalidArgument, "slot pool: capacity too large");
  }
  if (blocks.block_stride != 0 && blocks.block_stride < std::uint64_t{SlotBlocks::kRows} * slot_bytes) {
    return MakeError(ErrorCode::kInvalidArgument,
                     fmt::format("slot pool: a block stride of {} B is shorter than {} slots of {} B",
                                 blocks.block_stride, SlotBlocks::kRows, slot_bytes));
  }
  SlotPool pool(arena, slot_bytes, capacity, blocks);
  const std::uint64_t end = capacity == 0 ? 0 : pool.offset(SlotId(capacity - 1)) + slot_bytes;
  if (end > arena.bytes) {
    return MakeError(ErrorCode::kInvalidArgument,
                     fmt::format("slot pool: {} slots of {} B need {} B but the arena holds {} B", capacity,
                                 slot_bytes, end, arena.bytes));
  }
  return pool;
}

Result<SlotId> SlotPool::Allocate() {
  auto first = free_.FindFirst();
  if (!first) {
    return MakeError(ErrorCode::kResourceExhausted,
                     fmt::format("slot pool on {} rank {} is full ({} slots)", TierName(arena_.tier),
                                 arena_.rank.value(), capacity_));
  }
  free_.Clear(*first);
  return SlotId(static_cast<std::uint32_t>(*first));
}

Status SlotPool::Claim(SlotId slot) {
  if (slot.value() >= capacity_) {
    return MakeError(ErrorCode::kOutOfRange, fmt::format("slot {} is out of range (capacity {})", slot.value(), capacity_));
  }
  if (!free_.Test(slot.value())) {
    return MakeError(ErrorCode::kFailedPrecondition, fmt::format("slot {} is already allocated", slot.value()));
  }
  free_.Clear(slot.value());
  return Ok();
}

Status SlotPool::Free(SlotId slot) {
  if (slot.value() >= capacity_) {
    return MakeError(ErrorCode::kOutOfRange, fmt::format("slot {} is out of range (capacity {})", slot.value(), capacity_));
  }
  if (free_.Test(slot.value())) {
    return MakeError(ErrorCode::kFailedPrecondition, fmt::format("slot {} is already free", slot.value()));
  }
  free_.Set(slot.value());
  return Ok();
}

}  // namespace ula
