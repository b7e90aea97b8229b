// EngineStepPlanner. Plan does steps 1-4 and 6 of StepPlanner (validate, dedup, classify,
// claim device slots, write indices) and records the claims as one pending plan, the copy
// plan of MissFills (step/miss_fills.h, whose pending state it is: the wanted entries on
// host, the claimed slots, the victims' host slots); Complete publishes it per descriptor
// status (MissFills::Publish). The library path (Step) is Plan + MissFills::Run on the
// backend + Complete with each descriptor's status the outcome of its batch.
#include "ula/engine_step.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>

#include "space/space_access.h"
#include "step/engine_modes.h"
#include "space/space_kinds.h"
#include "step/miss_fills.h"
#include "space/address_space_state.h"
#include "ula/check.h"

namespace ula {

struct EngineStepPlanner::Scratch {
  std::vector<std::uint32_t> seen_epoch;  // [max addresses] dedup stamps
  std::vector<std::int32_t> slot_of;      // [max addresses] device slot for this step's misses
  std::uint32_t epoch = 0;
  std::vector<LogicalAddr> missed;        // [max selections]
  std::vector<SlotId> hit_slots;          // [max selections]
  std::vector<const RequestState*> row_req;  // [max batch] each row's request (null: not looked up)
  std::vector<SlotId> target_slots;       // [max descriptors]
  MissFills fills;                        // the copy plan (pending between Plan and Complete)
  std::vector<CopyDescriptor> library_descs;   // [max descriptors] Step's own plan
  std::vector<std::uint8_t> library_status;    // [max descriptors]
  // The pending plan.
  bool pending = false;
  std::uint64_t fence = 0;
  std::uint64_t next_fence = 1;
  Rank rank;
  GroupId group;
  std::uint32_t num_pending = 0;
  // One registered pool: layer l's rows at bases[l] + slot * layer_bytes.
  struct Pool {
    std::vector<std::uintptr_t> bases;  // [num_layers]; empty: nothing registered
    std::uint32_t layer_bytes = 0;
    std::uint32_t slots = 0;
  };
  std::vector<Pool> regions;  // [tier][rank][group]
  std::uint32_t max_descriptors = 0;

