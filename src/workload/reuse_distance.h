// ReuseTracker: how selections return. For every stream (a request) and every step, the
// caller passes the step's distinct selected positions (the union of its queries: what
// the planner dedups and makes resident). For a position selected at step t whose
// previous selection was at step s, the reuse distance is t - s >= 1 (1: selected in the
// previous step too); a position never selected before is a first use, not a reuse.
//
// Statistics (ReuseStats):
//   histogram[b]   reuses with distance in bin b: 1, 2, 3-4, 5-8, 9-16, 17-32, 33-64, 65+
//   p50, p90, p99  percentiles of the reuse distances (first uses excluded), in steps
//   mean_gap       mean distance over reuses with distance >= 2 (returns after a gap)
//   persistent_share  share of all selections (first uses included) whose position was
//                  selected in more than half of the `window` steps before (Scissorhands'
//                  "persistence of importance", measured)
//
// Cost: O(1) per selection; memory 12 B per position of each stream. Steps of a stream
// must come in non-decreasing order; a stream may skip steps.
// Thread-safety: none; one tracker per thread.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <unordered_map>
#include <vector>

namespace ula {

struct ReuseStats {
  static constexpr std::size_t kBins = 8;
  static constexpr std::array<const char*, kBins> kBinNames{"1", "2", "3-4", "5-8", "9-16", "17-32", "33-64", "65+"};
  std::uint64_t selections = 0;  // every selection passed, first uses included
  std::uint64_t reuses = 0;
  std::uint64_t first_uses = 0;
  std::array<std::uint64_t, kBins> histogram{};
  double p50 = 0, p90 = 0, p99 = 0;
  double mean_gap = 0;
  double persistent_share = 0;
  std::uint32_t window = 0;
};

class ReuseTracker {
 public:
  // REQUIRES: 1 <= window <= 62.
  explicit ReuseTracker(std::uint32_t window = 16);

  // The distinct positions `stream` selected at `step`.
  void Add(std::uint64_t stream, std::uint32_t step, std::span<const std::uint32_t> positions);
  ReuseStats Finish() const;

 private:
  struct Position {
    std::uint32_t last = 0;  // step + 1 of the last selection; 0: never
    std::uint64_t mask = 0;  // bit i: selected at step (last - 1) - i
  };
  std::uint32_t window_;
  std::unordered_map<std::uint64_t, std::vector<Position>> streams_;
  std::vector<std::uint64_t> distance_counts_;  // [distance] reuses, distances > kMaxExact in the last
  std::uint64_t selections_ = 0, first_uses_ = 0, persistent_ = 0;
};

}  // namespace ula
