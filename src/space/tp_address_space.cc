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
  return Ok();
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
  auto state = std::make_unique<State>(backend);  // on failure its arenas are destroyed
  const std::uint32_t dev = config.device_slots_per_group();
  const std::uint32_t host = config.host_slots_per_group();
  const std::uint32_t buf = config.buffer_slots_per_group();
  auto fail = [](Error e) -> Result<std::unique_ptr<TpAddressSpace>> { return std::unexpected(std::move(e)); };
  auto make_pool = [&](Tier tier, Rank rank, std::uint32_t slots) {
    return state->arenas.MakePool(tier, rank, slots, config.entry_bytes);
  };
  state->free_addrs.resize(config.num_ranks);
  state->minted.assign(config.num_ranks, 0);
  state->homed.assign(config.num_ranks, 0);
  state->shards.resize(config.num_ranks);
  for (Rank r : hosted) {
    for (std::uint32_t g = 0; g < config.num_groups; ++g) {
      auto device = make_pool(Tier::kDevice, r, dev);
      if (!device) return fail(device.error());
      auto host_pool = make_pool(Tier::kHost, r, host);
      if (!host_pool) return fail(host_pool.error());
      auto buffer = make_pool(Tier::kDevice, r, buf);
      if (!buffer) return fail(buffer.error());
      auto policy = MakePolicy(config.policy, dev, config.policy_options);
      if (!policy) return fail(policy.error());
      auto buffer_policy = MakePolicy(config.buffer_policy, buf, config.policy_options);
      if (!buffer_policy) return fail(buffer_policy.error());
      state->shards[r.value()].push_back(TpGroupShard{std::move(*device), std::move(*host_pool), std::move(*policy),
                                                      std::vector<LogicalAddr>(dev),
                                                      HomeTable(HomeEntries(config)),
                                                      std::move(*buffer), std::move(*buffer_policy),
                                                      std::vector<LogicalAddr>(buf), {}, {}, HostShadows{}});
      if (config.host_shadows) {
        TpGroupShard& sh = state->shards[r.value()].back();
        sh.shadows.Enable(dev, host, sh.policy.get());
      }
    }
  }
  state->stable_new_entries = config.stable_new_entries;
  state->host_shadows = config.host_shadows;
  return std::unique_ptr<TpAddressSpace>(new TpAddressSpace(config, backend, std::move(hosted), std::move(state)));
}

bool TpAddressSpace::Hosts(Rank r) const {
  return r.value() < config_.num_ranks && !state_->shards[r.value()].empty();
}

Status TpAddressSpace::AddRequest(RequestId request) {
  if (state_->requests.contains(request)) {
    return MakeError(ErrorCode::kAlreadyExists, fmt::format("request {} already exists", request.value()));
  }
  State& st = *state_;
  if (st.next_tag == 0 || st.next_tag == refs::kSharedTag) {  // 2^32 - 2 requests so far: renumber 1..n
    st.next_tag = 1;
    for (auto& [id, addrs] : st.requests) {
      State::Holder& h = st.tags[id];
      h.tag = st.next_tag++;
      for (LogicalAddr a : addrs) {  // its own allocations: the addresses it did not adopt
        if (!std::binary_search(h.adopted.begin(), h.adopted.end(), a)) st.owner[a.value()] = h.tag;
      }
    }
  }
  st.requests.emplace(request, std::vector<LogicalAddr>{});
  st.tags[request] = State::Holder{st.next_tag++, {}};
  return Ok();
}

