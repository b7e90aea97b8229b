// FixedSplitAllocator: the baseline for the unified buffer — one pool per kind, its size
// fixed at start as a fraction of the arena. Pool k is the byte range
// [base_k, base_k + slots_k * block_bytes_k), pools laid out in kind order; a block is a slot
// of its kind's pool and never moves. The first `padding_blocks` slots of the padding
// kind's pool are reserved (the engine's dummy page) and never allocated.
//
// Invariants: every slot of every pool is exactly one of {reserved, free (on its free list),
// live (in the table)}; pools do not overlap and fit in capacity_bytes.
// Thread-safety: none; callers serialize.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "ula/hybrid_allocator.h"

namespace ula {

namespace internal {
class BlockTable;
}  // namespace internal

struct FixedSplitConfig {
  std::uint64_t capacity_bytes = 0;
  std::vector<KindConfig> kinds;  // `end` is ignored
  // [num_kinds] share of capacity_bytes given to each kind's pool; each >= 0, sum <= 1.
  // A pool holds floor(fraction * capacity / block_bytes) blocks.
  std::vector<double> fractions;
  BlockKind padding_kind = BlockKind(0);
  std::uint32_t padding_blocks = 0;
  bool hold_bytes = true;

  Status Validate() const;
};

class FixedSplitAllocator final : public HybridAllocator {
 public:
  static Result<std::unique_ptr<FixedSplitAllocator>> Create(const FixedSplitConfig& config);
  ~FixedSplitAllocator() override;

  std::size_t num_kinds() const override { return config_.kinds.size(); }
  const KindConfig& kind_config(BlockKind kind) const override { return config_.kinds.at(kind.value()); }
  Result<std::vector<BlockId>> AllocateDemand(const Demand& demand) override;
  bool CanAllocate(const Demand& demand) const override;
  Status Free(BlockId id) override;
  Status Pin(BlockId id) override;
  Status Unpin(BlockId id) override;
  Result<BlockKind> KindOf(BlockId id) const override;
  Result<std::uint64_t> Offset(BlockId id) const override;
  Status Translate(std::span<const BlockId> ids, std::span<std::uint64_t> offsets) const override;
  std::byte* base() override { return bytes_.get(); }
  std::uint64_t Compact() override { return 0; }
  AllocatorStats Stats() const override;
  std::vector<BlockInfo> LiveBlocks() const override;
  Status CheckInvariants() const override;

  // Allocatable blocks of a kind's pool (reserved padding excluded).
  std::uint32_t pool_blocks(BlockKind kind) const;

 private:
  explicit FixedSplitAllocator(const FixedSplitConfig& config);

  struct Pool {
    std::uint64_t base = 0;
    std::uint32_t slots = 0;     // including reserved
    std::uint32_t reserved = 0;  // the first `reserved` slots
    std::vector<std::uint32_t> free_slots;  // LIFO; lowest slot on top initially
  };

  FixedSplitConfig config_;
  std::vector<Pool> pools_;  // [num_kinds]
  std::unique_ptr<std::byte[]> bytes_;
  std::unique_ptr<internal::BlockTable> table_;  // pos = slot index within the kind's pool
  std::uint64_t bytes_freed_ = 0;
};

}  // namespace ula
