// HostShadows: the clean host copies of device entries of one (rank, group) pool pair
// (AddressSpaceConfig::host_shadows). Name: "host shadow" everywhere; the
// verifiers' copy of every entry's expected bytes is their "reference bytes".
//
// What a host shadow is. When a step fetches an entry host -> device, its host slot keeps
// the bytes it held: the entry's authoritative location becomes the device slot, and the
// host slot becomes a *host shadow* of that device slot: a clean copy, reclaimable memory,
// counted free in every capacity figure (NumFree/NumUsed, Allocate's room check, the
// step's). Evicting an entry whose host shadow survives moves no bytes: only its table
// entry changes (to the shadow's host slot, which becomes authoritative again). Host
// allocations (an eviction without a shadow, a new entry placed on host) take a free host
// slot first and only then reclaim the oldest shadow (host LRU: a shadow is never read, so
// its age is the time since its fetch; the oldest is reclaimed first).
//
// Data (per (rank, group), only when enabled):
//   of_device_  [device slots] the host slot of the shadow of the entry in device slot d,
//               or kNone;
//   links_      [host slots]   one 12-byte record per host slot: device_of, for a host
//               slot that is a shadow the device slot whose entry it copies (kNone for a
//               free slot or an authoritative entry), and prev / next, the intrusive LRU
//               list of shadows, oldest at head_. One record, so that Take and Add touch one
//               cache line per host slot they visit (they were three arrays);
//   count_      shadows in the list.
// 12 B per host slot + 4 B per device slot; nothing when disabled. Every operation O(1).
// The host SlotPool counts a shadow slot as allocated (its bytes must survive); the owner
// (ShardPools in shard_pools.h) subtracts count_ wherever a capacity is reported.
//
// Invariants (CheckInvariants here; the space checks the rest):
//   1. of_device_ and links_[].device_of are inverse on the shadows; the list holds exactly them,
//      each once, and count_ is its length.
//   2. (space) A shadow's device slot holds a live entry whose authoritative location is
//      that device slot; its host slot is allocated in the host pool and located by no
//      address. Exactly one authoritative location per live entry; a shadow is never read.
//   3. (space) A shadow is clean: it holds the bytes its entry had when it was fetched, and
//      its entry has not been written since. Write and Allocate drop it (the new bytes are
//      on device only); an entry placed on device by Allocate has none.
//   4. (space) A shadow never outlives its entry's device copy being the authority: when the
//      entry leaves the device (eviction: the shadow becomes its location; Free: the shadow
//      is freed) the shadow stops being one.
//
// A shadow reclaimed while a fetch reads it: ordered, it cannot happen. Fetches read only
// authoritative host locations, never a shadow, and a host slot becomes a shadow only when
// the fetch that read it has completed and been published. Within one Step or Allocate the
// shadows of its victims are taken out of the list before any host slot is chosen for the
// other victims (so a victim's shadow is never reclaimed for another victim's copy), and
// every copy of the call completes (waited on its fence) before the call returns; the
// space has one driver thread (address_space.h), so no reclaim runs during another call's
// copies.
//
// Thread-safety: none; plain data of the space under its driver thread.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "ula/check.h"
#include "ula/error.h"
#include "ula/ids.h"
#include "ula/residency_policy.h"

namespace ula {

class HostShadows {
 public:
  static constexpr std::uint32_t kNone = 0xffffffffu;

  // Enables shadows over pools of these sizes (every slot without a shadow). `policy` (the
  // device pool's, may be null) is told of every shadow that appears or goes
  // (ResidencyPolicy::SetShadowed: PB-LRU may prefer such victims).
  void Enable(std::uint32_t device_slots, std::uint32_t host_slots, ResidencyPolicy* policy = nullptr) {
    policy_ = policy;
    of_device_.assign(device_slots, kNone);
    links_.assign(host_slots, Link{});
    head_ = tail_ = kNone;
    count_ = 0;
    enabled_ = true;
  }
  bool enabled() const { return enabled_; }
  std::uint32_t size() const { return count_; }

  // The host slot shadowing device slot d, or SlotId::Invalid(). REQUIRES: enabled, d in range.
  SlotId ShadowOf(SlotId d) const { return of_device_[d.value()] == kNone ? SlotId::Invalid() : SlotId(of_device_[d.value()]); }
  bool HasShadow(SlotId d) const { return enabled_ && of_device_[d.value()] != kNone; }
  // The device slot whose entry host slot h shadows, or SlotId::Invalid().
  SlotId DeviceOf(SlotId h) const {
    return links_[h.value()].device_of == kNone ? SlotId::Invalid() : SlotId(links_[h.value()].device_of);
  }
  bool IsShadow(SlotId h) const { return enabled_ && links_[h.value()].device_of != kNone; }

