#include "verify/consistency_verifier.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <unordered_set>

#include "ula/address_space.h"
#include "verify/verifier_core.h"
#include "ula/backend.h"
#include "backend/fault_backend.h"
#include "step/device_io.h"
#include "ula/device_step.h"
#include "ula/step_planner.h"
#include "backend/copy_publish.h"
#include "space/address_space_state.h"
#include "space/space_access.h"
#include "verify/engine_descriptors.h"
#include "verify/kind_model.h"
#include "verify/step_rows.h"
#include "config/model_kinds.h"

namespace ula {

Status VerifierConfig::Validate() const {
  auto bad = [](std::string m) { return MakeError(ErrorCode::kInvalidArgument, "VerifierConfig." + m); };
  if (num_ranks == 0) return bad("num_ranks must be > 0");
  if (num_groups == 0) return bad("num_groups must be > 0");
  if (entry_bytes == 0) return bad("entry_bytes must be > 0");
  if (top_k == 0) return bad("top_k must be > 0");
  if (max_batch == 0) return bad("max_batch must be > 0");
  if (queries_per_request == 0) return bad("queries_per_request must be > 0");
  if (device_slots_per_group < top_k * queries_per_request) {
    return bad(fmt::format("device_slots_per_group = {}: must hold one request's step (top_k x queries = {})",
                           device_slots_per_group, top_k * queries_per_request));
  }
  if (copy_threads < 0) return bad("copy_threads must be >= 0");
  if (!(fault_rate >= 0 && fault_rate <= 1)) return bad(fmt::format("fault_rate = {}: must be in [0, 1]", fault_rate));
  if (share_percent > 100) return bad(fmt::format("share_percent = {}: must be in [0, 100]", share_percent));
  if (group_layers == 0 || entry_bytes % group_layers != 0) {
    return bad(fmt::format("group_layers = {}: must divide entry_bytes = {}", group_layers, entry_bytes));
  }
  if (draft_reject_percent > 100) return bad(fmt::format("draft_reject_percent = {}: must be in [0, 100]", draft_reject_percent));
  if (reserve_rounds && !stable_new_entries) return bad("reserve_rounds: ReserveRound is the engine path's: needs stable_new_entries");
  if (model && share_percent > 0) {
    return bad(fmt::format("share_percent = {}: the space of model '{}' holds kinds, and a space with kinds refuses "
                           "ShareInto (kUnsupported: adopted C4 entries would come without their tokens' other kinds)",
                           share_percent, model->name));
  }
  return Ok();
}

namespace {

ModelKindsOptions KindsOptions(const VerifierConfig& config) {
  return {.max_draft_tokens = config.queries_per_request - 1};  // the verifier's drafts: the queries past the first
}

// The space config of a verifier config: the single kind, or the model's kinds.
Result<AddressSpaceConfig> SpaceConfigOf(const VerifierConfig& config) {
  AddressSpaceConfig c;
  c.num_ranks = config.num_ranks;
  c.num_groups = config.num_groups;
  c.entry_bytes = config.entry_bytes;
  const std::uint64_t per_slot = std::uint64_t{config.entry_bytes} * config.num_groups;
  c.device_bytes_per_rank = per_slot * config.device_slots_per_group;
  c.host_bytes_per_rank = per_slot * config.host_slots_per_group;
  c.policy = config.policy;
  c.host_shadows = config.host_shadows;
  c.stable_new_entries = config.stable_new_entries;
  c.row_bytes = config.entry_bytes / config.group_layers;
  if (!config.model) return c;
  auto m = SpaceConfigOfModel(*config.model, KindsOptions(config), c);
  if (!m) return std::unexpected(m.error());
  if (m->num_groups != c.num_groups || m->entry_bytes != c.entry_bytes || m->row_bytes != c.row_bytes) {
    return MakeError(ErrorCode::kInvalidArgument,
                     fmt::format("VerifierConfig: {} groups of {} B entries in rows of {} B; model '{}' has {} of {} "
                                 "in rows of {} (ApplyModel)", c.num_groups, c.entry_bytes, c.row_bytes,
                                 config.model->name, m->num_groups, m->entry_bytes, m->row_bytes));
  }
  return m;
}

}  // namespace

Status ApplyModel(VerifierConfig& config, const ModelConfig& model) {
  VerifierConfig c = config;
  c.model = model;
  AddressSpaceConfig budget;  // any budget: only the shape is read
  budget.device_bytes_per_rank = std::uint64_t{1} << 40;
  budget.host_bytes_per_rank = std::uint64_t{1} << 40;
  auto m = SpaceConfigOfModel(model, KindsOptions(c), budget);
  if (!m) return std::unexpected(m.error());
  for (std::uint32_t layers : m->group_layers) {
    if (layers != m->group_layers.front()) {
      return MakeError(ErrorCode::kInvalidArgument,
                       fmt::format("model '{}': its groups hold unequal numbers of layers; the verifier's entries "
                                   "are group_layers rows each", model.name));
    }
  }
  c.num_groups = m->num_groups;
  c.entry_bytes = m->entry_bytes;
  c.group_layers = m->group_layers.empty() ? 1 : m->group_layers.front();
  config = std::move(c);
  return Ok();
}

namespace {

class Verifier : public verify_internal::VerifierCore<Verifier, VerifierConfig, VerifierReport> {
  using Core = verify_internal::VerifierCore<Verifier, VerifierConfig, VerifierReport>;
  friend Core;