  // The phases of Plan. Classify: steps 1-3 (validate, dedup, classify into missed and
  // hit_slots; each row's request looked up at its first selection); changes nothing but
  // the dedup stamps. Returns the number of distinct entries.
  Result<std::uint64_t> Classify(const AddressSpace::State& st, const AddressRecords& table, Rank rank,
                                 const StepShape& shape, std::span<const RequestId> requests,
                                 std::span<const std::int32_t> selections);
  // Step 4: the misses' device slots into target_slots, free slots first, then victims
  // (marked used in this round); the hits touched; the fills decided (MissFills::Decide).
  // REQUIRES: the room check passed.
  void Claim(GroupPools& gp);
  // Step 6: indices in the kernels' layout: hits read their slot now, misses their target.
  void WriteIndices(const AddressRecords& table, std::span<const std::int32_t> selections,
                    std::span<std::int32_t> indices) const;
};

Result<std::uint64_t> EngineStepPlanner::Scratch::Classify(const AddressSpace::State& st, const AddressRecords& table,
                                                           Rank rank, const StepShape& shape,
                                                           std::span<const RequestId> requests,
                                                           std::span<const std::int32_t> selections) {
  std::fill(row_req.begin(), row_req.begin() + shape.batch, nullptr);
  const std::uint64_t row_len = std::uint64_t{shape.q_len} * shape.top_k;
  if (++epoch == 0) {
    std::fill(seen_epoch.begin(), seen_epoch.end(), 0);
    epoch = 1;
  }
  missed.clear();
  hit_slots.clear();
  std::uint64_t distinct = 0;
  for (std::size_t i = 0; i < selections.size(); ++i) {
    const std::int32_t v = selections[i];
    if (v == kPadIndex) continue;
    if (v < 0) {
      return MakeError(ErrorCode::kInvalidArgument, fmt::format("selection {}: {} is neither an address nor -1", i, v));
    }
    const LogicalAddr a(static_cast<std::uint32_t>(v));
    const Location loc = table.Get(a);
    if (loc.is_none()) {
      return MakeError(ErrorCode::kNotFound,
                       fmt::format("selection {}: logical address {} is not live (freed or never allocated)", i, v));
    }
    const std::size_t row = i / row_len;
    if (row_req[row] == nullptr) {
      auto req = st.dir.requests().find(requests[row]);
      if (req == st.dir.requests().end()) {
        return MakeError(ErrorCode::kNotFound, fmt::format("row {}: request {} is unknown or freed (a stale batch?): "
                                                           "refused", row, requests[row].value()));
      }
      row_req[row] = &req->second;
    }
    if (!st.dir.Holds(*row_req[row], a)) {
      return MakeError(ErrorCode::kNotFound,
                       fmt::format("selection {}: address {} is not live for request {} of row {} (freed and reused, "
                                   "or another request's): refused",
                                   i, v, requests[row].value(), row));
    }
    if (loc.rank() != rank) {
      return MakeError(ErrorCode::kInvalidArgument, fmt::format("selection {}: address {} lives on rank {}, not rank {}",
                                                                i, v, loc.rank().value(), rank.value()));
    }
    ULA_CHECK(a.value() < seen_epoch.size());
    if (seen_epoch[a.value()] == epoch) continue;
    seen_epoch[a.value()] = epoch;
    ++distinct;
    if (loc.tier() == Tier::kDevice) {
      hit_slots.push_back(loc.slot());
    } else {
      missed.push_back(a);
    }
  }
  return distinct;
}

void EngineStepPlanner::Scratch::Claim(GroupPools& gp) {
  gp.policy->Touch(hit_slots);
  const std::size_t n_miss = missed.size();
  const std::size_t n_free = std::min<std::size_t>(n_miss, gp.device.num_free());
  target_slots.resize(n_miss);
  for (std::size_t i = 0; i < n_free; ++i) target_slots[i] = *gp.device.Allocate();
  const std::size_t claimed = gp.policy->ClaimVictims(std::span(target_slots).subspan(n_free));
  ULA_CHECK(claimed == n_miss - n_free);
  fills.Decide(gp, target_slots, n_free);
}

void EngineStepPlanner::Scratch::WriteIndices(const AddressRecords& table, std::span<const std::int32_t> selections,
                                              std::span<std::int32_t> indices) const {
  for (std::size_t i = 0; i < selections.size(); ++i) {
    const std::int32_t v = selections[i];
    if (v == kPadIndex) {
      indices[i] = kPadIndex;
      continue;
    }
    const Location loc = table.Get(LogicalAddr(static_cast<std::uint32_t>(v)));
    indices[i] = loc.tier() == Tier::kDevice ? static_cast<std::int32_t>(loc.slot().value()) : slot_of[v];
  }
}

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
  return Ok();
}

EngineStepPlanner::EngineStepPlanner(AddressSpace& space, const EngineStepConfig& config,
                                     std::unique_ptr<Scratch> scratch)
    : space_(space), config_(config), scratch_(std::move(scratch)) {}
EngineStepPlanner::~EngineStepPlanner() {
  AddressSpace::State& st = StateOf(space_);
  if (scratch_->pending) st.dir.EndPlan();  // its claims stay (the space's check reports them)
  if (st.move_executor_owner == this) {
    st.move_executor = nullptr;
    st.move_executor_owner = nullptr;
  }
}

