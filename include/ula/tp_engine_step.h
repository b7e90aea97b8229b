// TpEngineStepPlanner: the engine step API (step_planner.h) of a TP address space: the
// same selection array in, one FlashMLA index array per hosted rank out.
//
// Per step and layer group the planner reads the indexer's selection, int32
// [batch][q_len][top_k] logical addresses (-1: padding), and the request of each batch
// row, runs one TpStepPlanner step (tp_step_planner.h: the library's backend and fabric
// move the bytes, then publish), and writes, for hosted rank i (ranks()[i]), the rank's
// sparse attention index array indices[i][batch][q_len][top_k] int32:
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
// refusal of TpStepPlanner::Step (kOutOfRange, kNotFound: an address not live for its
// row's request, kResourceExhausted, kFailedPrecondition) change nothing, indices
// included. kIo (a transfer failed) leaves the state TpStepPlanner::Step documents for it
// and the index arrays untouched: no index names a slot that was not published.
//
// Two ways to execute a step, as the DP planner (step_planner.h):
//   Step()            the library's backend (and fabric) move the bytes, wait, publish,
//                     write the indices.
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
//   Modes: as StepPlanner's engine path in DP, Create refuses a space whose TpConfig has
//   stable_new_entries off (kFailedPrecondition). With
//   stable new entries (Allocate in tp_address_space.h) a new token goes to its home
//   rank's device, in a free slot or a victim's, and no step of its round moves it, so the
//   engine writes its KV where Lookup said right after Allocate (tests/tp/
//   tp_engine_loop_test.cc: the SGLang-style loop). One pinned on host (the device held only
//   this round's entries, or its victims' move failed) makes a step of the round that
//   selects it refuse (kResourceExhausted, on every rank).
//
// Unlike the DP planner, a step allocates (TpStepPlanner's plan is a value of vectors).
// Thread-safety: as TpStepPlanner (one thread drives a planner).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "ula/step_planner.h"
#include "ula/tp_address_space.h"
#include "ula/tp_fabric.h"
#include "ula/tp_step_planner.h"

namespace ula {

struct TpPlannedStep {
  std::uint64_t fence = 0;            // pass to Complete
  std::uint32_t num_descriptors = 0;  // written to out_descriptors[0, n), all hosted ranks
  // Descriptors [0, first_phase) are the remote fetches (TpAttention::kLocalBuffer; 0 at
  // home): every one of them must have completed, on every rank, before any of
  // [first_phase, n) starts.
  std::uint32_t first_phase = 0;
  std::vector<StepStats> stats; // [hosted] as planned
};

class TpEngineStepPlanner {
 public:
  // fabric as TpStepPlanner's. kInvalidArgument for a config that fails Validate.
  static Result<std::unique_ptr<TpEngineStepPlanner>> Create(TpAddressSpace& space, const EngineStepConfig& config,
                                                             TpFabric* fabric = nullptr,
                                                             TpPlannerOptions options = {});
  ~TpEngineStepPlanner();
  TpEngineStepPlanner(const TpEngineStepPlanner&) = delete;
  TpEngineStepPlanner& operator=(const TpEngineStepPlanner&) = delete;

  // The hosted ranks, in the order of the index arrays.
  std::span<const Rank> ranks() const;
  // Rows of a rank's shard device pool per group: at home, indices lie in [0, device_slots()).
  std::uint32_t device_slots() const;
  // The rows a rank's attention reads through its indices: device_slots(), plus the local
  // buffer's slots with TpAttention::kLocalBuffer.
  std::uint32_t index_slots() const;

  // requests[b]: the request of batch row b (a row of padding only is not looked up).
  // REQUIRES (checked): requests.size() == shape.batch, selections.size() == shape.size(),
  // indices.size() == ranks().size() * shape.size(). Returns the stats of each hosted rank.
  Result<std::vector<StepStats>> Step(GroupId group, const StepShape& shape,
                                            std::span<const RequestId> requests,
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
  // kInvalidArgument, kFailedPrecondition while a plan is pending); changes nothing.
  Result<RoundReservation> ReserveRound(std::span<const RoundDemand> demands) const;

  // The most descriptors one Plan writes (every hosted rank's device shard pool and local
  // buffer turned over).
  std::uint32_t max_descriptors() const;
  // Engine path, part 1: claims device and buffer slots, writes the indices (valid once
  // Complete publishes) and the descriptors. Errors as Step's refusals (nothing changes),
  // plus kResourceExhausted when out_descriptors has fewer rows than the step's home misses
  // and remote fetches (the message names how many it needed), and kFailedPrecondition
  // while a plan is pending or with kLocalBuffer and a fabric.
  Result<TpPlannedStep> Plan(GroupId group, const StepShape& shape, std::span<const RequestId> requests,
                             std::span<const std::int32_t> selections, std::span<std::int32_t> indices,
                             std::span<CopyDescriptor> out_descriptors);
  // Engine path, part 2: status[i] == 0 publishes descriptor i. kNotFound (not the pending
  // fence), kInvalidArgument (status size): nothing changes.
  Result<CompleteReport> Complete(std::uint64_t fence, std::span<const std::uint8_t> status);
  bool has_pending() const;
  // Runs descriptors over the space's shard pools: status[i] = 0 when descriptor i's batch
  // completed, 1 when it failed or names no hosted shard (nothing copied).
  // REQUIRES: status.size() == descriptors.size().
  void ExecuteOnShards(std::span<const CopyDescriptor> descriptors, std::span<std::uint8_t> status) const;

 private:
  TpEngineStepPlanner(TpAddressSpace& space, const EngineStepConfig& config, TpFabric* fabric,
                      TpPlannerOptions options);
  // The selection array compacted into (compact_, where_, runs_), after the shape and size checks.
  Status Compact(const StepShape& shape, std::span<const RequestId> requests, std::span<const std::int32_t> selections,
                 std::size_t indices_size);
  // The plan's refs as per-rank index arrays.
  void WriteIndices(const TpStepPlan& plan, std::size_t n, std::span<std::int32_t> indices) const;

  TpAddressSpace& space_;
  EngineStepConfig config_;
  TpStepPlanner planner_;
  std::vector<LogicalAddr> compact_;   // the non-padding selections, row-major
  std::vector<std::uint32_t> where_;   // compact_[j] was selections[where_[j]]
  std::vector<SelectionRun> runs_;
  std::uint64_t last_fence_ = 0;
  std::uint64_t pending_fence_ = 0;
  std::vector<std::uint32_t> pending_counts_;  // [hosted] home moves of the pending plan
  std::vector<std::uint32_t> pending_fetches_; // [hosted] remote fetches of the pending plan (local buffer)
};

}  // namespace ula
