// BlockTable: the location table of virtual block ids shared by the hybrid allocators.
// Entry i describes BlockId(i): live or free, its kind, its position (meaning set by the
// allocator) and its pin count. Freed ids are reused (LIFO).
//
// Invariants: num_live == number of live entries; every id on the free list is not live and
// appears once. Thread-safety: none.
#pragma once

#include <cstdint>
#include <vector>

#include "ula/error.h"
#include "ula/hybrid_allocator.h"

namespace ula::internal {

class BlockTable {
 public:
  struct Entry {
    std::uint64_t pos = 0;
    BlockKind kind;
    std::uint32_t pins = 0;
    bool live = false;
  };

  BlockId Add(BlockKind kind, std::uint64_t pos);
  // REQUIRES: id live and unpinned.
  void Remove(BlockId id);
  // The live entry, or kNotFound naming the id.
  Result<const Entry*> Find(BlockId id) const;
  Entry& at(BlockId id) { return entries_[id.value()]; }
  const std::vector<Entry>& entries() const { return entries_; }
  std::size_t num_live() const { return num_live_; }
  Status CheckInvariants() const;

 private:
  std::vector<Entry> entries_;
  std::vector<std::uint32_t> free_ids_;
  std::size_t num_live_ = 0;
};

}  // namespace ula::internal
