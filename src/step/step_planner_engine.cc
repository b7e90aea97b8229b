// StepPlanner's engine path (ula/step_planner.h) over the one plan of
// step/step_planner_impl.h. Plan checks the engine's shape, hands the step the rows as runs of
// the kernels' padded layout, and writes the indices and the descriptors; Complete publishes
// by the engine's statuses. Step in the engine layout is the same plan, run on the backend,
// and Complete with each descriptor's outcome.
#include "ula/step_planner.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>

#include "space/space_access.h"
#include "step/engine_modes.h"
#include "step/step_planner_impl.h"
#include "space/address_space_state.h"
#include "ula/check.h"

namespace ula {

Status EngineStepConfig::Validate() const {
  auto bad = [](std::string m) { return MakeError(ErrorCode::kInvalidArgument, "EngineStepConfig." + m); };
  if (max_batch == 0) return bad("max_batch: must be >= 1");
  if (max_q_len == 0) return bad("max_q_len: must be >= 1");
  if (max_top_k == 0) return bad("max_top_k: must be >= 1");
  if (top_k_multiple == 0 || max_top_k % top_k_multiple != 0) {
    return bad(fmt::format("top_k_multiple = {}: must be >= 1 and divide max_top_k = {}", top_k_multiple, max_top_k));
  }
  if (std::uint64_t{max_rows} > std::uint64_t{max_batch} * max_q_len) {
    return bad(fmt::format("max_rows = {}: more than max_batch x max_q_len = {} rows", max_rows,
                           std::uint64_t{max_batch} * max_q_len));
  }
  if (rows() * max_top_k > (std::uint64_t{1} << 31)) {
    return bad(max_rows != 0 ? "max_rows * max_top_k: more than 2^31 selections"
                             : "max_batch * max_q_len * max_top_k: more than 2^31 selections (set max_rows to the "
                               "rows one step reads, e.g. the token budget)");
  }
  if (!(reserve_quantile > 0.0 && reserve_quantile <= 1.0)) {
    return bad(fmt::format("reserve_quantile = {}: must be in (0, 1]", reserve_quantile));
  }
  if (reserve_window == 0) return bad("reserve_window: must be >= 1");
  if (reserve != ReserveMode::kGuaranteed && reserve != ReserveMode::kQuantile) {
    return bad(fmt::format("reserve = {}: not a ReserveMode", static_cast<int>(reserve)));
  }
  return Ok();
}

Result<std::unique_ptr<StepPlanner>> StepPlanner::Create(AddressSpace& space, const EngineStepConfig& config) {
  ULA_RETURN_IF_ERROR(config.Validate());
  const AddressSpaceConfig& cfg = space.config();
  ULA_RETURN_IF_ERROR(RefuseUnstableNewEntries(cfg.stable_new_entries, "AddressSpaceConfig"));
  ULA_RETURN_IF_ERROR(RefuseDevicePlacement(cfg.device_placement, "StepPlanner::Create"));
  const std::uint64_t max_sel = config.rows() * config.max_top_k;
  // Addresses come in pages (address_space.h "Pages"): a page is minted only when none is
  // free, i.e. when every handed-out page holds a live address; live addresses fit in the
  // pools. So pages stay below the pools' capacity, addresses below page_tokens times that.
  // The step's scratch starts at the addresses handed out so far (at least the pools'
  // capacity) and Plan grows it, up to that bound, when the space minted pages since.
  const std::uint64_t max_addrs = std::max<std::uint64_t>(
      StateOf(space).dir.extent(),
      std::uint64_t{cfg.num_ranks} * (std::uint64_t{cfg.device_slots_per_group()} + cfg.host_slots_per_group()));
  auto m = std::make_unique<Impl>(space);
  m->engine = config;
  m->max_descriptors = static_cast<std::uint32_t>(std::min<std::uint64_t>(max_sel, cfg.device_slots_per_group()));
  m->Reserve(max_sel, m->max_descriptors, max_addrs);
  m->runs.resize(config.max_batch);
  m->status.reserve(m->max_descriptors);
  // The measurement's table only where it runs (kQuantile): 16 B a slot, twice a request's rows.
  m->share.Configure(config.reserve_window, config.reserve_quantile,
                     config.reserve == ReserveMode::kQuantile ? std::uint64_t{config.max_q_len} * config.max_top_k : 0);
  return std::unique_ptr<StepPlanner>(new StepPlanner(space, std::move(m)));
}

std::uint32_t StepPlanner::max_descriptors() const { return impl_->max_descriptors; }

Result<PlannedStep> StepPlanner::Prepare(Rank rank, GroupId group, const StepShape& shape,
                                               std::span<const RequestId> requests,
                                               std::span<const std::int32_t> selections,
                                               std::span<std::int32_t> indices, const DescriptorSink* out_descriptors) {
  Impl& m = *impl_;
  AddressSpace::State& st = StateOf(space_);
  const AddressSpaceConfig& cfg = space_.config();
  ULA_RETURN_IF_ERROR(RefuseWithoutEngineConfig(m.engine.has_value(), "StepPlanner", "Plan"));
  const EngineStepConfig& config = *m.engine;
  // The descriptors' rows: the caller's records or columns (refused as Rows says), or the
  // library's own plan (Step).
  std::size_t descriptor_rows = m.max_descriptors;
  if (out_descriptors != nullptr) {
    auto rows = out_descriptors->Rows();
    if (!rows) return std::unexpected(std::move(rows).error());
    descriptor_rows = *rows;
  }
  if (m.pending) {
    return MakeError(ErrorCode::kFailedPrecondition,
                     fmt::format("plan {} is pending: Complete it before planning again", m.fence));
  }
  // One plan at a time over a space: a pending plan's swap victims stay claimed only while
  // no other plan can take them (AdvanceRound between Plan and Complete ends their round).
  ULA_RETURN_IF_ERROR(st.dir.RefuseWhilePlanPending("Plan (another StepPlanner's over this space)"));
  if (rank.value() >= cfg.num_ranks) {
    return MakeError(ErrorCode::kOutOfRange, fmt::format("rank {} is out of range ({} ranks)", rank.value(), cfg.num_ranks));
  }
  if (group.value() >= cfg.num_groups) {
    return MakeError(ErrorCode::kOutOfRange, fmt::format("group {} is out of range ({} groups)", group.value(), cfg.num_groups));
  }
  if (shape.batch > config.max_batch || shape.q_len > config.max_q_len || shape.top_k > config.max_top_k) {
    return MakeError(ErrorCode::kInvalidArgument,
                     fmt::format("shape [{}][{}][{}] exceeds the planner's maximum [{}][{}][{}]", shape.batch,
                                 shape.q_len, shape.top_k, config.max_batch, config.max_q_len, config.max_top_k));
  }
  if (std::uint64_t{shape.batch} * shape.q_len > config.rows()) {
    return MakeError(ErrorCode::kInvalidArgument,
                     fmt::format("shape [{}][{}][{}]: {} rows, more than max_rows = {}", shape.batch, shape.q_len,
                                 shape.top_k, std::uint64_t{shape.batch} * shape.q_len, config.rows()));
  }
  if (shape.top_k % config.top_k_multiple != 0) {
    return MakeError(ErrorCode::kInvalidArgument,
                     fmt::format("top_k = {} is not a multiple of {} (FlashMLA's sparse kernels read index rows in "
                                 "tiles of 64: pad the rows with -1)", shape.top_k, config.top_k_multiple));
  }
  if (selections.size() != shape.size() || indices.size() != shape.size()) {
    return MakeError(ErrorCode::kInvalidArgument,
                     fmt::format("shape [{}][{}][{}] needs {} selections and indices, got {} and {}", shape.batch,
                                 shape.q_len, shape.top_k, shape.size(), selections.size(), indices.size()));
  }
  if (requests.size() != shape.batch) {
    return MakeError(ErrorCode::kInvalidArgument,
                     fmt::format("{} requests for a batch of {} rows", requests.size(), shape.batch));
  }
  // 1-3. Validate, dedup, classify: row b is a run of q_len x top_k selections of
  // requests[b]; -1 is padding. Nothing is modified until every check has passed.
  const auto row_len = static_cast<std::uint32_t>(std::uint64_t{shape.q_len} * shape.top_k);
  for (std::uint32_t b = 0; b < shape.batch; ++b) m.runs[b] = SelectionRun{requests[b], row_len};
  static_assert(sizeof(std::int32_t) == sizeof(std::uint32_t));
  const StepSelections sel{std::span(reinterpret_cast<const std::uint32_t*>(selections.data()), selections.size()),
                         std::span(m.runs).first(shape.batch), /*padding=*/true};
  auto stats = m.Classify(rank, group, sel, indices.data());
  if (!stats) return std::unexpected(std::move(stats).error());
  // Room was checked by Classify; then the descriptor rows: both refuse this step's state
  // (kResourceExhausted), not a malformed call; each says how many descriptors it needed.
  const std::size_t n_miss = m.missed.size();
  if (descriptor_rows < n_miss) {
    return MakeError(ErrorCode::kResourceExhausted,
                     fmt::format("step needs {} descriptors ({} misses) but the descriptor array has {} rows (size it "
                                 "to max_descriptors() = {})",
                                 n_miss, n_miss, descriptor_rows, m.max_descriptors));
  }

  // 4. Claim device slots and describe the copies (each written to out_descriptors as it is
  // made); 6. the misses' indices.
  PlannedStep out;
  out.stats = *stats;
  m.Claim(out.stats, out_descriptors);
  m.WriteTargets(indices.data());
  out.fence = m.fence;
  out.num_descriptors = static_cast<std::uint32_t>(n_miss);
  if (config.reserve == ReserveMode::kQuantile) {  // ReserveRound's measurement: each request's rows
    m.share.RecordPlan(shape.batch, row_len, selections,
                       [&](std::uint32_t b) { return st.dir.requests().contains(requests[b]); });
  }
  return out;
}

Result<PlannedStep> StepPlanner::Plan(Rank rank, GroupId group, const StepShape& shape,
                                            std::span<const RequestId> requests,
                                            std::span<const std::int32_t> selections, std::span<std::int32_t> indices,
                                            DescriptorSink out_descriptors) {
  return Prepare(rank, group, shape, requests, selections, indices, &out_descriptors);
}

Result<RoundReservation> StepPlanner::ReserveRound(Rank rank, std::span<const RoundDemand> demands) const {
  const AddressSpace::State& st = StateOf(space_);
  const AddressSpaceConfig& cfg = space_.config();
  ULA_RETURN_IF_ERROR(RefuseWithoutEngineConfig(impl_->engine.has_value(), "StepPlanner", "ReserveRound"));
  const EngineStepConfig& config = *impl_->engine;
  ULA_RETURN_IF_ERROR(st.dir.RefuseWhilePlanPending("ReserveRound"));
  if (rank.value() >= cfg.num_ranks) {
    return MakeError(ErrorCode::kOutOfRange, fmt::format("rank {} is out of range ({} ranks)", rank.value(), cfg.num_ranks));
  }
  const std::uint64_t row_max = std::uint64_t{config.max_q_len} * config.max_top_k;
  std::uint64_t new_tokens = 0, selected = 0;
  std::vector<RequestId> seen;
  seen.reserve(demands.size());
  for (const RoundDemand& d : demands) {
    auto it = st.dir.requests().find(d.request);
    if (it == st.dir.requests().end()) {
      return MakeError(ErrorCode::kNotFound, fmt::format("ReserveRound: request {} is unknown", d.request.value()));
    }
    if (it->second.rank != rank) {
      return MakeError(ErrorCode::kInvalidArgument, fmt::format("ReserveRound: request {} is on rank {}, not {}",
                                                                d.request.value(), it->second.rank.value(), rank.value()));
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
  // Over frames (docs/ARCHITECTURE.md, "The space over frames") new_tokens are the round's
  // tokens: its Allocates' C4 entries and the free frames their resident kinds may take
  // (KindEntries::CheckRound, Allocate's check over the whole round), whose C4 slots leave
  // every group's share.
  std::vector<std::uint32_t> entries;
  std::uint64_t withheld_slots = 0;
  if (st.frames) {  // the round's frames
    std::vector<KindEntries::RoundAppend> appends;
    appends.reserve(demands.size());
    for (const RoundDemand& d : demands) appends.push_back({d.request, d.new_tokens});
    auto round = st.kinds.CheckRound("ReserveRound", appends);
    if (!round) return std::unexpected(round.error());
    entries = std::move(round->entries);
    withheld_slots = std::uint64_t{round->frames} * st.frames->envelope(st.kinds.sparse_kind()).per_frame *
                     KindEntries::kBlockEntries;
  }
  for (std::size_t i = 0; i < demands.size(); ++i) {
    const RoundDemand& d = demands[i];
    const std::uint64_t n = entries.empty() ? d.new_tokens : entries[i];
    new_tokens += n;
    const std::uint64_t held = st.dir.requests().at(d.request).addrs.size() + n;
    const std::uint64_t bound = std::min<std::uint64_t>(d.max_selections, held);
    selected += config.reserve == ReserveMode::kQuantile ? impl_->share.Reserve(bound, d.max_selections) : bound;
  }
  RoundReservation out;
  for (std::uint32_t g = 0; g < cfg.num_groups; ++g) {
    const GroupPools& gp = st.at(rank, GroupId(g));
    const std::uint64_t used_now = gp.device.num_used() - gp.policy->NumEvictable();
    const std::uint64_t room = gp.device.capacity() - used_now;
    const std::uint64_t needed = new_tokens + selected + withheld_slots;
    const std::uint64_t free_slots = std::uint64_t{gp.device.num_free()} + gp.HostFree();
    if (needed > room || new_tokens + withheld_slots > free_slots) {
      return MakeError(ErrorCode::kResourceExhausted,
                       fmt::format("ReserveRound: rank {} group {}: the round needs up to {} device slots ({} new "
                                   "entries + {} selections + {} of the frames its other kinds take) but {} of {} "
                                   "are not yet used in this round, and {} new entries against {} free slots: "
                                   "schedule fewer requests this round",
                                   rank.value(), g, needed, new_tokens, selected, withheld_slots, room,
                                   gp.device.capacity(), new_tokens + withheld_slots, free_slots));
    }
    if (needed > out.device_needed) out = RoundReservation{needed, room};
  }
  return out;
}

Result<CompleteReport> StepPlanner::Complete(std::uint64_t fence, std::span<const std::uint8_t> status) {
  Impl& m = *impl_;
  if (!m.pending || fence != m.fence) {
    return MakeError(ErrorCode::kNotFound, m.pending ? fmt::format("fence {} is not the pending plan ({})", fence, m.fence)
                                                     : fmt::format("fence {}: no plan is pending", fence));
  }
  const std::size_t n = m.descriptors().size();
  if (status.size() != n) {
    return MakeError(ErrorCode::kInvalidArgument,
                     fmt::format("{} statuses for {} descriptors of plan {}", status.size(), n, fence));
  }
  CompleteReport report;
  report.published = static_cast<std::uint32_t>(m.Complete(status));
  report.failed = static_cast<std::uint32_t>(n) - report.published;
  return report;
}

Result<StepStats> StepPlanner::Step(Rank rank, GroupId group, const StepShape& shape,
                                          std::span<const RequestId> requests,
                                          std::span<const std::int32_t> selections, std::span<std::int32_t> indices) {
  Impl& m = *impl_;
  auto planned = Prepare(rank, group, shape, requests, selections, indices, /*out_descriptors=*/nullptr);
  if (!planned) return std::unexpected(planned.error());
  const std::uint32_t n = planned->num_descriptors;
  // The library runs the plan itself (Impl::Run, the host step's batches); Complete
  // publishes only what arrived.
  m.status.resize(n);
  const auto status = std::span(m.status);
  Status ran = n > 0 ? m.Run(status) : Ok();
  auto report = Complete(planned->fence, status);
  ULA_CHECK(report.has_value());
  if (!ran) return std::unexpected(std::move(ran).error());
  return planned->stats;
}

Status StepPlanner::RegisterEngineMemory(Tier tier, Rank rank, GroupId group, const EngineRegion& region) {
  if (region.base == 0) return MakeError(ErrorCode::kInvalidArgument, "EngineRegion.base: null");
  if (region.num_layers > 1 && region.layer_stride < std::uint64_t{region.slots} * region.layer_bytes) {
    return MakeError(ErrorCode::kInvalidArgument,
                     fmt::format("EngineRegion.layer_stride = {}: layers of {} slots x {} bytes overlap",
                                 region.layer_stride, region.slots, region.layer_bytes));
  }
  std::vector<std::uintptr_t> bases(region.num_layers);
  for (std::uint32_t l = 0; l < region.num_layers; ++l) bases[l] = region.base + l * region.layer_stride;
  return RegisterEngineMemory(tier, rank, group, bases, region.layer_bytes, region.slots);
}

Status StepPlanner::RegisterEngineMemory(Tier tier, Rank rank, GroupId group,
                                               std::span<const std::uintptr_t> layer_bases, std::uint32_t layer_bytes,
                                               std::uint32_t slots) {
  const AddressSpaceConfig& cfg = space_.config();
  if (rank.value() >= cfg.num_ranks || group.value() >= cfg.num_groups) {
    return MakeError(ErrorCode::kOutOfRange, fmt::format("rank {} / group {} is out of range", rank.value(), group.value()));
  }
  const std::size_t num_layers = layer_bases.size();
  // The layout must be the config's, layer for layer: the descriptors name one row of
  // cfg.row() bytes per layer at slot * row (step_arrays.h), so a region of other rows (the
  // same entry bytes split differently) would be copied at the wrong offsets.
  if (num_layers != cfg.layers_of(group) || layer_bytes != cfg.row()) {
    return MakeError(ErrorCode::kInvalidArgument,
                     fmt::format("engine memory of group {}: {} layers of {}-byte rows, but the config's group is {} "
                                 "layers of {}-byte rows (AddressSpaceConfig.row_bytes = {}, entry_bytes = {}): "
                                 "register one region per layer of row_bytes per slot, or make the config say so",
                                 group.value(), num_layers, layer_bytes, cfg.layers_of(group), cfg.row(),
                                 cfg.row_bytes, cfg.entry_bytes_of(group)));
  }
  const std::uint64_t capacity = tier == Tier::kDevice ? cfg.device_slots_per_group() : cfg.host_slots_per_group();
  if (slots < capacity) {
    return MakeError(ErrorCode::kInvalidArgument,
                     fmt::format("engine memory of group {}: {} slots per layer, but the {} pool has {} (a slot past "
                                 "the region would be copied out of bounds)", group.value(), slots, TierName(tier),
                                 capacity));
  }
  // The layers in address order: each must end before the next begins.
  std::vector<std::uintptr_t> sorted(layer_bases.begin(), layer_bases.end());
  std::sort(sorted.begin(), sorted.end());
  if (sorted[0] == 0) return MakeError(ErrorCode::kInvalidArgument, "engine memory: a layer's base is null");
  const std::uint64_t layer_size = std::uint64_t{slots} * layer_bytes;
  for (std::size_t l = 1; l < num_layers; ++l) {
    if (sorted[l] - sorted[l - 1] < layer_size) {
      return MakeError(ErrorCode::kInvalidArgument,
                       fmt::format("engine memory: layers at {:#x} and {:#x} overlap (each is {} slots x {} bytes)",
                                   sorted[l - 1], sorted[l], slots, layer_bytes));
    }
  }
  const std::size_t k = (static_cast<std::size_t>(tier) * cfg.num_ranks + rank.value()) * cfg.num_groups + group.value();
  impl_->regions[k] = Impl::Pool{std::vector<std::uintptr_t>(layer_bases.begin(), layer_bases.end()), layer_bytes,
                                       slots};
  // Allocate's victims now move in the registered memory (address_space.h).
  AddressSpace::State& st = StateOf(space_);
  if (!st.move_executor || st.move_executor_owner == this) {
    st.move_executor = [this](std::span<const CopyDescriptor> moves) -> Status {
      std::vector<std::uint8_t> status(moves.size(), 0);
      ExecuteOnEngineMemory(moves, status);
      const auto failed = std::count_if(status.begin(), status.end(), [](std::uint8_t v) { return v != 0; });
      if (failed > 0) {
        return MakeError(ErrorCode::kIo, fmt::format("{} of {} moves have no registered region", failed, moves.size()));
      }
      return Ok();
    };
    st.move_executor_owner = this;
  }
  return Ok();
}

void StepPlanner::ExecuteOnEngineMemory(std::span<const CopyDescriptor> descriptors,
                                              std::span<std::uint8_t> status) const {
  ULA_CHECK(status.size() == descriptors.size());
  const AddressSpaceConfig& cfg = space_.config();
  auto region_of = [&](std::uint8_t tier, std::uint16_t rank, std::uint16_t group) -> const Impl::Pool* {
    if (tier >= kNumTiers || rank >= cfg.num_ranks || group >= cfg.num_groups) return nullptr;
    const Impl::Pool& r = impl_->regions[(std::size_t{tier} * cfg.num_ranks + rank) * cfg.num_groups + group];
    return r.bases.empty() ? nullptr : &r;
  };
  for (std::size_t i = 0; i < descriptors.size(); ++i) {
    const CopyDescriptor& d = descriptors[i];
    const Impl::Pool* src = region_of(d.src_tier, d.src_rank, d.group);
    const Impl::Pool* dst = region_of(d.dst_tier, d.dst_rank, d.group);
    if (src == nullptr || dst == nullptr || src->layer_bytes != dst->layer_bytes ||
        src->bases.size() != dst->bases.size()) {
      status[i] = 1;
      continue;
    }
    const std::uint32_t lb = src->layer_bytes;
    for (std::size_t l = 0; l < src->bases.size(); ++l) {
      auto* a = reinterpret_cast<std::byte*>(src->bases[l] + std::uint64_t{d.src_slot} * lb);
      auto* b = reinterpret_cast<std::byte*>(dst->bases[l] + std::uint64_t{d.dst_slot} * lb);
      if (d.op == static_cast<std::uint8_t>(CopyOp::kSwap)) {
        std::swap_ranges(a, a + lb, b);
      } else if (d.op == static_cast<std::uint8_t>(CopyOp::kEvict)) {  // the victim's row out first
        std::memcpy(reinterpret_cast<std::byte*>(src->bases[l] + std::uint64_t{d.evict_slot} * lb), b, lb);
        std::memcpy(b, a, lb);
      } else {
        std::memcpy(b, a, lb);
      }
    }
    status[i] = 0;
  }
}

}  // namespace ula
