#include "ula/address_space.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <optional>

#include "space/address_space_state.h"
#include "space/frame_share.h"
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
  if (device_placement) {  // docs/ARCHITECTURE.md, "The device step": the device step's modes, one kind
    if (!stable_new_entries) {
      return bad("device_placement: needs stable_new_entries (the device places new entries by its rule)");
    }
    if (host_shadows) return bad("device_placement: needs host_shadows off (the device step keeps no shadows)");
    if (!kinds.empty()) return bad("device_placement: a space with kinds places its entries on the host");
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
  if (kind_frame_bytes != 0) {  // the budget's frames, each holding its C4 slots (frame_share.h)
    const std::optional<FrameShare> share = FrameShareOf(*this);
    if (!share) return 0;
    const std::uint64_t slots = std::uint64_t{share->num_frames} * share->slots_per_frame;
    return static_cast<std::uint32_t>(std::min<std::uint64_t>(slots, SlotId::kInvalidValue));
  }
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
  auto state = std::make_unique<State>(backend, config.page_tokens, config.kinds);  // on failure its arenas are destroyed
  const std::uint32_t dev_slots = config.device_slots_per_group();
  const std::uint32_t host_slots = config.host_slots_per_group();
  state->pools.resize(config.num_ranks);
  // A space with kind frames: one arena of the budget's frames on rank 0, in which the C4
  // slots of group g are the C4 kind's layers of g, in blocks of 64 (frame_share.h).
  std::optional<Arena> budget;
  if (config.kind_frame_bytes != 0) {
    state->share = *FrameShareOf(config);  // Validate checked the kinds and the frame
    auto arena = state->arenas.MakeArena(Tier::kDevice, Rank(0),
                                         std::uint64_t{state->share.num_frames} * config.kind_frame_bytes);
    if (!arena) return std::unexpected(arena.error());
    budget = *arena;
  }
  for (std::uint32_t r = 0; r < config.num_ranks; ++r) {
    std::uint64_t layer_base = 0;  // the C4 kind's layers before group g
    for (std::uint32_t g = 0; g < config.num_groups; ++g) {
      ShardPools::Geometry geo{.rank = Rank(static_cast<std::uint16_t>(r)),
                               .group = GroupId(static_cast<std::uint16_t>(g)),
                               .device_slots = dev_slots,
                               .host_slots = host_slots,
                               .row_bytes = config.row(),
                               .num_layers = config.layers_of(GroupId(g)),
                               .layer_regions = true};
      if (budget) {
        geo.device_arena = &*budget;
        geo.device_blocks = SlotBlocks{layer_base * SlotBlocks::kRows * config.row(), state->share.block_stride};
      }
      layer_base += config.layers_of(GroupId(g));
      auto pools = ShardPools::Create(state->arenas, geo, config.policy, config.policy_options, config.host_shadows);
      if (!pools) return std::unexpected(pools.error());
      state->pools[r].push_back(std::move(*pools));
    }
  }
  state->tables.resize(config.num_groups);
  if (config.kind_frame_bytes != 0) {  // every kind from one budget (frame_share.h)
    auto frames = KindFrames::Create({config.kinds, config.device_bytes_per_rank, config.kind_frame_bytes,
                                      /*take_from_top=*/true},
                                     budget->data);
    if (!frames) return std::unexpected(frames.error());
    state->frames = std::make_unique<KindFrames>(std::move(*frames));
    state->kinds = KindEntries(config.kinds, state->frames.get(), host_slots);
  }
  state->stable_new_entries = config.stable_new_entries;
  state->host_shadows = config.host_shadows;
  state->device_placement = config.device_placement;
  state->journal.seated.resize(config.num_ranks);
  state->journal.released.resize(config.num_ranks);
  state->live_on_rank.assign(config.num_ranks, 0);
  return std::unique_ptr<AddressSpace>(new AddressSpace(config, backend, std::move(state)));
}

