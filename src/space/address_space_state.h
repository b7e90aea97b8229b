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

struct RequestState {
  Rank rank;
  std::vector<LogicalAddr> addrs;  // [tokens] in order: adopted (ShareInto) and allocated, distinct
  std::uint32_t tag = 0;           // its owner tag (non-zero, unique among live requests)
  std::vector<LogicalAddr> adopted;  // sorted: the addresses of `addrs` it adopted (not its own allocation)
  // The page its last own allocation went to, while the list still ends there (a ShareInto
  // closes it): its next token continues that page. kNoPage otherwise.
  std::uint32_t open_page = kNoPage;
  static constexpr std::uint32_t kNoPage = 0xffffffffu;
};

// Owner tag of a live address whose allocating request no longer holds it (held by
// adopters and/or cache references only). Never a request's tag.
inline constexpr std::uint32_t kSharedTag = refs::kSharedTag;

struct AddressSpace::State {
  explicit State(Backend& backend) : arenas(backend) {}

  PoolArenas arenas;  // destroyed last: every pool below lives in one of them
  std::vector<std::vector<GroupPools>> pools;  // [num_ranks][num_groups]
  std::vector<AddressRecords> tables;          // [num_groups] location + dedup stamp per address
  std::unordered_map<RequestId, RequestState> requests;
  // [next_addr] the owner tag: the allocating request's while it holds the address,
  // kSharedTag once only adopters / cache references hold it, 0 when free; huge pages (the
  // planner reads it at random, once per selection: 4 KiB pages would add a TLB miss)
  std::vector<std::uint32_t, HugePageAllocator<std::uint32_t>> owner;
  // [next_addr] references, packed (sparse/address_refs.h): requests listing the address
  // and cache references (Retain) on it; 0 = free.
  std::vector<std::uint32_t> refs;
  static constexpr std::uint32_t kRequestRef = refs::kRequestRef, kCacheRef = refs::kCacheRef;
  static constexpr std::uint32_t kMaxRequestRefs = refs::kMaxRequestRefs, kMaxCacheRefs = refs::kMaxCacheRefs;
  std::uint32_t request_refs(LogicalAddr a) const { return refs::RequestRefs(refs[a.value()]); }
  std::uint32_t cache_refs(LogicalAddr a) const { return refs::CacheRefs(refs[a.value()]); }
  std::uint32_t next_tag = 1;          // the next request's tag (renumbered on wrap)
  // Addresses come in pages of config.page_tokens (page p: [p * P, (p + 1) * P)); a page
  // belongs to the request that opened it, token i of a request's list sits at offset
  // i % P of its page. A page whose last live address is freed (found by reading the
  // page's P reference counts: no per-page metadata) joins the FIFO, reused as late as
  // possible. An open page always holds a live address (its opener's own, held until
  // Free), so a free page is never open.
  std::deque<std::uint32_t> free_pages;
  std::uint32_t next_page = 0;           // pages [0, next_page) have been handed out once
  std::uint32_t next_addr = 0;           // next_page * page_tokens: the table's extent
  std::uint64_t live = 0;
  bool stable_new_entries = false;  // config.stable_new_entries: fixed at Create
  bool host_shadows = false;        // config.host_shadows: fixed at Create
  AddressSpace::MoveExecutor move_executor;  // null: the backend runs Allocate's moves
  const void* move_executor_owner = nullptr;  // the EngineStepPlanner that installed it, if one did
  std::uint64_t writes = 0;  // sanitizer trees: Write checks every 64th time
  // Plans between EngineStepPlanner::Plan and Complete over this space (each planner has
  // at most one). While one is pending its descriptors name entries, slots and victims
  // that a Free, Truncate, Allocate, Write, ShareInto or Release could change under it:
  // those calls are refused (RefuseWhilePlanPending). Set by Plan, cleared by Complete or
  // by the planner's destruction.
  std::uint32_t plans_pending = 0;
  Status RefuseWhilePlanPending(const char* what) const {
    if (plans_pending == 0) return Ok();
    return MakeError(ErrorCode::kFailedPrecondition,
                     fmt::format("{}: an engine step's plan is pending (between Plan and Complete); its descriptors "
                                 "name entries and slots this call could change: Complete the plan first", what));
  }

  GroupPools& at(Rank r, GroupId g) { return pools[r.value()][g.value()]; }
  // The isolation check (selection_run.h) of a live or free address `a` < next_addr:
  // whether request `req` holds it (its own allocation, or an adopted one). O(1) for its
  // own, O(log adopted) otherwise.
  bool Holds(const RequestState& req, LogicalAddr a) const {
    return refs::Holds(owner[a.value()], req.tag, req.adopted, a);
  }
  const GroupPools& at(Rank r, GroupId g) const { return pools[r.value()][g.value()]; }
};

// The error of selection i (address a, selected for `holder` on `rank`) that failed a check
// of the step (not live, not the holder's, another rank's), built off the hot path with the
// requests named: kNotFound or kInvalidArgument. The DP host step's (StepPlanner), defined in
// step_planner.cc.
Error SelectionError(const AddressSpace::State& st, const AddressRecords& table, std::size_t i, LogicalAddr a,
                     const RequestState& holder, Rank rank);

}  // namespace ula
