// SelectionModel: a cheap stand-in for the real indexer at full scale (hundreds of
// requests x 128K keys per step). Each step of one request stream, query 0 selects
// min(top_k, n) distinct positions of its n-token history:
//
//   1. sinks:  positions 0 .. sink_tokens-1 (attention sinks);
//   2. recent: the newest recent_tokens positions;
//   3. kept:   a uniformly random subset of the previous step's other selections, of size
//              p * |previous others| (stochastically rounded),
//              p = clamp(keep_mean + keep_stddev * N(0,1), 0, 1)
//              drawn afresh each step;
//   4. fresh:  draws from the rest of the history that the previous step did not select,
//              until top_k (previously selected positions only if nothing else is left).
//              Position p is drawn with probability proportional to its persistent weight
//              w(p) = (1 - u(p))^(-heavy_skew), u(p) uniform in [0, 1) from a hash of
//              (seed, stream, p): a Pareto weight with tail index 1 / heavy_skew, the same
//              for the life of the stream. heavy_skew = 0 draws uniformly. A few positions
//              of large weight return again and again after they drop out (the heavy
//              hitters of H2O; the persistence of importance of Scissorhands), so reuse
//              distances are short and long-tailed instead of geometric (docs/WORKLOADS.md).
//              A return_fraction of the fresh draws are instead returns: positions that
//              query 0 dropped in one of the last return_window steps, drawn uniformly —
//              the entries near the top-k cut that flip in and out from step to step.
//
// so keep_mean sets the step-to-step overlap (the fraction of a step's selection already
// selected in the previous step) and keep_stddev its spread; FitKeepForOverlap() and
// CalibrateSelectionModel() (calibration.h) choose them. Draft queries j >= 1 (speculative
// decoding) form a chain, as the drafts of MTP do (draft j's query evolves from draft j-1's):
// draft j takes the sinks, the recent tokens, a draft_keep fraction of draft j-1's other
// selections (query 0 for j = 1), and fresh draws from positions draft j-1 did not select.
// So draft_keep is the draft-to-previous-draft overlap, and each draft adds about
// (1 - draft_keep) x top_k to the step's union. Output order: sinks, recent (newest first),
// kept, fresh.
//
// Determinism: stream s draws from its own generator seeded by (seed, s), so its
// selections do not depend on how streams are interleaved.
// Thread-safety: none (per-stream state and scratch); one thread per model.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <unordered_map>
#include <vector>

#include "ula/error.h"

namespace ula {

struct SelectionModelParams {
  std::uint32_t top_k = 0;
  std::uint32_t sink_tokens = 0;
  std::uint32_t recent_tokens = 0;
  double keep_mean = 0.0;    // [0, 1]
  double keep_stddev = 0.0;  // >= 0
  double draft_keep = 0.0;   // [0, 1]: share of draft j-1's selection draft j keeps
  double heavy_skew = 0.0;   // [0, 4]: exponent of the persistent per-position weight; 0 = uniform
  double return_fraction = 0.0;     // [0, 1]: share of fresh draws that return a recently dropped position
  std::uint32_t return_window = 8;  // [1, 64] steps whose dropped positions may return
  std::uint64_t seed = 1;

  // Names the first bad field.
  Status Validate() const;
};

class SelectionModel {
 public:
  static Result<SelectionModel> Create(const SelectionModelParams& params);
  ~SelectionModel();
  SelectionModel(SelectionModel&&) noexcept;
  SelectionModel& operator=(SelectionModel&&) noexcept;

  // One step of `stream` with n = context_len tokens: out[j] = query j's selection
  // (out resized to num_queries). A stream starts at its first Step; context_len may grow
  // by any amount between steps. kInvalidArgument for context_len 0 or num_queries 0.
  Status Step(std::uint64_t stream, std::uint32_t context_len, std::uint32_t num_queries,
              std::vector<std::vector<std::uint32_t>>& out);
  // Drops a finished stream's state.
  void Forget(std::uint64_t stream);

  const SelectionModelParams& params() const { return params_; }

 private:
  struct Stream;
  explicit SelectionModel(const SelectionModelParams& params);
  void Mark(std::uint32_t pos) { mark_[pos] = epoch_; }
  bool Marked(std::uint32_t pos) const { return mark_[pos] == epoch_; }
  void NewEpoch(std::uint32_t n);
  // A fresh position of `st` drawn by weight among [0, n) (may be excluded; the caller
  // rejects). REQUIRES: heavy_skew > 0.
  std::uint32_t DrawWeighted(Stream& st, std::uint32_t n);

  SelectionModelParams params_;
  std::unordered_map<std::uint64_t, std::unique_ptr<Stream>> streams_;
  std::vector<std::uint32_t> mark_;       // [max context] epoch stamps: selected this query
  std::vector<std::uint32_t> prev_mark_;  // [max context] stamps: selected last step
  std::uint32_t epoch_ = 0;
  std::vector<std::uint32_t> scratch_;
};

// |cur ∩ prev| / |cur| (0 for an empty cur). Positions must be < universe.
double SelectionOverlap(std::span<const std::uint32_t> prev, std::span<const std::uint32_t> cur,
                        std::uint32_t universe);

// Summary of a set of overlap samples in [0, 1].
struct OverlapStats {
  std::uint64_t count = 0;
  double mean = 0, stddev = 0, min = 0, p10 = 0, p50 = 0, p90 = 0, max = 0;
  std::vector<std::uint64_t> histogram;  // [10] bins of width 0.1; 1.0 falls in the last
};
OverlapStats SummarizeOverlap(std::vector<double> samples);

}  // namespace ula