Status AddressSpace::AddRequest(RequestId request, Rank rank) {
  if (rank.value() >= config_.num_ranks) {
    return MakeError(ErrorCode::kOutOfRange,
                     fmt::format("rank {} is out of range ({} ranks)", rank.value(), config_.num_ranks));
  }
  State& st = *state_;
  if (st.device_placement && st.dir.TagsWrapNext() && !st.dir.requests().contains(request)) {
    // The wrap renumbers every live request's tags on the host: the device's owner tags
    // would no longer match, and a journal of the renumbering would be as large as the state.
    return MakeError(ErrorCode::kResourceExhausted,
                     "AddRequest: the owner tags wrapped (2^32 - 2 requests): in device placement mode the "
                     "device holds the tags; store the steps (DeviceStep::StoreInto) and re-create the space");
  }
  ULA_RETURN_IF_ERROR(st.dir.AddRequest(request, rank));
  if (st.device_placement) {
    st.request_pos[request.value()] = st.journal.new_requests.size();
    st.journal.new_requests.push_back({request, st.dir.Find(request)->tag, rank});
  }
  if (!state_->kinds.empty()) ULA_CHECK(state_->kinds.AddRequest(request));  // the directory knew no such request
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
    const Tier to = static_cast<Tier>(first.dst_tier);
    CopyBatch batch{gp.device.arena().id, gp.pool(to).arena().id, first.bytes, /*swap=*/false, {}};
    for (; i < moves.size() && moves[i].group == first.group && moves[i].src_rank == first.src_rank &&
           moves[i].dst_tier == first.dst_tier;
         ++i) {
      gp.AppendMoves(Tier::kDevice, SlotId(moves[i].src_slot), to, SlotId(moves[i].dst_slot), batch.moves);
    }
    auto fence = backend_.Submit(std::move(batch));
    if (!fence) return std::unexpected(fence.error());
    ULA_RETURN_IF_ERROR(backend_.Wait(*fence));
  }
  return Ok();
}

namespace {
// The kinds' entries of n_tokens more tokens; over frames, the frames that stayed free go
// back to the C4 share, and every frame a kind took was withheld (frame_share.h).
void AppendKinds(const AddressSpaceConfig& cfg, AddressSpace::State& st, RequestId request, std::uint32_t n_tokens) {
  st.kinds.Append(request, n_tokens);
  if (!st.frames) return;
  ReleaseFreeFrames(cfg, st, Rank(0));
  ULA_CHECK(st.frames->withheld_frames() == st.frames->num_frames() - st.frames->free_frames());
}

// Claims the victims of every group on `rank` (ShardPools::PlanVictims) and appends the
// copies that move them to host. Victims of every group are claimed and copied before
// anything is published: a failed copy publishes nothing (the victims stay on device).
void PlanVictims(const AddressSpaceConfig& cfg, AddressSpace::State& st, Rank rank, std::uint32_t n_tokens,
                 std::vector<ShardPools::VictimPlan>& plans, std::vector<CopyDescriptor>& moves) {
  for (std::uint32_t g = 0; g < cfg.num_groups; ++g) {
    GroupPools& gp = st.at(rank, GroupId(g));
    plans[g] = gp.PlanVictims(n_tokens, st.stable_new_entries);
    const ShardPools::VictimPlan& plan = plans[g];
    for (std::size_t k = 0; k < plan.victims.size(); ++k) {
      if (plan.shadowed[k]) continue;  // its clean copy is on host: the table alone changes
      const SlotId v = plan.victims[k];
      // One layer's row, num_layers of them (step_arrays.h).
      moves.push_back(MakeCopyDescriptor(CopyOp::kCopy, {Tier::kDevice, rank.value(), v.value()},
                                         {Tier::kHost, rank.value(), plan.victim_host[k].value()},
                                         gp.device_owner[v.value()].value(), static_cast<std::uint16_t>(g), cfg.row(),
                                         static_cast<std::uint16_t>(gp.num_layers)));
    }
  }
}
}  // namespace

