// TpStepPlanner: the TP host step, one decode step of one layer group for every rank this
// process hosts (docs/ARCHITECTURE.md "One decode step of one layer group"):
//
//   0. validate every selection (live address of its run's request, selection_run.h: a
//      stale or another request's address is refused), dedup the union once, and per hosted rank
//      split it into entries homed here (hit on device / miss on host) and entries homed
//      elsewhere (local-buffer hit / miss); check that each rank's misses fit in free plus
//      evictable slots -> all ranks agree (fabric collective) or the step fails with
//      nothing changed
//   1. home phase, per rank: host-resident entries of its own shard come onto device
//      exactly as in DP mode (free slots first, then policy victims; never a slot used in
//      this round): the engine path's plan (Plan's home moves, one plan with DP's:
//      src/step/miss_fills.h, host shadows included), its descriptors run on the backend,
//      waited on, then published by their outcomes (Complete's rules)
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
// A space with kinds (TpConfig::kinds, DeepSeek-V4; docs/ARCHITECTURE.md "Kinds under TP") is
// stepped at home as any TP space: its addresses are C4 entries, so a group's selections are
// a request's C4 entries, each read on its home a mod P; no other kind moves and no step
// changes a kind's page table (AttendKindsAtHome reads the other kinds where they live).
//
// The engine path (a planner made by Create), the DP engine path's API (step_planner.h) for
// a TP space: the same selection array in, one FlashMLA index array per hosted rank out.
//
// Per step and layer group the planner reads the indexer's selection, int32
// [batch][q_len][top_k] logical addresses (-1: padding), and the request of each batch
// row, runs the step above (Step: the library's backend and fabric move the bytes, then
// publish), and writes, for hosted rank i (ranks()[i]), the rank's sparse attention index
// array indices[i][batch][q_len][top_k] int32:
//
//   TpAttention::kAtHome      the device slot of the rank's own shard pool of the group
//                             (slot s of layer l at base(l) + s * layer_bytes) for an
//                             entry homed on the rank; -1 for padding AND for an entry
//                             homed on another rank. FlashMLA skips -1, so each rank's
//                             attention covers its own shard only: its output per query
//                             and head is a partial record, float
//                             [batch * q_len][num_heads][kv_lora_rank + 2] per rank
//                             ([acc | max logit | sum of exp], partial_attention.h), and
//                             MergeMlaPartials over the ranks' records in rank order gives
//                             the attention of the whole selection (tp_home_attention.h
//                             does the exchange by head owner).
//   TpAttention::kLocalBuffer every selection reads on the rank: an entry homed on it at
//                             its shard device slot s (index s), a copy of an entry homed
//                             elsewhere at its buffer slot b (index device_slots() + b),
//                             so an engine that lays each layer's device memory out as
//                             [device_slots() + buffer_slots][layer_bytes] (the shard pool,
//                             then the local buffer) reads both through one index array.
//                             -1 for padding only.
//
// Index values are valid until the next Step of the group after AdvanceRound(), or a
// Write/Free of the entry (TpAddressSpace::RefData's rule).
//
// Errors: kInvalidArgument (shape past the config, sizes, an address < -1), and every
// refusal of the step above (kOutOfRange, kNotFound: an address not live for its row's
// request, kResourceExhausted, kFailedPrecondition) change nothing, indices included. kIo
// (a transfer failed) leaves the state the step above documents for it and the index
// arrays untouched: no index names a slot that was not published.
//
// Two ways to execute a step in that layout, as the DP planner (step_planner.h):
//   Step(group, shape, ...) the library's backend (and fabric) move the bytes, wait,
//                     publish, write the indices.
//   Plan()/Complete() the engine runs the descriptors on its own streams, then calls
//                     Complete(fence, status per descriptor); only then are the new
//                     locations published. Plan writes the indices as they will read once
//                     published, and one descriptor array of two phases. A TP descriptor
//                     moves one whole group entry (num_layers 1, bytes = entry_bytes, offset
//                     = slot * entry_bytes; a TP pool's entry holds the group's layers side
//                     by side).
//                     Phase 1, descriptors [0, first_phase), kLocalBuffer only: every hosted
//                     rank's remote fetches, rank after rank (ranks() order): kCopy from the
//                     entry's home (src_rank, src_tier, src_slot: its shard pool, device or
//                     host, where the entry is now) into the fetching rank's local buffer
//                     (dst_rank, dst_tier kDevice, dst_slot in the index space above:
//                     device_slots() + the buffer slot, dst_offset = dst_slot * entry_bytes
//                     over the [shard device | local buffer] view).
//                     Phase 2, the rest: every hosted rank's home moves, rank after rank, in
//                     the DP engine path's order and semantics (step_planner.h, descriptor
//                     semantics and "Host shadows"; one plan, step/miss_fills.h):
//                     src_rank == dst_rank, from the shard's host pool to its device pool:
//                     kCopy into a free slot, then kCopy into the slot of a victim whose
//                     clean host shadow survives, then kEvict (the victim's row out to
//                     its host slot evict_slot, then the copy), then kSwap with a victim,
//                     which goes to the wanted entry's host slot. Every phase-1 descriptor
//                     must have completed, on every rank, before any phase-2 descriptor
//                     starts: a fetch reads a host slot that a swap overwrites (one stream
//                     in array order, or a barrier between).
//                     Status 0 publishes a descriptor (kEvictLanded: the victim's row
//                     landed, the fill did not); any other publishes nothing for it: a
//                     copy's free target or a fetch's buffer slot is freed again, a failed
//                     swap's victim keeps its bytes and slot (a failed swap must leave both
//                     ranges as they were).
//   Host shadows (TpConfig::host_shadows, src/space/host_shadows.h), as in DP: a victim
//                     whose shadow survives is published at its shadow by Complete with no
//                     descriptor of its own, whatever the statuses (its bytes are there; a
//                     failed copy into its slot sends the slot back to the pool). With kLocalBuffer, Plan needs every
//                     rank in this process (kFailedPrecondition with a fabric: a fetch names
//                     its home's slot). ExecuteOnShards is a CPU reference executor over
//                     the space's own pools (the library's backend, one batch per
//                     descriptor, in array order).
//   Between Plan and Complete one plan is pending: Step and a second Plan are refused
//   (kFailedPrecondition), and, as in DP, REQUIRES: no Allocate, Free or Write on the space
//   (a Write drops buffer copies a pending fetch targets).
//   Making a planner, as in DP (step_planner.h): the constructor gives the library path
//   only (the engine path's Plan, engine-layout Step and ReserveRound are refused with
//   kFailedPrecondition); Create(space, config, ...) gives both and refuses a config that
//   fails Validate (kInvalidArgument) and a space whose TpConfig has stable_new_entries
//   off (kFailedPrecondition). With
//   stable new entries (Allocate in tp_address_space.h) a new token goes to its home
//   rank's device, in a free slot or a victim's, and no step of its round moves it, so the
//   engine writes its KV where Lookup said right after Allocate (tests/tp/
//   tp_engine_loop_test.cc: the SGLang-style loop). One pinned on host (the device held only
//   this round's entries, or its victims' move failed) makes a step of the round that
//   selects it refuse (kResourceExhausted, on every rank).
//
// Unlike the DP planner, a step allocates (the plan is a value of vectors).
//
// Lifetime: the planner holds the space and the fabric by reference; both outlive it. A
// plan is a value; its refs name slots that RefData resolves, valid as stated there.
// Hosted ranks run on threads of their own, started once and kept, when options.parallel_ranks (the in-process
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

