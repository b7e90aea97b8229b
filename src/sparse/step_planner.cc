#include "ula/step_planner.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <limits>
#include <string>

#include "policy/fork_join.h"
#include "policy/pb_lru.h"
#include "sparse/address_space_state.h"
#include "ula/check.h"

namespace ula {

StepStats& StepStats::operator+=(const StepStats& o) {
  selections += o.selections;
  distinct += o.distinct;
  hits += o.hits;
  misses += o.misses;
  into_free += o.into_free;
  evictions += o.evictions;
  bytes_moved += o.bytes_moved;
  return *this;
}

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
  for (const auto& [id, req] : st.requests) {
    if (req.tag == st.owner[a.value()]) holder = id.value();
    if (req.tag == tag) wanted = id.value();
  }
  if (st.owner[a.value()] == kSharedTag) {
    return fmt::format("selection {}: logical address {} is a shared address that request {} does not hold (it "
                       "never adopted it, or released it): refused", i, a.value(), wanted);
  }
  return fmt::format("selection {}: logical address {} belongs to request {}, not to request {} (a stale address, "
                     "freed and reused?): refused", i, a.value(), holder, wanted);
}

// The error of selection i (which failed a check of steps 1-3), built off the hot path.
Error SelectionError(const AddressSpace::State& st, const AddressRecords& table, std::size_t i, LogicalAddr a,
                     const RequestState& holder, Rank rank) {
  const Location loc = table.Get(a);
  if (loc.is_none()) {
    return Error(ErrorCode::kNotFound, fmt::format("selection {}: logical address {} is not live (freed, or never "
                                                   "allocated)", i, a.value()));
  }
  if (!OwnedBy(st.owner.data(), a.value(), holder)) {
    return Error(ErrorCode::kNotFound, StaleSelectionMessage(st, i, a, holder.tag));
  }
  return Error(ErrorCode::kInvalidArgument, fmt::format("selection {}: address {} lives on rank {}, not rank {}", i,
                                                        a.value(), loc.rank().value(), rank.value()));
}

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

