// LocationTable: logical address -> Location for one layer group. A dense array indexed by
// address, 8 bytes per address; a none Location marks an address that is not live in this
// group. Translate() serves a whole step's lookups in one call.
//
// Invariants: entries at or past size() are none.
// Thread-safety: concurrent readers are safe; a writer needs exclusive access. Publishing
// a new location is a single 8-byte store (after the bytes have arrived — the caller's
// duty, DESIGN.md invariant 2).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "core/huge_page_allocator.h"
#include "ula/ids.h"
#include "ula/location.h"

namespace ula {

class LocationTable {
 public:
  // Grows the table to hold addresses [0, n). Never shrinks.
  void Reserve(std::uint32_t n) {
    if (n > table_.size()) table_.resize(n);
  }
  std::uint32_t size() const { return static_cast<std::uint32_t>(table_.size()); }

  // The location of `a`, or none if `a` is not live (or past the end).
  Location Get(LogicalAddr a) const { return a.value() < table_.size() ? table_[a.value()] : Location::None(); }
  // REQUIRES: a < size().
  void Set(LogicalAddr a, Location loc) { table_[a.value()] = loc; }
  void Erase(LogicalAddr a) {
    if (a.value() < table_.size()) table_[a.value()] = Location::None();
  }
  // Hints the cache that Get(a) comes soon.
  void Prefetch(LogicalAddr a) const {
    if (a.value() < table_.size()) __builtin_prefetch(&table_[a.value()], 0, 0);
  }
  // out[i] = Get(addrs[i]). REQUIRES: out.size() == addrs.size().
  void Translate(std::span<const LogicalAddr> addrs, std::span<Location> out) const;

  static constexpr std::size_t kBytesPerEntry = sizeof(Location);
  std::size_t MemoryBytes() const { return table_.capacity() * sizeof(Location); }

 private:
  std::vector<Location, HugePageAllocator<Location>> table_;  // [size] indexed by logical address
};

}  // namespace ula
