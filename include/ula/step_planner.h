// StepPlanner: the DP host step, one decode step of one layer group on one rank
// (docs/ARCHITECTURE.md "One decode step of one layer group"):
//
//   1. validate every selected address (live, owned by its run's request, on this rank)
//                                                                  -> error, nothing changed
//   2. dedup the union of all queries' selections
//   3. look up: device-resident = hit (touch in the current round); host-resident = miss
//   4. device slots for misses: free slots first, then victims from the residency policy
//      (never a slot used in this round); a victim swaps places with the missed entry
//      (host shadows on, sparse/host_shadows.h: a victim with a live host shadow is evicted
//      by the table alone; one without is copied to a host slot of its own, a free one or
//      the oldest shadow's, in a device -> host batch waited before its slot is filled;
//      only when the host holds nothing but entries does it swap; a fetched entry's host
//      slot stays behind as its shadow, except after a swap)
//   5. copy (backend batches), wait for the fence, and only then publish the new locations
//   6. write, for every selection in input order, the device slot attention reads
//
// If the step's distinct selections cannot all be on device at once (more than the free
// plus evictable slots: entries allocated or selected in this round are not evictable),
// the step fails with kResourceExhausted before touching anything; its message counts
// the entries used in this round and says to call AdvanceRound() after the round's
// attention.
//
// A failed transfer (kIo from the backend, ula/backend.h; FaultInjectingBackend injects
// them) fails the step with kIo naming the batch, after this documented state: the
// host->device copies into free slots and the swaps with victims are two batches, each
// waited on its own fence. A failed batch publishes nothing: its entries stay on host at
// their old slots with their bytes (a failed copy only wrote free device slots, which go
// back to the pool; a failed swap exchanged nothing, its victims stay on device). A batch
// that completed is published as on success (its bytes arrived). In the residency policy
// the step's hits and claimed victims count as used in this round. No entry is published
// before its bytes arrived; no entry's bytes are lost; every invariant holds.
// Host shadows on: the device -> host batch of victims without a shadow runs first; if it
// fails, those victims stay on device (their host slots go back, a reclaimed shadow stays
// reclaimed) and their misses stay on host; if it lands, the victims are published at
// their host slots. A victim evicted to its shadow is published before the copies (its
// bytes are already there); a failed copy into its slot frees that slot.
// Layout: steps 1-3 read one 16-byte record per (address, group) — location,
// owner tag, dedup stamp (src/core/address_records.h) — so a selection costs one cache
// line; the record of selection i + prefetch_distance is prefetched while i is processed.
// A hit's slot is written to out_slots in that same pass (a hit is never a victim), so only
// the selections of misses are looked up again after the publish.
//
// Threads (StepPlannerOptions::threads = T): steps 1-3 run on T threads, each owning the
// addresses of every T-th block of 4,096 addresses, so no two threads dedup or write the
// same record. Each thread scans the selections in order and keeps its hits and misses with
// their selection index; the lists are merged by that index, so hits, misses, claimed slots
// and the copy plan are exactly those of one thread, and an error names the same (first)
// selection as one thread would. The policy's Touch and the free-slot claims then run on
// the calling thread (PB-LRU's Touch splits its own pass, policy/pb_lru.h). Victims: with
// T > 1, PB-LRU as the pool's policy and at least parallel_claim_min_victims evictions in
// the step, they are claimed on the same T threads (PbLru::ClaimVictimsParallel: popcounts
// per word range, an exclusive prefix sum, each thread takes the ranks it owns) — exactly
// the victims, in the order, that one thread claims; otherwise on the calling thread. The
// output of the misses' selections runs on the T threads again.
// Two paths run that one step; one plan is pending per space, so either is refused
// (kFailedPrecondition) while a plan of the other is.
//   Step(StepInput)   the library path: the plan (steps 1-4 and the copy plan), the
//                     space's backend running its descriptors, and the completion that
//                     publishes each by its outcome; out_slots gets the device slots.
//   the engine path   for a decode loop that replays CUDA graphs (fixed shapes, no
//                     allocation per step), on a planner made by Create (below).
//
// The engine path. Per step and layer group the planner reads the indexer's selection as an int32 array
// [batch][q_len][top_k] of logical addresses (-1: padding) and writes, into arrays the
// caller owns and sizes once:
//   - indices[batch][q_len][top_k] int32: the sparse MLA kernels' index array (FlashMLA
//     sparse decode layout): the device slot each selection is read from, -1 where the
//     selection was -1. A slot is a row of the (rank, group) device pool: the entry of slot
//     s of layer l sits at  base(l) + s * row_bytes, in an engine-registered region and in
//     UlaCache's own pools alike (AddressSpace::DeviceLayerBytes): FlashMLA's
//     k_cache[layer].view(num_blocks, 64, 1, row_bytes), index = block * 64 + offset.
//   - the copy plan: CopyDescriptor[n] (source tier/rank/slot/byte offset, destination, bytes, the address
//     it brings in), as records or columns (ula/descriptor_sink.h: written as made), and a fence id.
//
// Two ways to execute a plan in that layout:
//   Step(rank, ...)   the library's backend runs the copies, waits, publishes, writes
//                     indices: the library path's plan and completion, in the kernels'
//                     format.
//   Plan()/Complete() the engine runs the descriptors on its own streams, then calls
//                     Complete(fence, status per descriptor). Only then are the new
//                     locations published. A descriptor whose status is not 0 publishes
//                     nothing: its entry stays where it was (on host), a victim it would
//                     have displaced stays on device, a free device slot it targeted is
//                     freed again. Complete reports how many failed; the engine finds them
//                     by index in its descriptor array (descriptor.addr names the entry)
//                     and either re-plans the same selection (the retry produces
//                     descriptors for the failed entries only) or masks them.
//
// Descriptor semantics (what an engine's copy kernel must do):
//   kCopy  copy `bytes` from (src_tier, src_rank, src_offset) to (dst_tier, dst_rank,
//          dst_offset). The destination is a free slot, or the slot of a victim whose
//          clean host shadow holds its bytes (host shadows, below): a failed copy may
//          leave garbage.
//   kSwap  exchange the two ranges (the displaced victim goes to the wanted entry's host
//          slot). A failed swap must leave both ranges as they were (swap through a
//          staging buffer and report failure before writing back).
// Coordinates (step_arrays.h): a descriptor moves num_layers rows of `bytes` = row_bytes,
// one per layer of the group; src_offset / dst_offset are slot * row_bytes, the same in
// every layer's region (layer l: region(l) + offset). So an engine that keeps one tensor
// per layer (vLLM's kv_caches, SGLang's per-layer buffers, FlashMLA's k_cache) runs them
// as they are, on UlaCache's pools and on registered regions alike; ExecuteOnEngineMemory
// is a CPU reference executor over registered regions.
//
// The order of a step, per scheduler iteration:
//   1. allocate: AddressSpace::Allocate the new token of every running row (prefill
//      chunks too) and look up its location per group, once (SGLang's out_cache_loc). A
//      new entry is on device and stays in that slot until AdvanceRound (address_space.h).
//   2. per layer group, after its indexer: Plan (indices + descriptors), the engine runs
//      the descriptors, then Complete (or Step, which does all three);
//   3. KV write: each layer writes the new tokens' rows at the location of step 1 (still
//      theirs: this round's entries are never evicted or moved, and a step finds them as
//      hits);
//   4. attention: FlashMLA reads the group's layers through the indices;
//   5. AdvanceRound() once the iteration's attention is done.
// The KV write may also run before step 2 (SGLang writes a layer's KV before its
// attention): the location does not change in between.
//
// FlashMLA's SM90 sparse decode reads the index rows in tiles of 64
// (csrc/sm90/decode/sparse_fp8/config.h: TOPK_BLOCK_SIZE = 64): size top_k, the index
// row, to a multiple of 64 (SGLang and vLLM use 2048), padding with -1.
// EngineStepConfig::top_k_multiple = 64 makes Plan refuse any other top_k.
//
// Between Plan and Complete one plan is pending per planner; its claimed device slots are
// not yet consistent with the tables (a claimed free slot has no owner):
//   REQUIRES: no Allocate, Free or other planner's step runs on the space before Complete
//   (Complete aborts via ULA_CHECK if an entry of the plan was freed). A second Plan or
//   Step on this planner is refused with kFailedPrecondition.
//
// Making a planner, and what each way refuses:
//   StepPlanner(space)      the library path only; refuses nothing. The engine path's calls
//                           (Plan, Step in the engine layout, ReserveRound) are refused
//                           with kFailedPrecondition: the planner has no engine config.
//   Create(space, config)   both paths. kInvalidArgument for a config that fails
//                           Validate; kFailedPrecondition for a space whose config has
//                           stable_new_entries off (the engine writes a new token's KV
//                           where Lookup said right after Allocate, so every new entry's
//                           write slot must stay put for its round). It is an
//                           AddressSpaceConfig field, fixed when the space is created;
//                           nothing here changes it.
//
// Host shadows (AddressSpaceConfig::host_shadows, src/space/host_shadows.h): a fetched
// entry's host slot stays behind as a clean copy. A victim whose shadow survives is
// published at its shadow by Complete, with no descriptor of its own: the miss that takes
// its slot is a plain kCopy, so an engine runs one copy where it ran a swap. The plan lists
// the copies into free slots, then those into shadowed victims' slots, then the swaps (the
// victims without a shadow). Complete moves every shadowed victim of the plan to its shadow
// whatever the statuses (its bytes are there; a failed copy may have overwritten its device
// row, whose slot then goes back to the pool). Entries are never rewritten in place by an
// engine (a new token's KV goes to a new entry, which has no shadow), so a shadow stays
// clean; AddressSpace::Write drops one as usual. On the comparison's workload the host link
// carries about 1.0 entries per miss with shadows, 2.0 without (docs/BENCHMARKS.md, "Host
// shadows").

