// ShardPools: one rank's pools of one layer group, the half of the space that holds bytes
// (docs/ARCHITECTURE.md, "Layers": the space core). DP keeps one per (rank, group)
// (GroupPools); a TP rank's shard is one plus its home table and local buffer (TpGroupShard
// in tp_state.h). The directory says which addresses are live; the space's location record
// (DP's table, TP's home table) says where each one is; ShardPools holds the slots.
//
// Data:
//   device, host   the slot pools of the two tiers. An entry is num_layers rows of row_bytes;
//                  layer l's row of slot s sits at pool.offset(s) + l * stride (DP's
//                  per-layer regions, include/ula/address_space.h "Pools"; TP: one layer; a
//                  space's frames: blocks of 64 rows per layer in the budget's arena);
//   policy         the residency policy over the device slots;
//   device_owner   [device capacity] the address each device slot holds, Invalid when free;
//   new_on_host    sorted: the entries this round's Allocate placed on host (the device held
//                  nothing but this round's entries, or its victims' move failed). The
//                  engine writes their KV at that host slot, so no step of the round moves
//                  them (RefuseMovingNewOnHost). Cleared by AdvanceRound; empty almost always;
//   shadows        the clean host copies of device entries (host_shadows.h), when enabled: a
//                  shadow's host slot is allocated in `host` but free in every capacity figure
//                  (HostFree, HostUsed, NumFree);
//   withheld       device slots allocated to no entry (a space's frames of other kinds,
//                  frame_share.h): counted used, owned by nothing, not in the policy.
//
// Invariants (CheckEntry and CheckInvariants, given what the location record locates here):
//   1. Each located entry sits in an allocated slot of its tier that no other entry holds; a
//      device entry's slot names it in device_owner and is tracked by the policy; the policy
//      tracks exactly the used device slots.
//   2. Used counts: device used = entries located on device + withheld slots; host used =
//      entries located on host + shadows.
//   3. Each shadow's host slot locates no entry; its device slot holds a live entry located
//      there, whose bytes it equals (a write dropped it otherwise).
//   4. new_on_host is sorted and distinct, and each of its entries is located on host here.
//
// Thread-safety: none. Plain data of the space under its driver thread; the pools of
// different (rank, group) pairs are disjoint, so steps of different groups may run on
// different threads.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include "backend/slot_pool.h"
#include "core/digest.h"
#include "space/host_shadows.h"
#include "space/pool_arenas.h"
#include "ula/error.h"
#include "ula/ids.h"
#include "ula/location.h"
#include "ula/residency_policy.h"

namespace ula {

struct ShardPools {
  // The shape of one rank's pools of one group.
  struct Geometry {
    Rank rank;
    GroupId group;
    std::uint32_t device_slots = 0;
    std::uint32_t host_slots = 0;
    std::uint32_t row_bytes = 0;
    std::uint32_t num_layers = 1;
    // DP: per-layer regions of PaddedRows(slots) rows each; TP: one region of the slots.
    bool layer_regions = false;
    // A space's frames (frame_share.h): the device slots in blocks of 64 rows over this arena,
    // layer l of slot s at blocks' offset(s) + l * 64 * row_bytes. Null: an arena of their own.
    const Arena* device_arena = nullptr;
    SlotBlocks device_blocks = {};
  };
  // The pools on `arenas`, the policy over the device slots, shadows when `host_shadows`.
  static Result<ShardPools> Create(PoolArenas& arenas, const Geometry& geometry, PolicyKind policy_kind,
                                   const PolicyOptions& options, bool host_shadows);

  SlotPool device;
  SlotPool host;
  std::unique_ptr<ResidencyPolicy> policy;  // over device slots
  std::vector<LogicalAddr> device_owner;    // [device capacity] address held by each device slot
  std::uint32_t num_layers = 1;
  std::uint32_t row_bytes = 0;
  std::uint64_t device_stride = 0;  // bytes of one layer's device region
  std::uint64_t host_stride = 0;
  Rank rank;
  GroupId group;
  std::vector<LogicalAddr> new_on_host;  // sorted (see above)
  HostShadows shadows;
  // Device slots allocated to no entry: the C4 slots of frames a space with kind frames gave
  // to its resident kinds (src/space/frame_share.h). No owner, not tracked by the policy.
  std::uint32_t withheld = 0;

  // Capacity, shadows counted free.
  std::uint32_t HostFree() const { return host.num_free() + shadows.size(); }
  std::uint32_t HostUsed() const { return host.num_used() - shadows.size(); }
  std::uint32_t NumFree(Tier t) const { return t == Tier::kDevice ? device.num_free() : HostFree(); }
  std::uint32_t NumUsed(Tier t) const { return t == Tier::kDevice ? device.num_used() - withheld : HostUsed(); }
  // A host slot for an entry: a free one, else the oldest shadow reclaimed (its device
  // entry keeps its authoritative copy). nullopt when the host holds only entries.
  std::optional<SlotId> AllocateHost() { return shadows.AllocateHost(host); }
  // Drops the shadow of device slot d, if it has one (its entry is written or freed).
  void DropShadow(SlotId d) { shadows.Drop(host, d); }
  // The entry at `loc` (here) was written: its bytes are on device only, so its host
  // shadow is no longer clean.
  void Written(Location loc) {
    if (loc.tier() == Tier::kDevice) DropShadow(loc.slot());
  }

