// SelectionModel (selection_model.h). Per stream it keeps the previous query-0 selection
// and a generator; per call it uses epoch-stamped marks over positions, so a step costs
// O(top_k) and never clears an n-sized array.
#include "workload/selection_model.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "workload/rng.h"
#include "ula/check.h"

namespace ula {

// Weighted draws: positions are kept in bins by weight level b = floor(log2 w) (w >= 1),
// each with its total weight. A draw picks a bin by weight, a position in it uniformly,
// and accepts it with probability w / 2^(b+1) >= 1/2, so a position is drawn with
// probability proportional to its weight; new positions join their bin as the context grows.
constexpr std::size_t kWeightLevels = 64;

struct SelectionModel::Stream {
  explicit Stream(std::uint64_t seed) : rng(seed), weight_seed(seed ^ 0x9e3779b97f4a7c15ull) {}
  workload_internal::Rng rng;
  std::vector<std::uint32_t> prev;  // previous step's query-0 selection
  std::uint64_t weight_seed;
  std::uint32_t weighted = 0;                            // positions [0, weighted) are in bins
  std::vector<std::vector<std::uint32_t>> bins;          // [kWeightLevels] positions by level
  std::vector<double> bin_mass;                          // [kWeightLevels] total weight per level
  double mass = 0;
  std::vector<std::vector<std::uint32_t>> dropped;       // [return_window] ring: query 0's drops per step
  std::uint32_t dropped_head = 0;                        // ring slot of the newest step
  std::size_t dropped_total = 0;
};

namespace {

// The persistent weight of position p of a stream: (1 - u)^(-skew), u in [0, 1).
double PositionWeight(std::uint64_t weight_seed, std::uint32_t p, double skew) {
  std::uint64_t h = weight_seed ^ (std::uint64_t{p} * 0xd1342543de82ef95ull);
  const double u = static_cast<double>(workload_internal::SplitMix64(h) >> 11) * 0x1.0p-53;
  return std::pow(1.0 - u, -skew);
}

std::size_t WeightLevel(double w) {
  return std::min<std::size_t>(kWeightLevels - 1, static_cast<std::size_t>(std::max(0.0, std::floor(std::log2(w)))));
}

}  // namespace

Status SelectionModelParams::Validate() const {
  auto bad = [](const char* f, std::string_view why) {
    return MakeError(ErrorCode::kInvalidArgument, fmt::format("field '{}': {}", f, why));
  };
  if (top_k == 0) return bad("top_k", "must be >= 1");
  if (std::uint64_t{sink_tokens} + recent_tokens > top_k) {
    return bad("recent_tokens", "sink_tokens + recent_tokens must be <= top_k");
  }
  if (!(keep_mean >= 0 && keep_mean <= 1)) return bad("keep_mean", "must be in [0, 1]");
  if (!(keep_stddev >= 0 && keep_stddev <= 1)) return bad("keep_stddev", "must be in [0, 1]");
  if (!(draft_keep >= 0 && draft_keep <= 1)) return bad("draft_keep", "must be in [0, 1]");
  if (!(heavy_skew >= 0 && heavy_skew <= 4)) return bad("heavy_skew", "must be in [0, 4]");
  if (!(return_fraction >= 0 && return_fraction <= 1)) return bad("return_fraction", "must be in [0, 1]");
  if (return_window < 1 || return_window > 64) return bad("return_window", "must be in [1, 64]");
  return Ok();
}

Result<SelectionModel> SelectionModel::Create(const SelectionModelParams& params) {
  ULA_RETURN_IF_ERROR(params.Validate());
  return SelectionModel(params);
}

SelectionModel::SelectionModel(const SelectionModelParams& params) : params_(params) {}
SelectionModel::~SelectionModel() = default;
SelectionModel::SelectionModel(SelectionModel&&) noexcept = default;
SelectionModel& SelectionModel::operator=(SelectionModel&&) noexcept = default;

void SelectionModel::Forget(std::uint64_t stream) { streams_.erase(stream); }

void SelectionModel::NewEpoch(std::uint32_t n) {
  if (mark_.size() < n) mark_.resize(n, 0);
  if (++epoch_ == 0) {  // wrapped: clear stamps once every 2^32 queries
    std::fill(mark_.begin(), mark_.end(), 0);
    std::fill(prev_mark_.begin(), prev_mark_.end(), 0);
    epoch_ = 1;
  }
}

std::uint32_t SelectionModel::DrawWeighted(Stream& st, std::uint32_t n) {
  const double skew = params_.heavy_skew;
  if (st.bins.empty()) {
    st.bins.resize(kWeightLevels);
    st.bin_mass.assign(kWeightLevels, 0.0);
  }
  for (; st.weighted < n; ++st.weighted) {
    const double w = PositionWeight(st.weight_seed, st.weighted, skew);
    const std::size_t b = WeightLevel(w);
    st.bins[b].push_back(st.weighted);
    st.bin_mass[b] += w;
    st.mass += w;
  }
  for (;;) {
    double r = st.rng.Uniform01() * st.mass;
    std::size_t b = kWeightLevels;
    for (std::size_t i = 0; i < kWeightLevels; ++i) {
      if (st.bins[i].empty()) continue;
      b = i;
      if (r < st.bin_mass[i]) break;
      r -= st.bin_mass[i];
    }
    if (b == kWeightLevels) return static_cast<std::uint32_t>(st.rng.Below(n));  // n == 0 cannot happen
    const std::vector<std::uint32_t>& bin = st.bins[b];
    const std::uint32_t p = bin[st.rng.Below(bin.size())];
    if (p >= n) continue;  // the context shrank below positions already binned (a new request reuses the stream)
    const double cap = b + 1 < kWeightLevels ? std::ldexp(1.0, static_cast<int>(b) + 1) : INFINITY;
    if (!std::isfinite(cap) || st.rng.Uniform01() * cap < PositionWeight(st.weight_seed, p, skew)) return p;
  }
}

Status SelectionModel::Step(std::uint64_t stream, std::uint32_t context_len, std::uint32_t num_queries,
                            std::vector<std::vector<std::uint32_t>>& out) {
  if (context_len == 0) return MakeError(ErrorCode::kInvalidArgument, "context_len must be >= 1");
  if (num_queries == 0) return MakeError(ErrorCode::kInvalidArgument, "num_queries must be >= 1");
  auto it = streams_.find(stream);
  if (it == streams_.end()) {
    it = streams_.emplace(stream, std::make_unique<Stream>(workload_internal::StreamSeed(params_.seed, stream))).first;
  }
  Stream& st = *it->second;
  const std::uint32_t n = context_len;
  const std::uint32_t k = std::min(params_.top_k, n);
  out.resize(num_queries);

  // prev_mark_: stamps of last step's selection (stamp = epoch of this call's query 0).
  NewEpoch(n);
  const std::uint32_t prev_epoch = epoch_;
  if (prev_mark_.size() < mark_.size()) prev_mark_.resize(mark_.size(), 0);
  for (std::uint32_t p : st.prev) {
    if (p < n) prev_mark_[p] = prev_epoch;
  }
  auto was_prev = [&](std::uint32_t p) { return prev_mark_[p] == prev_epoch; };

  for (std::uint32_t j = 0; j < num_queries; ++j) {
    std::vector<std::uint32_t>& sel = out[j];
    sel.clear();
    if (j > 0) NewEpoch(n);
    if (k == n) {  // everything fits: the whole history
      for (std::uint32_t p = 0; p < n; ++p) sel.push_back(p);
      continue;
    }
    auto add = [&](std::uint32_t p) {
      if (!Marked(p)) {
        Mark(p);
        sel.push_back(p);
      }
    };
    for (std::uint32_t p = 0; p < std::min(params_.sink_tokens, n); ++p) add(p);
    for (std::uint32_t r = 0; r < params_.recent_tokens && r < n && sel.size() < k; ++r) add(n - 1 - r);

    // The pool to keep from: query 0 keeps from the previous step, draft j from draft j-1
    // (a chain: each draft query evolves from the one before it).
    const std::vector<std::uint32_t>& source = (j == 0) ? st.prev : out[j - 1];
    scratch_.clear();
    for (std::uint32_t p : source) {
      if (p < n && !Marked(p)) scratch_.push_back(p);
    }
    double frac = params_.draft_keep;
    if (j == 0) {
      frac = params_.keep_mean + (params_.keep_stddev > 0 ? params_.keep_stddev * st.rng.Normal() : 0.0);
      frac = std::clamp(frac, 0.0, 1.0);
    }
    // Stochastic rounding: the expected kept count is exactly frac * |pool|.
    const double want = frac * static_cast<double>(scratch_.size());
    std::uint64_t keep = static_cast<std::uint64_t>(want);
    if (st.rng.Uniform01() < want - static_cast<double>(keep)) ++keep;
    keep = std::min<std::uint64_t>(keep, k - sel.size());
    for (std::uint64_t i = 0; i < keep; ++i) {  // partial Fisher-Yates
      const std::uint64_t r = i + st.rng.Below(scratch_.size() - i);
      std::swap(scratch_[i], scratch_[r]);
      add(scratch_[i]);
    }
    // Fresh draws: positions the previous step did not select (query 0) / the previous
    // draft did not select (draft j: query j-1). Rejection sampling while such positions
    // are plentiful, then a scan.
    std::vector<bool> in_source;
    if (j > 0) {  // O(1) membership for drafts
      in_source.assign(n, false);
      for (std::uint32_t p : out[j - 1]) in_source[p] = true;
    }
    auto excluded_fast = [&](std::uint32_t p) { return Marked(p) || (j == 0 ? was_prev(p) : bool(in_source[p])); };
    const std::uint32_t need = k - static_cast<std::uint32_t>(sel.size());
    std::uint32_t attempts = 0;
    while (sel.size() < k && attempts < 8 * need + 64) {
      ++attempts;
      std::uint32_t p;
      if (st.dropped_total > 0 && params_.return_fraction > 0 && st.rng.Uniform01() < params_.return_fraction) {
        std::size_t i = st.rng.Below(st.dropped_total);  // uniform over the ring's positions
        std::size_t slot = 0;
        while (i >= st.dropped[slot].size()) i -= st.dropped[slot++].size();
        p = st.dropped[slot][i];
        if (p >= n) continue;
      } else {
        p = params_.heavy_skew > 0 ? DrawWeighted(st, n) : static_cast<std::uint32_t>(st.rng.Below(n));
      }
      if (!excluded_fast(p)) add(p);
    }
    if (sel.size() < k) {  // dense case: scan from a random start, then allow repeats
      const auto start = static_cast<std::uint32_t>(st.rng.Below(n));
      for (std::uint32_t i = 0; i < n && sel.size() < k; ++i) {
        const std::uint32_t p = (start + i) % n;
        if (!excluded_fast(p)) add(p);
      }
      for (std::uint32_t i = 0; i < n && sel.size() < k; ++i) add((start + i) % n);
    }
    ULA_DCHECK(sel.size() == k);
    if (j == 0 && params_.return_fraction > 0) {  // query 0's drops join the ring (marks: this query)
      if (st.dropped.empty()) st.dropped.resize(params_.return_window);
      st.dropped_head = (st.dropped_head + 1) % params_.return_window;
      std::vector<std::uint32_t>& ring = st.dropped[st.dropped_head];
      st.dropped_total -= ring.size();
      ring.clear();
      for (std::uint32_t p : st.prev) {
        if (p < n && !Marked(p)) ring.push_back(p);
      }
      st.dropped_total += ring.size();
    }
  }
  st.prev = out[0];
  return Ok();
}

double SelectionOverlap(std::span<const std::uint32_t> prev, std::span<const std::uint32_t> cur,
                        std::uint32_t universe) {
  if (cur.empty()) return 0.0;
  std::vector<bool> in_prev(universe, false);
  for (std::uint32_t p : prev) {
    if (p < universe) in_prev[p] = true;
  }
  std::size_t common = 0;
  for (std::uint32_t p : cur) common += (p < universe && in_prev[p]) ? 1 : 0;
  return static_cast<double>(common) / static_cast<double>(cur.size());
}

OverlapStats SummarizeOverlap(std::vector<double> samples) {
  OverlapStats s;
  s.histogram.assign(10, 0);
  s.count = samples.size();
  if (samples.empty()) return s;
  std::sort(samples.begin(), samples.end());
  double sum = 0;
  for (double x : samples) sum += x;
  s.mean = sum / static_cast<double>(samples.size());
  double var = 0;
  for (double x : samples) var += (x - s.mean) * (x - s.mean);
  s.stddev = std::sqrt(var / static_cast<double>(samples.size()));
  auto q = [&](double f) { return samples[static_cast<std::size_t>(f * static_cast<double>(samples.size() - 1))]; };
  s.min = samples.front();
  s.p10 = q(0.1);
  s.p50 = q(0.5);
  s.p90 = q(0.9);
  s.max = samples.back();
  for (double x : samples) s.histogram[std::min<std::size_t>(9, static_cast<std::size_t>(x * 10.0))]++;
  return s;
}

}  // namespace ula
