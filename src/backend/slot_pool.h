// SlotPool: `capacity` equal cells of `slot_bytes` over one arena of one (tier, rank).
// Where a slot sits (SlotBlocks): slot s at s * slot_bytes, or, in blocks of 64 rows, at
// base + (s / 64) * block_stride + (s % 64) * slot_bytes (a space's frames share one arena
// among its kinds: src/space/frame_share.h).
// Tracks which cells are free in a HierBitmap (bit set = free), so Allocate and Free are
// O(levels) and Allocate returns the lowest free slot (dense use, fewer pages touched).
//
// Invariants: num_free() == free-bitmap count; slot s lives at arena offset offset(s).
// Errors leave the pool unchanged: Allocate on a full pool, Free of an out-of-range or
// already-free slot.
// Thread-safety: none; callers serialize.
#pragma once

#include <cstdint>

#include "ula/backend.h"
#include "ula/error.h"
#include "core/hier_bitmap.h"
#include "ula/ids.h"

namespace ula {

// The placement of a pool's slots in its arena: block_stride 0 is linear.
struct SlotBlocks {
  static constexpr std::uint32_t kRows = 64;  // slots per block
  std::uint64_t base = 0;
  std::uint64_t block_stride = 0;
};

class SlotPool {
 public:
  // The arena must hold every slot's bytes (linear: capacity * slot_bytes).
  static Result<SlotPool> Create(const Arena& arena, std::uint32_t slot_bytes, std::uint32_t capacity,
                                 SlotBlocks blocks = {});

  Result<SlotId> Allocate();
  Status Free(SlotId slot);
  // Allocates the given free slot. kOutOfRange, kFailedPrecondition (allocated).
  Status Claim(SlotId slot);
  bool IsAllocated(SlotId slot) const { return slot.value() < capacity_ && !free_.Test(slot.value()); }

  std::uint32_t capacity() const { return capacity_; }
  std::uint32_t num_free() const { return static_cast<std::uint32_t>(free_.Count()); }
  std::uint32_t num_used() const { return capacity_ - num_free(); }
  std::uint32_t slot_bytes() const { return slot_bytes_; }
  const Arena& arena() const { return arena_; }
  std::uint64_t offset(SlotId slot) const {
    const std::uint64_t s = slot.value();
    if (blocks_.block_stride == 0) return s * slot_bytes_;
    return blocks_.base + s / SlotBlocks::kRows * blocks_.block_stride + s % SlotBlocks::kRows * slot_bytes_;
  }
  const SlotBlocks& blocks() const { return blocks_; }
  // Pointer to the slot's bytes; nullptr on the counting backend.
  std::byte* data(SlotId slot) const { return arena_.data ? arena_.data + offset(slot) : nullptr; }
  const HierBitmap& free_bitmap() const { return free_; }
  // Makes the free set exactly `words` (free_bitmap().num_words() words, bit set = free):
  // a state kept elsewhere and copied back (DeviceStep::StoreInto). REQUIRES: no bit at or
  // past capacity is set.
  void AssignFreeWords(const std::uint64_t* words) {
    for (std::size_t w = 0; w < free_.num_words(); ++w) {
      const std::uint64_t now = free_.word(w);
      if (now == words[w]) continue;
      free_.AndNotWord(w, now & ~words[w]);
      free_.OrWord(w, words[w] & ~now);
    }
  }

  Status CheckInvariants() const { return free_.CheckInvariants(); }
  std::size_t MetadataBytes() const { return free_.MemoryBytes(); }

 private:
  SlotPool(const Arena& arena, std::uint32_t slot_bytes, std::uint32_t capacity, SlotBlocks blocks)
      : arena_(arena), slot_bytes_(slot_bytes), capacity_(capacity), blocks_(blocks), free_(capacity, /*all_set=*/true) {}

  Arena arena_;
  std::uint32_t slot_bytes_;
  std::uint32_t capacity_;
  SlotBlocks blocks_;
  HierBitmap free_;  // [capacity] bit set = slot free
};

}  // namespace ula
