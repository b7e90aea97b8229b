// HybridAllocator: the interface shared by the unified buffer (one arena for every kind of
// block of a hybrid model) and the fixed-split baseline (one pool per kind, sizes set at
// start), so that benchmarks and the small hybrid model run unchanged on either.
//
// Vocabulary:
//   kind          one kind of block with its own fixed size: a recurrent-state block (per
//                 request), a KV page envelope (all full-attention layers of one page), a
//                 sliding-window ring (per request). Kinds are indices into the config.
//   virtual block id (BlockId)  what requests and caches hold. A location table maps it to a
//                 physical byte offset; the offset may change (compaction), the id never does.
//                 Ids carry a generation: once freed, an id is refused (kNotFound) even after
//                 its table entry is reused, until that entry has been reallocated 1024 times.
//   demand        a number of blocks of each kind that must be allocated together
//                 (e.g. one state block + N KV pages for a new request).
//   pin           a counted "in use by computation or a transfer" mark. A pinned block is
//                 never moved. Pointers and offsets are stable only while the block is pinned.
//
// Contract of every implementation: a call that returns an Error has changed nothing, with
// one exception: UnifiedBuffer::AllocateDemand's kIo after a failed compaction move keeps
// the moves completed before it (their bytes arrived; every block keeps its bytes, none is
// allocated or freed: ula/unified_buffer.h, tests/unified/unified_fault_test.cc).
// Thread-safety: none; callers serialize.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "ula/error.h"
#include "ula/ids.h"

namespace ula {

// Index of a kind in the allocator's config.
using BlockKind = StrongId<struct BlockKindTag, std::uint8_t>;

// Which end of the unified buffer a kind grows from.
enum class BufferEnd : std::uint8_t {
  kLow = 0,   // offsets grow upward from 0 (per-request fixed-size blocks: state, window rings)
  kHigh = 1,  // offsets grow downward from the top (KV page envelopes)
};

struct KindConfig {
  std::string name;             // "state", "kv", "swa" — for messages and reports
  std::uint64_t block_bytes = 0;  // > 0, a multiple of the allocator's alignment
  BufferEnd end = BufferEnd::kLow;
};

// Blocks of each kind wanted at once. [num_kinds]
struct Demand {
  std::vector<std::uint32_t> blocks;

  static Demand Of(std::size_t num_kinds) { return Demand{std::vector<std::uint32_t>(num_kinds, 0)}; }
  Demand& Add(BlockKind kind, std::uint32_t n) {
    blocks.at(kind.value()) += n;
    return *this;
  }
};

// One live block as seen from outside (tests compare these before and after a failed call).
struct BlockInfo {
  BlockId id;
  BlockKind kind;
  std::uint64_t offset = 0;
  std::uint32_t pins = 0;
  auto operator<=>(const BlockInfo&) const = default;
};

struct AllocatorStats {
  std::uint64_t capacity_bytes = 0;   // the whole arena
  std::uint64_t reserved_bytes = 0;   // padding blocks, never allocated
  std::uint64_t live_bytes = 0;       // sum of live blocks
  std::uint64_t hole_bytes = 0;       // free bytes between live blocks (unified only)
  std::uint64_t middle_bytes = 0;     // free region between the two ends (unified only)
  std::vector<std::uint64_t> live_blocks_per_kind;  // [num_kinds]
  std::uint64_t bytes_freed = 0;      // cumulative: bytes of blocks freed
  std::uint64_t bytes_moved = 0;      // cumulative: bytes moved by compaction
  std::uint64_t blocks_moved = 0;     // cumulative: blocks moved by compaction
  auto operator<=>(const AllocatorStats&) const = default;
};

class HybridAllocator {
 public:
  virtual ~HybridAllocator() = default;
  HybridAllocator() = default;
  HybridAllocator(const HybridAllocator&) = delete;
  HybridAllocator& operator=(const HybridAllocator&) = delete;

  virtual std::size_t num_kinds() const = 0;
  virtual const KindConfig& kind_config(BlockKind kind) const = 0;

  // All blocks of the demand, or kResourceExhausted (nothing allocated) / kInvalidArgument.
  // Returned ids are grouped by kind in kind order. May compact (lazily) to make room.
  virtual Result<std::vector<BlockId>> AllocateDemand(const Demand& demand) = 0;
  Result<BlockId> Allocate(BlockKind kind);
  // Whether AllocateDemand(demand) would succeed now, counting free space, the holes between
  // live blocks and what compaction can recover. False for a malformed demand.
  virtual bool CanAllocate(const Demand& demand) const = 0;

  // kNotFound for an unknown or freed id; kFailedPrecondition for a pinned block.
  virtual Status Free(BlockId id) = 0;
  virtual Status Pin(BlockId id) = 0;
  // kFailedPrecondition when the block is not pinned.
  virtual Status Unpin(BlockId id) = 0;

  virtual Result<BlockKind> KindOf(BlockId id) const = 0;
  virtual Result<std::uint64_t> Offset(BlockId id) const = 0;
  // Batched lookup for a forward pass: offsets[i] = Offset(ids[i]). All-or-nothing: on an
  // unknown id (or a size mismatch) nothing is written.
  virtual Status Translate(std::span<const BlockId> ids, std::span<std::uint64_t> offsets) const = 0;
  // The arena's first byte; nullptr when the allocator holds no bytes (accounting only).
  virtual std::byte* base() = 0;
  // The block's bytes (empty span when holding no bytes). Stable while the block is pinned.
  Result<std::span<std::byte>> Bytes(BlockId id);

  // Moves unpinned blocks into holes now; returns the bytes moved (0 for the fixed split).
  virtual std::uint64_t Compact() = 0;

  virtual AllocatorStats Stats() const = 0;
  // Every live block, sorted by id (ids sort by their table index).
  virtual std::vector<BlockInfo> LiveBlocks() const = 0;
  virtual Status CheckInvariants() const = 0;
  // A hash of the whole state (core/digest.h), equal before and after a refused call; for
  // tests, O(state). The default hashes LiveBlocks() and Stats(); an implementation with
  // more state (free lists and their order, holes) overrides it.
  virtual std::uint64_t DebugDigest() const;
};

}  // namespace ula