  // Host slot h now shadows the entry of device slot d: the newest shadow.
  // REQUIRES: enabled; neither d nor h has a shadow.
  void Add(SlotId d, SlotId h) {
    Link& l = links_[h.value()];
    ULA_CHECK(of_device_[d.value()] == kNone && l.device_of == kNone);  // else the list cycles
    of_device_[d.value()] = h.value();
    l = Link{d.value(), tail_, kNone};
    if (tail_ != kNone) links_[tail_].next = h.value();
    else head_ = h.value();
    tail_ = h.value();
    ++count_;
    if (policy_ != nullptr) policy_->SetShadowed(d, true);
  }
  // Takes the shadow of device slot d out (it stops being a shadow) and returns its host
  // slot, still allocated in the host pool: the caller frees it or makes it an entry's
  // location. SlotId::Invalid() if d has none (or shadows are off).
  SlotId Take(SlotId d) {
    if (!enabled_ || of_device_[d.value()] == kNone) return SlotId::Invalid();
    const std::uint32_t h = of_device_[d.value()];
    of_device_[d.value()] = kNone;
    const Link l = links_[h];
    if (l.prev != kNone) links_[l.prev].next = l.next;
    else head_ = l.next;
    if (l.next != kNone) links_[l.next].prev = l.prev;
    else tail_ = l.prev;
    links_[h] = Link{};
    --count_;
    if (policy_ != nullptr) policy_->SetShadowed(d, false);
    return SlotId(h);
  }
  // Reclaims the oldest shadow: its device entry keeps its authoritative copy and loses
  // the clean one. Returns the host slot (still allocated), or SlotId::Invalid() if none.
  SlotId TakeOldest() {
    if (head_ == kNone) return SlotId::Invalid();
    return Take(SlotId(links_[head_].device_of));
  }

  // With the host pool the shadows live in (ShardPools::AllocateHost and DropShadow):
  // A host slot for an entry: a free one, else the oldest shadow reclaimed (its device
  // entry keeps its authoritative copy). nullopt when the host holds only entries.
  template <class Pool>
  std::optional<SlotId> AllocateHost(Pool& host) {
    if (auto s = host.Allocate(); s) return *s;
    const SlotId h = TakeOldest();
    if (!h.valid()) return std::nullopt;
    return h;
  }
  // Drops the shadow of device slot d, if it has one (its entry is written or freed).
  template <class Pool>
  void Drop(Pool& host, SlotId d) {
    if (const SlotId h = Take(d); h.valid()) ULA_CHECK(host.Free(h).has_value());
  }
  // The shadows' host slots, oldest first (checks, digests, the device step's copy). A list longer than
  // count_ is a cycle (a slot added twice): a check failure, never an endless walk.
  template <class F>
  void ForEach(F&& f) const {
    std::uint32_t walked = 0;
    for (std::uint32_t h = head_; h != kNone; h = links_[h].next) {
      ULA_CHECK(++walked <= count_);
      f(SlotId(links_[h].device_of), SlotId(h));
    }
  }

  std::uint64_t MemoryBytes() const {
    return of_device_.capacity() * sizeof(std::uint32_t) + links_.capacity() * sizeof(Link);
  }

  // Invariant 1 above: an error naming the first break, or Ok.
  Status CheckInvariants() const {
    auto fail = [](std::string m) { return MakeError(ErrorCode::kInternal, "HostShadows: " + std::move(m)); };
    if (!enabled_) {
      if (count_ != 0 || head_ != kNone) return fail("disabled but not empty");
      return Ok();
    }
    std::uint32_t n = 0, prev = kNone;
    for (std::uint32_t h = head_; h != kNone; h = links_[h].next) {
      if (h >= links_.size() || ++n > count_) return fail("the list is longer than its count or leaves the pool");
      if (links_[h].prev != prev) return fail("broken back link at host slot " + std::to_string(h));
      const std::uint32_t d = links_[h].device_of;
      if (d == kNone || d >= of_device_.size() || of_device_[d] != h) {
        return fail("host slot " + std::to_string(h) + " is listed but its device slot does not name it");
      }
      prev = h;
    }
    if (n != count_ || prev != tail_) return fail("count or tail disagrees with the list");
    std::uint32_t with = 0;
    for (std::uint32_t d = 0; d < of_device_.size(); ++d) {
      if (of_device_[d] == kNone) continue;
      ++with;
      if (of_device_[d] >= links_.size() || links_[of_device_[d]].device_of != d) {
        return fail("device slot " + std::to_string(d) + " names a shadow that does not name it");
      }
    }
    if (with != count_) return fail("device slots name more shadows than the list holds");
    return Ok();
  }

 private:
  struct Link {
    std::uint32_t device_of = kNone;  // the device slot this host slot shadows, or kNone
    std::uint32_t prev = kNone;       // toward the oldest
    std::uint32_t next = kNone;       // toward the newest
  };
  std::vector<std::uint32_t> of_device_;  // [device slots]
  std::vector<Link> links_;               // [host slots]
  std::uint32_t head_ = kNone;            // oldest
  std::uint32_t tail_ = kNone;            // newest
  std::uint32_t count_ = 0;
  bool enabled_ = false;
  ResidencyPolicy* policy_ = nullptr;  // told of each shadow's coming and going
};

// How a step with shadows fills each miss's device slot (MissFills in step/miss_fills.h: the
// one plan of the DP and TP host steps and engine paths). Misses below the free count go to free
// slots; a victim's slot is
//   kToShadow  emptied by moving its victim to its live shadow (the table alone), then filled by a copy;
//   kEvict     emptied by copying its victim device -> host into a host slot of its own, then filled by a copy;
//   kSwap      filled by a swap with the wanted entry's host slot (the host holds nothing but entries).
enum class ShadowFill : std::uint8_t { kFree, kToShadow, kEvict, kSwap };

}  // namespace ula
