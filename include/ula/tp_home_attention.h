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
// With kinds (TpConfig::kinds, DeepSeek-V4; docs/ARCHITECTURE.md "Kinds under TP"),
// AttendKindsAtHome runs the same three steps per layer kind: a rank's partial covers its
// own selected C4 entries (CSA) or its own C128 stripe (HCA), plus the request's window on
// the window home alone (a window-only layer: the home alone; the other ranks' parts are
// empty); the exchange and the merge in rank order are AttendAtHome's.
//
// Thread-safety: reads the space; must not overlap a Step or a mutation of the group.
// Collective when a fabric is used (every rank calls it with its own plan, same bounds).
#pragma once

#include <cstdint>
#include <functional>
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

// The layer kinds of DeepSeek-V4 (ModelConfig's compress ratios 0, 4, 128).
enum class KindLayer : std::uint8_t { kWindowOnly = 0, kCsa = 1, kHca = 2 };

// The bytes of one row of a resident kind that the engine holds (a TP space with kinds keeps
// their logical blocks only): `kind`'s layer as the engine's view indexes it on `rank`, the
// block id and row of KindPagesOf(request, kind, rank). nullptr: no such row (refused).
using KindRowBytes = std::function<const std::byte*(Rank rank, std::uint32_t kind, std::uint32_t block,
                                                    std::uint32_t row)>;

struct KindLayerInput {
  KindLayer layer = KindLayer::kCsa;
  std::span<const RequestId> requests;  // [n_queries] each query's request
  // [n_queries] each query's token position (MTP: the verified token and its drafts, q_len
  // queries of one request); empty: each query at its request's last token. A query at
  // position q reads the window's tokens (q - window, q] and the C128 entries complete by
  // token q; its C4 entries are its selections (the indexer's causal top-k).
  std::span<const std::uint32_t> positions;
  // kCsa only (empty otherwise): Step's plan of the layer's group, its selections the queries'
  // C4 entries, query j's [bounds[j], bounds[j + 1]); the layer at layer_offset of the entry.
  const TpStepPlan* plan = nullptr;
  GroupId group;
  std::span<const std::size_t> bounds;
  std::uint32_t layer_offset = 0;
};

// One layer of a space with kinds, attention at home (above). Rank r's partial of query j
// reads, in order: (kCsa) its shard's selections of query j in selection order, (kHca) its
// C128 entries of the request complete by the query's token, in KindPagesOf order, then, on
// the request's window home only, the window: the min(window, q + 1) tokens up to the
// query's token q, oldest first (window = the ring's tokens less its drafts).
// kFailedPrecondition (no kinds, not at home, the plan's ranks, a row the engine does not
// hold), kInvalidArgument (shape, sizes, a plan or bounds given to a layer without C4, none
// to kCsa, bounds not matching the requests, positions not one per query, a row wider than
// the kind's), kOutOfRange (a position at or past its request's tokens, or whose window the
// ring no longer holds), kNotFound (request), kUnsupported (a fabric without all-to-all).
// Nothing changes.
Result<TpHomeAttention> AttendKindsAtHome(const TpAddressSpace& space, const KindLayerInput& input,
                                          const MlaShape& shape, std::span<const float> queries,
                                          const KindRowBytes& rows, TpFabric* fabric = nullptr);

}  // namespace ula
