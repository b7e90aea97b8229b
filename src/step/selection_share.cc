// SelectionShare (step/selection_share.h): the ring and histogram of measured shares.
#include "step/selection_share.h"

#include <algorithm>
#include <cmath>

#include "ula/check.h"

namespace ula {

void SelectionShare::Configure(std::uint32_t window, double quantile, std::uint64_t max_row_selections) {
  ULA_CHECK(window >= 1 && quantile > 0.0 && quantile <= 1.0);
  quantile_ = quantile;
  const double tail = 1.0 - quantile;
  needed_ = tail <= 0.0 ? 1 : static_cast<std::uint64_t>(std::ceil(1.0 / tail - 1e-9));
  needed_ = std::clamp<std::uint64_t>(needed_, 1, window);
  ring_.assign(window, 0);
  next_ = count_ = 0;
  hist_.fill(0);
  // No table when nothing is measured (max_row_selections 0: a planner not in kQuantile).
  std::uint32_t log2 = 4;
  while ((std::uint64_t{1} << log2) < 2 * max_row_selections) ++log2;
  keys_.assign(max_row_selections == 0 ? 0 : std::size_t{1} << log2, 0);
  stamps_.assign(keys_.size(), 0);
  epoch_ = 0;
  shift_ = 32 - log2;
}

std::uint64_t SelectionShare::Distinct(std::span<const std::int32_t> rows) {
  ULA_DCHECK(2 * rows.size() <= keys_.size());
  if (++epoch_ == 0) {  // the stamps wrapped: forget them all
    std::fill(stamps_.begin(), stamps_.end(), 0);
    epoch_ = 1;
  }
  const std::size_t mask = keys_.size() - 1;
  std::uint64_t distinct = 0;
  for (std::int32_t a : rows) {
    if (a < 0) continue;  // padding
    std::size_t i = (static_cast<std::uint32_t>(a) * 0x9E3779B1u) >> shift_;
    for (;; i = (i + 1) & mask) {
      if (stamps_[i] != epoch_) {  // empty: a first sight
        stamps_[i] = epoch_;
        keys_[i] = a;
        ++distinct;
        break;
      }
      if (keys_[i] == a) break;  // a duplicate
    }
  }
  return distinct;
}

void SelectionShare::Record(std::span<const std::int32_t> rows) {
  const std::uint64_t bound = rows.size();
  const std::uint64_t distinct = Distinct(rows);
  if (distinct == 0) return;  // padding rows (a request's rows select at least its new token)
  // Bin i covers (i / kBins, (i + 1) / kBins]: the smallest i with distinct <= bound (i + 1) / kBins.
  const std::uint64_t scaled = std::min(distinct, bound) * kBins;
  const auto bin = static_cast<std::uint16_t>(scaled == 0 ? 0 : (scaled + bound - 1) / bound - 1);
  if (count_ == ring_.size()) {
    --hist_[ring_[next_]];
  } else {
    ++count_;
  }
  ring_[next_] = bin;
  ++hist_[bin];
  next_ = (next_ + 1) % ring_.size();
}

SelectionShare::Rows SelectionShare::NextRows(std::uint32_t batch) {
  if (batch == 0) return {};
  const Rows rows{static_cast<std::uint32_t>(cursor_ % batch), std::min(batch, kRequestsPerPlan)};
  cursor_ += rows.n;
  return rows;
}

std::uint32_t SelectionShare::QuantileBin() const {
  // The smallest bin b with at least ceil(q * count) samples in bins <= b.
  const auto want = std::max<std::uint64_t>(1, static_cast<std::uint64_t>(std::ceil(quantile_ * count_ - 1e-9)));
  std::uint64_t seen = 0;
  for (std::uint32_t b = 0; b < kBins; ++b) {
    seen += hist_[b];
    if (seen >= want) return b;
  }
  return kBins - 1;
}

std::uint64_t SelectionShare::Reserve(std::uint64_t bound, std::uint64_t demand) const {
  if (count_ < needed_) return bound;
  const std::uint64_t edge = QuantileBin() + 1;  // the bin's upper edge, in 1 / kBins
  return std::min(bound, (demand * edge + kBins - 1) / kBins);
}

}  // namespace ula
