#include "ula/address_space.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <limits>

#include "space/address_space_state.h"
#include "space/pool_geometry.h"
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
  auto state = std::make_unique<State>(backend);  // on failure its arenas are destroyed
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
  if (state_->requests.contains(request)) {
    return MakeError(ErrorCode::kAlreadyExists, fmt::format("request {} already exists", request.value()));
  }
  State& st = *state_;
  if (st.next_tag == 0 || st.next_tag == kSharedTag) {  // 2^32 - 2 requests so far: renumber the live ones 1..n
    st.next_tag = 1;
    for (auto& [id, req] : st.requests) {
      req.tag = st.next_tag++;
      for (LogicalAddr a : req.addrs) {  // its own allocations: the addresses it did not adopt
        if (!std::binary_search(req.adopted.begin(), req.adopted.end(), a)) st.owner[a.value()] = req.tag;
      }
    }
  }
  st.requests.emplace(request, RequestState{rank, {}, st.next_tag++, {}});
  return Ok();
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

Result<std::vector<LogicalAddr>> AddressSpace::Allocate(RequestId request, std::uint32_t n_tokens) {
  ULA_RETURN_IF_ERROR(state_->RefuseWhilePlanPending("Allocate"));
  State& st = *state_;
  auto it = st.requests.find(request);
  if (it == st.requests.end()) {
    return MakeError(ErrorCode::kNotFound, fmt::format("request {} is unknown", request.value()));
  }
  const Rank rank = it->second.rank;
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
  // Pages: token i of the list sits at offset i % P; a token at offset 0, or the first one
  // after a ShareInto (the list no longer ends in the open page), opens a fresh page.
  RequestState& req = it->second;
  const std::uint32_t P = config_.page_tokens;
  const std::uint64_t pos0 = req.addrs.size();
  std::uint64_t new_pages = 0;
  for (std::uint64_t i = 0; i < n_tokens; ++i) {
    const std::uint64_t pos = pos0 + i;
    new_pages += pos % P == 0 || (i == 0 && req.open_page == RequestState::kNoPage);
  }
  const std::uint64_t max_pages = std::uint64_t{LogicalAddr::kInvalidValue} / P;
  if (new_pages > st.free_pages.size() + (max_pages - st.next_page)) {
    return MakeError(ErrorCode::kResourceExhausted, "logical address space exhausted");
  }
  // Device placement: every new entry goes to device, into a free slot
  // or else into the slot of a victim that this round has not used (the policy's choice,
  // moved to a host slot first); only once the device holds nothing but this round's
  // entries does the rest go to host. Victims of every group are claimed and copied before
  // anything is published: a failed copy publishes nothing (the victims stay on device).
  // Host shadows: a victim with a live shadow goes back to it and moves no bytes; the
  // victims' shadows leave the list before any other victim's host slot is chosen (a free
  // slot, else the oldest shadow reclaimed), so none is reclaimed under its own victim.
  struct GroupPlan {
    std::uint32_t into_free = 0;
    std::vector<SlotId> victims;     // device slots whose entries move to host
    std::vector<SlotId> victim_host; // their host slots
    std::vector<bool> shadowed;      // [victims] its host slot is its shadow: no copy
  };
  std::vector<GroupPlan> plans(config_.num_groups);
  std::vector<CopyDescriptor> moves;
  for (std::uint32_t g = 0; g < config_.num_groups; ++g) {
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
                                         static_cast<std::uint16_t>(g), config_.row(),
                                         static_cast<std::uint16_t>(gp.num_layers)));
    }
  }
  if (!moves.empty()) {
    Status copied = RunMoves(moves);
    if (!copied) {
      for (std::uint32_t g = 0; g < config_.num_groups; ++g) {
        GroupPools& gp = st.at(rank, GroupId(g));
        const GroupPlan& plan = plans[g];
        for (std::size_t k = 0; k < plan.victims.size(); ++k) {
          if (plan.shadowed[k]) gp.shadows.Add(plan.victims[k], plan.victim_host[k]);  // still clean
          else ULA_CHECK(gp.host.Free(plan.victim_host[k]).has_value());
        }
      }
      return MakeError(ErrorCode::kIo, fmt::format("request {}: moving {} device entries to host to make room for its "
                                                   "new tokens failed ({}); nothing allocated, the entries stay on "
                                                   "device", request.value(), moves.size(), copied.error().message()));
    }
  }
  std::vector<LogicalAddr> out;
  out.reserve(n_tokens);
  std::uint32_t page = req.open_page;
  for (std::uint64_t i = 0; i < n_tokens; ++i) {
    const std::uint64_t pos = pos0 + i;
    if (pos % P == 0 || (i == 0 && page == RequestState::kNoPage)) {
      if (!st.free_pages.empty()) {
        page = st.free_pages.front();
        st.free_pages.pop_front();
      } else {
        page = st.next_page++;
      }
    }
    out.push_back(LogicalAddr(static_cast<std::uint32_t>(std::uint64_t{page} * P + pos % P)));
  }
  req.open_page = page;
  st.next_addr = static_cast<std::uint32_t>(std::uint64_t{st.next_page} * P);
  for (std::uint32_t g = 0; g < config_.num_groups; ++g) {
    AddressRecords& table = st.tables[g];
    table.Reserve(st.next_addr);
    GroupPools& gp = st.at(rank, GroupId(g));
    const GroupPlan& plan = plans[g];
    for (std::size_t k = 0; k < plan.victims.size(); ++k) {  // the victims' copies landed
      const LogicalAddr victim = gp.device_owner[plan.victims[k].value()];
      table.Set(victim, Location::Make(Tier::kHost, rank, plan.victim_host[k]));
    }
    for (std::uint32_t i = 0; i < n_tokens; ++i) {
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
        ULA_CHECK(host.has_value());  // capacity was checked above
        table.Set(a, Location::Make(Tier::kHost, rank, *host));
        if (st.stable_new_entries) gp.new_on_host.push_back(a);
      }
    }
    if (st.stable_new_entries && plan.into_free + plan.victims.size() < n_tokens) {
      std::sort(gp.new_on_host.begin(), gp.new_on_host.end());
    }
  }
  st.owner.resize(st.next_addr, 0);
  st.refs.resize(st.next_addr, 0);
  for (LogicalAddr a : out) {
    st.owner[a.value()] = it->second.tag;
    st.refs[a.value()] = State::kRequestRef;
  }
  auto& addrs = it->second.addrs;
  addrs.insert(addrs.end(), out.begin(), out.end());
  st.live += n_tokens;
  ULA_EXPENSIVE_CHECK(*this);
  return out;
}