Result<StepStats> StepPlanner::Step(const StepInput& input, std::span<SlotId> out_slots) {
  AddressSpace::State& st = *space_.state_;
  const AddressSpaceConfig& cfg = space_.config();
  if (input.rank.value() >= cfg.num_ranks) {
    return MakeError(ErrorCode::kOutOfRange, fmt::format("rank {} is out of range ({} ranks)", input.rank.value(), cfg.num_ranks));
  }
  if (input.group.value() >= cfg.num_groups) {
    return MakeError(ErrorCode::kOutOfRange, fmt::format("group {} is out of range ({} groups)", input.group.value(), cfg.num_groups));
  }
  if (out_slots.size() != input.selections.size()) {
    return MakeError(ErrorCode::kInvalidArgument,
                     fmt::format("{} output slots for {} selections", out_slots.size(), input.selections.size()));
  }
  if (input.selections.size() > std::numeric_limits<std::uint32_t>::max()) {
    return MakeError(ErrorCode::kInvalidArgument, fmt::format("{} selections: at most 2^32 - 1 per step",
                                                              input.selections.size()));
  }
  AddressRecords& table = st.tables[input.group.value()];
  GroupPools& gp = st.at(input.rank, input.group);
  ULA_CHECK(table.size() == st.owner.size());

  // 1-3. Validate, dedup, classify. Nothing is modified until every check has passed (the
  // records' dedup stamps are scratch, out_slots is not state).
  ULA_RETURN_IF_ERROR(CheckSelectionRuns(input.runs, input.selections.size()));
  Lanes& lanes = *lanes_;
  // Each run's request; a run of an unknown request fails at its first selection, unless
  // an earlier selection fails first.
  std::size_t end = input.selections.size();
  std::size_t bad_run = 0;
  lanes.run_holders.assign(input.runs.size(), nullptr);
  {
    std::size_t first = 0;
    for (std::size_t r = 0; r < input.runs.size(); ++r) {
      const SelectionRun& run = input.runs[r];
      if (run.count != 0) {
        auto req = st.requests.find(run.request);
        if (req == st.requests.end()) {
          end = first;
          bad_run = r;
          break;
        }
        lanes.run_holders[r] = &req->second;
      }
      first += run.count;
    }
  }
  const std::uint32_t epoch = table.NextEpoch();
  const std::uint32_t T = options_.threads;
  const std::uint32_t distance = options_.prefetch_distance;
  auto scan = [&](std::size_t lane) {
    ScanLane(lanes.lanes[lane], static_cast<std::uint32_t>(lane), T, input.selections, input.runs, lanes.run_holders, end,
             table, st.owner.data(), epoch, input.rank, distance, out_slots.data());
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
  const std::size_t n_distinct = hit_slots_.size() + missed_.size();
  for (LogicalAddr a : missed_) {  // issue 27, item 1: a new entry's write slot never moves in its round
    if (gp.IsNewOnHost(a)) return MakeError(ErrorCode::kResourceExhausted, fmt::format("address {} was placed on host by this round's Allocate (the device held only this round's "
                                 "entries): its KV is written at that host slot, so this round cannot move it; "
                                 "select it after AdvanceRound()", a.value()));
  }
  // Room: the hits not yet used in this round stop being evictable. When the misses fit
  // even if every hit were new to the round (almost always), the exact count — one policy
  // lookup per hit, a second random line per selection — is skipped: same decision.
  std::uint64_t evictable = gp.policy->NumEvictable();
  const bool fits_anyway =
      evictable >= hit_slots_.size() && missed_.size() <= gp.device.num_free() + (evictable - hit_slots_.size());
  std::uint64_t newly_used = 0;
  if (!fits_anyway) {
    for (SlotId s : hit_slots_) newly_used += !gp.policy->UsedInCurrentRound(s);
  }
  evictable -= newly_used;
  if (!fits_anyway && missed_.size() > gp.device.num_free() + evictable) {
    return MakeError(ErrorCode::kResourceExhausted,
                     fmt::format("step needs {} distinct entries on device ({} missing) but only {} free and {} "
                                 "evictable slots remain of {} in rank {} group {}: {} entries are used in this "
                                 "round (allocated or selected since the last AdvanceRound(), this step's hits "
                                 "included) and cannot be evicted: call AdvanceRound() after the round's "
                                 "attention, or select fewer entries per round",
                                 n_distinct, missed_.size(), gp.device.num_free(), evictable,
                                 gp.device.capacity(), input.rank.value(), input.group.value(),
                                 gp.device.num_used() - evictable));
  }

  // 4. Device slots for the misses: free slots first, then victims.
  gp.policy->Touch(hit_slots_);
  const std::size_t n_miss = missed_.size();
  const std::size_t n_free = std::min<std::size_t>(n_miss, gp.device.num_free());
  target_slots_.resize(n_miss);
  for (std::size_t i = 0; i < n_free; ++i) target_slots_[i] = *gp.device.Allocate();
  if (const std::size_t n_evict = n_miss - n_free; n_evict > 0) {
    const auto victims = std::span(target_slots_).subspan(n_free);
    const auto t0 = std::chrono::steady_clock::now();
    auto* pb = T > 1 && n_evict >= options_.parallel_claim_min_victims
                   ? dynamic_cast<policy::PbLru*>(gp.policy.get())
                   : nullptr;
    if (pb != nullptr) {
      ULA_CHECK(pb->ClaimVictimsParallel(victims, lanes.fork_join).has_value());  // the room check passed
      ++counters_.parallel_claims;
    } else {
      ULA_CHECK(gp.policy->ClaimVictims(victims) == n_evict);
    }
    counters_.claim_ns += static_cast<std::uint64_t>(
        std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count());
    ++counters_.claims;
    counters_.victims += n_evict;
  }

  // 5. Copy, wait, then publish.
  StepStats stats;
  stats.selections = input.selections.size();
  stats.distinct = n_distinct;
  stats.hits = hit_slots_.size();
  stats.misses = n_miss;
  stats.into_free = n_free;
  stats.evictions = n_miss - n_free;
  if (n_miss > 0) {
    // One move per layer's row of each entry (per-layer pools, address_space.h "Pools").
    CopyBatch fetch{gp.host.arena().id, gp.device.arena().id, cfg.row(), /*swap=*/false, {}};
    CopyBatch swap{gp.host.arena().id, gp.device.arena().id, cfg.row(), /*swap=*/true, {}};
    fetch.moves.reserve(n_free);
    swap.moves.reserve(n_miss - n_free);
    for (std::size_t i = 0; i < n_miss; ++i) {
      gp.AppendMoves(Tier::kHost, table.Get(missed_[i]).slot(), target_slots_[i], (i < n_free ? fetch : swap).moves);
    }
    stats.bytes_moved = (fetch.moves.size() + 2 * swap.moves.size()) * std::uint64_t{cfg.row()};
    // Each batch is waited on its own fence: a failed batch publishes nothing of its own,
    // a completed one is published (its bytes have arrived) — see the header's contract.
    CopyBatch* batches[2] = {&fetch, &swap};
    Fence fences[2] = {0, 0};
    std::string failed[2];
    for (int k = 0; k < 2; ++k) {
      if (batches[k]->moves.empty()) continue;
      auto fence = space_.backend().Submit(std::move(*batches[k]));
      if (fence) {
        fences[k] = *fence;
      } else {
        failed[k] = fence.error().message();
      }
    }
    for (int k = 0; k < 2; ++k) {
      if (fences[k] == 0) continue;
      if (auto w = space_.backend().Wait(fences[k]); !w) failed[k] = w.error().message();
    }
    // Bytes have arrived: publish.
    for (std::size_t i = 0; i < n_miss; ++i) {
      const LogicalAddr wanted = missed_[i];
      const SlotId device_slot = target_slots_[i];
      const SlotId host_slot = table.Get(wanted).slot();
      if (!failed[i < n_free ? 0 : 1].empty()) {
        // Not copied: the entry stays on host; a free slot goes back (a victim stays put).
        if (i < n_free) ULA_CHECK(gp.device.Free(device_slot).has_value());
        continue;
      }
      if (i < n_free) {
        ULA_CHECK(gp.host.Free(host_slot).has_value());
        gp.policy->Insert(device_slot);
      } else {
        const LogicalAddr victim = gp.device_owner[device_slot.value()];
        table.Set(victim, Location::Make(Tier::kHost, input.rank, host_slot));
      }
      table.Set(wanted, Location::Make(Tier::kDevice, input.rank, device_slot));
      gp.device_owner[device_slot.value()] = wanted;
    }
    if (!failed[0].empty() || !failed[1].empty()) {
      ULA_EXPENSIVE_CHECK(space_);
      const bool both = !failed[0].empty() && !failed[1].empty();
      return MakeError(ErrorCode::kIo,
                       fmt::format("rank {} group {}: {}{}{}", input.rank.value(), input.group.value(),
                                   failed[0].empty() ? "" : fmt::format("host->device copy of {} entries failed ({})", n_free, failed[0]),
                                   both ? "; " : "",
                                   failed[1].empty() ? "" : fmt::format("host<->device swap of {} entries failed ({})", n_miss - n_free, failed[1])));
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