namespace {
// The directory's half of TpAddressSpace::Allocate: n_tokens new addresses for the request
// whose list has pos0 entries (holder: its tag and open page), planned first and then taken
// from the free FIFOs or pages ("Pages" in tp_address_space.h); nothing changes on error.
Result<std::vector<LogicalAddr>> TakeAddresses(TpAddressSpace::State& st, const TpConfig& c, RequestId request,
                                               TpAddressSpace::State::Holder& holder, std::uint64_t pos0,
                                               std::uint32_t n_tokens) {
  using State = TpAddressSpace::State;
  const std::uint32_t p = c.num_ranks;
  const std::uint32_t cap = c.shard_slots_per_group();
  const std::uint32_t T = c.page_tokens;
  // Plan the addresses first (nothing changes until they all fit).
  std::vector<LogicalAddr> out(n_tokens);
  std::vector<std::uint32_t> planned(st.homed);
  std::uint32_t cursor = st.cursor;
  std::size_t pages_reused = 0;
  std::uint32_t next_page = st.next_page, page = holder.open_page;
  if (T == 1) {  // round robin from the cursor over ranks that have room
    std::uint64_t room = 0;
    for (std::uint32_t r = 0; r < p; ++r) room += cap - st.homed[r];
    if (n_tokens > room) {
      return MakeError(ErrorCode::kResourceExhausted,
                       fmt::format("request {}: {} new entries do not fit: {} free entries over {} ranks of {} each",
                                   request.value(), n_tokens, room, p, cap));
    }
    std::vector<std::uint32_t> taken(p, 0);
    for (std::uint32_t i = 0; i < n_tokens; ++i) {
      while (planned[cursor] >= cap) cursor = (cursor + 1) % p;
      const std::uint32_t k = taken[cursor]++;
      out[i] = k < st.free_addrs[cursor].size()
                   ? st.free_addrs[cursor][k]
                   : LogicalAddr((st.minted[cursor] + (k - static_cast<std::uint32_t>(st.free_addrs[cursor].size()))) * p +
                                 cursor);
      ++planned[cursor];
      cursor = (cursor + 1) % p;
    }
  } else {  // pages: token i of the list at offset i % T; its rank is its address's
    const std::uint32_t max_pages = static_cast<std::uint32_t>(std::uint64_t{LogicalAddr::kInvalidValue} / T);
    for (std::uint32_t i = 0; i < n_tokens; ++i) {
      const std::uint64_t pos = pos0 + i;
      if (pos % T == 0 || (i == 0 && page == State::Holder::kNoPage)) {
        if (pages_reused < st.free_pages.size()) {
          page = st.free_pages[pages_reused++];
        } else if (next_page < max_pages) {
          page = next_page++;
        } else {
          return MakeError(ErrorCode::kResourceExhausted,
                           fmt::format("request {}: the logical address space is exhausted", request.value()));
        }
      }
      out[i] = LogicalAddr(static_cast<std::uint32_t>(std::uint64_t{page} * T + pos % T));
      const std::uint32_t r = out[i].value() % p;
      if (++planned[r] > cap) {
        return MakeError(ErrorCode::kResourceExhausted,
                         fmt::format("request {}: {} new entries do not fit: token {} is homed on rank {} (address {} "
                                     "mod {}), whose shard of {} entries is full",
                                     request.value(), n_tokens, pos, r, out[i].value(), p, cap));
      }
    }
  }
  // Commit the directory.
  if (T == 1) {
    st.cursor = cursor;
    for (LogicalAddr a : out) {
      const std::uint32_t r = a.value() % p;
      if (!st.free_addrs[r].empty() && st.free_addrs[r].front() == a) {
        st.free_addrs[r].pop_front();
      } else {
        ULA_CHECK(a.value() == st.minted[r] * p + r);
        ++st.minted[r];
      }
    }
  } else {
    st.free_pages.erase(st.free_pages.begin(), st.free_pages.begin() + static_cast<std::ptrdiff_t>(pages_reused));
    st.next_page = next_page;
    if (n_tokens > 0) holder.open_page = page;
  }
  return out;
}

// The shard's half of TpAddressSpace::Allocate: places the new entries `fresh` of one
// hosted rank and group (their home table entries), by the rules in tp_address_space.h:
// free device slots; with `stable`, then the slots of victims this round has not used,
// moved device -> host in one batch and waited on before anything is published (a failed
// batch publishes nothing: the victims stay, and those entries go to host); the rest to
// host, pinned for the round with `stable`. Room on the shard was planned by TakeAddresses.
void PlaceNewEntries(const TpConfig& c, Backend& backend, TpGroupShard& sh, Rank rank,
                     std::span<const LogicalAddr> fresh, bool stable) {
  const std::uint32_t p = c.num_ranks;
  const std::size_t n = fresh.size();
  const std::size_t into_free = std::min<std::size_t>(n, sh.device.num_free());
  const std::size_t want = stable ? std::min<std::size_t>(n - into_free, sh.policy->NumEvictable()) : 0;
  std::vector<SlotId> victims(want), victim_host(want);
  std::vector<std::uint8_t> shadowed(want, 0);
  ULA_CHECK(sh.policy->ClaimVictims(victims) == want);  // used in this round from here on
  bool moved = true;
  if (want > 0) {
    // Host shadows: a victim with a live shadow goes back to it and moves no bytes; the
    // victims' shadows leave the list before any other victim's host slot is chosen.
    for (std::size_t k = 0; k < want; ++k) {
      victim_host[k] = sh.shadows.Take(victims[k]);
      shadowed[k] = victim_host[k].valid();
    }
    CopyBatch batch{sh.device.arena().id, sh.host.arena().id, c.entry_bytes, /*swap=*/false, {}};
    batch.moves.reserve(want);
    for (std::size_t k = 0; k < want; ++k) {
      if (shadowed[k]) continue;
      auto host = sh.shadows.AllocateHost(sh.host);  // a free slot, else the oldest shadow
      ULA_CHECK(host.has_value());  // victims + entries placed on host <= n - into_free <= host free + shadows
      victim_host[k] = *host;
      batch.moves.push_back({sh.device.offset(victims[k]), sh.host.offset(*host)});
    }
    if (!batch.moves.empty()) {
      auto fence = backend.Submit(std::move(batch));
      moved = fence.has_value() && backend.Wait(*fence).has_value();
    }
    if (!moved) {  // nothing published: the copied victims' slots go back, the shadows stay shadows
      for (std::size_t k = 0; k < want; ++k) {
        if (shadowed[k]) sh.shadows.Add(victims[k], victim_host[k]);  // still clean
        else ULA_CHECK(sh.host.Free(victim_host[k]).has_value());  // partly written, never published
      }
    }
  }
  const std::size_t into_victims = moved ? want : 0;
  bool pinned = false;
  for (std::size_t i = 0; i < n; ++i) {
    const LogicalAddr a = fresh[i];
    Location loc;
    if (i < into_free) {
      const SlotId dev = *sh.device.Allocate();
      sh.device_owner[dev.value()] = a;
      sh.policy->Insert(dev);
      loc = Location::Make(Tier::kDevice, rank, dev);
    } else if (i < into_free + into_victims) {
      const std::size_t k = i - into_free;
      const SlotId dev = victims[k];  // its victim's bytes landed in victim_host[k]
      sh.home[sh.device_owner[dev.value()].value() / p] = Location::Make(Tier::kHost, rank, victim_host[k]);
      sh.device_owner[dev.value()] = a;
      loc = Location::Make(Tier::kDevice, rank, dev);
    } else {
      auto host = sh.shadows.AllocateHost(sh.host);
      ULA_CHECK(host.has_value());  // room was planned by TakeAddresses (shadows are free room)
      loc = Location::Make(Tier::kHost, rank, *host);
      if (stable) {
        sh.new_on_host.push_back(a);
        pinned = true;
      }
    }
    sh.home[a.value() / p] = loc;
  }
  if (pinned) std::sort(sh.new_on_host.begin(), sh.new_on_host.end());
}
}  // namespace