namespace {
// Frees an address whose last holder let go: its slot in every group, its table entries;
// it joins the free FIFO.
void FreeAddress(const AddressSpaceConfig& cfg, AddressSpace::State& st, LogicalAddr a) {
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
  st.owner[a.value()] = 0;
  const std::uint32_t P = cfg.page_tokens;
  const std::uint32_t page = a.value() / P;
  const auto first = st.refs.begin() + std::size_t{page} * P;
  if (std::all_of(first, first + P, [](std::uint32_t r) { return r == 0; })) st.free_pages.push_back(page);
  --st.live;
}

// Ok iff every address is live, on `rank` unless it is invalid, and listed once.
Status CheckAddressList(const AddressSpace::State& st, std::span<const LogicalAddr> addrs, Rank rank,
                        const char* what) {
  std::vector<LogicalAddr> sorted(addrs.begin(), addrs.end());
  std::sort(sorted.begin(), sorted.end());
  if (auto d = std::adjacent_find(sorted.begin(), sorted.end()); d != sorted.end()) {
    return MakeError(ErrorCode::kInvalidArgument, fmt::format("{}: address {} is listed twice", what, d->value()));
  }
  for (LogicalAddr a : addrs) {
    if (a.value() >= st.next_addr || st.refs[a.value()] == 0) {
      return MakeError(ErrorCode::kNotFound, fmt::format("{}: logical address {} is not live (freed, or never "
                                                         "allocated)", what, a.value()));
    }
    const Rank at = st.tables[0].Get(a).rank();
    if (rank.valid() && at != rank) {
      return MakeError(ErrorCode::kInvalidArgument,
                       fmt::format("{}: address {} lives on rank {}, not rank {}", what, a.value(), at.value(),
                                   rank.value()));
    }
  }
  return Ok();
}
}  // namespace

Status AddressSpace::Free(RequestId request) {
  ULA_RETURN_IF_ERROR(state_->RefuseWhilePlanPending("Free"));
  State& st = *state_;
  auto it = st.requests.find(request);
  if (it == st.requests.end()) {
    return MakeError(ErrorCode::kNotFound, fmt::format("request {} is unknown or already freed", request.value()));
  }
  const std::uint32_t tag = it->second.tag;
  for (LogicalAddr a : it->second.addrs) {
    if ((st.refs[a.value()] -= State::kRequestRef) == 0) {
      FreeAddress(config_, st, a);
    } else if (st.owner[a.value()] == tag) {
      st.owner[a.value()] = kSharedTag;  // its other holders keep it where it is
    }
  }
  st.requests.erase(it);
  ULA_EXPENSIVE_CHECK(*this);
  return Ok();
}

