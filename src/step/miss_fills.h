// MissFills: how one step fills the device slots of its misses on one rank (a DP rank's pools,
// or a TP rank's shard in its home phase), and the publish of what arrived (docs/ARCHITECTURE.md,
// "One decode step of one layer group", step 5). The one copy plan of the host steps
// (StepPlanner::Step, TpStepPlanner::Step: decide, run on the backend, publish) and of the
// engine paths (StepPlanner::Plan, TpStepPlanner: Plan decides and hands the descriptors
// out, the engine or the library runs them, Complete publishes), so that every form moves and
// publishes alike, host shadows included.
//
// The plan, after the step claimed a device slot per miss (targets[i] for missed[i]: the first
// n_free free slots, the rest victims the policy marked used in this round):
//   - without host shadows every victim swaps with its miss (kSwap);
//   - with them (src/space/host_shadows.h, ShadowFill) the victims' shadows leave the list
//     first (kToShadow: none is then reclaimed for another victim), then each other victim,
//     in miss order, gets a host slot of its own (kEvict: a free one, else the oldest shadow
//     reclaimed) or, when the host holds nothing but entries, swaps.
// Descriptors, in plan order: the fills by copy (kFree, kToShadow: CopyOp::kCopy; kEvict:
// CopyOp::kEvict) in miss order, then the swaps. So the shadows are added in miss order,
// whichever form runs the plan.
//
// Pending state (between Decide and Publish; the space must not change in between): for
// descriptor j, the wanted entry is on host at src_slot; a kFree slot is allocated, owned by
// no address, untracked by the policy; a victim's slot (every other fill) is still owned by
// its victim, tracked as used in this round; a kToShadow or kEvict victim's host slot
// (victim_host) is allocated, located by no address and in no shadow list.
//
// Publish per descriptor status (step_arrays.h): a shadowed victim goes to its shadow whatever
// the status (its bytes are there; a failed copy may have left garbage in its slot); an
// evicted one to its host slot when its row landed there (kDescriptorDone or kEvictLanded),
// else it stays and that host slot goes back. A fill that arrived publishes its entry on
// device (with shadows, its host slot stays behind as its shadow, except after a swap, whose
// host slot now holds the victim); a failed fill's emptied slot goes back to the pool; a
// failed swap or eviction changes nothing.
//
// The location record is the space's: DP's table (AddressRecords) or a TP shard's home table
// (HomeRecords, space/tp_state.h), so that one plan and one publish serve both modes
// (docs/ARCHITECTURE.md, "One decode step of one layer group", step 5).
//
// Thread-safety: none; the space's driver thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "space/address_space_state.h"
#include "space/host_shadows.h"
#include "ula/backend.h"
#include "ula/descriptor_sink.h"
#include "ula/error.h"
#include "ula/step_arrays.h"
#include "ula/step_stats.h"

namespace ula {

class MissFills {
 public:
  // Sizes the scratch for up to max_misses misses (no allocation in Decide / Describe then).
  void Reserve(std::size_t max_misses);

  // Decides each miss's fill. REQUIRES: targets claimed as above, targets.size() = misses.
  void Decide(GroupPools& gp, std::span<const SlotId> targets, std::size_t n_free);
  // Writes the plan's descriptors (descriptors()) and, when out is not null, each into out as
  // it is made (the engine's records or columns, ula/descriptor_sink.h: descriptor j at row
  // j). REQUIRES: after Decide; missed[i] on host; out, if any, takes size() rows.
  // Records: AddressRecords or HomeRecords (above).
  template <class Records>
  void Describe(const Records& table, const GroupPools& gp, std::uint32_t row_bytes, Rank rank, GroupId group,
                std::span<const LogicalAddr> missed, std::span<const SlotId> targets,
                const DescriptorSink* out = nullptr);

  std::size_t size() const { return num_; }
  std::size_t num_free() const { return counts_[0]; }
  std::size_t num_to_shadow() const { return counts_[1]; }
  std::size_t num_evict() const { return counts_[2]; }
  std::size_t num_swap() const { return counts_[3]; }
  std::span<const CopyDescriptor> descriptors() const { return std::span(descs_).first(num_); }
  // The plan's counters: into_free, evictions, shadow_evictions, evict_copies, and the bytes
  // over the host link if every descriptor succeeds (a fetch per miss, a victim's row per
  // eviction and per swap).
  void AddPlannedStats(std::uint64_t entry_bytes, StepStats& stats) const;

  // The library runs the plan on the backend in the host step's batches: the evictions'
  // device -> host batch first, waited on its own fence; then CopyPublish's copies (the
  // evictions' fills only when their batch landed) and swaps. status[j] gets each
  // descriptor's outcome for Publish. kIo "rank R group G: F of N copies not published: <the
  // failed batches>" when any failed. Allocates only the backend's batches. REQUIRES:
  // status.size() == size().
  Status Run(Backend& backend, const GroupPools& gp, std::uint32_t row_bytes, Rank rank, GroupId group,
             std::span<std::uint8_t> status);

  // Publishes by status (above) and ends the plan. Returns the number of descriptors published.
  // REQUIRES: status.size() == size(); nothing of the plan was freed (checked).
  template <class Records>
  std::size_t Publish(Records& table, GroupPools& gp, Rank rank, std::span<const std::uint8_t> status);

 private:
  std::vector<ShadowFill> miss_fill_, fill_;     // per miss (Decide), per descriptor (Describe)
  std::vector<SlotId> miss_host_, victim_host_;  // kToShadow / kEvict: the victim's host slot
  std::vector<CopyDescriptor> descs_;            // the plan
  std::vector<std::uint32_t> move_;              // Run: descriptor j's move in its CopyPublish
  std::size_t num_ = 0;
  std::size_t counts_[4] = {0, 0, 0, 0};         // kFree, kToShadow, kEvict, kSwap
};

}  // namespace ula
