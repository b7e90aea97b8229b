// AddressRecords: the location table of one layer group (logical address -> Location), the
// one such table in the library: the DP space keeps one per group, the gather and its bench
// read one. One 8-byte record per logical address holds both what the step planner reads
// (the location) and what it writes (the dedup stamp) for an (address, group), so that
// steps 1-3 of a step touch one cache line of the group per distinct selection:
//
//   bits [49:0]  the Location (the layout of ula/location_bits.h; 0 = none)
//   bits [63:50] dedup stamp: the step epoch (1..2^14-1) that last saw the address; planner
//                scratch, never part of a location, of Get() or of the state's digest
//
// The stamp lives in the 14 bits the location leaves unused, so the table stays 8 bytes per
// address per group (the metadata budget, docs/BENCHMARKS.md). The epoch counter is per
// table (one per group, shared by every planner over the space), so two planners never
// mistake each other's stamps; after 2^14 - 1 steps of a group its stamps are cleared once
// (O(size) every 16,383 steps).
//
// Invariants: records at or past size() are none; every stamp is <= epoch().
// Thread-safety: concurrent readers of locations are safe; a writer (Set, Erase, a stamp)
// needs exclusive access to its record (the planner's parallel pass gives every thread a
// disjoint set of addresses). Publishing a new location is a single 8-byte store, after the
// bytes arrived (docs/ARCHITECTURE.md invariant 2).
// Failure: none (REQUIRES are the callers' checks).
#pragma once

#include <cstdint>
#include <vector>

#include "core/huge_page_allocator.h"
#include "ula/ids.h"
#include "ula/location.h"

namespace ula {

class AddressRecords {
 public:
  static constexpr unsigned kStampShift = location_bits::kUsedBits;
  static constexpr std::uint64_t kLocationMask = location_bits::kMask;
  static constexpr std::uint32_t kMaxEpoch = (std::uint32_t{1} << (64 - kStampShift)) - 1;
  static_assert(Location::Make(Tier::kHost, Rank(0xffff), SlotId(0xffffffffu)).bits() <= kLocationMask,
                "a location must leave the stamp bits free");

  // Grows the table to hold addresses [0, n). Never shrinks.
  void Reserve(std::uint32_t n) {
    if (n > records_.size()) records_.resize(n, 0);
  }
  std::uint32_t size() const { return static_cast<std::uint32_t>(records_.size()); }

  // The location of `a`, or none if `a` is not live (or past the end).
  Location Get(LogicalAddr a) const {
    return a.value() < records_.size() ? Location::FromBits(records_[a.value()] & kLocationMask) : Location::None();
  }
  // REQUIRES: a < size(). Keeps the stamp.
  void Set(LogicalAddr a, Location loc) {
    std::uint64_t& r = records_[a.value()];
    r = (r & ~kLocationMask) | loc.bits();
  }
  void Erase(LogicalAddr a) {
    if (a.value() < records_.size()) records_[a.value()] = 0;
  }
  // Hints the cache that Get(a) comes soon.
  void Prefetch(LogicalAddr a) const {
    if (a.value() < records_.size()) __builtin_prefetch(&records_[a.value()], 0, 0);
  }
  static Location LocationOf(std::uint64_t record) { return Location::FromBits(record & kLocationMask); }
  static std::uint32_t StampOf(std::uint64_t record) { return static_cast<std::uint32_t>(record >> kStampShift); }
  static std::uint64_t WithStamp(std::uint64_t record, std::uint32_t epoch) {
    return (record & kLocationMask) | (std::uint64_t{epoch} << kStampShift);
  }
  std::uint64_t* data() { return records_.data(); }
  const std::uint64_t* data() const { return records_.data(); }

  // A fresh dedup epoch for one step: no record carries it yet.
  std::uint32_t NextEpoch() {
    if (++epoch_ > kMaxEpoch) {
      for (std::uint64_t& r : records_) r &= kLocationMask;
      epoch_ = 1;
    }
    return epoch_;
  }
  std::uint32_t epoch() const { return epoch_; }
  // For tests of the wrap: the next NextEpoch() returns `epoch` + 1 (clearing at the top).
  void SetEpochForTesting(std::uint32_t epoch) { epoch_ = epoch; }

  static constexpr std::size_t kBytesPerEntry = sizeof(std::uint64_t);
  std::size_t MemoryBytes() const { return records_.capacity() * sizeof(std::uint64_t); }

 private:
  std::vector<std::uint64_t, HugePageAllocator<std::uint64_t>> records_;  // [size] by logical address
  std::uint32_t epoch_ = 0;
};

}  // namespace ula