Result<std::vector<LogicalAddr>> AddressSpace::Allocate(RequestId request, std::uint32_t n_tokens) {
  State& st = *state_;
  ULA_RETURN_IF_ERROR(st.dir.RefuseWhilePlanPending("Allocate"));
  RequestState* req = st.dir.Find(request);
  if (req == nullptr) return MakeError(ErrorCode::kNotFound, fmt::format("request {} is unknown", request.value()));
  const Rank rank = req->rank;
  if (st.device_placement) {
    // Addresses only (docs/ARCHITECTURE.md, "The device step"): the device places them when
    // it applies the journal, by the rule below for stable new entries.
    const std::uint64_t room = std::uint64_t{config_.device_slots_per_group()} + config_.host_slots_per_group();
    if (st.live_on_rank[rank.value()] + n_tokens > room) {
      return MakeError(ErrorCode::kResourceExhausted,
                       fmt::format("request {}: {} new entries do not fit on rank {} ({} live of {} slots per group)",
                                   request.value(), n_tokens, rank.value(), st.live_on_rank[rank.value()], room));
    }
    auto planned = st.dir.PlanPages(request, *req, n_tokens);
    if (!planned) return std::unexpected(std::move(planned).error());
    st.dir.Append(*req, *planned);
    for (AddressRecords& table : st.tables) table.Reserve(st.dir.extent());
    std::vector<PlacementJournal::Seat>& seats = st.journal.seated[rank.value()];
    for (LogicalAddr a : planned->addrs) {
      st.seat_pos[a.value()] = seats.size();
      seats.push_back({a, req->tag});
    }
    st.live_on_rank[rank.value()] += n_tokens;
    ULA_EXPENSIVE_CHECK(*this);
    return std::move(planned->addrs);
  }
  // With kinds, n_tokens are the model's tokens and the new addresses are the C4 entries
  // they complete (docs/ARCHITECTURE.md, "Kinds"): the rest of the path places them as
  // single-kind entries; the other kinds' entries are taken once they are placed.
  const bool kinds = !st.kinds.empty();
  std::uint32_t n_entries = n_tokens;
  if (kinds) {
    auto made = st.kinds.CheckAppend(request, n_tokens);
    if (!made) return std::unexpected(made.error());
    n_entries = made->entries;
    if (st.frames) {  // the frames the other kinds' new blocks may take leave the C4 share first
      ULA_RETURN_IF_ERROR(WithholdFrames(config_, st, rank, made->frames,
                                         [this](std::span<const CopyDescriptor> m) { return RunMoves(m); }));
    }
    if (n_entries == 0) {
      AppendKinds(config_, st, request, n_tokens);
      ULA_EXPENSIVE_CHECK(*this);
      return std::vector<LogicalAddr>{};
    }
  }
  for (std::uint32_t g = 0; g < config_.num_groups; ++g) {
    const GroupPools& gp = st.at(rank, GroupId(g));
    const std::uint64_t free = std::uint64_t{gp.NumFree(Tier::kDevice)} + gp.NumFree(Tier::kHost);
    if (n_entries > free) {
      ReleaseFreeFrames(config_, st, rank);
      return MakeError(ErrorCode::kResourceExhausted,
                       fmt::format("request {}: {} new entries do not fit on rank {} group {} ({} free of {})",
                                   request.value(), n_entries, rank.value(), g, free,
                                   std::uint64_t{gp.device.capacity()} + gp.host.capacity()));
    }
  }
  auto planned = st.dir.PlanPages(request, *req, n_entries);
  if (!planned) {
    ReleaseFreeFrames(config_, st, rank);
    return std::unexpected(std::move(planned).error());
  }
  std::vector<ShardPools::VictimPlan> plans(config_.num_groups);
  std::vector<CopyDescriptor> moves;
  PlanVictims(config_, st, rank, n_entries, plans, moves);
  if (!moves.empty()) {
    Status copied = RunMoves(moves);
    if (!copied) {
      for (std::uint32_t g = 0; g < config_.num_groups; ++g) st.at(rank, GroupId(g)).ReturnVictims(plans[g]);
      ReleaseFreeFrames(config_, st, rank);
      return MakeError(ErrorCode::kIo, fmt::format("request {}: moving {} device entries to host to make room for its "
                                                   "new tokens failed ({}); nothing allocated, the entries stay on "
                                                   "device", request.value(), moves.size(), copied.error().message()));
    }
  }
  st.dir.Append(*req, *planned);
  for (std::uint32_t g = 0; g < config_.num_groups; ++g) {
    AddressRecords& table = st.tables[g];
    table.Reserve(st.dir.extent());
    st.at(rank, GroupId(g)).PlaceNew(plans[g], /*moved=*/true, planned->addrs, st.stable_new_entries,
                                     [&table](LogicalAddr a, Location loc) { table.Set(a, loc); });
  }
  if (kinds) AppendKinds(config_, st, request, n_tokens);
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
    // Device placement: an address no StoreInto located has no slot here (the device frees it).
    if (!loc.is_none()) st.at(loc.rank(), GroupId(g)).FreeEntry(a, loc);
    table.Erase(a);
  }
}