#include "ula/selection_run.h"
#include "ula/step_planner.h"
#include "ula/tp_address_space.h"
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
  bool parallel_ranks = true;  // each hosted rank on a thread of its own, kept for the planner's life
};

struct TpPlannedStep {
  std::uint64_t fence = 0;            // pass to Complete
  std::uint32_t num_descriptors = 0;  // written to out_descriptors[0, n), all hosted ranks
  // Descriptors [0, first_phase) are the remote fetches (TpAttention::kLocalBuffer; 0 at
  // home): every one of them must have completed, on every rank, before any of
  // [first_phase, n) starts.
  std::uint32_t first_phase = 0;
  std::vector<StepStats> stats; // [hosted] as planned
};

class TpStepPlanner {
 public:
  // fabric: nullptr when every rank is hosted in this process; otherwise the fabric whose
  // local rank the space hosts (the space must be Exposed on it).
  // The library path only (the engine path's calls are refused, above).
  explicit TpStepPlanner(TpAddressSpace& space, TpFabric* fabric = nullptr, TpPlannerOptions options = {});
  // Both paths, the engine path's scratch sized for config; refusals above.
  static Result<std::unique_ptr<TpStepPlanner>> Create(TpAddressSpace& space, const EngineStepConfig& config,
                                                       TpFabric* fabric = nullptr, TpPlannerOptions options = {});
  ~TpStepPlanner();
  TpStepPlanner(const TpStepPlanner&) = delete;
  TpStepPlanner& operator=(const TpStepPlanner&) = delete;

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

  // The hosted ranks, in the order of the index arrays.
  std::span<const Rank> ranks() const;
  // Rows of a rank's shard device pool per group: at home, indices lie in [0, device_slots()).
  std::uint32_t device_slots() const;
  // The rows a rank's attention reads through its indices: device_slots(), plus the local
  // buffer's slots with TpAttention::kLocalBuffer.
  std::uint32_t index_slots() const;

