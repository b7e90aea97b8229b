// TpVerifier (src/verify/tp_verifier.h): a seeded random workload through TP mode with a
// shadow of every entry's bytes. Every process of an MPI run draws the same random
// numbers, so the directory calls and selections agree across ranks by construction.
#include "verify/tp_verifier.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <optional>
#include <random>
#include <unordered_set>

#include "ula/backend.h"
#include "backend/fault_backend.h"
#include "tp/fault_fabric.h"
#include "ula/tp_home_attention.h"
#include "ula/reference_attention.h"
#include "ula/tp_fabric.h"
#include "backend/copy_publish.h"
#include "space/space_access.h"
#include "space/tp_state.h"
#include "step/device_io.h"
#include "ula/device_step.h"
#include "ula/tp_step_planner.h"
#include "config/model_kinds.h"
#include "verify/kind_model.h"
#include "verify/step_rows.h"
#include "verify/verifier_core.h"

namespace ula {

std::uint32_t TpVerifierConfig::buffer_slots() const {
  if (attention == TpAttention::kAtHome) return 0;
  return buffer_slots_per_group != 0 ? buffer_slots_per_group : 2 * max_batch * queries_per_request * top_k;
}

Status TpVerifierConfig::Validate() const {
  auto bad = [](std::string m) { return MakeError(ErrorCode::kInvalidArgument, "TpVerifierConfig." + m); };
  if (num_ranks == 0) return bad("num_ranks must be > 0");
  if (cuda && form != PlannerForm::kDevice) {
    return bad(fmt::format("cuda: the CUDA form is the device step's; form is {}", PlannerFormName(form)));
  }
  if (num_groups == 0) return bad("num_groups must be > 0");
  if (entry_bytes < 32 || entry_bytes % 4 != 0) return bad("entry_bytes must be a multiple of 4, >= 32 (float32 entries)");
  if (top_k == 0 || max_batch == 0 || queries_per_request == 0) return bad("top_k, max_batch, queries_per_request must be > 0");
  if (device_slots_per_group < top_k * queries_per_request) {
    return bad(fmt::format("device_slots_per_group = {}: must hold one request's step ({})", device_slots_per_group,
                           top_k * queries_per_request));
  }
  if (attention == TpAttention::kAtHome && buffer_slots_per_group != 0) {
    return bad(fmt::format("buffer_slots_per_group = {}: attention at home keeps no local buffer", buffer_slots_per_group));
  }
  if (attention == TpAttention::kLocalBuffer && buffer_slots() < top_k * queries_per_request) {
    return bad(fmt::format("buffer_slots_per_group = {}: must hold one request's step ({})", buffer_slots(),
                           top_k * queries_per_request));
  }
  if (copy_threads < 0) return bad("copy_threads must be >= 0");
  if (initial_requests > verify_internal::kMaxLiveRequests) {
    return bad(fmt::format("initial_requests = {}: at most {} (the live cap)", initial_requests,
                           verify_internal::kMaxLiveRequests));
  }
  if (!(fault_rate >= 0 && fault_rate <= 1)) return bad(fmt::format("fault_rate = {}: must be in [0, 1]", fault_rate));
  if (share_percent > 100) return bad(fmt::format("share_percent = {}: must be in [0, 100]", share_percent));
  if (draft_reject_percent > 100) return bad(fmt::format("draft_reject_percent = {}: must be in [0, 100]", draft_reject_percent));
  if (reserve_rounds && !stable_new_entries) return bad("reserve_rounds: ReserveRound is the engine path's: needs stable_new_entries");
  if (model && attention != TpAttention::kAtHome) {
    return bad(fmt::format("attention = local_buffer: the TP space of model '{}' holds kinds, and a space with kinds "
                           "runs attention at home only (the local buffer would copy C4 entries onto other ranks; "
                           "docs/ARCHITECTURE.md, \"Kinds under TP\")", model->name));
  }
  if (model && form == PlannerForm::kDevice) {
    return bad(fmt::format("form = device: the device step over a TP space with kinds is not built (model '{}'; "
                           "docs/ARCHITECTURE.md, \"Kinds under TP\"): use the host or engine form", model->name));
  }
  if (model && share_percent > 0) {
    return bad(fmt::format("share_percent = {}: the space of model '{}' holds kinds, and a space with kinds refuses "
                           "ShareInto (kUnsupported: adopted C4 entries would come without their tokens' other kinds)",
                           share_percent, model->name));
  }
  if (form == PlannerForm::kDevice && attention != TpAttention::kAtHome) {
    return bad("form = device: the TP device step covers attention at home only (the local buffer's remote phase "
               "is not a kernel yet)");
  }
  return Ok();
}

namespace {

// Merged vs reference attention, relative to 1 + |reference| (float32 sums in another
// order; the values are convex combinations of entries in [-1, 1]).
constexpr double kAttentionTolerance = 1e-5;

class TpVerifier : public verify_internal::VerifierCore<TpVerifier, TpVerifierConfig, TpVerifierReport> {
  using Core = verify_internal::VerifierCore<TpVerifier, TpVerifierConfig, TpVerifierReport>;
  friend Core;

 public:
  // faults / fault_fabric: the decorators over backend and fabric when cfg.fault_rate > 0
  // (the space moves through `faults`; `fabric` is then `fault_fabric` itself).
  TpVerifier(const TpVerifierConfig& cfg, TpFabric* fabric, std::unique_ptr<Backend> backend,
             std::unique_ptr<FaultInjectingBackend> faults, FaultInjectingFabric* fault_fabric,
             std::unique_ptr<TpAddressSpace> space)
      : Core(cfg), fabric_(fabric), backend_(std::move(backend)), faults_(std::move(faults)),
        fault_fabric_(fault_fabric), space_(std::move(space)),
        // With faults the hosted ranks step on one thread: the decorator's dice are then
        // drawn in a fixed order, so that the seed reproduces every fault.
        planner_(*space_, fabric, {.parallel_ranks = cfg.parallel_ranks && cfg.fault_rate == 0}) {
    Arm(false);  // armed only around planner steps
    const std::uint32_t values = cfg.entry_bytes / 4;
    // At home: 6 heads, so that 4 and 8 ranks own uneven head ranges (some none).
    const std::uint32_t heads = cfg.attention == TpAttention::kAtHome ? 6 : 2;
    mla_ = MlaShape{.num_heads = heads, .kv_lora_rank = values - 4, .rope_dim = 4, .softmax_scale = 0.125f};
    const TpConfig& tc = space_->config();
    if (!tc.kinds.empty()) {
      kinds_ = std::make_unique<verify_internal::KindModel>(tc.kinds, tc.page_tokens, tc.num_ranks);
    }
  }