  bool IsNewOnHost(LogicalAddr a) const {
    return !new_on_host.empty() && std::binary_search(new_on_host.begin(), new_on_host.end(), a);
  }
  // The refusal every planner makes (a new entry's write slot never moves in its round):
  // kResourceExhausted naming the first of `missed` (LogicalAddr or raw uint32 addresses)
  // that this round's Allocate placed on host; Ok when none is.
  template <class Addr>
  Status RefuseMovingNewOnHost(const std::vector<Addr>& missed) const {
    if (new_on_host.empty()) return Ok();
    for (const Addr& raw : missed) {
      const LogicalAddr a{raw};
      if (IsNewOnHost(a)) {
        return RefuseNewOnHost(a);
      }
    }
    return Ok();
  }
  // The step's room check, for every planner (docs/ARCHITECTURE.md, "One decode step of one
  // layer group"): Ok when `missed` (the step's distinct misses here, LogicalAddr or raw
  // uint32 addresses) can all come to device: none is a new entry pinned on host
  // (RefuseMovingNewOnHost), and they fit in the free device slots plus the slots the policy
  // may evict once `hits` (the step's distinct device hits here) are used in this round.
  // kResourceExhausted naming the room otherwise. Changes nothing.
  template <class Addr>
  Status RefuseMissesWithoutRoom(const std::vector<Addr>& missed, std::span<const SlotId> hits) const {
    if (Status s = RefuseMovingNewOnHost(missed); !s) return s;
    return RefuseNoRoom(hits, missed.size());
  }
  const SlotPool& pool(Tier t) const { return t == Tier::kDevice ? device : host; }
  std::uint64_t stride(Tier t) const { return t == Tier::kDevice ? device_stride : host_stride; }
  // The backend moves of one entry from slot `src` of tier `from` to slot `dst` of tier `to`
  // (the other tier, or a device slot of another frame: frame_share.h): one row per layer.
  void AppendMoves(Tier from, SlotId src, Tier to, SlotId dst, std::vector<SlotMove>& out) const {
    for (std::uint32_t l = 0; l < num_layers; ++l) {
      out.push_back({pool(from).offset(src) + l * stride(from), pool(to).offset(dst) + l * stride(to)});
    }
  }
  void AppendMoves(Tier from, SlotId src, SlotId dst, std::vector<SlotMove>& out) const {
    AppendMoves(from, src, from == Tier::kDevice ? Tier::kHost : Tier::kDevice, dst, out);
  }

  // Allocate's placement of n new entries, in two halves so that the space can move the
  // victims in between and fail with nothing published: every new entry goes to device,
  // into a free slot or else (stable_new_entries) into the slot of a victim this round has
  // not used, moved to a host slot first; only once the device holds nothing but this
  // round's entries does the rest go to host. A victim with a live shadow goes back to it
  // and moves no bytes; the victims' shadows leave the list before any other victim's host
  // slot is chosen (a free slot, else the oldest shadow), so none is reclaimed under its
  // own victim.
  struct VictimPlan {
    std::uint32_t into_free = 0;
    std::vector<SlotId> victims;        // device slots whose entries move to host
    std::vector<SlotId> victim_host;    // [victims] their host slots
    std::vector<std::uint8_t> shadowed; // [victims] its host slot is its shadow: no copy
  };
  // Claims the victims (used in this round from here on) and their host slots. The victims
  // whose shadowed[k] is 0 need a copy device -> host before PlaceNew.
  // REQUIRES: n_new <= device free + HostFree().
  VictimPlan PlanVictims(std::uint32_t n_new, bool stable);
  // After a failed copy of the victims: their host slots go back, the shadows stay shadows.
  void ReturnVictims(const VictimPlan& plan);
  // Publishes through set(address, location): each victim's new host location (when
  // `moved`), then each of `fresh`'s. With `stable`, the entries placed on host join
  // new_on_host. `moved` false: the victims stayed, and their share goes to host.
  void PlaceNew(const VictimPlan& plan, bool moved, std::span<const LogicalAddr> fresh, bool stable,
                const std::function<void(LogicalAddr, Location)>& set);

  // The entry `a` at `loc` (here) is gone: its slot is freed, its shadow with it.
  void FreeEntry(LogicalAddr a, Location loc);
  // The round ends: the policy's round, and new_on_host empties.
  void AdvanceRound() {
    policy->AdvanceRound();
    new_on_host.clear();
  }

  // The slots the location record locates here, per tier (invariants 1 and 2).
  struct Occupancy {
    std::vector<bool> device_seen, host_seen;  // [capacity] slot already located
    std::uint64_t on_device = 0, on_host = 0;
  };
  // Invariant 1 for the entry `a` located at `loc` (on this rank): an error prefixed by
  // `who`, or Ok; counts it in `seen`.
  Status CheckEntry(std::string_view who, LogicalAddr a, Location loc, Occupancy& seen) const;
  // Invariants 1 (the policy's count) to 4, after CheckEntry of every entry located here.
  // `locate(a)`: where the record says `a` is (None when not live or not homed here);
  // `shadows_on`: the space's setting; `compare_bytes`: the backend holds bytes.
  Status CheckInvariants(std::string_view who, const Occupancy& seen,
                         const std::function<Location(LogicalAddr)>& locate, bool shadows_on,
                         bool compare_bytes) const;
  void AddToDigest(StateDigest& d) const;

 private:
  Status RefuseNewOnHost(LogicalAddr a) const;
  // The room half of RefuseMissesWithoutRoom: `n_miss` misses against free plus evictable.
  Status RefuseNoRoom(std::span<const SlotId> hits, std::size_t n_miss) const;
};

}  // namespace ula
