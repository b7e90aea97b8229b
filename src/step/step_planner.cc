#include "ula/step_planner.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <limits>
#include <string>

#include "policy/fork_join.h"
#include "policy/pb_lru.h"
#include "space/space_access.h"
#include "space/space_kinds.h"
#include "space/address_space_state.h"
#include "step/miss_fills.h"
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
// Thread t of T owns the addresses of every T-th block of 2^kLaneShift addresses.
constexpr unsigned kLaneShift = 12;
constexpr std::size_t kNoError = ~std::size_t{0};

// A selection's entry, tagged with its index in the input (the merge key).
struct Indexed {
  std::uint32_t index;
  std::uint32_t value;  // a slot (hits) or an address (misses)
};
}  // namespace

namespace {
// One thread's part of steps 1-3.
struct alignas(64) Lane {
  std::vector<Indexed> hits, misses;
  std::vector<std::uint32_t> patch;  // selections of misses: their slots are known after the publish
  std::size_t first_error = kNoError;
};
}  // namespace

struct StepPlanner::Lanes {
  explicit Lanes(std::uint32_t threads) : lanes(threads), fork_join(static_cast<int>(threads)) {}
  std::vector<Lane> lanes;
  policy::ForkJoin fork_join;
  std::vector<const RequestState*> run_holders;  // [runs] each run's request (null: a run of count 0)
  // Step 5: the misses' copy plan (step/miss_fills.h, shared with the engine path) and its
  // descriptors' statuses.
  MissFills fills;
  std::vector<std::uint8_t> status;
};

StepPlanner::StepPlanner(AddressSpace& space) : space_(space), lanes_(std::make_unique<Lanes>(1)) {}
StepPlanner::~StepPlanner() = default;