  TpVerifierReport Finish() {
    TpVerifierReport r = Run();
    if (faults_) r.faults_injected += faults_->stats().injected;
    if (fault_fabric_) r.faults_injected += fault_fabric_->stats().injected;
    if (kinds_) {
      const auto& c = kinds_->counts();
      r.kind_pages_checked = c.pages_checked;
      r.c4_made = c.c4_made;
      r.c4_freed = c.c4_freed;
      r.c128_made = c.c128_made;
      r.ring_blocks_freed = c.ring_blocks_freed;
      r.rollbacks_refused = c.rollbacks_refused;
    }
    return r;
  }

 private:
  void Arm(bool armed) {
    if (faults_) faults_->set_armed(armed);
    if (fault_fabric_) fault_fabric_->set_armed(armed);
  }
  bool injecting() const { return faults_ != nullptr; }

  // After a step failed with kIo (TpStepPlanner::Step's documented state), on every hosted
  // rank: each selected entry that the rank would read here — homed here and on device, or
  // (local buffers) buffered here — holds its shadow bytes at that slot, else it was
  // published early; every live entry homed here reads back its shadow, else it is lost;
  // the invariants hold.
  void CheckAfterFailedStep(GroupId g, std::span<const LogicalAddr> sel) {
    std::unordered_set<std::uint64_t> early;  // (rank, address) published without bytes
    auto key = [](Rank r, LogicalAddr a) { return (std::uint64_t{r.value()} << 32) | a.value(); };
    for (Rank h : space_->hosted_ranks()) {
      for (LogicalAddr a : sel) {
        if (early.contains(key(h, a))) continue;
        std::optional<TpReadRef> ref;
        if (space_->HomeOf(a) == h) {
          auto loc = space_->Lookup(a, g);
          if (!loc) {
            Fail(report_.invariant_failures, "failed step: Lookup: " + loc.error().ToString());
            continue;
          }
          if (loc->tier() == Tier::kDevice) ref = TpReadRef{TpReadRef::Source::kShard, loc->slot(), h};
        } else if (cfg_.attention == TpAttention::kLocalBuffer) {
          auto slot = space_->BufferSlot(h, a, g);
          if (!slot) {
            Fail(report_.invariant_failures, "failed step: BufferSlot: " + slot.error().ToString());
            continue;
          }
          if (*slot) ref = TpReadRef{TpReadRef::Source::kBuffer, **slot, h};
        }
        if (!ref) continue;  // on host (read back below) or not buffered: nothing published
        ++report_.entries_checked;
        const std::byte* got = space_->RefData(h, g, *ref);
        if (got == nullptr || std::memcmp(got, Shadow(a, g.value()), cfg_.entry_bytes) != 0) {
          early.insert(key(h, a));
          Fail(report_.early_publishes,
               fmt::format("failed step: rank {} group {} address {}: published in its {} at slot {} without its bytes",
                           h.value(), g.value(), a.value(),
                           ref->source == TpReadRef::Source::kShard ? "device pool" : "local buffer",
                           ref->slot.value()));
        }
      }
    }
    std::vector<std::byte> buf(cfg_.entry_bytes);
    for (const Request& r : requests_) {
      for (LogicalAddr a : r.addrs) {
        if (!HomeHosted(a)) continue;
        for (std::uint32_t gg = 0; gg < cfg_.num_groups; ++gg) {
          if (gg == g.value() && early.contains(key(space_->HomeOf(a), a))) continue;  // counted above
          ++report_.entries_checked;
          if (!space_->Read(a, GroupId(static_cast<std::uint16_t>(gg)), buf) ||
              std::memcmp(buf.data(), Shadow(a, gg), cfg_.entry_bytes) != 0) {
            Fail(report_.entries_lost,
                 fmt::format("failed step: address {} group {} (home rank {}) no longer reads its bytes", a.value(), gg,
                             space_->HomeOf(a).value()));
          }
        }
      }
    }
    CheckInvariants("failed step");
  }

  static constexpr verify_internal::OpMix kOpMix{.arrive = 8, .decode = 28, .rewrite = 34, .step = 88, .finish = 95};

