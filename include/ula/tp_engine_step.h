// TpEngineStepPlanner: the engine step API (engine_step.h) of a TP address space: the
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
// Unlike the DP planner, a step allocates (TpStepPlanner's plan is a value of vectors).
// Thread-safety: as TpStepPlanner (one thread drives a planner).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "ula/engine_step.h"
#include "ula/tp_address_space.h"
#include "ula/tp_fabric.h"
#include "ula/tp_step_planner.h"

namespace ula {

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
  Result<std::vector<TpRankStepStats>> Step(GroupId group, const StepShape& shape,
                                            std::span<const RequestId> requests,
                                            std::span<const std::int32_t> selections, std::span<std::int32_t> indices);

 private:
  TpEngineStepPlanner(TpAddressSpace& space, const EngineStepConfig& config, TpFabric* fabric,
                      TpPlannerOptions options);

  TpAddressSpace& space_;
  EngineStepConfig config_;
  TpStepPlanner planner_;
  std::vector<LogicalAddr> compact_;   // the non-padding selections, row-major
  std::vector<std::uint32_t> where_;   // compact_[j] was selections[where_[j]]
  std::vector<SelectionRun> runs_;
};

}  // namespace ula