// Allocation: Create sizes every scratch array for the largest step (config.max_*) and
// the largest address count the space can reach; Plan, Complete, ExecuteOnEngineMemory,
// and a Step without misses then allocate nothing (tests/step/engine_step_test.cc counts
// operator new), once the residency policy has seen its largest touch (PB-LRU keeps a
// high-water-mark scratch: warm up with one step of the largest shape, as a CUDA-graph
// capture does). A Step with misses allocates only the backend's CopyBatch vectors.
//
// A failed swap's victim stays on device and counts as used in this round (the policy
// has no "unclaim"); a retry of the same selection in the same round may therefore not
// find room: retry in the next round, as an engine retries a failed load next step.
//
// Engine-path errors leave the address space and the pending plan exactly as they were.
// Lifetime: the planner holds the space by reference (the space outlives it); out_slots
// name device slots whose bytes DeviceSlotData returns, valid as stated there.
// Thread-safety: as AddressSpace (one driver thread calls the planner; its own worker
// threads run inside a step only).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "ula/address_space.h"
#include "ula/descriptor_sink.h"
#include "ula/selection_run.h"
#include "ula/step_arrays.h"
#include "ula/step_stats.h"

namespace ula {


struct StepInput {
  Rank rank;
  GroupId group;
  // The selected addresses of every query of every request of the batch, concatenated in
  // selection order (e.g. request 0 query 0's top-k, then request 0 query 1's, ...).
  std::span<const LogicalAddr> selections;
  // Which request each selection belongs to (selection_run.h): runs of consecutive
  // selections, covering them exactly. The isolation check: a selection whose address is
  // not live for its run's request (freed, reused by another request, or another
  // request's) fails the step with kNotFound.
  std::span<const SelectionRun> runs;
};

struct StepPlannerOptions {
  static constexpr std::uint32_t kMaxThreads = 64;
  static constexpr std::uint32_t kMaxPrefetchDistance = 256;
  static constexpr std::uint32_t kDefaultParallelClaimMinVictims = 1u << 22;
  std::uint32_t threads = 1;             // [1, kMaxThreads]: threads of steps 1-3
  std::uint32_t prefetch_distance = 16;  // [0, kMaxPrefetchDistance]: selections ahead (0: none)
  // >= 1: with threads > 1 and PB-LRU, a step evicting at least this many entries claims its
  // victims on the T threads; fewer are claimed on the calling thread (no fork/join). The
  // result is the same either way. 2^22, above every demand measured: on the 2-core
  // development machine (loaded) the parallel claim never beat the serial one, at any T or
  // demand up to 2^20 victims (there 1.33x slower at T = 2 with passive waiting, 10x with
  // spinning workers; its two fork/joins alone cost 44-68 us passive, 16-20 ms spinning),
  // while the serial claim costs 1.7-2.3 ns per victim and a group step evicts at most about
  // 5,900 entries at the admission limits (~10 us, 0.1-0.2 % of the step):
  // docs/BENCHMARKS.md, "Victims claimed in parallel". Lower it on a machine with free cores
  // after measuring with `ula bench planner --claim-sweep`.
  std::uint32_t parallel_claim_min_victims = kDefaultParallelClaimMinVictims;
  // kInvalidArgument naming the first bad field.
  Status Validate() const;
};

// What the planner did besides its result, for benchmarks and tests (the result does not
// depend on T; these do). Counted over every Step that reached the victim claims.
struct StepPlannerCounters {
  std::uint64_t claims = 0;           // steps that claimed at least one victim
  std::uint64_t parallel_claims = 0;  // of which on the T threads (PbLru::ClaimVictimsParallel)
  std::uint64_t victims = 0;          // victims claimed
  std::uint64_t claim_ns = 0;         // wall time of the victim claims (steady clock)
};

struct StepShape {
  std::uint32_t batch = 0;
  std::uint32_t q_len = 1;  // 1 + draft tokens with speculative decoding
  std::uint32_t top_k = 0;
  std::uint64_t size() const { return std::uint64_t{batch} * q_len * top_k; }
};

// ReserveRound's bound on one request's selections in one group step. Its guaranteed
// bound is min(max_selections, tokens it will hold).
enum class ReserveMode : std::uint8_t {
  // The guaranteed bound: a round that keeps to its reservation has no Plan refused for
  // room.
  kGuaranteed,
  // max_selections times quantile reserve_quantile of the shares of their selections that
  // the planner's recent successful plans' requests selected distinct (distinct entries of
  // a request's rows over q_len x top_k, measured per request and group step, at most 8
  // requests a plan, over the last reserve_window of them, in 1/1024 steps rounded up),
  // never more than the bound; the
  // bound itself until ceil(1 / (1 - reserve_quantile)) samples are kept (1 for a quantile
  // of 1, at most the window). A round can then be refused a Plan for room
  // (kResourceExhausted, nothing changed): the engine drops a request from the round and
  // plans again (docs/INTEGRATION.md, "Reservation modes").
  kQuantile,
};

struct EngineStepConfig {
  std::uint32_t max_batch = 1;
  std::uint32_t max_q_len = 1;
  std::uint32_t max_top_k = 2048;
  // The most selection rows of one step (batch x q_len; flat token rows with per-request
  // q_len come as batch = tokens, q_len = 1); 0: max_batch x max_q_len. The scratch is sized
  // for max_rows x max_top_k selections, so a scheduler with a token budget sets max_rows to
  // the budget and max_q_len to its largest chunk (vLLM: 8,192 and 2,048 at top-k 2,048:
  // 2^24 selections, where max_batch x max_q_len x max_top_k would pass 2^31). Plan and Step
  // refuse a shape with more rows; ReserveRound caps a request at max_q_len x max_top_k.
  std::uint32_t max_rows = 0;
  // Plan and Step refuse a shape whose top_k is not a multiple of this (64 for FlashMLA's
  // SM90 sparse kernels, above); 1 accepts any.
  std::uint32_t top_k_multiple = 1;
  // What ReserveRound sets aside for a request's selections (ReserveMode, above).
  ReserveMode reserve = ReserveMode::kGuaranteed;
  // kQuantile: the quantile, in (0, 1], of the measured shares a request's reservation
  // covers, and how many of the latest samples (request x group step) are kept, >= 1.
  double reserve_quantile = 0.99;
  std::uint32_t reserve_window = 4096;
  std::uint64_t rows() const { return max_rows != 0 ? max_rows : std::uint64_t{max_batch} * max_q_len; }
  // kInvalidArgument naming the field: a zero maximum, top_k_multiple not dividing
  // max_top_k, max_rows above max_batch x max_q_len, more than 2^31 selections,
  // reserve_quantile outside (0, 1], reserve_window 0.
  Status Validate() const;
};

struct PlannedStep {
  std::uint64_t fence = 0;           // pass to Complete
  std::uint32_t num_descriptors = 0; // written to out_descriptors[0, n)
  StepStats stats;                   // as planned (bytes_moved if every descriptor succeeds)
};

struct CompleteReport {
  std::uint32_t published = 0;  // descriptors whose entries now read from device
  std::uint32_t failed = 0;     // descriptors with a non-zero status: nothing published
};

// One running request's share of a scheduler round (ReserveRound): the tokens Allocate will
// give it in the round (a prefill chunk, or 1 + drafts) and the most entries one group's
// step selects for it (its rows' q_len x top_k; fewer distinct when it holds fewer tokens).
// In a space with kinds new_tokens is a bound in C4 entries, except over frames
// (AddressSpaceConfig::kind_frame_bytes), where it is the round's tokens exactly as Allocate
// takes them: their C4 entries and their other kinds' frames are counted from them.
struct RoundDemand {
  RequestId request;
  std::uint32_t new_tokens = 0;
  std::uint32_t max_selections = 0;
};

struct RoundReservation {
  std::uint64_t device_needed = 0;  // the largest group's bound: new tokens + distinct selections
  std::uint64_t device_room = 0;    // that group's device slots not yet used in this round
};

// Engine-owned memory of one pool (tier, rank, group) in one allocation: num_layers regions
// of slots * layer_bytes bytes, layer l starting at base + l * layer_stride; slot s of layer
// l at base + l * layer_stride + s * layer_bytes. Layers allocated one by one (at any
// addresses) register through the layer_bases form of RegisterEngineMemory instead.
struct EngineRegion {
  std::uintptr_t base = 0;
  std::uint64_t layer_stride = 0;
  std::uint32_t layer_bytes = 0;
  std::uint32_t num_layers = 1;
  std::uint32_t slots = 0;  // rows per layer; at least the pool's capacity
};

class StepPlanner {
 public:
  // The library path only (the engine path's calls are refused, above).
  explicit StepPlanner(AddressSpace& space);
  // Both paths, the engine path's scratch sized for config; refusals above.
  static Result<std::unique_ptr<StepPlanner>> Create(AddressSpace& space, const EngineStepConfig& config);
  ~StepPlanner();  // a pending plan ends (its claims stay: the space's check reports them)
  StepPlanner(const StepPlanner&) = delete;
  StepPlanner& operator=(const StepPlanner&) = delete;

