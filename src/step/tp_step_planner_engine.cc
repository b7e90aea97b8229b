// TpStepPlanner's engine path (include/ula/tp_step_planner.h): the selection array compacted
// into the runs layout (selections, runs) the step takes, its refs written back as per-rank
// index arrays; Plan / Complete over PlanHome / CompleteHome.
#include "ula/tp_step_planner.h"

#include <fmt/format.h>

#include <algorithm>
#include <string>

#include "space/space_access.h"
#include "step/engine_modes.h"
#include "space/tp_state.h"
#include "step/tp_step_planner_engine.h"
#include "ula/check.h"

namespace ula {

Result<std::unique_ptr<TpStepPlanner>> TpStepPlanner::Create(TpAddressSpace& space, const EngineStepConfig& config,
                                                             TpFabric* fabric, TpPlannerOptions options) {
  ULA_RETURN_IF_ERROR(config.Validate());
  ULA_RETURN_IF_ERROR(RefuseTpKinds(KindsWithoutHome(space.config()), "TpStepPlanner::Create"));
  ULA_RETURN_IF_ERROR(RefuseUnstableNewEntries(space.config().stable_new_entries, "TpConfig"));
  auto planner = std::make_unique<TpStepPlanner>(space, fabric, options);
  auto engine = std::make_unique<Engine>();
  engine->config = config;
  const std::size_t most = config.rows() * config.max_top_k;
  engine->compact.reserve(most);
  engine->where.reserve(most);
  engine->runs.reserve(config.max_batch);
  engine->share.Configure(config.reserve_window, config.reserve_quantile,  // the table only where it runs
                          config.reserve == ReserveMode::kQuantile ? std::uint64_t{config.max_q_len} * config.max_top_k : 0);
  planner->engine_ = std::move(engine);
  return planner;
}

namespace {
// Positions k in [0, x) with k mod P == r.
std::uint64_t PositionsOn(std::uint64_t x, std::uint32_t p, std::uint32_t r) { return x / p + (x % p > r ? 1 : 0); }
}  // namespace

Result<RoundReservation> TpStepPlanner::ReserveRound(std::span<const RoundDemand> demands) const {
  const TpAddressSpace::State& st = StateOf(space_);
  const TpConfig& cfg = space_.config();
  ULA_RETURN_IF_ERROR(RefuseWithoutEngineConfig(engine_ != nullptr, "TpStepPlanner", "ReserveRound"));
  ULA_RETURN_IF_ERROR(st.dir.RefuseWhilePlanPending("ReserveRound"));
  const EngineStepConfig& config = engine_->config;
  const std::uint64_t row_max = std::uint64_t{config.max_q_len} * config.max_top_k;
  const std::uint32_t p = cfg.num_ranks;
  // New tokens are homed by position when P divides the page (token i on rank i mod P).
  const bool by_position = cfg.page_tokens > 1 && cfg.page_tokens % p == 0;
  std::vector<RequestId> seen;
  seen.reserve(demands.size());
  for (const RoundDemand& d : demands) {
    if (!st.dir.requests().contains(d.request)) {
      return MakeError(ErrorCode::kNotFound, fmt::format("ReserveRound: request {} is unknown", d.request.value()));
    }
    if (d.max_selections > row_max) {
      return MakeError(ErrorCode::kInvalidArgument,
                       fmt::format("ReserveRound: request {} selects up to {} entries, past the planner's "
                                   "max_q_len x max_top_k = {}", d.request.value(), d.max_selections, row_max));
    }
    seen.push_back(d.request);
  }
  std::sort(seen.begin(), seen.end());
  if (auto dup = std::adjacent_find(seen.begin(), seen.end()); dup != seen.end()) {
    return MakeError(ErrorCode::kInvalidArgument, fmt::format("ReserveRound: request {} is listed twice", dup->value()));
  }
  const bool quantile = config.reserve == ReserveMode::kQuantile;
  RoundReservation out;
  for (Rank r : space_.hosted_ranks()) {
    std::uint64_t new_here = 0, home_sel = 0, remote_sel = 0;
    for (const RoundDemand& d : demands) {
      const std::vector<LogicalAddr>& addrs = st.dir.requests().at(d.request).addrs;
      std::uint64_t held_here = 0;
      for (LogicalAddr a : addrs) held_here += a.value() % p == r.value();
      const std::uint64_t len = addrs.size();
      const std::uint64_t fresh = by_position ? PositionsOn(len + d.new_tokens, p, r.value()) - PositionsOn(len, p, r.value())
                                              : d.new_tokens;
      new_here += fresh;
      const std::uint64_t elsewhere = len + d.new_tokens - std::min<std::uint64_t>(len + d.new_tokens, held_here + fresh);
      const std::uint64_t home_bound = std::min<std::uint64_t>(d.max_selections, held_here + fresh);
      const std::uint64_t remote_bound = std::min<std::uint64_t>(d.max_selections, by_position ? elsewhere : len + d.new_tokens);
      home_sel += quantile ? engine_->share.Reserve(home_bound, d.max_selections) : home_bound;
      remote_sel += quantile ? engine_->share.Reserve(remote_bound, d.max_selections) : remote_bound;
    }
    for (std::uint32_t g = 0; g < cfg.num_groups; ++g) {
      const TpGroupShard& sh = st.at(r, GroupId(static_cast<std::uint16_t>(g)));
      const std::uint64_t room = sh.device.capacity() - (sh.device.num_used() - sh.policy->NumEvictable());
      const std::uint64_t needed = new_here + home_sel;
      const std::uint64_t seatable = std::uint64_t{sh.device.num_free()} + sh.HostFree();
      if (needed > room || new_here > seatable) {
        return MakeError(ErrorCode::kResourceExhausted,
                         fmt::format("ReserveRound: rank {} group {}: the round needs up to {} device slots ({} new "
                                     "tokens homed here + {} selections) but {} of {} are not yet used in this "
                                     "round, and {} new tokens against {} free slots: schedule fewer requests this "
                                     "round", r.value(), g, needed, new_here, home_sel, room, sh.device.capacity(),
                                     new_here, seatable));
      }
      if (cfg.attention == TpAttention::kLocalBuffer) {
        const std::uint64_t buffer_room =
            sh.buffer.capacity() - (sh.buffer.num_used() - sh.buffer_policy->NumEvictable());
        if (remote_sel > buffer_room) {
          return MakeError(ErrorCode::kResourceExhausted,
                           fmt::format("ReserveRound: rank {} group {}: the round selects up to {} entries homed "
                                       "elsewhere but {} of the local buffer's {} slots are not yet used in this "
                                       "round: schedule fewer requests this round", r.value(), g, remote_sel,
                                       buffer_room, sh.buffer.capacity()));
        }
      }
      if (needed > out.device_needed || out.device_room == 0) out = RoundReservation{needed, room};
    }
  }
  return out;
}

std::span<const Rank> TpStepPlanner::ranks() const { return space_.hosted_ranks(); }

std::uint32_t TpStepPlanner::device_slots() const { return space_.config().device_slots_per_group(); }

std::uint32_t TpStepPlanner::index_slots() const {
  const auto& c = space_.config();
  return c.attention == TpAttention::kLocalBuffer ? c.device_slots_per_group() + c.buffer_slots_per_group()
                                                  : c.device_slots_per_group();
}

Status TpStepPlanner::Compact(const StepShape& shape, std::span<const RequestId> requests,
                                    std::span<const std::int32_t> selections, std::size_t indices_size) {
  ULA_RETURN_IF_ERROR(RefuseWithoutEngineConfig(engine_ != nullptr, "TpStepPlanner", "the engine layout's step"));
  const EngineStepConfig& config = engine_->config;
  if (shape.batch == 0 || shape.q_len == 0 || shape.top_k == 0 || shape.batch > config.max_batch ||
      shape.q_len > config.max_q_len || shape.top_k > config.max_top_k ||
      std::uint64_t{shape.batch} * shape.q_len > config.rows()) {
    return MakeError(ErrorCode::kInvalidArgument, "shape [" + std::to_string(shape.batch) + ", " +
                                                std::to_string(shape.q_len) + ", " + std::to_string(shape.top_k) +
                                                "] is empty or past the planner's config");
  }
  const std::size_t n = shape.size();
  const std::size_t hosted = ranks().size();
  if (requests.size() != shape.batch || selections.size() != n || indices_size != hosted * n) {
    return MakeError(ErrorCode::kInvalidArgument,
               "sizes: requests " + std::to_string(requests.size()) + " (want " + std::to_string(shape.batch) +
                   "), selections " + std::to_string(selections.size()) + " (want " + std::to_string(n) +
                   "), indices " + std::to_string(indices_size) + " (want " + std::to_string(hosted * n) + ")");
  }
  std::vector<LogicalAddr>& compact = engine_->compact;
  std::vector<std::uint32_t>& where = engine_->where;
  std::vector<SelectionRun>& runs = engine_->runs;
  compact.clear();
  where.clear();
  runs.clear();
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
      compact.push_back(LogicalAddr(static_cast<std::uint32_t>(a)));
      where.push_back(static_cast<std::uint32_t>(i));
      ++count;
    }
    if (count > 0) runs.push_back(SelectionRun{requests[b], count});
  }
  return Ok();
}

