// TpEngineStepPlanner (include/ula/tp_engine_step.h): the selection array compacted into
// TpStepPlanner's (selections, runs), its refs written back as per-rank index arrays.
#include "ula/tp_engine_step.h"

#include <algorithm>
#include <string>

namespace ula {

Result<std::unique_ptr<TpEngineStepPlanner>> TpEngineStepPlanner::Create(TpAddressSpace& space,
                                                                         const EngineStepConfig& config,
                                                                         TpFabric* fabric, TpPlannerOptions options) {
  ULA_RETURN_IF_ERROR(config.Validate());
  return std::unique_ptr<TpEngineStepPlanner>(new TpEngineStepPlanner(space, config, fabric, options));
}

TpEngineStepPlanner::TpEngineStepPlanner(TpAddressSpace& space, const EngineStepConfig& config, TpFabric* fabric,
                                         TpPlannerOptions options)
    : space_(space), config_(config), planner_(space, fabric, options) {
  const std::size_t most = std::size_t{config.max_batch} * config.max_q_len * config.max_top_k;
  compact_.reserve(most);
  where_.reserve(most);
  runs_.reserve(config.max_batch);
}

TpEngineStepPlanner::~TpEngineStepPlanner() = default;

std::span<const Rank> TpEngineStepPlanner::ranks() const { return space_.hosted_ranks(); }

std::uint32_t TpEngineStepPlanner::device_slots() const { return space_.config().device_slots_per_group(); }

std::uint32_t TpEngineStepPlanner::index_slots() const {
  const auto& c = space_.config();
  return c.attention == TpAttention::kLocalBuffer ? c.device_slots_per_group() + c.buffer_slots_per_group()
                                                  : c.device_slots_per_group();
}

Result<std::vector<TpRankStepStats>> TpEngineStepPlanner::Step(GroupId group, const StepShape& shape,
                                                               std::span<const RequestId> requests,
                                                               std::span<const std::int32_t> selections,
                                                               std::span<std::int32_t> indices) {
  if (shape.batch == 0 || shape.q_len == 0 || shape.top_k == 0 || shape.batch > config_.max_batch ||
      shape.q_len > config_.max_q_len || shape.top_k > config_.max_top_k) {
    return MakeError(ErrorCode::kInvalidArgument, "shape [" + std::to_string(shape.batch) + ", " +
                                                std::to_string(shape.q_len) + ", " + std::to_string(shape.top_k) +
                                                "] is empty or past the planner's config");
  }
  const std::size_t n = shape.size();
  const std::size_t hosted = ranks().size();
  if (requests.size() != shape.batch || selections.size() != n || indices.size() != hosted * n) {
    return MakeError(ErrorCode::kInvalidArgument,
               "sizes: requests " + std::to_string(requests.size()) + " (want " + std::to_string(shape.batch) +
                   "), selections " + std::to_string(selections.size()) + " (want " + std::to_string(n) +
                   "), indices " + std::to_string(indices.size()) + " (want " + std::to_string(hosted * n) + ")");
  }
  compact_.clear();
  where_.clear();
  runs_.clear();
  const std::size_t per_row = std::size_t{shape.q_len} * shape.top_k;
  for (std::uint32_t b = 0; b < shape.batch; ++b) {
    std::uint32_t count = 0;
    for (std::size_t i = b * per_row; i < (b + 1) * per_row; ++i) {
      const std::int32_t a = selections[i];
      if (a == kPadIndex) continue;
      if (a < kPadIndex) {
        return MakeError(ErrorCode::kInvalidArgument, "selection " + std::to_string(i) + " is " + std::to_string(a) +
                                                    " (addresses are >= 0, padding is -1)");
      }
      compact_.push_back(LogicalAddr(static_cast<std::uint32_t>(a)));
      where_.push_back(static_cast<std::uint32_t>(i));
      ++count;
    }
    if (count > 0) runs_.push_back(SelectionRun{requests[b], count});
  }
  auto plan = planner_.Step(group, compact_, runs_);
  if (!plan) return std::unexpected(plan.error());
  const std::uint32_t buffer_base = device_slots();
  for (std::size_t r = 0; r < hosted; ++r) {
    std::span<std::int32_t> out = indices.subspan(r * n, n);
    std::fill(out.begin(), out.end(), kPadIndex);
    for (std::size_t j = 0; j < compact_.size(); ++j) {
      const TpReadRef& ref = plan->refs[r][j];
      switch (ref.source) {
        case TpReadRef::Source::kShard: out[where_[j]] = static_cast<std::int32_t>(ref.slot.value()); break;
        case TpReadRef::Source::kBuffer:
          out[where_[j]] = static_cast<std::int32_t>(buffer_base + ref.slot.value());
          break;
        case TpReadRef::Source::kElsewhere: break;  // stays -1: its home rank's partial covers it
      }
    }
  }
  return std::move(plan->stats);
}

}  // namespace ula