  // --- the strategy's verbs (verifier_core.h) ---
  Rank PickRank() { return Rank(0); }  // TP: a request spans every rank (a mod P)
  Status AddRequest(RequestId id, Rank) {
    Status s = space_->AddRequest(id);
    if (s && kinds_) kinds_->Added(id);
    return s;
  }
  // With kinds, n is tokens (verifier_core.h, AllocateTokens).
  Result<std::vector<LogicalAddr>> Allocate(RequestId id, std::uint32_t n) {
    if (!kinds_) return space_->Allocate(id, n);
    return AllocateTokens(id, n);
  }
  // float32 values in [-1, 1]: the attention check reads the entries as MLA latents.
  void RandomBytes(std::span<std::byte> entry) {
    std::uniform_real_distribution<float> value(-1.0f, 1.0f);
    for (std::size_t i = 0; i + 4 <= entry.size(); i += 4) {
      const float v = value(rng_);
      std::memcpy(entry.data() + i, &v, 4);
    }
  }
  Status Write(LogicalAddr a, GroupId g, std::span<const std::byte> bytes) { return space_->Write(a, g, bytes); }
  Status Free(RequestId id) {
    Status s = space_->Free(id);
    if (s && kinds_) kinds_->Freed(id);
    return s;
  }
  Status Truncate(RequestId id, std::uint32_t length) { return space_->Truncate(id, length); }
  // --- kinds (verifier_core.h, "Kinds"; verify/kind_model.h, its rank view) ---
  bool CountsTokens() const { return kinds_ != nullptr; }
  std::uint32_t TokensPerAddress() const { return kinds_->sparse_tokens(); }
  // Every request's kinds on every rank against the model, after every op.
  void AfterOp() {
    if (kinds_) CheckEveryKind();
  }
  void CheckKindsOf(RequestId id, std::span<const LogicalAddr> addrs) {
    if (auto wrong = kinds_->Check(*space_, id, addrs)) Fail(report_.kind_failures, *wrong);
  }
  Result<RoundReservation> ReserveRound(Rank, std::span<const RoundDemand> demands) {
    if (!reserver_) {
      auto made = TpStepPlanner::Create(*space_, {.max_batch = cfg_.max_batch, .max_q_len = 1, .max_top_k = MaxRun()});
      if (!made) return std::unexpected(made.error());
      reserver_ = std::move(*made);
    }
    return reserver_->ReserveRound(demands);
  }
  bool KeepInSelection(LogicalAddr a) { return space_->IsLive(a); }
  bool Readable(LogicalAddr a) { return HomeHosted(a); }  // this process's shards only
  Status Read(LogicalAddr a, GroupId g, std::span<std::byte> out) { return space_->Read(a, g, out); }
  Status CheckSpaceInvariants() { return space_->CheckInvariants(); }
  // Sharing (verifier_core.h): one cache over the striped space (replicated like the directory).
  Status ShareInto(RequestId id, std::span<const LogicalAddr> addrs) { return space_->ShareInto(id, addrs); }
  std::uint32_t RefCount(LogicalAddr a) { return space_->RefCount(a); }
  std::uint64_t Where(LogicalAddr a) { return HomeHosted(a) ? space_->Lookup(a, GroupId(0)).value().bits() : 0; }
  SparsePrefixCache& CacheFor(Rank) { return *cache_; }
  auto StepWithFreedAddress(const Request& r, LogicalAddr freed) {
    std::vector<LogicalAddr> sel{freed};
    std::vector<SelectionRun> runs{{r.id, 1}};
    return Plan(GroupId(0), sel, runs);
  }
  // One group step through the configured form.
  Result<TpStepPlan> Plan(GroupId group, std::span<const LogicalAddr> sel, std::span<const SelectionRun> runs) {
    switch (cfg_.form) {
      case PlannerForm::kEngine: return EnginePlan(group, sel, runs);
      case PlannerForm::kDevice: return DevicePlan(group, sel, runs);
      case PlannerForm::kHost: break;
    }
    return planner_.Step(group, sel, runs);
  }

 public:
  // The form's Create refused the space (its modes or policy): the run stops with the reason.
  std::optional<Error> CreateError() {
    if (cfg_.form == PlannerForm::kEngine) {
      auto made = TpStepPlanner::Create(*space_, {.max_batch = cfg_.max_batch, .max_q_len = 1,
                                                        .max_top_k = MaxRun()}, fabric_,
                                              {.parallel_ranks = cfg_.parallel_ranks && cfg_.fault_rate == 0});
      if (!made) return made.error();
      engine_ = std::move(*made);
    }
    if (cfg_.form == PlannerForm::kDevice) {
      device_steps_.resize(std::size_t{cfg_.num_ranks} * cfg_.num_groups);
      device_config_ = {.cuda = cfg_.cuda, .max_rows = cfg_.max_batch, .max_batch = cfg_.max_batch,
                        .max_top_k = MaxRun(), .max_addresses = 1024, .max_requests = 64, .max_adopted = 1024};
      auto made = DeviceStep::Create(*space_, space_->hosted_ranks()[0], GroupId(0), device_config_);
      if (!made) return made.error();
      device_io_.resize(space_->hosted_ranks().size());
      if (Status st = EnsureIo(0, (*made)->max_descriptors()); !st) return st.error();
      device_steps_[std::size_t{space_->hosted_ranks()[0].value()} * cfg_.num_groups] = std::move(*made);
    }
    return std::nullopt;
  }

 private:
  std::uint32_t MaxRun() const { return cfg_.top_k * cfg_.queries_per_request; }

  // The engine path's refs, from its per-rank index arrays ([hosted][rows][top_k]): a shard
  // slot, a buffer slot (index_slots past device_slots), or -1 (attention at home: homed
  // elsewhere).
  TpReadRef RefOf(Rank rank, std::int32_t index) const {
    const std::uint32_t dev = space_->config().device_slots_per_group();
    if (index < 0) return TpReadRef{TpReadRef::Source::kElsewhere, SlotId::Invalid(), rank};
    const auto i = static_cast<std::uint32_t>(index);
    return i < dev ? TpReadRef{TpReadRef::Source::kShard, SlotId(i), rank}
                   : TpReadRef{TpReadRef::Source::kBuffer, SlotId(i - dev), rank};
  }

  Result<TpStepPlan> EnginePlan(GroupId group, std::span<const LogicalAddr> sel, std::span<const SelectionRun> runs) {
    ULA_RETURN_IF_ERROR(rows_.Fill(sel, runs, MaxRun()));
    const std::span<const Rank> ranks = space_->hosted_ranks();
    const std::size_t n = rows_.shape.size();
    indices_.assign(ranks.size() * n, kPadIndex);
    auto stats = engine_->Step(group, rows_.shape, rows_.requests, rows_.rows, indices_);
    if (!stats) return std::unexpected(stats.error());
    TpStepPlan plan;
    plan.ranks.assign(ranks.begin(), ranks.end());
    plan.stats = std::move(*stats);
    plan.refs.resize(ranks.size());
    for (std::size_t h = 0; h < ranks.size(); ++h) {
      plan.refs[h].resize(sel.size());
      rows_.Gather(runs, std::span<const std::int32_t>(indices_).subspan(h * n, n),
                   [&](std::size_t i, std::int32_t index) { plan.refs[h][i] = RefOf(ranks[h], index); });
    }
    return plan;
  }