Status AddressSpace::Truncate(RequestId request, std::uint32_t length) {
  ULA_RETURN_IF_ERROR(state_->RefuseWhilePlanPending("Truncate"));
  State& st = *state_;
  auto it = st.requests.find(request);
  if (it == st.requests.end()) {
    return MakeError(ErrorCode::kNotFound, fmt::format("Truncate: request {} is unknown", request.value()));
  }
  RequestState& req = it->second;
  if (length > req.addrs.size()) {
    return MakeError(ErrorCode::kOutOfRange, fmt::format("Truncate: request {} holds {} tokens, cannot keep {}",
                                                         request.value(), req.addrs.size(), length));
  }
  for (std::size_t i = length; i < req.addrs.size(); ++i) {
    const LogicalAddr a = req.addrs[i];
    if (st.owner[a.value()] != req.tag || st.refs[a.value()] != State::kRequestRef) {
      return MakeError(ErrorCode::kFailedPrecondition,
                       fmt::format("Truncate: token {} of request {} (address {}) is {}: a shared entry is "
                                   "immutable, only the request's own unshared tail can be rolled back",
                                   i, request.value(), a.value(),
                                   st.owner[a.value()] != req.tag ? "adopted (ShareInto)"
                                                                  : fmt::format("held by {} holders",
                                                                                refs::Holders(st.refs[a.value()]))));
    }
  }
  for (std::size_t i = length; i < req.addrs.size(); ++i) {
    st.refs[req.addrs[i].value()] = 0;
    FreeAddress(config_, st, req.addrs[i]);
  }
  req.addrs.resize(length);
  // Own allocations sit at offset (position % P) of their page ("Pages"), so the next token
  // continues the last kept one's page; after an adopted one it opens a fresh page.
  const bool own_last = length > 0 && st.owner[req.addrs.back().value()] == req.tag;
  req.open_page = own_last ? req.addrs.back().value() / config_.page_tokens : RequestState::kNoPage;
  ULA_EXPENSIVE_CHECK(*this);
  return Ok();
}

Status AddressSpace::ShareInto(RequestId request, std::span<const LogicalAddr> addrs) {
  ULA_RETURN_IF_ERROR(state_->RefuseWhilePlanPending("ShareInto"));
  State& st = *state_;
  auto it = st.requests.find(request);
  if (it == st.requests.end()) {
    return MakeError(ErrorCode::kNotFound, fmt::format("ShareInto: request {} is unknown", request.value()));
  }
  RequestState& req = it->second;
  ULA_RETURN_IF_ERROR(CheckAddressList(st, addrs, req.rank, "ShareInto"));
  for (LogicalAddr a : addrs) {
    if (st.Holds(req, a)) {
      return MakeError(ErrorCode::kAlreadyExists,
                       fmt::format("ShareInto: request {} already holds address {}", request.value(), a.value()));
    }
    if (st.request_refs(a) == State::kMaxRequestRefs) {
      return MakeError(ErrorCode::kResourceExhausted,
                       fmt::format("ShareInto: address {} is held by {} requests, the most there can be", a.value(),
                                   State::kMaxRequestRefs));
    }
  }
  req.addrs.insert(req.addrs.end(), addrs.begin(), addrs.end());
  if (!addrs.empty()) req.open_page = RequestState::kNoPage;  // the list no longer ends in it
  refs::MergeAdopted(req.adopted, addrs);
  for (LogicalAddr a : addrs) st.refs[a.value()] += State::kRequestRef;
  ULA_EXPENSIVE_CHECK(*this);
  return Ok();
}

Status AddressSpace::Retain(std::span<const LogicalAddr> addrs) {
  State& st = *state_;
  ULA_RETURN_IF_ERROR(CheckAddressList(st, addrs, Rank::Invalid(), "Retain"));
  for (LogicalAddr a : addrs) {
    if (st.cache_refs(a) == State::kMaxCacheRefs) {
      return MakeError(ErrorCode::kResourceExhausted,
                       fmt::format("Retain: address {} has {} cache references, the most there can be", a.value(),
                                   State::kMaxCacheRefs));
    }
  }
  for (LogicalAddr a : addrs) st.refs[a.value()] += State::kCacheRef;
  ULA_EXPENSIVE_CHECK(*this);
  return Ok();
}