Result<std::vector<LogicalAddr>> TpAddressSpace::Allocate(RequestId request, std::uint32_t n_tokens) {
  ULA_RETURN_IF_ERROR(state_->RefuseWhilePlanPending("Allocate"));
  State& st = *state_;
  auto it = st.requests.find(request);
  if (it == st.requests.end()) {
    return MakeError(ErrorCode::kNotFound, fmt::format("request {} is unknown", request.value()));
  }
  State::Holder& holder = st.tags.at(request);
  auto taken = TakeAddresses(st, config_, request, holder, it->second.size(), n_tokens);
  if (!taken) return std::unexpected(std::move(taken).error());
  std::vector<LogicalAddr> out = std::move(*taken);
  const std::uint32_t p = config_.num_ranks;
  const std::uint32_t tag = holder.tag;
  for (std::uint32_t i = 0; i < n_tokens; ++i) {
    const LogicalAddr a = out[i];
    const std::uint32_t r = a.value() % p;
    if (st.live.size() <= a.value()) {
      st.live.resize(std::max<std::size_t>(a.value() + 1, st.live.size() * 2), 0);
      st.owner.resize(st.live.size(), 0);
      st.refs.resize(st.live.size(), 0);
    }
    st.live[a.value()] = 1;
    st.owner[a.value()] = tag;
    st.refs[a.value()] = refs::kRequestRef;
    ++st.homed[r];
  }
  // The hosted shards (the directory above is every process's alike; what follows is each
  // process's own ranks and never fails).
  std::vector<LogicalAddr> fresh;
  for (Rank r : hosted_) {
    fresh.clear();
    for (LogicalAddr a : out) {
      if (a.value() % p == r.value()) fresh.push_back(a);
    }
    if (fresh.empty()) continue;
    for (TpGroupShard& sh : st.shards[r.value()]) PlaceNewEntries(config_, backend_, sh, r, fresh, st.stable_new_entries);
  }
  auto& addrs = it->second;
  addrs.insert(addrs.end(), out.begin(), out.end());
  st.num_live += n_tokens;
  ULA_EXPENSIVE_CHECK(*this);
  return out;
}