void TpStepPlanner::Measure(const StepShape& shape, std::span<const RequestId> requests,
                            std::span<const std::int32_t> selections) {
  if (engine_->config.reserve != ReserveMode::kQuantile) return;
  const auto& reqs = StateOf(space_).dir.requests();
  engine_->share.RecordPlan(shape.batch, std::size_t{shape.q_len} * shape.top_k, selections,
                            [&](std::uint32_t b) { return reqs.contains(requests[b]); });
}

void TpStepPlanner::WriteIndices(const TpStepPlan& plan, std::size_t n, std::span<std::int32_t> indices) const {
  const std::uint32_t buffer_base = device_slots();
  const std::vector<std::uint32_t>& where = engine_->where;
  for (std::size_t r = 0; r < plan.refs.size(); ++r) {
    std::span<std::int32_t> out = indices.subspan(r * n, n);
    std::fill(out.begin(), out.end(), kPadIndex);
    for (std::size_t j = 0; j < engine_->compact.size(); ++j) {
      const TpReadRef& ref = plan.refs[r][j];
      switch (ref.source) {
        case TpReadRef::Source::kShard: out[where[j]] = static_cast<std::int32_t>(ref.slot.value()); break;
        case TpReadRef::Source::kBuffer:
          out[where[j]] = static_cast<std::int32_t>(buffer_base + ref.slot.value());
          break;
        case TpReadRef::Source::kElsewhere: break;  // stays -1: its home rank's partial covers it
      }
    }
  }
}

