// TpStepPlanner: one decode step of one layer group for every rank this process hosts
// (TP mode, docs/ARCHITECTURE.md "One decode step of one layer group"):
//
//   0. validate every selection (live address of its run's request, selection_run.h: a
//      stale or another request's address is refused), dedup the union once, and per hosted rank
//      split it into entries homed here (hit on device / miss on host) and entries homed
//      elsewhere (local-buffer hit / miss); check that each rank's misses fit in free plus
//      evictable slots -> all ranks agree (fabric collective) or the step fails with
//      nothing changed
//   1. home phase, per rank: host-resident entries of its own shard come onto device
//      exactly as in DP mode (free slots first, then policy victims; never a slot used in
//      this round): the engine path's plan (PlanHome's, one plan with DP's:
//      src/step/miss_fills.h, host shadows included), its descriptors run on the backend,
//      waited on, then published by their outcomes (CompleteHome's rules)
//   -- barrier: every home is settled before anyone reads it --
//   2. remote phase, per rank: buffer hits are touched; misses get buffer slots (free first,
//      then victims of the buffer policy — read-only copies, dropped without write-back)
//      and are fetched from their home ranks in one batch per source rank; copy, wait,
//      then publish the buffer index
//   -- barrier: nobody mutates a home while another rank may still read it --
//   3. plan.refs[i][j] = where hosted rank i's attention reads selection j.
//
// With TpAttention::kAtHome there is no remote phase and no barrier: entries homed
// elsewhere get a kElsewhere ref, and each rank's attention covers only its own shard
// (AttendAtHome, tp_home_attention.h, computes and merges the partial outputs).
//
// Lifetime: the planner holds the space and the fabric by reference; both outlive it. A
// plan is a value; its refs name slots that RefData resolves, valid as stated there.
// Hosted ranks run on their own threads when options.parallel_ranks (the in-process
// engine). Thread-safety: a planner is driven by one thread at a time (TpPrefetcher, in
// tp_prefetcher.h, steps it on a worker thread, one step at a time); use one planner per
// thread to step different groups concurrently. A TpLayerSink's callbacks run on the
// stepping thread.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "ula/tp_address_space.h"
#include "ula/selection_run.h"
#include "ula/step_arrays.h"
#include "ula/step_stats.h"
#include "ula/tp_fabric.h"

namespace ula {

struct TpStepPlan {
  std::vector<Rank> ranks;                   // [hosted] the hosted ranks, in order
  std::vector<std::vector<TpReadRef>> refs;  // [hosted][selections]
  std::vector<StepStats> stats;        // [hosted]
  StepStats Total() const;
};

// The layer pipeline of one group step (TpPrefetcher, tp_prefetcher.h). A group entry is
// the group's layers side by side: layer l of an entry of E bytes is the sub-range
// [l * E / L, (l + 1) * E / L), L = layers(). With a sink, Step copies each remote miss as
// L strided sub-range copies (one batch per source rank, tier and layer, all submitted at
// once, layer 0 first), calls Planned(plan) with the step's refs once the buffer slots are
// chosen and the copies submitted, then Arrived(l, ok) for l = 0 .. L-1 as every hosted
// rank's layer-l copies arrived (ok = no copy of this step failed so far on any hosted rank),
// and only then publishes (a slot any of whose layers failed is not published). So the
// refs of Planned are valid for layer l's bytes from Arrived(l, true) on, and are published
// (valid as RefData says) only when Step returns a plan. Entries homed here that come from
// host (the home phase) move whole, before Planned: swaps are all-or-nothing per entry.
// Both callbacks run on the thread that called Step.
class TpLayerSink {
 public:
  virtual ~TpLayerSink() = default;
  virtual std::uint32_t layers() const = 0;
  virtual void Planned(const TpStepPlan& plan) = 0;
  virtual void Arrived(std::uint32_t layer, bool ok) = 0;
};

struct TpPlannerOptions {
  bool parallel_ranks = true;  // one thread per hosted rank in each phase
};

class TpStepPlanner {
 public:
  // fabric: nullptr when every rank is hosted in this process; otherwise the fabric whose
  // local rank the space hosts (the space must be Exposed on it).
  explicit TpStepPlanner(TpAddressSpace& space, TpFabric* fabric = nullptr, TpPlannerOptions options = {});
  ~TpStepPlanner();

