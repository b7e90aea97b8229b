// SelectionShare: the running measurement behind ReserveRound's quantile mode
// (EngineStepConfig::reserve, ula/step_planner.h), one implementation for the DP and TP
// planners.
//
// A sample is one request's rows in one group step: the distinct entries they selected
// over the selections they hold, q_len x top_k (padding included), kept as a bin of kBins
// equal bins of (0, 1] (bin i covers (i / kBins, (i + 1) / kBins]; a share
// of 0 falls in bin 0). The last `window` samples are kept in a ring, their bins counted in
// hist_. Invariants: sum(hist_) == count_ <= ring_.size(); hist_ counts exactly the bins of
// the count_ ring entries before next_.
//
// Reserve(bound, demand) scales a request's demand (its max_selections, q_len x top_k) by
// the upper edge of the bin holding quantile q of the kept samples, rounded up, and takes
// the guaranteed bound where that is smaller (a short history). While fewer samples are
// kept than the quantile needs (ceil(1 / (1 - q)), 1 for q = 1, at most the window) it is
// the bound.
//
// Counting a sample's distinct entries: an open-addressed set of addresses (linear probing,
// a power-of-two table of at least twice the largest sample), each slot valid only while its
// stamp is the current sample's epoch, so a sample starts from an empty set without clearing
// it. One pass over the sample, no copy and no sort. The count is per sample, not the plan's:
// the planner's own dedup (its records' stamps, one epoch a plan) counts an entry once in the
// whole plan, so an entry that two requests share (ShareInto) or that two rows of one request
// select (vLLM's flat rows are rows of one query each) would count for the first only.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <vector>

namespace ula {

class SelectionShare {
 public:
  static constexpr std::uint32_t kBins = 1024;
  // A plan records at most this many of its requests (a pass over q_len x top_k each),
  // starting where the previous plan's stopped, so the measurement's cost per step is
  // bounded whatever the batch.
  static constexpr std::uint32_t kRequestsPerPlan = 8;

  // REQUIRES: window >= 1, 0 < quantile <= 1 (EngineStepConfig::Validate); scratch sized
  // for rows of up to max_row_selections selections (no allocation in Record): the set's
  // table, 8 bytes a slot, the power of two at least twice max_row_selections; none for 0
  // (the planners pass 0 unless they reserve by kQuantile, the only mode that records).
  void Configure(std::uint32_t window, double quantile, std::uint64_t max_row_selections);

  // One request's rows of one group step: its q_len x top_k selections (-1 padding).
  // Rows of padding only record nothing.
  // REQUIRES: rows.size() <= Configure's max_row_selections.
  void Record(std::span<const std::int32_t> rows);

  // The distinct entries of rows, padding (< 0) not counted: what Record bins.
  // REQUIRES: as Record.
  std::uint64_t Distinct(std::span<const std::int32_t> rows);

  // The selections a request with this guaranteed bound and demand (max_selections) is
  // reserved: <= bound.
  std::uint64_t Reserve(std::uint64_t bound, std::uint64_t demand) const;

  std::uint64_t samples() const { return count_; }

  // One plan's measurement, for the DP and TP planners alike: of its `batch` rows of
  // `per_row` selections, up to kRequestsPerPlan from where the previous plan stopped, each
  // row of a request (is_request(b); rows of padding only are skipped) recorded.
  template <class IsRequest>
  void RecordPlan(std::uint32_t batch, std::size_t per_row, std::span<const std::int32_t> selections,
                  IsRequest&& is_request) {
    const Rows rows = NextRows(batch);
    for (std::uint32_t i = 0; i < rows.n; ++i) {
      const std::uint32_t b = (rows.first + i) % batch;
      if (is_request(b)) Record(selections.subspan(std::size_t{b} * per_row, per_row));
    }
  }

 private:
  // The batch rows a plan of `batch` rows records: [first, first + n) modulo batch.
  struct Rows {
    std::uint32_t first = 0, n = 0;
  };
  Rows NextRows(std::uint32_t batch);

  // The bin of quantile q of the kept samples; REQUIRES count_ >= needed_.
  std::uint32_t QuantileBin() const;

  double quantile_ = 1.0;
  std::uint64_t needed_ = 1;            // samples before the quantile is measured
  std::vector<std::uint16_t> ring_;     // [window] bins of the last samples
  std::size_t next_ = 0;                // the ring entry the next sample overwrites
  std::size_t count_ = 0;               // ring entries filled
  std::uint64_t cursor_ = 0;            // the next plan's first row (modulo its batch)
  std::array<std::uint32_t, kBins> hist_{};
  // The distinct-entry set (see the file comment): slot i holds keys_[i] iff stamps_[i] == epoch_.
  std::vector<std::int32_t> keys_;      // [table] addresses
  std::vector<std::uint32_t> stamps_;   // [table] the epoch of the sample that wrote keys_[i]
  std::uint32_t epoch_ = 0;             // the current sample's epoch (0: no sample; stamps start at 0)
  std::uint32_t shift_ = 32;            // 32 - log2(table): the hash keeps the product's top bits
};

}  // namespace ula