Result<std::unique_ptr<EngineStepPlanner>> EngineStepPlanner::Create(AddressSpace& space,
                                                                      const EngineStepConfig& config) {
  ULA_RETURN_IF_ERROR(config.Validate());
  const AddressSpaceConfig& cfg = space.config();
  ULA_RETURN_IF_ERROR(RefuseKinds(cfg, "EngineStepPlanner"));
  ULA_RETURN_IF_ERROR(RefuseUnstableNewEntries(cfg.stable_new_entries, "AddressSpaceConfig"));
  const std::uint64_t max_sel = config.rows() * config.max_top_k;
  // Addresses come in pages (address_space.h "Pages"): a page is minted only when none is
  // free, i.e. when every handed-out page holds a live address; live addresses fit in the
  // pools. So pages stay below the pools' capacity, addresses below page_tokens times that.
  // The scratch starts at the addresses handed out so far (at least the pools' capacity)
  // and Plan grows it, up to that bound, when the space minted pages since.
  const std::uint64_t max_addrs = std::max<std::uint64_t>(
      StateOf(space).dir.extent(),
      std::uint64_t{cfg.num_ranks} * (std::uint64_t{cfg.device_slots_per_group()} + cfg.host_slots_per_group()));
  auto s = std::make_unique<Scratch>();
  s->max_descriptors = static_cast<std::uint32_t>(std::min<std::uint64_t>(max_sel, cfg.device_slots_per_group()));
  s->seen_epoch.assign(max_addrs, 0);
  s->row_req.assign(config.max_batch, nullptr);
  s->slot_of.assign(max_addrs, kPadIndex);
  s->missed.reserve(max_sel);
  s->hit_slots.reserve(max_sel);
  s->target_slots.reserve(s->max_descriptors);
  s->fills.Reserve(s->max_descriptors);
  s->library_descs.resize(s->max_descriptors);
  s->library_status.assign(s->max_descriptors, 0);
  s->regions.resize(std::size_t{kNumTiers} * cfg.num_ranks * cfg.num_groups);
  return std::unique_ptr<EngineStepPlanner>(new EngineStepPlanner(space, config, std::move(s)));
}

std::uint32_t EngineStepPlanner::max_descriptors() const { return scratch_->max_descriptors; }
bool EngineStepPlanner::has_pending() const { return scratch_->pending; }