  // The engine layout on the library path. requests[b]: the request of batch row b (a row
  // of padding only is not looked up). REQUIRES (checked): requests.size() == shape.batch,
  // selections.size() == shape.size(), indices.size() == ranks().size() * shape.size().
  // Returns the stats of each hosted rank.
  Result<std::vector<StepStats>> Step(GroupId group, const StepShape& shape, std::span<const RequestId> requests,
                                      std::span<const std::int32_t> selections, std::span<std::int32_t> indices);

  // Admission that guarantees the round (StepPlanner::ReserveRound's contract, per
  // hosted rank): the scheduler calls it once per round, before any Allocate of it, with
  // every running request it means to schedule (in TP every rank steps every request). Ok
  // iff on every hosted rank r and group: the new tokens homed on r plus each request's
  // selections homed on r (at most min(max_selections, its tokens homed on r after the
  // round)) fit the shard's device slots this round has not used yet, the new tokens homed on
  // r fit its free device and host slots, and, with TpAttention::kLocalBuffer, each request's
  // selections homed elsewhere (at most min(max_selections, its tokens homed elsewhere)) fit
  // the rank's buffer slots not used this round. New tokens are homed by position (token i on
  // rank i mod P when P divides page_tokens, address_space.h "Pages"); otherwise every new
  // token counts on every rank (a bound). The split of a request's selections between the
  // ranks is the indexer's, so each rank is bounded by all of them: the bound admits up to P
  // times fewer requests than fit on average (tests/tp/tp_round_reservation_test.cc). A
  // round that keeps to its reservation has no Allocate and no Plan refused for room. With a fabric each process checks the rank it
  // hosts: admit the round only where every rank's reservation is Ok (the scheduler's
  // all-reduce). Returns the tightest (rank, group): its bound and room. Refusals as
  // StepPlanner::ReserveRound's (kResourceExhausted with the numbers, kNotFound,
  // kInvalidArgument, kFailedPrecondition while a plan is pending); changes nothing. With
  // the config's reserve = kQuantile each of those bounds is reserved as the measured
  // quantile of it (ReserveMode, ula/step_planner.h; the shares measured over every hosted
  // rank's plans): a Plan of the round may then be refused for room.
  Result<RoundReservation> ReserveRound(std::span<const RoundDemand> demands) const;

  // The most descriptors one Plan writes (every hosted rank's device shard pool and local
  // buffer turned over).
  std::uint32_t max_descriptors() const;
  // Engine path, part 1: claims device and buffer slots, writes the indices (valid once
  // Complete publishes) and the descriptors, as records or columns (ula/descriptor_sink.h).
  // Errors as Step's refusals (nothing changes), plus kInvalidArgument for columns refused
  // by DescriptorColumns::Rows, kResourceExhausted when out_descriptors has fewer rows than
  // the step's home misses and remote fetches (the message names how many it needed), and
  // kFailedPrecondition while a plan is pending or with kLocalBuffer and a fabric.
  Result<TpPlannedStep> Plan(GroupId group, const StepShape& shape, std::span<const RequestId> requests,
                             std::span<const std::int32_t> selections, std::span<std::int32_t> indices,
                             DescriptorSink out_descriptors);
  // Engine path, part 2: status[i] == 0 publishes descriptor i. kNotFound (not the pending
  // fence), kInvalidArgument (status size): nothing changes.
  Result<CompleteReport> Complete(std::uint64_t fence, std::span<const std::uint8_t> status);
  bool has_pending() const;  // a plan is pending between Plan and Complete
  // Runs descriptors over the space's shard pools: status[i] = 0 when descriptor i's batch
  // completed, 1 when it failed or names no hosted shard (nothing copied).
  // REQUIRES: status.size() == descriptors.size().
  void ExecuteOnShards(std::span<const CopyDescriptor> descriptors, std::span<std::uint8_t> status) const;

 private:
  // Plan in the runs layout: Step's phase 0 and agreement, then each hosted rank's home
  // phase up to its choice of device targets (hits touched; free slots first, then policy
  // victims) and, with
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

  // The selection array compacted into (compact_, where_, runs_), after the shape and size checks.
  Status Compact(const StepShape& shape, std::span<const RequestId> requests, std::span<const std::int32_t> selections,
                 std::size_t indices_size);
  // The plan's refs as per-rank index arrays.
  void WriteIndices(const TpStepPlan& plan, std::size_t n, std::span<std::int32_t> indices) const;
  // ReserveRound's measurement (reserve = kQuantile): each request's rows of a step that ran.
  void Measure(const StepShape& shape, std::span<const RequestId> requests, std::span<const std::int32_t> selections);

  struct Scratch;
  struct Engine;  // the engine path's config and scratch (step/tp_step_planner_engine.h); null: library only
  TpAddressSpace& space_;
  TpFabric* fabric_;
  TpPlannerOptions options_;
  std::unique_ptr<Scratch> scratch_;
  std::unique_ptr<Engine> engine_;
};

}  // namespace ula
