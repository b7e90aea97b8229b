// TpAddressSpace: directory, shards and local buffers (see include/ula/tp_address_space.h
// for the structure and its invariants). Every mutating call validates all of its input
// before the first change, so an error leaves everything as it was.
#include "ula/tp_address_space.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <limits>

#include "sparse/pool_geometry.h"
#include "sparse/tp_state.h"
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
// Home entries of rank r that an address handed out so far can index: [0, n).
std::size_t HomeInUse(const TpAddressSpace::State& st, const TpConfig& c, std::uint32_t r) {
  if (c.page_tokens == 1) return st.minted[r];
  const std::uint64_t end = std::uint64_t{st.next_page} * c.page_tokens;  // addresses [0, end)
  return end > r ? static_cast<std::size_t>((end - r + c.num_ranks - 1) / c.num_ranks) : 0;
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
                                                      std::vector<LogicalAddr>(buf), {}, {}});
    }
  }
  state->stable_new_entries = config.stable_new_entries;
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
  ULA_CHECK(sh.policy->ClaimVictims(victims) == want);  // used in this round from here on
  bool moved = true;
  if (want > 0) {
    CopyBatch batch{sh.device.arena().id, sh.host.arena().id, c.entry_bytes, /*swap=*/false, {}};
    batch.moves.reserve(want);
    for (std::size_t k = 0; k < want; ++k) {
      auto host = sh.host.Allocate();
      ULA_CHECK(host.has_value());  // victims + entries placed on host <= n - into_free <= host free
      victim_host[k] = *host;
      batch.moves.push_back({sh.device.offset(victims[k]), sh.host.offset(*host)});
    }
    auto fence = backend.Submit(std::move(batch));
    moved = fence.has_value() && backend.Wait(*fence).has_value();
    if (!moved) {
      for (SlotId h : victim_host) ULA_CHECK(sh.host.Free(h).has_value());  // partly written, never published
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
      auto host = sh.host.Allocate();
      ULA_CHECK(host.has_value());  // room was planned by TakeAddresses
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
    const TpGroupShard& sh = state_->at(home, group);
    const Location loc = sh.home[addr.value() / config_.num_ranks];
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
  return tier == Tier::kDevice ? sh.device.num_used() : sh.host.num_used();
}
std::uint32_t TpAddressSpace::NumFree(Rank rank, GroupId group, Tier tier) const {
  if (!Hosts(rank) || group.value() >= config_.num_groups) return 0;
  const TpGroupShard& sh = state_->at(rank, group);
  return tier == Tier::kDevice ? sh.device.num_free() : sh.host.num_free();
}
std::uint32_t TpAddressSpace::NumBuffered(Rank rank, GroupId group) const {
  if (!Hosts(rank) || group.value() >= config_.num_groups) return 0;
  return state_->at(rank, group).buffer.num_used();
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

Status TpAddressSpace::CheckInvariants() const {
  const State& st = *state_;
  auto fail = [](std::string msg) { return MakeError(ErrorCode::kInternal, "TpAddressSpace: " + std::move(msg)); };
  const std::uint32_t p = config_.num_ranks;
  // Directory.
  // Holders (address_refs.h): a list names an address once; refs' request part counts the
  // lists; each listed address is exactly one of the request's own and its adopted.
  if (st.owner.size() != st.live.size() || st.refs.size() != st.live.size()) {
    return fail(fmt::format("owner/refs sizes {}/{} != {}", st.owner.size(), st.refs.size(), st.live.size()));
  }
  if (st.tags.size() != st.requests.size()) return fail("tags and requests disagree");
  std::vector<std::uint32_t> listed(st.live.size(), 0), own(st.live.size(), 0), last_list(st.live.size(), 0);
  std::uint32_t list_no = 0;
  for (const auto& [id, addrs] : st.requests) {
    ++list_no;
    auto h = st.tags.find(id);
    if (h == st.tags.end() || h->second.tag == 0 || h->second.tag == refs::kSharedTag) {
      return fail(fmt::format("request {} has no valid tag", id.value()));
    }
    const auto& adopted = h->second.adopted;
    if (!std::is_sorted(adopted.begin(), adopted.end()) ||
        std::adjacent_find(adopted.begin(), adopted.end()) != adopted.end()) {
      return fail(fmt::format("request {}: adopted list not sorted and distinct", id.value()));
    }
    std::size_t n_adopted = 0;
    for (LogicalAddr a : addrs) {
      if (!st.IsLive(a)) return fail(fmt::format("request {} holds address {} that is not live", id.value(), a.value()));
      if (last_list[a.value()] == list_no) return fail(fmt::format("request {} lists address {} twice", id.value(), a.value()));
      last_list[a.value()] = list_no;
      ++listed[a.value()];
      const bool is_own = st.owner[a.value()] == h->second.tag;
      const bool is_adopted = std::binary_search(adopted.begin(), adopted.end(), a);
      if (is_own == is_adopted) {
        return fail(fmt::format("address {} of request {} is {} its allocation and adopted", a.value(), id.value(),
                                is_own ? "both" : "neither"));
      }
      own[a.value()] += is_own;
      n_adopted += is_adopted;
    }
    if (n_adopted != adopted.size()) return fail(fmt::format("request {}: adopted addresses it does not list", id.value()));
  }
  std::vector<std::uint32_t> homed(p, 0);
  std::uint64_t n_live = 0;
  for (std::size_t a = 0; a < st.live.size(); ++a) {
    if (refs::RequestRefs(st.refs[a]) != listed[a]) {
      return fail(fmt::format("address {}: {} request references but {} lists", a, refs::RequestRefs(st.refs[a]), listed[a]));
    }
    if ((st.refs[a] != 0) != (st.live[a] != 0)) return fail(fmt::format("address {}: live {} with count {}", a, st.live[a], st.refs[a]));
    const std::uint32_t o = st.owner[a];
    if ((o == 0) != (st.live[a] == 0)) return fail(fmt::format("address {}: owner tag {} but live {}", a, o, st.live[a]));
    if (o != 0 && o != refs::kSharedTag && own[a] != 1) return fail(fmt::format("address {}: owner tag {} of no holder", a, o));
    if (st.live[a]) {
      ++homed[a % p];
      ++n_live;
    }
  }
  if (n_live != st.num_live) return fail(fmt::format("{} live addresses but the counter says {}", n_live, st.num_live));
  for (std::uint32_t r = 0; r < p; ++r) {
    if (homed[r] != st.homed[r]) return fail(fmt::format("rank {}: {} homed addresses, counter says {}", r, homed[r], st.homed[r]));
    if (st.homed[r] > config_.shard_slots_per_group()) return fail(fmt::format("rank {} holds more than its shard", r));
    if (config_.page_tokens > 1) continue;
    for (LogicalAddr a : st.free_addrs[r]) {
      if (a.value() % p != r || st.IsLive(a)) return fail(fmt::format("free list of rank {} holds address {}", r, a.value()));
    }
    if (st.free_addrs[r].size() + st.homed[r] != st.minted[r]) {
      return fail(fmt::format("rank {}: {} free + {} live != {} minted", r, st.free_addrs[r].size(), st.homed[r], st.minted[r]));
    }
  }
  if (config_.page_tokens > 1) {
    // Pages: no address past the minted pages is live; the free pages are exactly the minted
    // pages without a live address, each listed once; an open page ends its request's list.
    const std::uint32_t T = config_.page_tokens;
    std::vector<std::uint32_t> page_live(st.next_page, 0);
    for (std::size_t a = 0; a < st.live.size(); ++a) {
      if (st.live[a] == 0) continue;
      if (a / T >= st.next_page) return fail(fmt::format("live address {} is past the {} minted pages", a, st.next_page));
      ++page_live[a / T];
    }
    std::vector<bool> page_free(st.next_page, false);
    for (std::uint32_t pg : st.free_pages) {
      if (pg >= st.next_page || page_free[pg] || page_live[pg] != 0) {
        return fail(fmt::format("free page {} is past the end, listed twice or holds a live address", pg));
      }
      page_free[pg] = true;
    }
    for (std::uint32_t pg = 0; pg < st.next_page; ++pg) {
      if (page_live[pg] == 0 && !page_free[pg]) return fail(fmt::format("page {} has no live address but is not free", pg));
    }
    for (const auto& [id, h] : st.tags) {
      if (h.open_page == State::Holder::kNoPage) continue;
      const auto& addrs = st.requests.at(id);
      if (addrs.empty() || addrs.back().value() / T != h.open_page || st.owner[addrs.back().value()] != h.tag) {
        return fail(fmt::format("request {}: open page {} does not end its list", id.value(), h.open_page));
      }
    }
  }

  // Hosted shards and buffers.
  for (Rank rank : hosted_) {
    const std::uint32_t r = rank.value();
    for (std::uint32_t g = 0; g < config_.num_groups; ++g) {
      const TpGroupShard& sh = st.shards[r][g];
      std::vector<bool> dev_seen(sh.device.capacity()), host_seen(sh.host.capacity());
      std::uint32_t n_dev = 0, n_host = 0;
      const std::size_t in_use = HomeInUse(st, config_, r);
      for (std::size_t i = in_use; i < sh.home.size() && i < in_use + 64; ++i) {  // spot check past the end
        if (!sh.home[i].is_none()) return fail(fmt::format("rank {} group {}: home entry {} past the addresses is set", r, g, i));
      }
      for (std::uint32_t i = 0; i < in_use; ++i) {
        const LogicalAddr a(i * p + r);
        const Location loc = sh.home[i];
        const bool live = st.IsLive(a);
        if (loc.is_none()) {
          if (live) return fail(fmt::format("live address {} has no home in group {}", a.value(), g));
          continue;
        }
        if (!live) return fail(fmt::format("dead address {} has a home in group {}", a.value(), g));
        if (loc.rank() != rank) return fail(fmt::format("address {} homed on rank {} is located on rank {}", a.value(), r, loc.rank().value()));
        const bool dev = loc.tier() == Tier::kDevice;
        const SlotPool& pool = dev ? sh.device : sh.host;
        auto& seen = dev ? dev_seen : host_seen;
        if (!pool.IsAllocated(loc.slot())) return fail(fmt::format("address {} group {} sits in a free slot", a.value(), g));
        if (seen[loc.slot().value()]) return fail(fmt::format("rank {} group {}: {} slot {} holds two addresses", r, g, TierName(loc.tier()), loc.slot().value()));
        seen[loc.slot().value()] = true;
        if (dev) {
          if (sh.device_owner[loc.slot().value()] != a) return fail(fmt::format("device owner map disagrees for address {}", a.value()));
          if (!sh.policy->IsTracked(loc.slot())) return fail(fmt::format("device slot of address {} is untracked", a.value()));
          ++n_dev;
        } else {
          ++n_host;
        }
      }
      // Pinned new entries (stable_new_entries): live, homed here, on host, each once.
      if (!std::is_sorted(sh.new_on_host.begin(), sh.new_on_host.end()) ||
          std::adjacent_find(sh.new_on_host.begin(), sh.new_on_host.end()) != sh.new_on_host.end()) {
        return fail(fmt::format("rank {} group {}: the pinned new entries are not sorted and distinct", r, g));
      }
      for (LogicalAddr a : sh.new_on_host) {
        if (!st.IsLive(a) || a.value() % p != r || sh.home[a.value() / p].tier() != Tier::kHost) {
          return fail(fmt::format("rank {} group {}: pinned new entry {} is not a live entry of this rank on host", r,
                                  g, a.value()));
        }
      }
      if (n_dev != sh.device.num_used() || n_host != sh.host.num_used()) {
        return fail(fmt::format("rank {} group {}: pools hold {}/{} but homes locate {}/{}", r, g, sh.device.num_used(),
                                sh.host.num_used(), n_dev, n_host));
      }
      // Local buffer.
      if (sh.buffered.size() != sh.buffer.num_used()) {
        return fail(fmt::format("rank {} group {}: {} buffer slots used but {} indexed", r, g, sh.buffer.num_used(), sh.buffered.size()));
      }
      std::vector<std::byte> home_bytes(config_.entry_bytes);
      for (const auto& [addr, slot] : sh.buffered) {
        const LogicalAddr a(addr);
        if (!st.IsLive(a)) return fail(fmt::format("rank {} buffers dead address {}", r, addr));
        if (addr % p == r) return fail(fmt::format("rank {} buffers its own address {}", r, addr));
        if (!sh.buffer.IsAllocated(slot) || sh.buffer_owner[slot.value()] != a) {
          return fail(fmt::format("rank {} group {}: buffer slot {} does not hold address {}", r, g, slot.value(), addr));
        }
        if (!sh.buffer_policy->IsTracked(slot)) return fail(fmt::format("buffer slot {} is untracked", slot.value()));
        const Rank home = HomeOf(a);
        if (backend_.holds_bytes() && Hosts(home)) {
          (void)Read(a, GroupId(static_cast<std::uint16_t>(g)), home_bytes);
          if (std::memcmp(home_bytes.data(), sh.buffer.data(slot), config_.entry_bytes) != 0) {
            return fail(fmt::format("rank {} group {}: buffered copy of address {} differs from its home", r, g, addr));
          }
        }
      }
      ULA_RETURN_IF_ERROR(sh.device.CheckInvariants());
      ULA_RETURN_IF_ERROR(sh.host.CheckInvariants());
      ULA_RETURN_IF_ERROR(sh.buffer.CheckInvariants());
      ULA_RETURN_IF_ERROR(sh.policy->CheckInvariants());
      ULA_RETURN_IF_ERROR(sh.buffer_policy->CheckInvariants());
      std::uint64_t tracked = 0, tracked_buf = 0;
      for (std::uint32_t s = 0; s < sh.device.capacity(); ++s) tracked += sh.policy->IsTracked(SlotId(s));
      for (std::uint32_t s = 0; s < sh.buffer.capacity(); ++s) tracked_buf += sh.buffer_policy->IsTracked(SlotId(s));
      if (tracked != sh.device.num_used() || tracked_buf != sh.buffer.num_used()) {
        return fail(fmt::format("rank {} group {}: policies track {}/{} slots, {}/{} occupied", r, g, tracked, tracked_buf,
                                sh.device.num_used(), sh.buffer.num_used()));
      }
    }
  }
  return Ok();
}


std::uint64_t TpAddressSpace::DebugDigest() const {
  const State& st = *state_;
  StateDigest d;
  std::uint64_t requests = 0;  // unordered: a sum of per-request hashes
  for (const auto& [id, addrs] : st.requests) {
    StateDigest rd;
    rd.Add(id.value());
    for (LogicalAddr a : addrs) rd.Add(a.value());
    const State::Holder& h = st.tags.at(id);
    rd.Add(h.tag);
    for (LogicalAddr a : h.adopted) rd.Add(a.value());
    rd.Add(h.open_page);
    requests += rd.value();
  }
  d.AddAll(std::span<const std::uint32_t>(st.owner));
  d.AddAll(std::span<const std::uint32_t>(st.refs));
  d.Add(requests);
  for (const auto& fifo : st.free_addrs) {
    d.Add(fifo.size());
    for (LogicalAddr a : fifo) d.Add(a.value());
  }
  d.AddAll(std::span<const std::uint32_t>(st.minted));
  d.Add(st.next_page);
  d.Add(st.free_pages.size());
  for (std::uint32_t pg : st.free_pages) d.Add(pg);
  d.AddAll(std::span<const std::uint32_t>(st.homed));
  d.AddAll(std::span<const std::uint8_t>(st.live));
  d.Add(st.cursor);
  d.Add(st.num_live);
  for (Rank r : hosted_) {
    for (std::uint32_t g = 0; g < config_.num_groups; ++g) {
      const TpGroupShard& sh = state_->at(r, GroupId(static_cast<std::uint16_t>(g)));
      d.Add(sh.device.free_bitmap());
      d.Add(sh.host.free_bitmap());
      d.Add(sh.policy->DebugDigest());
      for (LogicalAddr a : sh.device_owner) d.Add(a.value());
      for (std::size_t i = 0, n = HomeInUse(st, config_, r.value()); i < n; ++i) d.Add(sh.home[i].bits());
      d.Add(sh.buffer.free_bitmap());
      d.Add(sh.buffer_policy->DebugDigest());
      for (LogicalAddr a : sh.buffer_owner) d.Add(a.value());
      std::uint64_t buffered = 0;
      for (const auto& [a, s] : sh.buffered) buffered += StateDigest::Mix(a, s.value());
      d.Add(buffered);
      d.Add(sh.new_on_host.size());
      for (LogicalAddr a : sh.new_on_host) d.Add(a.value());
    }
  }
  return d.value();
}

}  // namespace ula
