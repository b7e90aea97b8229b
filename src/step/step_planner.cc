// StepPlanner (ula/step_planner.h): the DP host step's classify, claim, copy plan and
// completion (step/step_planner_impl.h), and the library path over them: classify, claim and
// describe the plan, run its descriptors on the space's backend, complete by their outcomes,
// then read the misses' slots.
#include "ula/step_planner.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#include "policy/fork_join.h"
#include "policy/pb_lru.h"
#include "space/address_space_state.h"
#include "space/space_access.h"
#include "step/miss_fills.h"
#include "step/step_planner_impl.h"
#include "step/engine_modes.h"
#include "ula/check.h"

namespace ula {

Status StepPlannerOptions::Validate() const {
  if (threads < 1 || threads > kMaxThreads) {
    return MakeError(ErrorCode::kInvalidArgument,
                     fmt::format("StepPlannerOptions.threads = {}: must be in [1, {}]", threads, kMaxThreads));
  }
  if (prefetch_distance > kMaxPrefetchDistance) {
    return MakeError(ErrorCode::kInvalidArgument,
                     fmt::format("StepPlannerOptions.prefetch_distance = {}: must be in [0, {}]", prefetch_distance,
                                 kMaxPrefetchDistance));
  }
  if (parallel_claim_min_victims < 1) {
    return MakeError(ErrorCode::kInvalidArgument, "StepPlannerOptions.parallel_claim_min_victims = 0: must be >= 1");
  }
  return Ok();
}

namespace {
using step_lanes::Indexed;
using step_lanes::kNoError;
using step_lanes::Lane;
// Thread t of T owns the addresses of every T-th block of 2^kLaneShift addresses.
constexpr unsigned kLaneShift = 12;
constexpr std::uint32_t kPadAddr = static_cast<std::uint32_t>(kPadIndex);
}  // namespace

StepPlanner::Impl::Impl(AddressSpace& s) : space(s) {}
StepPlanner::Impl::~Impl() {
  if (pending) StateOf(space).dir.EndPlan();
}

Status StepPlanner::Impl::SetOptions(const StepPlannerOptions& o) {
  ULA_RETURN_IF_ERROR(o.Validate());
  if (o.threads != options.threads) {
    lanes = std::vector<Lane>(o.threads);
    for (Lane& L : lanes) {
      L.hits.reserve(reserved);
      L.misses.reserve(reserved);
      L.patch.reserve(reserved);
    }
    fork_join = std::make_unique<policy::ForkJoin>(static_cast<int>(o.threads));
  }
  options = o;
  return Ok();
}

void StepPlanner::Impl::Reserve(std::size_t max_selections, std::size_t max_misses, std::size_t max_addresses) {
  reserved = std::max(reserved, max_selections);
  for (Lane& L : lanes) {
    L.hits.reserve(max_selections);
    L.misses.reserve(max_selections);
    L.patch.reserve(max_selections);
  }
  missed.reserve(max_selections);
  hit_slots.reserve(max_selections);
  staged.reserve(max_selections);
  target_slots.reserve(max_misses);
  fills.Reserve(max_misses);
  slot_of.resize(std::max(slot_of.size(), max_addresses), kPadIndex);
}

namespace {
// The isolation check, in one place: does `holder` hold address `a` — its own allocation
// (the owner tag, one load) or an address it adopted (ShareInto: a binary search of its
// sorted adopted list, only when the tag differs)? REQUIRES: a < the owner map's size.
inline bool OwnedBy(const std::uint32_t* owner, std::uint32_t a, const RequestState& holder) {
  return refs::Holds(owner[a], holder.tag, holder.adopted, LogicalAddr(a));
}

// The error path of the isolation check: names both requests (a scan of the requests).
std::string StaleSelectionMessage(const AddressSpace::State& st, std::size_t i, LogicalAddr a, std::uint32_t tag) {
  std::uint64_t holder = 0, wanted = 0;
  for (const auto& [id, req] : st.dir.requests()) {
    if (req.tag == st.dir.owner()[a.value()]) holder = id.value();
    if (req.tag == tag) wanted = id.value();
  }
  if (st.dir.owner()[a.value()] == kSharedTag) {
    return fmt::format("selection {}: logical address {} is a shared address that request {} does not hold (it "
                       "never adopted it, or released it): refused", i, a.value(), wanted);
  }
  return fmt::format("selection {}: logical address {} belongs to request {}, not to request {} (a stale address, "
                     "freed and reused?): refused", i, a.value(), holder, wanted);
}
}  // namespace

// address_space_state.h: the error of selection i (which failed a check of steps 1-3).
Error SelectionError(const AddressSpace::State& st, const AddressRecords& table, std::size_t i, LogicalAddr a,
                     const RequestState& holder, Rank rank) {
  const Location loc = table.Get(a);
  if (loc.is_none()) {
    return Error(ErrorCode::kNotFound, fmt::format("selection {}: logical address {} is not live (freed, or never "
                                                   "allocated)", i, a.value()));
  }
  if (!OwnedBy(st.dir.owner().data(), a.value(), holder)) {
    return Error(ErrorCode::kNotFound, StaleSelectionMessage(st, i, a, holder.tag));
  }
  return Error(ErrorCode::kInvalidArgument, fmt::format("selection {}: address {} lives on rank {}, not rank {}", i,
                                                        a.value(), loc.rank().value(), rank.value()));
}

namespace {

inline void Emit(SlotId* out, std::size_t i, SlotId s) { out[i] = s; }
inline void Emit(std::int32_t* out, std::size_t i, SlotId s) { out[i] = static_cast<std::int32_t>(s.value()); }

// Steps 1-3 for the addresses lane `lane` of `lanes` owns: validate, dedup by the records'
// stamps, classify; hits' slots (and padding) go straight to out. Stops at its first failing
// selection (first_error): past the table, not live, not its run's request's (or a request
// that is unknown), another rank's.
template <bool kPadding, class Out>
void ScanLane(Lane& L, std::uint32_t lane, std::uint32_t lanes, std::span<const std::uint32_t> sel,
              std::span<const SelectionRun> runs, std::span<const RequestState* const> run_holders,
              AddressRecords& table, const std::uint32_t* owner, std::uint32_t epoch, Rank rank,
              std::uint32_t distance, Out* out) {
  L.hits.clear();
  L.misses.clear();
  L.patch.clear();
  L.first_error = kNoError;
  std::uint64_t* const rec = table.data();
  const std::uint32_t size = table.size();  // == the owner map's size (both cover [0, next_addr))
  const std::uint32_t* const p = sel.data();
  const std::size_t end = sel.size();
  auto mine = [&](std::uint32_t a) { return lanes == 1 || ((a >> kLaneShift) % lanes) == lane; };
  std::size_t next_run = 0, run_end = 0;
  const RequestState* holder = nullptr;
  for (std::size_t i = 0; i < end; ++i) {
    while (i == run_end) {  // runs of count 0 are skipped; the runs cover every selection
      holder = run_holders[next_run];
      run_end += runs[next_run++].count;
    }
    if (distance != 0 && i + distance < end) {
      const std::uint32_t ahead = p[i + distance];
      if (ahead < size && mine(ahead)) {
        __builtin_prefetch(rec + ahead, 1, 3);
        __builtin_prefetch(owner + ahead, 0, 3);
      }
    }
    const std::uint32_t a = p[i];
    if (!mine(a)) continue;
    if constexpr (kPadding) {
      if (a == kPadAddr) {
        out[i] = kPadIndex;
        continue;
      }
    }
    if (a >= size || holder == nullptr) {
      L.first_error = i;
      return;
    }
    const std::uint64_t r = rec[a];
    const Location loc = AddressRecords::LocationOf(r);
    if (loc.is_none() || !OwnedBy(owner, a, *holder) || loc.rank() != rank) {
      L.first_error = i;
      return;
    }
    const bool on_device = loc.tier() == Tier::kDevice;
    const auto idx = static_cast<std::uint32_t>(i);
    if (on_device) Emit(out, i, loc.slot());  // a hit's slot does not change in this step
    else L.patch.push_back(idx);
    if (AddressRecords::StampOf(r) == epoch) continue;  // a duplicate
    rec[a] = AddressRecords::WithStamp(r, epoch);
    if (on_device) {
      L.hits.push_back({idx, loc.slot().value()});
    } else {
      L.misses.push_back({idx, a});
    }
  }
}

// Appends the values of the lanes' lists, merged by selection index (each list ascends).
template <class Get, class Emit>
void MergeLanes(std::span<Lane> lanes, Get get, Emit emit) {
  if (lanes.size() == 1) {
    for (const Indexed& x : get(lanes[0])) emit(x.value);
    return;
  }
  std::size_t pos[StepPlannerOptions::kMaxThreads] = {};
  for (;;) {
    std::size_t best = lanes.size();
    std::uint32_t best_index = 0;
    for (std::size_t t = 0; t < lanes.size(); ++t) {
      const auto& v = get(lanes[t]);
      if (pos[t] < v.size() && (best == lanes.size() || v[pos[t]].index < best_index)) {
        best = t;
        best_index = v[pos[t]].index;
      }
    }
    if (best == lanes.size()) return;
    emit(get(lanes[best])[pos[best]++].value);
  }
}

// Step 4: the misses' device slots into targets[0, n_miss): free slots first, then victims
// (on the step's threads when there are enough of them, PbLru::ClaimVictimsParallel).
// Returns the number of free slots. REQUIRES: the room check passed.
std::size_t ClaimDeviceSlots(GroupPools& gp, std::vector<SlotId>& targets, std::size_t n_miss,
                             const StepPlannerOptions& options, policy::ForkJoin& fork_join,
                             StepPlannerCounters& counters) {
  const std::size_t n_free = std::min<std::size_t>(n_miss, gp.device.num_free());
  targets.resize(n_miss);
  for (std::size_t i = 0; i < n_free; ++i) targets[i] = *gp.device.Allocate();
  const std::size_t n_evict = n_miss - n_free;
  if (n_evict == 0) return n_free;
  const auto victims = std::span(targets).subspan(n_free);
  const auto t0 = std::chrono::steady_clock::now();
  auto* pb = options.threads > 1 && n_evict >= options.parallel_claim_min_victims
                 ? dynamic_cast<policy::PbLru*>(gp.policy.get())
                 : nullptr;
  if (pb != nullptr && pb->prefers_shadowed()) pb = nullptr;  // the parallel claim has no preference
  if (pb != nullptr) {
    ULA_CHECK(pb->ClaimVictimsParallel(victims, fork_join).has_value());  // the room check passed
    ++counters.parallel_claims;
  } else {
    ULA_CHECK(gp.policy->ClaimVictims(victims) == n_evict);
  }
  counters.claim_ns += static_cast<std::uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count());
  ++counters.claims;
  counters.victims += n_evict;
  return n_free;
}

}  // namespace

