// DeviceStep: one (rank, group)'s DP step as data-parallel kernels on the engine's stream
//. It reads a StepArrays (ula/step_arrays.h) of device pointers and writes the
// device indices, the copy descriptors and the StepRecord — StepPlanner's Plan /
// Complete (ula/step_planner.h), bit for bit, with no host in the loop:
//   - no host synchronisation: every count (hits, misses, free slots taken, victims) stays in
//     device memory; each kernel reads it there and runs over a fixed index space (the
//     selections, the descriptor rows, the bitmaps' summary words);
//   - no allocation after Create: the state and every scratch array are sized once for the
//     largest shape (DeviceStepConfig), the scans' per-block partials come from an arena of
//     Create's;
//   - fixed shapes: for the same StepArrays (pointers and shape) the launches are the same, so
//     Plan, the engine's copies and Complete can be captured in one CUDA graph and replayed.
//
// The state lives in the step's own memory (device memory for the CUDA form): the group's
// location records and owner tags, the request table (tags and adopted lists, indexed by
// request id: StepArrays::requests holds request ids below num_requests), the device and host
// pools' free bitmaps, the device pool's PB-LRU as flat bitmaps with a summary level
// (kernels/step_kernels.h, the layout of policy kernel_pb_lru) and each device slot's
// address. Create copies it from an AddressSpace whose policy is kernel_pb_lru and whose
// modes are the device step's (stable_new_entries on, host_shadows off; refused otherwise
// at Create, src/step/engine_modes.h); from then on
// the device step's state is the authoritative one for that (rank, group) (ReadState copies
// it back for inspection).
//
// The space between rounds: StoreInto and Reload. Allocate, Free, ShareInto, Retain and
// Release are host operations of the space (they are not device kernels yet), and the space
// does not see what the device step moved. So an engine that changes the space between
// steps brackets the change (a space in device placement mode needs no bracket: see
// "Addresses on the host, slots on the device" below):
//   step->StoreInto(space, stream);   // syncs; the step's locations, pools and PB-LRU -> space
//   space.AdvanceRound(); space.Allocate(...); space.Free(...);   // host bookkeeping
//   step->Reload(space, stream);      // the space's state -> the step's own buffers
// StoreInto refuses (kFailedPrecondition, nothing changes) when the space changed since the
// step loaded it (a host step, an Allocate, an AdvanceRound: the two histories cannot be
// merged): the step keeps a digest of what it loaded and compares. Reload refuses
// (kFailedPrecondition) while the step holds moves not yet stored (any Plan, Claim, Complete
// or AdvanceRound since its last load or store), so no device move is ever dropped. Reload
// writes into the buffers of Create and keeps every pointer and launch shape: the state's
// arrays are sized once for DeviceStepConfig::max_addresses, max_requests and max_adopted
// (padding: addresses that are not live, request ids that name no request), so a graph
// captured before a Reload replays after it. A space that outgrew them is refused
// (kResourceExhausted naming the field; re-create the step with larger maxima). Call
// AdvanceRound either on the step or on the space between StoreInto and Reload, never both
// for the same round.
//
// Addresses on the host, slots on the device (AddressSpaceConfig::device_placement): the
// space's Allocate hands out addresses only and Free / Truncate release them, recording a
// PlacementJournal; the engine applies it to each (rank, group)'s step with Place, so no
// bracket is needed and the loop has no host synchronisation:
//   space.Free(...); space.AddRequest(...); space.Allocate(...);   // addresses, tags (host)
//   journal = space.TakePlacement();            // copied to device arrays (pinned, async)
//   per group: step->Place(place_arrays, stream); copy_kernel(evictions, status);
//              step->CompletePlace(status, stream); write the new tokens' KV at locations;
//              step->Plan(...); copies; step->Complete(...); attention(...);
//   per group, once per iteration: step->AdvanceRound(stream);
// Place applies the journal's retired and new requests' tags, then its releases (a slot
// back to its free bitmap and out of PB-LRU), then its seats by Allocate's rule for stable
// new entries: the lowest free device slots in seat order, then PB-LRU victims not used this
// round (ClaimVictims' order), each moved to the lowest free host slot by an eviction the
// engine runs, then the lowest free host slots, new on host for the round (no step of the
// round moves them). An engine that frees before it allocates in an iteration gets the
// slots the host's Allocate would give. Copy first, publish after: CompletePlace publishes
// an eviction only where its copy arrived. StoreInto and Reload keep working for
// checkpoints: in this mode StoreInto checks that the device's owner and request tags are
// the space's (every journal applied) instead of comparing the space with what was loaded.
//
// Phases of Plan (kernels in src/kernels/step_kernels.inl, each with its arrays and atomics;
// Check is 1-3 and Claim 4-6, each one cooperative launch whose grid barriers stand between
// the kernels below, and Plan both in one launch):
//   1. classify [rows * top_k]: StepPlanner's checks in its order (value, live, the
//      row's request, held, rank); each valid address's first selection by an atomic minimum;
//   2. one exclusive scan of each selection's tally (first-occurrence hit and miss, newly used
//      hit, selection, first bad, flags), then scatter (misses in selection order, hits marked);
//   3. decide (thread 0 of the scatter, from the scan's total): the refusal (first bad
//      selection; a miss that this round's Allocate placed on host, whose KV is written at
//      that host slot this round; no room:
//      misses > free + evictable - hits new to this round; fewer descriptor rows than misses:
//      both kResourceExhausted, as StepPlanner's engine path), the split;
//   4. one summary-level scan over the free slots, then PB-LRU's victims (cold, oldest to
//      newest, lowest slot first, never the current bucket, not this step's hits), and the
//      take: the hits touched, the lowest free slots out of the free bitmap, the victims touched;
//   5. descriptors [max_descriptors], copies into free slots first, then swaps, with
//   6. indices (hits: their slot, misses: their target, pads -1); the StepRecord last, its
//      `done` = the step's sequence number (>= 1) after a system-scope fence.
// A refused step writes only the StepRecord (error = 1 + the ula::ErrorCode that
// StepPlanner::Plan returns for the same inputs) and changes no state. Complete follows
// every Plan, refused or not (a refused plan's Complete publishes nothing), so that one graph
// holds both.
//
// Copies and publish. The engine runs descriptors [0, StepRecord::num_descriptors) on the same
// stream after Plan (or on a copy stream that the step's stream then waits on with an
// event), and its copy kernel writes status[i] (uint8, device memory, [max_descriptors]) =
// 0 for each descriptor whose bytes arrived, non-zero otherwise. Complete(status) enqueues the
// publish kernel, which reads those statuses: stream order puts it after the copies, so a
// location changes only after its bytes are there. A failed copy publishes nothing and loses
// nothing: its entry stays on host, a free slot it targeted is free again, a failed swap's
// victim stays on device (counted as used this round, as in StepPlanner's engine path).
//
// Decode loop (docs/INTEGRATION.md): per group, after its indexer on `stream`:
//   step->Plan(arrays, stream); copy_kernel<<<..., stream>>>(descriptors, status, ...);
//   step->Complete(status, stream); attention(indices, stream);
// and once per scheduler iteration, after the last group's attention, AdvanceRound(stream).
//
// The OpenMP form (config.cuda = false) runs the same kernels on the host, on host memory,
// with `stream` ignored: it is what `make test` checks against StepPlanner's engine path.
//
// Errors are values: every call returns a Status (no exception crosses this API; the CUDA
// form catches thrust's and CCCL's at its entry points, and checks every CUDA call). Besides
// each call's own refusals, the CUDA form can return:
//   - kResourceExhausted: the scans' per-block partials of the largest grid the device holds
//     resident do not fit the arena (sized at Create for them, so this is a sizing bug, or
//     another device than Create's is current): refused before anything is
//     enqueued, nothing changes, no StepRecord is written (a refused Claim uses up its Check);
//   - kIo (a CUDA call failed or a launch threw; the message has CUDA's) or kResourceExhausted
//     (device memory) after work was enqueued: the device state is then unknown, so the step
//     refuses every later call with kFailedPrecondition naming that first error (nothing it
//     moved reaches the space: StoreInto is refused too). Re-create it from the space.
//
// TP attention at home (Create from a TpAddressSpace): one device step per (rank, group)
// shard, each in its rank's process, on its rank's stream, planning its own shard only —
// TpStepPlanner's Plan / Complete (ula/tp_step_planner.h, kAtHome) cut by rank. The
// kernels are the DP step's with the home table as the records (address a at a / P), the
// directory (owner tags by address, the request table) replicated in each rank's copy. A
// selection homed on another rank is checked against the directory (live, held by its
// row's request) and gets index -1: its home rank's partial covers it. A step must be
// refused on every rank or none (a rank that moved would diverge from the others' plans), so
// TP splits Plan in two around the engine's agreement:
//   step->Check(arrays, stream);                       // classify, decide: writes verdict()
//   ncclAllReduce(step->verdict(), agreed, 1, ncclUint32, ncclMax, comm, stream);
//   step->Claim(agreed, stream);                       // claims, descriptors, indices, record
//   copy_kernel<<<..., stream>>>(descriptors, status); step->Complete(status, stream);
// all enqueued, no host synchronisation, so the sequence (the all-reduce included) captures
// in one CUDA graph as the DP step does. verdict() is 0 or 1 + the ErrorCode of this rank's
// refusal (a value < -1 anywhere: kInvalidArgument; the lowest invalid selection: kNotFound;
// a home miss that this round's Allocate placed on host, more home misses than descriptor
// rows, or than free + evictable device slots: kResourceExhausted); a rank whose own verdict is 0 but whose agreed value is not refuses
// with kFailedPrecondition. Either way the StepRecord alone is written and nothing changes.
// TpStepPlanner, every rank in one process, returns the first refusing rank's error.
// StepRecord in TP: selections counts every non-padding selection; distinct, hits, misses,
// evictions count this rank's home entries (the ranks' distinct add up to
// StepStats::distinct); a descriptor moves one whole entry (num_layers 1, bytes =
// entry_bytes, offsets slot * entry_bytes), src_rank == dst_rank == this rank.
// Not covered in TP: the local buffer (kLocalBuffer, refused at Create).
//
// Thread-safety: one driver thread per DeviceStep.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "ula/address_space.h"
#include "ula/error.h"
#include "ula/ids.h"
#include "ula/step_arrays.h"
#include "ula/tp_address_space.h"