  // One device step per hosted rank, agreed as an engine's all-reduce would (the maximum of
  // the ranks' verdicts), bracketed by Reload and StoreInto as docs/INTEGRATION.md says an
  // engine that changes the space between steps does.
  Result<TpStepPlan> DevicePlan(GroupId group, std::span<const LogicalAddr> sel, std::span<const SelectionRun> runs) {
    if (group.value() >= cfg_.num_groups) return MakeError(ErrorCode::kOutOfRange, "group out of range");
    ULA_RETURN_IF_ERROR(rows_.Fill(sel, runs, MaxRun()));
    const std::span<const Rank> ranks = space_->hosted_ranks();
    const std::size_t n = rows_.shape.size();
    std::vector<DeviceStep*> steps;
    for (Rank r : ranks) {
      std::unique_ptr<DeviceStep>& step = device_steps_[std::size_t{r.value()} * cfg_.num_groups + group.value()];
      const std::size_t h = steps.size();  // the hosted rank's index
      ULA_RETURN_IF_ERROR(EnsureIo(h, 0));
      Status loaded = step ? step->Reload(*space_, Stream(h))
                           : Status(MakeError(ErrorCode::kResourceExhausted, "none"));
      while (!loaded && loaded.error().code() == ErrorCode::kResourceExhausted) {  // outgrown: larger maxima
        if (step) {
          device_config_.max_addresses *= 2;
          device_config_.max_requests *= 2;
          device_config_.max_adopted *= 2;
        }
        auto made = DeviceStep::Create(*space_, r, group, device_config_);
        if (made) {
          step = std::move(*made);
          loaded = Ok();
        } else if (made.error().code() == ErrorCode::kResourceExhausted) {
          step = nullptr;
          device_config_.max_addresses *= 2;
          device_config_.max_requests *= 2;
          device_config_.max_adopted *= 2;
        } else {
          loaded = std::unexpected(made.error());
        }
      }
      if (!loaded) return std::unexpected(loaded.error());
      steps.push_back(step.get());
    }
    for (std::size_t h = 0; h < ranks.size(); ++h) ULA_RETURN_IF_ERROR(EnsureIo(h, steps[h]->max_descriptors()));
    const std::size_t hosted = ranks.size();
    indices_.assign(hosted * n, kPadIndex);
    device_descs_.resize(hosted);
    device_records_.assign(hosted, StepRecord{});
    std::uint32_t agreed = 0;
    std::vector<std::uint32_t> verdicts(hosted, 0);
    std::vector<StepArrays> host_arrays(hosted), dev(hosted);
    for (std::size_t h = 0; h < hosted; ++h) {
      device_descs_[h].assign(steps[h]->max_descriptors(), CopyDescriptor{});
      host_arrays[h] = rows_.Arrays(std::span(indices_).subspan(h * n, n), device_descs_[h], &device_records_[h]);
      auto up = device_io_[h]->Upload(host_arrays[h]);  // the CUDA form's arrays on the GPU (OpenMP: these)
      if (!up) return std::unexpected(up.error());
      dev[h] = *up;
      ULA_RETURN_IF_ERROR(steps[h]->Check(dev[h], Stream(h)));
      auto v = device_io_[h]->ReadWord(steps[h]->verdict());  // the engine's all-reduce, here on the host
      if (!v) return std::unexpected(v.error());
      verdicts[h] = *v;
      agreed = std::max(agreed, verdicts[h]);
    }
    bool all_arrived = true;
    std::optional<Error> failure;
    const TpConfig& tc = space_->config();
    for (std::size_t h = 0; h < hosted; ++h) {
      auto agreed_dev = device_io_[h]->Agreed(agreed);
      if (!agreed_dev) return std::unexpected(agreed_dev.error());
      ULA_RETURN_IF_ERROR(steps[h]->Claim(*agreed_dev, Stream(h)));
      ULA_RETURN_IF_ERROR(device_io_[h]->Download(dev[h], host_arrays[h]));
      const StepRecord& rec = device_records_[h];
      std::vector<std::uint8_t> status(steps[h]->max_descriptors(), 0);
      const std::uint32_t m = rec.error == 0 ? rec.num_descriptors : 0;
      if (m > 0) {  // the engine's copies: the backend's, over the shard's pools
        const TpGroupShard& sh = StateOf(*space_).at(ranks[h], group);
        const std::size_t n_free = rec.misses - rec.evictions;
        CopyPublish cp(sh.host.arena().id, sh.device.arena().id, tc.entry_bytes, n_free, m - n_free, 1);
        for (std::uint32_t i = 0; i < m; ++i) {
          const CopyDescriptor& d = device_descs_[h][i];
          cp.Add(SlotMove{sh.host.offset(SlotId(d.src_slot)), sh.device.offset(SlotId(d.dst_slot))});
        }
        cp.Run(space_->backend());
        for (std::uint32_t i = 0; i < m; ++i) status[i] = cp.arrived(i) ? 0 : 1;
        if (!cp.all_arrived()) {
          all_arrived = false;
          if (!failure) failure = cp.Failure(fmt::format("device step of rank {} group {}", ranks[h].value(), group.value()));
        }
      }
      auto status_dev = device_io_[h]->UploadStatus(status);
      if (!status_dev) return std::unexpected(status_dev.error());
      ULA_RETURN_IF_ERROR(steps[h]->Complete(*status_dev, Stream(h)));
      ULA_RETURN_IF_ERROR(steps[h]->StoreInto(*space_, Stream(h)));
    }
    if (agreed != 0) {  // the first rank that refused names the error (TpStepPlanner's rule)
      for (std::size_t h = 0; h < hosted; ++h) {
        if (verdicts[h] != 0) {
          return MakeError(static_cast<ErrorCode>(verdicts[h] - 1),
                           fmt::format("device step of rank {} group {} refused the step", ranks[h].value(),
                                       group.value()));
        }
      }
    }
    if (!all_arrived) return std::unexpected(*failure);
    TpStepPlan plan;
    plan.ranks.assign(ranks.begin(), ranks.end());
    plan.refs.resize(hosted);
    plan.stats.resize(hosted);
    const std::uint32_t p = tc.num_ranks;
    for (std::size_t h = 0; h < hosted; ++h) {
      plan.refs[h].resize(sel.size());
      rows_.Gather(runs, std::span<const std::int32_t>(indices_).subspan(h * n, n),
                   [&](std::size_t i, std::int32_t index) { plan.refs[h][i] = RefOf(ranks[h], index); });
      std::unordered_set<std::uint32_t> elsewhere;
      for (LogicalAddr a : sel) {
        if (a.value() % p != ranks[h].value()) elsewhere.insert(a.value());
      }
      const StepRecord& rec = device_records_[h];
      StepStats& st = plan.stats[h];
      st.selections = rec.selections;
      st.elsewhere = elsewhere.size();
      st.distinct = rec.distinct + elsewhere.size();
      st.hits = rec.hits;
      st.misses = rec.misses;
      st.into_free = rec.misses - rec.evictions;
      st.evictions = rec.evictions;
      st.bytes_moved = rec.bytes_moved;
    }
    return plan;
  }