  // The library path: out_slots[i] = device slot holding input.selections[i] after the
  // step. After an error the contents of out_slots are unspecified (the space's state is as
  // documented above). kOutOfRange (rank, group), kInvalidArgument (out_slots.size() !=
  // selections.size(), runs that do not cover the selections, an address of another
  // rank), kNotFound (an address not live for its run's request), kResourceExhausted (no
  // room, or a new entry on host selected), kFailedPrecondition (a plan is pending on the
  // space): nothing changes. kIo (a failed transfer) with the state of the contract above.
  Result<StepStats> Step(const StepInput& input, std::span<SlotId> out_slots);

  // The most descriptors one plan can produce (size out_descriptors to it); 0 without an
  // engine config.
  std::uint32_t max_descriptors() const;

  // Admission that guarantees the round: the scheduler calls it once per round, before it
  // commits the round (before any Allocate of it), with every running request of `rank`
  // it means to schedule. Ok iff in every group the round's working set fits the device
  // slots this round has not used yet: sum over requests of new_tokens +
  // min(max_selections, tokens it will hold) <= capacity - used in this round, and the new
  // tokens fit device free + host free (Allocate's own bound). A round that keeps to its
  // reservation (at most new_tokens per request, one step per group whose rows select at
  // most max_selections entries of their request) has no Allocate and no Plan refused for
  // room (kResourceExhausted): the round's entries never outnumber the device. Shared
  // entries are counted once per request that selects them (a bound, not a tally).
  // Over frames (docs/ARCHITECTURE.md, "The space over frames") the round's Allocates also
  // take free frames for their resident kinds (window ring, C128, compressor states, index
  // keys): Ok iff they fit as Allocate's check counts them (KindEntries::CheckRound, each
  // request's blocks net of its own gives, in any order), and those frames' C4 slots join the
  // round's working set and its new entries (in C4 entries). One gap: an Allocate may still
  // be refused when the round's C4 entries already allocated or selected sit in every free
  // frame it could take (docs/ARCHITECTURE.md, "Not built yet").
  // With the config's reserve = kQuantile each request's selections are reserved as its
  // measured quantile of that bound instead (ReserveMode): fewer slots, and a Plan of the
  // round may then be refused for room.
  // kResourceExhausted (with the numbers; drop requests from the round and ask again),
  // kNotFound (unknown request), kInvalidArgument (another rank's request, listed twice,
  // max_selections past max_q_len x max_top_k), kOutOfRange (over frames, a request's tokens
  // past 2^32 - 1), kFailedPrecondition (a plan is pending).
  // Changes nothing: the reservation is the scheduler's commitment, not a hold.
  Result<RoundReservation> ReserveRound(Rank rank, std::span<const RoundDemand> demands) const;