Result<std::vector<StepStats>> TpStepPlanner::Step(GroupId group, const StepShape& shape,
                                                               std::span<const RequestId> requests,
                                                               std::span<const std::int32_t> selections,
                                                               std::span<std::int32_t> indices) {
  ULA_RETURN_IF_ERROR(Compact(shape, requests, selections, indices.size()));
  auto plan = Step(group, engine_->compact, engine_->runs);
  if (!plan) return std::unexpected(plan.error());
  WriteIndices(*plan, shape.size(), indices);
  Measure(shape, requests, selections);
  return std::move(plan->stats);
}

std::uint32_t TpStepPlanner::max_descriptors() const {
  return static_cast<std::uint32_t>(ranks().size()) * index_slots();
}

Result<TpPlannedStep> TpStepPlanner::Plan(GroupId group, const StepShape& shape,
                                                std::span<const RequestId> requests,
                                                std::span<const std::int32_t> selections,
                                                std::span<std::int32_t> indices,
                                                DescriptorSink out_descriptors) {
  auto rows = out_descriptors.Rows();
  if (!rows) return std::unexpected(std::move(rows).error());
  ULA_RETURN_IF_ERROR(Compact(shape, requests, selections, indices.size()));
  auto plan = PlanHome(group, engine_->compact, engine_->runs, *rows);
  if (!plan) return std::unexpected(plan.error());
  WriteIndices(*plan, shape.size(), indices);
  Measure(shape, requests, selections);
  Engine& en = *engine_;
  TpPlannedStep planned;
  planned.fence = ++en.last_fence;
  planned.stats = plan->stats;
  en.pending_counts.assign(plan->ranks.size(), 0);
  en.pending_fetches.assign(plan->ranks.size(), 0);
  const std::uint32_t entry_bytes = space_.config().entry_bytes;
  const std::uint32_t buffer_base = device_slots();
  std::uint32_t d = 0;
  for (std::size_t h = 0; h < plan->ranks.size(); ++h) {  // phase 1: the remote fetches
    const auto fetches = pending_remote_fetches(h);
    for (const auto& f : fetches) {
      // A TP entry moves whole: one row of entry_bytes (offsets slot * entry_bytes, as the
      // planner's source_offset is).
      out_descriptors.Put(d++, MakeCopyDescriptor(
          CopyOp::kCopy, {f.source.tier(), f.home.value(), f.source.slot().value()},
          {Tier::kDevice, plan->ranks[h].value(), buffer_base + f.buffer_slot.value()}, f.addr.value(), group.value(),
          entry_bytes, 1));
    }
    en.pending_fetches[h] = static_cast<std::uint32_t>(fetches.size());
  }
  planned.first_phase = d;
  for (std::size_t h = 0; h < plan->ranks.size(); ++h) {  // phase 2: the home moves
    const auto moves = pending_home_descriptors(h);
    for (const CopyDescriptor& m : moves) out_descriptors.Put(d++, m);
    en.pending_counts[h] = static_cast<std::uint32_t>(moves.size());
  }
  planned.num_descriptors = d;
  en.pending_fence = planned.fence;
  return planned;
}

