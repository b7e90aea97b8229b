#include "ula/address_space.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <limits>

#include "space/address_space_state.h"
#include "space/pool_geometry.h"
#include "space/space_kinds.h"
#include "ula/check.h"
#include "core/digest.h"

namespace ula {

Status AddressSpaceConfig::Validate() const {
  ULA_RETURN_IF_ERROR(
      ValidatePoolGeometry("AddressSpaceConfig", num_ranks, num_groups, entry_bytes, device_bytes_per_rank));
  const std::uint64_t kMaxSlots = SlotId::kInvalidValue - 1;
  auto bad = [](std::string msg) { return MakeError(ErrorCode::kInvalidArgument, "AddressSpaceConfig." + msg); };
  if (group_layers.empty()) {
    if (entry_bytes % row() != 0) {
      return bad(fmt::format("row_bytes = {}: entry_bytes = {} is not a whole number of rows", row_bytes, entry_bytes));
    }
  } else {
    if (row_bytes == 0) return bad("row_bytes = 0: group_layers needs the bytes of one layer's row");
    if (group_layers.size() != num_groups) {
      return bad(fmt::format("group_layers has {} entries for {} groups", group_layers.size(), num_groups));
    }
    std::uint64_t largest = 0;
    for (std::uint32_t l : group_layers) {
      if (l == 0 || l > 65535) return bad(fmt::format("group_layers: {} layers, must be in [1, 65535]", l));
      largest = std::max<std::uint64_t>(largest, std::uint64_t{l} * row_bytes);
    }
    if (largest != entry_bytes) {
      return bad(fmt::format("entry_bytes = {}: with group_layers it is the largest group's entry ({})", entry_bytes,
                             largest));
    }
  }
  if (device_bytes_per_rank / bytes_per_address() == 0) {
    return bad(fmt::format("device_bytes_per_rank = {}: holds no address's entries ({} B over the groups)",
                           device_bytes_per_rank, bytes_per_address()));
  }
  if (device_bytes_per_rank / bytes_per_address() > kMaxSlots) {
    return bad(fmt::format("device_bytes_per_rank = {}: more than 2^32 - 2 slots per group", device_bytes_per_rank));
  }
  if (host_bytes_per_rank / bytes_per_address() > kMaxSlots) {
    return bad(fmt::format("host_bytes_per_rank = {}: more than 2^32 - 2 slots per group", host_bytes_per_rank));
  }
  if (page_tokens == 0 || page_tokens > 65536) {
    return bad(fmt::format("page_tokens = {}: must be in [1, 65536]", page_tokens));
  }
  ULA_RETURN_IF_ERROR(ValidateSpaceKinds(*this));
  return policy_options.Validate();
}

std::uint64_t AddressSpaceConfig::bytes_per_address() const {
  if (group_layers.empty()) return std::uint64_t{entry_bytes} * num_groups;  // as SlotsPerGroup splits them
  std::uint64_t total = 0;
  for (std::uint32_t l : group_layers) total += std::uint64_t{l} * row();
  return std::max<std::uint64_t>(total, 1);
}

std::uint32_t AddressSpaceConfig::device_slots_per_group() const {
  return static_cast<std::uint32_t>(device_bytes_per_rank / std::max<std::uint64_t>(bytes_per_address(), 1));
}
std::uint32_t AddressSpaceConfig::host_slots_per_group() const {
  return static_cast<std::uint32_t>(host_bytes_per_rank / std::max<std::uint64_t>(bytes_per_address(), 1));
}

AddressSpace::AddressSpace(const AddressSpaceConfig& config, Backend& backend, std::unique_ptr<State> state)
    : config_(config), backend_(backend), state_(std::move(state)) {}

AddressSpace::~AddressSpace() = default;

Result<std::unique_ptr<AddressSpace>> AddressSpace::Create(const AddressSpaceConfig& config, Backend& backend) {
  ULA_RETURN_IF_ERROR(config.Validate());
  auto state = std::make_unique<State>(backend, config.page_tokens);  // on failure its arenas are destroyed
  const std::uint32_t dev_slots = config.device_slots_per_group();
  const std::uint32_t host_slots = config.host_slots_per_group();
  auto fail = [](Error e) -> Result<std::unique_ptr<AddressSpace>> { return std::unexpected(std::move(e)); };
  // Per-layer regions of PaddedRows(slots) rows (address_space.h "Pools").
  auto make_pool = [&](Tier tier, Rank rank, std::uint32_t slots, std::uint32_t layers) {
    return state->arenas.MakePool(tier, rank, slots, config.row(), layers * PaddedRows(slots) * config.row());
  };
  state->pools.resize(config.num_ranks);
  for (std::uint32_t r = 0; r < config.num_ranks; ++r) {
    for (std::uint32_t g = 0; g < config.num_groups; ++g) {
      const std::uint32_t layers = config.layers_of(GroupId(g));
      auto device = make_pool(Tier::kDevice, Rank(r), dev_slots, layers);
      if (!device) return fail(device.error());
      auto host = make_pool(Tier::kHost, Rank(r), host_slots, layers);
      if (!host) return fail(host.error());
      auto policy = MakePolicy(config.policy, dev_slots, config.policy_options);
      if (!policy) return fail(policy.error());
      state->pools[r].push_back(GroupPools{std::move(*device), std::move(*host), std::move(*policy),
                                           std::vector<LogicalAddr>(dev_slots), layers,
                                           PaddedRows(dev_slots) * config.row(), PaddedRows(host_slots) * config.row(),
                                           {}, HostShadows{}});
      if (config.host_shadows) {
        GroupPools& gp = state->pools[r].back();
        gp.shadows.Enable(dev_slots, host_slots, gp.policy.get());
      }
    }
  }
  state->tables.resize(config.num_groups);
  state->stable_new_entries = config.stable_new_entries;
  state->host_shadows = config.host_shadows;
  return std::unique_ptr<AddressSpace>(new AddressSpace(config, backend, std::move(state)));
}

Status AddressSpace::AddRequest(RequestId request, Rank rank) {
  if (rank.value() >= config_.num_ranks) {
    return MakeError(ErrorCode::kOutOfRange,
                     fmt::format("rank {} is out of range ({} ranks)", rank.value(), config_.num_ranks));
  }
  return state_->dir.AddRequest(request, rank);
}

void AddressSpace::SetMoveExecutor(MoveExecutor executor) { state_->move_executor = std::move(executor); }

Status AddressSpace::RunMoves(std::span<const CopyDescriptor> moves) {
  if (state_->move_executor) return state_->move_executor(moves);
  // The space's own pools: one device -> host batch per (rank, group), waited on its fence.
  std::size_t i = 0;
  while (i < moves.size()) {
    const CopyDescriptor& first = moves[i];
    const GroupPools& gp = state_->at(Rank(first.src_rank), GroupId(first.group));
    CopyBatch batch{gp.device.arena().id, gp.host.arena().id, first.bytes, /*swap=*/false, {}};
    for (; i < moves.size() && moves[i].group == first.group && moves[i].src_rank == first.src_rank; ++i) {
      gp.AppendMoves(Tier::kDevice, SlotId(moves[i].src_slot), SlotId(moves[i].dst_slot), batch.moves);
    }
    auto fence = backend_.Submit(std::move(batch));
    if (!fence) return std::unexpected(fence.error());
    ULA_RETURN_IF_ERROR(backend_.Wait(*fence));
  }
  return Ok();
}

namespace {
// Device placement of one group for Allocate: every new entry goes to device, into a free
// slot or else into the slot of a victim that this round has not used (the policy's choice,
// moved to a host slot first); only once the device holds nothing but this round's entries
// does the rest go to host. Victims of every group are claimed and copied before anything
// is published: a failed copy publishes nothing (the victims stay on device). Host shadows:
// a victim with a live shadow goes back to it and moves no bytes; the victims' shadows leave
// the list before any other victim's host slot is chosen (a free slot, else the oldest
// shadow reclaimed), so none is reclaimed under its own victim.
struct GroupPlan {
  std::uint32_t into_free = 0;
  std::vector<SlotId> victims;      // device slots whose entries move to host
  std::vector<SlotId> victim_host;  // their host slots
  std::vector<bool> shadowed;       // [victims] its host slot is its shadow: no copy
};

// Claims the victims of every group on `rank` (stable_new_entries) and appends the copies
// that move them to host.
void PlanVictims(const AddressSpaceConfig& cfg, AddressSpace::State& st, Rank rank, std::uint32_t n_tokens,
                 std::vector<GroupPlan>& plans, std::vector<CopyDescriptor>& moves) {
  for (std::uint32_t g = 0; g < cfg.num_groups; ++g) {
    GroupPools& gp = st.at(rank, GroupId(g));
    GroupPlan& plan = plans[g];
    plan.into_free = std::min(n_tokens, gp.device.num_free());
    const std::uint64_t want =
        st.stable_new_entries ? std::min<std::uint64_t>(n_tokens - plan.into_free, gp.policy->NumEvictable()) : 0;
    plan.victims.resize(want);
    ULA_CHECK(gp.policy->ClaimVictims(plan.victims) == want);
    plan.victim_host.resize(want);
    plan.shadowed.assign(want, false);
    for (std::size_t k = 0; k < want; ++k) {
      plan.victim_host[k] = gp.shadows.Take(plan.victims[k]);
      plan.shadowed[k] = plan.victim_host[k].valid();
    }
    for (std::size_t k = 0; k < want; ++k) {
      if (plan.shadowed[k]) continue;  // its clean copy is on host: the table alone changes
      const SlotId v = plan.victims[k];
      auto host = gp.AllocateHost();
      ULA_CHECK(host.has_value());  // victims + host-placed entries = n_tokens - into_free <= host free
      plan.victim_host[k] = *host;
      // One layer's row, num_layers of them (step_arrays.h).
      moves.push_back(MakeCopyDescriptor(CopyOp::kCopy, {Tier::kDevice, rank.value(), v.value()},
                                         {Tier::kHost, rank.value(), host->value()}, gp.device_owner[v.value()].value(),
                                         static_cast<std::uint16_t>(g), cfg.row(),
                                         static_cast<std::uint16_t>(gp.num_layers)));
    }
  }
}

// After a failed copy: the copied victims' host slots go back, the shadows stay shadows.
void ReturnVictims(const AddressSpaceConfig& cfg, AddressSpace::State& st, Rank rank,
                   const std::vector<GroupPlan>& plans) {
  for (std::uint32_t g = 0; g < cfg.num_groups; ++g) {
    GroupPools& gp = st.at(rank, GroupId(g));
    const GroupPlan& plan = plans[g];
    for (std::size_t k = 0; k < plan.victims.size(); ++k) {
      if (plan.shadowed[k]) gp.shadows.Add(plan.victims[k], plan.victim_host[k]);  // still clean
      else ULA_CHECK(gp.host.Free(plan.victim_host[k]).has_value());
    }
  }
}

// Publishes group g's new entries `out` on `rank` once the victims' copies landed.
void PlaceGroup(AddressSpace::State& st, Rank rank, std::uint32_t g, const GroupPlan& plan,
                std::span<const LogicalAddr> out) {
  AddressRecords& table = st.tables[g];
  table.Reserve(st.dir.extent());
  GroupPools& gp = st.at(rank, GroupId(g));
  for (std::size_t k = 0; k < plan.victims.size(); ++k) {
    const LogicalAddr victim = gp.device_owner[plan.victims[k].value()];
    table.Set(victim, Location::Make(Tier::kHost, rank, plan.victim_host[k]));
  }
  for (std::size_t i = 0; i < out.size(); ++i) {
    const LogicalAddr a = out[i];
    if (i < plan.into_free) {
      const SlotId dev = *gp.device.Allocate();
      table.Set(a, Location::Make(Tier::kDevice, rank, dev));
      gp.device_owner[dev.value()] = a;
      gp.policy->Insert(dev);
    } else if (i < plan.into_free + plan.victims.size()) {
      const SlotId dev = plan.victims[i - plan.into_free];  // tracked, used in this round
      table.Set(a, Location::Make(Tier::kDevice, rank, dev));
      gp.device_owner[dev.value()] = a;
    } else {
      auto host = gp.AllocateHost();
      ULA_CHECK(host.has_value());  // capacity was checked by Allocate
      table.Set(a, Location::Make(Tier::kHost, rank, *host));
      if (st.stable_new_entries) gp.new_on_host.push_back(a);
    }
  }
  if (st.stable_new_entries && plan.into_free + plan.victims.size() < out.size()) {
    std::sort(gp.new_on_host.begin(), gp.new_on_host.end());
  }
}
}  // namespace

Result<std::vector<LogicalAddr>> AddressSpace::Allocate(RequestId request, std::uint32_t n_tokens) {
  State& st = *state_;
  ULA_RETURN_IF_ERROR(RefuseKinds(config_, "Allocate"));
  ULA_RETURN_IF_ERROR(st.dir.RefuseWhilePlanPending("Allocate"));
  RequestState* req = st.dir.Find(request);
  if (req == nullptr) return MakeError(ErrorCode::kNotFound, fmt::format("request {} is unknown", request.value()));
  const Rank rank = req->rank;
  for (std::uint32_t g = 0; g < config_.num_groups; ++g) {
    const GroupPools& gp = st.at(rank, GroupId(g));
    const std::uint64_t free = std::uint64_t{gp.device.num_free()} + gp.HostFree();
    if (n_tokens > free) {
      return MakeError(ErrorCode::kResourceExhausted,
                       fmt::format("request {}: {} new entries do not fit on rank {} group {} ({} free of {})",
                                   request.value(), n_tokens, rank.value(), g, free,
                                   std::uint64_t{gp.device.capacity()} + gp.host.capacity()));
    }
  }
  auto planned = st.dir.PlanPages(request, *req, n_tokens);
  if (!planned) return std::unexpected(std::move(planned).error());
  std::vector<GroupPlan> plans(config_.num_groups);
  std::vector<CopyDescriptor> moves;
  PlanVictims(config_, st, rank, n_tokens, plans, moves);
  if (!moves.empty()) {
    Status copied = RunMoves(moves);
    if (!copied) {
      ReturnVictims(config_, st, rank, plans);
      return MakeError(ErrorCode::kIo, fmt::format("request {}: moving {} device entries to host to make room for its "
                                                   "new tokens failed ({}); nothing allocated, the entries stay on "
                                                   "device", request.value(), moves.size(), copied.error().message()));
    }
  }
  st.dir.Append(*req, *planned);
  for (std::uint32_t g = 0; g < config_.num_groups; ++g) PlaceGroup(st, rank, g, plans[g], planned->addrs);
  ULA_EXPENSIVE_CHECK(*this);
  return std::move(planned->addrs);
}

namespace {
// Frees the entries of an address whose last holder let go (the directory's ReleaseFn): its
// slot in every group, its table entries.
void ReleaseEntries(const AddressSpaceConfig& cfg, AddressSpace::State& st, LogicalAddr a) {
  for (std::uint32_t g = 0; g < cfg.num_groups; ++g) {
    AddressRecords& table = st.tables[g];
    const Location loc = table.Get(a);
    GroupPools& gp = st.at(loc.rank(), GroupId(g));
    if (loc.tier() == Tier::kDevice) {
      gp.DropShadow(loc.slot());
      gp.policy->Remove(loc.slot());
      ULA_CHECK(gp.device.Free(loc.slot()).has_value());
      gp.device_owner[loc.slot().value()] = LogicalAddr::Invalid();
    } else {
      ULA_CHECK(gp.host.Free(loc.slot()).has_value());
    }
    table.Erase(a);
    if (gp.IsNewOnHost(a)) gp.new_on_host.erase(std::lower_bound(gp.new_on_host.begin(), gp.new_on_host.end(), a));
  }
}

Directory::ReleaseFn Releaser(const AddressSpaceConfig& cfg, AddressSpace::State& st) {
  return [&cfg, &st](LogicalAddr a) { ReleaseEntries(cfg, st, a); };
}
}  // namespace

Status AddressSpace::Free(RequestId request) {
  return Checked(*this, state_->dir.Free(request, Releaser(config_, *state_)));
}

Status AddressSpace::Truncate(RequestId request, std::uint32_t length) {
  return Checked(*this, state_->dir.Truncate(request, length, Releaser(config_, *state_)));
}

Status AddressSpace::ShareInto(RequestId request, std::span<const LogicalAddr> addrs) {
  const State& st = *state_;
  const RequestState* req = st.dir.Find(request);
  const Rank rank = req != nullptr ? req->rank : Rank::Invalid();
  // DP: an adopted address lives on the request's rank.
  auto on_rank = [&st, rank](LogicalAddr a) -> Status {
    const Rank at = st.tables[0].Get(a).rank();
    if (at == rank) return Ok();
    return MakeError(ErrorCode::kInvalidArgument, fmt::format("ShareInto: address {} lives on rank {}, not rank {}",
                                                              a.value(), at.value(), rank.value()));
  };
  return Checked(*this, state_->dir.ShareInto(request, addrs, on_rank));
}

Status AddressSpace::Retain(std::span<const LogicalAddr> addrs) {
  return Checked(*this, state_->dir.Retain(addrs));
}

Status AddressSpace::Release(std::span<const LogicalAddr> addrs) {
  return Checked(*this, state_->dir.Release(addrs, Releaser(config_, *state_)));
}

std::uint32_t AddressSpace::RefCount(LogicalAddr addr) const { return state_->dir.RefCount(addr); }

bool AddressSpace::Holds(RequestId request, LogicalAddr addr) const { return state_->dir.Holds(request, addr); }

namespace {
// The rows of an entry: layer l's row at first + l * stride.
struct EntryRows {
  std::byte* first = nullptr;
  std::uint64_t stride = 0;
  std::uint32_t layers = 1;
  std::uint32_t row = 0;
};

Result<EntryRows> EntryBytes(const AddressSpace& space, const AddressSpace::State& st, LogicalAddr addr,
                             GroupId group, std::size_t size) {
  const auto& cfg = space.config();
  if (group.value() >= cfg.num_groups) {
    return MakeError(ErrorCode::kOutOfRange, fmt::format("group {} is out of range ({} groups)", group.value(), cfg.num_groups));
  }
  if (size != cfg.entry_bytes_of(group)) {
    return MakeError(ErrorCode::kInvalidArgument,
                     fmt::format("an entry of group {} is {} bytes ({} layers x {}), not {}", group.value(),
                                 cfg.entry_bytes_of(group), cfg.layers_of(group), cfg.row(), size));
  }
  const Location loc = st.tables[group.value()].Get(addr);
  if (loc.is_none()) {
    return MakeError(ErrorCode::kNotFound, fmt::format("logical address {} is not live", addr.value()));
  }
  if (!space.backend().holds_bytes()) {
    return MakeError(ErrorCode::kUnsupported, "the counting backend holds no bytes");
  }
  const GroupPools& gp = st.at(loc.rank(), group);
  return EntryRows{gp.pool(loc.tier()).data(loc.slot()), gp.stride(loc.tier()), gp.num_layers, cfg.row()};
}
}  // namespace

Status AddressSpace::Write(LogicalAddr addr, GroupId group, std::span<const std::byte> data) {
  ULA_RETURN_IF_ERROR(state_->dir.RefuseWhilePlanPending("Write"));
  auto p = EntryBytes(*this, *state_, addr, group, data.size());
  if (!p) return std::unexpected(p.error());
  if (const std::uint32_t holders = refs::Holders(state_->dir.refs(addr)); holders > 1) {
    return MakeError(ErrorCode::kFailedPrecondition,
                     fmt::format("address {} is shared by {} holders: a shared entry is immutable (write a new "
                                 "address)", addr.value(), holders));
  }
  if (state_->host_shadows) {  // the new bytes are on device only: its host copy is no longer clean
    const Location loc = state_->tables[group.value()].Get(addr);
    if (loc.tier() == Tier::kDevice) state_->at(loc.rank(), group).DropShadow(loc.slot());
  }
  for (std::uint32_t l = 0; l < p->layers; ++l) std::memcpy(p->first + l * p->stride, data.data() + l * p->row, p->row);
#ifdef ULA_EXPENSIVE_CHECKS
  // Write changes bytes, never metadata: the full check runs on every 64th write (on every
  // one, the verifier's sanitizer run took 13 times as long).
  if (++state_->writes % 64 == 0) ULA_EXPENSIVE_CHECK(*this);
#endif
  return Ok();
}

Status AddressSpace::Read(LogicalAddr addr, GroupId group, std::span<std::byte> out) const {
  auto p = EntryBytes(*this, *state_, addr, group, out.size());
  if (!p) return std::unexpected(p.error());
  for (std::uint32_t l = 0; l < p->layers; ++l) std::memcpy(out.data() + l * p->row, p->first + l * p->stride, p->row);
  return Ok();
}

Result<Location> AddressSpace::Lookup(LogicalAddr addr, GroupId group) const {
  if (group.value() >= config_.num_groups) {
    return MakeError(ErrorCode::kOutOfRange, fmt::format("group {} is out of range", group.value()));
  }
  const Location loc = state_->tables[group.value()].Get(addr);
  if (loc.is_none()) return MakeError(ErrorCode::kNotFound, fmt::format("logical address {} is not live", addr.value()));
  return loc;
}

Result<std::span<const LogicalAddr>> AddressSpace::AddressesOf(RequestId request) const {
  return state_->dir.AddressesOf(request);
}

Result<Rank> AddressSpace::RankOf(RequestId request) const {
  const RequestState* req = state_->dir.Find(request);
  if (req == nullptr) return MakeError(ErrorCode::kNotFound, fmt::format("request {} is unknown", request.value()));
  return req->rank;
}

bool AddressSpace::IsLive(LogicalAddr addr) const { return !state_->tables[0].Get(addr).is_none(); }

void AddressSpace::AdvanceRound() {
  for (auto& rank : state_->pools) {
    for (auto& gp : rank) {
      gp.policy->AdvanceRound();
      gp.new_on_host.clear();
    }
  }
  ULA_EXPENSIVE_CHECK(*this);
}

std::uint64_t AddressSpace::num_live_addresses() const { return state_->dir.num_live(); }
std::uint32_t AddressSpace::num_requests() const { return state_->dir.num_requests(); }

namespace {
bool InRange(const AddressSpaceConfig& cfg, Rank rank, GroupId group) {
  return rank.value() < cfg.num_ranks && group.value() < cfg.num_groups;
}
}  // namespace

std::uint32_t AddressSpace::NumUsed(Rank rank, GroupId group, Tier tier) const {
  if (!InRange(config_, rank, group)) return 0;
  const GroupPools& gp = state_->at(rank, group);
  return tier == Tier::kDevice ? gp.device.num_used() : gp.HostUsed();
}
std::uint32_t AddressSpace::NumFree(Rank rank, GroupId group, Tier tier) const {
  if (!InRange(config_, rank, group)) return 0;
  const GroupPools& gp = state_->at(rank, group);
  return tier == Tier::kDevice ? gp.device.num_free() : gp.HostFree();
}
std::uint32_t AddressSpace::NumHostShadows(Rank rank, GroupId group) const {
  if (!InRange(config_, rank, group)) return 0;
  return state_->at(rank, group).shadows.size();
}

const std::byte* AddressSpace::DeviceSlotData(Rank rank, GroupId group, SlotId slot) const {
  if (!InRange(config_, rank, group)) return nullptr;
  const SlotPool& pool = state_->at(rank, group).device;
  if (!pool.IsAllocated(slot)) return nullptr;  // past the pool (SlotId::Invalid() too) or free
  return pool.data(slot);
}

std::span<const std::byte> AddressSpace::DevicePoolBytes(Rank rank, GroupId group) const {
  if (!InRange(config_, rank, group)) return {};
  const GroupPools& gp = state_->at(rank, group);
  const std::byte* base = gp.device.data(SlotId(0));
  if (base == nullptr) return {};
  return {base, static_cast<std::size_t>(gp.num_layers * gp.device_stride)};
}

std::span<const std::byte> AddressSpace::DeviceLayerBytes(Rank rank, GroupId group, std::uint32_t layer) const {
  if (!InRange(config_, rank, group)) return {};
  const GroupPools& gp = state_->at(rank, group);
  const std::byte* base = gp.device.data(SlotId(0));
  if (base == nullptr || layer >= gp.num_layers) return {};
  return {base + layer * gp.device_stride, static_cast<std::size_t>(gp.device_stride)};
}

MetadataReport AddressSpace::Metadata() const {
  // Per entry per group at full occupancy: every byte of metadata divided by the entries
  // the pools can hold.
  MetadataReport m;
  std::uint64_t capacity = 0, owner = 0, policy = 0, bitmaps = 0, shadows = 0;
  for (const auto& rank : state_->pools) {
    for (const auto& gp : rank) {
      capacity += std::uint64_t{gp.device.capacity()} + gp.host.capacity();
      owner += gp.device_owner.size() * sizeof(LogicalAddr);
      policy += gp.policy->MemoryBytes();
      bitmaps += gp.device.MetadataBytes() + gp.host.MetadataBytes();
      shadows += gp.shadows.MemoryBytes();
    }
  }
  const double cap = static_cast<double>(std::max<std::uint64_t>(capacity, 1));
  m.location_table = static_cast<double>(AddressRecords::kBytesPerEntry);
  m.device_owner = owner / cap;
  m.policy = policy / cap;
  m.free_bitmaps = bitmaps / cap;
  m.host_shadows = shadows / cap;
  // List + owner tag + reference counts (requests and cache, packed) per address.
  m.request_lists = static_cast<double>(sizeof(LogicalAddr) + 2 * sizeof(std::uint32_t)) / config_.num_groups;
  return m;
}

namespace {
constexpr std::uint16_t kNoRank = std::numeric_limits<std::uint16_t>::max();

auto Fail(std::string msg) { return MakeError(ErrorCode::kInternal, "AddressSpace: " + std::move(msg)); }

// Per (rank, tier) of one group: which slots the table locates, and how many.
struct Located {
  std::vector<std::vector<bool>> seen;  // [num_ranks * 2][capacity] slot already located
  std::vector<std::uint64_t> count;     // [num_ranks * 2]
  std::size_t at(Rank r, Tier t) const { return r.value() * 2 + static_cast<std::size_t>(t); }
};

// Group g's table: exactly the live addresses are located, each on its requests' rank, in an
// allocated slot that no other address holds; a device slot's owner map and policy agree.
Status CheckTable(const AddressSpaceConfig& cfg, const AddressSpace::State& st, std::uint32_t g,
                  const std::vector<std::uint16_t>& rank_of, Located& located) {
  const AddressRecords& table = st.tables[g];
  for (std::uint32_t a = 0; a < table.size(); ++a) {
    const Location loc = table.Get(LogicalAddr(a));
    const bool live = st.dir.IsLive(LogicalAddr(a));
    if (AddressRecords::StampOf(table.data()[a]) > table.epoch()) {
      return Fail(fmt::format("address {} group {}: dedup stamp from the future", a, g));
    }
    if (loc.is_none()) {
      if (live) return Fail(fmt::format("live address {} has no location in group {}", a, g));
      continue;
    }
    if (!live) return Fail(fmt::format("free address {} has a location in group {}", a, g));
    if (loc.rank().value() >= cfg.num_ranks || (rank_of[a] != kNoRank && loc.rank().value() != rank_of[a])) {
      return Fail(fmt::format("address {} is on rank {} but its request is on rank {}", a, loc.rank().value(), rank_of[a]));
    }
    const GroupPools& gp = st.at(loc.rank(), GroupId(g));
    const SlotPool& pool = loc.tier() == Tier::kDevice ? gp.device : gp.host;
    if (!pool.IsAllocated(loc.slot())) {
      return Fail(fmt::format("address {} group {} sits in free {} slot {}", a, g, TierName(loc.tier()), loc.slot().value()));
    }
    auto& seen_slots = located.seen[located.at(loc.rank(), loc.tier())];
    if (seen_slots.empty()) seen_slots.resize(pool.capacity());
    if (seen_slots[loc.slot().value()]) {
      return Fail(fmt::format("{} slot {} of rank {} group {} holds two addresses", TierName(loc.tier()),
                              loc.slot().value(), loc.rank().value(), g));
    }
    seen_slots[loc.slot().value()] = true;
    if (loc.tier() == Tier::kDevice) {
      if (gp.device_owner[loc.slot().value()] != LogicalAddr(a)) {
        return Fail(fmt::format("device slot {} owner map disagrees with address {}", loc.slot().value(), a));
      }
      if (!gp.policy->IsTracked(loc.slot())) {
        return Fail(fmt::format("device slot {} holds address {} but the policy does not track it", loc.slot().value(), a));
      }
    }
    ++located.count[located.at(loc.rank(), loc.tier())];
  }
  return Ok();
}

// The pools of (rank r, group g) against what the table locates there.
Status CheckPools(const AddressSpace::State& st, Rank rank, std::uint32_t g, const Located& located) {
  const std::uint32_t r = rank.value();
  const GroupPools& gp = st.at(rank, GroupId(g));
  const AddressRecords& table = st.tables[g];
  // Host shadows (sparse/host_shadows.h): each one's host slot is allocated and located by no
  // address; its device slot holds a live entry whose location is that slot.
  if (gp.shadows.enabled() != st.host_shadows) {
    return Fail(fmt::format("rank {} group {}: shadows {} but the space {}", r, g, gp.shadows.enabled(), st.host_shadows));
  }
  ULA_RETURN_IF_ERROR(gp.shadows.CheckInvariants());
  Status shadow_ok = Ok();
  const auto& host_seen = located.seen[located.at(rank, Tier::kHost)];
  gp.shadows.ForEach([&](SlotId d, SlotId h) {
    if (!shadow_ok) return;
    if (!gp.host.IsAllocated(h) || (!host_seen.empty() && host_seen[h.value()])) {
      shadow_ok = Fail(fmt::format("rank {} group {}: host shadow slot {} is free or an entry's location", r, g, h.value()));
      return;
    }
    const LogicalAddr a = gp.device_owner[d.value()];
    if (!gp.device.IsAllocated(d) || !a.valid() || table.Get(a) != Location::Make(Tier::kDevice, rank, d)) {
      shadow_ok = Fail(fmt::format("rank {} group {}: host shadow {} of device slot {} whose entry is not there", r, g,
                                   h.value(), d.value()));
    }
  });
  ULA_RETURN_IF_ERROR(shadow_ok);
  // Distinct slots: used counts equal located counts (plus the host shadows), and the owner
  // map has no extras.
  const std::uint64_t on_device = located.count[located.at(rank, Tier::kDevice)];
  const std::uint64_t on_host = located.count[located.at(rank, Tier::kHost)];
  if (gp.device.num_used() != on_device || gp.host.num_used() != on_host + gp.shadows.size()) {
    return Fail(fmt::format("rank {} group {}: pools hold {}/{} entries ({} host shadows) but the table locates {}/{}", r,
                            g, gp.device.num_used(), gp.host.num_used(), gp.shadows.size(), on_device, on_host));
  }
  ULA_RETURN_IF_ERROR(gp.device.CheckInvariants());
  ULA_RETURN_IF_ERROR(gp.host.CheckInvariants());
  ULA_RETURN_IF_ERROR(gp.policy->CheckInvariants());
  std::uint64_t tracked = 0;
  for (std::uint32_t s = 0; s < gp.device.capacity(); ++s) tracked += gp.policy->IsTracked(SlotId(s));
  if (tracked != gp.device.num_used()) {
    return Fail(fmt::format("rank {} group {}: policy tracks {} slots, {} are occupied", r, g, tracked, gp.device.num_used()));
  }
  return Ok();
}
}  // namespace

Status AddressSpace::CheckInvariants() const {
  const State& st = *state_;
  // The directory (directory.h), which also gives each address its requests' rank.
  std::vector<std::uint16_t> rank_of;
  ULA_RETURN_IF_ERROR(st.dir.CheckInvariants("AddressSpace", &rank_of));
  for (std::uint32_t g = 0; g < config_.num_groups; ++g) {
    if (st.tables[g].size() < st.dir.extent()) {
      return Fail(fmt::format("group {}: a table of {} for {} addresses", g, st.tables[g].size(), st.dir.extent()));
    }
    Located located{std::vector<std::vector<bool>>(config_.num_ranks * 2),
                    std::vector<std::uint64_t>(config_.num_ranks * 2, 0)};
    ULA_RETURN_IF_ERROR(CheckTable(config_, st, g, rank_of, located));
    for (std::uint32_t r = 0; r < config_.num_ranks; ++r) {
      ULA_RETURN_IF_ERROR(CheckPools(st, Rank(static_cast<std::uint16_t>(r)), g, located));
    }
  }
  return Ok();
}

std::uint64_t AddressSpace::DebugDigest() const {
  const State& st = *state_;
  StateDigest d;
  for (const AddressRecords& t : st.tables) {
    d.Add(t.size());
    for (std::uint32_t a = 0; a < t.size(); ++a) d.Add(t.Get(LogicalAddr(a)).bits());
  }
  for (const auto& per_rank : st.pools) {
    for (const GroupPools& gp : per_rank) {
      d.Add(gp.device.free_bitmap());
      d.Add(gp.host.free_bitmap());
      d.Add(gp.policy->DebugDigest());
      for (LogicalAddr a : gp.device_owner) d.Add(a.value());
      for (LogicalAddr a : gp.new_on_host) d.Add(a.value());
      d.Add(gp.shadows.size());
      gp.shadows.ForEach([&](SlotId dev, SlotId h) {
        d.Add(dev.value());
        d.Add(h.value());
      });
    }
  }
  st.dir.AddToDigest(d);
  return d.value();
}

}  // namespace ula