Result<PlannedStep> EngineStepPlanner::Plan(Rank rank, GroupId group, const StepShape& shape,
                                            std::span<const RequestId> requests,
                                            std::span<const std::int32_t> selections, std::span<std::int32_t> indices,
                                            std::span<CopyDescriptor> out_descriptors) {
  Scratch& s = *scratch_;
  AddressSpace::State& st = StateOf(space_);
  const AddressSpaceConfig& cfg = space_.config();
  if (s.pending) {
    return MakeError(ErrorCode::kFailedPrecondition,
                     fmt::format("plan {} is pending: Complete it before planning again", s.fence));
  }
  // One plan at a time over a space: a pending plan's swap victims stay claimed only while
  // no other plan can take them (AdvanceRound between Plan and Complete ends their round).
  ULA_RETURN_IF_ERROR(st.dir.RefuseWhilePlanPending("Plan (another EngineStepPlanner over this space)"));
  if (rank.value() >= cfg.num_ranks) {
    return MakeError(ErrorCode::kOutOfRange, fmt::format("rank {} is out of range ({} ranks)", rank.value(), cfg.num_ranks));
  }
  if (group.value() >= cfg.num_groups) {
    return MakeError(ErrorCode::kOutOfRange, fmt::format("group {} is out of range ({} groups)", group.value(), cfg.num_groups));
  }
  if (shape.batch > config_.max_batch || shape.q_len > config_.max_q_len || shape.top_k > config_.max_top_k) {
    return MakeError(ErrorCode::kInvalidArgument,
                     fmt::format("shape [{}][{}][{}] exceeds the planner's maximum [{}][{}][{}]", shape.batch,
                                 shape.q_len, shape.top_k, config_.max_batch, config_.max_q_len, config_.max_top_k));
  }
  if (std::uint64_t{shape.batch} * shape.q_len > config_.rows()) {
    return MakeError(ErrorCode::kInvalidArgument,
                     fmt::format("shape [{}][{}][{}]: {} rows, more than max_rows = {}", shape.batch, shape.q_len,
                                 shape.top_k, std::uint64_t{shape.batch} * shape.q_len, config_.rows()));
  }
  if (shape.top_k % config_.top_k_multiple != 0) {
    return MakeError(ErrorCode::kInvalidArgument,
                     fmt::format("top_k = {} is not a multiple of {} (FlashMLA's sparse kernels read index rows in "
                                 "tiles of 64: pad the rows with -1)", shape.top_k, config_.top_k_multiple));
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
  const AddressRecords& table = st.tables[group.value()];
  GroupPools& gp = st.at(rank, group);

  // 1-3. Validate, dedup, classify. Nothing is modified until every check has passed
  // (growing the scratch to new pages' addresses changes no state).
  if (st.dir.extent() > s.seen_epoch.size()) {
    const std::size_t n = std::max<std::size_t>(st.dir.extent(), 2 * s.seen_epoch.size());
    s.seen_epoch.resize(n, 0);
    s.slot_of.resize(n, kPadIndex);
  }
  auto distinct = s.Classify(st, table, rank, shape, requests, selections);
  if (!distinct) return std::unexpected(std::move(distinct).error());
  const std::size_t n_miss = s.missed.size();
  ULA_RETURN_IF_ERROR(gp.RefuseMovingNewOnHost(s.missed));
  // Room first, then the descriptor rows: both refuse this step's state (kResourceExhausted),
  // not a malformed call; each says how many descriptors the step needed.
  std::uint64_t newly_used = 0;
  for (SlotId slot : s.hit_slots) newly_used += !gp.policy->UsedInCurrentRound(slot);
  const std::uint64_t evictable = gp.policy->NumEvictable() - newly_used;
  if (n_miss > gp.device.num_free() + evictable) {
    return MakeError(ErrorCode::kResourceExhausted,
                     fmt::format("step needs {} distinct entries on device ({} missing: {} descriptors) but only {} "
                                 "free and {} evictable slots remain of {} in rank {} group {}",
                                 *distinct, n_miss, n_miss, gp.device.num_free(), evictable, gp.device.capacity(),
                                 rank.value(), group.value()));
  }
  if (out_descriptors.size() < n_miss) {
    return MakeError(ErrorCode::kResourceExhausted,
                     fmt::format("step needs {} descriptors ({} misses) but the descriptor array has {} rows (size it "
                                 "to max_descriptors() = {})",
                                 n_miss, n_miss, out_descriptors.size(), s.max_descriptors));
  }

  // 4. Claim device slots; the copy plan; 6. the indices.
  s.Claim(gp);
  PlannedStep out;
  out.stats.selections = selections.size();
  out.stats.distinct = *distinct;
  out.stats.hits = s.hit_slots.size();
  out.stats.misses = n_miss;
  s.fills.AddPlannedStats(cfg.entry_bytes_of(group), out.stats);
  s.fills.Describe(table, gp, cfg.row(), rank, group, s.missed, s.target_slots);
  std::ranges::copy(s.fills.descriptors(), out_descriptors.begin());
  for (std::size_t i = 0; i < n_miss; ++i) s.slot_of[s.missed[i].value()] = static_cast<std::int32_t>(s.target_slots[i].value());
  s.WriteIndices(table, selections, indices);
  s.pending = true;
  st.dir.BeginPlan();
  s.fence = s.next_fence++;
  s.rank = rank;
  s.group = group;
  s.num_pending = static_cast<std::uint32_t>(n_miss);
  out.fence = s.fence;
  out.num_descriptors = static_cast<std::uint32_t>(n_miss);
  return out;
}

Result<RoundReservation> EngineStepPlanner::ReserveRound(Rank rank, std::span<const RoundDemand> demands) const {
  const AddressSpace::State& st = StateOf(space_);
  const AddressSpaceConfig& cfg = space_.config();
  ULA_RETURN_IF_ERROR(st.dir.RefuseWhilePlanPending("ReserveRound"));
  if (rank.value() >= cfg.num_ranks) {
    return MakeError(ErrorCode::kOutOfRange, fmt::format("rank {} is out of range ({} ranks)", rank.value(), cfg.num_ranks));
  }
  const std::uint64_t row_max = std::uint64_t{config_.max_q_len} * config_.max_top_k;
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
    new_tokens += d.new_tokens;
    selected += std::min<std::uint64_t>(d.max_selections, it->second.addrs.size() + d.new_tokens);
  }
  std::sort(seen.begin(), seen.end());
  if (auto dup = std::adjacent_find(seen.begin(), seen.end()); dup != seen.end()) {
    return MakeError(ErrorCode::kInvalidArgument, fmt::format("ReserveRound: request {} is listed twice", dup->value()));
  }
  RoundReservation out;
  for (std::uint32_t g = 0; g < cfg.num_groups; ++g) {
    const GroupPools& gp = st.at(rank, GroupId(g));
    const std::uint64_t used_now = gp.device.num_used() - gp.policy->NumEvictable();
    const std::uint64_t room = gp.device.capacity() - used_now;
    const std::uint64_t needed = new_tokens + selected;
    if (needed > room || new_tokens > std::uint64_t{gp.device.num_free()} + gp.HostFree()) {
      return MakeError(ErrorCode::kResourceExhausted,
                       fmt::format("ReserveRound: rank {} group {}: the round needs up to {} device slots ({} new "
                                   "tokens + {} selections) but {} of {} are not yet used in this round, and {} "
                                   "new tokens against {} free slots: schedule fewer requests this round",
                                   rank.value(), g, needed, new_tokens, selected, room, gp.device.capacity(),
                                   new_tokens, std::uint64_t{gp.device.num_free()} + gp.HostFree()));
    }
    if (needed > out.device_needed) out = RoundReservation{needed, room};
  }
  return out;
}

