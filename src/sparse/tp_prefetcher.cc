// TpPrefetcher: group g + 1's step on a worker thread while group g computes
// (include/ula/tp_prefetcher.h). One step is in flight at a time: the future of step g + 1
// is created only after step g's future was consumed, which also orders the planner's
// scratch between the threads.
#include "ula/tp_prefetcher.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <future>

namespace ula {

double TpPipelineStats::overlap() const {
  if (fetch_s <= 0) return 0;
  return std::clamp((fetch_s + compute_s - wall_s) / fetch_s, 0.0, 1.0);
}

TpPrefetcher::TpPrefetcher(TpAddressSpace& space, TpPlannerOptions options)
    : space_(space), planner_(space, nullptr, options) {}

Result<TpPipelineStats> TpPrefetcher::RunStep(std::span<const std::vector<LogicalAddr>> selections,
                                              std::span<const std::vector<SelectionRun>> runs, const Compute& compute,
                                              bool prefetch) {
  using Clock = std::chrono::steady_clock;
  const std::uint32_t groups = space_.config().num_groups;
  if (selections.size() != groups || runs.size() != groups) {
    return MakeError(ErrorCode::kInvalidArgument, fmt::format("{} selection lists and {} run lists for {} layer groups",
                                                              selections.size(), runs.size(), groups));
  }
  // Refusal is total: check every group before stepping any (group states are disjoint).
  for (std::uint32_t g = 0; g < groups; ++g) {
    if (auto s = planner_.Check(GroupId(static_cast<std::uint16_t>(g)), selections[g], runs[g]); !s) {
      return MakeError(s.error().code(), fmt::format("group {} refused, no group stepped: {}", g, s.error().message()));
    }
  }
  struct Timed {
    Result<TpStepPlan> plan;
    double seconds;
  };
  auto step = [this, &selections, &runs](std::uint32_t g) -> Timed {
    const auto t0 = Clock::now();
    auto plan = planner_.Step(GroupId(static_cast<std::uint16_t>(g)), selections[g], runs[g]);
    return Timed{std::move(plan), std::chrono::duration<double>(Clock::now() - t0).count()};
  };
  TpPipelineStats stats;
  const auto start = Clock::now();
  std::future<Timed> next;
  if (prefetch) next = std::async(std::launch::async, step, 0u);
  for (std::uint32_t g = 0; g < groups; ++g) {
    Timed cur = prefetch ? next.get() : step(g);
    stats.fetch_s += cur.seconds;
    if (!cur.plan) {
      return MakeError(cur.plan.error().code(),
                       fmt::format("group {} of {} failed ({} stepped before it): {}", g, groups, g, cur.plan.error().message()));
    }
    if (prefetch && g + 1 < groups) next = std::async(std::launch::async, step, g + 1);
    const auto c0 = Clock::now();
    compute(GroupId(static_cast<std::uint16_t>(g)), *cur.plan);
    stats.compute_s += std::chrono::duration<double>(Clock::now() - c0).count();
    stats.totals += cur.plan->Total();
  }
  stats.wall_s = std::chrono::duration<double>(Clock::now() - start).count();
  return stats;
}

}  // namespace ula