template <class Out>
Result<StepStats> StepPlanner::Impl::Classify(Rank rank, GroupId group, const StepSelections& sel, Out* out) {
  Impl& m = *this;
  ULA_CHECK(!m.pending);
  AddressSpace::State& st = StateOf(m.space);
  AddressRecords& table = st.tables[group.value()];
  GroupPools& gp = st.at(rank, group);
  ULA_CHECK(table.size() == st.dir.owner().size());

  // Each run's request (null: unknown, or a run of count 0: its first selection fails).
  m.run_holders.assign(sel.runs.size(), nullptr);
  for (std::size_t r = 0; r < sel.runs.size(); ++r) {
    if (sel.runs[r].count == 0) continue;
    auto req = st.dir.requests().find(sel.runs[r].request);
    if (req != st.dir.requests().end()) m.run_holders[r] = &req->second;
  }
  const std::uint32_t epoch = table.NextEpoch();
  const auto T = static_cast<std::uint32_t>(m.lanes.size());
  const std::uint32_t distance = m.options.prefetch_distance;
  // Padding is the engine layout's, whose output is the int32 indices.
  ULA_CHECK((!sel.padding || std::is_same_v<Out, std::int32_t>));
  // The engine's indices are written only by a plan that passed (a refused one leaves them
  // as they were): its scan writes to staged, which WriteTargets copies out.
  Out* scan_out = out;
  if constexpr (std::is_same_v<Out, std::int32_t>) {
    m.staged.resize(sel.addrs.size());
    scan_out = m.staged.data();
  }
  m.ForLanes([&](std::size_t lane) {
    auto scan = sel.padding ? &ScanLane<std::is_same_v<Out, std::int32_t>, Out> : &ScanLane<false, Out>;
    scan(m.lanes[lane], static_cast<std::uint32_t>(lane), T, sel.addrs, sel.runs, m.run_holders, table,
         st.dir.owner().data(), epoch, rank, distance, scan_out);
  });
  std::size_t first_error = kNoError;
  for (const auto& L : m.lanes) first_error = std::min(first_error, L.first_error);
  if (first_error != kNoError) {
    std::size_t r = 0, run_end = sel.runs[0].count;
    while (first_error >= run_end) run_end += sel.runs[++r].count;
    const std::uint32_t a = sel.addrs[first_error];
    if (sel.padding && a > static_cast<std::uint32_t>(std::numeric_limits<std::int32_t>::max())) {
      return MakeError(ErrorCode::kInvalidArgument, fmt::format("selection {}: {} is neither an address nor -1",
                                                                first_error, static_cast<std::int32_t>(a)));
    }
    if (m.run_holders[r] == nullptr) {
      return MakeError(ErrorCode::kNotFound,
                       fmt::format("selection {}: request {} of its run is unknown or freed (a stale selection?): "
                                   "refused", first_error, sel.runs[r].request.value()));
    }
    return std::unexpected(SelectionError(st, table, first_error, LogicalAddr(a), *m.run_holders[r], rank));
  }
  m.missed.clear();
  m.hit_slots.clear();
  MergeLanes(m.lanes, [](const Lane& L) -> const std::vector<Indexed>& { return L.hits; },
             [&](std::uint32_t slot) { m.hit_slots.push_back(SlotId(slot)); });
  MergeLanes(m.lanes, [](const Lane& L) -> const std::vector<Indexed>& { return L.misses; },
             [&](std::uint32_t a) { m.missed.push_back(LogicalAddr(a)); });
  ULA_RETURN_IF_ERROR(gp.RefuseMissesWithoutRoom(m.missed, m.hit_slots));
  m.addrs = sel.addrs;
  m.rank = rank;
  m.group = group;
  StepStats stats;
  stats.selections = sel.addrs.size();
  stats.hits = m.hit_slots.size();
  stats.misses = m.missed.size();
  stats.distinct = stats.hits + stats.misses;
  return stats;
}

