// UnifiedBuffer: one arena shared by every kind of block of a hybrid model.
//
// Layout (physical offsets):
//
//   0 ............ low top | middle (free) | high top ........ usable | padding
//   [state + window rings ->]              [<- KV page envelopes     ][reserved]
//
//   * Low-end kinds (recurrent-state blocks and sliding-window rings) grow upward from 0.
//   * High-end kinds (full-attention KV page envelopes) grow downward from `usable`.
//   * `padding_blocks` blocks of `padding_kind` at the very top are reserved: the page that
//     padded batch lanes write into (an engine's dummy page). They are never allocated.
//   * Either end takes from the middle; there is no split to tune.
//
// Where sliding-window KV lives (design choice): a sliding-window layer only ever needs the
// last `window` tokens, so its KV is a fixed-size per-request ring block — the same shape
// as a recurrent state — and it lives at the low end next to the states. Cost: a request
// shorter than the window still reserves the whole ring (waste = (window - length) tokens of
// one layer's KV), and a prefix checkpoint must copy the ring together with the state. Gain:
// no per-token page churn for that layer, the ring is written in place like a state, and a
// checkpoint (state + ring) restores the layer exactly at the saved position. The other
// option (HybridModelConfig::window_in_pages, PrefixCacheConfig::sliding_window) keeps the
// window as window pages, one per KV page, released outside the window; it holds less for
// windows of several pages and more for windows shorter than a page (docs/RESULTS.md).
//
// Holes and compaction: a block freed between live blocks of its end leaves a hole.
// Allocation fills holes first (first fit, nearest the edge), then takes the middle. A hole
// touching the middle is merged into it. Compaction moves the outermost unpinned block of an
// end into the innermost hole it fits and changes only its table entry (BlockId -> offset);
// pinned blocks never move. Modes: kEager compacts an end whenever a block of it is freed
// or unpinned; kLazy compacts only when an allocation needs the space. CanAllocate
// simulates the exact placement (with and without compaction) on a copy of the metadata.
//
// Memory: the bytes live in a Backend arena (include/ula/backend.h), like every pool of the
// project. Create(config, arena) places the buffer on an arena the caller created (and keeps
// alive): arena.data == nullptr (the counting backend) means accounting only. Create(config)
// is the convenience path for tests and tools: it owns a CPU backend (no copy threads) and
// one device arena on rank 0, or no arena at all when hold_bytes is false. Compaction moves
// bytes with memcpy inside the arena (host memory on the CPU backend), or, with
// Create(config, arena, mover), as copy batches of the backend that owns the arena.
//
// Failed compaction moves (a mover batch that fails: ula/backend.h; FaultInjectingBackend
// injects them): each move copies the block into the hole first (free space), waits, and
// only then changes the block's table entry. A failed move leaves that block where it was
// with its bytes, ends the compaction, and keeps the moves completed before it (their
// bytes arrived); every invariant holds, no block loses bytes. Compact() then returns the
// bytes moved so far; AllocateDemand that needed the compaction returns kIo naming the
// failed move, with nothing allocated, unless the demand fits anyway; Free and Unpin
// succeed (eager compaction is best-effort).
//
// Invariants (CheckInvariants): the live blocks and holes of each end tile [0, top) of that
// end exactly; no hole touches the top; low top + high top <= usable; every live table
// entry appears once in its end at its offset; pin counts match the ends' pinned flags.
// Thread-safety: none; callers serialize.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "ula/backend.h"
#include "ula/hybrid_allocator.h"

namespace ula {

namespace internal {
class EndLayout;
class BlockTable;
}  // namespace internal

enum class CompactionMode : std::uint8_t { kEager, kLazy };

struct UnifiedBufferConfig {
  std::uint64_t capacity_bytes = 0;
  std::uint64_t alignment = 64;  // every block size is a multiple of it
  std::vector<KindConfig> kinds;
  BlockKind padding_kind = BlockKind(0);
  std::uint32_t padding_blocks = 0;
  CompactionMode compaction = CompactionMode::kLazy;
  bool hold_bytes = true;  // Create(config) only; false: accounting only (large simulations)

  // Names the first bad field.
  Status Validate() const;
};

class UnifiedBuffer final : public HybridAllocator {
 public:
  // Convenience path: an owned CPU-backend arena (or none when !config.hold_bytes).
  static Result<std::unique_ptr<UnifiedBuffer>> Create(const UnifiedBufferConfig& config);
  // On the caller's arena, which must hold at least capacity_bytes and outlive the buffer;
  // config.hold_bytes is ignored (arena.data decides). kInvalidArgument when it is too small.
  static Result<std::unique_ptr<UnifiedBuffer>> Create(const UnifiedBufferConfig& config, const Arena& arena);
  // As above, with compaction moving bytes through `mover` (which must own the arena and
  // outlive the buffer); kInvalidArgument when the arena is not the mover's.
  static Result<std::unique_ptr<UnifiedBuffer>> Create(const UnifiedBufferConfig& config, const Arena& arena,
                                                       Backend& mover);
  ~UnifiedBuffer() override;

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
  std::byte* base() override { return bytes_; }
  std::uint64_t Compact() override;
  AllocatorStats Stats() const override;
  std::vector<BlockInfo> LiveBlocks() const override;
  Status CheckInvariants() const override;
  // A hash of the whole state (block table with generations and pins, the free-id FIFO in
  // order, both ends' blocks and holes, counters): equal before and after a refused call.
  // For tests; O(state). core/digest.h.
  std::uint64_t DebugDigest() const override;

  // Offset of the first reserved padding byte (== usable bytes).
  std::uint64_t padding_offset() const { return usable_; }
  const UnifiedBufferConfig& config() const { return config_; }
  // The arena the bytes live in (bytes == 0 and no data when accounting only).
  const Arena& arena() const { return arena_; }

 private:
  explicit UnifiedBuffer(const UnifiedBufferConfig& config);

  enum class Plan { kFits, kFitsAfterCompaction, kNoFit };
  Plan PlanDemand(const Demand& demand) const;
  Status ValidateDemand(const Demand& demand) const;
  std::uint64_t CompactEnd(int end);
  std::uint64_t PhysicalOffset(int end, std::uint64_t pos, std::uint64_t size) const;

  UnifiedBufferConfig config_;
  std::uint64_t usable_ = 0;  // capacity - padding
  std::unique_ptr<Backend> owned_backend_;  // Create(config) only; owns arena_
  Backend* mover_ = nullptr;                // compaction's copies, or memcpy when null
  std::string compaction_error_;            // the last failed move of the current compaction
  Arena arena_;
  std::byte* bytes_ = nullptr;  // arena_.data: [capacity_bytes] or null
  std::array<std::unique_ptr<internal::EndLayout>, 2> ends_;  // [kLow, kHigh]
  std::unique_ptr<internal::BlockTable> table_;
  std::uint64_t bytes_freed_ = 0;
  std::uint64_t bytes_moved_ = 0;
  std::uint64_t blocks_moved_ = 0;
};

}  // namespace ula