// Device placement: the release of a (on `rank`) in the journal. A seat not yet taken is
// cancelled (the device never saw it); otherwise the device frees it.
void JournalRelease(AddressSpace::State& st, Rank rank, LogicalAddr a) {
  if (auto it = st.seat_pos.find(a.value()); it != st.seat_pos.end()) {
    st.journal.seated[rank.value()][it->second].tag = 0;
    st.seat_pos.erase(it);
  } else {
    st.journal.released[rank.value()].push_back(a);
  }
  st.live_on_rank[rank.value()] -= 1;
}

// `rank`: the request's (device placement records the release there).
Directory::ReleaseFn Releaser(const AddressSpaceConfig& cfg, AddressSpace::State& st, Rank rank = Rank(0)) {
  return [&cfg, &st, rank](LogicalAddr a) {
    ReleaseEntries(cfg, st, a);
    if (st.device_placement) JournalRelease(st, rank, a);
  };
}

// Device placement: sharing adds holders that the device's request table cannot follow.
Status RefuseSharing(const AddressSpace::State& st, const char* what) {
  if (!st.device_placement) return Ok();
  return MakeError(ErrorCode::kUnsupported,
                   fmt::format("{}: AddressSpaceConfig.device_placement is on: the device step's request table "
                               "keeps no adopted lists or cache references that the journal could update, so "
                               "shared prefixes are not built in this mode", what));
}
}  // namespace

Status AddressSpace::Free(RequestId request) {
  State& st = *state_;
  const RequestState* req = st.dir.Find(request);
  const Rank rank = req != nullptr ? req->rank : Rank(0);
  const std::uint32_t tag = req != nullptr ? req->tag : 0;
  Status freed = st.dir.Free(request, Releaser(config_, st, rank));
  if (freed && st.device_placement) {  // a request added since the last take is cancelled
    if (auto it = st.request_pos.find(request.value());
        it != st.request_pos.end() && st.journal.new_requests[it->second].tag == tag) {
      st.journal.new_requests[it->second].tag = 0;
      st.request_pos.erase(it);
    } else {
      st.journal.retired.push_back(request);
    }
  }
  if (freed && !st.kinds.empty()) {
    ULA_CHECK(st.kinds.Free(request));  // it knows every request the directory does
    ReleaseFreeFrames(config_, st, Rank(0));
  }
  return Checked(*this, std::move(freed));
}

Status AddressSpace::Truncate(RequestId request, std::uint32_t length) {
  State& st = *state_;
  if (st.kinds.empty()) {
    const RequestState* req = st.dir.Find(request);
    const Rank rank = req != nullptr ? req->rank : Rank(0);
    return Checked(*this, st.dir.Truncate(request, length, Releaser(config_, st, rank)));
  }
  // length is in tokens: the directory keeps the C4 entries of the kept tokens.
  auto keep = st.kinds.CheckTruncate(request, length);
  if (!keep) return std::unexpected(keep.error());
  ULA_RETURN_IF_ERROR(st.dir.Truncate(request, *keep, Releaser(config_, st)));
  st.kinds.Truncate(request, length);
  ReleaseFreeFrames(config_, st, Rank(0));
  return Checked(*this, Ok());
}