template Result<StepStats> StepPlanner::Impl::Classify<SlotId>(Rank, GroupId, const StepSelections&, SlotId*);
template Result<StepStats> StepPlanner::Impl::Classify<std::int32_t>(Rank, GroupId, const StepSelections&,
                                                                   std::int32_t*);

void StepPlanner::Impl::Claim(StepStats& stats, const DescriptorSink* out) {
  Impl& m = *this;
  AddressSpace::State& st = StateOf(m.space);
  const AddressSpaceConfig& cfg = m.space.config();
  GroupPools& gp = st.at(m.rank, m.group);
  gp.policy->Touch(m.hit_slots);
  const std::size_t n_miss = m.missed.size();
  const std::size_t n_free = ClaimDeviceSlots(gp, m.target_slots, n_miss, m.options, *m.fork_join, m.counters);
  m.fills.Decide(gp, m.target_slots, n_free);
  m.fills.AddPlannedStats(cfg.entry_bytes_of(m.group), stats);
  m.fills.Describe(st.tables[m.group.value()], gp, cfg.row(), m.rank, m.group, m.missed, m.target_slots, out);
  m.pending = true;
  st.dir.BeginPlan();
  ++m.fence;
}

void StepPlanner::Impl::WriteTargets(std::int32_t* out) {
  Impl& m = *this;
  ULA_CHECK(m.pending);
  std::copy(m.staged.begin(), m.staged.end(), out);  // the hits' slots and the padding
  if (m.missed.empty()) return;
  const std::size_t extent = StateOf(m.space).dir.extent();
  if (m.slot_of.size() < extent) m.slot_of.resize(std::max(extent, 2 * m.slot_of.size()), kPadIndex);
  for (std::size_t i = 0; i < m.missed.size(); ++i) {
    m.slot_of[m.missed[i].value()] = static_cast<std::int32_t>(m.target_slots[i].value());
  }
  for (const Lane& L : m.lanes) {
    for (std::uint32_t i : L.patch) out[i] = m.slot_of[m.addrs[i]];
  }
}