  // The engine layout on the library path: plan, run on the backend, wait, publish, write
  // indices. requests[b] is the request of batch row b: every address of row b must be live for it
  // (the isolation check of selection_run.h: freed, reused or another request's -> kNotFound);
  // the request of a row of padding only is not looked up.
  // REQUIRES (checked): requests.size() == shape.batch; selections.size() == indices.size()
  // == shape.size(). Errors as Plan's; a step whose misses do not fit the device pool (more
  // than max_descriptors() of them, or more than its free and evictable slots) is
  // kResourceExhausted, names the descriptors it needed, and changes nothing.
  Result<StepStats> Step(Rank rank, GroupId group, const StepShape& shape, std::span<const RequestId> requests,
                         std::span<const std::int32_t> selections, std::span<std::int32_t> indices);

  // Engine path, part 1: claims device slots, writes indices (valid once Complete reports
  // no failure) and the descriptors: rows [0, num_descriptors) of out_descriptors, the
  // engine's CopyDescriptor records or its columns (ula/descriptor_sink.h: a std::vector or
  // span of records, or DescriptorColumns; each descriptor written as the plan makes it,
  // a column not asked for never written). kInvalidArgument (shape, sizes, an address < -1,
  // columns refused by DescriptorColumns::Rows), kOutOfRange, kNotFound (a request unknown
  // or freed, an address not live for its row's request: freed, reused by another request,
  // or another request's), kResourceExhausted (the misses do not fit the device pool, or
  // out_descriptors has fewer rows than this step's misses: the message names how many it
  // needed), kFailedPrecondition (a plan is pending). A refused call writes no descriptor.
  Result<PlannedStep> Plan(Rank rank, GroupId group, const StepShape& shape, std::span<const RequestId> requests,
                           std::span<const std::int32_t> selections, std::span<std::int32_t> indices,
                           DescriptorSink out_descriptors);
  // Engine path, part 2: status[i] == 0 publishes descriptor i; anything else publishes
  // nothing for it. kNotFound (not the pending fence), kInvalidArgument (status size).
  Result<CompleteReport> Complete(std::uint64_t fence, std::span<const std::uint8_t> status);
  bool has_pending() const;