Status AddressSpace::ShareInto(RequestId request, std::span<const LogicalAddr> addrs) {
  const State& st = *state_;
  ULA_RETURN_IF_ERROR(RefuseSharing(st, "ShareInto"));
  if (!st.kinds.empty()) {
    return MakeError(ErrorCode::kUnsupported,
                     "ShareInto: a space with kinds adopts a prefix by SharePrefix: C4 entries alone would come "
                     "without the window, C128 entries and compressor state of their tokens (docs/ARCHITECTURE.md, "
                     "\"Kinds\")");
  }
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

Result<PrefixShare> AddressSpace::SharePrefix(RequestId request, RequestId source, std::uint32_t tokens) {
  State& st = *state_;
  ULA_RETURN_IF_ERROR(RefuseSharing(st, "SharePrefix"));
  if (st.kinds.empty()) {
    return MakeError(ErrorCode::kFailedPrecondition,
                     "SharePrefix: the space has no kinds (ShareInto adopts addresses)");
  }
  ULA_RETURN_IF_ERROR(st.dir.RefuseWhilePlanPending("SharePrefix"));
  const RequestState* req = st.dir.Find(request);
  const RequestState* src = st.dir.Find(source);
  if (req == nullptr || src == nullptr) {
    return MakeError(ErrorCode::kNotFound, fmt::format("SharePrefix: request {} is unknown",
                                                       (req == nullptr ? request : source).value()));
  }
  if (req->rank != src->rank) {
    return MakeError(ErrorCode::kInvalidArgument, fmt::format("SharePrefix: request {} is on rank {}, source {} on {}",
                                                              request.value(), req->rank.value(), source.value(),
                                                              src->rank.value()));
  }
  const std::uint32_t held = *st.kinds.TokensOf(source);
  if (tokens > held) {
    return MakeError(ErrorCode::kOutOfRange, fmt::format("SharePrefix: a prefix of {} tokens is longer than source "
                                                         "{} ({} tokens)", tokens, source.value(), held));
  }
  // Whole blocks of every kind; the tokens of the blocks still filling are recomputed.
  const std::uint32_t unit = KindEntries::ShareUnit(config_.kinds, config_.page_tokens);  // whole blocks
  const std::uint32_t resume = tokens / unit * unit;
  ULA_RETURN_IF_ERROR(st.kinds.CheckShare(request, source, resume, unit));
  const std::uint32_t E = config_.kinds[st.kinds.sparse_kind()].tokens_per_entry;
  const std::vector<LogicalAddr> prefix(src->addrs.begin(), src->addrs.begin() + resume / E);
  if (!prefix.empty()) ULA_RETURN_IF_ERROR(st.dir.ShareInto(request, prefix));  // same rank, live, not held
  PrefixShare out{resume, st.kinds.SharePrefix(request, source, resume)};
  ULA_RETURN_IF_ERROR(Checked(*this, Ok()));
  return out;
}

Status AddressSpace::Retain(std::span<const LogicalAddr> addrs) {
  ULA_RETURN_IF_ERROR(RefuseSharing(*state_, "Retain"));
  return Checked(*this, state_->dir.Retain(addrs));
}

Status AddressSpace::Release(std::span<const LogicalAddr> addrs) {
  ULA_RETURN_IF_ERROR(RefuseSharing(*state_, "Release"));
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
  if (loc.is_none() && st.device_placement && st.dir.IsLive(addr)) {
    return MakeError(ErrorCode::kFailedPrecondition,
                     fmt::format("logical address {} is live but unplaced here: in device placement mode its entry "
                                 "is where the device step put it (DeviceStep::StoreInto writes the locations)",
                                 addr.value()));
  }
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
    state_->at(loc.rank(), group).Written(loc);
  }
  for (std::uint32_t l = 0; l < p->layers; ++l) std::memcpy(p->first + l * p->stride, data.data() + l * p->row, p->row);
#ifdef ULA_EXPENSIVE_CHECKS
  // Write changes bytes, never metadata: the full check, O(live entries x groups), runs once
  // per WriteCheckStride writes, so that its cost stays a constant factor of the writes' (on
  // every write the verifier's sanitizer run took 13 times as long; on every 64th a prefill of
  // V4-Flash's 21 groups was quadratic in its length).
  if (++state_->writes >= WriteCheckStride(num_live_addresses(), config_.num_groups)) {
    state_->writes = 0;
    ULA_EXPENSIVE_CHECK(*this);
  }
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
  if (loc.is_none() && state_->device_placement && state_->dir.IsLive(addr)) {
    return MakeError(ErrorCode::kFailedPrecondition,
                     fmt::format("logical address {} is live but unplaced here (device placement mode: "
                                 "DeviceStep::StoreInto writes the locations)", addr.value()));
  }
  if (loc.is_none()) return MakeError(ErrorCode::kNotFound, fmt::format("logical address {} is not live", addr.value()));
  return loc;
}

Result<std::span<const LogicalAddr>> AddressSpace::AddressesOf(RequestId request) const {
  return state_->dir.AddressesOf(request);
}