  // selections: every query of every request of the batch, concatenated (as in DP mode);
  // runs: which request each selection belongs to (selection_run.h, covering them exactly).
  // kOutOfRange (group), kInvalidArgument (runs that do not cover the selections),
  // kNotFound (an address that is not live for its run's request: freed, reused by another
  // request, or another request's), kResourceExhausted (some rank's misses do not fit),
  // kFailedPrecondition (another rank refused; or the space does not host every rank and
  // no fabric was given, or the fabric's local rank is not the hosted one): nothing
  // changes. Collective when a fabric is used.
  //
  // kIo: a transfer failed (a backend batch, ula/backend.h, or a fabric fetch;
  // FaultInjectingBackend / FaultInjectingFabric inject them), named in the message, on a
  // hosted rank. The step still joins every collective, then fails with this documented
  // state: home phase as StepPlanner's contract (each batch waited on its own fence; a
  // failed batch publishes nothing — its entries stay on host with their bytes, free
  // slots go back; a completed batch is published); a rank whose home phase failed skips
  // its remote phase; in the remote phase, entries fetched by a completed batch or fetch
  // are published in the buffer, and an entry whose batch or fetch failed is not
  // buffered — its buffer slot goes back to the pool (free) — so no later step counts it
  // as a buffer hit. Buffer copies evicted for the step stay evicted (read-only copies:
  // their homes keep the bytes). Policies count the step's hits and victims as used in
  // this round. Other ranks' steps are unaffected. No entry is published before its
  // bytes arrived, no entry's bytes are lost, every invariant holds.
  //
  // sink: the layer pipeline above (nullptr: whole entries, no callbacks). With a sink:
  // kFailedPrecondition with a fabric, kInvalidArgument unless sink->layers() >= 1 divides
  // entry_bytes (nothing changes, no callback); a refused step calls no callback; on kIo
  // Planned was called and Arrived reported the first failed layer and every later one
  // with ok = false, and the state is the kIo state above.
  Result<TpStepPlan> Step(GroupId group, std::span<const LogicalAddr> selections,
                          std::span<const SelectionRun> runs, TpLayerSink* sink = nullptr);
  // Whether Step would refuse these selections now: its refusals (kOutOfRange,
  // kInvalidArgument, kNotFound, kResourceExhausted) or Ok; changes nothing. In-process
  // ranks only (kFailedPrecondition with a fabric, where the refusal is agreed inside
  // Step). Steps of other groups do not change the answer (their state is disjoint), so a
  // caller can check every group first.
  Status Check(GroupId group, std::span<const LogicalAddr> selections, std::span<const SelectionRun> runs);