  // The hosted rank h's DeviceIo, for steps of up to max_descriptors descriptors.
  Status EnsureIo(std::size_t h, std::uint32_t max_descriptors) {
    device_io_descriptors_.resize(device_io_.size(), 0);
    if (device_io_[h] && device_io_descriptors_[h] >= max_descriptors) return Ok();
    auto made = DeviceIo::Create(device_config_.cuda,
                                 {.max_selections = std::uint64_t{device_config_.max_rows} * MaxRun(),
                                  .max_rows = device_config_.max_rows, .max_batch = device_config_.max_batch,
                                  .max_descriptors = max_descriptors});
    if (!made) return std::unexpected(made.error());
    device_io_[h] = std::move(*made);
    device_io_descriptors_[h] = max_descriptors;
    return Ok();
  }
  void* Stream(std::size_t h) const { return device_io_[h] ? device_io_[h]->stream() : nullptr; }

  bool HomeHosted(LogicalAddr a) const { return space_->Hosts(space_->HomeOf(a)); }

  // Everything observable on the hosted ranks: home locations, buffer contents, occupancy,
  // and the full-state DebugDigest (policy stamps and buckets, rounds, free lists in order).
  std::uint64_t Fingerprint() {
    std::uint64_t h = 1469598103934665603ull;
    auto mix = [&](std::uint64_t v) { h = (h ^ v) * 1099511628211ull; };
    for (const Request& r : requests_) {
      for (LogicalAddr a : r.addrs) {
        for (std::uint32_t g = 0; g < cfg_.num_groups; ++g) {
          const GroupId gid(static_cast<std::uint16_t>(g));
          if (HomeHosted(a)) mix(space_->Lookup(a, gid).value().bits());
          for (Rank q : space_->hosted_ranks()) {
            auto slot = space_->BufferSlot(q, a, gid).value();
            mix(slot ? slot->value() : 0xffffffffu);
          }
        }
      }
    }
    for (std::uint32_t q = 0; q < cfg_.num_ranks; ++q) {
      const Rank rank(static_cast<std::uint16_t>(q));
      mix(space_->NumHomed(rank));
      for (std::uint32_t g = 0; g < cfg_.num_groups; ++g) {
        const GroupId gid(static_cast<std::uint16_t>(g));
        mix(space_->NumFree(rank, gid, Tier::kDevice));
        mix(space_->NumFree(rank, gid, Tier::kHost));
        mix(space_->NumBuffered(rank, gid));
      }
    }
    mix(space_->num_live_addresses());
    mix(space_->num_requests());
    mix(space_->DebugDigest());  // what no accessor shows: policy state, rounds, free-list order
    return h;
  }

  // Checks that every hosted rank reads the shadow at its refs.
  void CheckPlan(const TpStepPlan& plan, std::uint32_t g, std::span<const LogicalAddr> sel, const char* when) {
    const GroupId gid(static_cast<std::uint16_t>(g));
    for (std::size_t h = 0; h < plan.ranks.size(); ++h) {
      for (std::size_t j = 0; j < sel.size(); ++j) {
        ++report_.entries_checked;
        const bool mine = space_->HomeOf(sel[j]) == plan.ranks[h];
        if (cfg_.attention == TpAttention::kAtHome && !mine) {
          if (plan.refs[h][j].source != TpReadRef::Source::kElsewhere) {
            Fail(report_.mismatches, fmt::format("{}: rank {} group {} address {}: homed elsewhere but not left to its home",
                                                 when, plan.ranks[h].value(), g, sel[j].value()));
          }
          continue;
        }
        const std::byte* got = space_->RefData(plan.ranks[h], gid, plan.refs[h][j]);
        if (got == nullptr || std::memcmp(got, Shadow(sel[j], g), cfg_.entry_bytes) != 0) {
          Fail(report_.mismatches, fmt::format("{}: rank {} group {} address {}: bytes at the ref differ from the shadow",
                                               when, plan.ranks[h].value(), g, sel[j].value()));
        }
      }
    }
  }

  void Record(const TpStepPlan& plan, std::uint32_t g, std::span<const LogicalAddr> sel, std::size_t n_requests) {
    const GroupId gid(static_cast<std::uint16_t>(g));
    const std::size_t per_query = sel.size() / (n_requests * cfg_.queries_per_request);
    std::vector<float> query(mla_.query_values());
    for (std::size_t i = 0; i < query.size(); ++i) query[i] = static_cast<float>((i * 37 + step_ * 11 + g) % 17) / 17.0f - 0.5f;
    for (std::size_t h = 0; h < plan.ranks.size(); ++h) {
      TpStepRecord rec{step_, static_cast<std::uint16_t>(g), plan.ranks[h].value(), plan.refs[h], {}};
      std::vector<const std::byte*> entries;
      std::vector<float> out(mla_.output_values());
      for (std::size_t r = 0; r < n_requests; ++r) {
        entries.clear();
        const std::size_t base = r * cfg_.queries_per_request * per_query;
        for (std::size_t j = 0; j < per_query; ++j) entries.push_back(space_->RefData(plan.ranks[h], gid, plan.refs[h][base + j]));
        if (!SparseMlaAttention(mla_, query, entries, out)) Fail(report_.invariant_failures, "attention refused its input");
        rec.attention.insert(rec.attention.end(), out.begin(), out.end());
      }
      report_.records.push_back(std::move(rec));
    }
  }