Result<KindPages> AddressSpace::KindPagesOf(RequestId request, std::uint32_t kind) const {
  const State& st = *state_;
  if (st.kinds.empty()) {
    return MakeError(ErrorCode::kFailedPrecondition, "KindPagesOf: the space has no kinds (AddressSpaceConfig::kinds)");
  }
  if (kind >= st.kinds.num_kinds() || !st.kinds.addressed(kind)) return st.kinds.PagesOf(request, kind);
  // The sparse kind and its companions: the request's logical addresses, token i of its
  // list at offset i % P of its page (a shared prefix is whole pages, and the first entry
  // after it opens a fresh page), so its pages are the addresses at every P-th position.
  auto tokens = st.kinds.TokensOf(request);
  if (!tokens) return std::unexpected(tokens.error());
  const std::span<const LogicalAddr> addrs = st.dir.Find(request)->addrs;
  const std::uint32_t P = config_.page_tokens;
  KindPages p;
  p.tokens = *tokens;
  p.entries = static_cast<std::uint32_t>(addrs.size());
  p.entries_per_block = P;
  p.filling_tokens = *tokens % config_.kinds[kind].tokens_per_entry;
  for (std::size_t i = 0; i < addrs.size(); i += P) p.blocks.push_back(addrs[i].value() / P);
  return p;
}

Result<Rank> AddressSpace::RankOf(RequestId request) const {
  const RequestState* req = state_->dir.Find(request);
  if (req == nullptr) return MakeError(ErrorCode::kNotFound, fmt::format("request {} is unknown", request.value()));
  return req->rank;
}

bool AddressSpace::IsLive(LogicalAddr addr) const {
  if (state_->device_placement) return state_->dir.IsLive(addr);  // live addresses may be unplaced
  return !state_->tables[0].Get(addr).is_none();
}

bool PlacementJournal::empty() const {
  auto none = [](const auto& per_rank) {
    return std::all_of(per_rank.begin(), per_rank.end(), [](const auto& v) { return v.empty(); });
  };
  return new_requests.empty() && retired.empty() && none(seated) && none(released);
}

Result<PlacementJournal> AddressSpace::TakePlacement() {
  State& st = *state_;
  if (!st.device_placement) {
    return MakeError(ErrorCode::kFailedPrecondition,
                     "TakePlacement: the space places its entries itself (AddressSpaceConfig.device_placement is off)");
  }
  PlacementJournal out;
  out.seated.resize(config_.num_ranks);
  out.released.resize(config_.num_ranks);
  std::swap(out.released, st.journal.released);
  std::swap(out.retired, st.journal.retired);
  for (const PlacementJournal::NewRequest& r : st.journal.new_requests) {
    if (r.tag != 0) out.new_requests.push_back(r);  // tag 0: freed before the take
  }
  for (std::uint32_t r = 0; r < config_.num_ranks; ++r) {
    for (const PlacementJournal::Seat& seat : st.journal.seated[r]) {
      if (seat.tag != 0) out.seated[r].push_back(seat);  // tag 0: released before the take
    }
    st.journal.seated[r].clear();
  }
  st.journal.new_requests.clear();
  st.seat_pos.clear();
  st.request_pos.clear();
  return out;
}

void AddressSpace::AdvanceRound() {
  for (auto& rank : state_->pools) {
    for (auto& gp : rank) gp.AdvanceRound();
  }
  // The window rings free the round's tokens no later round reads (kind_entries.h, kRing).
  if (state_->kinds.EndRound() && state_->frames) ReleaseFreeFrames(config_, *state_, Rank(0));
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
  return state_->at(rank, group).NumUsed(tier);
}
std::uint32_t AddressSpace::NumFree(Rank rank, GroupId group, Tier tier) const {
  if (!InRange(config_, rank, group)) return 0;
  return state_->at(rank, group).NumFree(tier);
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
  if (!InRange(config_, rank, group) || state_->frames) return {};
  const GroupPools& gp = state_->at(rank, group);
  const std::byte* base = gp.device.data(SlotId(0));
  if (base == nullptr) return {};
  return {base, static_cast<std::size_t>(gp.num_layers * gp.device_stride)};
}