void TpAddressSpace::FreeAddress(LogicalAddr a) {
  State& st = *state_;
  const std::uint32_t p = config_.num_ranks;
  const std::uint32_t r = a.value() % p;
  for (Rank hr : hosted_) {
    for (TpGroupShard& sh : st.shards[hr.value()]) sh.DropCopy(a);
  }
  if (!st.shards[r].empty()) {
    for (TpGroupShard& sh : st.shards[r]) {
      if (sh.IsNewOnHost(a)) sh.new_on_host.erase(std::lower_bound(sh.new_on_host.begin(), sh.new_on_host.end(), a));
      Location& loc = sh.home[a.value() / p];
      if (loc.tier() == Tier::kDevice) {
        sh.shadows.Drop(sh.host, loc.slot());
        sh.policy->Remove(loc.slot());
        ULA_CHECK(sh.device.Free(loc.slot()).has_value());
        sh.device_owner[loc.slot().value()] = LogicalAddr::Invalid();
      } else {
        ULA_CHECK(sh.host.Free(loc.slot()).has_value());
      }
      loc = Location::None();
    }
  }
  st.live[a.value()] = 0;
  st.owner[a.value()] = 0;
  --st.homed[r];
  --st.num_live;
  const std::uint32_t T = config_.page_tokens;
  if (T == 1) {
    st.free_addrs[r].push_back(a);
    return;
  }
  // The page joins the free FIFO once none of its addresses is live.
  const std::uint32_t page = a.value() / T;
  for (std::uint64_t b = std::uint64_t{page} * T; b < std::uint64_t{page + 1} * T; ++b) {
    if (b < st.live.size() && st.live[b] != 0) return;
  }
  st.free_pages.push_back(page);
}

Status TpAddressSpace::Free(RequestId request) {
  ULA_RETURN_IF_ERROR(state_->RefuseWhilePlanPending("Free"));
  State& st = *state_;
  auto it = st.requests.find(request);
  if (it == st.requests.end()) {
    return MakeError(ErrorCode::kNotFound, fmt::format("request {} is unknown or already freed", request.value()));
  }
  const std::uint32_t tag = st.tags.at(request).tag;
  for (LogicalAddr a : it->second) {
    if ((st.refs[a.value()] -= refs::kRequestRef) == 0) {
      FreeAddress(a);
    } else if (st.owner[a.value()] == tag) {
      st.owner[a.value()] = refs::kSharedTag;  // its other holders keep it where it is
    }
  }
  st.tags.erase(request);
  st.requests.erase(it);
  ULA_EXPENSIVE_CHECK(*this);
  return Ok();
}

Status TpAddressSpace::Truncate(RequestId request, std::uint32_t length) {
  ULA_RETURN_IF_ERROR(state_->RefuseWhilePlanPending("Truncate"));
  State& st = *state_;
  auto it = st.requests.find(request);
  if (it == st.requests.end()) {
    return MakeError(ErrorCode::kNotFound, fmt::format("Truncate: request {} is unknown", request.value()));
  }
  std::vector<LogicalAddr>& addrs = it->second;
  State::Holder& h = st.tags.at(request);
  if (length > addrs.size()) {
    return MakeError(ErrorCode::kOutOfRange, fmt::format("Truncate: request {} holds {} tokens, cannot keep {}",
                                                         request.value(), addrs.size(), length));
  }
  for (std::size_t i = length; i < addrs.size(); ++i) {
    const LogicalAddr a = addrs[i];
    if (st.owner[a.value()] != h.tag || st.refs[a.value()] != refs::kRequestRef) {
      return MakeError(ErrorCode::kFailedPrecondition,
                       fmt::format("Truncate: token {} of request {} (address {}) is {}: a shared entry is "
                                   "immutable, only the request's own unshared tail can be rolled back",
                                   i, request.value(), a.value(),
                                   st.owner[a.value()] != h.tag ? "adopted (ShareInto)"
                                                                : fmt::format("held by {} holders",
                                                                              refs::Holders(st.refs[a.value()]))));
    }
  }
  for (std::size_t i = length; i < addrs.size(); ++i) {
    st.refs[addrs[i].value()] = 0;
    FreeAddress(addrs[i]);
  }
  addrs.resize(length);
  const bool own_last = length > 0 && st.owner[addrs.back().value()] == h.tag;
  h.open_page = own_last && config_.page_tokens > 1 ? addrs.back().value() / config_.page_tokens
                                                    : State::Holder::kNoPage;
  ULA_EXPENSIVE_CHECK(*this);
  return Ok();
}

