// TpStepPlanner: validate -> agree -> home phase (RunHome: the engine path's plan, MissFills) -> barrier
// -> remote phase (RemotePhase) -> barrier -> emit (see include/ula/tp_step_planner.h), and
// the engine path's plan and completion in the runs layout (PlanHome, CompleteHome; the
// engine layout over them is tp_step_planner_engine.cc). The
// dedup runs once per step and group and is shared read-only by the rank workers; each
// worker touches only its own rank's shard and buffer of the stepped group, and in the
// remote phase only reads other ranks' homes, which the barrier has settled.
#include "ula/tp_step_planner.h"

#include <fmt/format.h>

#include <algorithm>
#include <functional>
#include <string>
#include <string_view>
#include <unordered_map>

#include "space/space_access.h"
#include "space/tp_state.h"
#include "step/engine_modes.h"
#include "step/miss_fills.h"
#include "step/rank_threads.h"
#include "step/tp_step_planner_engine.h"
#include "ula/check.h"

namespace ula {

StepStats TpStepPlan::Total() const {
  StepStats t;
  for (const auto& s : stats) t += s;
  return t;
}

// Per hosted rank: the step's classification and the slots chosen for it.
struct RankWork {
  Rank rank;
  std::vector<SlotId> home_hit_slots, home_targets;
  std::vector<LogicalAddr> home_missed;
  std::size_t home_free = 0;       // home_targets[0, home_free) were free slots (copies)
  MissFills fills;                 // the home phase's plan (step/miss_fills.h), pending until published
  std::vector<std::uint8_t> home_status;  // [fills.size()] each home descriptor's outcome
  std::vector<SlotId> buffer_hit_slots, buffer_targets;
  std::vector<LogicalAddr> remote_missed;
  std::vector<char> fetch_failed;  // [remote_missed]
  struct Submitted {               // a remote copy batch in flight: one source, one layer
    Fence fence;
    std::uint32_t source;
    std::uint32_t layer;
    std::vector<std::size_t> misses;  // indices into remote_missed
  };
  std::vector<Submitted> submitted;
  StepStats stats;
  Status status;                   // the first failed transfer of this rank's step
};

struct TpStepPlanner::Scratch {
  std::vector<std::uint32_t> seen_epoch;  // [addresses] dedup stamps
  std::uint32_t epoch = 0;
  std::vector<LogicalAddr> distinct;
  std::vector<RankWork> work;  // [hosted]
  bool home_pending = false;   // PlanHome claimed the work's home targets; CompleteHome publishes
  GroupId pending_group;
  RankThreads rank_threads;    // the hosted ranks' threads when options.parallel_ranks
};

TpStepPlanner::TpStepPlanner(TpAddressSpace& space, TpFabric* fabric, TpPlannerOptions options)
    : space_(space), fabric_(fabric), options_(options), scratch_(std::make_unique<Scratch>()) {}
TpStepPlanner::~TpStepPlanner() {
  if (scratch_ && scratch_->home_pending) StateOf(space_).dir.EndPlan();
}

namespace {

// One call of fn per hosted rank: on the planner's kept rank threads when parallel (the
// calls may wait for each other at the fabric's barriers), else one after another.
template <class F>
void ForEachRank(std::vector<RankWork>& work, bool parallel, RankThreads& threads, F&& fn) {
  if (!parallel || work.size() < 2) {
    for (RankWork& w : work) fn(w);
    return;
  }
  threads.Run(work.size(), [&](std::size_t i) { fn(work[i]); });
}

// The home phase's choice of slots for one rank: its hits touched, then a device target per
// host-resident entry of its own shard, free slots first (home_free of them), then policy
// victims. Nothing moves and nothing is published.
void ClaimHome(TpGroupShard& sh, RankWork& w) {
  sh.policy->Touch(w.home_hit_slots);
  const std::size_t n_miss = w.home_missed.size();
  const std::size_t n_free = std::min<std::size_t>(n_miss, sh.device.num_free());
  w.home_targets.resize(n_miss);
  for (std::size_t i = 0; i < n_free; ++i) w.home_targets[i] = *sh.device.Allocate();
  const std::size_t claimed = sh.policy->ClaimVictims(std::span(w.home_targets).subspan(n_free));
  ULA_CHECK(claimed == n_miss - n_free);
  w.home_free = n_free;
  w.stats.misses = n_miss;
}

// The home phase's plan of one rank (docs/ARCHITECTURE.md, "One decode step of one layer
// group", steps 4 and 5): ClaimHome's slots, then the one copy plan of DP and TP (MissFills,
// step/miss_fills.h) decides each fill (a free slot, a victim to its clean host shadow with no
// descriptor of its own, a victim evicted to a host slot of its own, a swap) and describes it:
// one descriptor per miss, copies into free slots, then into emptied victims' slots, then
// swaps. Its planned counters go to the rank's stats. Pending until PublishHome.
void PlanHomeFills(const TpConfig& cfg, TpGroupShard& sh, RankWork& w, GroupId group) {
  ClaimHome(sh, w);
  w.fills.Decide(sh, w.home_targets, w.home_free);
  w.fills.AddPlannedStats(cfg.entry_bytes, w.stats);
  w.fills.Describe(HomeRecords{sh.home, cfg.num_ranks}, sh, cfg.entry_bytes, w.rank, group, w.home_missed,
                   w.home_targets);
  w.home_status.assign(w.fills.size(), kDescriptorFailed);
}

// Publishes the rank's pending home plan by w.home_status (MissFills::Publish: shadowed
// victims at their shadows, what arrived on device, the rest back where it was) and ends it.
std::size_t PublishHomeFills(const TpConfig& cfg, TpGroupShard& sh, RankWork& w) {
  HomeRecords records{sh.home, cfg.num_ranks};
  return w.fills.Publish(records, sh, w.rank, w.home_status);
}

// The home phase of one rank (Step): the engine path's plan (PlanHomeFills), its descriptors
// run on the backend in the host step's batches (MissFills::Run: the evictions' device -> host
// batch first, waited on its own fence, then the copies and the swaps, each batch waited on its
// own fence), then the engine path's publish by each descriptor's outcome (PublishHomeFills):
// only what arrived is published. kIo names every failed batch.
Status RunHome(const TpConfig& cfg, Backend& backend, TpGroupShard& sh, RankWork& w, GroupId group) {
  PlanHomeFills(cfg, sh, w, group);
  if (w.fills.size() == 0) return Ok();
  Status ran = w.fills.Run(backend, sh, cfg.entry_bytes, w.rank, group, w.home_status);
  PublishHomeFills(cfg, sh, w);
  return ran;
}

// The remote phase of one step and group: what its parts share. Layer l of a layer sink
// moves bytes [l * layer_bytes, (l + 1) * layer_bytes) of each entry (a strided sub-range).
struct RemotePhase {
  TpAddressSpace& space;
  TpAddressSpace::State& st;
  TpFabric* fabric;
  GroupId group;
  std::uint32_t layers;      // 1 without a layer sink
  std::uint32_t layer_bytes;