std::span<const std::byte> AddressSpace::DeviceLayerBytes(Rank rank, GroupId group, std::uint32_t layer) const {
  if (!InRange(config_, rank, group) || state_->frames) return {};
  const GroupPools& gp = state_->at(rank, group);
  const std::byte* base = gp.device.data(SlotId(0));
  if (base == nullptr || layer >= gp.num_layers) return {};
  return {base + layer * gp.device_stride, static_cast<std::size_t>(gp.device_stride)};
}

Result<LayerView> AddressSpace::DeviceLayerView(Rank rank, GroupId group, std::uint32_t layer) const {
  if (!InRange(config_, rank, group) || layer >= config_.layers_of(group)) {
    return MakeError(ErrorCode::kOutOfRange, fmt::format("DeviceLayerView: rank {} group {} layer {} is out of range",
                                                         rank.value(), group.value(), layer));
  }
  const GroupPools& gp = state_->at(rank, group);
  const SlotPool& pool = gp.device;
  constexpr std::uint32_t kRows = SlotBlocks::kRows;
  LayerView v;
  v.rows = kRows;
  v.row_bytes = config_.row();
  v.blocks = (pool.capacity() + kRows - 1) / kRows;
  // Linear regions: 64 rows of a layer's region are a block; blocks: the pool's own stride.
  v.block_stride = pool.blocks().block_stride != 0 ? pool.blocks().block_stride : std::uint64_t{kRows} * v.row_bytes;
  if (pool.arena().data != nullptr) v.base = pool.arena().data + pool.offset(SlotId(0)) + layer * gp.device_stride;
  return v;
}

Result<LayerView> AddressSpace::KindLayerView(std::uint32_t kind, std::uint32_t layer) const {
  const State& st = *state_;
  if (!st.frames) {
    return MakeError(ErrorCode::kFailedPrecondition, "KindLayerView: the space holds no kind frames "
                                                     "(AddressSpaceConfig::kind_frame_bytes)");
  }
  if (kind >= config_.kinds.size() || layer >= config_.kinds[kind].layers) {
    return MakeError(ErrorCode::kOutOfRange, fmt::format("KindLayerView: kind {} layer {} is out of range", kind, layer));
  }
  if (kind == st.kinds.sparse_kind()) {
    return MakeError(ErrorCode::kInvalidArgument, fmt::format("KindLayerView: kind {} is the sparse kind, whose "
                                                              "layers are its groups' (DeviceLayerView)", kind));
  }
  const StridedLayer l = st.frames->Layer(kind, layer);
  return LayerView{l.base, l.block_stride, l.blocks, l.rows, l.row_bytes};
}

Result<KindBudget> AddressSpace::KindBudgetOf() const {
  const State& st = *state_;
  if (!st.frames) {
    return MakeError(ErrorCode::kFailedPrecondition, "KindBudgetOf: the space holds no kind frames "
                                                     "(AddressSpaceConfig::kind_frame_bytes)");
  }
  KindBudget b = BudgetOf(*st.frames, st.kinds);
  b.c4_on_device = st.at(Rank(0), GroupId(0)).NumUsed(Tier::kDevice);  // where the pools hold them
  return b;
}

Result<std::uint32_t> AddressSpace::CompactKind(std::uint32_t kind) {
  State& st = *state_;
  if (!st.frames) {
    return MakeError(ErrorCode::kFailedPrecondition, "CompactKind: the space holds no kind frames "
                                                     "(AddressSpaceConfig::kind_frame_bytes)");
  }
  ULA_RETURN_IF_ERROR(st.dir.RefuseWhilePlanPending("CompactKind"));
  auto returned = st.kinds.Compact(kind, {});
  if (!returned) return std::unexpected(returned.error());
  ReleaseFreeFrames(config_, st, Rank(0));
  ULA_EXPENSIVE_CHECK(*this);
  return *returned;
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

// Group g's table: exactly the live addresses are located, each on its requests' rank, in
// its pools' slot (ShardPools::CheckEntry, counted in located[rank]).
Status CheckTable(const AddressSpaceConfig& cfg, const AddressSpace::State& st, std::uint32_t g,
                  const std::vector<std::uint16_t>& rank_of, std::vector<ShardPools::Occupancy>& located) {
  const AddressRecords& table = st.tables[g];
  for (std::uint32_t a = 0; a < table.size(); ++a) {
    const Location loc = table.Get(LogicalAddr(a));
    const bool live = st.dir.IsLive(LogicalAddr(a));
    if (AddressRecords::StampOf(table.data()[a]) > table.epoch()) {
      return Fail(fmt::format("address {} group {}: dedup stamp from the future", a, g));
    }
    if (loc.is_none()) {
      // Device placement: a live address is located only where a DeviceStep::StoreInto wrote it.
      if (live && !st.device_placement) return Fail(fmt::format("live address {} has no location in group {}", a, g));
      continue;
    }
    if (!live) return Fail(fmt::format("free address {} has a location in group {}", a, g));
    if (loc.rank().value() >= cfg.num_ranks || (rank_of[a] != kNoRank && loc.rank().value() != rank_of[a])) {
      return Fail(fmt::format("address {} is on rank {} but its request is on rank {}", a, loc.rank().value(), rank_of[a]));
    }
    ULA_RETURN_IF_ERROR(
        st.at(loc.rank(), GroupId(g)).CheckEntry("AddressSpace", LogicalAddr(a), loc, located[loc.rank().value()]));
  }
  return Ok();
}
}  // namespace