namespace {
// Ok iff every address is live and listed once.
Status CheckTpAddressList(const TpAddressSpace::State& st, std::span<const LogicalAddr> addrs, const char* what) {
  std::vector<LogicalAddr> sorted(addrs.begin(), addrs.end());
  std::sort(sorted.begin(), sorted.end());
  if (auto d = std::adjacent_find(sorted.begin(), sorted.end()); d != sorted.end()) {
    return MakeError(ErrorCode::kInvalidArgument, fmt::format("{}: address {} is listed twice", what, d->value()));
  }
  for (LogicalAddr a : addrs) {
    if (!st.IsLive(a)) {
      return MakeError(ErrorCode::kNotFound,
                       fmt::format("{}: logical address {} is not live (freed, or never allocated)", what, a.value()));
    }
  }
  return Ok();
}
}  // namespace

Status TpAddressSpace::ShareInto(RequestId request, std::span<const LogicalAddr> addrs) {
  ULA_RETURN_IF_ERROR(state_->RefuseWhilePlanPending("ShareInto"));
  State& st = *state_;
  auto it = st.requests.find(request);
  if (it == st.requests.end()) {
    return MakeError(ErrorCode::kNotFound, fmt::format("ShareInto: request {} is unknown", request.value()));
  }
  State::Holder& h = st.tags.at(request);
  ULA_RETURN_IF_ERROR(CheckTpAddressList(st, addrs, "ShareInto"));
  for (LogicalAddr a : addrs) {
    if (st.Holds(h, a)) {
      return MakeError(ErrorCode::kAlreadyExists,
                       fmt::format("ShareInto: request {} already holds address {}", request.value(), a.value()));
    }
    if (refs::RequestRefs(st.refs[a.value()]) == refs::kMaxRequestRefs) {
      return MakeError(ErrorCode::kResourceExhausted,
                       fmt::format("ShareInto: address {} is held by the most requests there can be", a.value()));
    }
  }
  it->second.insert(it->second.end(), addrs.begin(), addrs.end());
  refs::MergeAdopted(h.adopted, addrs);
  if (!addrs.empty()) h.open_page = State::Holder::kNoPage;  // the list no longer ends in it
  for (LogicalAddr a : addrs) st.refs[a.value()] += refs::kRequestRef;
  ULA_EXPENSIVE_CHECK(*this);
  return Ok();
}

Status TpAddressSpace::Retain(std::span<const LogicalAddr> addrs) {
  State& st = *state_;
  ULA_RETURN_IF_ERROR(CheckTpAddressList(st, addrs, "Retain"));
  for (LogicalAddr a : addrs) {
    if (refs::CacheRefs(st.refs[a.value()]) == refs::kMaxCacheRefs) {
      return MakeError(ErrorCode::kResourceExhausted,
                       fmt::format("Retain: address {} has {} cache references, the most there can be", a.value(),
                                   refs::kMaxCacheRefs));
    }
  }
  for (LogicalAddr a : addrs) st.refs[a.value()] += refs::kCacheRef;
  ULA_EXPENSIVE_CHECK(*this);
  return Ok();
}

Status TpAddressSpace::Release(std::span<const LogicalAddr> addrs) {
  ULA_RETURN_IF_ERROR(state_->RefuseWhilePlanPending("Release"));
  State& st = *state_;
  ULA_RETURN_IF_ERROR(CheckTpAddressList(st, addrs, "Release"));
  for (LogicalAddr a : addrs) {
    if (refs::CacheRefs(st.refs[a.value()]) == 0) {
      return MakeError(ErrorCode::kFailedPrecondition,
                       fmt::format("Release: address {} has no cache reference to release (released twice?)",
                                   a.value()));
    }
  }
  for (LogicalAddr a : addrs) {
    if ((st.refs[a.value()] -= refs::kCacheRef) == 0) FreeAddress(a);
  }
  ULA_EXPENSIVE_CHECK(*this);
  return Ok();
}

std::uint32_t TpAddressSpace::RefCount(LogicalAddr addr) const {
  return state_->IsLive(addr) ? refs::Holders(state_->refs[addr.value()]) : 0;
}