 public:
  Verifier(const VerifierConfig& cfg, std::unique_ptr<Backend> backend, std::unique_ptr<FaultInjectingBackend> faults,
           std::unique_ptr<AddressSpace> space)
      : Core(cfg), backend_(std::move(backend)), faults_(std::move(faults)), space_(std::move(space)), planner_(*space_, cfg) {
    if (faults_) faults_->set_armed(false);  // armed only around planner steps
    // Sharing's caches: a space with kinds refuses sharing by addresses (share_percent, above).
    for (std::uint32_t r = 0; space_->config().kinds.empty() && r < cfg.num_ranks; ++r) {
      caches_.push_back(SparsePrefixCache::Create(*space_, Rank(static_cast<std::uint16_t>(r))).value());
    }
    if (cfg.reserve_rounds) {
      reserver_ = StepPlanner::Create(*space_, {.max_batch = cfg.max_batch, .max_q_len = 1,
                                                .max_top_k = cfg.top_k * cfg.queries_per_request}).value();
    }
    if (!space_->config().kinds.empty()) {
      kinds_ = std::make_unique<verify_internal::KindModel>(space_->config().kinds, space_->config().page_tokens);
    }
  }

  // The form's Create refused the space (its modes or policy): the run stops with the reason.
  std::optional<Error> CreateError() const { return planner_.create_error; }