Status AddressSpace::CheckInvariants() const {
  const State& st = *state_;
  // The directory (directory.h), which also gives each address its requests' rank.
  std::vector<std::uint16_t> rank_of;
  ULA_RETURN_IF_ERROR(st.dir.CheckInvariants("AddressSpace", &rank_of));
  if (!st.kinds.empty()) {  // the kinds' entries (kind_entries.h); a request's addresses are its C4 entries
    ULA_RETURN_IF_ERROR(st.kinds.CheckInvariants("AddressSpace"));
    ULA_RETURN_IF_ERROR(CheckFrameShare(config_, st));
    if (st.kinds.num_requests() != st.dir.num_requests()) {
      return Fail(fmt::format("{} requests with kind entries, {} in the directory", st.kinds.num_requests(),
                              st.dir.num_requests()));
    }
    const std::uint32_t E = config_.kinds[st.kinds.sparse_kind()].tokens_per_entry;
    const std::uint32_t unit = KindEntries::ShareUnit(config_.kinds, config_.page_tokens);
    for (const auto& [id, req] : st.dir.requests()) {
      auto c4 = st.kinds.AddressedEntries(id);
      if (!c4) return Fail(fmt::format("request {} has no kind entries", id.value()));
      // Its adopted addresses are the C4 entries of its shared prefix, the first of its list,
      // in whole pages (kind_entries.h, "Shared prefixes").
      const std::uint32_t shared = *st.kinds.SharedTokensOf(id);
      bool prefix = req.adopted.size() == shared / E && shared % unit == 0;
      for (std::size_t i = 0; prefix && i < req.adopted.size(); ++i) {
        prefix = std::binary_search(req.adopted.begin(), req.adopted.end(), req.addrs[i]);
      }
      if (*c4 != req.addrs.size() || !prefix) {
        return Fail(fmt::format("request {} of {} tokens ({} shared) lists {} addresses ({} adopted), not its {} C4 "
                                "entries with the shared prefix's first", id.value(), *st.kinds.TokensOf(id), shared,
                                req.addrs.size(), req.adopted.size(), *c4));
      }
    }
  }
  for (std::uint32_t g = 0; g < config_.num_groups; ++g) {
    const AddressRecords& table = st.tables[g];
    if (table.size() < st.dir.extent()) {
      return Fail(fmt::format("group {}: a table of {} for {} addresses", g, table.size(), st.dir.extent()));
    }
    std::vector<ShardPools::Occupancy> located(config_.num_ranks);
    ULA_RETURN_IF_ERROR(CheckTable(config_, st, g, rank_of, located));
    auto locate = [&table](LogicalAddr a) { return table.Get(a); };
    for (std::uint32_t r = 0; r < config_.num_ranks; ++r) {
      ULA_RETURN_IF_ERROR(st.at(Rank(static_cast<std::uint16_t>(r)), GroupId(g))
                              .CheckInvariants("AddressSpace", located[r], locate, st.host_shadows,
                                               backend_.holds_bytes()));
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
    for (const GroupPools& gp : per_rank) gp.AddToDigest(d);
  }
  st.dir.AddToDigest(d);
  st.kinds.AddToDigest(d);
  return d.value();
}

}  // namespace ula
