// TpAddressSpace's whole-state checks: CheckInvariants (the invariants of
// include/ula/tp_address_space.h, for every hosted rank) and DebugDigest. Split from
// tp_address_space.cc, which holds the operations.
#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "core/digest.h"
#include "space/tp_state.h"
#include "ula/tp_address_space.h"

namespace ula {

namespace {

auto Fail(std::string msg) { return MakeError(ErrorCode::kInternal, "TpAddressSpace: " + std::move(msg)); }

// The home rule: each rank's homed count is its live addresses (address mod P) and within
// its shard; page_tokens == 1: its free FIFO holds its freed addresses, and free + live =
// minted.
Status CheckHomeRule(const TpAddressSpace::State& st, const TpConfig& c) {
  const std::uint32_t p = c.num_ranks;
  std::vector<std::uint32_t> homed(p, 0);
  for (std::uint32_t a = 0; a < st.dir.extent(); ++a) homed[a % p] += st.dir.IsLive(LogicalAddr(a));
  for (std::uint32_t r = 0; r < p; ++r) {
    if (homed[r] != st.homed[r]) return Fail(fmt::format("rank {}: {} homed addresses, counter says {}", r, homed[r], st.homed[r]));
    if (st.homed[r] > c.shard_slots_per_group()) return Fail(fmt::format("rank {} holds more than its shard", r));
    if (c.page_tokens > 1) continue;
    for (LogicalAddr a : st.free_addrs[r]) {
      if (a.value() % p != r || st.dir.IsLive(a)) return Fail(fmt::format("free list of rank {} holds address {}", r, a.value()));
    }
    if (st.free_addrs[r].size() + st.homed[r] != st.minted[r]) {
      return Fail(fmt::format("rank {}: {} free + {} live != {} minted", r, st.free_addrs[r].size(), st.homed[r], st.minted[r]));
    }
  }
  return Ok();
}

// The home table of (rank, group g): exactly the live addresses homed there are located, on
// this rank, in its pools' slot (ShardPools::CheckEntry, counted in `homed`).
Status CheckHomes(const TpAddressSpace::State& st, const TpConfig& c, Rank rank, std::uint32_t g,
                  ShardPools::Occupancy& homed) {
  const std::uint32_t p = c.num_ranks, r = rank.value();
  const TpGroupShard& sh = st.shards[r][g];
  const std::size_t in_use = HomeInUse(st, c, r);
  for (std::size_t i = in_use; i < sh.home.size() && i < in_use + 64; ++i) {  // spot check past the end
    if (!sh.home[i].is_none()) return Fail(fmt::format("rank {} group {}: home entry {} past the addresses is set", r, g, i));
  }
  for (std::uint32_t i = 0; i < in_use; ++i) {
    const LogicalAddr a(i * p + r);
    const Location loc = sh.home[i];
    const bool live = st.dir.IsLive(a);
    if (loc.is_none()) {
      if (live) return Fail(fmt::format("live address {} has no home in group {}", a.value(), g));
      continue;
    }
    if (!live) return Fail(fmt::format("dead address {} has a home in group {}", a.value(), g));
    if (loc.rank() != rank) return Fail(fmt::format("address {} homed on rank {} is located on rank {}", a.value(), r, loc.rank().value()));
    ULA_RETURN_IF_ERROR(sh.CheckEntry("TpAddressSpace", a, loc, homed));
  }
  return Ok();
}

// The pools of (rank, group g) against the homes (ShardPools::CheckInvariants: shadows,
// used counts, policy, new entries on host).
Status CheckPools(const TpAddressSpace& space, const TpAddressSpace::State& st, Rank rank, std::uint32_t g,
                  const ShardPools::Occupancy& homed) {
  const std::uint32_t p = space.config().num_ranks, r = rank.value();
  const TpGroupShard& sh = st.shards[r][g];
  auto locate = [&](LogicalAddr a) {
    return a.value() % p == r && st.dir.IsLive(a) ? sh.home[a.value() / p] : Location::None();
  };
  return sh.CheckInvariants("TpAddressSpace", homed, locate, st.host_shadows, space.backend().holds_bytes());
}

// The local buffer of (rank, group g): each copy is of a live address homed elsewhere, in a
// tracked slot, equal to its home's bytes (when that home is hosted here); then the buffer's
// pool and policy checks.
Status CheckBuffer(const TpAddressSpace& space, const TpAddressSpace::State& st, Rank rank, std::uint32_t g) {
  const TpConfig& c = space.config();
  const std::uint32_t p = c.num_ranks, r = rank.value();
  const TpGroupShard& sh = st.shards[r][g];
  if (sh.buffered.size() != sh.buffer.num_used()) {
    return Fail(fmt::format("rank {} group {}: {} buffer slots used but {} indexed", r, g, sh.buffer.num_used(), sh.buffered.size()));
  }
  std::vector<std::byte> home_bytes(c.entry_bytes);
  for (const auto& [addr, slot] : sh.buffered) {
    const LogicalAddr a(addr);
    if (!st.dir.IsLive(a)) return Fail(fmt::format("rank {} buffers dead address {}", r, addr));
    if (addr % p == r) return Fail(fmt::format("rank {} buffers its own address {}", r, addr));
    if (!sh.buffer.IsAllocated(slot) || sh.buffer_owner[slot.value()] != a) {
      return Fail(fmt::format("rank {} group {}: buffer slot {} does not hold address {}", r, g, slot.value(), addr));
    }
    if (!sh.buffer_policy->IsTracked(slot)) return Fail(fmt::format("buffer slot {} is untracked", slot.value()));
    if (space.backend().holds_bytes() && space.Hosts(space.HomeOf(a))) {
      (void)space.Read(a, GroupId(static_cast<std::uint16_t>(g)), home_bytes);
      if (std::memcmp(home_bytes.data(), sh.buffer.data(slot), c.entry_bytes) != 0) {
        return Fail(fmt::format("rank {} group {}: buffered copy of address {} differs from its home", r, g, addr));
      }
    }
  }
  ULA_RETURN_IF_ERROR(sh.buffer.CheckInvariants());
  ULA_RETURN_IF_ERROR(sh.buffer_policy->CheckInvariants());
  std::uint64_t tracked_buf = 0;
  for (std::uint32_t s = 0; s < sh.buffer.capacity(); ++s) tracked_buf += sh.buffer_policy->IsTracked(SlotId(s));
  if (tracked_buf != sh.buffer.num_used()) {
    return Fail(fmt::format("rank {} group {}: the buffer policy tracks {} slots, {} occupied", r, g, tracked_buf,
                            sh.buffer.num_used()));
  }
  return Ok();
}

}  // namespace

Status TpAddressSpace::CheckInvariants() const {
  const State& st = *state_;
  ULA_RETURN_IF_ERROR(st.dir.CheckInvariants("TpAddressSpace"));  // the directory (directory.h)
  ULA_RETURN_IF_ERROR(CheckHomeRule(st, config_));
  ULA_RETURN_IF_ERROR(CheckTpKinds(st, config_));  // invariants 5-7 (space/tp_kinds.cc)
  for (Rank rank : hosted_) {  // hosted shards and buffers
    for (std::uint32_t g = 0; g < config_.num_groups; ++g) {
      ShardPools::Occupancy homed;
      ULA_RETURN_IF_ERROR(CheckHomes(st, config_, rank, g, homed));
      ULA_RETURN_IF_ERROR(CheckPools(*this, st, rank, g, homed));
      ULA_RETURN_IF_ERROR(CheckBuffer(*this, st, rank, g));
    }
  }
  return Ok();
}

std::uint64_t TpAddressSpace::DebugDigest() const {
  const State& st = *state_;
  StateDigest d;
  st.dir.AddToDigest(d);
  for (const auto& fifo : st.free_addrs) {
    d.Add(fifo.size());
    for (LogicalAddr a : fifo) d.Add(a.value());
  }
  d.AddAll(std::span<const std::uint32_t>(st.minted));
  d.AddAll(std::span<const std::uint32_t>(st.homed));
  d.Add(st.cursor);
  AddTpKindsToDigest(st, d);
  for (Rank r : hosted_) {
    for (std::uint32_t g = 0; g < config_.num_groups; ++g) {
      const TpGroupShard& sh = state_->at(r, GroupId(static_cast<std::uint16_t>(g)));
      sh.AddToDigest(d);
      for (std::size_t i = 0, n = HomeInUse(st, config_, r.value()); i < n; ++i) d.Add(sh.home[i].bits());
      d.Add(sh.buffer.free_bitmap());
      d.Add(sh.buffer_policy->DebugDigest());
      for (LogicalAddr a : sh.buffer_owner) d.Add(a.value());
      std::uint64_t buffered = 0;
      for (const auto& [a, s] : sh.buffered) buffered += StateDigest::Mix(a, s.value());
      d.Add(buffered);
    }
  }
  return d.value();
}

}  // namespace ula
