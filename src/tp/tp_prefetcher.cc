// TpPrefetcher (include/ula/tp_prefetcher.h): per group, the planner's step with a layer
// sink on a worker thread; the sink hands the refs and each layer's arrival to the driver
// through a mutex and a condition variable. One step is in flight at a time: group g + 1's
// step starts only after group g's worker was joined, which also orders the planner's
// scratch between the threads.
#include "ula/tp_prefetcher.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <optional>
#include <thread>

namespace ula {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }

// The driver's view of one group step's layers.
class LayerGate final : public TpLayerSink {
 public:
  explicit LayerGate(std::uint32_t layers) : layers_(layers) {}
  std::uint32_t layers() const override { return layers_; }
  void Planned(const TpStepPlan& plan) override {
    std::lock_guard lock(mu_);
    plan_ = plan;
    cv_.notify_all();
  }
  // After the last layer (or a failure) the step publishes, which may free slots the driver
  // is still reading: the worker waits here until the driver released the step.
  void Arrived(std::uint32_t layer, bool ok) override {
    std::unique_lock lock(mu_);
    arrived_ = layer + 1;
    if (!ok) failed_ = true;
    if (!failed_) arrived_ok_ = layer + 1;
    last_arrival_ = Clock::now();
    if (layer == 0) first_arrival_ = last_arrival_;
    cv_.notify_all();
    if (failed_ || arrived_ == layers_) cv_.wait(lock, [&] { return released_; });
  }
  void Release() {
    std::lock_guard lock(mu_);
    released_ = true;
    cv_.notify_all();
  }
  Clock::time_point last_arrival() {
    std::lock_guard lock(mu_);
    return last_arrival_;
  }
  Clock::time_point first_arrival() {
    std::lock_guard lock(mu_);
    return first_arrival_;
  }
  void Done() {  // the step returned (after the last callback, or without any on a refusal)
    std::lock_guard lock(mu_);
    done_ = true;
    cv_.notify_all();
  }
  // Blocks until layer `layer` arrived (true, *plan set) or the step failed or ended without it (false).
  bool WaitLayer(std::uint32_t layer, const TpStepPlan** plan) {
    std::unique_lock lock(mu_);
    cv_.wait(lock, [&] { return failed_ || done_ || arrived_ok_ > layer; });
    if (arrived_ok_ <= layer || !plan_) return false;  // a layer that arrived before a later one failed still computes
    *plan = &*plan_;
    return true;
  }

 private:
  const std::uint32_t layers_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::optional<TpStepPlan> plan_;
  std::uint32_t arrived_ = 0;     // layers reported
  std::uint32_t arrived_ok_ = 0;  // layers 0 .. arrived_ok_ - 1 arrived with no failure before them
  bool failed_ = false;
  bool done_ = false;
  bool released_ = false;
  Clock::time_point last_arrival_{}, first_arrival_{};
};

}  // namespace

double TpPipelineStats::overlap() const {
  if (fetch_s <= 0) return 0;
  return std::clamp((fetch_s + compute_s - wall_s) / fetch_s, 0.0, 1.0);
}

TpPrefetcher::TpPrefetcher(TpAddressSpace& space, std::uint32_t layers_per_group, TpPlannerOptions options)
    : space_(space), layers_(layers_per_group), planner_(space, nullptr, options) {}

Result<TpPipelineStats> TpPrefetcher::RunStep(std::span<const std::vector<LogicalAddr>> selections,
                                              std::span<const std::vector<SelectionRun>> runs, const Compute& compute,
                                              bool layered) {
  const std::uint32_t groups = space_.config().num_groups;
  if (selections.size() != groups || runs.size() != groups) {
    return MakeError(ErrorCode::kInvalidArgument, fmt::format("{} selection lists and {} run lists for {} layer groups",
                                                              selections.size(), runs.size(), groups));
  }
  if (layers_ == 0 || space_.config().entry_bytes % layers_ != 0) {
    return MakeError(ErrorCode::kInvalidArgument, fmt::format("{} layers per group do not divide the {}-byte group entry",
                                                              layers_, space_.config().entry_bytes));
  }
  // Refusal is total: check every group before stepping any (group states are disjoint).
  for (std::uint32_t g = 0; g < groups; ++g) {
    if (auto s = planner_.Check(GroupId(static_cast<std::uint16_t>(g)), selections[g], runs[g]); !s) {
      return MakeError(s.error().code(), fmt::format("group {} refused, no group stepped: {}", g, s.error().message()));
    }
  }
  TpPipelineStats stats;
  const auto start = Clock::now();
  auto timed_compute = [&](GroupId g, std::uint32_t l, const TpStepPlan& plan) {
    const auto c0 = Clock::now();
    compute(g, l, plan);
    stats.compute_s += Seconds(c0, Clock::now());
  };
  for (std::uint32_t g = 0; g < groups; ++g) {
    const GroupId gid(static_cast<std::uint16_t>(g));
    const auto g0 = Clock::now();
    std::optional<Result<TpStepPlan>> result;
    if (!layered) {
      result = planner_.Step(gid, selections[g], runs[g]);
      const auto g1 = Clock::now();
      stats.fetch_s += Seconds(g0, g1);
      stats.exposed_s += Seconds(g0, g1);
      if (*result) {
        for (std::uint32_t l = 0; l < layers_; ++l) timed_compute(gid, l, **result);
      }
    } else {
      LayerGate gate(layers_);
      std::thread worker([&] {
        result = planner_.Step(gid, selections[g], runs[g], &gate);
        gate.Done();
      });
      for (std::uint32_t l = 0; l < layers_; ++l) {
        const TpStepPlan* plan = nullptr;
        if (!gate.WaitLayer(l, &plan)) break;
        timed_compute(gid, l, *plan);
      }
      gate.Release();
      worker.join();
      // The group step's transfer time: until its last layer arrived (its publish waited for
      // the computes, above, and is not transfer time).
      const auto end = Clock::now();
      const auto last = gate.last_arrival(), first = gate.first_arrival();
      stats.fetch_s += Seconds(g0, last == Clock::time_point{} ? end : last);
      stats.exposed_s += Seconds(g0, first == Clock::time_point{} ? end : first);
    }
    if (!*result) {
      return MakeError(result->error().code(), fmt::format("group {} of {} failed ({} stepped before it): {}", g, groups,
                                                           g, result->error().message()));
    }
    stats.totals += (*result)->Total();
  }
  stats.wall_s = Seconds(start, Clock::now());
  return stats;
}

}  // namespace ula
