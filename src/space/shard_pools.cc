#include "space/shard_pools.h"

#include <fmt/format.h>

#include <cstring>
#include <string>

#include "ula/address_space.h"
#include "ula/check.h"

namespace ula {

Result<ShardPools> ShardPools::Create(PoolArenas& arenas, const Geometry& geo, PolicyKind policy_kind,
                                      const PolicyOptions& options, bool host_shadows) {
  // Per-layer regions of PaddedRows(slots) rows (address_space.h "Pools"), or one region.
  auto rows = [&](std::uint32_t slots) { return geo.layer_regions ? PaddedRows(slots) : std::uint64_t{slots}; };
  auto make_pool = [&](Tier tier, std::uint32_t slots) {
    return arenas.MakePool(tier, geo.rank, slots, geo.row_bytes,
                           geo.layer_regions ? geo.num_layers * rows(slots) * geo.row_bytes : 0);
  };
  auto device = geo.device_arena != nullptr
                    ? SlotPool::Create(*geo.device_arena, geo.row_bytes, geo.device_slots, geo.device_blocks)
                    : make_pool(Tier::kDevice, geo.device_slots);
  if (!device) return std::unexpected(device.error());
  const std::uint64_t device_stride = geo.device_arena != nullptr
                                          ? std::uint64_t{SlotBlocks::kRows} * geo.row_bytes
                                          : rows(geo.device_slots) * geo.row_bytes;
  auto host = make_pool(Tier::kHost, geo.host_slots);
  if (!host) return std::unexpected(host.error());
  auto policy = MakePolicy(policy_kind, geo.device_slots, options);
  if (!policy) return std::unexpected(policy.error());
  ShardPools sp{std::move(*device), std::move(*host), std::move(*policy),
                std::vector<LogicalAddr>(geo.device_slots), geo.num_layers, geo.row_bytes,
                device_stride, rows(geo.host_slots) * geo.row_bytes,
                geo.rank, geo.group, {}, HostShadows{}};
  if (host_shadows) sp.shadows.Enable(geo.device_slots, geo.host_slots, sp.policy.get());
  return sp;
}

Status ShardPools::RefuseNoRoom(std::span<const SlotId> hits, std::size_t n_miss) const {
  // When the misses fit even if every hit were new to the round (almost always), the exact
  // count — one policy lookup per hit, a second random line per selection — is skipped:
  // same decision.
  std::uint64_t evictable = policy->NumEvictable();
  const bool fits_anyway =
      evictable >= hits.size() && n_miss <= device.num_free() + (evictable - hits.size());
  if (fits_anyway) return Ok();
  std::uint64_t newly_used = 0;
  for (SlotId s : hits) newly_used += !policy->UsedInCurrentRound(s);
  evictable -= newly_used;
  if (n_miss <= device.num_free() + evictable) return Ok();
  return MakeError(ErrorCode::kResourceExhausted,
                   fmt::format("rank {} group {}: the step needs {} of its own entries on device ({} missing: {} "
                               "descriptors) but only {} device slots are free or evictable ({} free, {} "
                               "evictable, of {}): {} entries are used in this round (allocated or selected since "
                               "the last AdvanceRound(), this step's hits included) and cannot be evicted: call "
                               "AdvanceRound() after the round's attention, or select fewer entries per round",
                               rank.value(), group.value(), hits.size() + n_miss, n_miss, n_miss,
                               device.num_free() + evictable, device.num_free(), evictable, device.capacity(),
                               device.num_used() - evictable));
}

Status ShardPools::RefuseNewOnHost(LogicalAddr a) const {
  return MakeError(ErrorCode::kResourceExhausted,
                   fmt::format("rank {} group {}: address {} was placed on host by this round's Allocate (the "
                               "device held only this round's entries, or its victims' move failed): its KV is "
                               "written at that host slot, so this round cannot move it; select it after "
                               "AdvanceRound()", rank.value(), group.value(), a.value()));
}

ShardPools::VictimPlan ShardPools::PlanVictims(std::uint32_t n_new, bool stable) {
  VictimPlan plan;
  plan.into_free = std::min(n_new, device.num_free());
  const std::uint64_t want = stable ? std::min<std::uint64_t>(n_new - plan.into_free, policy->NumEvictable()) : 0;
  plan.victims.resize(want);
  ULA_CHECK(policy->ClaimVictims(plan.victims) == want);  // used in this round from here on
  plan.victim_host.resize(want);
  plan.shadowed.assign(want, 0);
  for (std::size_t k = 0; k < want; ++k) {
    plan.victim_host[k] = shadows.Take(plan.victims[k]);
    plan.shadowed[k] = plan.victim_host[k].valid();
  }
  for (std::size_t k = 0; k < want; ++k) {
    if (plan.shadowed[k]) continue;  // its clean copy is on host: the location alone changes
    auto h = AllocateHost();
    ULA_CHECK(h.has_value());  // victims + entries placed on host = n_new - into_free <= host free
    plan.victim_host[k] = *h;
  }
  return plan;
}

void ShardPools::ReturnVictims(const VictimPlan& plan) {
  for (std::size_t k = 0; k < plan.victims.size(); ++k) {
    if (plan.shadowed[k]) shadows.Add(plan.victims[k], plan.victim_host[k]);  // still clean
    else ULA_CHECK(host.Free(plan.victim_host[k]).has_value());  // partly written, never published
  }
}

void ShardPools::PlaceNew(const VictimPlan& plan, bool moved, std::span<const LogicalAddr> fresh, bool stable,
                          const std::function<void(LogicalAddr, Location)>& set) {
  const std::size_t into_victims = moved ? plan.victims.size() : 0;
  for (std::size_t k = 0; k < into_victims; ++k) {
    set(device_owner[plan.victims[k].value()], Location::Make(Tier::kHost, rank, plan.victim_host[k]));
  }
  bool on_host = false;
  for (std::size_t i = 0; i < fresh.size(); ++i) {
    const LogicalAddr a = fresh[i];
    if (i < plan.into_free + into_victims) {
      const bool free_slot = i < plan.into_free;
      const SlotId dev = free_slot ? *device.Allocate() : plan.victims[i - plan.into_free];
      device_owner[dev.value()] = a;
      if (free_slot) policy->Insert(dev);  // a victim's slot is tracked, used in this round
      set(a, Location::Make(Tier::kDevice, rank, dev));
    } else {
      auto h = AllocateHost();
      ULA_CHECK(h.has_value());  // the space checked the room (shadows are free room)
      set(a, Location::Make(Tier::kHost, rank, *h));
      if (stable) {
        new_on_host.push_back(a);
        on_host = true;
      }
    }
  }
  if (on_host) {
    std::sort(new_on_host.begin(), new_on_host.end());
  }
}

void ShardPools::FreeEntry(LogicalAddr a, Location loc) {
  if (loc.tier() == Tier::kDevice) {
    DropShadow(loc.slot());
    policy->Remove(loc.slot());
    ULA_CHECK(device.Free(loc.slot()).has_value());
    device_owner[loc.slot().value()] = LogicalAddr::Invalid();
  } else {
    ULA_CHECK(host.Free(loc.slot()).has_value());
  }
  if (IsNewOnHost(a)) new_on_host.erase(std::lower_bound(new_on_host.begin(), new_on_host.end(), a));
}

namespace {
std::unexpected<Error> Fail(std::string_view who, std::string msg) {
  return MakeError(ErrorCode::kInternal, fmt::format("{}: {}", who, msg));
}

enum class EntryFault : std::uint8_t { kFreeSlot, kTwoAddresses, kOwner, kUntracked };

// Out of line and cold: formatted in CheckEntry's body, the texts gave every call a stack
// frame of some 1 KB that the sanitizer trees poison and unpoison on each call, and their
// CheckInvariants calls it for every entry of every group after every operation.
[[gnu::noinline, gnu::cold]] Status EntryFailure(std::string_view who, EntryFault fault, const ShardPools& sp,
                                                 LogicalAddr a, Location loc) {
  const std::uint32_t s = loc.slot().value(), r = sp.rank.value(), g = sp.group.value();
  switch (fault) {
    case EntryFault::kFreeSlot:
      return Fail(who, fmt::format("address {} group {} sits in free {} slot {} of rank {}", a.value(), g,
                                   TierName(loc.tier()), s, r));
    case EntryFault::kTwoAddresses:
      return Fail(who, fmt::format("{} slot {} of rank {} group {} holds two addresses", TierName(loc.tier()), s, r, g));
    case EntryFault::kOwner:
      return Fail(who, fmt::format("device slot {} owner map disagrees with address {}", s, a.value()));
    case EntryFault::kUntracked:
      break;
  }
  return Fail(who, fmt::format("device slot {} holds address {} but the policy does not track it", s, a.value()));
}
}  // namespace

Status ShardPools::CheckEntry(std::string_view who, LogicalAddr a, Location loc, Occupancy& seen) const {
  const bool dev = loc.tier() == Tier::kDevice;
  const SlotPool& p = pool(loc.tier());
  const std::uint32_t s = loc.slot().value();
  if (!p.IsAllocated(loc.slot())) return EntryFailure(who, EntryFault::kFreeSlot, *this, a, loc);
  auto& slots = dev ? seen.device_seen : seen.host_seen;
  if (slots.empty()) slots.resize(p.capacity());
  if (slots[s]) return EntryFailure(who, EntryFault::kTwoAddresses, *this, a, loc);
  slots[s] = true;
  if (dev) {
    if (device_owner[s] != a) return EntryFailure(who, EntryFault::kOwner, *this, a, loc);
    if (!policy->IsTracked(loc.slot())) return EntryFailure(who, EntryFault::kUntracked, *this, a, loc);
  }
  ++(dev ? seen.on_device : seen.on_host);
  return Ok();
}

namespace {
// Invariant 3 for the shadow h of device slot d.
Status CheckShadow(std::string_view who, const ShardPools& sp, SlotId d, SlotId h,
                   const ShardPools::Occupancy& seen, const std::function<Location(LogicalAddr)>& locate,
                   bool compare_bytes) {
  const std::uint32_t r = sp.rank.value(), g = sp.group.value();
  if (!sp.host.IsAllocated(h) || (!seen.host_seen.empty() && seen.host_seen[h.value()])) {
    return Fail(who, fmt::format("rank {} group {}: host shadow slot {} is free or an entry's location", r, g, h.value()));
  }
  const LogicalAddr a = sp.device_owner[d.value()];
  if (!sp.device.IsAllocated(d) || !a.valid() || locate(a) != Location::Make(Tier::kDevice, sp.rank, d)) {
    return Fail(who, fmt::format("rank {} group {}: host shadow {} of device slot {} whose entry is not there", r, g,
                                 h.value(), d.value()));
  }
  if (!compare_bytes) return Ok();
  for (std::uint32_t l = 0; l < sp.num_layers; ++l) {
    if (std::memcmp(sp.host.data(h) + l * sp.host_stride, sp.device.data(d) + l * sp.device_stride, sp.row_bytes) != 0) {
      return Fail(who, fmt::format("rank {} group {}: host shadow {} of address {} differs from its device bytes (a "
                                   "write did not drop it)", r, g, h.value(), a.value()));
    }
  }
  return Ok();
}
}  // namespace

Status ShardPools::CheckInvariants(std::string_view who, const Occupancy& seen,
                                   const std::function<Location(LogicalAddr)>& locate, bool shadows_on,
                                   bool compare_bytes) const {
  const std::uint32_t r = rank.value(), g = group.value();
  if (shadows.enabled() != shadows_on) {
    return Fail(who, fmt::format("rank {} group {}: shadows {} but the space {}", r, g, shadows.enabled(), shadows_on));
  }
  ULA_RETURN_IF_ERROR(shadows.CheckInvariants());
  Status shadow_ok = Ok();
  shadows.ForEach([&](SlotId d, SlotId h) {
    if (shadow_ok) shadow_ok = CheckShadow(who, *this, d, h, seen, locate, compare_bytes);
  });
  ULA_RETURN_IF_ERROR(shadow_ok);
  if (device.num_used() != seen.on_device + withheld || host.num_used() != seen.on_host + shadows.size()) {
    return Fail(who, fmt::format("rank {} group {}: pools hold {}/{} entries ({} withheld device slots, {} host "
                                 "shadows) but the record locates {}/{}", r, g, device.num_used(), host.num_used(),
                                 withheld, shadows.size(), seen.on_device, seen.on_host));
  }
  ULA_RETURN_IF_ERROR(device.CheckInvariants());
  ULA_RETURN_IF_ERROR(host.CheckInvariants());
  ULA_RETURN_IF_ERROR(policy->CheckInvariants());
  std::uint64_t tracked = 0;
  for (std::uint32_t s = 0; s < device.capacity(); ++s) tracked += policy->IsTracked(SlotId(s));
  if (tracked != device.num_used() - withheld) {
    return Fail(who, fmt::format("rank {} group {}: policy tracks {} slots, {} are occupied", r, g, tracked,
                                 device.num_used() - withheld));
  }
  if (!std::is_sorted(new_on_host.begin(), new_on_host.end()) ||
      std::adjacent_find(new_on_host.begin(), new_on_host.end()) != new_on_host.end()) {
    return Fail(who, fmt::format("rank {} group {}: the new entries on host are not sorted and distinct", r, g));
  }
  for (LogicalAddr a : new_on_host) {
    const Location loc = locate(a);
    if (loc.is_none() || loc.tier() != Tier::kHost || loc.rank() != rank) {
      return Fail(who, fmt::format("rank {} group {}: new entry {} on host is not a live entry of this rank on host",
                                   r, g, a.value()));
    }
  }
  return Ok();
}

void ShardPools::AddToDigest(StateDigest& d) const {
  d.Add(device.free_bitmap());
  d.Add(host.free_bitmap());
  d.Add(policy->DebugDigest());
  for (LogicalAddr a : device_owner) d.Add(a.value());
  d.Add(new_on_host.size());
  for (LogicalAddr a : new_on_host) d.Add(a.value());
  d.Add(withheld);
  d.Add(shadows.size());
  shadows.ForEach([&](SlotId dev, SlotId h) {
    d.Add(dev.value());
    d.Add(h.value());
  });
}

}  // namespace ula