namespace ula {

struct DeviceStepConfig {
  bool cuda = false;              // the CUDA form (a build with ULA_WITH_CUDA and a device)
  std::uint32_t threads = 1;      // the OpenMP form's team, [1, 64]
  std::uint32_t max_rows = 1;     // StepArrays::num_rows at most
  std::uint32_t max_batch = 1;    // StepArrays::batch at most
  std::uint32_t max_top_k = 2048; // StepArrays::top_k at most
  // The state's extent that Reload can take without re-creating the step (see "The space
  // between rounds"); 0 = the space's at Create. Addresses (the space's address extent,
  // next page * page_tokens), request ids (the highest id + 1) and adopted addresses over
  // every request.
  std::uint32_t max_addresses = 0;
  std::uint32_t max_requests = 0;
  std::uint32_t max_adopted = 0;
  // Device placement (see "Addresses on the host, slots on the device"): the most seated
  // addresses, released addresses and request changes (new or retired, each list) one Place
  // takes. Size PlacementArrays::locations, evictions and CompletePlace's status to
  // max_place_seats. 0: Place takes no such entries.
  std::uint32_t max_place_seats = 0;
  std::uint32_t max_place_releases = 0;
  std::uint32_t max_place_requests = 0;
  // kInvalidArgument naming the first bad field.
  Status Validate() const;
};

// The device step's state, copied back (host memory): for tests and inspection.
struct DeviceStepState {
  std::vector<std::uint64_t> records;        // [table] locations (Location bits)
  std::vector<std::uint32_t> device_owner;   // [device capacity]
  std::vector<std::uint64_t> device_free;    // [words] free device slots
  std::vector<std::uint64_t> host_free;      // [words] free host slots
  std::vector<std::uint32_t> stamps;         // [device capacity] PB-LRU round of last use
  std::vector<std::uint64_t> bucket_words;   // [R + 2][words]
  std::uint32_t round = 0, cur = 0;
  std::uint64_t tracked = 0;
  std::uint32_t published = 0, failed = 0;   // of the last Complete
  std::uint32_t error = 0;                   // *verdict(): after Check this rank's, after Claim the step's
  std::uint32_t place_published = 0, place_failed = 0;  // evictions of the last CompletePlace
  std::vector<std::uint32_t> owner;          // [max_addresses] owner tags (device placement changes them)
  std::vector<std::uint32_t> request_tags;   // [max_requests]
};

// Kernel launches and host synchronisations of one phase (see DeviceStepCounters).
struct DeviceStepCounts {
  std::uint64_t launches = 0;
  std::uint64_t syncs = 0;   // stream synchronisations, blocking and pageable copies
  friend bool operator==(const DeviceStepCounts&, const DeviceStepCounts&) = default;
};
// What the step has enqueued since Create, by phase, cumulative: take a snapshot before a
// step and subtract (Since). Counted where every launch goes through (the kernels' one
// launch helper, src/kernels/step_kernels.inl: a cooperative launch, whatever its grid
// barriers, or a thrust for_each is one kernel) and where every synchronisation goes through
// (the step's Sync and Copy). Both forms count the CUDA form's kernels. Plan is one launch for
// Check and Claim, counted into check. docs/ARCHITECTURE.md ("The device step") gives the
// count of one step: one launch per phase, DP's plan one for two.
struct DeviceStepCounters {
  DeviceStepCounts check, claim, complete, advance_round;
  DeviceStepCounts state;    // Create, Reload, StoreInto, ReadState: outside a step
  DeviceStepCounts place;    // device placement: Place and CompletePlace (enqueued only: no syncs)
  // The four step phases together (state and place excluded: add place for an iteration
  // of device placement).
  DeviceStepCounts Step() const;
  // This minus an earlier snapshot of the same step.
  DeviceStepCounters Since(const DeviceStepCounters& earlier) const;
  friend bool operator==(const DeviceStepCounters&, const DeviceStepCounters&) = default;
};

class DeviceStep {
 public:
  // Sizes everything for config's largest shape and copies (rank, group)'s state from
  // `space`. kInvalidArgument (config), kOutOfRange (rank, group), kFailedPrecondition (the
  // group's policy is not kernel_pb_lru; config.cuda in a build without CUDA, with no
  // device, or with a CUDA driver older than the build's runtime, each named), kResourceExhausted (device memory), kIo (another CUDA error).
  static Result<std::unique_ptr<DeviceStep>> Create(const AddressSpace& space, Rank rank, GroupId group,
                                                    const DeviceStepConfig& config);
  // TP attention at home: rank's shard of group. The same errors, plus kFailedPrecondition
  // for TpAttention::kLocalBuffer or a rank this space does not host.
  static Result<std::unique_ptr<DeviceStep>> Create(const TpAddressSpace& space, Rank rank, GroupId group,
                                                    const DeviceStepConfig& config);
  ~DeviceStep();
  DeviceStep(const DeviceStep&) = delete;
  DeviceStep& operator=(const DeviceStep&) = delete;

