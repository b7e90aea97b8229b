// Shared-prefix admission (shared_admission.h).
#include "serving/shared_admission.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "ula/address_space.h"
#include "ula/sparse_prefix_cache.h"
#include "workload/rng.h"

namespace ula::serving_internal {
namespace {

RankDemand operator+(RankDemand a, const RankDemand& b) {
  a.device += b.device, a.host += b.host, a.either += b.either;
  return a;
}

constexpr std::uint32_t kRouterBlock = 256;  // tokens per router-tree token

std::uint32_t BlockId(std::uint64_t stream, std::uint64_t k) {
  return static_cast<std::uint32_t>(workload_internal::StreamSeed(stream, k) >> 32);
}

// The router tree's view of a request: one token per 256-token block. Blocks fully inside
// the group's part (the prefix; multi-turn: the session so far, its input) are the group's
// and match across sharers; the rest is the request's own.
std::vector<std::uint32_t> RouterTokens(const SharedItem& it) {
  const std::uint32_t grouped = (it.extends ? it.input : it.prefix) / kRouterBlock;
  const std::uint32_t total = (it.input + kRouterBlock - 1) / kRouterBlock;
  std::vector<std::uint32_t> t;
  t.reserve(total);
  for (std::uint32_t k = 0; k < grouped; ++k) t.push_back(BlockId(it.group, k));
  for (std::uint32_t k = grouped; k < total; ++k) t.push_back(BlockId((std::uint64_t{1} << 40) + it.id, k));
  return t;
}

}  // namespace

std::vector<SharedItem> SharedLengths(const SharedWorkloadConfig& c) {
  // The draws of GenerateSharedWorkload, in its order.
  workload_internal::Rng rng(c.seed);
  std::vector<SharedItem> out;
  out.reserve(std::size_t{c.groups} * c.requests_per_group);
  const bool mt = c.kind == SharingKind::kMultiTurn;
  for (std::uint32_t g = 0; g < c.groups; ++g) {
    const auto shared = static_cast<std::uint32_t>(rng.Between(c.min_shared_tokens, c.max_shared_tokens));
    std::uint32_t history = shared;  // multi-turn: the session so far
    for (std::uint32_t k = 0; k < c.requests_per_group; ++k) {
      SharedItem r;
      r.id = out.size();
      r.group = g;
      r.turn = k;
      const auto own = static_cast<std::uint32_t>(rng.Between(c.min_own_tokens, c.max_own_tokens));
      r.output = static_cast<std::uint32_t>(rng.Between(c.min_output_tokens, c.max_output_tokens));
      if (mt) {
        r.shared = k == 0 ? 0 : history;
        r.input = history + (k > 0 ? own : 0);
        r.prefix = r.shared;
        r.extends = true;
        r.next = k + 1 < c.requests_per_group ? static_cast<std::int64_t>(r.id + 1) : -1;
        history = r.input + r.output;
      } else {
        r.shared = k == 0 ? 0 : shared;
        r.input = shared + own;
        r.prefix = shared;
      }
      out.push_back(r);
    }
  }
  return out;
}

Result<SharedStream> MakeSharedStream(const SharedWorkloadConfig& config, std::uint32_t n, std::uint64_t seed) {
  ULA_RETURN_IF_ERROR(config.Validate());
  if (n == 0) return MakeError(ErrorCode::kInvalidArgument, "MakeSharedStream: n must be >= 1");
  SharedWorkloadConfig c = config;
  const std::uint32_t k = c.requests_per_group;
  switch (c.kind) {
    case SharingKind::kSummariesPerDocument: c.groups = std::max(c.groups, (n + k - 1) / k); break;
    case SharingKind::kSharedSystemPrompt: c.requests_per_group = std::max(k, (n + c.groups - 1) / c.groups); break;
    case SharingKind::kMultiTurn: c.groups = std::max(c.groups, n); break;  // n sessions
  }
  SharedStream s;
  s.kind = c.kind;
  s.items = SharedLengths(c);
  switch (c.kind) {
    case SharingKind::kSummariesPerDocument:
      for (std::uint64_t i = 0; i < n; ++i) s.arrivals.push_back(i);
      break;
    case SharingKind::kSharedSystemPrompt:
      for (std::uint32_t u = 0; u < c.requests_per_group && s.arrivals.size() < n; ++u) {
        for (std::uint32_t g = 0; g < c.groups && s.arrivals.size() < n; ++g) {
          s.arrivals.push_back(std::uint64_t{g} * c.requests_per_group + u);
        }
      }
      break;
    case SharingKind::kMultiTurn:
      for (std::uint32_t g = 0; g < n; ++g) {
        workload_internal::Rng rng(workload_internal::StreamSeed(seed, g));
        s.arrivals.push_back(std::uint64_t{g} * c.requests_per_group + rng.Below(c.requests_per_group));
      }
      break;
  }
  return s;
}

RankDemand TokenPart(const PlacementRules& r, std::uint32_t t) {
  const double kv = r.kv_bytes_per_token, ix = r.index_bytes_per_token;
  RankDemand d;
  switch (r.system) {
    case SystemKind::kAllGpu: d.device = t * (kv + ix); break;
    case SystemKind::kHiSparse:
    case SystemKind::kTrtllmOffload:
      d.device = t * ix;
      d.host = t * kv;
      break;
    case SystemKind::kDcp: d.device = std::ceil(double(t) / r.num_ranks) * (kv + ix); break;
    case SystemKind::kDcpSglang: d.device = std::ceil(double(t) / r.num_ranks) * kv + t * ix; break;
    case SystemKind::kHelix: d.device = HelixRankTokens(t, r.helix_tokens_per_block, r.num_ranks) * (kv + ix); break;
    case SystemKind::kVllmHiSparse:
      d.device = t * ix;
      d.host = r.mode == ParallelMode::kTp ? t * kv / r.num_ranks : t * kv;
      break;
    case SystemKind::kUlaCache:
    case SystemKind::kUlaCacheAtHome: {
      const double tokens = r.mode == ParallelMode::kDp ? double(t) : std::ceil(double(t) / r.num_ranks);
      d.device = tokens * ix;
      d.either = tokens * kv;
      break;
    }
  }
  return d;
}

double WorkingSet(const PlacementRules& r, std::uint32_t t) {
  if (!IsUlaCache(r.system)) return 0;
  const double w = std::min<double>(t, r.working_set_entries);
  return (r.mode == ParallelMode::kDp ? w : std::ceil(w / r.num_ranks)) * r.kv_bytes_per_token;
}

RankDemand RequestPart(const PlacementRules& r, std::uint32_t t) {
  RankDemand d = DemandOf(r, t);
  const RankDemand tok = TokenPart(r, t);
  const double ws = WorkingSet(r, t);
  d.device -= tok.device + ws, d.host -= tok.host, d.either -= tok.either - ws;
  return d;
}

struct SharedLedger::Router {
  std::unique_ptr<Backend> backend = MakeCountingBackend();
  std::unique_ptr<AddressSpace> space;
  std::vector<std::unique_ptr<SparsePrefixCache>> caches;
  std::vector<const SparsePrefixCache*> view;
  std::uint64_t next_request = 0;
  ~Router() {
    caches.clear();  // before the space
    space.reset();
  }
};

SharedLedger::SharedLedger(const PlacementRules& rules, std::uint32_t holders)
    : rules_(rules), holders_(holders), loads_(holders, 0) {}

Result<SharedLedger> SharedLedger::Create(const PlacementRules& rules, std::span<const SharedItem> items) {
  ULA_RETURN_IF_ERROR(rules.Validate());
  const bool dp = rules.mode == ParallelMode::kDp;
  SharedLedger l(rules, dp ? rules.num_ranks : 1);
  if (dp) {
    // Room for every block the stream names, on each rank (an upper bound on what one
    // router tree can hold: it never evicts).
    std::uint64_t blocks = 1024;
    std::vector<std::uint32_t> group_blocks;
    for (const SharedItem& it : items) {
      const std::uint32_t grouped = (it.extends ? it.input : it.prefix) / kRouterBlock;
      const std::uint32_t total = (it.input + kRouterBlock - 1) / kRouterBlock;
      if (it.group >= group_blocks.size()) group_blocks.resize(it.group + 1, 0);
      group_blocks[it.group] = std::max(group_blocks[it.group], grouped);
      blocks += total - grouped;
    }
    for (std::uint32_t g : group_blocks) blocks += g;
    auto router = std::make_shared<Router>();
    AddressSpaceConfig ac;
    ac.num_ranks = rules.num_ranks;
    ac.num_groups = 1;
    ac.entry_bytes = 1;
    ac.device_bytes_per_rank = blocks;
    ac.host_bytes_per_rank = 0;
    auto space = AddressSpace::Create(ac, *router->backend);
    if (!space) return std::unexpected(space.error());
    router->space = std::move(*space);
    for (std::uint32_t r = 0; r < rules.num_ranks; ++r) {
      auto cache = SparsePrefixCache::Create(*router->space, Rank(static_cast<std::uint16_t>(r)));
      if (!cache) return std::unexpected(cache.error());
      router->view.push_back(cache->get());
      router->caches.push_back(std::move(*cache));
    }
    l.router_ = std::move(router);
  }
  return l;
}

Result<std::uint32_t> SharedLedger::Route(const SharedItem& item) {
  if (auto it = routed_.find(item.id); it != routed_.end()) return it->second;
  Router& ro = *router_;
  const std::vector<std::uint32_t> tokens = RouterTokens(item);
  auto d = RouteByPrefix(ro.view, loads_, tokens);
  if (!d) return std::unexpected(d.error());
  // The router remembers the request on the rank it picked (SMG inserts on routing).
  const RequestId tmp(ro.next_request++);
  AddressSpace& sp = *ro.space;
  SparsePrefixCache& cache = *ro.caches[d->rank.value()];
  ULA_RETURN_IF_ERROR(sp.AddRequest(tmp, d->rank));
  const SparsePrefixMatch m = cache.Match(tokens);
  ULA_RETURN_IF_ERROR(sp.ShareInto(tmp, m.addrs));
  if (auto a = sp.Allocate(tmp, static_cast<std::uint32_t>(tokens.size() - m.length)); !a) return std::unexpected(a.error());
  auto addrs = sp.AddressesOf(tmp);
  if (!addrs) return std::unexpected(addrs.error());
  if (auto ins = cache.Insert(tokens, *addrs); !ins) return std::unexpected(ins.error());
  ULA_RETURN_IF_ERROR(sp.Free(tmp));
  routed_[item.id] = d->rank.value();
  return d->rank.value();
}

bool SharedLedger::Fits(const Holder& h, const RankDemand& d, double ws) const {
  const double dev = rules_.device_bytes_per_rank, host = rules_.host_bytes_per_rank;
  // The working sets must be on device, but the step's distinct selections on a holder
  // cannot exceed the entries it stores: sharers' working sets overlap in their prefix.
  const double ws_device = std::min(h.ws + ws, h.either + d.either);
  return h.device + d.device + d.device_transient + ws_device <= dev && h.host + d.host <= host &&
         h.device + h.host + h.either + d.device + d.device_transient + d.host + d.either <= dev + host;
}

void SharedLedger::Add(Holder& h, const RankDemand& d, double ws, double sign) {
  h.device += sign * d.device;
  h.host += sign * d.host;
  h.either += sign * d.either;
  h.ws += sign * ws;
}

Result<SharedAdmission> SharedLedger::TryAdmit(const SharedItem& item) {
  if (resident_.contains(item.id)) {
    return MakeError(ErrorCode::kInvalidArgument, fmt::format("request {} already admitted", item.id));
  }
  SharedAdmission a;
  if (rules_.mode == ParallelMode::kDp) {
    auto r = Route(item);
    if (!r) return std::unexpected(r.error());
    a.holder = *r;
  }
  Holder& h = holders_[a.holder];
  const std::uint32_t t = item.final_tokens();
  auto pre = h.prefixes.find(item.group);
  if (pre != h.prefixes.end()) {
    a.matched = std::min(pre->second.tokens, item.prefix);
  } else if (item.prefix > 0) {
    a.cached = item.prefix;
    a.warm = item.extends;  // a multi-turn entry turn: its previous turn is cached
  }
  const std::uint32_t own = t - a.matched - a.cached;
  const RankDemand need = RequestPart(rules_, t) + TokenPart(rules_, own) + TokenPart(rules_, a.cached);
  const double ws = WorkingSet(rules_, t);
  while (!Fits(h, need, ws)) {
    // Evict the least recently used idle prefix of the holder (never the one matched).
    auto victim = h.prefixes.end();
    for (auto it = h.prefixes.begin(); it != h.prefixes.end(); ++it) {
      if (it->second.refs != 0 || it->first == item.group) continue;
      if (victim == h.prefixes.end() || it->second.last_use < victim->second.last_use) victim = it;
    }
    if (victim == h.prefixes.end()) return a;  // does not fit: it waits
    Add(h, TokenPart(rules_, victim->second.tokens), 0, -1);
    h.stored -= victim->second.tokens;
    a.evicted.push_back(victim->first);
    h.prefixes.erase(victim);
    ++evictions_;
  }
  Add(h, need, ws, +1);
  h.stored += own + a.cached;
  ++clock_;
  if (a.cached > 0) {
    h.prefixes[item.group] = Prefix{a.cached, 1, clock_};
  } else if (a.matched > 0) {
    ++pre->second.refs;
    pre->second.last_use = clock_;
  }
  resident_[item.id] = Resident{a.holder, a.matched, own, a.cached > 0 || a.matched > 0, a.cached > 0};
  ++loads_[a.holder];
  ++admitted_;
  named_ += t;
  a.admitted = true;
  return a;
}

Result<SharedLedger::Resident> SharedLedger::Remove(const SharedItem& item) {
  auto it = resident_.find(item.id);
  if (it == resident_.end()) return MakeError(ErrorCode::kNotFound, fmt::format("request {} not admitted", item.id));
  const Resident r = it->second;
  resident_.erase(it);
  Holder& h = holders_[r.holder];
  const std::uint32_t t = item.final_tokens();
  Add(h, RequestPart(rules_, t) + TokenPart(rules_, r.own), WorkingSet(rules_, t), -1);
  h.stored -= r.own;
  --loads_[r.holder];
  --admitted_;
  named_ -= t;
  return r;
}

Status SharedLedger::Release(const SharedItem& item) {
  auto removed = Remove(item);
  if (!removed) return std::unexpected(removed.error());
  const Resident r = *removed;
  Holder& h = holders_[r.holder];
  const std::uint32_t t = item.final_tokens();
  ++clock_;
  std::uint32_t refs = 0;
  if (auto p = h.prefixes.find(item.group); p != h.prefixes.end()) {
    if (r.holds_prefix) --p->second.refs;
    p->second.last_use = clock_;
    if (item.extends) {
      // The session's cached prefix becomes this turn's whole sequence.
      refs = p->second.refs;
      Add(h, TokenPart(rules_, p->second.tokens), 0, -1);
      h.stored -= p->second.tokens;
      h.prefixes.erase(p);
    }
  }
  if (item.extends) {
    Add(h, TokenPart(rules_, t), 0, +1);
    h.stored += t;
    h.prefixes[item.group] = Prefix{t, refs, clock_};
  }
  return Ok();
}

Status SharedLedger::Cancel(const SharedItem& item) {
  auto removed = Remove(item);
  if (!removed) return std::unexpected(removed.error());
  const Resident r = *removed;
  Holder& h = holders_[r.holder];
  if (auto p = h.prefixes.find(item.group); p != h.prefixes.end()) {
    if (r.created) {
      Add(h, TokenPart(rules_, p->second.tokens), 0, -1);
      h.stored -= p->second.tokens;
      h.prefixes.erase(p);
    } else if (r.holds_prefix) {
      --p->second.refs;
    }
  }
  return Ok();
}

Result<SharedAdmissionLimit> MaxAdmittedShared(const PlacementRules& rules, const SharedStream& stream) {
  auto ledger = SharedLedger::Create(rules, stream.items);
  if (!ledger) return std::unexpected(ledger.error());
  SharedAdmissionLimit lim;
  for (std::uint64_t i : stream.arrivals) {
    const SharedItem& item = stream.items[i];
    auto a = ledger->TryAdmit(item);
    if (!a) return std::unexpected(a.error());
    if (!a->admitted) break;
    lim.prefill_saved += a->saved();
    lim.input_tokens += item.input;
  }
  lim.admitted = ledger->admitted();
  lim.named_tokens = ledger->named_tokens();
  for (std::uint32_t h = 0; h < ledger->holders(); ++h) {
    lim.stored_tokens += ledger->stored_tokens(h);
    lim.max_holder_stored = std::max(lim.max_holder_stored, ledger->stored_tokens(h));
    lim.max_load = std::max(lim.max_load, ledger->load(h));
  }
  return lim;
}

}  // namespace ula::serving_internal
