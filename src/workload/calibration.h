// Calibration of the selection model against the real indexer, and the runs both share:
// the same requests, context lengths, steps and queries (a DecodeSimConfig schedule), so
// their statistics are comparable side by side.
//
// Statistics of a run:
//   overlap        per request and step t >= 1: |S_t ∩ S_{t-1}| / |S_t| for query 0
//   draft_overlap  per request, step and draft query j >= 1: |S_j ∩ S_0| / |S_j|
//   draft_chain_overlap  the same against the previous draft: |S_j ∩ S_{j-1}| / |S_j|
//   union_per_top_k mean |union of the step's queries| / top_k
//   union_turnover  per request and step t >= 1: |U_t \ U_{t-1}| / top_k, U the union of the
//                  step's queries: the entries a step selects that its previous step did not
//   first_rate[p]  how often position p (p < 64) is selected by query 0
//   newest_rate[r] how often the r-th newest position (r < 64) is selected by query 0
//   reuse          reuse distances of each request's step unions (reuse_distance.h, window 16)
// Fit: sink_tokens / recent_tokens = the leading runs of first_rate / newest_rate >= 0.5;
// keep_mean, keep_stddev and draft_keep by bisection on synthetic runs until the synthetic
// overlap mean, overlap stddev and draft-chain-overlap mean match the real ones (the model's
// drafts are chained, selection_model.h, so draft_keep is fitted to the chain; the overlap
// with query 0 and the union are then outcomes, compared, not fitted); then, for each
// heavy_skew of a grid (0, 0.25, 0.5, 1, 1.5; return_window 8), return_fraction by
// bisection until the mean reuse gap matches, keeping the pair whose reuse p90, p99, mean
// gap and persistent share are nearest the real ones (the largest relative error).
//
// Thread-safety: reentrant.
#pragma once

#include <cstdint>
#include <vector>

#include "ula/error.h"
#include "indexer/indexer.h"
#include "workload/indexer_decode.h"
#include "workload/reuse_distance.h"
#include "workload/selection_model.h"
#include "workload/trace_file.h"

namespace ula {

struct SelectionRunStats {
  OverlapStats overlap;
  OverlapStats draft_overlap;
  OverlapStats draft_chain_overlap;
  double union_per_top_k = 0;
  double union_turnover = 0;
  std::vector<double> first_rate;   // [64]
  std::vector<double> newest_rate;  // [64]
  ReuseStats reuse;
  double seconds = 0;
  Trace trace;  // kPosition, one group, queries_per_step queries (if recorded)
};

// The real indexer over the schedule (IndexerDecodeSim with top-k from `shape`). With
// tokens_per_entry > 1 (a C4 indexer) positions and context lengths count entries, and the
// trace's records carry the entry count as context_len.
Result<SelectionRunStats> RunRealIndexer(const IndexerShape& shape, const DecodeSimConfig& schedule,
                                         bool record_trace = true);
// The selection model over the same schedule (kUnsupported for tokens_per_entry > 1).
Result<SelectionRunStats> RunSelectionModel(const SelectionModelParams& params, const DecodeSimConfig& schedule,
                                            bool record_trace = true);

// Sets keep_mean (others unchanged) so that the synthetic overlap mean over the schedule is
// as close as it can get to `target` (bisection; the reachable range is bounded by sinks,
// recent tokens and fresh draws).
Result<SelectionModelParams> FitKeepForOverlap(SelectionModelParams params, const DecodeSimConfig& schedule,
                                               double target);

struct CalibrationReport {
  SelectionRunStats real;
  SelectionRunStats synthetic;  // with `fitted`
  SelectionModelParams fitted;
};
Result<CalibrationReport> CalibrateSelectionModel(const IndexerShape& shape, const DecodeSimConfig& schedule);

}  // namespace ula
