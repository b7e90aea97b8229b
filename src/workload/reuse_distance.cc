// ReuseTracker (reuse_distance.h): per position the step of its last selection and a bit
// mask of the steps before it, so a reuse and the persistence count cost O(1).
#include "workload/reuse_distance.h"

#include <algorithm>
#include <bit>

#include "ula/check.h"

namespace ula {
namespace {

constexpr std::uint32_t kMaxExact = 4096;  // distances above this are counted as kMaxExact

std::size_t Bin(std::uint64_t d) {
  if (d <= 1) return 0;
  const std::size_t b = static_cast<std::size_t>(std::bit_width(d - 1));  // 2 -> 1, 3-4 -> 2, 5-8 -> 3
  return std::min<std::size_t>(b, ReuseStats::kBins - 1);
}

}  // namespace

ReuseTracker::ReuseTracker(std::uint32_t window) : window_(window), distance_counts_(kMaxExact + 1, 0) {
  ULA_CHECK(window >= 1 && window <= 62);
}

void ReuseTracker::Add(std::uint64_t stream, std::uint32_t step, std::span<const std::uint32_t> positions) {
  std::vector<Position>& pos = streams_[stream];
  const std::uint64_t window_bits = ((std::uint64_t{1} << window_) - 1) << 1;  // steps t-1 .. t-window
  for (std::uint32_t p : positions) {
    if (p >= pos.size()) pos.resize(std::max<std::size_t>(p + 1, pos.size() * 2));
    Position& e = pos[p];
    ++selections_;
    if (e.last == 0) {
      ++first_uses_;
      e.last = step + 1;
      e.mask = 1;
      continue;
    }
    const std::uint32_t prev = e.last - 1;
    ULA_CHECK(step >= prev);
    if (step == prev) continue;  // repeated within a step: the caller passes distinct positions
    const std::uint64_t d = step - prev;
    ++distance_counts_[std::min<std::uint64_t>(d, kMaxExact)];
    const std::uint64_t shifted = d >= 64 ? 0 : e.mask << d;  // bit i: selected at step t - i
    if (2 * static_cast<std::uint32_t>(std::popcount(shifted & window_bits)) > window_) ++persistent_;
    e.mask = shifted | 1;
    e.last = step + 1;
  }
}

ReuseStats ReuseTracker::Finish() const {
  ReuseStats s;
  s.window = window_;
  s.selections = selections_;
  s.first_uses = first_uses_;
  double gap_sum = 0;
  std::uint64_t gaps = 0;
  for (std::uint64_t d = 1; d <= kMaxExact; ++d) {
    const std::uint64_t c = distance_counts_[d];
    s.reuses += c;
    s.histogram[Bin(d)] += c;
    if (d >= 2) {
      gap_sum += static_cast<double>(c) * static_cast<double>(d);
      gaps += c;
    }
  }
  s.mean_gap = gaps ? gap_sum / static_cast<double>(gaps) : 0;
  s.persistent_share = selections_ ? static_cast<double>(persistent_) / static_cast<double>(selections_) : 0;
  auto percentile = [&](double f) -> double {
    if (s.reuses == 0) return 0;
    const auto rank = static_cast<std::uint64_t>(f * static_cast<double>(s.reuses - 1));
    std::uint64_t seen = 0;
    for (std::uint64_t d = 1; d <= kMaxExact; ++d) {
      seen += distance_counts_[d];
      if (seen > rank) return static_cast<double>(d);
    }
    return kMaxExact;
  };
  s.p50 = percentile(0.5);
  s.p90 = percentile(0.9);
  s.p99 = percentile(0.99);
  return s;
}

}  // namespace ula