Status StepPlanner::Impl::Run(std::span<std::uint8_t> out) {
  Impl& m = *this;
  ULA_CHECK(m.pending);
  const GroupPools& gp = StateOf(m.space).at(m.rank, m.group);
  return m.fills.Run(m.space.backend(), gp, m.space.config().row(), m.rank, m.group, out);
}

std::size_t StepPlanner::Impl::Complete(std::span<const std::uint8_t> outcome) {
  Impl& m = *this;
  ULA_CHECK(m.pending);
  AddressSpace::State& st = StateOf(m.space);
  const std::size_t published =
      m.fills.Publish(st.tables[m.group.value()], st.at(m.rank, m.group), m.rank, outcome);
  m.pending = false;
  st.dir.EndPlan();
  ULA_EXPENSIVE_CHECK(m.space);
  return published;
}

void StepPlanner::Impl::WritePublished(SlotId* out) {
  Impl& m = *this;
  const AddressRecords& table = StateOf(m.space).tables[m.group.value()];
  m.ForLanes([&](std::size_t lane) {
    for (std::uint32_t i : m.lanes[lane].patch) out[i] = table.Get(LogicalAddr(m.addrs[i])).slot();
  });
}

StepPlanner::StepPlanner(AddressSpace& space) : StepPlanner(space, std::make_unique<Impl>(space)) {}
StepPlanner::StepPlanner(AddressSpace& space, std::unique_ptr<Impl> impl) : space_(space), impl_(std::move(impl)) {
  impl_->regions.resize(std::size_t{kNumTiers} * space.config().num_ranks * space.config().num_groups);
}
StepPlanner::~StepPlanner() {
  AddressSpace::State& st = StateOf(space_);  // a pending plan ends with its Impl
  if (st.move_executor_owner == this) {
    st.move_executor = nullptr;
    st.move_executor_owner = nullptr;
  }
}

