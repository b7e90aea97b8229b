// Attention at home for TP mode (TpAttention::kAtHome; docs/ARCHITECTURE.md "TP attention
// at home"): the CPU reference of what an engine's kernels and collectives do per layer
// after TpStepPlanner::Step.
//
//   1. Partial: every hosted rank computes, for each query of the step, the partial record
//      of every head over the selected entries of its own shard (the plan's kShard refs,
//      in selection order; PartialMlaAttention, partial_attention.h).
//   2. Exchange by head owner: rank r owns heads [r H / P, (r + 1) H / P) (OwnedHeads) and
//      receives, from every rank, the records of its own heads — in-process by copying,
//      with a fabric by one AllToAllV. Each rank sends (P - 1) / P of its records.
//   3. Merge: per owned head and query, the P records in rank order (MergeMlaPartials).
//
// The output of a hosted rank is [queries][owned heads][kv_lora_rank]: what the rank's
// slice of the output projection consumes next under TP. It is a pure function of the
// entries' bytes and the queries, the same bits on every engine (in-process or MPI).
//
// Thread-safety: reads the space; must not overlap a Step or a mutation of the group.
// Collective when a fabric is used (every rank calls it with its own plan, same bounds).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "ula/error.h"
#include "ula/partial_attention.h"
#include "ula/tp_address_space.h"
#include "ula/tp_fabric.h"
#include "ula/tp_step_planner.h"

namespace ula {

struct HeadRange {
  std::uint32_t begin = 0, end = 0;
  std::uint32_t count() const { return end - begin; }
  bool operator==(const HeadRange&) const = default;
};

// The heads `rank` owns out of num_heads over num_ranks (contiguous; some ranks own none
// when num_heads < num_ranks). REQUIRES: rank < num_ranks.
HeadRange OwnedHeads(std::uint32_t num_heads, std::uint32_t num_ranks, Rank rank);

struct TpHomeAttention {
  std::vector<Rank> ranks;                  // [hosted], as in the plan
  std::vector<HeadRange> heads;             // [hosted] the heads each owns
  std::vector<std::vector<float>> outputs;  // [hosted][queries][owned heads][kv_lora_rank]
  std::uint64_t entries_read = 0;           // shard entries read by the partials (hosted ranks)
  std::uint64_t bytes_sent = 0;             // partial records sent to other ranks (hosted ranks)
};

// plan: the result of TpStepPlanner::Step(group, selections) on `space` (not stepped
// since). queries: [n_queries][shape.query_values()]; bounds: n_queries + 1 offsets, query
// j selected selections[bounds[j], bounds[j + 1]) (non-empty). The layer's entry starts
// at layer_offset bytes into the group entry.
// kFailedPrecondition (space not at home, or the plan's ranks are not the space's),
// kInvalidArgument (shape, sizes, bounds, offset), kUnsupported (a fabric without
// all-to-all). Nothing changes on error.
Result<TpHomeAttention> AttendAtHome(const TpAddressSpace& space, const TpStepPlan& plan, GroupId group,
                                     const MlaShape& shape, std::span<const float> queries,
                                     std::span<const std::size_t> bounds, TpFabric* fabric = nullptr,
                                     std::uint32_t layer_offset = 0);

}  // namespace ula
