// DpStep: the one DP host step of a layer group on one rank, as a plan and its completion
// (docs/ARCHITECTURE.md, "One decode step of one layer group"). Both public forms sit over it:
//   - the engine path (EngineStepPlanner::Plan / Complete): Classify, Claim, WriteTargets;
//     the engine runs descriptors(); Complete publishes by the engine's statuses;
//   - the library path (StepPlanner::Step, EngineStepPlanner::Step): the same plan, Run on
//     the space's backend, Complete with each descriptor's outcome (WritePublished then
//     reads the misses' slots).
// So validate, dedup, classify, the room check, the claims and the copy plan exist once.
//
// Classify (steps 1-3): every selected address is checked (live, held by its run's request,
// on this rank), deduplicated by the records' stamps (src/core/address_records.h) and sorted
// into hits and misses; a hit's slot goes to out[i] in that pass, padding (the engine layout)
// gets kPadIndex. Then the refusals that need the whole step, TP's too: a new entry on host
// and the room check (GroupPools::RefuseMissesWithoutRoom). Changes nothing but the stamps.
// Threads (StepPlannerOptions::threads = T): thread t of T owns the addresses of every T-th
// block of 4,096 addresses, so no two threads dedup or write the same record; each scans the
// selections in order and keeps its hits and misses with their selection index; the lists
// are merged by that index, so hits, misses, claimed slots and the copy plan are those of one
// thread, and an error names the same (first) selection.
//
// Claim (step 4 and the copy plan): the hits are touched, free slots are claimed first, then
// victims (on the T threads with PB-LRU and at least parallel_claim_min_victims of them,
// PbLru::ClaimVictimsParallel: the same victims in the same order), and MissFills
// (step/miss_fills.h) decides and describes the fills. From then on one plan is pending, in
// MissFills' pending state, and the space knows it (Directory::BeginPlan) until Complete.
//
// Thread-safety: the space's driver thread; the step's worker threads run inside Classify,
// Claim and WritePublished only.
#pragma once

#include <cstdint>
#include <memory>
#include <span>

#include "ula/address_space.h"
#include "ula/backend.h"
#include "ula/selection_run.h"
#include "ula/step_arrays.h"
#include "ula/step_planner.h"
#include "ula/step_stats.h"

namespace ula {

// The selections of one step: addrs[i] is selection i's logical address; runs name each
// selection's request (selection_run.h) and cover addrs exactly (the caller checked).
struct DpSelections {
  std::span<const std::uint32_t> addrs;
  std::span<const SelectionRun> runs;
  // The engine layout: 0xFFFFFFFF (int32 -1) is padding (output kPadIndex), any other value
  // of the sign bit is refused (kInvalidArgument, "neither an address nor -1").
  bool padding = false;
};

class DpStep {
 public:
  explicit DpStep(AddressSpace& space);
  ~DpStep();  // a pending plan's claims stay (the space's check reports them)
  DpStep(const DpStep&) = delete;
  DpStep& operator=(const DpStep&) = delete;

  // kInvalidArgument for invalid options (Validate): the step keeps its old options.
  Status SetOptions(const StepPlannerOptions& options);
  const StepPlannerOptions& options() const;
  const StepPlannerCounters& counters() const;
  // Sizes the scratch for steps of up to max_selections selections and max_misses misses
  // over max_addresses addresses (then Classify, Claim and WriteTargets allocate nothing at
  // one thread until the space hands out more addresses; SetOptions keeps the sizes).
  void Reserve(std::size_t max_selections, std::size_t max_misses, std::size_t max_addresses);

  // Steps 1-3 and the refusals above. Out is SlotId (StepPlanner) or std::int32_t (the
  // engine's indices: Classify leaves them alone, WriteTargets writes them all; SlotId
  // output gets the hits' slots here and is unspecified after an error). kNotFound,
  // kInvalidArgument (the first failing selection's error), kResourceExhausted (no room, or
  // a new entry on host selected): nothing changed but the dedup stamps.
  // REQUIRES: rank and group in range; out has sel.addrs.size() elements; no plan pending.
  template <class Out>
  Result<StepStats> Classify(Rank rank, GroupId group, const DpSelections& sel, Out* out);
  // The misses of the last Classify.
  std::size_t num_misses() const;
  // Step 4 and the copy plan; adds the planned counters to stats. The plan is pending.
  // REQUIRES: the last Classify succeeded and nothing changed the space since.
  void Claim(StepStats& stats);
  std::uint64_t fence() const;
  std::span<const CopyDescriptor> descriptors() const;  // the pending plan's
  // The engine path: the indices of the last Classify<std::int32_t> into out: the hits'
  // slots, kPadIndex for padding, each miss's claimed slot (read once Complete published
  // it). REQUIRES: a plan pending; out as in Classify.
  void WriteTargets(std::int32_t* out);
  // The library path: runs the pending plan on the space's backend (MissFills::Run), each
  // descriptor's outcome into status. REQUIRES: status.size() == descriptors().size().
  Status Run(std::span<std::uint8_t> status);
  // Publishes the pending plan by status (MissFills::Publish) and ends it. Returns the
  // descriptors published. REQUIRES: a plan pending; status.size() == descriptors().size().
  std::size_t Complete(std::span<const std::uint8_t> status);
  bool pending() const;
  // The library path, after Complete: each miss's selection reads its published slot.
  void WritePublished(SlotId* out);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ula
