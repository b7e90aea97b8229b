// FrameShare: the sparse kind's device slots in a space with kind frames
// (AddressSpaceConfig::kind_frame_bytes; docs/ARCHITECTURE.md, "Kinds").
//
// A space with kind frames cuts its rank's device budget (device_bytes_per_rank) into the
// frames of src/space/kind_frames.h. Every kind takes its blocks there but the sparse one
// (C4), whose device slots are the groups' pools as in any space, sized to the whole budget:
// frame f holds C4 slots [f x slots_per_frame, (f + 1) x slots_per_frame) of every group, one
// sparse block of 64 slots per padded C4 envelope, so C4 slot s is row s % 64 of block s / 64
// of the budget (its bytes there, when the backend holds bytes: space/address_space.cc,
// Create). The pools allocate slots lowest first while the kinds take frames from the top
// (KindFramesConfig::take_from_top), so the two meet only when the budget is full: the two
// ends of one buffer, as in the unified buffer (unified/end_layout.h).
//
// A frame a kind holds is withheld from C4: its C4 slots are allocated in every group's
// device pool with no owner and no place in the policy (ShardPools::withheld), so the step
// and Allocate see the C4 device share shrink as the resident kinds grow, and grow back when
// their frames return. Before an Append whose resident blocks may take free frames
// (KindEntries::CheckAppend's bound), WithholdFrames empties that many free frames: their C4
// entries move to a free device slot of another frame, or to host when the share is full,
// copy first, publish after, and KindFrames::Take gives withheld free frames first. An
// entry used in this round (allocated or selected since AdvanceRound) never moves, since its
// write slot or its step's index would go stale: the frames taken are the lowest free ones
// that hold none, and the Allocate is refused when too few are left. After every
// change of the kinds, ReleaseFreeFrames gives the C4 slots of the frames that are free again
// back to the pools.
//
// Invariants (CheckFrameShare, between calls): the withheld frames are exactly the frames a
// kind holds; in every group, a withheld frame's C4 slots are allocated with no owner, and
// ShardPools::withheld counts them.
// Thread-safety: none; the space's driver thread.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <span>

#include "space/kind_entries.h"
#include "space/kind_frames.h"
#include "ula/address_space.h"
#include "ula/step_arrays.h"

namespace ula {

struct FrameShare {
  std::uint32_t num_frames = 0;
  std::uint32_t slots_per_frame = 0;  // C4 slots of one group per frame: 64 x blocks per frame
  std::uint64_t block_stride = 0;     // the padded C4 envelope: one block of 64 slots
  std::uint32_t FirstSlot(std::uint32_t f) const { return f * slots_per_frame; }
  std::uint32_t FrameOfSlot(std::uint32_t s) const { return s / slots_per_frame; }
};

// Where the C4 slots of a config with kind frames sit; nullopt when its kinds have no sparse
// kind or a frame holds no envelope (Validate names the field).
std::optional<FrameShare> FrameShareOf(const AddressSpaceConfig& config);

// How the frames are shared (AddressSpace::KindBudgetOf): the C4 entries on device as the
// share holds them when new entries fill it first (the space reports its pools' count).
KindBudget BudgetOf(const KindFrames& frames, const KindEntries& entries);

using RunMovesFn = std::function<Status(std::span<const CopyDescriptor>)>;

// Withholds `need` free frames from C4 on `rank`, the first Take gives whose C4 slots hold no entry
// used in this round: their entries move out (a free device slot of another frame first,
// else host), copy first, publish after. kResourceExhausted when fewer such frames are free or
// the moved entries find no room, kIo when a copy fails; nothing changes on error.
Status WithholdFrames(const AddressSpaceConfig& config, AddressSpace::State& st, Rank rank, std::uint32_t need,
                      const RunMovesFn& run_moves);

// Gives the C4 slots of every free withheld frame back to the groups' pools.
void ReleaseFreeFrames(const AddressSpaceConfig& config, AddressSpace::State& st, Rank rank);

Status CheckFrameShare(const AddressSpaceConfig& config, const AddressSpace::State& st);

}  // namespace ula