Result<CompleteReport> EngineStepPlanner::Complete(std::uint64_t fence, std::span<const std::uint8_t> status) {
  Scratch& s = *scratch_;
  if (!s.pending || fence != s.fence) {
    return MakeError(ErrorCode::kNotFound, s.pending ? fmt::format("fence {} is not the pending plan ({})", fence, s.fence)
                                                     : fmt::format("fence {}: no plan is pending", fence));
  }
  if (status.size() != s.num_pending) {
    return MakeError(ErrorCode::kInvalidArgument,
                     fmt::format("{} statuses for {} descriptors of plan {}", status.size(), s.num_pending, fence));
  }
  AddressSpace::State& st = StateOf(space_);
  AddressRecords& table = st.tables[s.group.value()];
  GroupPools& gp = st.at(s.rank, s.group);
  CompleteReport report;
  report.published = static_cast<std::uint32_t>(s.fills.Publish(table, gp, s.rank, status));
  report.failed = s.num_pending - report.published;
  s.pending = false;
  st.dir.EndPlan();
  s.num_pending = 0;
  ULA_EXPENSIVE_CHECK(space_);
  return report;
}

Result<StepStats> EngineStepPlanner::Step(Rank rank, GroupId group, const StepShape& shape,
                                          std::span<const RequestId> requests,
                                          std::span<const std::int32_t> selections, std::span<std::int32_t> indices) {
  Scratch& s = *scratch_;
  auto planned = Plan(rank, group, shape, requests, selections, indices, s.library_descs);
  if (!planned) return std::unexpected(planned.error());
  const std::uint32_t n = planned->num_descriptors;
  if (n == 0) {
    auto report = Complete(planned->fence, {});
    ULA_CHECK(report.has_value() && report->failed == 0);
    return planned->stats;
  }
  // The library runs the plan itself (MissFills::Run, the host step's batches); Complete
  // publishes only what arrived.
  const GroupPools& gp = StateOf(space_).at(rank, group);
  const auto status = std::span(s.library_status).first(n);
  Status ran = s.fills.Run(space_.backend(), gp, space_.config().row(), rank, group, status);
  auto report = Complete(planned->fence, status);
  ULA_CHECK(report.has_value());
  if (!ran) return std::unexpected(std::move(ran).error());
  return planned->stats;
}

Status EngineStepPlanner::RegisterEngineMemory(Tier tier, Rank rank, GroupId group, const EngineRegion& region) {
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

Status EngineStepPlanner::RegisterEngineMemory(Tier tier, Rank rank, GroupId group,
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
  scratch_->regions[k] = Scratch::Pool{std::vector<std::uintptr_t>(layer_bases.begin(), layer_bases.end()), layer_bytes,
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

void EngineStepPlanner::ExecuteOnEngineMemory(std::span<const CopyDescriptor> descriptors,
                                              std::span<std::uint8_t> status) const {
  ULA_CHECK(status.size() == descriptors.size());
  const AddressSpaceConfig& cfg = space_.config();
  auto region_of = [&](std::uint8_t tier, std::uint16_t rank, std::uint16_t group) -> const Scratch::Pool* {
    if (tier >= kNumTiers || rank >= cfg.num_ranks || group >= cfg.num_groups) return nullptr;
    const Scratch::Pool& r = scratch_->regions[(std::size_t{tier} * cfg.num_ranks + rank) * cfg.num_groups + group];
    return r.bases.empty() ? nullptr : &r;
  };
  for (std::size_t i = 0; i < descriptors.size(); ++i) {
    const CopyDescriptor& d = descriptors[i];
    const Scratch::Pool* src = region_of(d.src_tier, d.src_rank, d.group);
    const Scratch::Pool* dst = region_of(d.dst_tier, d.dst_rank, d.group);
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
