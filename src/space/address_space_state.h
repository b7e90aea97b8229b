// Internal state of AddressSpace, shared with the StepPlanner (same component).
#pragma once

#include <algorithm>
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <unordered_map>
#include <vector>

#include <fmt/format.h>

#include "ula/address_space.h"
#include "core/address_records.h"
#include "space/address_refs.h"
#include "space/directory.h"
#include "space/host_shadows.h"
#include "space/pool_arenas.h"
#include "backend/slot_pool.h"
#include "ula/check.h"

namespace ula {

// The pools of one (rank, group): per layer regions (address_space.h "Pools"). A SlotPool's
// slot_bytes is one row; slot s of layer l sits at offset(s) + l * stride.
struct GroupPools {
  SlotPool device;
  SlotPool host;
  std::unique_ptr<ResidencyPolicy> policy;  // over device slots
  std::vector<LogicalAddr> device_owner;    // [device capacity] address held by each device slot
  std::uint32_t num_layers = 1;
  std::uint64_t device_stride = 0;  // bytes of one layer's device region
  std::uint64_t host_stride = 0;
  // Sorted: the entries this round's Allocate placed on host (the device held nothing but
  // this round's entries). Their KV is written at that host slot, so no step of this round
  // moves them (address_space.h, Allocate). Cleared by AdvanceRound; empty almost always.
  std::vector<LogicalAddr> new_on_host;
  bool IsNewOnHost(LogicalAddr a) const {
    return !new_on_host.empty() && std::binary_search(new_on_host.begin(), new_on_host.end(), a);
  }
  // The refusal every planner makes (item 1: a new entry's write slot never moves
  // in its round): kResourceExhausted naming the first of `missed` (LogicalAddr or raw
  // uint32 addresses) that this round's Allocate placed on host; Ok when none is.
  template <class Addr>
  Status RefuseMovingNewOnHost(const std::vector<Addr>& missed) const {
    if (new_on_host.empty()) return Ok();
    for (const Addr& raw : missed) {
      const LogicalAddr a{raw};
      if (IsNewOnHost(a)) {
        return MakeError(ErrorCode::kResourceExhausted,
                         fmt::format("address {} was placed on host by this round's Allocate (the device held only "
                                     "this round's entries): its KV is written at that host slot, so this round "
                                     "cannot move it; select it after AdvanceRound()", a.value()));
      }
    }
    return Ok();
  }

  // Clean host copies of device entries (sparse/host_shadows.h); disabled unless
  // AddressSpaceConfig::host_shadows. A shadow's host slot is allocated in `host` but free
  // in every capacity figure: HostFree / HostUsed.
  HostShadows shadows;
  std::uint32_t HostFree() const { return host.num_free() + shadows.size(); }
  std::uint32_t HostUsed() const { return host.num_used() - shadows.size(); }
  // A host slot for an entry: a free one, else the oldest shadow reclaimed (its device
  // entry keeps its authoritative copy). nullopt when the host holds only entries.
  std::optional<SlotId> AllocateHost() { return shadows.AllocateHost(host); }
  // Drops the shadow of device slot d, if it has one (its entry is written or freed).
  void DropShadow(SlotId d) { shadows.Drop(host, d); }

  const SlotPool& pool(Tier t) const { return t == Tier::kDevice ? device : host; }
  std::uint64_t stride(Tier t) const { return t == Tier::kDevice ? device_stride : host_stride; }
  // The backend moves of one entry from slot `src` of tier `from` to slot `dst` of the
  // other tier: one row per layer.
  void AppendMoves(Tier from, SlotId src, SlotId dst, std::vector<SlotMove>& out) const {
    const Tier to = from == Tier::kDevice ? Tier::kHost : Tier::kDevice;
    for (std::uint32_t l = 0; l < num_layers; ++l) {
      out.push_back({pool(from).offset(src) + l * stride(from), pool(to).offset(dst) + l * stride(to)});
    }
  }
};

// A DP request: its rank, list, tag, adopted addresses and open page (directory.h).
using RequestState = Directory::Request;

// Owner tag of a live address whose allocating request no longer holds it (held by
// adopters and/or cache references only). Never a request's tag.
inline constexpr std::uint32_t kSharedTag = refs::kSharedTag;

struct AddressSpace::State {
  State(Backend& backend, std::uint32_t page_tokens) : arenas(backend), dir(page_tokens, /*paged=*/true) {}

  PoolArenas arenas;  // destroyed last: every pool below lives in one of them
  std::vector<std::vector<GroupPools>> pools;  // [num_ranks][num_groups]
  std::vector<AddressRecords> tables;          // [num_groups] location + dedup stamp per address
  // The requests, their addresses, tags, reference counts and pages (directory.h); its
  // extent is the tables' size.
  Directory dir;
  bool stable_new_entries = false;  // config.stable_new_entries: fixed at Create
  bool host_shadows = false;        // config.host_shadows: fixed at Create
  AddressSpace::MoveExecutor move_executor;  // null: the backend runs Allocate's moves
  const void* move_executor_owner = nullptr;  // the EngineStepPlanner that installed it, if one did
  std::uint64_t writes = 0;  // sanitizer trees: Write checks every 64th time

  GroupPools& at(Rank r, GroupId g) { return pools[r.value()][g.value()]; }
  const GroupPools& at(Rank r, GroupId g) const { return pools[r.value()][g.value()]; }
};

// The error of selection i (address a, selected for `holder` on `rank`) that failed a check
// of the step (not live, not the holder's, another rank's), built off the hot path with the
// requests named: kNotFound or kInvalidArgument. The DP host step's (src/step/dp_step.h),
// defined in dp_step.cc.
Error SelectionError(const AddressSpace::State& st, const AddressRecords& table, std::size_t i, LogicalAddr a,
                     const RequestState& holder, Rank rank);

}  // namespace ula
