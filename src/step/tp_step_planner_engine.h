// TpStepPlanner::Engine: the TP engine path's config and scratch (ula/tp_step_planner.h),
// present on a planner made by Create. The engine layout's selections are compacted into the
// runs layout the step takes (compact, where, runs) and the step's refs written back as
// per-rank index arrays; between Plan and Complete the pending plan's descriptor counts say
// which status belongs to which rank's fetch or home move.
#pragma once

#include <cstdint>
#include <vector>

#include "step/selection_share.h"
#include "ula/tp_step_planner.h"

namespace ula {

struct TpStepPlanner::Engine {
  EngineStepConfig config;
  std::vector<LogicalAddr> compact;    // the non-padding selections, row-major
  std::vector<std::uint32_t> where;    // compact[j] was selections[where[j]]
  std::vector<SelectionRun> runs;      // [rows with a selection] their requests
  std::uint64_t last_fence = 0;
  std::uint64_t pending_fence = 0;
  std::vector<std::uint32_t> pending_counts;   // [hosted] home moves of the pending plan
  std::vector<std::uint32_t> pending_fetches;  // [hosted] remote fetches of the pending plan (local buffer)
  SelectionShare share;                        // ReserveRound's measurement (reserve = kQuantile)
};

}  // namespace ula