  // The most descriptors one step can produce: size StepArrays::descriptors and the status
  // array to it.
  std::uint32_t max_descriptors() const;

  // Enqueues the plan on `stream` (a cudaStream_t for the CUDA form; ignored by the OpenMP
  // form). Host checks only (no device read): kInvalidArgument (a shape past the config, a
  // stride below top_k, a null array, num_rows != batch * q_len without row_batch),
  // kFailedPrecondition (a plan is pending). Refusals that depend on the data (the first bad
  // selection, no room, too few descriptor rows) come back in StepRecord::error.
  // TP with more than one rank: kFailedPrecondition (use Check and Claim).
  Status Plan(const StepArrays& arrays, void* stream);
  // Plan's first half: enqueues the checks and writes verdict(); changes no state. The same
  // host checks as Plan. REQUIRES: the arrays' contents stay as they are until Claim.
  Status Check(const StepArrays& arrays, void* stream);
  // This rank's verdict after Check (device memory, one uint32): 0, or 1 + the ErrorCode.
  // Read it (reduce it) before Claim: Claim overwrites it with the step's agreed error.
  const std::uint32_t* verdict() const;
  // Plan's second half: `agreed` (device memory, one uint32: the MAX of every rank's verdict,
  // or verdict() itself for one rank) decides; claims, writes the descriptors, indices and
  // the StepRecord. Complete follows as after Plan. kFailedPrecondition: no Check is pending.
  Status Claim(const std::uint32_t* agreed, void* stream);
  // Enqueues the publish of the pending plan: status[i] == 0 publishes descriptor i.
  // `status` is device memory [max_descriptors]. kFailedPrecondition: no plan is pending.
  Status Complete(const std::uint8_t* status, void* stream);
  // Enqueues the end of the scheduler iteration (PB-LRU's next round).
  // kFailedPrecondition: a plan or a place is pending.
  Status AdvanceRound(void* stream);