  // Attention at home (AttendAtHome, tp_home_attention.h): every hosted rank's partials over
  // its own shard, exchanged by head owner, merged in rank order; each rank's heads against
  // the reference over the shadow. bounds: query j reads sel[bounds[j], bounds[j + 1]).
  void CheckAttentionAtHome(const TpStepPlan& plan, std::uint32_t g, std::span<const LogicalAddr> sel,
                            std::span<const std::size_t> bounds) {
    const std::size_t n_queries = bounds.size() - 1;
    const std::size_t qv = mla_.query_values();
    std::vector<float> queries(n_queries * qv);
    for (std::size_t j = 0; j < n_queries; ++j) {
      for (std::size_t i = 0; i < qv; ++i) {
        queries[j * qv + i] = static_cast<float>((i * 37 + step_ * 11 + g * 5 + j * 3) % 17) / 17.0f - 0.5f;
      }
    }
    auto att = AttendAtHome(*space_, plan, GroupId(static_cast<std::uint16_t>(g)), mla_, queries, bounds, fabric_);
    if (!att) {
      Fail(report_.invariant_failures, "attention at home failed: " + att.error().ToString());
      return;
    }
    std::vector<float> want(mla_.output_values());
    std::vector<const std::byte*> entries;
    const std::uint32_t l = mla_.kv_lora_rank;
    for (std::size_t j = 0; j < n_queries; ++j) {
      entries.clear();
      for (std::size_t i = bounds[j]; i < bounds[j + 1]; ++i) entries.push_back(Shadow(sel[i], g));
      if (!SparseMlaAttention(mla_, std::span(queries).subspan(j * qv, qv), entries, want)) {
        Fail(report_.invariant_failures, "reference attention refused its input");
        continue;
      }
      for (std::size_t h = 0; h < att->ranks.size(); ++h) {
        const HeadRange heads = att->heads[h];
        if (heads.count() == 0) continue;
        ++report_.attention_checks;
        double worst = 0.0;
        for (std::uint32_t k = 0; k < heads.count(); ++k) {
          for (std::uint32_t d = 0; d < l; ++d) {
            const double got = att->outputs[h][(j * heads.count() + k) * l + d];
            const double ref = want[std::size_t{heads.begin + k} * l + d];
            worst = std::max(worst, std::abs(got - ref) / (1.0 + std::abs(ref)));
          }
        }
        report_.max_attention_error = std::max(report_.max_attention_error, worst);
        if (!(worst <= kAttentionTolerance)) {
          Fail(report_.attention_mismatches,
               fmt::format("step {} group {} query {} rank {}: merged attention differs from the reference by {:.3g}",
                           step_, g, j, att->ranks[h].value(), worst));
        }
      }
    }
    report_.partial_bytes_sent += att->bytes_sent;
    if (cfg_.record) {
      for (std::size_t h = 0; h < plan.ranks.size(); ++h) {
        report_.records.push_back(
            TpStepRecord{step_, static_cast<std::uint16_t>(g), plan.ranks[h].value(), plan.refs[h], att->outputs[h]});
      }
    }
  }

  void Tally(const TpStepPlan& plan) {
    const StepStats t = plan.Total();
    report_.home_swaps += t.evictions;
    report_.home_shadow_evictions += t.shadow_evictions;
    report_.home_misses += t.misses;
    report_.host_bytes += t.bytes_moved;
    report_.buffer_hits += t.buffer_hits;
    report_.remote_fetches += t.remote_fetches;
    report_.buffer_evictions += t.buffer_evictions;
    report_.left_to_home += t.elsewhere;
  }

  // One round: two sub-batches per group, both in the current round.
  void Step() {
    std::vector<Request*> batch[2];
    for (Request& r : requests_) {
      if (r.addrs.empty() || rng_() % 2 != 0) continue;
      auto& b = batch[rng_() % 2];
      if (b.size() < cfg_.max_batch) b.push_back(&r);
    }
    ++step_;
    if (!batch[0].empty() || !batch[1].empty()) ++report_.rounds;
    report_.sub_batches += !batch[0].empty() + !batch[1].empty();
    for (std::uint32_t g = 0; g < cfg_.num_groups; ++g) {
      const GroupId gid(static_cast<std::uint16_t>(g));
      std::vector<LogicalAddr> sel[2];
      std::vector<SelectionRun> runs[2];
      std::vector<std::size_t> bounds[2];
      std::optional<TpStepPlan> plans[2];
      for (int b = 0; b < 2; ++b) {
        if (batch[b].empty()) continue;
        bounds[b].push_back(0);
        for (Request* r : batch[b]) {
          const std::size_t first = sel[b].size();
          for (std::uint32_t q = 0; q < cfg_.queries_per_request; ++q) {
            Select(*r, g * cfg_.queries_per_request + q, sel[b]);
            bounds[b].push_back(sel[b].size());
          }
          runs[b].push_back(SelectionRun{r->id, static_cast<std::uint32_t>(sel[b].size() - first)});
        }
        // Equal-length per-query selections (for the attention record): only full-k requests.
        const std::uint64_t before = Fingerprint();
        const std::uint64_t kinds_before = kinds_ ? KindsDigest() : 0;
        Arm(true);
        auto plan = Plan(gid, sel[b], runs[b]);
        Arm(false);
        if (kinds_ && KindsDigest() != kinds_before) {  // the step moves C4 entries only: every kind's pages stay
          Fail(report_.kind_failures, fmt::format("a step of group {} changed a kind's page table", g));
        }
        const bool io_failed = !plan && plan.error().code() == ErrorCode::kIo;
        // Under MPI a transfer fails on one rank: the others have a plan, but the attention
        // at home is a collective the failed rank cannot join, so every rank learns it.
        const bool any_failed = injecting() && fabric_ != nullptr ? !fabric_->AllTrue(!io_failed) : io_failed;
        if (io_failed) {
          ++report_.failed_calls;
          CheckAfterFailedStep(gid, sel[b]);
          continue;
        }
        if (!plan) {
          const auto code = plan.error().code();
          if (code != ErrorCode::kResourceExhausted && code != ErrorCode::kFailedPrecondition) {
            Fail(report_.invariant_failures, "step: " + plan.error().ToString());
          } else if (Fingerprint() != before || !BytesMatchShadow()) {
            Fail(report_.invariant_failures, "a refused step changed state");
          }
          ++report_.rejected_steps;
          continue;
        }
        ++report_.steps;
        Tally(*plan);
        CheckPlan(*plan, g, sel[b], "after its step");
        if (cfg_.attention == TpAttention::kAtHome && !any_failed) CheckAttentionAtHome(*plan, g, sel[b], bounds[b]);
        plans[b] = std::move(*plan);
        CheckInvariants("step");
      }
      // The first sub-batch's entries were used in this round: still where its plan says.
      if (plans[0]) CheckPlan(*plans[0], g, sel[0], "after the next sub-batch of the round");
      if (cfg_.record && cfg_.attention == TpAttention::kLocalBuffer) {
        for (int b = 0; b < 2; ++b) {
          bool uniform = plans[b].has_value();
          for (Request* r : batch[b]) uniform = uniform && r->addrs.size() >= cfg_.top_k;
          if (uniform) Record(*plans[b], g, sel[b], batch[b].size());
        }
      }
    }
    space_->AdvanceRound();
    if (kinds_) kinds_->RoundEnded();
  }