Status StepPlanner::SetOptions(const StepPlannerOptions& options) {
  ULA_RETURN_IF_ERROR(options.Validate());
  if (options.threads != options_.threads) lanes_ = std::make_unique<Lanes>(options.threads);
  options_ = options;
  return Ok();
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

// Steps 1-3 for the addresses lane `lane` of `lanes` owns, over selections [0, end):
// validate, dedup by the records' stamps, classify; hits' slots go straight to out.
// Stops at its first failing selection (first_error).
void ScanLane(Lane& L, std::uint32_t lane, std::uint32_t lanes, std::span<const LogicalAddr> sel,
              std::span<const SelectionRun> runs, std::span<const RequestState* const> run_holders, std::size_t end,
              AddressRecords& table, const std::uint32_t* owner, std::uint32_t epoch, Rank rank,
              std::uint32_t distance, SlotId* out) {
  L.hits.clear();
  L.misses.clear();
  L.patch.clear();
  L.first_error = kNoError;
  std::uint64_t* const rec = table.data();
  const std::uint32_t size = table.size();  // == the owner map's size (both cover [0, next_addr))
  const LogicalAddr* const p = sel.data();
  auto mine = [&](std::uint32_t a) { return lanes == 1 || ((a >> kLaneShift) % lanes) == lane; };
  std::size_t next_run = 0, run_end = 0;
  const RequestState* holder = nullptr;
  for (std::size_t i = 0; i < end; ++i) {
    while (i == run_end) {  // runs of count 0 are skipped; the runs cover every selection
      holder = run_holders[next_run];
      run_end += runs[next_run++].count;
    }
    if (distance != 0 && i + distance < end) {
      const std::uint32_t ahead = p[i + distance].value();
      if (ahead < size && mine(ahead)) {
        __builtin_prefetch(rec + ahead, 1, 3);
        __builtin_prefetch(owner + ahead, 0, 3);
      }
    }
    const std::uint32_t a = p[i].value();
    if (!mine(a)) continue;
    if (a >= size) {
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
    if (on_device) out[i] = loc.slot();  // a hit's slot does not change in this step
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
  std::vector<std::size_t> pos(lanes.size(), 0);
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
}  // namespace

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

// Each run's request into holders (null: a run of count 0). Returns the first selection of
// the first run whose request is unknown (its index in bad_run), or the selections' size.
std::size_t ResolveRunHolders(const AddressSpace::State& st, std::span<const SelectionRun> runs, std::size_t n,
                              std::vector<const RequestState*>& holders, std::size_t& bad_run) {
  holders.assign(runs.size(), nullptr);
  std::size_t first = 0;
  for (std::size_t r = 0; r < runs.size(); ++r) {
    if (runs[r].count != 0) {
      auto req = st.dir.requests().find(runs[r].request);
      if (req == st.dir.requests().end()) {
        bad_run = r;
        return first;
      }
      holders[r] = &req->second;
    }
    first += runs[r].count;
  }
  return n;
}

// The room check: kResourceExhausted unless the misses fit in the free slots plus the slots
// the policy may evict this round (the hits not yet used in this round stop being evictable).
Status CheckRoom(const GroupPools& gp, std::span<const SlotId> hits, std::size_t n_miss, const StepInput& input) {
  // When the misses fit even if every hit were new to the round (almost always), the exact
  // count — one policy lookup per hit, a second random line per selection — is skipped:
  // same decision.
  std::uint64_t evictable = gp.policy->NumEvictable();
  const bool fits_anyway =
      evictable >= hits.size() && n_miss <= gp.device.num_free() + (evictable - hits.size());
  if (fits_anyway) return Ok();
  std::uint64_t newly_used = 0;
  for (SlotId s : hits) newly_used += !gp.policy->UsedInCurrentRound(s);
  evictable -= newly_used;
  if (n_miss <= gp.device.num_free() + evictable) return Ok();
  return MakeError(ErrorCode::kResourceExhausted,
                   fmt::format("step needs {} distinct entries on device ({} missing) but only {} free and {} "
                               "evictable slots remain of {} in rank {} group {}: {} entries are used in this "
                               "round (allocated or selected since the last AdvanceRound(), this step's hits "
                               "included) and cannot be evicted: call AdvanceRound() after the round's "
                               "attention, or select fewer entries per round",
                               hits.size() + n_miss, n_miss, gp.device.num_free(), evictable, gp.device.capacity(),
                               input.rank.value(), input.group.value(), gp.device.num_used() - evictable));
}

// Step 4: the misses' device slots into targets[0, n_miss): free slots first, then victims
// (on the planner's threads when there are enough of them, PbLru::ClaimVictimsParallel).
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

// validate -> scan lanes (dedup, classify) -> merge -> room check -> claim -> copy and
// publish -> patch the misses' slots. Nothing changes before the room check has passed.
Result<StepStats> StepPlanner::Step(const StepInput& input, std::span<SlotId> out_slots) {
  AddressSpace::State& st = StateOf(space_);
  const AddressSpaceConfig& cfg = space_.config();
  ULA_RETURN_IF_ERROR(RefuseKinds(cfg, "StepPlanner"));
  ULA_RETURN_IF_ERROR(CheckStepInput(cfg, input, out_slots.size()));
  AddressRecords& table = st.tables[input.group.value()];
  GroupPools& gp = st.at(input.rank, input.group);
  ULA_CHECK(table.size() == st.dir.owner().size());

  // 1-3. Validate, dedup, classify. Nothing is modified until every check has passed (the
  // records' dedup stamps are scratch, out_slots is not state).
  ULA_RETURN_IF_ERROR(CheckSelectionRuns(input.runs, input.selections.size()));
  Lanes& lanes = *lanes_;
  // A run of an unknown request fails at its first selection, unless an earlier one fails first.
  std::size_t bad_run = 0;
  const std::size_t end = ResolveRunHolders(st, input.runs, input.selections.size(), lanes.run_holders, bad_run);
  const std::uint32_t epoch = table.NextEpoch();
  const std::uint32_t T = options_.threads;
  const std::uint32_t distance = options_.prefetch_distance;
  auto scan = [&](std::size_t lane) {
    ScanLane(lanes.lanes[lane], static_cast<std::uint32_t>(lane), T, input.selections, input.runs, lanes.run_holders, end,
             table, st.dir.owner().data(), epoch, input.rank, distance, out_slots.data());
  };
  if (T == 1) {
    scan(0);
  } else {
    auto body = [&](std::size_t, std::size_t begin, std::size_t stop) {
      for (std::size_t lane = begin; lane < stop; ++lane) scan(lane);
    };
    lanes.fork_join.Run(T, body);
  }
  std::size_t first_error = kNoError;
  for (const auto& L : lanes.lanes) first_error = std::min(first_error, L.first_error);
  if (first_error != kNoError) {
    std::size_t r = 0, run_end = input.runs[0].count;
    while (first_error >= run_end) run_end += input.runs[++r].count;
    return std::unexpected(SelectionError(st, table, first_error, input.selections[first_error], *lanes.run_holders[r],
                                          input.rank));
  }
  if (end != input.selections.size()) {
    return MakeError(ErrorCode::kNotFound,
                     fmt::format("selection {}: request {} of its run is unknown or freed (a stale selection?): "
                                 "refused", end, input.runs[bad_run].request.value()));
  }
  missed_.clear();
  hit_slots_.clear();
  MergeLanes(lanes.lanes, [](const Lane& L) -> const std::vector<Indexed>& { return L.hits; },
             [&](std::uint32_t slot) { hit_slots_.push_back(SlotId(slot)); });
  MergeLanes(lanes.lanes, [](const Lane& L) -> const std::vector<Indexed>& { return L.misses; },
             [&](std::uint32_t a) { missed_.push_back(LogicalAddr(a)); });
  ULA_RETURN_IF_ERROR(gp.RefuseMovingNewOnHost(missed_));
  ULA_RETURN_IF_ERROR(CheckRoom(gp, hit_slots_, missed_.size(), input));

  // 4. Device slots for the misses: free slots first, then victims.
  gp.policy->Touch(hit_slots_);
  const std::size_t n_miss = missed_.size();
  const std::size_t n_free = ClaimDeviceSlots(gp, target_slots_, n_miss, options_, lanes.fork_join, counters_);

  // 5. The copy plan (shared with the engine path), run on the backend; then publish what
  // arrived.
  StepStats stats;
  stats.selections = input.selections.size();
  stats.distinct = hit_slots_.size() + n_miss;
  stats.hits = hit_slots_.size();
  stats.misses = n_miss;
  if (n_miss > 0) {
    MissFills& fills = lanes.fills;
    fills.Decide(gp, target_slots_, n_free);
    fills.AddPlannedStats(cfg.entry_bytes_of(input.group), stats);
    lanes.status.resize(n_miss);
    fills.Describe(table, gp, cfg.row(), input.rank, input.group, missed_, target_slots_);
    Status s = fills.Run(space_.backend(), gp, cfg.row(), input.rank, input.group, lanes.status);
    fills.Publish(table, gp, input.rank, lanes.status);
    if (!s) {
      ULA_EXPENSIVE_CHECK(space_);
      return std::unexpected(std::move(s).error());
    }
  }

  // 6. Physical slots in selection order: the hits' were written by the scan; the misses'
  // selections (first or repeated) read their published locations.
  auto patch = [&](std::size_t lane) {
    for (std::uint32_t i : lanes.lanes[lane].patch) out_slots[i] = table.Get(input.selections[i]).slot();
  };
  if (T == 1) {
    patch(0);
  } else {
    auto body = [&](std::size_t, std::size_t begin, std::size_t stop) {
      for (std::size_t lane = begin; lane < stop; ++lane) patch(lane);
    };
    lanes.fork_join.Run(T, body);
  }
  ULA_EXPENSIVE_CHECK(space_);
  return stats;
}

}  // namespace ula