  // The step's threads and prefetch (StepPlannerOptions): steps 1-3 and, with PB-LRU and
  // enough victims, the victim claims run on options.threads threads; the plan, the slots,
  // the indices and the errors are those of one thread. The engine path's no-allocation
  // promise is made (and tested) at one thread.
  // kInvalidArgument for invalid options (the planner keeps its old ones);
  // kFailedPrecondition while a plan is pending.
  Status SetOptions(const StepPlannerOptions& options);
  const StepPlannerOptions& options() const;
  const StepPlannerCounters& counters() const;

  // Registers engine-owned memory for (tier, rank, group): num_layers regions of
  // layer_bytes rows, e.g. the group's 2 layers of 656 bytes (a group of any layer count,
  // AddressSpaceConfig::group_layers). kInvalidArgument, with the numbers, when num_layers
  // is not the group's layers_of or layer_bytes its row() (the descriptors name rows of
  // row() bytes at slot * row() in each of the group's layers: a region split otherwise
  // would be copied at the wrong offsets), base is 0, slots is below the pool's capacity
  // (more are accepted: rows past the pool, e.g. padding to whole blocks, are never named),
  // or layers would overlap. Also makes Allocate's victims move in the registered memory
  // (AddressSpace::SetMoveExecutor), unless another executor is installed.
  // REQUIRES: the memory outlives the planner.
  Status RegisterEngineMemory(Tier tier, Rank rank, GroupId group, const EngineRegion& region);
  // The same with one base per layer: slot s of layer l at layer_bases[l] + s * layer_bytes,
  // each layer's tensor wherever it was allocated (vLLM's kv_caches and SGLang's per-layer
  // buffers are separate tensors, not equally spaced). The bases are copied. Refused as
  // above, plus a null base or two layers whose [base, base + slots * layer_bytes) overlap.
  Status RegisterEngineMemory(Tier tier, Rank rank, GroupId group, std::span<const std::uintptr_t> layer_bases,
                              std::uint32_t layer_bytes, std::uint32_t slots);
  // Runs descriptors over the registered regions (memcpy / swap per layer); status[i] = 0
  // on success, 1 when a side of descriptor i has no registered region (nothing copied).
  // REQUIRES: status.size() == descriptors.size().
  void ExecuteOnEngineMemory(std::span<const CopyDescriptor> descriptors, std::span<std::uint8_t> status) const;

 private:
  struct Impl;  // the step's classify, claim, copy plan and completion (step/step_planner_impl.h)
  // Plan: the engine layout's checks, the classify and claim, the indices; the descriptors
  // into out_descriptors (null: only the planner's own plan, max_descriptors() rows, for
  // Step); refuses a step of more misses than it has rows.
  Result<PlannedStep> Prepare(Rank rank, GroupId group, const StepShape& shape, std::span<const RequestId> requests,
                              std::span<const std::int32_t> selections, std::span<std::int32_t> indices,
                              const DescriptorSink* out_descriptors);
  StepPlanner(AddressSpace& space, std::unique_ptr<Impl> impl);

  AddressSpace& space_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ula
