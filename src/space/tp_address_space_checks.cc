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
      // Host shadows (sparse/host_shadows.h): each one's host slot is allocated and locates
      // no address; its device slot holds a live entry located there, whose bytes it equals
      // (clean: the entry was not written since its fetch).
      if (sh.shadows.enabled() != st.host_shadows) {
        return fail(fmt::format("rank {} group {}: shadows {} but the space {}", r, g, sh.shadows.enabled(), st.host_shadows));
      }
      ULA_RETURN_IF_ERROR(sh.shadows.CheckInvariants());
      Status shadow_ok = Ok();
      sh.shadows.ForEach([&](SlotId d, SlotId h) {
        if (!shadow_ok) return;
        if (!sh.host.IsAllocated(h) || host_seen[h.value()]) {
          shadow_ok = fail(fmt::format("rank {} group {}: host shadow slot {} is free or an entry's location", r, g, h.value()));
          return;
        }
        const LogicalAddr a = sh.device_owner[d.value()];
        if (!sh.device.IsAllocated(d) || !a.valid() || a.value() % p != r ||
            sh.home[a.value() / p] != Location::Make(Tier::kDevice, rank, d)) {
          shadow_ok = fail(fmt::format("rank {} group {}: host shadow {} of device slot {} whose entry is not there", r,
                                       g, h.value(), d.value()));
          return;
        }
        if (backend_.holds_bytes() && std::memcmp(sh.host.data(h), sh.device.data(d), config_.entry_bytes) != 0) {
          shadow_ok = fail(fmt::format("rank {} group {}: host shadow {} of address {} differs from its device bytes (a "
                                       "write did not drop it)", r, g, h.value(), a.value()));
        }
      });
      ULA_RETURN_IF_ERROR(shadow_ok);
      if (n_dev != sh.device.num_used() || n_host + sh.shadows.size() != sh.host.num_used()) {
        return fail(fmt::format("rank {} group {}: pools hold {}/{} ({} host shadows) but homes locate {}/{}", r, g,
                                sh.device.num_used(), sh.host.num_used(), sh.shadows.size(), n_dev, n_host));
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
      d.Add(sh.shadows.size());
      sh.shadows.ForEach([&](SlotId dev, SlotId h) {
        d.Add(dev.value());
        d.Add(h.value());
      });
    }
  }
  return d.value();
}

}  // namespace ula
