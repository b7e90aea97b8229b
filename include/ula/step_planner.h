// StepPlanner: one decode step of one layer group on one rank (DP mode) (docs/ARCHITECTURE.md "One decode step of one layer group"):
//
//   1. validate every selected address (live, owned by its run's request, on this rank)
//                                                                  -> error, nothing changed
//   2. dedup the union of all queries' selections
//   3. look up: device-resident = hit (touch in the current round); host-resident = miss
//   4. device slots for misses: free slots first, then victims from the residency policy
//      (never a slot used in this round); a victim swaps places with the missed entry
//      (host shadows on, sparse/host_shadows.h: a victim with a live host shadow is evicted
//      by the table alone; one without is copied to a host slot of its own, a free one or
//      the oldest shadow's, in a device -> host batch waited before its slot is filled;
//      only when the host holds nothing but entries does it swap; a fetched entry's host
//      slot stays behind as its shadow, except after a swap)
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
// Host shadows on: the device -> host batch of victims without a shadow runs first; if it
// fails, those victims stay on device (their host slots go back, a reclaimed shadow stays
// reclaimed) and their misses stay on host; if it lands, the victims are published at
// their host slots. A victim evicted to its shadow is published before the copies (its
// bytes are already there); a failed copy into its slot frees that slot.
// Layout: steps 1-3 read one 16-byte record per (address, group) — location,
// owner tag, dedup stamp (src/core/address_records.h) — so a selection costs one cache
// line; the record of selection i + prefetch_distance is prefetched while i is processed.
// A hit's slot is written to out_slots in that same pass (a hit is never a victim), so only
// the selections of misses are looked up again after the publish.
//
// Threads (StepPlannerOptions::threads = T): steps 1-3 run on T threads, each owning the
// addresses of every T-th block of 4,096 addresses, so no two threads dedup or write the
// same record. Each thread scans the selections in order and keeps its hits and misses with
// their selection index; the lists are merged by that index, so hits, misses, claimed slots
// and the copy plan are exactly those of one thread, and an error names the same (first)
// selection as one thread would. The policy's Touch and the free-slot claims then run on
// the calling thread (PB-LRU's Touch splits its own pass, policy/pb_lru.h). Victims: with
// T > 1, PB-LRU as the pool's policy and at least parallel_claim_min_victims evictions in
// the step, they are claimed on the same T threads (PbLru::ClaimVictimsParallel: popcounts
// per word range, an exclusive prefix sum, each thread takes the ranks it owns) — exactly
// the victims, in the order, that one thread claims; otherwise on the calling thread. The
// output of the misses' selections runs on the T threads again.
// Implementation: the library path over the engine path. Step is the plan of
// src/step/dp_step.h (steps 1-4 and the copy plan, the one DP host step that
// EngineStepPlanner::Plan runs too), the backend running its descriptors, and the
// completion that publishes each by its outcome (docs/ARCHITECTURE.md, "The step's forms
// today"); one plan is pending per space, so Step is refused while an engine plan is.
// Lifetime: the planner holds the space by reference (the space outlives it); out_slots
// name device slots whose bytes DeviceSlotData returns, valid as stated there.
// Thread-safety: as AddressSpace (one driver thread calls Step; the planner's own worker
// threads run inside Step only).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "ula/address_space.h"
#include "ula/selection_run.h"
#include "ula/step_stats.h"

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

struct StepPlannerOptions {
  static constexpr std::uint32_t kMaxThreads = 64;
  static constexpr std::uint32_t kMaxPrefetchDistance = 256;
  static constexpr std::uint32_t kDefaultParallelClaimMinVictims = 1u << 22;
  std::uint32_t threads = 1;             // [1, kMaxThreads]: threads of steps 1-3
  std::uint32_t prefetch_distance = 16;  // [0, kMaxPrefetchDistance]: selections ahead (0: none)
  // >= 1: with threads > 1 and PB-LRU, a step evicting at least this many entries claims its
  // victims on the T threads; fewer are claimed on the calling thread (no fork/join). The
  // result is the same either way. 2^22, above every demand measured: on the 2-core
  // development machine (loaded) the parallel claim never beat the serial one, at any T or
  // demand up to 2^20 victims (there 1.33x slower at T = 2 with passive waiting, 10x with
  // spinning workers; its two fork/joins alone cost 44-68 us passive, 16-20 ms spinning),
  // while the serial claim costs 1.7-2.3 ns per victim and a group step evicts at most about
  // 5,900 entries at the admission limits (~10 us, 0.1-0.2 % of the step):
  // docs/BENCHMARKS.md, "Victims claimed in parallel". Lower it on a machine with free cores
  // after measuring with `ula bench planner --claim-sweep`.
  std::uint32_t parallel_claim_min_victims = kDefaultParallelClaimMinVictims;
  // kInvalidArgument naming the first bad field.
  Status Validate() const;
};

// What the planner did besides its result, for benchmarks and tests (the result does not
// depend on T; these do). Counted over every Step that reached the victim claims.
struct StepPlannerCounters {
  std::uint64_t claims = 0;           // steps that claimed at least one victim
  std::uint64_t parallel_claims = 0;  // of which on the T threads (PbLru::ClaimVictimsParallel)
  std::uint64_t victims = 0;          // victims claimed
  std::uint64_t claim_ns = 0;         // wall time of the victim claims (steady clock)
};

class StepPlanner {
 public:
  explicit StepPlanner(AddressSpace& space);
  ~StepPlanner();
  StepPlanner(const StepPlanner&) = delete;
  StepPlanner& operator=(const StepPlanner&) = delete;

  // kInvalidArgument for invalid options (Validate): the planner keeps its old options.
  Status SetOptions(const StepPlannerOptions& options);
  const StepPlannerOptions& options() const;
  const StepPlannerCounters& counters() const;

  // out_slots[i] = device slot holding input.selections[i] after the step. After an error
  // the contents of out_slots are unspecified (the space's state is as documented above).
  // kOutOfRange (rank, group), kInvalidArgument (out_slots.size() !=
  // selections.size(), runs that do not cover the selections, an address of another
  // rank), kNotFound (an address not live for its run's request), kResourceExhausted (no
  // room, or a new entry on host selected), kFailedPrecondition (an EngineStepPlanner's plan
  // is pending on the space): nothing changes. kIo (a failed transfer) with the state of
  // the contract above.
  Result<StepStats> Step(const StepInput& input, std::span<SlotId> out_slots);

 private:
  struct Impl;  // the one DP host step and its descriptors' outcomes (step_planner.cc)
  AddressSpace& space_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ula