bool TpAddressSpace::Holds(RequestId request, LogicalAddr addr) const {
  auto it = state_->tags.find(request);
  return it != state_->tags.end() && state_->IsLive(addr) && state_->Holds(it->second, addr);
}

namespace {

Status CheckEntryArgs(const TpConfig& cfg, const TpAddressSpace::State& st, LogicalAddr addr, GroupId group,
                      std::size_t size) {
  if (group.value() >= cfg.num_groups) {
    return MakeError(ErrorCode::kOutOfRange, fmt::format("group {} is out of range ({} groups)", group.value(), cfg.num_groups));
  }
  if (size != cfg.entry_bytes) {
    return MakeError(ErrorCode::kInvalidArgument, fmt::format("entry is {} bytes, not {}", cfg.entry_bytes, size));
  }
  if (!st.IsLive(addr)) {
    return MakeError(ErrorCode::kNotFound, fmt::format("logical address {} is not live", addr.value()));
  }
  return Ok();
}

}  // namespace

Status TpAddressSpace::Write(LogicalAddr addr, GroupId group, std::span<const std::byte> data) {
  ULA_RETURN_IF_ERROR(state_->RefuseWhilePlanPending("Write"));
  ULA_RETURN_IF_ERROR(CheckEntryArgs(config_, *state_, addr, group, data.size()));
  if (!backend_.holds_bytes()) return MakeError(ErrorCode::kUnsupported, "the counting backend holds no bytes");
  if (const std::uint32_t holders = refs::Holders(state_->refs[addr.value()]); holders > 1) {
    return MakeError(ErrorCode::kFailedPrecondition,
                     fmt::format("address {} is shared by {} holders: a shared entry is immutable (write a new "
                                 "address)", addr.value(), holders));
  }
  for (Rank r : hosted_) state_->at(r, group).DropCopy(addr);
  const Rank home = HomeOf(addr);
  if (Hosts(home)) {
    TpGroupShard& sh = state_->at(home, group);
    const Location loc = sh.home[addr.value() / config_.num_ranks];
    // The new bytes are on device only: its host shadow is no longer clean.
    if (loc.tier() == Tier::kDevice) sh.shadows.Drop(sh.host, loc.slot());
    const SlotPool& pool = loc.tier() == Tier::kDevice ? sh.device : sh.host;
    std::memcpy(pool.data(loc.slot()), data.data(), data.size());
  }
#ifdef ULA_EXPENSIVE_CHECKS
  // Write drops buffer copies and changes bytes: the full check runs on every 64th write
  // (on every one, the TP verifier's sanitizer run took three times as long).
  if (++state_->writes % 64 == 0) ULA_EXPENSIVE_CHECK(*this);
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
  if (!state_->IsLive(addr)) {
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
  if (!state_->IsLive(addr)) {
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
  auto it = state_->requests.find(request);
  if (it == state_->requests.end()) {
    return MakeError(ErrorCode::kNotFound, fmt::format("request {} is unknown", request.value()));
  }
  return std::span<const LogicalAddr>(it->second);
}

bool TpAddressSpace::IsLive(LogicalAddr addr) const { return state_->IsLive(addr); }

void TpAddressSpace::AdvanceRound() {
  for (Rank r : hosted_) {
    for (TpGroupShard& sh : state_->shards[r.value()]) {
      sh.policy->AdvanceRound();
      sh.buffer_policy->AdvanceRound();
      sh.new_on_host.clear();
    }
  }
  ULA_EXPENSIVE_CHECK(*this);
}

std::uint64_t TpAddressSpace::num_live_addresses() const { return state_->num_live; }
std::uint32_t TpAddressSpace::num_requests() const { return static_cast<std::uint32_t>(state_->requests.size()); }
std::uint32_t TpAddressSpace::NumHomed(Rank r) const {
  return r.value() < config_.num_ranks ? state_->homed[r.value()] : 0;
}

std::uint32_t TpAddressSpace::NumUsed(Rank rank, GroupId group, Tier tier) const {
  if (!Hosts(rank) || group.value() >= config_.num_groups) return 0;
  const TpGroupShard& sh = state_->at(rank, group);
  return tier == Tier::kDevice ? sh.device.num_used() : sh.HostUsed();
}
std::uint32_t TpAddressSpace::NumFree(Rank rank, GroupId group, Tier tier) const {
  if (!Hosts(rank) || group.value() >= config_.num_groups) return 0;
  const TpGroupShard& sh = state_->at(rank, group);
  return tier == Tier::kDevice ? sh.device.num_free() : sh.HostFree();
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