Status AddressSpace::Release(std::span<const LogicalAddr> addrs) {
  ULA_RETURN_IF_ERROR(state_->RefuseWhilePlanPending("Release"));
  State& st = *state_;
  ULA_RETURN_IF_ERROR(CheckAddressList(st, addrs, Rank::Invalid(), "Release"));
  for (LogicalAddr a : addrs) {
    if (st.cache_refs(a) == 0) {
      return MakeError(ErrorCode::kFailedPrecondition,
                       fmt::format("Release: address {} has no cache reference to release (released twice?)",
                                   a.value()));
    }
  }
  for (LogicalAddr a : addrs) {
    if ((st.refs[a.value()] -= State::kCacheRef) == 0) FreeAddress(config_, st, a);
  }
  ULA_EXPENSIVE_CHECK(*this);
  return Ok();
}

std::uint32_t AddressSpace::RefCount(LogicalAddr addr) const {
  if (addr.value() >= state_->next_addr) return 0;
  return refs::Holders(state_->refs[addr.value()]);
}

bool AddressSpace::Holds(RequestId request, LogicalAddr addr) const {
  auto it = state_->requests.find(request);
  return it != state_->requests.end() && addr.value() < state_->next_addr && state_->Holds(it->second, addr);
}

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
  ULA_RETURN_IF_ERROR(state_->RefuseWhilePlanPending("Write"));
  auto p = EntryBytes(*this, *state_, addr, group, data.size());
  if (!p) return std::unexpected(p.error());
  if (const std::uint32_t holders = refs::Holders(state_->refs[addr.value()]); holders > 1) {
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
  auto it = state_->requests.find(request);
  if (it == state_->requests.end()) return MakeError(ErrorCode::kNotFound, fmt::format("request {} is unknown", request.value()));
  return std::span<const LogicalAddr>(it->second.addrs);
}

