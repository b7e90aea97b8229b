// AddressRecords: the DP location table of one layer group as one 16-byte record per
// logical address — everything the step planner's hot path reads and writes for an
// (address, group) in one cache line (issue 16, item 2):
//
//   bytes [0, 8)   location   (ula/location.h; none = not live in this group)
//   bytes [8, 12)  owner tag  of the request holding the address (0 = free): a copy of
//                  AddressSpace::State::owner, so the isolation check reads no other line
//   bytes [12, 16) dedup stamp: the step epoch that last saw the address (planner scratch,
//                  never part of the state's meaning or digest)
//
// Four records share a 64-byte line; records are 16-byte aligned, so none straddles two.
// The epoch counter lives here too (one per group, shared by every planner of the space),
// so two planners over one space can never mistake each other's stamps.
//
// Invariants: records at or past size() are none (Get returns none); a live address's owner
// equals State::owner (AddressSpace::CheckInvariants checks it); every stamp is <= epoch().
// Thread-safety: concurrent readers are safe; writers need exclusive access per record (the
// planner's parallel pass gives every thread a disjoint set of addresses). Publishing a new
// location is a single 8-byte store, after the bytes arrived (DESIGN.md invariant 2).
// Failure: none (REQUIRES are checked by the callers).
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "ula/huge_page_allocator.h"
#include "ula/ids.h"
#include "ula/location.h"

namespace ula {

struct alignas(16) AddressRecord {
  std::uint64_t loc = 0;     // Location::bits()
  std::uint32_t owner = 0;   // owner tag, 0 = free
  std::uint32_t stamp = 0;   // dedup epoch
};
static_assert(sizeof(AddressRecord) == 16);

class AddressRecords {
 public:
  // Grows the table to hold addresses [0, n). Never shrinks.
  void Reserve(std::uint32_t n) {
    if (n > records_.size()) records_.resize(n);
  }
  std::uint32_t size() const { return static_cast<std::uint32_t>(records_.size()); }

  Location Get(LogicalAddr a) const {
    return a.value() < records_.size() ? Location::FromBits(records_[a.value()].loc) : Location::None();
  }
  // REQUIRES: a < size().
  void Set(LogicalAddr a, Location loc) { records_[a.value()].loc = loc.bits(); }
  void SetOwner(LogicalAddr a, std::uint32_t tag) { records_[a.value()].owner = tag; }
  void Erase(LogicalAddr a) {
    if (a.value() < records_.size()) records_[a.value()] = AddressRecord{};
  }
  // REQUIRES: a < size().
  AddressRecord& record(LogicalAddr a) { return records_[a.value()]; }
  const AddressRecord& record(LogicalAddr a) const { return records_[a.value()]; }
  AddressRecord* data() { return records_.data(); }
  const AddressRecord* data() const { return records_.data(); }

  // A fresh dedup epoch for one step: no record carries it yet. On the wrap after 2^32 - 1
  // steps every stamp is cleared once (O(size)).
  std::uint32_t NextEpoch() {
    if (++epoch_ == 0) {
      for (AddressRecord& r : records_) r.stamp = 0;
      epoch_ = 1;
    }
    return epoch_;
  }
  std::uint32_t epoch() const { return epoch_; }

  static constexpr std::size_t kBytesPerEntry = sizeof(AddressRecord);
  std::size_t MemoryBytes() const { return records_.capacity() * sizeof(AddressRecord); }

 private:
  std::vector<AddressRecord, HugePageAllocator<AddressRecord>> records_;  // [size] by logical address
  std::uint32_t epoch_ = 0;
};

}  // namespace ula
