// DeviceStep (ula/device_step.h): the host side. Create sizes and fills the state and scratch
// in the form's memory (kernels::omp or kernels::gpu MemAlloc), Plan / Complete /
// AdvanceRound check the host-side arguments and enqueue the kernels of
// src/kernels/step_kernels.inl. Nothing here reads device memory during a step.
// Every call into the kernels' forms returns a KernelError, turned here into a Status
// (KernelStatus); a failure after launches were enqueued marks the step failed (Impl::failed):
// its device state is unknown, so every later call is refused.
#include "ula/device_step.h"

#include <fmt/format.h>
#include <omp.h>

#include <algorithm>
#include <bit>
#include <cstring>
#include <functional>
#include <span>
#include <type_traits>

#include "kernels/step_kernels.h"
#include "policy/kernel_pb_lru.h"
#include "space/space_access.h"
#include "step/device_io.h"
#include "step/engine_modes.h"
#include "space/address_space_state.h"
#include "space/tp_state.h"
#include "ula/check.h"
#include "kernels/omp_team.h"

namespace ula {

namespace {
constexpr std::uint64_t kMaxRequestIds = std::uint64_t{1} << 24;


std::uint32_t SummaryWords(std::uint32_t words) { return (words + 63) / 64; }

// kFailedPrecondition while a plan (Plan or Claim, before Complete) or a check (Check,
// before Claim) is pending: the host calls that must not interleave with one.
Status RefuseWhilePending(bool pending, bool checked, const char* what) {
  if (pending || checked) {
    return MakeError(ErrorCode::kFailedPrecondition,
                     fmt::format("DeviceStep::{}: a {} is pending: {} it first", what, pending ? "plan" : "check",
                                 pending ? "Complete" : "Claim"));
  }
  return Ok();
}


// kFailedPrecondition while a Place awaits its CompletePlace: its seats past the free slots
// are not published yet.
Status RefuseWhilePlacing(bool placing, const char* what) {
  if (!placing) return Ok();
  return MakeError(ErrorCode::kFailedPrecondition,
                   fmt::format("DeviceStep::{}: a place is pending: CompletePlace it first", what));
}

// A KernelError as a Status: kResourceExhausted (the arena, memory), kFailedPrecondition (no
// device, an old driver), kIo (any other CUDA error or an exception the CUDA form caught).
Status KernelStatus(kernels::KernelError e, const char* what, std::size_t arena_bytes = 0) {
  switch (e) {
    case kernels::kKernelOk:
      return Ok();
    case kernels::kKernelArenaOverflow:
      return MakeError(ErrorCode::kResourceExhausted,
                       fmt::format("DeviceStep::{}: the step's scans need more than the scratch arena's {} bytes "
                                   "(sized at Create for the largest shape): refused, nothing enqueued", what,
                                   arena_bytes));
    case kernels::kKernelOutOfMemory:
      return MakeError(ErrorCode::kResourceExhausted, fmt::format("DeviceStep::{}: {}", what, KernelErrorText(e)));
    case kernels::kKernelNoDevice:
      return MakeError(ErrorCode::kFailedPrecondition,
                       fmt::format("DeviceStep::{}: config.cuda needs a CUDA device: {}", what, KernelErrorText(e)));
    case kernels::kKernelOldDriver:
      return MakeError(ErrorCode::kFailedPrecondition,
                       fmt::format("DeviceStep::{}: config.cuda needs a newer CUDA driver: {}", what, KernelErrorText(e)));
    default:
      return MakeError(ErrorCode::kIo, fmt::format("DeviceStep::{}: the CUDA form failed: {}", what, KernelErrorText(e)));
  }
}
}  // namespace

Status DeviceStepConfig::Validate() const {
  auto bad = [](std::string m) { return MakeError(ErrorCode::kInvalidArgument, "DeviceStepConfig." + m); };
  if (threads < 1 || threads > 64) return bad(fmt::format("threads = {}: must be in [1, 64]", threads));
  if (max_rows == 0) return bad("max_rows: must be >= 1");
  if (max_batch == 0) return bad("max_batch: must be >= 1");
  if (max_top_k == 0) return bad("max_top_k: must be >= 1");
  if (std::uint64_t{max_rows} * max_top_k > (std::uint64_t{1} << 31)) {
    return bad("max_rows * max_top_k: more than 2^31 selections");
  }
  if (max_addresses > (std::uint32_t{1} << 31)) {
    return bad(fmt::format("max_addresses = {}: selections are int32, at most 2^31 addresses", max_addresses));
  }
  if (max_requests > kMaxRequestIds) {
    return bad(fmt::format("max_requests = {}: request ids must be below 2^24", max_requests));
  }
  for (auto [name, v] : {std::pair{"max_place_seats", max_place_seats}, std::pair{"max_place_releases", max_place_releases},
                         std::pair{"max_place_requests", max_place_requests}}) {
    if (v > (std::uint32_t{1} << 31)) return bad(fmt::format("{} = {}: at most 2^31", name, v));
  }
#if !defined(ULA_WITH_CUDA_KERNELS)
  if (cuda) return MakeError(ErrorCode::kFailedPrecondition, "DeviceStepConfig.cuda: this build has no CUDA (ULA_WITH_CUDA)");
#endif
  return Ok();
}

struct DeviceStep::Impl {
  DeviceStepConfig config;
  kernels::DeviceStepArgs args;      // the state and scratch pointers; io filled per Plan
  kernels::ScratchArena arena;
  // [kNumPhases] launches and syncs, cumulative (args.counts points here).
  mutable kernels::LaunchCounts counts[kernels::kNumPhases] = {};
  std::vector<void*> blocks;         // every MemAlloc, freed at destruction
  std::uint32_t max_selections = 0, max_descriptors = 0;
  std::uint32_t device_capacity = 0, host_words = 0, new_on_host_cap = 0;
  bool pending = false;
  bool checked = false;              // Check ran, Claim has not
  bool device_placement = false;     // the space's AddressSpaceConfig::device_placement
  bool placing = false;              // Place ran, CompletePlace has not
  // The space, shard and extent loaded (StoreInto and Reload check them).
  const void* space = nullptr;
  std::uint32_t rank = 0, group = 0;
  std::uint32_t table_cap = 0, owner_cap = 0, request_cap = 0, adopted_cap = 0;  // the buffers' extents
  std::uint32_t loaded_table = 0;    // records of the space at the last load or store
  std::uint64_t loaded_digest = 0;   // Digest of what was loaded or stored
  bool dirty = false;                // a state-changing call ran since the last load or store
  std::uint32_t round = 1;           // the host's count of the PB-LRU round (for the rebase)
  // Build's first failed memory call (kKernelOk: none).
  kernels::KernelError setup_error = kernels::kKernelOk;
  // Non-empty once a call of the form failed after enqueueing work (a launch, a copy, a sync):
  // the device state is unknown from then on and every call is refused with this reason.
  mutable std::string failed;