  void BadInput() {
    std::vector<std::byte> buf(cfg_.entry_bytes);
    const LogicalAddr unknown(LogicalAddr::kInvalidValue - 1);
    const Request& front = requests_.front();
    const LogicalAddr some = front.addrs.empty() ? unknown : front.addrs[0];
    const GroupId bad_group(static_cast<std::uint16_t>(cfg_.num_groups));
    // With kinds: Allocate takes tokens, and the space's own refusals are fed too.
    const std::uint32_t per_entry = kinds_ ? kinds_->sparse_tokens() : 1;
    switch (rng_() % (kinds_ ? 9 : 6)) {
      case 0:
        ExpectRefused("write of an unknown address", ErrorCode::kNotFound,
                      [&] { return space_->Write(unknown, GroupId(0), buf); });
        break;
      case 1:
        ExpectRefused("allocation larger than all shards", ErrorCode::kResourceExhausted, [&] {
          return space_->Allocate(
              front.id, (cfg_.num_ranks * (cfg_.device_slots_per_group + cfg_.host_slots_per_group) + 1) * per_entry);
        });
        break;
      case 2:
        ExpectRefused("write to an out-of-range group", front.addrs.empty() ? ErrorCode::kOutOfRange : ErrorCode::kOutOfRange,
                      [&] { return space_->Write(some, bad_group, buf); });
        break;
      case 3: {
        // Unknown, and below 2^31 so that the engine forms' int32 selections carry it too:
        // every form must refuse it as not live (kNotFound).
        std::vector<LogicalAddr> sel{LogicalAddr(0x7ffffffeu)};
        std::vector<SelectionRun> runs{{front.id, 1}};
        ExpectRefused("step with an unknown address", ErrorCode::kNotFound,
                      [&] { return Plan(GroupId(0), sel, runs); });
        break;
      }
      case 4:
        ExpectRefused("free of an unknown request", ErrorCode::kNotFound,
                      [&] { return space_->Free(RequestId(~std::uint64_t{0} - 1)); });
        break;
      case 5:
        ExpectRefused("buffer lookup on an out-of-range rank", ErrorCode::kOutOfRange, [&] {
          return space_->BufferSlot(Rank(static_cast<std::uint16_t>(cfg_.num_ranks)), some, GroupId(0));
        });
        break;
      case 6:
      case 7: KindsBadInput(rng_() % 2); break;  // ShareInto, a Truncate past the tokens (verifier_core.h)
      default: {
        const Rank past(static_cast<std::uint16_t>(cfg_.num_ranks));
        const auto kinds = static_cast<std::uint32_t>(space_->config().kinds.size());
        if (rng_() % 2 == 0) {
          ExpectRefused("KindPagesOf of a rank out of range", ErrorCode::kOutOfRange,
                        [&] { return space_->KindPagesOf(front.id, 0, past); });
        } else {
          ExpectRefused("KindPagesOf of a kind out of range", ErrorCode::kOutOfRange,
                        [&] { return space_->KindPagesOf(front.id, kinds, Rank(0)); });
        }
        break;
      }
    }
  }