  VerifierReport Finish() {
    VerifierReport r = Run();
    if (faults_) r.faults_injected = faults_->stats().injected;
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
  static constexpr verify_internal::OpMix kOpMix{.arrive = 8, .decode = 30, .rewrite = 36, .step = 90, .finish = 96};

  // --- the strategy's verbs (verifier_core.h) ---
  Rank PickRank() { return Rank(static_cast<std::uint16_t>(rng_() % cfg_.num_ranks)); }
  Status AddRequest(RequestId id, Rank rank) {
    Status s = space_->AddRequest(id, rank);
    if (s && kinds_) kinds_->Added(id);
    return s;
  }
  // With kinds, n is tokens (verifier_core.h, AllocateTokens).
  Result<std::vector<LogicalAddr>> Allocate(RequestId id, std::uint32_t n) {
    if (!kinds_) return space_->Allocate(id, n);
    return AllocateTokens(id, n);
  }
  void RandomBytes(std::span<std::byte> entry) {
    for (std::byte& b : entry) b = static_cast<std::byte>(rng_());
  }
  Status Write(LogicalAddr a, GroupId g, std::span<const std::byte> bytes) { return space_->Write(a, g, bytes); }
  Status Free(RequestId id) {
    Status s = space_->Free(id);
    if (s && kinds_) kinds_->Freed(id);
    return s;
  }

  // --- kinds (verifier_core.h, "Kinds"; verify/kind_model.h) ---
  bool CountsTokens() const { return kinds_ != nullptr; }
  std::uint32_t TokensPerAddress() const { return kinds_->sparse_tokens(); }
  // Every request's kinds against the model, after every op.
  void AfterOp() {
    if (kinds_) CheckEveryKind();
  }
  void CheckKindsOf(RequestId id, std::span<const LogicalAddr> addrs) {
    if (auto wrong = kinds_->Check(*space_, id, addrs)) Fail(report_.kind_failures, *wrong);
  }
  Status Truncate(RequestId id, std::uint32_t length) { return space_->Truncate(id, length); }
  Result<RoundReservation> ReserveRound(Rank rank, std::span<const RoundDemand> demands) const {
    return reserver_->ReserveRound(rank, demands);
  }
  bool KeepInSelection(LogicalAddr) { return true; }
  bool Readable(LogicalAddr) { return true; }
  Status Read(LogicalAddr a, GroupId g, std::span<std::byte> out) { return space_->Read(a, g, out); }
  Status CheckSpaceInvariants() { return space_->CheckInvariants(); }
  // Whether device slot `slot` of (rank, g) holds `want` in every layer's row.
  bool DeviceHolds(Rank rank, GroupId g, SlotId slot, const std::byte* want) const {
    const std::uint32_t row = cfg_.entry_bytes / cfg_.group_layers;
    for (std::uint32_t l = 0; l < cfg_.group_layers; ++l) {
      const auto layer = space_->DeviceLayerBytes(rank, g, l);
      if (std::size_t{slot.value() + 1} * row > layer.size()) return false;
      if (std::memcmp(layer.data() + std::size_t{slot.value()} * row, want + l * row, row) != 0) return false;
    }
    return true;
  }
  // Sharing (verifier_core.h).
  Status ShareInto(RequestId id, std::span<const LogicalAddr> addrs) { return space_->ShareInto(id, addrs); }
  std::uint32_t RefCount(LogicalAddr a) { return space_->RefCount(a); }
  std::uint64_t Where(LogicalAddr a) {
    auto loc = space_->Lookup(a, GroupId(0));
    return loc ? loc->bits() : 0;
  }
  SparsePrefixCache& CacheFor(Rank r) { return *caches_[r.value()]; }
  auto StepWithFreedAddress(const Request& r, LogicalAddr freed) {
    std::vector<LogicalAddr> sel{freed};
    std::vector<SelectionRun> runs{{r.id, 1}};
    std::vector<SlotId> out(1);
    return planner_.Step(StepInput{r.rank, GroupId(0), sel, runs}, out);
  }
  // A fingerprint of the placement: every live entry's location and the pools' occupancy,
  // and the full-state DebugDigest (policy stamps and buckets, rounds, free lists in order).
  // Bytes are checked against the shadow instead (BytesMatchShadow).
  std::uint64_t Fingerprint() {
    std::uint64_t h = 1469598103934665603ull;
    auto mix = [&](std::uint64_t v) { h = (h ^ v) * 1099511628211ull; };
    for (const Request& r : requests_) {
      for (LogicalAddr a : r.addrs) {
        for (std::uint32_t g = 0; g < cfg_.num_groups; ++g) mix(space_->Lookup(a, GroupId(g)).value().bits());
      }
    }
    for (std::uint32_t r = 0; r < cfg_.num_ranks; ++r) {
      for (std::uint32_t g = 0; g < cfg_.num_groups; ++g) {
        mix(space_->NumFree(Rank(r), GroupId(g), Tier::kDevice));
        mix(space_->NumFree(Rank(r), GroupId(g), Tier::kHost));
      }
    }
    mix(space_->num_live_addresses());
    mix(space_->num_requests());
    mix(space_->DebugDigest());  // what no accessor shows: policy state, rounds, free-list order
    return h;
  }

  // After a step failed with kIo (its documented state, step_planner.h): every selected
  // entry that the table now puts on device holds its shadow bytes there, and every live
  // entry reads back its shadow; the invariants hold.
  void CheckAfterFailedStep(GroupId g, std::span<const LogicalAddr> selections) {
    std::unordered_set<std::uint32_t> early;
    for (LogicalAddr a : selections) {
      auto loc = space_->Lookup(a, g);
      if (!loc || loc->tier() != Tier::kDevice || early.contains(a.value())) continue;
      if (!DeviceHolds(loc->rank(), g, loc->slot(), Shadow(a, g.value()))) {
        early.insert(a.value());
        Fail(report_.early_publishes, fmt::format("failed step: address {} group {} published at device slot {} "
                                                  "without its bytes", a.value(), g.value(), loc->slot().value()));
      }
    }
    std::vector<std::byte> buf(cfg_.entry_bytes);
    for (const Request& r : requests_) {
      for (LogicalAddr a : r.addrs) {
        for (std::uint32_t gg = 0; gg < cfg_.num_groups; ++gg) {
          ++report_.entries_checked;
          if (gg == g.value() && early.contains(a.value())) continue;
          if (!space_->Read(a, GroupId(static_cast<std::uint16_t>(gg)), buf) ||
              std::memcmp(buf.data(), Shadow(a, gg), cfg_.entry_bytes) != 0) {
            Fail(report_.entries_lost, fmt::format("failed step: address {} group {} no longer reads its bytes",
                                                   a.value(), gg));
          }
        }
      }
    }
    CheckInvariants("failed step");
  }

  void Step() {
    const Rank rank(static_cast<std::uint16_t>(rng_() % cfg_.num_ranks));
    std::vector<Request*> batch;
    for (Request& r : requests_) {
      if (r.rank == rank && !r.addrs.empty() && batch.size() < cfg_.max_batch && rng_() % 2 == 0) batch.push_back(&r);
    }
    if (batch.empty()) return;
    std::vector<LogicalAddr> selections;
    std::vector<SelectionRun> runs;
    std::vector<SlotId> slots;
    std::vector<std::byte> buf(cfg_.entry_bytes);
    for (std::uint32_t g = 0; g < cfg_.num_groups; ++g) {
      selections.clear();
      runs.clear();
      for (Request* r : batch) {
        const std::size_t first = selections.size();
        for (std::uint32_t q = 0; q < cfg_.queries_per_request; ++q) Select(*r, g * cfg_.queries_per_request + q, selections);
        runs.push_back(SelectionRun{r->id, static_cast<std::uint32_t>(selections.size() - first)});
      }
      slots.assign(selections.size(), SlotId());
      const std::uint64_t before = Fingerprint();
      const std::uint64_t kinds_before = kinds_ ? KindsDigest() : 0;
      if (faults_) faults_->set_armed(true);
      auto stats = planner_.Step(StepInput{rank, GroupId(g), selections, runs}, slots);
      if (faults_) faults_->set_armed(false);
      if (kinds_ && KindsDigest() != kinds_before) {  // the step moves C4 rows only: every kind's pages stay
        Fail(report_.kind_failures, fmt::format("a step of group {} changed a kind's page table", g));
      }
      if (!stats && stats.error().code() == ErrorCode::kIo) {
        ++report_.failed_calls;
        CheckAfterFailedStep(GroupId(g), selections);
        continue;
      }
      if (!stats) {
        if (stats.error().code() != ErrorCode::kResourceExhausted) {
          Fail(report_.invariant_failures, "step: " + stats.error().ToString());
        } else if (Fingerprint() != before || !BytesMatchShadow()) {
          Fail(report_.invariant_failures, "a refused step changed state");
        }
        ++report_.rejected_steps;
        continue;
      }
      ++report_.steps;
      report_.hits += stats->hits;
      report_.fetches += stats->into_free;
      report_.swaps += stats->evictions;
      report_.shadow_evictions += stats->shadow_evictions;
      for (std::size_t i = 0; i < selections.size(); ++i) {
        ++report_.entries_checked;
        if (!DeviceHolds(rank, GroupId(g), slots[i], Shadow(selections[i], g))) {
          Fail(report_.mismatches, fmt::format("group {} address {} at device slot {}: bytes differ from the shadow", g,
                                               selections[i].value(), slots[i].value()));
        }
        auto loc = space_->Lookup(selections[i], GroupId(g));
        if (!loc || loc->tier() != Tier::kDevice || loc->slot() != slots[i]) {
          Fail(report_.mismatches, fmt::format("address {}: table does not say device slot {}", selections[i].value(),
                                               slots[i].value()));
        }
      }
      // A sample of entries anywhere, through Read().
      for (int i = 0; i < 4; ++i) {
        const Request& r = requests_[rng_() % requests_.size()];
        if (r.addrs.empty()) continue;
        const LogicalAddr a = r.addrs[rng_() % r.addrs.size()];
        ++report_.entries_checked;
        if (!space_->Read(a, GroupId(g), buf) || std::memcmp(buf.data(), Shadow(a, g), cfg_.entry_bytes) != 0) {
          Fail(report_.mismatches, fmt::format("Read of address {} group {} differs from the shadow", a.value(), g));
        }
      }
      CheckInvariants("step");
    }
    space_->AdvanceRound();
    if (kinds_) kinds_->RoundEnded();
  }

  void BadInput() {
    std::vector<std::byte> buf(cfg_.entry_bytes);
    const LogicalAddr unknown(LogicalAddr::kInvalidValue - 1);
    // With kinds: Allocate takes tokens, and the space's own refusals are fed too.
    const std::uint32_t per_entry = kinds_ ? kinds_->sparse_tokens() : 1;
    switch (rng_() % (kinds_ ? 8 : 5)) {
      case 0:
        ExpectRefused("read of an unknown address", ErrorCode::kNotFound,
                      [&] { return space_->Read(unknown, GroupId(0), buf); });
        break;
      case 1:
        ExpectRefused("allocation larger than the rank", ErrorCode::kResourceExhausted, [&] {
          return space_->Allocate(requests_.front().id,
                                  (cfg_.device_slots_per_group + cfg_.host_slots_per_group + 1) * per_entry);
        });
        break;
      case 2:
        ExpectRefused("write to an out-of-range group", ErrorCode::kOutOfRange, [&] {
          return space_->Write(requests_.front().addrs.empty() ? unknown : requests_.front().addrs[0],
                               GroupId(static_cast<std::uint16_t>(cfg_.num_groups)), buf);
        });
        break;
      case 3: {
        // Unknown, and below 2^31 so that the engine forms' int32 selections carry it too:
        // every form must refuse it as not live (kNotFound).
        std::vector<LogicalAddr> sel{LogicalAddr(0x7ffffffeu)};
        std::vector<SelectionRun> runs{{requests_.front().id, 1}};
        std::vector<SlotId> out(1);
        ExpectRefused("step with an unknown address", ErrorCode::kNotFound,
                      [&] { return planner_.Step(StepInput{Rank(0), GroupId(0), sel, runs}, out); });
        break;
      }
      case 4:
        ExpectRefused("free of an unknown request", ErrorCode::kNotFound,
                      [&] { return space_->Free(RequestId(~std::uint64_t{0} - 1)); });
        break;
      default: {
        const std::uint64_t which = rng_() % 3;  // the space's refusals (verifier_core.h), a kind out of range
        if (which < 2) {
          KindsBadInput(which);
        } else {
          const Request& r = requests_.front();
          ExpectRefused("KindPagesOf of a kind out of range", ErrorCode::kOutOfRange, [&] {
            return space_->KindPagesOf(r.id, static_cast<std::uint32_t>(space_->config().kinds.size()));
          });
        }
        break;
      }
    }
  }

  std::unique_ptr<Backend> backend_;
  std::unique_ptr<FaultInjectingBackend> faults_;  // over backend_, when fault_rate > 0
  std::unique_ptr<AddressSpace> space_;
  // The step under test, in the form VerifierConfig::form names, behind the library path's
  // signature (StepPlanner::Step): selections in runs in, a device slot per selection out.
  struct Planner {
    Planner(AddressSpace& space, const VerifierConfig& cfg)
        : space(space), form(cfg.form), max_top_k(cfg.top_k * cfg.queries_per_request) {
      if (form == PlannerForm::kEngine) {  // the engine layout's path: a planner with an engine config
        auto made = StepPlanner::Create(space, {.max_batch = cfg.max_batch, .max_q_len = 1, .max_top_k = max_top_k});
        if (made) host = std::move(*made);
        else create_error = made.error();
      } else {
        host = std::make_unique<StepPlanner>(space);
      }
      if (cfg.cuda && form != PlannerForm::kDevice) {
        create_error = Error(ErrorCode::kInvalidArgument,
                             fmt::format("VerifierConfig.cuda: the CUDA form is the device step's; form is {}",
                                         PlannerFormName(form)));
        return;
      }
      if (form == PlannerForm::kDevice) {
        devices.resize(std::size_t{cfg.num_ranks} * cfg.num_groups);
        generations.resize(devices.size(), 0);
        device_config = {.cuda = cfg.cuda, .max_rows = cfg.max_batch, .max_batch = cfg.max_batch,
                         .max_top_k = max_top_k, .max_addresses = 1024, .max_requests = 64, .max_adopted = 1024};
        // Create's refusals (policy, modes, the CUDA form's) come at once, not at the first step.
        auto made = DeviceStep::Create(space, Rank(0), GroupId(0), device_config);
        if (made) devices[0] = std::move(*made);
        else create_error = made.error();
        if (made) {
          if (Status st = EnsureIo(devices[0]->max_descriptors()); !st) create_error = st.error();
        }
      }
    }
    // The engine's side of the device steps (their arrays in the step's memory, the stream),
    // for steps of up to `max_descriptors` descriptors.
    Status EnsureIo(std::uint32_t max_descriptors) {
      if (io && io_descriptors >= max_descriptors) return Ok();
      auto made = DeviceIo::Create(device_config.cuda,
                                   {.max_selections = std::uint64_t{device_config.max_rows} * max_top_k,
                                    .max_rows = device_config.max_rows, .max_batch = device_config.max_batch,
                                    .max_descriptors = max_descriptors});
      if (!made) return std::unexpected(made.error());
      io = std::move(*made);
      io_descriptors = max_descriptors;
      return Ok();
    }
    Result<StepStats> Step(const StepInput& in, std::span<SlotId> out) {
      switch (form) {
        case PlannerForm::kHost: return host->Step(in, out);
        case PlannerForm::kEngine: return EngineStep(in, out);
        case PlannerForm::kDevice: return DeviceStepOf(in, out);
      }
      return MakeError(ErrorCode::kInternal, "unknown planner form");
    }

    Status ToRows(const StepInput& in) {
      ULA_RETURN_IF_ERROR(rows.Fill(in.selections, in.runs, max_top_k));
      indices.assign(rows.shape.size(), kPadIndex);
      return Ok();
    }
    void FromRows(const StepInput& in, std::span<SlotId> out) const {
      rows.Gather(in.runs, indices, [&](std::size_t i, std::int32_t index) { out[i] = SlotId(static_cast<std::uint32_t>(index)); });
    }

    // One engine-path step of (rank, group), as an engine runs it: Plan, the descriptors
    // (checked, then run on the space's pools), Complete with their statuses.
    Result<StepStats> EngineStep(const StepInput& in, std::span<SlotId> out) {
      ULA_RETURN_IF_ERROR(ToRows(in));
      descriptors.assign(host->max_descriptors(), CopyDescriptor{});
      auto planned = host->Plan(in.rank, in.group, rows.shape, rows.requests, rows.rows, indices, descriptors);
      if (!planned) return std::unexpected(planned.error());
      const auto described = std::span<const CopyDescriptor>(descriptors).first(planned->num_descriptors);
      status.assign(described.size(), kDescriptorDone);
      const auto misdescribed = verify_internal::MisdescribedRows(space, in.rank, in.group, described, "engine");
      // A descriptor that does not name its entry's rows fails the step: nothing published.
      if (misdescribed) std::fill(status.begin(), status.end(), kDescriptorFailed);
      Status ran = misdescribed || described.empty()
                       ? Ok()
                       : verify_internal::RunDescriptors(space, in.rank, in.group, described, status);
      auto report = host->Complete(planned->fence, status);
      if (!report) return std::unexpected(report.error());
      if (misdescribed) return MakeError(ErrorCode::kInternal, *misdescribed);
      if (!ran) return std::unexpected(ran.error());
      FromRows(in, out);
      return planned->stats;
    }

    // One device step of (rank, group), bracketed as docs/INTEGRATION.md says an engine that
    // changes the space between steps does: Reload, Plan, the copies, Complete, StoreInto.
    Result<StepStats> DeviceStepOf(const StepInput& in, std::span<SlotId> out) {
      const AddressSpaceConfig& sc = space.config();
      if (in.rank.value() >= sc.num_ranks || in.group.value() >= sc.num_groups) {
        return MakeError(ErrorCode::kOutOfRange, "rank or group out of range");
      }
      ULA_RETURN_IF_ERROR(ToRows(in));
      const std::size_t k = std::size_t{in.rank.value()} * sc.num_groups + in.group.value();
      std::unique_ptr<DeviceStep>& step = devices[k];
      Status loaded = step ? step->Reload(space, io->stream())
                           : Status(MakeError(ErrorCode::kResourceExhausted, "not created"));
      // Outgrown (or none yet): re-create at the maxima, doubled when this step already had
      // them (the maxima are shared: the other groups' steps outgrow them together).
      auto grow = [&] {
        device_config.max_addresses *= 2;
        device_config.max_requests *= 2;
        device_config.max_adopted *= 2;
        ++device_generation;
      };
      while (!loaded && loaded.error().code() == ErrorCode::kResourceExhausted) {
        if (step && generations[k] == device_generation) grow();
        auto made = DeviceStep::Create(space, in.rank, in.group, device_config);
        if (made) {
          step = std::move(*made);
          generations[k] = device_generation;
          loaded = Ok();
        } else if (made.error().code() == ErrorCode::kResourceExhausted) {
          step = nullptr;
          grow();
        } else {
          loaded = std::unexpected(made.error());
        }
      }
      if (!loaded) return std::unexpected(loaded.error());
      ULA_RETURN_IF_ERROR(EnsureIo(step->max_descriptors()));
      void* const stream = io->stream();
      descriptors.assign(step->max_descriptors(), CopyDescriptor{});
      StepRecord record;
      const StepArrays arrays = rows.Arrays(indices, descriptors, &record);
      auto dev = io->Upload(arrays);  // the CUDA form's arrays on the GPU (OpenMP: these)
      if (!dev) return std::unexpected(dev.error());
      ULA_RETURN_IF_ERROR(step->Plan(*dev, stream));
      ULA_RETURN_IF_ERROR(io->Download(*dev, arrays));
      status.assign(step->max_descriptors(), 0);
      // Complete with the engine's statuses, in the step's memory.
      auto complete = [&]() -> Status {
        auto st = io->UploadStatus(status);
        if (!st) return std::unexpected(st.error());
        return step->Complete(*st, stream);
      };
      const std::uint32_t n = record.error == 0 ? record.num_descriptors : 0;
      const auto described = std::span<const CopyDescriptor>(descriptors).first(n);
      // The engine's copies (verify/engine_descriptors.h): every descriptor must name its
      // entry's rows, else the step fails (copies failed, nothing published).
      const auto misdescribed = verify_internal::MisdescribedRows(space, in.rank, in.group, described, "device");
      if (misdescribed) std::fill(status.begin(), status.end(), kDescriptorFailed);
      Status ran = misdescribed || n == 0 ? Ok()
                                          : verify_internal::RunDescriptors(space, in.rank, in.group, described,
                                                                            std::span(status).first(n));
      ULA_RETURN_IF_ERROR(complete());
      ULA_RETURN_IF_ERROR(step->StoreInto(space, stream));
      if (misdescribed) return MakeError(ErrorCode::kInternal, *misdescribed);
      if (record.error != 0) {
        return MakeError(static_cast<ErrorCode>(record.error - 1),
                         fmt::format("device step of rank {} group {} refused the step", in.rank.value(), in.group.value()));
      }
      if (!ran) {
        return MakeError(ran.error().code(), fmt::format("device step of rank {} group {}: copies failed: {}",
                                                         in.rank.value(), in.group.value(), ran.error().message()));
      }
      FromRows(in, out);
      StepStats st;
      st.selections = record.selections;
      st.distinct = record.distinct;
      st.hits = record.hits;
      st.misses = record.misses;
      st.into_free = record.misses - record.evictions;
      st.evictions = record.evictions;
      st.bytes_moved = record.bytes_moved;
      return st;
    }

    AddressSpace& space;
    PlannerForm form;
    std::unique_ptr<StepPlanner> host;  // kHost: the library path; kEngine: made by Create, the engine layout
    std::vector<std::unique_ptr<DeviceStep>> devices;  // [rank][group]
    std::vector<std::uint32_t> generations;            // [rank][group] the maxima each step was made with
    DeviceStepConfig device_config;
    std::unique_ptr<DeviceIo> io;                      // kDevice: the engine's side of every step
    std::uint32_t io_descriptors = 0;                  // the descriptors io holds
    std::uint32_t device_generation = 0;               // how often the maxima grew
    std::uint32_t max_top_k;
    std::optional<Error> create_error;  // the form's Create refused this space
    // Step scratch.
    verify_internal::StepRows rows;
    std::vector<std::int32_t> indices;
    std::vector<CopyDescriptor> descriptors;
    std::vector<std::uint8_t> status;
  };
  Planner planner_;
  std::vector<std::unique_ptr<SparsePrefixCache>> caches_;  // sharing: one per rank (destroyed first)
  std::unique_ptr<StepPlanner> reserver_;                   // reserve_rounds: the admission's planner
  std::unique_ptr<verify_internal::KindModel> kinds_;       // a space with kinds: the model of every request's kinds
};

}  // namespace

Result<VerifierReport> RunConsistencyVerifier(const VerifierConfig& config) {
  ULA_RETURN_IF_ERROR(config.Validate());
  auto space_config = SpaceConfigOf(config);
  if (!space_config) return std::unexpected(space_config.error());
  auto backend = MakeCpuBackend({.copy_threads = config.copy_threads});
  std::unique_ptr<FaultInjectingBackend> faults;
  if (config.fault_rate > 0) {
    auto made = MakeFaultInjectingBackend(
        *backend, FaultPlan{.seed = config.seed, .fail_fraction = config.fault_rate, .partial = true});
    if (!made) return std::unexpected(made.error());
    faults = std::move(*made);
  }
  Backend& moves = faults ? static_cast<Backend&>(*faults) : *backend;
  auto space = AddressSpace::Create(*space_config, moves);
  if (!space) return std::unexpected(space.error());
  Verifier verifier(config, std::move(backend), std::move(faults), std::move(*space));
  if (auto refused = verifier.CreateError()) return std::unexpected(*refused);
  return verifier.Finish();
}

}  // namespace ula