Status StepPlanner::SetOptions(const StepPlannerOptions& options) {
  if (impl_->pending) {
    return MakeError(ErrorCode::kFailedPrecondition,
                     fmt::format("SetOptions: plan {} is pending: Complete it first", impl_->fence));
  }
  return impl_->SetOptions(options);
}
const StepPlannerOptions& StepPlanner::options() const { return impl_->options; }
const StepPlannerCounters& StepPlanner::counters() const { return impl_->counters; }
bool StepPlanner::has_pending() const { return impl_->pending; }

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
  // The library path has no Create: a space whose entries the device places is refused here.
  ULA_RETURN_IF_ERROR(RefuseDevicePlacement(space_.config().device_placement, "StepPlanner::Step"));
  ULA_RETURN_IF_ERROR(CheckStepInput(space_.config(), input, out_slots.size()));
  ULA_RETURN_IF_ERROR(CheckSelectionRuns(input.runs, input.selections.size()));
  // One plan at a time over a space: an engine plan's claims must not be taken by this step.
  ULA_RETURN_IF_ERROR(StateOf(space_).dir.RefuseWhilePlanPending("StepPlanner::Step"));
  static_assert(sizeof(LogicalAddr) == sizeof(std::uint32_t));
  const StepSelections sel{
      std::span(reinterpret_cast<const std::uint32_t*>(input.selections.data()), input.selections.size()), input.runs};
  Impl& m = *impl_;
  auto stats = m.Classify(input.rank, input.group, sel, out_slots.data());
  if (!stats) return stats;
  m.Claim(*stats);
  m.status.resize(m.descriptors().size());
  Status ran = m.status.empty() ? Ok() : m.Run(m.status);
  m.Complete(m.status);
  if (!ran) return std::unexpected(std::move(ran).error());
  m.WritePublished(out_slots.data());
  return stats;
}

}  // namespace ula