  // Marks the misses failed and keeps the rank's first error (kIo naming `what`).
  void Fail(RankWork& w, const std::vector<std::size_t>& misses, std::string_view what, const Error& e) const;
  // Buffer slots for the rank's remote misses (free first, then victims, whose read-only
  // copies are dropped), and the copies submitted: one batch per source rank and source
  // tier (and layer); a fabric fetch from a rank not hosted here returns when it arrived.
  void AssignAndSubmit(RankWork& w) const;
  // Waits on each submitted batch of `layer` on its own fence; a failed one fails its misses.
  void WaitLayer(RankWork& w, std::uint32_t layer) const;
  // Bytes have arrived (every layer): publishes the fetched copies. A slot whose fetch
  // failed in any layer holds no entry (a victim's old copy was dropped, and may be partly
  // overwritten): it goes back to the pool.
  void Publish(RankWork& w) const;
};

void RemotePhase::Fail(RankWork& w, const std::vector<std::size_t>& misses, std::string_view what,
                       const Error& e) const {
  for (std::size_t i : misses) w.fetch_failed[i] = 1;
  if (w.status) {
    w.status = MakeError(ErrorCode::kIo, fmt::format("rank {} group {}: remote phase: {} ({})", w.rank.value(),
                                                     group.value(), what, e.message()));
  }
}

// The remote phase's claim on one rank: buffer hits touched, buffer slots for its remote
// misses (free first, then victims of the buffer policy, whose read-only copies are
// dropped, no write-back), nothing fetched or published yet.
void ClaimBuffer(const TpConfig& cfg, TpGroupShard& sh, RankWork& w) {
  sh.buffer_policy->Touch(w.buffer_hit_slots);
  const std::size_t n_miss = w.remote_missed.size();
  const std::size_t n_free = std::min<std::size_t>(n_miss, sh.buffer.num_free());
  w.buffer_targets.resize(n_miss);
  for (std::size_t i = 0; i < n_free; ++i) w.buffer_targets[i] = *sh.buffer.Allocate();
  const std::size_t claimed = sh.buffer_policy->ClaimVictims(std::span(w.buffer_targets).subspan(n_free));
  ULA_CHECK(claimed == n_miss - n_free);
  for (std::size_t i = n_free; i < n_miss; ++i) {  // read-only copies: dropped, no write-back
    const SlotId s = w.buffer_targets[i];
    sh.buffered.erase(sh.buffer_owner[s.value()].value());
    sh.buffer_owner[s.value()] = LogicalAddr::Invalid();
  }
  w.stats.remote_fetches = n_miss;
  w.stats.buffer_evictions = n_miss - n_free;
  w.stats.remote_bytes = n_miss * std::uint64_t{cfg.entry_bytes};
  std::vector<char> sources(cfg.num_ranks, 0);  // one fetch batch per source rank with misses
  for (LogicalAddr a : w.remote_missed) sources[a.value() % cfg.num_ranks] = 1;
  w.stats.source_batches = static_cast<std::uint32_t>(std::count(sources.begin(), sources.end(), 1));
  w.fetch_failed.assign(n_miss, 0);
}

// Publishes the fetched copies of one rank: a slot whose fetch failed (fetch_failed, in any
// layer) holds no entry (a victim's old copy was dropped, and may be partly overwritten):
// it goes back to the pool.
void PublishBuffer(TpGroupShard& sh, RankWork& w) {
  const std::size_t n_miss = w.buffer_targets.size();
  const std::size_t n_free = n_miss - w.stats.buffer_evictions;
  for (std::size_t i = 0; i < n_miss; ++i) {
    const SlotId s = w.buffer_targets[i];
    if (w.fetch_failed[i]) {
      if (i >= n_free) sh.buffer_policy->Remove(s);
      ULA_CHECK(sh.buffer.Free(s).has_value());
      continue;
    }
    sh.buffered[w.remote_missed[i].value()] = s;
    sh.buffer_owner[s.value()] = w.remote_missed[i];
    if (i < n_free) sh.buffer_policy->Insert(s);
  }
}

void RemotePhase::AssignAndSubmit(RankWork& w) const {
  w.submitted.clear();
  w.fetch_failed.clear();
  w.buffer_targets.clear();
  if (!w.status) return;
  const std::uint32_t p = space.config().num_ranks;
  TpGroupShard& sh = st.at(w.rank, group);
  ClaimBuffer(space.config(), sh, w);
  std::vector<std::vector<std::size_t>> by_source(p);
  for (std::size_t i = 0; i < w.remote_missed.size(); ++i) by_source[w.remote_missed[i].value() % p].push_back(i);
  std::vector<LogicalAddr> addrs;
  std::vector<std::byte*> dst;
  for (std::uint32_t q = 0; q < p; ++q) {
    if (by_source[q].empty()) continue;
    const Rank src(static_cast<std::uint16_t>(q));
    if (space.Hosts(src)) {
      const TpGroupShard& home = st.at(src, group);
      for (std::uint32_t l = 0; l < layers; ++l) {
        const std::uint64_t shift = std::uint64_t{l} * layer_bytes;
        CopyBatch from[2] = {{home.device.arena().id, sh.buffer.arena().id, layer_bytes, false, {}},
                             {home.host.arena().id, sh.buffer.arena().id, layer_bytes, false, {}}};
        std::vector<std::size_t> misses[2];
        for (std::size_t i : by_source[q]) {
          const Location loc = home.home[w.remote_missed[i].value() / p];
          const int t = loc.tier() == Tier::kDevice ? 0 : 1;
          from[t].moves.push_back({(t == 0 ? home.device : home.host).offset(loc.slot()) + shift,
                                   sh.buffer.offset(w.buffer_targets[i]) + shift});
          misses[t].push_back(i);
        }
        for (int t = 0; t < 2; ++t) {
          if (from[t].moves.empty()) continue;
          auto fence = space.backend().Submit(std::move(from[t]));
          if (fence) {
            w.submitted.push_back({*fence, q, l, std::move(misses[t])});
          } else {
            Fail(w, misses[t], fmt::format("copy of {} entries from rank {} failed", misses[t].size(), q), fence.error());
          }
        }
      }
    } else {  // a fabric fetch moves whole entries and returns when they arrived (no sink with a fabric)
      addrs.clear();
      dst.clear();
      for (std::size_t i : by_source[q]) {
        addrs.push_back(w.remote_missed[i]);
        dst.push_back(sh.buffer.data(w.buffer_targets[i]));
      }
      if (auto s = fabric->FetchFromHome(src, group, addrs, dst); !s) {
        Fail(w, by_source[q], fmt::format("fetch of {} entries from rank {} failed", addrs.size(), q), s.error());
      }
    }
  }
}

void RemotePhase::WaitLayer(RankWork& w, std::uint32_t layer) const {
  for (const RankWork::Submitted& b : w.submitted) {
    if (b.layer != layer) continue;
    if (auto s = space.backend().Wait(b.fence); !s) {
      Fail(w, b.misses, fmt::format("copy of {} entries from rank {} failed", b.misses.size(), b.source), s.error());
    }
  }
}

void RemotePhase::Publish(RankWork& w) const { PublishBuffer(st.at(w.rank, group), w); }

}  // namespace

namespace {

// Validates each selection against its run's request (live, held by it) and appends the
// distinct addresses, in first-selection order, to `distinct` (seen_epoch: the dedup stamps).
Status DedupSelections(const TpAddressSpace::State& st, std::span<const LogicalAddr> selections,
                       std::span<const SelectionRun> runs, std::vector<std::uint32_t>& seen_epoch,
                       std::uint32_t& epoch, std::vector<LogicalAddr>& distinct) {
  if (seen_epoch.size() < st.dir.extent()) seen_epoch.resize(st.dir.extent(), 0);
  if (++epoch == 0) {
    std::fill(seen_epoch.begin(), seen_epoch.end(), 0);
    epoch = 1;
  }
  distinct.clear();
  std::size_t next_run = 0, run_end = 0;
  const Directory::Request* holder = nullptr;  // selection i's run's request
  for (std::size_t i = 0; i < selections.size(); ++i) {
    while (i == run_end) {  // skips runs of count 0; the runs cover every selection
      const SelectionRun& run = runs[next_run++];
      run_end += run.count;
      if (run.count == 0) continue;
      auto req = st.dir.requests().find(run.request);
      if (req == st.dir.requests().end()) {
        return MakeError(ErrorCode::kNotFound,
                         fmt::format("selection {}: request {} of its run is unknown or freed (a stale selection?): "
                                     "refused", i, run.request.value()));
      }
      holder = &req->second;
    }
    const LogicalAddr a = selections[i];
    if (!st.dir.IsLive(a)) {
      return MakeError(ErrorCode::kNotFound,
                       fmt::format("selection {}: logical address {} is not live (freed, or never allocated)", i,
                                   a.value()));
    }
    if (!st.dir.Holds(*holder, a)) {
      std::uint64_t owner = 0, wanted = 0;  // the error path: name both requests
      for (const auto& [id, t] : st.dir.requests()) {
        if (t.tag == st.dir.owner()[a.value()]) owner = id.value();
        if (t.tag == holder->tag) wanted = id.value();
      }
      return MakeError(ErrorCode::kNotFound,
                       fmt::format("selection {}: logical address {} belongs to request {}, not to request {} "
                                   "(a stale address, freed and reused?): refused", i, a.value(), owner, wanted));
    }
    if (seen_epoch[a.value()] == epoch) continue;
    seen_epoch[a.value()] = epoch;
    distinct.push_back(a);
  }
  return Ok();
}

// One hosted rank's classification of the distinct addresses (home hit / home miss /
// buffer hit / remote miss / elsewhere) into w, and whether its misses fit: free slots plus
// the slots its policies may evict this round (kResourceExhausted). Changes nothing else.
Status ClassifyRank(RankWork& w, const TpGroupShard& sh, std::span<const LogicalAddr> distinct, std::uint32_t p,
                    bool at_home, GroupId group) {
  w.home_hit_slots.clear();
  w.home_missed.clear();
  w.buffer_hit_slots.clear();
  w.remote_missed.clear();
  w.stats = {};
  w.status = Ok();
  w.stats.distinct = distinct.size();
  for (LogicalAddr a : distinct) {
    if (at_home && a.value() % p != w.rank.value()) {
      ++w.stats.elsewhere;  // its home's partial attention covers it
    } else if (a.value() % p == w.rank.value()) {
      const Location loc = sh.home[a.value() / p];
      if (loc.tier() == Tier::kDevice) {
        w.home_hit_slots.push_back(loc.slot());
      } else {
        w.home_missed.push_back(a);
      }
    } else if (auto it = sh.buffered.find(a.value()); it != sh.buffered.end()) {
      w.buffer_hit_slots.push_back(it->second);
    } else {
      w.remote_missed.push_back(a);
    }
  }
  w.stats.hits = w.home_hit_slots.size();
  w.stats.buffer_hits = w.buffer_hit_slots.size();
  // A new entry pinned on host (TpConfig::stable_new_entries) is written at that host slot:
  // no step of its round moves it.
  ULA_RETURN_IF_ERROR(sh.RefuseMissesWithoutRoom(w.home_missed, w.home_hit_slots));
  std::uint64_t buffer_newly_used = 0;
  for (SlotId s : w.buffer_hit_slots) buffer_newly_used += !sh.buffer_policy->UsedInCurrentRound(s);
  const std::uint64_t buffer_room =
      std::uint64_t{sh.buffer.num_free()} + (sh.buffer_policy->NumEvictable() - buffer_newly_used);
  if (w.remote_missed.size() > buffer_room) {
    return MakeError(ErrorCode::kResourceExhausted,
                     fmt::format("rank {} group {}: {} remote entries must be fetched but only {} local-buffer "
                                 "slots are free or evictable: {} copies are used in this round and cannot be "
                                 "evicted: call AdvanceRound() after the round's attention, give the local "
                                 "buffer more bytes, or use TpAttention::kAtHome", w.rank.value(), group.value(),
                                 w.remote_missed.size(), buffer_room,
                                 sh.buffer.num_used() + sh.buffer.num_free() - buffer_room));
  }
  return Ok();
}

}  // namespace

Status TpStepPlanner::Classify(GroupId group, std::span<const LogicalAddr> selections,
                               std::span<const SelectionRun> runs) {
  TpAddressSpace::State& st = StateOf(space_);
  const TpConfig& cfg = space_.config();
  const std::uint32_t p = cfg.num_ranks;
  Scratch& sc = *scratch_;
  // Errors every rank sees alike (the directory is replicated): no collective needed.
  if (group.value() >= cfg.num_groups) {
    return MakeError(ErrorCode::kOutOfRange, fmt::format("group {} is out of range ({} groups)", group.value(), cfg.num_groups));
  }
  if (fabric_ != nullptr && (space_.hosted_ranks().size() != 1 || space_.hosted_ranks()[0] != fabric_->local_rank())) {
    return MakeError(ErrorCode::kFailedPrecondition, "with a fabric the space must host exactly the fabric's local rank");
  }
  if (fabric_ == nullptr && space_.hosted_ranks().size() != p) {
    return MakeError(ErrorCode::kFailedPrecondition,
                     fmt::format("the space hosts {} of {} ranks but the planner has no fabric: construct the "
                                 "TpStepPlanner with the TpFabric that reaches the other ranks (MakeMpiFabric), "
                                 "or create the space for every rank", space_.hosted_ranks().size(), p));
  }
  ULA_RETURN_IF_ERROR(CheckSelectionRuns(runs, selections.size()));
  // 0. Validate and dedup.
  ULA_RETURN_IF_ERROR(DedupSelections(st, selections, runs, sc.seen_epoch, sc.epoch, sc.distinct));
  // Classify per hosted rank and check that its misses fit (the first rank that does not
  // fit names the error; every rank is classified).
  const auto hosted = space_.hosted_ranks();
  sc.work.resize(hosted.size());
  Status local = Ok();
  for (std::size_t h = 0; h < hosted.size(); ++h) {
    sc.work[h].rank = hosted[h];
    Status s = ClassifyRank(sc.work[h], st.at(hosted[h], group), sc.distinct, p,
                            cfg.attention == TpAttention::kAtHome, group);
    if (local && !s) local = std::move(s);
  }
  return local;
}

Status TpStepPlanner::Check(GroupId group, std::span<const LogicalAddr> selections,
                            std::span<const SelectionRun> runs) {
  ULA_RETURN_IF_ERROR(RefuseIfPending());
  if (fabric_ != nullptr) {
    return MakeError(ErrorCode::kFailedPrecondition, "Check is for in-process ranks (with a fabric, Step agrees)");
  }
  return Classify(group, selections, runs);
}

Result<TpStepPlan> TpStepPlanner::Step(GroupId group, std::span<const LogicalAddr> selections,
                                       std::span<const SelectionRun> runs, TpLayerSink* sink) {
  ULA_RETURN_IF_ERROR(RefuseTpKinds(KindsWithoutHome(space_.config()), "TpStepPlanner::Step"));
  ULA_RETURN_IF_ERROR(RefuseIfPending());
  if (sink != nullptr) {
    if (fabric_ != nullptr) {
      return MakeError(ErrorCode::kFailedPrecondition, "the layer pipeline (a TpLayerSink) is for in-process ranks");
    }
    const std::uint32_t l = sink->layers();
    if (l == 0 || space_.config().entry_bytes % l != 0) {
      return MakeError(ErrorCode::kInvalidArgument,
                       fmt::format("{} layers per group do not divide the {}-byte group entry", l,
                                   space_.config().entry_bytes));
    }
  }
  TpAddressSpace::State& st = StateOf(space_);
  const TpConfig& cfg = space_.config();
  const bool at_home = cfg.attention == TpAttention::kAtHome;
  Scratch& sc = *scratch_;
  // 0. Validate, dedup, classify, check that the misses fit (nothing changes).
  Status local = Classify(group, selections, runs);
  ULA_RETURN_IF_ERROR(Agree(group, std::move(local)));

  // 1. Home phase.
  ForEachRank(sc.work, options_.parallel_ranks, sc.rank_threads,
              [&](RankWork& w) { w.status = RunHome(cfg, space_.backend(), st.at(w.rank, group), w, group); });
  // Attention at home: no rank reads another's memory, so no barrier and no remote phase.
  if (fabric_ && !at_home) fabric_->Barrier();

  // 2. Remote phase (RemotePhase above). A rank whose home phase failed skips it (it still
  // joins the barriers).
  const std::uint32_t layers = sink ? sink->layers() : 1;
  const RemotePhase remote{space_, st, fabric_, group, layers, cfg.entry_bytes / layers};
  if (!at_home && sink == nullptr) {
    ForEachRank(sc.work, options_.parallel_ranks, sc.rank_threads, [&](RankWork& w) {
      remote.AssignAndSubmit(w);
      remote.WaitLayer(w, 0);
      remote.Publish(w);
    });
  } else if (sink != nullptr) {
    // The layer pipeline: the refs are handed out before any copy is waited on, then each
    // layer's arrival on every hosted rank, in layer order, then everything is published.
    if (!at_home) ForEachRank(sc.work, options_.parallel_ranks, sc.rank_threads, [&](RankWork& w) { remote.AssignAndSubmit(w); });
    sink->Planned(Emit(group, selections, /*pending=*/!at_home, /*home_pending=*/false));
    for (std::uint32_t l = 0; l < layers; ++l) {
      bool ok = true;
      for (RankWork& w : sc.work) {
        if (!at_home) remote.WaitLayer(w, l);
        ok = ok && w.status.has_value();
      }
      sink->Arrived(l, ok);
    }
    if (!at_home) {
      for (RankWork& w : sc.work) {
        if (!w.buffer_targets.empty()) remote.Publish(w);
      }
    }
  }
  if (fabric_ && !at_home) fabric_->Barrier();
  // A failed transfer is a broken copy engine or transport, not bad input: reported after
  // the barrier (so the collectives stay matched), with the state the header documents.
  for (const RankWork& w : sc.work) {
    if (!w.status) {
      ULA_EXPENSIVE_CHECK(space_);
      return std::unexpected(w.status.error());
    }
  }

  // 3. Emit.
  TpStepPlan plan = Emit(group, selections, /*pending=*/false, /*home_pending=*/false);
  ULA_EXPENSIVE_CHECK(space_);
  return plan;
}

Status TpStepPlanner::Agree(GroupId group, Status local) const {
  // Any other refusal is the same on every rank (the directory is replicated): no collective.
  if (!local && local.error().code() != ErrorCode::kResourceExhausted) return local;
  const bool all_ok = fabric_ ? fabric_->AllTrue(local.has_value()) : local.has_value();
  if (!local) return local;
  if (!all_ok) {
    return MakeError(ErrorCode::kFailedPrecondition,
                     fmt::format("group {}: another rank refused the step (its misses do not fit)", group.value()));
  }
  return Ok();
}

Status TpStepPlanner::RefuseIfPending() const {
  if (!scratch_->home_pending) return Ok();
  return MakeError(ErrorCode::kFailedPrecondition,
                   fmt::format("group {}: a plan is pending (Plan): Complete it first",
                               scratch_->pending_group.value()));
}

bool TpStepPlanner::has_pending() const { return scratch_->home_pending; }

Result<TpStepPlan> TpStepPlanner::PlanHome(GroupId group, std::span<const LogicalAddr> selections,
                                           std::span<const SelectionRun> runs, std::size_t max_moves) {
  ULA_RETURN_IF_ERROR(RefuseTpKinds(KindsWithoutHome(space_.config()), "TpStepPlanner::PlanHome"));
  ULA_RETURN_IF_ERROR(RefuseIfPending());
  const bool at_home = space_.config().attention == TpAttention::kAtHome;
  if (!at_home && fabric_ != nullptr) {
    return MakeError(ErrorCode::kFailedPrecondition,
                     "PlanHome with TpAttention::kLocalBuffer needs every rank in this process: a fetch descriptor "
                     "names its home's slot, which only the home's process knows; use Step (the fabric fetches by "
                     "address)");
  }
  Scratch& sc = *scratch_;
  Status local = Classify(group, selections, runs);
  if (local) {
    std::size_t home = 0, remote = 0;
    for (const RankWork& w : sc.work) {
      home += w.home_missed.size();
      remote += w.remote_missed.size();
    }
    if (home + remote > max_moves) {
      local = MakeError(ErrorCode::kResourceExhausted,
                        fmt::format("group {}: the step needs {} descriptors ({} home misses and {} remote fetches on "
                                    "the hosted ranks) but the descriptor array has {} rows", group.value(),
                                    home + remote, home, remote, max_moves));
    }
  }
  ULA_RETURN_IF_ERROR(Agree(group, std::move(local)));
  TpAddressSpace::State& st = StateOf(space_);
  for (RankWork& w : sc.work) {
    PlanHomeFills(space_.config(), st.at(w.rank, group), w, group);
    w.buffer_targets.clear();
    w.fetch_failed.clear();
    if (!at_home) {
      ClaimBuffer(space_.config(), st.at(w.rank, group), w);
    }
  }
  sc.home_pending = true;
  StateOf(space_).dir.BeginPlan();  // the space refuses what would break it
  sc.pending_group = group;
  return Emit(group, selections, /*pending=*/!at_home, /*home_pending=*/true);
}

std::vector<TpStepPlanner::RemoteFetch> TpStepPlanner::pending_remote_fetches(std::size_t h) const {
  const Scratch& sc = *scratch_;
  ULA_CHECK(sc.home_pending && h < sc.work.size());
  const RankWork& w = sc.work[h];
  const TpAddressSpace::State& st = StateOf(space_);
  const std::uint32_t p = space_.config().num_ranks;
  const TpGroupShard& mine = st.at(w.rank, sc.pending_group);
  std::vector<RemoteFetch> fetches(w.buffer_targets.size());
  for (std::size_t i = 0; i < fetches.size(); ++i) {
    const LogicalAddr a = w.remote_missed[i];
    const Rank home = space_.HomeOf(a);
    const TpGroupShard& src = st.at(home, sc.pending_group);  // hosted: PlanHome refuses a fabric here
    const Location loc = src.home[a.value() / p];
    fetches[i] = RemoteFetch{a, home, loc, (loc.tier() == Tier::kDevice ? src.device : src.host).offset(loc.slot()),
                             w.buffer_targets[i], mine.buffer.offset(w.buffer_targets[i])};
  }
  return fetches;
}

std::span<const CopyDescriptor> TpStepPlanner::pending_home_descriptors(std::size_t h) const {
  const Scratch& sc = *scratch_;
  ULA_CHECK(sc.home_pending && h < sc.work.size());
  return sc.work[h].fills.descriptors();
}

std::vector<std::size_t> TpStepPlanner::CompleteHome(
    const std::function<std::uint8_t(std::size_t, std::size_t)>& status,
    const std::function<bool(std::size_t, std::size_t)>& fetched) {
  Scratch& sc = *scratch_;
  ULA_CHECK(sc.home_pending);
  TpAddressSpace::State& st = StateOf(space_);
  std::vector<std::size_t> published(sc.work.size());
  for (std::size_t h = 0; h < sc.work.size(); ++h) {
    RankWork& w = sc.work[h];
    TpGroupShard& sh = st.at(w.rank, sc.pending_group);
    // Complete aborts (as the DP engine path's) when an entry of the plan was freed since
    // (MissFills::Publish checks the home misses).
    for (LogicalAddr a : w.remote_missed) ULA_CHECK(st.dir.IsLive(a));
    for (std::size_t i = 0; i < w.home_status.size(); ++i) w.home_status[i] = status(h, i);
    published[h] = PublishHomeFills(space_.config(), sh, w);
    for (std::size_t i = 0; i < w.buffer_targets.size(); ++i) {
      w.fetch_failed[i] = !(fetched && fetched(h, i));
      published[h] += !w.fetch_failed[i];
    }
    PublishBuffer(sh, w);
  }
  sc.home_pending = false;
  st.dir.EndPlan();
  ULA_EXPENSIVE_CHECK(space_);
  return published;
}

TpStepPlan TpStepPlanner::Emit(GroupId group, std::span<const LogicalAddr> selections, bool pending,
                               bool home_pending) const {
  const TpAddressSpace::State& st = StateOf(space_);
  const std::uint32_t p = space_.config().num_ranks;
  const bool at_home = space_.config().attention == TpAttention::kAtHome;
  const Scratch& sc = *scratch_;
  TpStepPlan plan;
  plan.refs.resize(sc.work.size());
  plan.stats.resize(sc.work.size());
  std::unordered_map<std::uint64_t, SlotId> targets;  // pending: this step's misses -> their buffer slots
  for (std::size_t h = 0; h < sc.work.size(); ++h) {
    const RankWork& w = sc.work[h];
    const TpGroupShard& sh = st.at(w.rank, group);
    plan.ranks.push_back(w.rank);
    targets.clear();
    if (pending) {
      for (std::size_t i = 0; i < w.buffer_targets.size(); ++i) targets[w.remote_missed[i].value()] = w.buffer_targets[i];
    }
    if (home_pending) {
      for (std::size_t i = 0; i < w.home_targets.size(); ++i) targets[w.home_missed[i].value()] = w.home_targets[i];
    }
    auto& refs = plan.refs[h];
    refs.resize(selections.size());
    for (std::size_t j = 0; j < selections.size(); ++j) {
      const LogicalAddr a = selections[j];
      if (a.value() % p == w.rank.value()) {
        const auto t = home_pending ? targets.find(a.value()) : targets.end();
        refs[j] = TpReadRef{TpReadRef::Source::kShard, t != targets.end() ? t->second : sh.home[a.value() / p].slot(),
                            w.rank};
      } else if (at_home) {
        refs[j] = TpReadRef{TpReadRef::Source::kElsewhere, SlotId::Invalid(), w.rank};
      } else if (auto t = targets.find(a.value()); t != targets.end()) {
        refs[j] = TpReadRef{TpReadRef::Source::kBuffer, t->second, w.rank};
      } else {
        auto b = sh.buffered.find(a.value());
        refs[j] = TpReadRef{TpReadRef::Source::kBuffer, b == sh.buffered.end() ? SlotId::Invalid() : b->second, w.rank};
      }
    }
    plan.stats[h] = w.stats;
  }
  return plan;
}

}  // namespace ula
