// StepPlanner: one decode step of one layer group on one rank (DP mode), DESIGN.md Part A:
//
//   1. validate every selected address (live, owned by its run's request, on this rank)
//                                                                  -> error, nothing changed
//   2. dedup the union of all queries' selections
//   3. look up: device-resident = hit (touch in the current round); host-resident = miss
//   4. device slots for misses: free slots first, then victims from the residency policy
//      (never a slot used in this round); a victim swaps places with the missed entry
//   5. copy (backend batches), wait for the fence, and only then publish the new locations
//   6. write, for every selection in input order, the device slot attention reads
//
// If the step's distinct selections cannot all be on device at once (more than the free
// plus evictable slots: entries allocated or selected in this round are not evictable),
// the step fails with kResourceExhausted before touching anything; its message counts
// the entries used in this round and says to call AdvanceRound() after the round's
// attention.
//
// A failed transfer (kIo from the backend, ula/backend.h; FaultInjectingBackend injects
// them) fails the step with kIo naming the batch, after this documented state: the
// host->device copies into free slots and the swaps with victims are two batches, each
// waited on its own fence. A failed batch publishes nothing: its entries stay on host at
// their old slots with their bytes (a failed copy only wrote free device slots, which go
// back to the pool; a failed swap exchanged nothing, its victims stay on device). A batch
// that completed is published as on success (its bytes arrived). In the residency policy
// the step's hits and claimed victims count as used in this round. No entry is published
// before its bytes arrived; no entry's bytes are lost; every invariant holds.
// Lifetime: the planner holds the space by reference (the space outlives it); out_slots
// name device slots whose bytes DeviceSlotData returns, valid as stated there.
// Thread-safety: as AddressSpace (one driver thread).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "ula/address_space.h"
#include "ula/selection_run.h"

namespace ula {

struct StepInput {
  Rank rank;
  GroupId group;
  // The selected addresses of every query of every request of the batch, concatenated in
  // selection order (e.g. request 0 query 0's top-k, then request 0 query 1's, ...).
  std::span<const LogicalAddr> selections;
  // Which request each selection belongs to (selection_run.h): runs of consecutive
  // selections, covering them exactly. The isolation check: a selection whose address is
  // not live for its run's request (freed, reused by another request, or another
  // request's) fails the step with kNotFound.
  std::span<const SelectionRun> runs;
};

struct StepStats {
  std::uint64_t selections = 0;
  std::uint64_t distinct = 0;
  std::uint64_t hits = 0;          // distinct entries already on device
  std::uint64_t misses = 0;        // distinct entries fetched from host
  std::uint64_t into_free = 0;     // misses placed in free device slots
  std::uint64_t evictions = 0;     // misses that displaced a victim (swaps)
  std::uint64_t bytes_moved = 0;   // both directions
  StepStats& operator+=(const StepStats& o);
};

class StepPlanner {
 public:
  explicit StepPlanner(AddressSpace& space);

  // out_slots[i] = device slot holding input.selections[i] after the step.
  // kOutOfRange (rank, group), kInvalidArgument (out_slots.size() !=
  // selections.size(), runs that do not cover the selections, an address of another
  // rank), kNotFound (an address not live for its run's request), kResourceExhausted:
  // nothing changes. kIo (a failed transfer) with the state of the contract above.
  Result<StepStats> Step(const StepInput& input, std::span<SlotId> out_slots);

 private:
  AddressSpace& space_;
  std::vector<std::uint32_t> seen_epoch_;  // [addresses] dedup stamps
  std::uint32_t epoch_ = 0;
  std::vector<LogicalAddr> distinct_, missed_;
  std::vector<SlotId> hit_slots_, target_slots_;
};

}  // namespace ula
