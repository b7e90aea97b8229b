// TpAddressSpace: directory, shards and local buffers (see include/ula/tp_address_space.h
// for the structure and its invariants). Every mutating call validates all of its input
// before the first change, so an error leaves everything as it was.
#include "ula/tp_address_space.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <limits>

#include "space/pool_geometry.h"
#include "space/tp_state.h"
#include "ula/check.h"
#include "core/digest.h"

namespace ula {

std::string_view TpAttentionName(TpAttention a) {
  return a == TpAttention::kAtHome ? "at_home" : "local_buffer";
}

Result<TpAttention> ParseTpAttention(std::string_view name) {
  if (name == "local_buffer") return TpAttention::kLocalBuffer;
  if (name == "at_home") return TpAttention::kAtHome;
  return MakeError(ErrorCode::kInvalidArgument,
                   fmt::format("TP attention '{}' is unknown (local_buffer or at_home)", name));
}

namespace {
// The kinds' fields (tp_address_space.h, "Kinds"): ValidateKinds, then one sparse kind whose
// layers the groups hold, each group's entry a whole number of its rows.
Status ValidateKindsOf(const TpConfig& c) {
  if (c.kinds.empty()) return Ok();
  ULA_RETURN_IF_ERROR(ValidateKinds(c.kinds));
  auto bad = [](std::string msg) { return MakeError(ErrorCode::kInvalidArgument, "TpConfig." + msg); };
  const std::size_t s = SparseKindIndex(c.kinds);
  if (s == c.kinds.size()) return bad("kinds: no sparse kind; a space's groups are the selections of its sparse kind");
  const KvKind& sparse = c.kinds[s];
  if (c.entry_bytes % sparse.row_bytes != 0) {
    return bad(fmt::format("entry_bytes = {}: the groups hold the sparse kind '{}', whose row of {} B does not "
                           "divide it", c.entry_bytes, sparse.name, sparse.row_bytes));
  }
  const std::uint64_t layers = std::uint64_t{c.num_groups} * (c.entry_bytes / sparse.row_bytes);
  if (layers != sparse.layers) {
    return bad(fmt::format("num_groups = {}: the groups hold {} layers of the sparse kind '{}', which has {}",
                           c.num_groups, layers, sparse.name, sparse.layers));
  }
  return Ok();
}
}  // namespace

Status TpConfig::Validate() const {
  ULA_RETURN_IF_ERROR(ValidatePoolGeometry("TpConfig", num_ranks, num_groups, entry_bytes, device_bytes_per_rank));
  auto bad = [](std::string msg) { return MakeError(ErrorCode::kInvalidArgument, "TpConfig." + msg); };
  const std::uint64_t per_group = std::uint64_t{entry_bytes} * num_groups;
  if (attention != TpAttention::kLocalBuffer && attention != TpAttention::kAtHome) {
    return bad(fmt::format("attention = {}: unknown", static_cast<int>(attention)));
  }
  if (attention == TpAttention::kAtHome && buffer_bytes_per_rank != 0) {
    return bad(fmt::format("buffer_bytes_per_rank = {}: attention at home keeps no local buffer (must be 0)",
                           buffer_bytes_per_rank));
  }
  if (attention == TpAttention::kLocalBuffer && num_ranks > 1 && buffer_bytes_per_rank / per_group == 0) {
    return bad(fmt::format("buffer_bytes_per_rank = {}: holds no entry of {} B in each of {} groups",
                           buffer_bytes_per_rank, entry_bytes, num_groups));
  }
  const std::uint64_t shard = (device_bytes_per_rank + host_bytes_per_rank) / per_group;
  if (shard * num_ranks >= LogicalAddr::kInvalidValue || buffer_bytes_per_rank / per_group >= SlotId::kInvalidValue) {
    return bad("the pools hold more than 2^32 - 2 addresses over all ranks");
  }
  if (page_tokens == 0 || page_tokens > 65536) {
    return bad(fmt::format("page_tokens = {}: must be in [1, 65536]", page_tokens));
  }
  if ((shard + 1) * page_tokens >= LogicalAddr::kInvalidValue) {  // the home table (HomeEntries below)
    return bad(fmt::format("page_tokens = {}: a shard of {} entries per group would need a home table of more than "
                           "2^32 entries; lower page_tokens", page_tokens, shard));
  }
  ULA_RETURN_IF_ERROR(policy_options.Validate());
  return ValidateKindsOf(*this);
}

namespace {
// Entries of a shard's home table (indexed by address / P). T = 1: the shard's slots (a
// rank mints an address only when its free list is empty, i.e. all its minted ones are
// live). T > 1: a page is minted only when no page is free, i.e. every minted page holds a
// live address, so pages <= P * shard slots and addresses / P < shard slots * T.
std::size_t HomeEntries(const TpConfig& c) {
  return std::size_t{c.shard_slots_per_group()} * c.page_tokens + (c.page_tokens > 1 ? c.page_tokens : 0);
}
}  // namespace

std::uint32_t TpConfig::device_slots_per_group() const {
  return static_cast<std::uint32_t>(SlotsPerGroup(device_bytes_per_rank, entry_bytes, num_groups));
}
std::uint32_t TpConfig::host_slots_per_group() const {
  return static_cast<std::uint32_t>(SlotsPerGroup(host_bytes_per_rank, entry_bytes, num_groups));
}
std::uint32_t TpConfig::buffer_slots_per_group() const {
  return static_cast<std::uint32_t>(SlotsPerGroup(buffer_bytes_per_rank, entry_bytes, num_groups));
}

TpAddressSpace::TpAddressSpace(const TpConfig& config, Backend& backend, std::vector<Rank> hosted,
                               std::unique_ptr<State> state)
    : config_(config), backend_(backend), hosted_(std::move(hosted)), state_(std::move(state)) {}

TpAddressSpace::~TpAddressSpace() = default;

Result<std::unique_ptr<TpAddressSpace>> TpAddressSpace::Create(const TpConfig& config, Backend& backend,
                                                              std::span<const Rank> hosted_ranks) {
  ULA_RETURN_IF_ERROR(config.Validate());
  if (!config.kinds.empty() && config.attention != TpAttention::kAtHome) {
    return MakeError(ErrorCode::kUnsupported,
                     "TpConfig.attention = local_buffer with kinds: not built; the local buffer copies the selected "
                     "C4 entries of other ranks onto every rank, and a space with kinds keeps every entry on one rank "
                     "(docs/ARCHITECTURE.md, \"Kinds under TP\"); use attention = at_home");
  }
  std::vector<Rank> hosted(hosted_ranks.begin(), hosted_ranks.end());
  if (hosted.empty()) {
    for (std::uint32_t r = 0; r < config.num_ranks; ++r) hosted.push_back(Rank(static_cast<std::uint16_t>(r)));
  }
  std::sort(hosted.begin(), hosted.end());
  for (std::size_t i = 0; i < hosted.size(); ++i) {
    if (hosted[i].value() >= config.num_ranks) {
      return MakeError(ErrorCode::kOutOfRange, fmt::format("hosted rank {} is out of range ({} ranks)",
                                                           hosted[i].value(), config.num_ranks));
    }
    if (i > 0 && hosted[i] == hosted[i - 1]) {
      return MakeError(ErrorCode::kInvalidArgument, fmt::format("rank {} is hosted twice", hosted[i].value()));
    }
  }
  auto state = std::make_unique<State>(backend, config.page_tokens);  // on failure its arenas are destroyed
  const std::uint32_t dev = config.device_slots_per_group();
  const std::uint32_t host = config.host_slots_per_group();
  const std::uint32_t buf = config.buffer_slots_per_group();
  auto fail = [](Error e) -> Result<std::unique_ptr<TpAddressSpace>> { return std::unexpected(std::move(e)); };
  state->free_addrs.resize(config.num_ranks);
  state->minted.assign(config.num_ranks, 0);
  state->homed.assign(config.num_ranks, 0);
  state->shards.resize(config.num_ranks);
  for (Rank r : hosted) {
    for (std::uint32_t g = 0; g < config.num_groups; ++g) {
      const ShardPools::Geometry geo{.rank = r, .group = GroupId(static_cast<std::uint16_t>(g)), .device_slots = dev,
                                     .host_slots = host, .row_bytes = config.entry_bytes};
      auto pools = ShardPools::Create(state->arenas, geo, config.policy, config.policy_options, config.host_shadows);
      if (!pools) return fail(pools.error());
      auto buffer = state->arenas.MakePool(Tier::kDevice, r, buf, config.entry_bytes);
      if (!buffer) return fail(buffer.error());
      auto buffer_policy = MakePolicy(config.buffer_policy, buf, config.policy_options);
      if (!buffer_policy) return fail(buffer_policy.error());
      state->shards[r.value()].push_back(TpGroupShard{std::move(*pools), HomeTable(HomeEntries(config)),
                                                      std::move(*buffer), std::move(*buffer_policy),
                                                      std::vector<LogicalAddr>(buf), {}});
    }
  }
  state->stable_new_entries = config.stable_new_entries;
  state->host_shadows = config.host_shadows;
  if (!config.kinds.empty()) {  // every rank's share of the kinds (kind_entries.h, "A rank's share")
    for (std::uint32_t r = 0; r < config.num_ranks; ++r) {
      state->kinds.emplace_back(config.kinds, nullptr, 0, KindEntries::Share{r, config.num_ranks});
    }
    state->window_homed.assign(config.num_ranks, 0);
  }
  return std::unique_ptr<TpAddressSpace>(new TpAddressSpace(config, backend, std::move(hosted), std::move(state)));
}

bool TpAddressSpace::Hosts(Rank r) const {
  return r.value() < config_.num_ranks && !state_->shards[r.value()].empty();
}

Status TpAddressSpace::AddRequest(RequestId request) {
  State& st = *state_;
  ULA_RETURN_IF_ERROR(st.dir.AddRequest(request, Rank::Invalid()));
  if (st.kinds.empty()) return Ok();
  // Its window and compressor states go whole to one rank (tp_address_space.h, "Kinds").
  const Rank home = NextWindowHome(st);
  for (std::uint32_t r = 0; r < config_.num_ranks; ++r) {
    ULA_CHECK(st.kinds[r].AddRequest(request, r == home.value()));  // the directory knew no such request
  }
  st.window_home.emplace(request, home);
  ++st.window_homed[home.value()];
  return Ok();
}

namespace {
// The home rule's half of TpAddressSpace::Allocate: n_tokens new addresses for `req`, chosen
// but not taken ("Pages" in tp_address_space.h). page_tokens == 1: round robin from the
// cursor over the ranks with room, each rank's freed addresses first (FIFO), then its next
// minted one; `cursor` gets the cursor after them. Else the directory's pages, refused when
// a token's home rank (address mod P) would hold more than its shard.
Result<Directory::AddressPlan> PlanAddresses(const TpAddressSpace::State& st, const TpConfig& c, RequestId request,
                                             const Directory::Request& req, std::uint32_t n_tokens,
                                             std::uint32_t& cursor) {
  const std::uint32_t p = c.num_ranks;
  const std::uint32_t cap = c.shard_slots_per_group();
  std::vector<std::uint32_t> planned(st.homed);
  if (c.page_tokens > 1) {
    auto plan = st.dir.PlanPages(request, req, n_tokens);
    if (!plan) return plan;
    for (std::uint32_t i = 0; i < n_tokens; ++i) {
      const LogicalAddr a = plan->addrs[i];
      const std::uint32_t r = a.value() % p;
      if (++planned[r] > cap) {
        return MakeError(ErrorCode::kResourceExhausted,
                         fmt::format("request {}: {} new entries do not fit: token {} is homed on rank {} (address {} "
                                     "mod {}), whose shard of {} entries is full",
                                     request.value(), n_tokens, req.addrs.size() + i, r, a.value(), p, cap));
      }
    }
    return plan;
  }
  std::uint64_t room = 0;
  for (std::uint32_t r = 0; r < p; ++r) room += cap - st.homed[r];
  if (n_tokens > room) {
    return MakeError(ErrorCode::kResourceExhausted,
                     fmt::format("request {}: {} new entries do not fit: {} free entries over {} ranks of {} each",
                                 request.value(), n_tokens, room, p, cap));
  }
  Directory::AddressPlan plan;
  plan.addrs.resize(n_tokens);
  std::vector<std::uint32_t> taken(p, 0);
  cursor = st.cursor;
  for (std::uint32_t i = 0; i < n_tokens; ++i) {
    while (planned[cursor] >= cap) cursor = (cursor + 1) % p;
    const std::uint32_t k = taken[cursor]++;
    const auto& fifo = st.free_addrs[cursor];
    plan.addrs[i] = k < fifo.size()
                        ? fifo[k]
                        : LogicalAddr((st.minted[cursor] + (k - static_cast<std::uint32_t>(fifo.size()))) * p + cursor);
    ++planned[cursor];
    cursor = (cursor + 1) % p;
  }
  return plan;
}

// Takes the addresses PlanAddresses chose (page_tokens == 1: from the free FIFOs or minted)
// and counts them homed.
void TakeAddresses(TpAddressSpace::State& st, const TpConfig& c, std::span<const LogicalAddr> addrs,
                   std::uint32_t cursor) {
  const std::uint32_t p = c.num_ranks;
  if (c.page_tokens == 1) st.cursor = cursor;
  for (LogicalAddr a : addrs) {
    const std::uint32_t r = a.value() % p;
    ++st.homed[r];
    if (c.page_tokens > 1) continue;
    if (!st.free_addrs[r].empty() && st.free_addrs[r].front() == a) {
      st.free_addrs[r].pop_front();
    } else {
      ULA_CHECK(a.value() == st.minted[r] * p + r);
      ++st.minted[r];
    }
  }
}

// The shard's half of TpAddressSpace::Allocate: places the new entries `fresh` of one
// hosted rank and group (their home table entries) by ShardPools's placement: the victims'
// moves device -> host run in one batch, waited on before anything is published; a failed
// batch publishes nothing (the victims stay, and their share of the entries goes to host,
// pinned for the round with `stable`). Room on the shard was planned by TakeAddresses.
void PlaceNewEntries(const TpConfig& c, Backend& backend, TpGroupShard& sh, std::span<const LogicalAddr> fresh,
                     bool stable) {
  const ShardPools::VictimPlan plan = sh.PlanVictims(static_cast<std::uint32_t>(fresh.size()), stable);
  CopyBatch batch{sh.device.arena().id, sh.host.arena().id, c.entry_bytes, /*swap=*/false, {}};
  for (std::size_t k = 0; k < plan.victims.size(); ++k) {
    if (!plan.shadowed[k]) sh.AppendMoves(Tier::kDevice, plan.victims[k], plan.victim_host[k], batch.moves);
  }
  bool moved = true;
  if (!batch.moves.empty()) {
    auto fence = backend.Submit(std::move(batch));
    moved = fence.has_value() && backend.Wait(*fence).has_value();
  }
  if (!moved) sh.ReturnVictims(plan);
  const std::uint32_t p = c.num_ranks;
  sh.PlaceNew(plan, moved, fresh, stable, [&sh, p](LogicalAddr a, Location loc) { sh.home[a.value() / p] = loc; });
}
}  // namespace

Result<std::vector<LogicalAddr>> TpAddressSpace::Allocate(RequestId request, std::uint32_t n_tokens) {
  State& st = *state_;
  ULA_RETURN_IF_ERROR(st.dir.RefuseWhilePlanPending("Allocate"));
  Directory::Request* req = st.dir.Find(request);
  if (req == nullptr) return MakeError(ErrorCode::kNotFound, fmt::format("request {} is unknown", request.value()));
  // With kinds, n_tokens are the model's tokens and the addresses the C4 entries they
  // complete (address_space.h, "Kinds"); every rank's share of the other kinds follows.
  std::uint32_t n_entries = n_tokens;
  if (!st.kinds.empty()) {
    for (const KindEntries& share : st.kinds) {  // every rank counts alike; each checks its own share
      auto made = share.CheckAppend(request, n_tokens);
      if (!made) return std::unexpected(made.error());
      n_entries = made->entries;
    }
    if (n_entries == 0) {  // tokens in the compressor states only: no address
      for (KindEntries& share : st.kinds) share.Append(request, n_tokens);
      ULA_EXPENSIVE_CHECK(*this);
      return std::vector<LogicalAddr>{};
    }
  }
  std::uint32_t cursor = 0;
  auto plan = PlanAddresses(st, config_, request, *req, n_entries, cursor);
  if (!plan) return std::unexpected(std::move(plan).error());
  TakeAddresses(st, config_, plan->addrs, cursor);
  st.dir.Append(*req, *plan);
  for (KindEntries& share : st.kinds) share.Append(request, n_tokens);
  // The hosted shards (the directory above is every process's alike; what follows is each
  // process's own ranks and never fails).
  const std::uint32_t p = config_.num_ranks;
  std::vector<LogicalAddr> fresh;
  for (Rank r : hosted_) {
    fresh.clear();
    for (LogicalAddr a : plan->addrs) {
      if (a.value() % p == r.value()) fresh.push_back(a);
    }
    if (fresh.empty()) continue;
    for (TpGroupShard& sh : st.shards[r.value()]) PlaceNewEntries(config_, backend_, sh, fresh, st.stable_new_entries);
  }
  ULA_EXPENSIVE_CHECK(*this);
  return std::move(plan->addrs);
}

// The directory's ReleaseFn: frees the entries of an address whose last holder let go (its
// buffer copies, its home entry and slot in every hosted group) and returns it to its home
// rank (page_tokens == 1: to the rank's free FIFO; else the directory frees its page).
void TpAddressSpace::FreeAddress(LogicalAddr a) {
  State& st = *state_;
  const std::uint32_t p = config_.num_ranks;
  const std::uint32_t r = a.value() % p;
  for (Rank hr : hosted_) {
    for (TpGroupShard& sh : st.shards[hr.value()]) sh.DropCopy(a);
  }
  for (TpGroupShard& sh : st.shards[r]) {  // none unless rank r is hosted here
    Location& loc = sh.home[a.value() / p];
    sh.FreeEntry(a, loc);
    loc = Location::None();
  }
  --st.homed[r];
  if (config_.page_tokens == 1) st.free_addrs[r].push_back(a);
}

Status TpAddressSpace::Free(RequestId request) {
  State& st = *state_;
  Status freed = st.dir.Free(request, [this](LogicalAddr a) { FreeAddress(a); });
  if (freed && !st.kinds.empty()) {
    for (KindEntries& share : st.kinds) ULA_CHECK(share.Free(request));  // they know every request the directory does
    auto home = st.window_home.find(request);
    --st.window_homed[home->second.value()];
    st.window_home.erase(home);
  }
  return Checked(*this, std::move(freed));
}

Status TpAddressSpace::Truncate(RequestId request, std::uint32_t length) {
  State& st = *state_;
  auto release = [this](LogicalAddr a) { FreeAddress(a); };
  if (st.kinds.empty()) return Checked(*this, st.dir.Truncate(request, length, release));
  // length is in tokens: the directory keeps the C4 entries of the kept tokens. Every rank
  // counts the request's tokens alike, so each share's check agrees (the window home's
  // refuses a rollback past its ring; the others apply the same rule to the same counts).
  std::uint32_t keep = 0;
  for (const KindEntries& share : st.kinds) {
    auto k = share.CheckTruncate(request, length);
    if (!k) return std::unexpected(k.error());
    keep = *k;
  }
  ULA_RETURN_IF_ERROR(st.dir.Truncate(request, keep, release));
  for (KindEntries& share : st.kinds) share.Truncate(request, length);
  return Checked(*this, Ok());
}

Status TpAddressSpace::ShareInto(RequestId request, std::span<const LogicalAddr> addrs) {
  if (!state_->kinds.empty()) {
    return MakeError(ErrorCode::kUnsupported,
                     "ShareInto: a TP space with kinds shares no prefix: SharePrefix, which shares every kind's "
                     "whole blocks, is built for the DP space only, and C4 entries alone would come without the "
                     "window, C128 entries and compressor state of their tokens (docs/ARCHITECTURE.md, \"Kinds\")");
  }
  return Checked(*this, state_->dir.ShareInto(request, addrs));
}

Status TpAddressSpace::Retain(std::span<const LogicalAddr> addrs) {
  return Checked(*this, state_->dir.Retain(addrs));
}

Status TpAddressSpace::Release(std::span<const LogicalAddr> addrs) {
  return Checked(*this, state_->dir.Release(addrs, [this](LogicalAddr a) { FreeAddress(a); }));
}

std::uint32_t TpAddressSpace::RefCount(LogicalAddr addr) const { return state_->dir.RefCount(addr); }

bool TpAddressSpace::Holds(RequestId request, LogicalAddr addr) const { return state_->dir.Holds(request, addr); }

namespace {

Status CheckEntryArgs(const TpConfig& cfg, const TpAddressSpace::State& st, LogicalAddr addr, GroupId group,
                      std::size_t size) {
  if (group.value() >= cfg.num_groups) {
    return MakeError(ErrorCode::kOutOfRange, fmt::format("group {} is out of range ({} groups)", group.value(), cfg.num_groups));
  }
  if (size != cfg.entry_bytes) {
    return MakeError(ErrorCode::kInvalidArgument, fmt::format("entry is {} bytes, not {}", cfg.entry_bytes, size));
  }
  if (!st.dir.IsLive(addr)) {
    return MakeError(ErrorCode::kNotFound, fmt::format("logical address {} is not live", addr.value()));
  }
  return Ok();
}

}  // namespace

Status TpAddressSpace::Write(LogicalAddr addr, GroupId group, std::span<const std::byte> data) {
  ULA_RETURN_IF_ERROR(state_->dir.RefuseWhilePlanPending("Write"));
  ULA_RETURN_IF_ERROR(CheckEntryArgs(config_, *state_, addr, group, data.size()));
  if (!backend_.holds_bytes()) return MakeError(ErrorCode::kUnsupported, "the counting backend holds no bytes");
  if (const std::uint32_t holders = refs::Holders(state_->dir.refs(addr)); holders > 1) {
    return MakeError(ErrorCode::kFailedPrecondition,
                     fmt::format("address {} is shared by {} holders: a shared entry is immutable (write a new "
                                 "address)", addr.value(), holders));
  }
  for (Rank r : hosted_) state_->at(r, group).DropCopy(addr);
  const Rank home = HomeOf(addr);
  if (Hosts(home)) {
    TpGroupShard& sh = state_->at(home, group);
    const Location loc = sh.home[addr.value() / config_.num_ranks];
    sh.Written(loc);
    const SlotPool& pool = sh.pool(loc.tier());
    std::memcpy(pool.data(loc.slot()), data.data(), data.size());
  }
#ifdef ULA_EXPENSIVE_CHECKS
  // Write drops buffer copies and changes bytes: the full check runs once per WriteCheckStride
  // writes (on every one, the TP verifier's sanitizer run took three times as long).
  if (++state_->writes >= WriteCheckStride(num_live_addresses(), config_.num_groups)) {
    state_->writes = 0;
    ULA_EXPENSIVE_CHECK(*this);
  }
#endif
  return Ok();
}

Status TpAddressSpace::Read(LogicalAddr addr, GroupId group, std::span<std::byte> out) const {
  ULA_RETURN_IF_ERROR(CheckEntryArgs(config_, *state_, addr, group, out.size()));
  if (!backend_.holds_bytes()) return MakeError(ErrorCode::kUnsupported, "the counting backend holds no bytes");
  const Rank home = HomeOf(addr);
  if (!Hosts(home)) {
    return MakeError(ErrorCode::kUnsupported, fmt::format("address {} is homed on rank {}, not hosted here",
                                                          addr.value(), home.value()));
  }
  const TpGroupShard& sh = state_->at(home, group);
  const Location loc = sh.home[addr.value() / config_.num_ranks];
  const SlotPool& pool = loc.tier() == Tier::kDevice ? sh.device : sh.host;
  std::memcpy(out.data(), pool.data(loc.slot()), out.size());
  return Ok();
}

Result<Location> TpAddressSpace::Lookup(LogicalAddr addr, GroupId group) const {
  if (group.value() >= config_.num_groups) {
    return MakeError(ErrorCode::kOutOfRange, fmt::format("group {} is out of range", group.value()));
  }
  if (!state_->dir.IsLive(addr)) {
    return MakeError(ErrorCode::kNotFound, fmt::format("logical address {} is not live", addr.value()));
  }
  const Rank home = HomeOf(addr);
  if (!Hosts(home)) return MakeError(ErrorCode::kUnsupported, fmt::format("rank {} is not hosted here", home.value()));
  return state_->at(home, group).home[addr.value() / config_.num_ranks];
}

Result<std::optional<SlotId>> TpAddressSpace::BufferSlot(Rank rank, LogicalAddr addr, GroupId group) const {
  if (rank.value() >= config_.num_ranks || group.value() >= config_.num_groups) {
    return MakeError(ErrorCode::kOutOfRange, fmt::format("rank {} / group {} is out of range", rank.value(), group.value()));
  }
  if (!Hosts(rank)) return MakeError(ErrorCode::kUnsupported, fmt::format("rank {} is not hosted here", rank.value()));
  if (!state_->dir.IsLive(addr)) {
    return MakeError(ErrorCode::kNotFound, fmt::format("logical address {} is not live", addr.value()));
  }
  const auto& buffered = state_->at(rank, group).buffered;
  auto it = buffered.find(addr.value());
  if (it == buffered.end()) return std::optional<SlotId>();
  return std::optional<SlotId>(it->second);
}

const std::byte* TpAddressSpace::RefData(Rank rank, GroupId group, TpReadRef ref) const {
  if (group.value() >= config_.num_groups || !Hosts(rank) || ref.reader != rank) return nullptr;
  if (ref.source != TpReadRef::Source::kShard && ref.source != TpReadRef::Source::kBuffer) return nullptr;
  const TpGroupShard& sh = state_->at(rank, group);
  const SlotPool& pool = ref.source == TpReadRef::Source::kShard ? sh.device : sh.buffer;
  if (!pool.IsAllocated(ref.slot)) return nullptr;  // past the pool (SlotId::Invalid() too) or free
  return pool.data(ref.slot);
}

Result<std::span<const LogicalAddr>> TpAddressSpace::AddressesOf(RequestId request) const {
  return state_->dir.AddressesOf(request);
}

bool TpAddressSpace::IsLive(LogicalAddr addr) const { return state_->dir.IsLive(addr); }

void TpAddressSpace::AdvanceRound() {
  for (Rank r : hosted_) {
    for (TpGroupShard& sh : state_->shards[r.value()]) sh.AdvanceRound();
  }
  // The window rings free the round's tokens no later round reads (kind_entries.h, kRing).
  for (KindEntries& share : state_->kinds) (void)share.EndRound();
  ULA_EXPENSIVE_CHECK(*this);
}

std::uint64_t TpAddressSpace::num_live_addresses() const { return state_->dir.num_live(); }
std::uint32_t TpAddressSpace::num_requests() const { return state_->dir.num_requests(); }
std::uint32_t TpAddressSpace::NumHomed(Rank r) const {
  return r.value() < config_.num_ranks ? state_->homed[r.value()] : 0;
}

std::uint32_t TpAddressSpace::NumUsed(Rank rank, GroupId group, Tier tier) const {
  if (!Hosts(rank) || group.value() >= config_.num_groups) return 0;
  return state_->at(rank, group).NumUsed(tier);
}
std::uint32_t TpAddressSpace::NumFree(Rank rank, GroupId group, Tier tier) const {
  if (!Hosts(rank) || group.value() >= config_.num_groups) return 0;
  return state_->at(rank, group).NumFree(tier);
}
std::uint32_t TpAddressSpace::NumBuffered(Rank rank, GroupId group) const {
  if (!Hosts(rank) || group.value() >= config_.num_groups) return 0;
  return state_->at(rank, group).buffer.num_used();
}

std::uint32_t TpAddressSpace::NumHostShadows(Rank rank, GroupId group) const {
  if (!Hosts(rank) || group.value() >= config_.num_groups) return 0;
  return state_->at(rank, group).shadows.size();
}

std::uint32_t TpAddressSpace::NumNewOnHost(Rank rank, GroupId group) const {
  if (!Hosts(rank) || group.value() >= config_.num_groups) return 0;
  return static_cast<std::uint32_t>(state_->at(rank, group).new_on_host.size());
}

TpShardMemory TpAddressSpace::ShardMemory(Rank rank, GroupId group) const {
  if (!Hosts(rank) || group.value() >= config_.num_groups) return {};
  const TpGroupShard& sh = state_->at(rank, group);
  return TpShardMemory{sh.home.data(), static_cast<std::uint32_t>(sh.home.size()), sh.device.arena(), sh.host.arena()};
}

}  // namespace ula