  ~Impl() {
    for (void* p : blocks) Free(p);
  }
  void* Alloc(std::size_t bytes) {
    void* p = nullptr;
#if defined(ULA_WITH_CUDA_KERNELS)
    const kernels::KernelError e = config.cuda ? kernels::gpu::MemAlloc(bytes, &p) : kernels::omp::MemAlloc(bytes, &p);
#else
    const kernels::KernelError e = kernels::omp::MemAlloc(bytes, &p);
#endif
    if (e != kernels::kKernelOk) {
      if (setup_error == kernels::kKernelOk) setup_error = e;
      return nullptr;
    }
    blocks.push_back(p);
    return p;
  }
  // Teardown: a failed free has no caller to report to (the memory is lost either way).
  void Free(void* p) const {
#if defined(ULA_WITH_CUDA_KERNELS)
    if (config.cuda) {
      (void)kernels::gpu::MemFree(p);
      return;
    }
#endif
    (void)kernels::omp::MemFree(p);
  }
  // A copy between the step's memory and pageable host memory: counted as a host
  // synchronisation (outside a step: Create, Reload, StoreInto, ReadState).
  kernels::KernelError Copy(void* stream, void* dst, const void* src, std::size_t bytes) const {
    ++counts[kernels::kPhaseState].syncs;
#if defined(ULA_WITH_CUDA_KERNELS)
    if (config.cuda) return kernels::gpu::MemCopy(stream, dst, src, bytes);
#endif
    (void)stream;
    return kernels::omp::MemCopy(0, dst, src, bytes);
  }
  kernels::KernelError Sync(void* stream) const {
    ++counts[kernels::kPhaseState].syncs;
#if defined(ULA_WITH_CUDA_KERNELS)
    if (config.cuda) return kernels::gpu::Sync(stream);
#endif
    (void)stream;
    return kernels::omp::Sync(0);
  }
  // kFailedPrecondition once a call failed midway (`failed`); `what` names the call refused.
  Status RefuseIfFailed(const char* what) const {
    if (failed.empty()) return Ok();
    return MakeError(ErrorCode::kFailedPrecondition,
                     fmt::format("DeviceStep::{}: an earlier call failed after enqueueing work ({}): the step's "
                                 "device state is unknown; re-create it from the space", what, failed));
  }
  // The Status of a call of the form that may have enqueued work: any error but the arena's
  // refusal (raised before anything is enqueued) marks the step failed.
  Status Enqueued(kernels::KernelError e, const char* what) const {
    if (e == kernels::kKernelOk) return Ok();
    Status st = KernelStatus(e, what, arena.capacity);
    if (e != kernels::kKernelArenaOverflow && failed.empty()) failed = st.error().ToString();
    return st;
  }
  // A device array holding `values` (nullptr when allocation or the copy failed).
  template <class T>
  T* Upload(const std::vector<T>& values, std::size_t min_count = 1) {
    const std::size_t n = std::max(values.size(), min_count);
    auto* p = static_cast<T*>(Alloc(n * sizeof(T)));
    if (p != nullptr && !values.empty()) {
      if (const kernels::KernelError e = Copy(nullptr, p, values.data(), values.size() * sizeof(T)); e != kernels::kKernelOk) {
        if (setup_error == kernels::kKernelOk) setup_error = e;
        return nullptr;
      }
    }
    return p;
  }
  template <class T>
  T* Zeroed(std::size_t count) {
    return Upload(std::vector<T>(std::max<std::size_t>(count, 1), T{}));
  }
};

DeviceStep::DeviceStep(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
DeviceStep::~DeviceStep() = default;

std::uint32_t DeviceStep::max_descriptors() const { return impl_->max_descriptors; }
std::uint64_t DeviceStep::arena_high_water() const { return impl_->arena.high_water; }
std::uint64_t DeviceStep::arena_overflows() const { return impl_->arena.overflows; }

DeviceStepCounts DeviceStepCounters::Step() const {
  return {.launches = check.launches + claim.launches + complete.launches + advance_round.launches,
          .syncs = check.syncs + claim.syncs + complete.syncs + advance_round.syncs};
}

DeviceStepCounters DeviceStepCounters::Since(const DeviceStepCounters& e) const {
  const auto minus = [](const DeviceStepCounts& a, const DeviceStepCounts& b) {
    return DeviceStepCounts{.launches = a.launches - b.launches, .syncs = a.syncs - b.syncs};
  };
  return {.check = minus(check, e.check), .claim = minus(claim, e.claim), .complete = minus(complete, e.complete),
          .advance_round = minus(advance_round, e.advance_round), .state = minus(state, e.state),
          .place = minus(place, e.place)};
}

DeviceStepCounters DeviceStep::counters() const {
  const auto at = [&](kernels::LaunchPhase p) {
    return DeviceStepCounts{.launches = impl_->counts[p].launches, .syncs = impl_->counts[p].syncs};
  };
  return {.check = at(kernels::kPhaseCheck), .claim = at(kernels::kPhaseClaim), .complete = at(kernels::kPhaseComplete),
          .advance_round = at(kernels::kPhaseAdvanceRound), .state = at(kernels::kPhaseState),
          .place = at(kernels::kPhasePlace)};
}

// What the device step copies from one (rank, group) of either space, in host memory.
struct DeviceStep::ShardSource {
  std::vector<std::uint64_t> records;        // DP: by address; TP: the home table, by address / P
  std::vector<std::uint32_t> owner;          // by address
  std::vector<std::uint32_t> tags, adopted_starts, adopted;  // the request table, by request id
  const SlotPool* device = nullptr;
  const SlotPool* host = nullptr;
  const policy::KernelPbLru* pb = nullptr;
  std::vector<std::uint32_t> device_owner;
  std::vector<std::uint32_t> new_on_host;    // sorted: this round's Allocate placed them on host
  const void* space = nullptr;               // the AddressSpace or TpAddressSpace read
  std::uint32_t rank = 0, group = 0, row_bytes = 0, num_layers = 1, num_ranks = 1;
  std::uint64_t entry_bytes = 0;
  bool device_placement = false;             // the space's AddressSpaceConfig::device_placement
  // This source as Read would see the shard after StoreInto wrote `stored` into it (the
  // pools and the policy are read through their pointers; shadows were dropped).
  const ShardSource& Stored(DeviceShard&& stored);
};

namespace {

// The checks both spaces share: rank, group, the policy.
Status CheckShard(std::uint32_t ranks, std::uint32_t groups, Rank rank, GroupId group, const ResidencyPolicy& policy) {
  if (rank.value() >= ranks) {
    return MakeError(ErrorCode::kOutOfRange, fmt::format("rank {} is out of range ({} ranks)", rank.value(), ranks));
  }
  if (group.value() >= groups) {
    return MakeError(ErrorCode::kOutOfRange, fmt::format("group {} is out of range ({} groups)", group.value(), groups));
  }
  if (dynamic_cast<const policy::KernelPbLru*>(&policy) == nullptr) {
    return MakeError(ErrorCode::kFailedPrecondition,
                     fmt::format("rank {} group {}: the device step holds PB-LRU as flat bitmaps: create the space "
                                 "with policy kernel_pb_lru (it has {})", rank.value(), group.value(), policy.name()));
  }
  return Ok();
}

// The request table, indexed by id: each holder's tag and sorted adopted addresses. `holders`
// maps RequestId to a value with `tag` and `adopted` (DP's RequestState, TP's Holder).
template <class Map>
Status FillRequests(const Map& holders, std::vector<std::uint32_t>& tags,
                    std::vector<std::uint32_t>& adopted_starts, std::vector<std::uint32_t>& adopted) {
  std::uint64_t max_id = 0;
  for (const auto& [id, h] : holders) max_id = std::max(max_id, id.value());
  if (!holders.empty() && max_id >= kMaxRequestIds) {
    return MakeError(ErrorCode::kFailedPrecondition,
                     fmt::format("request id {}: the device step's request table is indexed by id, ids must be below "
                                 "2^24", max_id));
  }
  const std::uint32_t n = holders.empty() ? 0 : static_cast<std::uint32_t>(max_id + 1);
  std::vector<const typename Map::mapped_type*> by_id(n, nullptr);
  for (const auto& [id, h] : holders) by_id[id.value()] = &h;
  tags.assign(n, 0);
  adopted_starts.assign(n + 1, 0);
  adopted.clear();
  for (std::uint32_t r = 0; r < n; ++r) {
    if (by_id[r] != nullptr) {
      tags[r] = by_id[r]->tag;
      for (LogicalAddr x : by_id[r]->adopted) adopted.push_back(x.value());
    }
    adopted_starts[r + 1] = static_cast<std::uint32_t>(adopted.size());
  }
  return Ok();
}

}  // namespace

Status DeviceStep::Read(const AddressSpace& space, Rank rank, GroupId group, ShardSource& src) {
  const AddressSpace::State& st = StateOf(space);
  const AddressSpaceConfig& cfg = space.config();
  if (rank.value() >= cfg.num_ranks || group.value() >= cfg.num_groups) {
    return CheckShard(cfg.num_ranks, cfg.num_groups, rank, group, *st.at(Rank(0), GroupId(0)).policy);
  }
  const GroupPools& gp = st.at(rank, group);
  ULA_RETURN_IF_ERROR(CheckShard(cfg.num_ranks, cfg.num_groups, rank, group, *gp.policy));
  src.new_on_host.clear();
  for (LogicalAddr a : gp.new_on_host) src.new_on_host.push_back(a.value());
  ULA_RETURN_IF_ERROR(FillRequests(st.dir.requests(), src.tags, src.adopted_starts, src.adopted));
  const AddressRecords& table = st.tables[group.value()];
  src.records.assign(table.data(), table.data() + table.size());
  for (std::uint64_t& r : src.records) r &= AddressRecords::kLocationMask;
  src.owner.assign(st.dir.owner().begin(), st.dir.owner().end());
  src.owner.resize(src.records.size(), 0);
  src.device = &gp.device;
  src.host = &gp.host;
  src.pb = dynamic_cast<const policy::KernelPbLru*>(gp.policy.get());
  src.device_owner.resize(gp.device_owner.size());
  for (std::size_t s = 0; s < src.device_owner.size(); ++s) src.device_owner[s] = gp.device_owner[s].value();
  src.space = &space;
  src.rank = rank.value();
  src.group = group.value();
  src.row_bytes = cfg.row();
  src.num_layers = gp.num_layers;
  src.entry_bytes = cfg.entry_bytes_of(group);
  src.device_placement = cfg.device_placement;
  return Ok();
}

Status DeviceStep::Read(const TpAddressSpace& space, Rank rank, GroupId group, ShardSource& src) {
  const TpAddressSpace::State& st = StateOf(space);
  const TpConfig& cfg = space.config();
  if (rank.value() >= cfg.num_ranks || group.value() >= cfg.num_groups) {
    return CheckShard(cfg.num_ranks, cfg.num_groups, rank, group, *st.at(space.hosted_ranks()[0], GroupId(0)).policy);
  }
  if (!space.Hosts(rank)) {
    return MakeError(ErrorCode::kFailedPrecondition, fmt::format("rank {}: this space does not host it", rank.value()));
  }
  if (cfg.attention != TpAttention::kAtHome) {
    return MakeError(ErrorCode::kFailedPrecondition,
                     "the TP device step covers attention at home, not the local buffer (at home peaks 1.12 to 1.57x "
                     "higher in ula compare's TP configs: docs/ARCHITECTURE.md, \"Which form runs which mode\"); "
                     "the host steps run the local buffer");
  }
  const TpGroupShard& sh = st.at(rank, group);
  ULA_RETURN_IF_ERROR(CheckShard(cfg.num_ranks, cfg.num_groups, rank, group, *sh.policy));
  src.new_on_host.clear();
  for (LogicalAddr a : sh.new_on_host) src.new_on_host.push_back(a.value());
  ULA_RETURN_IF_ERROR(FillRequests(st.dir.requests(), src.tags, src.adopted_starts, src.adopted));
  const std::size_t entries = HomeInUse(st, cfg, rank.value());
  src.records.resize(entries);
  for (std::size_t e = 0; e < entries; ++e) src.records[e] = sh.home[e].bits();
  src.owner.assign(st.dir.owner().begin(), st.dir.owner().end());
  src.device = &sh.device;
  src.host = &sh.host;
  src.pb = dynamic_cast<const policy::KernelPbLru*>(sh.policy.get());
  src.device_owner.resize(sh.device_owner.size());
  for (std::size_t s = 0; s < src.device_owner.size(); ++s) src.device_owner[s] = sh.device_owner[s].value();
  src.space = &space;
  src.rank = rank.value();
  src.group = group.value();
  src.row_bytes = cfg.entry_bytes;  // a TP entry moves whole: one row of entry_bytes
  src.num_layers = 1;
  src.entry_bytes = cfg.entry_bytes;
  src.num_ranks = cfg.num_ranks;
  return Ok();
}

Result<std::unique_ptr<DeviceStep>> DeviceStep::Create(const AddressSpace& space, Rank rank, GroupId group,
                                                       const DeviceStepConfig& config) {
  ULA_RETURN_IF_ERROR(config.Validate());
  ULA_RETURN_IF_ERROR(RefuseEngineModes(space.config().stable_new_entries, space.config().host_shadows, "AddressSpaceConfig"));
  ShardSource src;
  ULA_RETURN_IF_ERROR(Read(space, rank, group, src));
  return Build(src, config);
}

Result<std::unique_ptr<DeviceStep>> DeviceStep::Create(const TpAddressSpace& space, Rank rank, GroupId group,
                                                       const DeviceStepConfig& config) {
  ULA_RETURN_IF_ERROR(config.Validate());
  ULA_RETURN_IF_ERROR(RefuseTpKinds(!space.config().kinds.empty(), "DeviceStep::Create"));
  ULA_RETURN_IF_ERROR(RefuseEngineModes(space.config().stable_new_entries, space.config().host_shadows, "TpConfig"));
  ShardSource src;
  ULA_RETURN_IF_ERROR(Read(space, rank, group, src));
  return Build(src, config);
}

Result<std::unique_ptr<DeviceStep>> DeviceStep::Build(const ShardSource& src, const DeviceStepConfig& config) {
#if defined(ULA_WITH_CUDA_KERNELS)
  // The CUDA form needs a device before anything is allocated (kFailedPrecondition without one).
  if (config.cuda) ULA_RETURN_IF_ERROR(KernelStatus(kernels::gpu::CheckDevice(), "Create"));
#endif
  auto impl = std::make_unique<Impl>();
  impl->config = config;
  Impl& m = *impl;
  kernels::DeviceStepArgs& a = m.args;
  m.max_selections = config.max_rows * config.max_top_k;
  m.device_capacity = src.device->capacity();
  m.max_descriptors = std::min(m.max_selections, m.device_capacity);
  m.space = src.space;
  m.rank = src.rank;
  m.group = src.group;
  bool ok = true;
  auto need = [&](const void* p) { ok = ok && p != nullptr; };

  // The state, sized for the largest extent Reload takes (padding: not live, no request).
  const std::uint64_t home_cap = (std::uint64_t{config.max_addresses} + src.num_ranks - 1) / src.num_ranks;
  m.table_cap = static_cast<std::uint32_t>(std::max<std::uint64_t>(src.records.size(), home_cap));
  m.owner_cap = static_cast<std::uint32_t>(std::max<std::uint64_t>(src.owner.size(), config.max_addresses));
  m.request_cap = static_cast<std::uint32_t>(std::max<std::uint64_t>(src.tags.size(), config.max_requests));
  m.adopted_cap = static_cast<std::uint32_t>(std::max<std::uint64_t>(src.adopted.size(), config.max_adopted));
  a.table_size = m.table_cap;
  need(a.records = m.Zeroed<std::uint64_t>(m.table_cap));
  a.owner_size = m.owner_cap;
  need(a.owner = m.Zeroed<std::uint32_t>(m.owner_cap));
  a.num_ranks = src.num_ranks;
  a.num_requests = m.request_cap;
  need(a.request_tags = m.Zeroed<std::uint32_t>(m.request_cap));
  need(a.adopted_starts = m.Zeroed<std::uint32_t>(std::size_t{m.request_cap} + 1));
  need(a.adopted = m.Zeroed<std::uint32_t>(m.adopted_cap));
  auto flat = [&](const HierBitmap& b, kernels::FlatBitmap& f) {
    f.num_words = static_cast<std::uint32_t>(b.num_words());
    f.num_summary = SummaryWords(f.num_words);
    need(f.words = m.Zeroed<std::uint64_t>(f.num_words));
    need(f.summary = m.Zeroed<std::uint64_t>(f.num_summary));
    need(f.count = m.Zeroed<std::uint64_t>(1));
  };
  flat(src.device->free_bitmap(), a.device_free);
  flat(src.host->free_bitmap(), a.host_free);
  m.host_words = a.host_free.num_words;
  {
    const kernels::PbLruArrays pb = src.pb->arrays();
    kernels::PbLruArrays& d = a.pb;
    d = pb;
    const std::size_t buckets = pb.recent + 2;
    need(d.words = m.Zeroed<std::uint64_t>(buckets * pb.num_words));
    need(d.summary = m.Zeroed<std::uint64_t>(buckets * pb.num_summary));
    need(d.counts = m.Zeroed<std::uint64_t>(buckets));
    need(d.stamps = m.Zeroed<std::uint32_t>(pb.capacity));
    need(d.clock = m.Zeroed<kernels::PbLruClock>(1));
  }
  need(a.device_owner = m.Zeroed<std::uint32_t>(m.device_capacity));
  m.new_on_host_cap = src.host->capacity();  // a new entry on host holds a host slot
  need(a.new_on_host = m.Zeroed<std::uint32_t>(m.new_on_host_cap));
  a.rank = src.rank;
  a.group = src.group;
  a.row_bytes = src.row_bytes;
  a.num_layers = src.num_layers;
  a.entry_bytes = src.entry_bytes;
  a.codes.invalid_argument = 1 + static_cast<std::uint32_t>(ErrorCode::kInvalidArgument);
  a.codes.not_found = 1 + static_cast<std::uint32_t>(ErrorCode::kNotFound);
  a.codes.resource_exhausted = 1 + static_cast<std::uint32_t>(ErrorCode::kResourceExhausted);
  a.codes.failed_precondition = 1 + static_cast<std::uint32_t>(ErrorCode::kFailedPrecondition);
  // The scratch, for the largest shape.
  need(a.first = m.Zeroed<std::uint32_t>(m.table_cap));
  need(a.kind = m.Zeroed<std::uint8_t>(m.max_selections));
  need(a.tally = static_cast<kernels::StepTally*>(m.Alloc(std::size_t{m.max_selections} * sizeof(kernels::StepTally))));
  need(a.pick = m.Zeroed<std::uint32_t>(m.max_selections));
  need(a.hit_mark = m.Zeroed<std::uint64_t>(a.pb.num_words));
  need(a.missed = m.Zeroed<std::uint32_t>(m.max_selections));
  need(a.targets = m.Zeroed<std::uint32_t>(m.max_descriptors));
  // Claim's one take over the free bitmap's blocks, then the victim buckets'.
  need(a.take_offsets = m.Zeroed<std::uint32_t>(std::size_t{a.pb.recent + 1} * a.pb.num_summary +
                                                a.device_free.num_summary));
  need(a.ctl = m.Upload(std::vector<kernels::DeviceStepControl>{kernels::DeviceStepControl{}}));
  m.device_placement = src.device_placement;
  if (src.device_placement) {  // Place's scratch and the round's new-on-host bitmap
    kernels::PlaceArgs& p = a.place;
    p.max_seats = config.max_place_seats;
    need(p.slots = m.Zeroed<std::uint32_t>(p.max_seats));
    need(p.hosts = m.Zeroed<std::uint32_t>(p.max_seats));
    need(p.addrs = m.Zeroed<std::uint32_t>(p.max_seats));
    const std::size_t place_blocks = std::max<std::size_t>(
        {std::size_t{a.pb.recent + 1} * a.pb.num_summary, a.device_free.num_summary, a.host_free.num_summary});
    need(p.take_counts = m.Zeroed<std::uint32_t>(place_blocks));
    need(p.take_offsets = m.Zeroed<std::uint32_t>(place_blocks));
    p.new_on_host_words = (m.owner_cap + 63) / 64;
    need(p.new_on_host_bits = m.Zeroed<std::uint64_t>(p.new_on_host_words));
    need(p.ctl = m.Upload(std::vector<kernels::PlaceControl>{kernels::PlaceControl{}}));
  }
  // The cooperative scans' per-block partials (CUDA form): for the most blocks the device
  // holds resident, the bound of any launch's grid (checked again before each launch, which is
  // refused when they do not fit). The OpenMP form's live on the launching thread's stack: no
  // arena.
#if defined(ULA_WITH_CUDA_KERNELS)
  if (config.cuda) {
    kernels::KernelError e = kernels::kKernelOk;
    const std::size_t scan = kernels::gpu::ScanScratchBytes(a, m.max_selections, &e);
    ULA_RETURN_IF_ERROR(KernelStatus(e, "Create"));
    m.arena.capacity = kernels::ScratchArena::AlignUp(scan);
    need(m.arena.base = static_cast<char*>(m.Alloc(m.arena.capacity)));
  }
#endif
  a.arena = &m.arena;
  a.counts = m.counts;
  if (!ok) {
    if (m.setup_error == kernels::kKernelOutOfMemory || m.setup_error == kernels::kKernelOk) {
      return MakeError(ErrorCode::kResourceExhausted, "DeviceStep: the state and scratch do not fit in device memory");
    }
    return std::unexpected(KernelStatus(m.setup_error, "Create").error());
  }
  auto step = std::unique_ptr<DeviceStep>(new DeviceStep(std::move(impl)));
  ULA_RETURN_IF_ERROR(step->Load(src, nullptr));
  ULA_RETURN_IF_ERROR(KernelStatus(step->impl_->Sync(nullptr), "Create"));
  return step;
}

Status DeviceStep::Load(const ShardSource& src, void* stream) {
  Impl& m = *impl_;
  kernels::DeviceStepArgs& a = m.args;
  kernels::KernelError error = kernels::kKernelOk;  // the first failed copy; the rest are skipped
  auto copy = [&](void* dst, const void* from, std::size_t bytes) {
    if (error == kernels::kKernelOk) error = m.Copy(stream, dst, from, bytes);
  };
  // (Some arrays are const in the kernels' arguments: the kernels only read them; the step owns them.)
  // values, then zeros up to count.
  auto put = [&](auto* dst, const auto& values, std::size_t count) {
    using T = std::decay_t<decltype(values[0])>;
    void* out = const_cast<void*>(static_cast<const void*>(dst));
    const std::size_t n = std::min(values.size(), count);
    copy(out, values.data(), n * sizeof(T));
    if (n < count) {
      const std::vector<T> zeros(count - n, T{});
      copy(static_cast<T*>(out) + n, zeros.data(), zeros.size() * sizeof(T));
    }
  };
  put(a.records, src.records, m.table_cap);
  put(a.owner, src.owner, m.owner_cap);
  put(a.request_tags, src.tags, m.request_cap);
  std::vector<std::uint32_t> starts = src.adopted_starts;
  starts.resize(std::size_t{m.request_cap} + 1, starts.empty() ? 0 : starts.back());
  put(a.adopted_starts, std::move(starts), std::size_t{m.request_cap} + 1);
  put(a.adopted, src.adopted, m.adopted_cap);
  put(a.new_on_host, src.new_on_host, m.new_on_host_cap);
  {
    const auto pinned = static_cast<std::uint32_t>(src.new_on_host.size());
    copy(&a.ctl->num_new_on_host, &pinned, sizeof(pinned));
  }
  if (a.place.new_on_host_bits != nullptr) {  // device placement: the same set as a bitmap
    std::vector<std::uint64_t> bits(a.place.new_on_host_words, 0);
    for (std::uint32_t x : src.new_on_host) bits[x >> 6] |= std::uint64_t{1} << (x & 63);
    put(a.place.new_on_host_bits, std::move(bits), a.place.new_on_host_words);
  }
  auto flat = [&](const HierBitmap& b, const kernels::FlatBitmap& f) {
    std::vector<std::uint64_t> words(b.words(), b.words() + b.num_words()), summary(f.num_summary, 0);
    for (std::uint32_t w = 0; w < f.num_words; ++w) {
      if (words[w] != 0) summary[w >> 6] |= std::uint64_t{1} << (w & 63);
    }
    put(f.words, std::move(words), f.num_words);
    put(f.summary, std::move(summary), f.num_summary);
    put(f.count, std::vector<std::uint64_t>{b.Count()}, 1);
  };
  flat(src.device->free_bitmap(), a.device_free);
  flat(src.host->free_bitmap(), a.host_free);
  const kernels::PbLruArrays pb = src.pb->arrays();
  const std::size_t buckets = pb.recent + 2;
  put(a.pb.words, std::vector<std::uint64_t>(pb.words, pb.words + buckets * pb.num_words), buckets * pb.num_words);
  put(a.pb.summary, std::vector<std::uint64_t>(pb.summary, pb.summary + buckets * pb.num_summary),
      buckets * pb.num_summary);
  put(a.pb.counts, std::vector<std::uint64_t>(pb.counts, pb.counts + buckets), buckets);
  put(a.pb.stamps, std::vector<std::uint32_t>(pb.stamps, pb.stamps + pb.capacity), pb.capacity);
  put(a.pb.clock, std::vector<kernels::PbLruClock>{*pb.clock}, 1);
  m.round = pb.clock->round;
  put(a.device_owner, src.device_owner, m.device_capacity);
  put(a.first, std::vector<std::uint32_t>(m.table_cap, kernels::kNoSelection), m.table_cap);
  if (error != kernels::kKernelOk) return m.Enqueued(error, "Create or Reload (loading the state)");
  m.loaded_table = static_cast<std::uint32_t>(src.records.size());
  m.loaded_digest = Digest(src);
  m.dirty = false;
  return Ok();
}

namespace {
// A digest of raw bytes in four independent lanes (multiply-rotate per 8-byte word, the
// lanes folded at the end): StoreInto hashes the whole shard per call, and one serial chain
// (StateDigest) was a third of the round bracket's time (bench BM_DeviceStepRound).
class BytesDigest {
 public:
  template <class T>
  void Add(std::span<const T> values) {
    AddBytes(values.data(), values.size_bytes());
  }
  void AddBytes(const void* data, std::size_t bytes) {
    Mix(0, bytes);
    const auto* p = static_cast<const unsigned char*>(data);
    std::size_t i = 0;
    for (; i + 32 <= bytes; i += 32) {
      for (int l = 0; l < 4; ++l) Mix(l, Load(p + i + 8 * l));
    }
    for (; i + 8 <= bytes; i += 8) Mix(0, Load(p + i));
    std::uint64_t tail = 0;
    if (i < bytes) std::memcpy(&tail, p + i, bytes - i);
    Mix(1, tail);
  }
  std::uint64_t value() const {
    std::uint64_t h = 0;
    for (std::uint64_t l : lanes_) h = (h ^ l) * kMul + (h >> 29);
    return h;
  }

 private:
  static constexpr std::uint64_t kMul = 0x9e3779b97f4a7c15ull;
  static std::uint64_t Load(const unsigned char* p) {
    std::uint64_t v;
    std::memcpy(&v, p, 8);
    return v;
  }
  void Mix(int l, std::uint64_t v) {
    const std::uint64_t x = (lanes_[l] ^ v) * kMul;
    lanes_[l] = (x << 31) | (x >> 33);
  }
  std::uint64_t lanes_[4] = {1, 2, 3, 4};
};
}  // namespace

std::uint64_t DeviceStep::Digest(const ShardSource& src) {
  BytesDigest d;
  const std::uint32_t ids[2] = {src.rank, src.group};
  d.Add(std::span<const std::uint32_t>(ids));
  d.Add(std::span<const std::uint64_t>(src.records));
  d.Add(std::span<const std::uint32_t>(src.owner));
  d.Add(std::span<const std::uint32_t>(src.tags));
  d.Add(std::span<const std::uint32_t>(src.adopted_starts));
  d.Add(std::span<const std::uint32_t>(src.adopted));
  for (const SlotPool* pool : {src.device, src.host}) {
    const HierBitmap& b = pool->free_bitmap();
    d.Add(std::span<const std::uint64_t>(b.words(), b.num_words()));
  }
  d.Add(std::span<const std::uint32_t>(src.new_on_host));
  const kernels::PbLruArrays pb = src.pb->arrays();
  const std::size_t buckets = pb.recent + 2;
  d.Add(std::span<const std::uint64_t>(pb.words, buckets * pb.num_words));
  d.Add(std::span<const std::uint64_t>(pb.counts, buckets));
  d.Add(std::span<const std::uint32_t>(pb.stamps, pb.capacity));
  d.Add(std::span<const kernels::PbLruClock>(pb.clock, 1));
  d.Add(std::span<const std::uint32_t>(src.device_owner));
  return d.value();
}

Status DeviceStep::CheckSameSpace(const void* space, const char* what) const {
  const Impl& m = *impl_;
  ULA_RETURN_IF_ERROR(m.RefuseIfFailed(what));
  ULA_RETURN_IF_ERROR(RefuseWhilePending(m.pending, m.checked, what));
  ULA_RETURN_IF_ERROR(RefuseWhilePlacing(m.placing, what));
  if (space != m.space) {
    return MakeError(ErrorCode::kInvalidArgument,
                     fmt::format("DeviceStep::{}: not the space this step was created from (rank {} group {})", what,
                                 m.rank, m.group));
  }
  return Ok();
}

struct DeviceStep::DeviceShard {
  std::vector<std::uint64_t> records, device_free, host_free, pb_words, pb_summary, pb_counts;
  std::vector<std::uint64_t> new_on_host_bits;  // device placement: the round's new entries on host
  std::vector<std::uint32_t> device_owner, pb_stamps;
  kernels::PbLruClock clock;
  // The PB-LRU arrays over the vectors above (KernelPbLru::LoadFrom).
  kernels::PbLruArrays pb(const kernels::PbLruArrays& shape) {
    kernels::PbLruArrays p = shape;
    p.words = pb_words.data();
    p.summary = pb_summary.data();
    p.counts = pb_counts.data();
    p.stamps = pb_stamps.data();
    p.clock = &clock;
    return p;
  }
};

const DeviceStep::ShardSource& DeviceStep::ShardSource::Stored(DeviceShard&& stored) {
  records = std::move(stored.records);
  device_owner = std::move(stored.device_owner);
  return *this;
}

Status DeviceStep::ReadBack(const ShardSource& now, DeviceShard& d, void* stream) const {
  const Impl& m = *impl_;
  if (m.device_placement) return ReadBackPlaced(now, d, stream);
  if (Digest(now) != m.loaded_digest) {
    return MakeError(ErrorCode::kFailedPrecondition,
                     fmt::format("DeviceStep::StoreInto: rank {} group {} of the space changed since the step loaded "
                                 "it (a host step, Allocate, Free, ShareInto, Retain, Release or AdvanceRound): the "
                                 "step's moves cannot be stored over them; store before changing the space, then Reload",
                                 m.rank, m.group));
  }
  const kernels::DeviceStepArgs& a = m.args;
  kernels::KernelError error = m.Sync(stream);  // the first failure; the calls after it are skipped
  auto read = [&](auto& v, const auto* src, std::size_t n) {
    v.resize(n);
    if (error == kernels::kKernelOk) error = m.Copy(stream, v.data(), src, n * sizeof(v[0]));
  };
  const std::size_t buckets = a.pb.recent + 2;
  read(d.records, a.records, m.loaded_table);
  read(d.device_owner, a.device_owner, m.device_capacity);
  read(d.device_free, a.device_free.words, a.device_free.num_words);
  read(d.host_free, a.host_free.words, a.host_free.num_words);
  read(d.pb_words, a.pb.words, buckets * a.pb.num_words);
  read(d.pb_summary, a.pb.summary, buckets * a.pb.num_summary);
  read(d.pb_counts, a.pb.counts, buckets);
  read(d.pb_stamps, a.pb.stamps, a.pb.capacity);
  if (error == kernels::kKernelOk) error = m.Copy(stream, &d.clock, a.pb.clock, sizeof(d.clock));
  if (error == kernels::kKernelOk) error = m.Sync(stream);
  return m.Enqueued(error, "StoreInto");
}

// Device placement: the space's directory changed since the load by design (the engine
// applied it with Place), so the check is that the device's owner tags and request tags are
// the directory's: a journal not applied (or applied twice) shows there.
Status DeviceStep::ReadBackPlaced(const ShardSource& now, DeviceShard& d, void* stream) const {
  const Impl& m = *impl_;
  const kernels::DeviceStepArgs& a = m.args;
  kernels::KernelError error = m.Sync(stream);
  auto read = [&](auto& v, const auto* src, std::size_t n) {
    v.resize(n);
    if (error == kernels::kKernelOk) error = m.Copy(stream, v.data(), src, n * sizeof(v[0]));
  };
  std::vector<std::uint32_t> owner, tags;
  read(owner, a.owner, m.owner_cap);
  read(tags, a.request_tags, m.request_cap);
  if (error == kernels::kKernelOk) error = m.Sync(stream);
  ULA_RETURN_IF_ERROR(m.Enqueued(error, "StoreInto"));
  auto same = [](const std::vector<std::uint32_t>& dev, const std::vector<std::uint32_t>& host) {
    for (std::size_t i = 0; i < std::max(dev.size(), host.size()); ++i) {
      if ((i < dev.size() ? dev[i] : 0) != (i < host.size() ? host[i] : 0)) return false;
    }
    return true;
  };
  if (!same(owner, now.owner) || !same(tags, now.tags)) {
    return MakeError(ErrorCode::kFailedPrecondition,
                     fmt::format("DeviceStep::StoreInto: rank {} group {}: the device's owner or request tags are not "
                                 "the space's directory (device placement): a placement journal was not applied "
                                 "(TakePlacement, then Place and CompletePlace on every step), nothing stored",
                                 m.rank, m.group));
  }
  const std::size_t table = std::min<std::size_t>(now.records.size(), m.table_cap);
  const std::size_t buckets = a.pb.recent + 2;
  read(d.records, a.records, table);
  read(d.device_owner, a.device_owner, m.device_capacity);
  read(d.device_free, a.device_free.words, a.device_free.num_words);
  read(d.host_free, a.host_free.words, a.host_free.num_words);
  read(d.pb_words, a.pb.words, buckets * a.pb.num_words);
  read(d.pb_summary, a.pb.summary, buckets * a.pb.num_summary);
  read(d.pb_counts, a.pb.counts, buckets);
  read(d.pb_stamps, a.pb.stamps, a.pb.capacity);
  read(d.new_on_host_bits, a.place.new_on_host_bits, a.place.new_on_host_words);
  if (error == kernels::kKernelOk) error = m.Copy(stream, &d.clock, a.pb.clock, sizeof(d.clock));
  if (error == kernels::kKernelOk) error = m.Sync(stream);
  return m.Enqueued(error, "StoreInto");
}

namespace {
// The space's side of StoreInto for one shard of either kind: owners, both pools' free sets
// and the PB-LRU. A shard with host shadows is never stored: Create refuses its space, and the
// step keeps no shadow links, so storing into one would leave links to slots it reassigned.
template <class Shard>
void StoreShard(Shard& sh, std::vector<LogicalAddr>& device_owner, const std::vector<std::uint32_t>& owners,
                const std::vector<std::uint64_t>& device_free, const std::vector<std::uint64_t>& host_free,
                const kernels::PbLruArrays& pb) {
  ULA_CHECK(!sh.shadows.enabled());
  for (std::size_t s = 0; s < device_owner.size(); ++s) device_owner[s] = LogicalAddr(owners[s]);
  sh.device.AssignFreeWords(device_free.data());
  sh.host.AssignFreeWords(host_free.data());
  dynamic_cast<policy::KernelPbLru&>(*sh.policy).LoadFrom(pb);
}
}  // namespace

Status DeviceStep::Store(const void* space, const std::function<Status(ShardSource&)>& read,
                         const std::function<void(DeviceShard&)>& write, void* stream) {
  ULA_RETURN_IF_ERROR(CheckSameSpace(space, "StoreInto"));
  Impl& m = *impl_;
  ShardSource now;
  ULA_RETURN_IF_ERROR(read(now));
  DeviceShard d;
  ULA_RETURN_IF_ERROR(ReadBack(now, d, stream));
  write(d);  // nothing below fails: the space is written whole or not at all
  if (m.device_placement) m.loaded_table = static_cast<std::uint32_t>(d.records.size());
  m.loaded_digest = Digest(now.Stored(std::move(d)));
  m.dirty = false;
  return Ok();
}

Status DeviceStep::StoreInto(AddressSpace& space, void* stream) {
  const Rank rank(impl_->rank);
  const GroupId group(impl_->group);
  return Store(
      &space, [&](ShardSource& now) { return Read(space, rank, group, now); },
      [&](DeviceShard& d) {
        AddressSpace::State& st = StateOf(space);
        GroupPools& gp = st.at(rank, group);
        AddressRecords& table = st.tables[group.value()];
        for (std::uint32_t a = 0; a < d.records.size(); ++a) table.Set(LogicalAddr(a), Location::FromBits(d.records[a]));
        StoreShard(gp, gp.device_owner, d.device_owner, d.device_free, d.host_free, d.pb(impl_->args.pb));
        if (impl_->device_placement) {  // the round's new entries on host, as the device marked them (sorted)
          gp.new_on_host.clear();
          for (std::size_t w = 0; w < d.new_on_host_bits.size(); ++w) {
            for (std::uint64_t bits = d.new_on_host_bits[w]; bits != 0; bits &= bits - 1) {
              gp.new_on_host.push_back(LogicalAddr(static_cast<std::uint32_t>(w * 64 + std::countr_zero(bits))));
            }
          }
        }
      },
      stream);
}

Status DeviceStep::StoreInto(TpAddressSpace& space, void* stream) {
  const Rank rank(impl_->rank);
  const GroupId group(impl_->group);
  return Store(
      &space, [&](ShardSource& now) { return Read(space, rank, group, now); },
      [&](DeviceShard& d) {
        TpGroupShard& sh = StateOf(space).at(rank, group);
        for (std::size_t e = 0; e < d.records.size(); ++e) sh.home[e] = Location::FromBits(d.records[e]);
        StoreShard(sh, sh.device_owner, d.device_owner, d.device_free, d.host_free, d.pb(impl_->args.pb));
      },
      stream);
}

Status DeviceStep::Reload(const ShardSource& src, void* stream) {
  Impl& m = *impl_;
  auto over = [&](const char* field, std::size_t have, std::uint32_t cap) {
    return MakeError(ErrorCode::kResourceExhausted,
                     fmt::format("DeviceStep::Reload: the space needs {} = {} (the step was sized for {}): re-create "
                                 "the step with a larger DeviceStepConfig::{}", field, have, cap, field));
  };
  if (src.owner.size() > m.owner_cap || src.records.size() > m.table_cap) {
    return over("max_addresses", src.owner.size(), m.owner_cap);
  }
  if (src.tags.size() > m.request_cap) return over("max_requests", src.tags.size(), m.request_cap);
  if (src.adopted.size() > m.adopted_cap) return over("max_adopted", src.adopted.size(), m.adopted_cap);
  ULA_RETURN_IF_ERROR(Load(src, stream));
  return m.Enqueued(m.Sync(stream), "Reload");
}

Status DeviceStep::Reload(const AddressSpace& space, void* stream) {
  ULA_RETURN_IF_ERROR(CheckSameSpace(&space, "Reload"));
  ULA_RETURN_IF_ERROR(CheckStored("Reload"));
  ShardSource src;
  ULA_RETURN_IF_ERROR(Read(space, Rank(impl_->rank), GroupId(impl_->group), src));
  return Reload(src, stream);
}

Status DeviceStep::Reload(const TpAddressSpace& space, void* stream) {
  ULA_RETURN_IF_ERROR(CheckSameSpace(&space, "Reload"));
  ULA_RETURN_IF_ERROR(CheckStored("Reload"));
  ShardSource src;
  ULA_RETURN_IF_ERROR(Read(space, Rank(impl_->rank), GroupId(impl_->group), src));
  return Reload(src, stream);
}

Status DeviceStep::CheckStored(const char* what) const {
  if (!impl_->dirty) return Ok();
  return MakeError(ErrorCode::kFailedPrecondition,
                   fmt::format("DeviceStep::{}: the step moved entries since it last loaded or stored its state: "
                               "StoreInto the space first (a reload would drop those moves)", what));
}

Status DeviceStep::Accept(const StepArrays& arrays, const char* what) {
  Impl& m = *impl_;
  auto bad = [what](std::string msg) { return MakeError(ErrorCode::kInvalidArgument, fmt::format("DeviceStep::{}: {}", what, msg)); };
  ULA_RETURN_IF_ERROR(m.RefuseIfFailed(what));
  ULA_RETURN_IF_ERROR(RefuseWhilePending(m.pending, m.checked, what));
  ULA_RETURN_IF_ERROR(RefuseWhilePlacing(m.placing, what));
  if (arrays.selections == nullptr || arrays.requests == nullptr || arrays.indices == nullptr ||
      arrays.descriptors == nullptr || arrays.stats == nullptr) {
    return bad("selections, requests, indices, descriptors and stats must not be null");
  }
  if (arrays.top_k == 0 || arrays.top_k > m.config.max_top_k) {
    return bad(fmt::format("top_k = {}: must be in [1, {}]", arrays.top_k, m.config.max_top_k));
  }
  if (arrays.num_rows > m.config.max_rows || arrays.batch > m.config.max_batch || arrays.q_len == 0) {
    return bad(fmt::format("{} rows of a batch of {} (q_len {}) exceed the step's maximum of {} rows, batch {}",
                           arrays.num_rows, arrays.batch, arrays.q_len, m.config.max_rows, m.config.max_batch));
  }
  if (arrays.selection_stride < arrays.top_k || arrays.index_stride < arrays.top_k) {
    return bad(fmt::format("strides {} (selections) and {} (indices) must be >= top_k = {}", arrays.selection_stride,
                           arrays.index_stride, arrays.top_k));
  }
  if (arrays.row_batch == nullptr && std::uint64_t{arrays.num_rows} != std::uint64_t{arrays.batch} * arrays.q_len) {
    return bad(fmt::format("{} rows without row_batch: must be batch * q_len = {}", arrays.num_rows,
                           std::uint64_t{arrays.batch} * arrays.q_len));
  }
  m.args.io = arrays;
  return Ok();
}

// The form's entry point `call` on the step's arguments: the CUDA form's on `stream`, the
// OpenMP form's under the step's team (its `stream` ignored).
#if defined(ULA_WITH_CUDA_KERNELS)
#define ULA_DEVICE_STEP_RUN(m, stream, call, ...)                                              \
  ((m).config.cuda ? kernels::gpu::call((stream), (m).args __VA_OPT__(, ) __VA_ARGS__)          \
                   : (OmpTeam((m).config.threads), kernels::omp::call(0, (m).args __VA_OPT__(, ) __VA_ARGS__)))
#else
#define ULA_DEVICE_STEP_RUN(m, stream, call, ...) \
  ((void)(stream), OmpTeam((m).config.threads), kernels::omp::call(0, (m).args __VA_OPT__(, ) __VA_ARGS__))
#endif

Status DeviceStep::Plan(const StepArrays& arrays, void* stream) {
  Impl& m = *impl_;
  if (m.args.num_ranks > 1) {
    return MakeError(ErrorCode::kFailedPrecondition,
                     fmt::format("DeviceStep::Plan: a TP step of {} ranks must agree its verdict: Check, reduce "
                                 "verdict() with MAX over the ranks, then Claim", m.args.num_ranks));
  }
  ULA_RETURN_IF_ERROR(Accept(arrays, "Plan"));
  ULA_RETURN_IF_ERROR(m.Enqueued(ULA_DEVICE_STEP_RUN(m, stream, DevicePlan), "Plan"));
  m.pending = true;
  m.dirty = true;
  return Ok();
}

Status DeviceStep::Check(const StepArrays& arrays, void* stream) {
  Impl& m = *impl_;
  ULA_RETURN_IF_ERROR(Accept(arrays, "Check"));
  ULA_RETURN_IF_ERROR(m.Enqueued(ULA_DEVICE_STEP_RUN(m, stream, DeviceCheck), "Check"));
  m.checked = true;
  return Ok();
}

const std::uint32_t* DeviceStep::verdict() const { return &impl_->args.ctl->error; }

Status DeviceStep::Claim(const std::uint32_t* agreed, void* stream) {
  Impl& m = *impl_;
  ULA_RETURN_IF_ERROR(m.RefuseIfFailed("Claim"));
  if (!m.checked) return MakeError(ErrorCode::kFailedPrecondition, "DeviceStep::Claim: no Check is pending");
  if (agreed == nullptr) return MakeError(ErrorCode::kInvalidArgument, "DeviceStep::Claim: agreed must not be null");
  // Refused or not, the check is used up: a refused Claim (the arena) claimed nothing.
  m.checked = false;
  ULA_RETURN_IF_ERROR(m.Enqueued(ULA_DEVICE_STEP_RUN(m, stream, DeviceClaim, agreed), "Claim"));
  m.pending = true;
  m.dirty = true;
  return Ok();
}

Status DeviceStep::Complete(const std::uint8_t* status, void* stream) {
  Impl& m = *impl_;
  ULA_RETURN_IF_ERROR(m.RefuseIfFailed("Complete"));
  if (!m.pending) return MakeError(ErrorCode::kFailedPrecondition, "DeviceStep::Complete: no plan is pending");
  if (status == nullptr && m.args.io.max_descriptors > 0) {
    return MakeError(ErrorCode::kInvalidArgument, "DeviceStep::Complete: status must not be null");
  }
  m.pending = false;
  m.dirty = true;
  return m.Enqueued(ULA_DEVICE_STEP_RUN(m, stream, DeviceComplete, status), "Complete");
}

Status DeviceStep::AdvanceRound(void* stream) {
  Impl& m = *impl_;
  ULA_RETURN_IF_ERROR(m.RefuseIfFailed("AdvanceRound"));
  if (m.checked || m.pending || m.placing) {
    return MakeError(ErrorCode::kFailedPrecondition, "DeviceStep::AdvanceRound: a plan, a check or a place is pending");
  }
  m.dirty = true;
  // The round's new entries on host are free to move from the next round on (the space's
  // AdvanceRound clears its list likewise), then PB-LRU's next round.
  const bool rebase = m.round == ~std::uint32_t{0};
  ULA_RETURN_IF_ERROR(m.Enqueued(ULA_DEVICE_STEP_RUN(m, stream, DeviceAdvanceRound, rebase), "AdvanceRound"));
  m.round = (rebase ? m.args.pb.recent + 2 : m.round) + 1;
  return Ok();
}

Status DeviceStep::Place(const PlacementArrays& p, void* stream) {
  Impl& m = *impl_;
  ULA_RETURN_IF_ERROR(m.RefuseIfFailed("Place"));
  if (!m.device_placement) {
    return MakeError(ErrorCode::kFailedPrecondition,
                     "DeviceStep::Place: the step's space places its own entries (AddressSpaceConfig.device_placement "
                     "is off)");
  }
  ULA_RETURN_IF_ERROR(RefuseWhilePending(m.pending, m.checked, "Place"));
  ULA_RETURN_IF_ERROR(RefuseWhilePlacing(m.placing, "Place"));
  auto bad = [](std::string msg) { return MakeError(ErrorCode::kInvalidArgument, "DeviceStep::Place: " + msg); };
  const DeviceStepConfig& c = m.config;
  struct Count {
    const char* what;
    std::uint32_t n, max;
    const char* field;
    const void* a;
    const void* b;
  };
  for (const Count& k : {Count{"num_seated", p.num_seated, c.max_place_seats, "max_place_seats", p.seated, p.seated_tags},
                         Count{"num_released", p.num_released, c.max_place_releases, "max_place_releases", p.released,
                               p.released},
                         Count{"num_new_requests", p.num_new_requests, c.max_place_requests, "max_place_requests",
                               p.new_requests, p.new_tags},
                         Count{"num_retired", p.num_retired, c.max_place_requests, "max_place_requests", p.retired,
                               p.retired}}) {
    if (k.n > k.max) return bad(fmt::format("{} = {}: past DeviceStepConfig::{} = {}", k.what, k.n, k.field, k.max));
    if (k.n > 0 && (k.a == nullptr || k.b == nullptr)) return bad(fmt::format("{} = {} with a null array", k.what, k.n));
  }
  if (p.locations == nullptr || p.evictions == nullptr || p.num_evictions == nullptr) {
    return bad("locations, evictions and num_evictions must not be null");
  }
  if (p.counts != nullptr && p.error == nullptr) {
    return bad("error must not be null with counts (the device's refusal of a count past its capacity is written there)");
  }
  if (!c.cuda) {  // the OpenMP form's arrays are host memory: their contents are checked too
    // With counts in memory, the entries the kernel will read; a count past its capacity is
    // the kernel's refusal of the whole place (the same in both forms): nothing to check.
    std::uint32_t n[4];
    kernels::PlaceCounts(p, n);
    PlacementArrays q = p;
    q.num_retired = n[0], q.num_new_requests = n[1], q.num_released = n[2], q.num_seated = n[3];
    auto over = [&](const char* what, std::uint32_t v, std::uint32_t cap, const char* field) {
      return MakeError(ErrorCode::kResourceExhausted,
                       fmt::format("DeviceStep::Place: {} {} is past the step's extent {} (DeviceStepConfig::{}): "
                                   "re-create the step with a larger one", what, v, cap, field));
    };
    for (std::uint32_t i = 0; i < q.num_seated; ++i) {
      if (p.seated[i] >= m.owner_cap) return over("address", p.seated[i], m.owner_cap, "max_addresses");
      if (p.seated_tags[i] == 0) return bad(fmt::format("seat {}: owner tag 0", i));
    }
    for (std::uint32_t i = 0; i < q.num_released; ++i) {
      if (p.released[i] >= m.owner_cap) return over("address", p.released[i], m.owner_cap, "max_addresses");
    }
    for (std::uint32_t i = 0; i < q.num_new_requests; ++i) {
      if (p.new_requests[i] >= m.request_cap) return over("request id", p.new_requests[i], m.request_cap, "max_requests");
      if (p.new_tags[i] == 0) return bad(fmt::format("new request {}: owner tag 0", p.new_requests[i]));
    }
    for (std::uint32_t i = 0; i < q.num_retired; ++i) {
      if (p.retired[i] >= m.request_cap) return over("request id", p.retired[i], m.request_cap, "max_requests");
    }
  }
  m.args.place.io = p;
  ULA_RETURN_IF_ERROR(m.Enqueued(ULA_DEVICE_STEP_RUN(m, stream, DevicePlace), "Place"));
  m.placing = true;
  m.dirty = true;
  return Ok();
}

Status DeviceStep::CompletePlace(const std::uint8_t* status, void* stream) {
  Impl& m = *impl_;
  ULA_RETURN_IF_ERROR(m.RefuseIfFailed("CompletePlace"));
  if (!m.placing) return MakeError(ErrorCode::kFailedPrecondition, "DeviceStep::CompletePlace: no place is pending");
  if (status == nullptr && m.args.place.max_seats > 0) {
    return MakeError(ErrorCode::kInvalidArgument, "DeviceStep::CompletePlace: status must not be null");
  }
  m.placing = false;
  return m.Enqueued(ULA_DEVICE_STEP_RUN(m, stream, DevicePlaceComplete, status), "CompletePlace");
}

Result<DeviceStepState> DeviceStep::ReadState(void* stream) const {
  const Impl& m = *impl_;
  ULA_RETURN_IF_ERROR(m.RefuseIfFailed("ReadState"));
  const kernels::DeviceStepArgs& a = m.args;
  kernels::KernelError error = m.Sync(stream);  // the first failure; the calls after it are skipped
  DeviceStepState s;
  auto read = [&](auto& v, const auto* src, std::size_t n) {
    v.resize(n);
    if (error == kernels::kKernelOk) error = m.Copy(stream, v.data(), src, n * sizeof(v[0]));
  };
  // Device placement: Place seats addresses past the loaded extent, so the whole table.
  read(s.records, a.records, m.device_placement ? m.table_cap : m.loaded_table);
  read(s.device_owner, a.device_owner, m.device_capacity);
  read(s.device_free, a.device_free.words, a.device_free.num_words);
  read(s.host_free, a.host_free.words, a.host_free.num_words);
  read(s.stamps, a.pb.stamps, a.pb.capacity);
  read(s.owner, a.owner, m.owner_cap);
  read(s.request_tags, a.request_tags, m.request_cap);
  read(s.bucket_words, a.pb.words, std::size_t{a.pb.recent + 2} * a.pb.num_words);
  kernels::PbLruClock clock;
  kernels::DeviceStepControl ctl;
  kernels::PlaceControl place;
  if (error == kernels::kKernelOk) error = m.Copy(stream, &clock, a.pb.clock, sizeof(clock));
  if (error == kernels::kKernelOk) error = m.Copy(stream, &ctl, a.ctl, sizeof(ctl));
  if (error == kernels::kKernelOk && a.place.ctl != nullptr) error = m.Copy(stream, &place, a.place.ctl, sizeof(place));
  if (error == kernels::kKernelOk) error = m.Sync(stream);
  ULA_RETURN_IF_ERROR(m.Enqueued(error, "ReadState"));
  s.round = clock.round;
  s.cur = clock.cur;
  s.tracked = clock.tracked;
  // While a plan is pending its record has zeroed the counts for its Complete and kept the
  // last Complete's.
  s.published = m.pending ? ctl.last_published : ctl.published;
  s.failed = m.pending ? ctl.last_failed : ctl.failed;
  s.error = ctl.error;
  s.place_published = place.published;
  s.place_failed = place.failed;
  return s;
}

#undef ULA_DEVICE_STEP_RUN

}  // namespace ula