  // Device placement (a space with AddressSpaceConfig::device_placement; see "Addresses on
  // the host, slots on the device"): enqueues the kernels that apply one (rank, group)'s
  // share of a PlacementJournal: tags, releases, then the seats by Allocate's rule for
  // stable new entries, each seat's location in arrays.locations, the evictions'
  // descriptors in arrays.evictions and their count in *arrays.num_evictions. Nothing is
  // read back. Host checks only, nothing enqueued on a refusal: kFailedPrecondition (not
  // such a step; a plan, check or place pending), kInvalidArgument (a count or capacity past
  // its DeviceStepConfig maximum, a null array, a zero tag, `counts` without `error`),
  // kResourceExhausted (OpenMP form, which reads the host arrays: an address past
  // max_addresses or a request id past max_requests; the CUDA form's kernels skip those).
  // With arrays.counts the counts are read on the device when the kernel runs (one launch,
  // the same arguments every iteration: capturable once), and a count past its capacity is
  // the device's refusal: nothing changes, *arrays.error = 1 + kInvalidArgument (the
  // journal is then not applied: StoreInto refuses until it is). REQUIRES: the arrays stay
  // as they are until CompletePlace.
  Status Place(const PlacementArrays& arrays, void* stream);
  // Enqueues the evictions' publish after the engine ran them: status[k] == 0 (device
  // memory, [max_place_seats]) publishes eviction k (victim -> its host slot, the new
  // address -> the victim's device slot); a failed copy loses nothing (the victim stays,
  // the new address takes the reserved host slot, new on host this round). Follows every
  // Place. kFailedPrecondition: no place is pending.
  Status CompletePlace(const std::uint8_t* status, void* stream);