  // The engine path (TpEngineStepPlanner::Plan / Complete, tp_engine_step.h): Step's
  // phase 0 and agreement, then each hosted rank's home phase up to its choice of device
  // targets (hits touched; free slots first, then policy victims) and, with
  // TpAttention::kLocalBuffer, its remote phase up to its choice of buffer slots (hits
  // touched; free slots first, then buffer victims, whose read-only copies are dropped),
  // with nothing moved and nothing published. The plan's refs name where each selection is
  // read once CompleteHome has published it (a home miss: its device target; a remote
  // miss: its buffer slot). The moves come in two phases, because a remote fetch reads its
  // entry's home where it is now (pending_remote_fetches, host or device) and a home swap
  // overwrites the wanted entry's host slot: every fetch of every rank must have completed
  // before any home move starts. Refusals as Step's, and kResourceExhausted when the hosted
  // ranks' home misses and remote fetches exceed max_moves; kFailedPrecondition while a
  // plan is pending (Step and Check refuse then too) and with kLocalBuffer and a fabric (a
  // fetch names its home's slot, which only the home's process knows: use Step). Refusals
  // change nothing. Collective when a fabric is used (the agreement).
  // REQUIRES: no Allocate, Free, Write or other planner's step on the space before
  // CompleteHome (CompleteHome aborts via ULA_CHECK when an entry of the plan was freed).
  Result<TpStepPlan> PlanHome(GroupId group, std::span<const LogicalAddr> selections,
                              std::span<const SelectionRun> runs, std::size_t max_moves);
  bool has_pending() const;
  // The home descriptors of hosted rank h's pending plan (ula/step_arrays.h; one entry row
  // each, offsets slot * entry_bytes in the shard's pools): descriptor i brings home miss i's
  // entry from its host slot to its device slot, as the DP engine path's (step_planner.h, "Host
  // shadows"): the copies into free slots, then those into shadowed victims' slots (a victim
  // whose clean host shadow survives is published at it by CompleteHome, with no descriptor of
  // its own), then kEvict (the victim's row out to a host slot of its own, then the copy),
  // then the swaps (the victim goes to the wanted entry's host slot). Without host shadows:
  // copies into free slots, then swaps. REQUIRES: has_pending(), h < hosted ranks.
  std::span<const CopyDescriptor> pending_home_descriptors(std::size_t h) const;
  // Fetch i of hosted rank h's pending plan (TpAttention::kLocalBuffer): the entry's home
  // rank and its location there now (the fetch reads it before any home move), and the
  // buffer slot of rank h it lands in. Offsets: slot * entry_bytes in the home's pool of
  // that tier and in rank h's local buffer. REQUIRES: has_pending(), h < hosted ranks.
  struct RemoteFetch {
    LogicalAddr addr;
    Rank home;
    Location source;
    std::uint64_t source_offset = 0;
    SlotId buffer_slot;
    std::uint64_t buffer_offset = 0;
  };
  std::vector<RemoteFetch> pending_remote_fetches(std::size_t h) const;
  // Publishes the pending plan: home descriptor i of hosted rank h by status(h, i)
  // (ula/step_arrays.h: kDescriptorDone, kEvictLanded, anything else failed), by the rules of
  // step/miss_fills.h (a shadowed victim goes to its shadow whatever the status; a failed
  // copy's target is freed again; a failed swap changes nothing: its victim keeps its bytes
  // and slot), and fetch i of rank h when fetched(h, i) (a failed fetch's buffer slot goes
  // back to the pool: no later step counts it a hit). Returns the descriptors published per
  // rank. REQUIRES: has_pending().
  std::vector<std::size_t> CompleteHome(const std::function<std::uint8_t(std::size_t h, std::size_t i)>& status,
                                        const std::function<bool(std::size_t h, std::size_t i)>& fetched = {});

 private:
  // Step's phase 0 into the scratch: validation, dedup, per-rank classification, and the
  // fit check (kResourceExhausted, not yet agreed). Changes nothing but the scratch.
  Status Classify(GroupId group, std::span<const LogicalAddr> selections, std::span<const SelectionRun> runs);

  // The plan of the step in the scratch; pending: this step's remote misses are not yet
  // published and are read from the scratch's buffer targets.
  // home_pending: PlanHome's claimed home targets are not yet published; their refs name them.
  TpStepPlan Emit(GroupId group, std::span<const LogicalAddr> selections, bool pending, bool home_pending) const;
  Status RefuseIfPending() const;
  // Classify's outcome on this rank, agreed with the others (collective with a fabric):
  // kResourceExhausted here, kFailedPrecondition where another rank's misses do not fit.
  Status Agree(GroupId group, Status local) const;

  struct Scratch;
  TpAddressSpace& space_;
  TpFabric* fabric_;
  TpPlannerOptions options_;
  std::unique_ptr<Scratch> scratch_;
};

}  // namespace ula
