// BlockTable: the location table of virtual block ids shared by the hybrid allocators.
// Entry i describes the block at table index i: live or free, its kind, its position
// (meaning set by the allocator), its pin count and its generation.
//
// Id format: a BlockId packs (index << kGenerationBits) | generation into its 32 bits, so
// ids sort by table index. Freeing an entry bumps its generation; an id is accepted only
// while its generation equals the entry's, so a freed id is refused (kNotFound) even after
// its index has been handed out again. Bound: the generation has kGenerationBits = 10 bits,
// so a stale id could alias a newer block only after its index has been reallocated 1024
// times; freed indices are reused first-in first-out, so that takes at least 1024
// allocations of that index and, in practice, 1024 x (indices free at the time) allocations.
// At most kMaxEntries = 2^22 - 1 entries (the all-ones id stays BlockId::Invalid()).
//
// Invariants: num_live == number of live entries; every index on the free queue is not live
// and appears once; live + queued == entries; every generation < 2^kGenerationBits.
// Thread-safety: none.
#pragma once

#include <cstdint>
#include <deque>
#include <vector>

#include "ula/error.h"
#include "ula/hybrid_allocator.h"

namespace ula::internal {

class BlockTable {
 public:
  static constexpr int kGenerationBits = 10;
  static constexpr std::uint32_t kGenerationMask = (1u << kGenerationBits) - 1;
  static constexpr std::uint32_t kMaxEntries = (1u << (32 - kGenerationBits)) - 1;

  struct Entry {
    std::uint64_t pos = 0;
    BlockKind kind;
    std::uint16_t generation = 0;
    std::uint32_t pins = 0;
    bool live = false;
  };

  static constexpr std::uint32_t IndexOf(BlockId id) { return id.value() >> kGenerationBits; }
  static constexpr std::uint32_t GenerationOf(BlockId id) { return id.value() & kGenerationMask; }

  // Whether n more blocks can get an id (the table is bounded by kMaxEntries).
  bool CanAdd(std::uint64_t n) const {
    return n <= free_ids_.size() + (kMaxEntries - entries_.size());
  }
  // REQUIRES: CanAdd(1).
  BlockId Add(BlockKind kind, std::uint64_t pos);
  // REQUIRES: id live and unpinned.
  void Remove(BlockId id);
  // The live entry, or kNotFound naming the id (unknown, freed, or of an older generation).
  Result<const Entry*> Find(BlockId id) const;
  // The live entry or nullptr; the same test as Find without building an error.
  const Entry* FindLive(BlockId id) const {
    const std::uint32_t index = IndexOf(id);
    if (!id.valid() || index >= entries_.size()) return nullptr;
    const Entry& e = entries_[index];
    return e.live && e.generation == GenerationOf(id) ? &e : nullptr;
  }
  // REQUIRES: Find(id) succeeded.
  Entry& at(BlockId id) { return entries_[IndexOf(id)]; }
  // The current id of the entry at `index` (live or not).
  BlockId IdAt(std::uint32_t index) const {
    return BlockId((index << kGenerationBits) | entries_[index].generation);
  }
  const std::vector<Entry>& entries() const { return entries_; }
  // Freed indices in reuse order (oldest first).
  const std::deque<std::uint32_t>& free_ids() const { return free_ids_; }
  std::size_t num_live() const { return num_live_; }
  Status CheckInvariants() const;

 private:
  std::vector<Entry> entries_;      // [table size]
  std::deque<std::uint32_t> free_ids_;  // FIFO: oldest freed index first
  std::size_t num_live_ = 0;
};

}  // namespace ula::internal
