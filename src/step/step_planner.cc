// StepPlanner: the library path of the DP host step (step_planner.h) over the one plan of
// step/dp_step.h, which the engine path (EngineStepPlanner) runs too: classify, claim and
// describe the plan, run its descriptors on the space's backend, complete by their outcomes,
// then read the misses' slots.
#include "ula/step_planner.h"

#include <fmt/format.h>

#include <limits>
#include <vector>

#include "space/address_space_state.h"
#include "space/space_access.h"
#include "step/dp_step.h"

namespace ula {

struct StepPlanner::Impl {
  explicit Impl(AddressSpace& space) : step(space) {}
  DpStep step;                       // the one DP step, shared with the engine path
  std::vector<std::uint8_t> status;  // [descriptors] each descriptor's outcome on the backend
};

StepPlanner::StepPlanner(AddressSpace& space) : space_(space), impl_(std::make_unique<Impl>(space)) {}
StepPlanner::~StepPlanner() = default;

Status StepPlanner::SetOptions(const StepPlannerOptions& options) { return impl_->step.SetOptions(options); }
const StepPlannerOptions& StepPlanner::options() const { return impl_->step.options(); }
const StepPlannerCounters& StepPlanner::counters() const { return impl_->step.counters(); }

namespace {
// The checks of the step's arguments that need no state: rank, group, output size.
Status CheckStepInput(const AddressSpaceConfig& cfg, const StepInput& input, std::size_t num_out) {
  if (input.rank.value() >= cfg.num_ranks) {
    return MakeError(ErrorCode::kOutOfRange, fmt::format("rank {} is out of range ({} ranks)", input.rank.value(), cfg.num_ranks));
  }
  if (input.group.value() >= cfg.num_groups) {
    return MakeError(ErrorCode::kOutOfRange, fmt::format("group {} is out of range ({} groups)", input.group.value(), cfg.num_groups));
  }
  if (num_out != input.selections.size()) {
    return MakeError(ErrorCode::kInvalidArgument,
                     fmt::format("{} output slots for {} selections", num_out, input.selections.size()));
  }
  if (input.selections.size() > std::numeric_limits<std::uint32_t>::max()) {
    return MakeError(ErrorCode::kInvalidArgument, fmt::format("{} selections: at most 2^32 - 1 per step",
                                                              input.selections.size()));
  }
  return Ok();
}
}  // namespace

Result<StepStats> StepPlanner::Step(const StepInput& input, std::span<SlotId> out_slots) {
  ULA_RETURN_IF_ERROR(CheckStepInput(space_.config(), input, out_slots.size()));
  ULA_RETURN_IF_ERROR(CheckSelectionRuns(input.runs, input.selections.size()));
  // One plan at a time over a space: an engine plan's claims must not be taken by this step.
  ULA_RETURN_IF_ERROR(StateOf(space_).dir.RefuseWhilePlanPending("StepPlanner::Step"));
  static_assert(sizeof(LogicalAddr) == sizeof(std::uint32_t));
  const DpSelections sel{
      std::span(reinterpret_cast<const std::uint32_t*>(input.selections.data()), input.selections.size()), input.runs};
  DpStep& step = impl_->step;
  auto stats = step.Classify(input.rank, input.group, sel, out_slots.data());
  if (!stats) return stats;
  step.Claim(*stats);
  std::vector<std::uint8_t>& status = impl_->status;
  status.resize(step.descriptors().size());
  Status ran = status.empty() ? Ok() : step.Run(status);
  step.Complete(status);
  if (!ran) return std::unexpected(std::move(ran).error());
  step.WritePublished(out_slots.data());
  return stats;
}

}  // namespace ula