  TpFabric* fabric_;
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<FaultInjectingBackend> faults_;  // over backend_, when fault_rate > 0
  FaultInjectingFabric* fault_fabric_;             // == fabric_ under MPI with fault_rate > 0
  std::unique_ptr<TpAddressSpace> space_;
  TpStepPlanner planner_;
  std::unique_ptr<TpStepPlanner> engine_;       // kEngine
  std::vector<std::unique_ptr<DeviceStep>> device_steps_;  // kDevice: [rank][group]
  DeviceStepConfig device_config_;
  verify_internal::StepRows rows_;                    // the engine forms' rows
  std::vector<std::int32_t> indices_;                 // [hosted][rows][top_k]
  std::vector<std::vector<CopyDescriptor>> device_descs_;  // [hosted]
  std::vector<StepRecord> device_records_;            // [hosted]
  std::vector<std::unique_ptr<DeviceIo>> device_io_;  // kDevice: [hosted] the engine's side of the rank's steps
  std::vector<std::uint32_t> device_io_descriptors_;  // [hosted] the descriptors each holds
  MlaShape mla_;
  // Sharing (a TP space with kinds refuses a cache: SharePrefix is DP only).
  std::unique_ptr<SparsePrefixCache> cache_ =
      space_->config().kinds.empty() ? SparsePrefixCache::Create(*space_).value() : nullptr;
  std::unique_ptr<TpStepPlanner> reserver_;           // reserve_rounds: the admission's planner
  std::unique_ptr<verify_internal::KindModel> kinds_;  // a space with kinds: the model of every request's kinds
  std::uint64_t step_ = 0;
};

}  // namespace

namespace {

// The model's kinds over the TP space (TpVerifierConfig::model): SpaceConfigOfModel's kinds,
// pages and budgets; the shape must be the config's. Nothing changes on an error.
Status ApplyModelKinds(const TpVerifierConfig& config, TpConfig& tp) {
  AddressSpaceConfig c;
  c.num_groups = config.num_groups;
  c.entry_bytes = config.entry_bytes;
  c.row_bytes = config.entry_bytes;  // one layer a group: an entry is one C4 row
  c.device_bytes_per_rank = tp.device_bytes_per_rank;
  c.host_bytes_per_rank = tp.host_bytes_per_rank;
  c.policy = tp.policy;
  c.stable_new_entries = tp.stable_new_entries;
  auto m = SpaceConfigOfModel(*config.model, {.max_draft_tokens = config.queries_per_request - 1}, c);
  if (!m) return std::unexpected(m.error());
  if (m->num_groups != c.num_groups || m->entry_bytes != c.entry_bytes || m->row_bytes != c.row_bytes) {
    return MakeError(ErrorCode::kInvalidArgument,
                     fmt::format("TpVerifierConfig: {} groups of {} B entries; model '{}' has {} of {} in rows of {} "
                                 "(ApplyModel, one layer a group)", c.num_groups, c.entry_bytes, config.model->name,
                                 m->num_groups, m->entry_bytes, m->row_bytes));
  }
  if (m->page_tokens % config.num_ranks != 0) {
    return MakeError(ErrorCode::kInvalidArgument,
                     fmt::format("TpVerifierConfig.num_ranks = {}: with model '{}' it must divide the page's {} C4 "
                                 "entries (C4 entry i of a request on rank i mod P; docs/ARCHITECTURE.md, \"Kinds "
                                 "under TP\")", config.num_ranks, config.model->name, m->page_tokens));
  }
  tp.device_bytes_per_rank = m->device_bytes_per_rank;
  tp.host_bytes_per_rank = m->host_bytes_per_rank;
  tp.page_tokens = m->page_tokens;
  tp.kinds = m->kinds;
  return Ok();
}

}  // namespace

Result<TpVerifierReport> RunTpVerifier(const TpVerifierConfig& config, TpFabric* fabric) {
  ULA_RETURN_IF_ERROR(config.Validate());
  if (fabric != nullptr && config.form == PlannerForm::kDevice) {
    return MakeError(ErrorCode::kFailedPrecondition, "TpVerifierConfig.form = device: the verifier agrees the ranks' "
                                                     "verdicts in this process (no fabric)");
  }
  if (fabric != nullptr && config.reserve_rounds) {
    return MakeError(ErrorCode::kInvalidArgument, "TpVerifierConfig.reserve_rounds: each process would admit by its own "
                                                  "rank's room (the scheduler's all-reduce is not modelled): in-process "
                                                  "ranks only");
  }
  if (fabric != nullptr && fabric->num_ranks() != config.num_ranks) {
    return MakeError(ErrorCode::kInvalidArgument, fmt::format("TpVerifierConfig.num_ranks = {} but the fabric has {} ranks",
                                                              config.num_ranks, fabric->num_ranks()));
  }
  auto backend = MakeCpuBackend({.copy_threads = config.copy_threads});
  TpConfig tp;
  tp.num_ranks = config.num_ranks;
  tp.num_groups = config.num_groups;
  tp.entry_bytes = config.entry_bytes;
  const std::uint64_t per = std::uint64_t{config.entry_bytes} * config.num_groups;
  tp.device_bytes_per_rank = per * config.device_slots_per_group;
  tp.host_bytes_per_rank = per * config.host_slots_per_group;
  tp.buffer_bytes_per_rank = per * config.buffer_slots();
  tp.attention = config.attention;
  tp.policy = config.policy;
  tp.buffer_policy = config.policy;
  tp.host_shadows = config.host_shadows;
  tp.stable_new_entries = config.stable_new_entries;
  if (config.model) ULA_RETURN_IF_ERROR(ApplyModelKinds(config, tp));
  std::vector<Rank> hosted;
  if (fabric != nullptr) hosted.push_back(fabric->local_rank());
  // Faults: one stream per process (the ranks of an MPI run fail different transfers),
  // another for the fabric's fetches.
  std::unique_ptr<FaultInjectingBackend> faults;
  std::unique_ptr<FaultInjectingFabric> fault_fabric;
  if (config.fault_rate > 0) {
    const std::uint64_t seed = config.seed + 0x9e3779b97f4a7c15ull * (fabric ? fabric->local_rank().value() + 1u : 0u);
    auto made = MakeFaultInjectingBackend(*backend, FaultPlan{.seed = seed, .fail_fraction = config.fault_rate,
                                                              .partial = true});
    if (!made) return std::unexpected(made.error());
    faults = std::move(*made);
    if (fabric != nullptr) {
      auto f = MakeFaultInjectingFabric(*fabric, FaultPlan{.seed = seed ^ 0x5bd1e995u, .fail_fraction = config.fault_rate,
                                                            .partial = true});
      if (!f) return std::unexpected(f.error());
      fault_fabric = std::move(*f);
      fabric = fault_fabric.get();
    }
  }
  Backend& moves = faults ? static_cast<Backend&>(*faults) : *backend;
  auto space = TpAddressSpace::Create(tp, moves, hosted);
  if (!space) return std::unexpected(space.error());
  if (fabric != nullptr) ULA_RETURN_IF_ERROR(fabric->Expose(**space));
  TpVerifier verifier(config, fabric, std::move(backend), std::move(faults), fault_fabric.get(), std::move(*space));
  if (auto refused = verifier.CreateError()) {
    if (fabric != nullptr) fabric->Unexpose();
    return std::unexpected(*refused);
  }
  auto report = verifier.Finish();
  if (fabric != nullptr) fabric->Unexpose();
  return report;
}

}  // namespace ula