Result<CompleteReport> TpStepPlanner::Complete(std::uint64_t fence, std::span<const std::uint8_t> status) {
  if (!has_pending() || engine_ == nullptr || fence != engine_->pending_fence) {
    return MakeError(ErrorCode::kNotFound, "fence " + std::to_string(fence) + " is not the pending plan's");
  }
  const std::vector<std::uint32_t>& fetch_counts = engine_->pending_fetches;
  const std::vector<std::uint32_t>& move_counts = engine_->pending_counts;
  std::size_t total = 0;
  std::vector<std::size_t> first_fetch(fetch_counts.size()), first(move_counts.size());
  for (std::size_t h = 0; h < fetch_counts.size(); ++h) {
    first_fetch[h] = total;
    total += fetch_counts[h];
  }
  for (std::size_t h = 0; h < move_counts.size(); ++h) {
    first[h] = total;
    total += move_counts[h];
  }
  if (status.size() != total) {
    return MakeError(ErrorCode::kInvalidArgument, "status has " + std::to_string(status.size()) +
                                                      " entries; the pending plan has " + std::to_string(total) +
                                                      " descriptors");
  }
  const auto published = CompleteHome([&](std::size_t h, std::size_t i) { return status[first[h] + i]; },
                                      [&](std::size_t h, std::size_t i) { return status[first_fetch[h] + i] == 0; });
  CompleteReport report;
  for (std::size_t p : published) report.published += static_cast<std::uint32_t>(p);
  report.failed = static_cast<std::uint32_t>(total) - report.published;
  return report;
}

void TpStepPlanner::ExecuteOnShards(std::span<const CopyDescriptor> descriptors,
                                          std::span<std::uint8_t> status) const {
  ULA_CHECK(status.size() == descriptors.size());
  const TpAddressSpace::State& st = StateOf(space_);
  Backend& backend = space_.backend();
  const std::uint32_t buffer_base = device_slots();
  const std::uint64_t entry_bytes = space_.config().entry_bytes;
  const auto device = static_cast<std::uint8_t>(Tier::kDevice), host = static_cast<std::uint8_t>(Tier::kHost);
  for (std::size_t i = 0; i < descriptors.size(); ++i) {
    const CopyDescriptor& c = descriptors[i];
    status[i] = 1;
    const Rank rank(c.dst_rank), source(c.src_rank);
    if (!space_.Hosts(rank) || !space_.Hosts(source) || c.group >= space_.config().num_groups ||
        c.dst_tier != device || (c.src_tier != device && c.src_tier != host)) {
      continue;
    }
    const TpGroupShard& dst = st.at(rank, GroupId(c.group));
    const TpGroupShard& src = st.at(source, GroupId(c.group));
    CopyBatch batch;
    if (c.dst_slot >= buffer_base) {  // a remote fetch into the local buffer
      if (c.op != static_cast<std::uint8_t>(CopyOp::kCopy)) continue;
      batch = CopyBatch{(c.src_tier == device ? src.device : src.host).arena().id, dst.buffer.arena().id, c.bytes,
                        /*swap=*/false, {SlotMove{c.src_offset, (c.dst_slot - buffer_base) * entry_bytes}}};
    } else {  // a home move within one rank's shard
      if (c.src_rank != c.dst_rank || c.src_tier != host || c.op > static_cast<std::uint8_t>(CopyOp::kEvict)) continue;
      if (c.op == static_cast<std::uint8_t>(CopyOp::kEvict)) {  // the victim's row out to its host slot first
        auto out = backend.Submit(CopyBatch{dst.device.arena().id, dst.host.arena().id, c.bytes, /*swap=*/false,
                                            {SlotMove{c.dst_offset, dst.host.offset(SlotId(c.evict_slot))}}});
        if (!out || !backend.Wait(*out)) continue;
        status[i] = kEvictLanded;
      }
      batch = CopyBatch{dst.host.arena().id, dst.device.arena().id, c.bytes, c.op == static_cast<std::uint8_t>(CopyOp::kSwap),
                        {SlotMove{c.src_offset, c.dst_offset}}};
    }
    auto f = backend.Submit(std::move(batch));
    if (f && backend.Wait(*f)) status[i] = 0;
  }
}

}  // namespace ula
