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
#include "space/frame_share.h"
#include "space/kind_frames.h"
#include "space/kind_entries.h"
#include "space/pool_arenas.h"
#include "space/shard_pools.h"
#include "backend/slot_pool.h"
#include "ula/check.h"

namespace ula {

// The pools of one (rank, group) (shard_pools.h): per layer regions (address_space.h "Pools").
using GroupPools = ShardPools;

// A DP request: its rank, list, tag, adopted addresses and open page (directory.h).
using RequestState = Directory::Request;

// Owner tag of a live address whose allocating request no longer holds it (held by
// adopters and/or cache references only). Never a request's tag.
inline constexpr std::uint32_t kSharedTag = refs::kSharedTag;

struct AddressSpace::State {
  State(Backend& backend, std::uint32_t page_tokens, std::span<const KvKind> kinds)
      : arenas(backend), dir(page_tokens, /*paged=*/true), kinds(kinds) {}

  PoolArenas arenas;  // destroyed last: every pool below lives in one of them
  std::vector<std::vector<GroupPools>> pools;  // [num_ranks][num_groups]
  std::vector<AddressRecords> tables;          // [num_groups] location + dedup stamp per address
  // The requests, their addresses, tags, reference counts and pages (directory.h); its
  // extent is the tables' size.
  Directory dir;
  // A space with kinds: every request's entries of every kind (kind_entries.h); the
  // directory's addresses are the sparse kind's entries. Empty without kinds.
  KindEntries kinds;
  // A space with kind frames (config.kind_frame_bytes): rank 0's budget of every kind, and
  // where the C4 slots sit in it (frame_share.h). Null and empty otherwise.
  std::unique_ptr<KindFrames> frames;
  FrameShare share;
  bool stable_new_entries = false;  // config.stable_new_entries: fixed at Create
  bool host_shadows = false;        // config.host_shadows: fixed at Create
  AddressSpace::MoveExecutor move_executor;  // null: the backend runs Allocate's moves
  const void* move_executor_owner = nullptr;  // the StepPlanner that installed it, if one did
  // Device placement mode (config.device_placement): the journal not yet taken, with the
  // positions of its seats and new requests (a release or Free before the take cancels
  // them: tombstoned with tag 0, dropped by TakePlacement), and each rank's live addresses
  // (Allocate's room check: the host pools see no placements).
  bool device_placement = false;
  PlacementJournal journal;
  std::unordered_map<std::uint32_t, std::size_t> seat_pos;     // address -> its seat in journal.seated[rank]
  std::unordered_map<std::uint64_t, std::size_t> request_pos;  // request id -> journal.new_requests
  std::vector<std::uint64_t> live_on_rank;                     // [num_ranks]
  std::uint64_t writes = 0;  // sanitizer trees: writes since the last full check (WriteCheckStride)

  GroupPools& at(Rank r, GroupId g) { return pools[r.value()][g.value()]; }
  const GroupPools& at(Rank r, GroupId g) const { return pools[r.value()][g.value()]; }
};

// The error of selection i (address a, selected for `holder` on `rank`) that failed a check
// of the step (not live, not the holder's, another rank's), built off the hot path with the
// requests named: kNotFound or kInvalidArgument. The DP host step's (src/step/step_planner_impl.h),
// defined in step_planner.cc.
Error SelectionError(const AddressSpace::State& st, const AddressRecords& table, std::size_t i, LogicalAddr a,
                     const RequestState& holder, Rank rank);

}  // namespace ula