  // Synchronises `stream` and writes the step's state (locations, device owners, both pools'
  // free sets, PB-LRU; device placement: the round's new entries on host) into `space`, the
  // one it was created from, for its (rank, group):
  // the space then equals the device state (Create refuses a space with host shadows, so
  // there are none to reconcile). kInvalidArgument (another space),
  // kFailedPrecondition (a plan or check is pending; the space changed since the step
  // loaded or stored it; device placement: the device's owner tags or request tags differ
  // from the space's directory, i.e. a journal was not applied): nothing changes then.
  // After it the step is clean: Reload may follow.
  Status StoreInto(AddressSpace& space, void* stream);
  Status StoreInto(TpAddressSpace& space, void* stream);
  // Loads `space`'s state for the step's (rank, group) into the step's existing buffers (no
  // allocation, the same pointers and launch shapes). kInvalidArgument (another space),
  // kFailedPrecondition (a plan or check is pending; moves since the last load or store
  // were not stored: StoreInto first; a condition Create refuses), kResourceExhausted (the
  // space outgrew max_addresses, max_requests or max_adopted): nothing changes then.
  Status Reload(const AddressSpace& space, void* stream);
  Status Reload(const TpAddressSpace& space, void* stream);

  // Synchronises `stream` and copies the state back (records: the loaded address extent).
  // The errors of "Errors are values" above.
  Result<DeviceStepState> ReadState(void* stream) const;
  // Bytes the cooperative launches' scan partials have taken from the arena at most, and the
  // calls refused because they would not fit (CUDA form; the OpenMP form's partials live on
  // the launching thread's stack: both stay 0 there).
  std::uint64_t arena_high_water() const;
  std::uint64_t arena_overflows() const;
  // Launches and host synchronisations since Create, by phase (cumulative).
  DeviceStepCounters counters() const;

  struct Impl;  // src/step/device_step.cc

 private:
  struct ShardSource;  // what Create copies from either space (src/step/device_step.cc)
  static Result<std::unique_ptr<DeviceStep>> Build(const ShardSource& source, const DeviceStepConfig& config);
  // What Create, StoreInto and Reload read of one shard; Create's refusals.
  static Status Read(const AddressSpace& space, Rank rank, GroupId group, ShardSource& out);
  static Status Read(const TpAddressSpace& space, Rank rank, GroupId group, ShardSource& out);
  // StoreInto's and Reload's checks: no plan pending, the same space; `what` names the call.
  Status CheckSameSpace(const void* space, const char* what) const;
  // StoreInto's second half for either space: the device state, read back, and the check
  // that `now` (the space read again) is what the step loaded.
  struct DeviceShard;
  Status ReadBack(const ShardSource& now, DeviceShard& out, void* stream) const;
  Status ReadBackPlaced(const ShardSource& now, DeviceShard& out, void* stream) const;
  // StoreInto for either space: `read` reads the shard as Create does, `write` writes the
  // device state into it (after every check passed: it cannot fail).
  Status Store(const void* space, const std::function<Status(ShardSource&)>& read,
               const std::function<void(DeviceShard&)>& write, void* stream);
  // Writes `src` into the buffers (Build, Reload) and remembers its digest.
  Status Load(const ShardSource& src, void* stream);
  static std::uint64_t Digest(const ShardSource& src);
  Status Reload(const ShardSource& src, void* stream);
  // kFailedPrecondition while moves since the last load or store are not stored.
  Status CheckStored(const char* what) const;
  explicit DeviceStep(std::unique_ptr<Impl> impl);
  // Plan's and Check's host checks; on success the arrays are the step's io.
  Status Accept(const StepArrays& arrays, const char* what);
  std::unique_ptr<Impl> impl_;
};

}  // namespace ula