Result<Rank> AddressSpace::RankOf(RequestId request) const {
  auto it = state_->requests.find(request);
  if (it == state_->requests.end()) return MakeError(ErrorCode::kNotFound, fmt::format("request {} is unknown", request.value()));
  return it->second.rank;
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

std::uint64_t AddressSpace::num_live_addresses() const { return state_->live; }
std::uint32_t AddressSpace::num_requests() const { return static_cast<std::uint32_t>(state_->requests.size()); }

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

Status AddressSpace::CheckInvariants() const {
  const State& st = *state_;
  auto fail = [](std::string msg) { return MakeError(ErrorCode::kInternal, "AddressSpace: " + std::move(msg)); };
  // Holders of every address from the request lists: each list names an address at most
  // once; all holders of an address are on one rank; refs = lists + cache references.
  const std::uint32_t n = st.next_addr;
  constexpr std::uint16_t kNoRank = std::numeric_limits<std::uint16_t>::max();
  std::vector<std::uint16_t> rank_of(n, kNoRank);
  std::vector<std::uint32_t> listed(n, 0), own(n, 0), last_list(n, 0);
  if (st.owner.size() != n || st.refs.size() != n) {
    return fail(fmt::format("owner/refs sizes {}/{} != {} handed out", st.owner.size(), st.refs.size(), n));
  }
  std::uint32_t list_no = 0;
  for (const auto& [id, req] : st.requests) {
    ++list_no;
    if (req.tag == 0 || req.tag == kSharedTag) return fail(fmt::format("request {} has tag {}", id.value(), req.tag));
    if (!std::is_sorted(req.adopted.begin(), req.adopted.end()) ||
        std::adjacent_find(req.adopted.begin(), req.adopted.end()) != req.adopted.end()) {
      return fail(fmt::format("request {}: its adopted list is not sorted and distinct", id.value()));
    }
    std::size_t adopted = 0;
    for (LogicalAddr a : req.addrs) {
      if (a.value() >= n) return fail(fmt::format("request {} holds address {} never handed out", id.value(), a.value()));
      if (last_list[a.value()] == list_no) return fail(fmt::format("request {} lists address {} twice", id.value(), a.value()));
      last_list[a.value()] = list_no;
      if (rank_of[a.value()] != kNoRank && rank_of[a.value()] != req.rank.value()) {
        return fail(fmt::format("address {} is held by requests of ranks {} and {}", a.value(), rank_of[a.value()],
                                req.rank.value()));
      }
      rank_of[a.value()] = req.rank.value();
      ++listed[a.value()];
      const bool is_own = st.owner[a.value()] == req.tag;
      const bool is_adopted = std::binary_search(req.adopted.begin(), req.adopted.end(), a);
      if (is_own == is_adopted) {
        return fail(fmt::format("address {} of request {} is {} its allocation and adopted", a.value(), id.value(),
                                is_own ? "both" : "neither"));
      }
      own[a.value()] += is_own;
      adopted += is_adopted;
    }
    if (adopted != req.adopted.size()) {
      return fail(fmt::format("request {} adopted {} addresses but lists {} of them", id.value(), req.adopted.size(), adopted));
    }
  }
  std::uint64_t live = 0;
  for (std::uint32_t a = 0; a < n; ++a) {
    if (st.request_refs(LogicalAddr(a)) != listed[a]) {
      return fail(fmt::format("address {}: {} request references but {} lists hold it", a,
                              st.request_refs(LogicalAddr(a)), listed[a]));
    }
    const std::uint32_t o = st.owner[a];
    if ((o == 0) != (st.refs[a] == 0)) return fail(fmt::format("address {}: owner tag {} with {} references", a, o, st.refs[a]));
    if (o != 0 && o != kSharedTag && own[a] != 1) {
      return fail(fmt::format("address {}: owner tag {} of no request that lists it", a, o));
    }
    live += st.refs[a] != 0;
  }
  if (live != st.live) return fail(fmt::format("{} referenced addresses but live = {}", live, st.live));
  // Pages: free pages are exactly those without a live address (each listed once), an open page is its request's and holds a live address.
  const std::uint32_t P = config_.page_tokens;
  if (std::uint64_t{st.next_page} * P != n) {
    return fail(fmt::format("{} pages of {} for {} addresses", st.next_page, P, n));
  }
  std::vector<std::uint32_t> page_live(st.next_page, 0);
  for (std::uint32_t a = 0; a < n; ++a) page_live[a / P] += st.refs[a] != 0;
  std::vector<bool> page_free(st.next_page, false);
  for (std::uint32_t p : st.free_pages) {
    if (p >= st.next_page || page_free[p] || page_live[p] != 0) {
      return fail(fmt::format("free page {} is past the end, listed twice or holds a live address", p));
    }
    page_free[p] = true;
  }
  for (std::uint32_t p = 0; p < st.next_page; ++p) {
    if (page_live[p] == 0 && !page_free[p]) return fail(fmt::format("page {} has no live address but is not free", p));
  }
  for (const auto& [id, req] : st.requests) {
    if (req.open_page == RequestState::kNoPage) continue;
    if (req.addrs.empty() || req.addrs.back().value() / P != req.open_page || st.owner[req.addrs.back().value()] != req.tag ||
        req.addrs.back().value() % P != (req.addrs.size() - 1) % P) {
      return fail(fmt::format("request {}: open page {} does not end its list", id.value(), req.open_page));
    }
  }
  for (std::uint32_t g = 0; g < config_.num_groups; ++g) {
    const AddressRecords& table = st.tables[g];
    std::vector<std::vector<bool>> seen(config_.num_ranks * 2);  // per (rank, tier): slot already located
    std::vector<std::uint64_t> count(config_.num_ranks * 2, 0);
    for (std::uint32_t a = 0; a < table.size(); ++a) {
      const Location loc = table.Get(LogicalAddr(a));
      const bool live = a < n && st.refs[a] != 0;
      if (AddressRecords::StampOf(table.data()[a]) > table.epoch()) {
        return fail(fmt::format("address {} group {}: dedup stamp from the future", a, g));
      }
      if (loc.is_none()) {
        if (live) return fail(fmt::format("live address {} has no location in group {}", a, g));
        continue;
      }
      if (!live) return fail(fmt::format("free address {} has a location in group {}", a, g));
      if (loc.rank().value() >= config_.num_ranks || (rank_of[a] != kNoRank && loc.rank().value() != rank_of[a])) {
        return fail(fmt::format("address {} is on rank {} but its request is on rank {}", a, loc.rank().value(), rank_of[a]));
      }
      const GroupPools& gp = st.at(loc.rank(), GroupId(g));
      const SlotPool& pool = loc.tier() == Tier::kDevice ? gp.device : gp.host;
      if (!pool.IsAllocated(loc.slot())) {
        return fail(fmt::format("address {} group {} sits in free {} slot {}", a, g, TierName(loc.tier()), loc.slot().value()));
      }
      auto& seen_slots = seen[loc.rank().value() * 2 + static_cast<int>(loc.tier())];
      if (seen_slots.empty()) seen_slots.resize(pool.capacity());
      if (seen_slots[loc.slot().value()]) {
        return fail(fmt::format("{} slot {} of rank {} group {} holds two addresses", TierName(loc.tier()),
                                loc.slot().value(), loc.rank().value(), g));
      }
      seen_slots[loc.slot().value()] = true;
      if (loc.tier() == Tier::kDevice) {
        if (gp.device_owner[loc.slot().value()] != LogicalAddr(a)) {
          return fail(fmt::format("device slot {} owner map disagrees with address {}", loc.slot().value(), a));
        }
        if (!gp.policy->IsTracked(loc.slot())) {
          return fail(fmt::format("device slot {} holds address {} but the policy does not track it", loc.slot().value(), a));
        }
      }
      ++count[loc.rank().value() * 2 + static_cast<int>(loc.tier())];
    }
    for (std::uint32_t r = 0; r < config_.num_ranks; ++r) {
      const GroupPools& gp = st.at(Rank(r), GroupId(g));
      // Host shadows (sparse/host_shadows.h): each one's host slot is allocated and located
      // by no address; its device slot holds a live entry whose location is that slot.
      if (gp.shadows.enabled() != st.host_shadows) return fail(fmt::format("rank {} group {}: shadows {} but the space {}", r, g, gp.shadows.enabled(), st.host_shadows));
      ULA_RETURN_IF_ERROR(gp.shadows.CheckInvariants());
      Status shadow_ok = Ok();
      const auto& host_seen = seen[r * 2 + static_cast<int>(Tier::kHost)];
      gp.shadows.ForEach([&](SlotId d, SlotId h) {
        if (!shadow_ok) return;
        if (!gp.host.IsAllocated(h) || (!host_seen.empty() && host_seen[h.value()])) {
          shadow_ok = fail(fmt::format("rank {} group {}: host shadow slot {} is free or an entry's location", r, g, h.value()));
          return;
        }
        const LogicalAddr a = gp.device_owner[d.value()];
        if (!gp.device.IsAllocated(d) || !a.valid() ||
            table.Get(a) != Location::Make(Tier::kDevice, Rank(r), d)) {
          shadow_ok = fail(fmt::format("rank {} group {}: host shadow {} of device slot {} whose entry is not there",
                                       r, g, h.value(), d.value()));
        }
      });
      ULA_RETURN_IF_ERROR(shadow_ok);
      // Distinct slots: used counts equal located counts (plus the host shadows), and the
      // owner map has no extras.
      if (gp.device.num_used() != count[r * 2] || gp.host.num_used() != count[r * 2 + 1] + gp.shadows.size()) {
        return fail(fmt::format("rank {} group {}: pools hold {}/{} entries ({} host shadows) but the table locates {}/{}",
                                r, g, gp.device.num_used(), gp.host.num_used(), gp.shadows.size(), count[r * 2],
                                count[r * 2 + 1]));
      }
      ULA_RETURN_IF_ERROR(gp.device.CheckInvariants());
      ULA_RETURN_IF_ERROR(gp.host.CheckInvariants());
      ULA_RETURN_IF_ERROR(gp.policy->CheckInvariants());
      std::uint64_t tracked = 0;
      for (std::uint32_t s = 0; s < gp.device.capacity(); ++s) tracked += gp.policy->IsTracked(SlotId(s));
      if (tracked != gp.device.num_used()) {
        return fail(fmt::format("rank {} group {}: policy tracks {} slots, {} are occupied", r, g, tracked, gp.device.num_used()));
      }
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
  std::uint64_t requests = 0;  // unordered: a sum of per-request hashes
  for (const auto& [id, r] : st.requests) {
    StateDigest rd;
    rd.Add(id.value());
    rd.Add(r.rank.value());
    rd.Add(r.tag);
    for (LogicalAddr a : r.addrs) rd.Add(a.value());
    for (LogicalAddr a : r.adopted) rd.Add(a.value());
    rd.Add(r.open_page);
    requests += rd.value();
  }
  for (std::uint32_t v : st.owner) d.Add(v);
  for (std::uint32_t v : st.refs) d.Add(v);
  d.Add(requests);
  d.Add(st.free_pages.size());
  for (std::uint32_t p : st.free_pages) d.Add(p);
  d.Add(st.next_addr);
  d.Add(st.live);
  return d.value();
}

}  // namespace ula
