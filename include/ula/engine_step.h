// EngineStepPlanner: the engine-facing step API of a DP AddressSpace, for a decode loop
// that replays CUDA graphs (fixed shapes, no allocation per step).
//
// Per step and layer group the planner reads the indexer's selection as an int32 array
// [batch][q_len][top_k] of logical addresses (-1: padding) and writes, into arrays the
// caller owns and sizes once:
//   - indices[batch][q_len][top_k] int32: the sparse MLA kernels' index array (FlashMLA
//     sparse decode layout): the device slot each selection is read from, -1 where the
//     selection was -1. A slot is a row of the (rank, group) device pool: the entry of slot
//     s of layer l sits at  base(l) + s * row_bytes, in an engine-registered region and in
//     UlaCache's own pools alike (AddressSpace::DeviceLayerBytes): FlashMLA's
//     k_cache[layer].view(num_blocks, 64, 1, row_bytes), index = block * 64 + offset.
//   - the copy plan: CopyDescriptor[n] (source tier/rank/slot/byte offset, destination,
//     bytes, the logical address it brings in) and a fence id.
//
// Two ways to execute a plan:
//   Step()            the library's backend runs the copies, waits, publishes, writes
//                     indices: the same plan and completion as StepPlanner::Step (one
//                     DP host step, src/step/dp_step.h), in the kernels' format.
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
// Modes: Create refuses a space whose config has stable_new_entries off
// (kFailedPrecondition: the engine writes a new token's KV where Lookup said right after
// Allocate, so every new entry's write slot must stay put for its round). It is an
// AddressSpaceConfig field, fixed when the space is created; nothing here changes it.
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
// Errors leave the address space and the pending plan exactly as they were.
// Thread-safety: as AddressSpace (one driver thread per space).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "ula/address_space.h"
#include "ula/step_arrays.h"
#include "ula/step_planner.h"

namespace ula {

struct StepShape {
  std::uint32_t batch = 0;
  std::uint32_t q_len = 1;  // 1 + draft tokens with speculative decoding
  std::uint32_t top_k = 0;
  std::uint64_t size() const { return std::uint64_t{batch} * q_len * top_k; }
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
  std::uint64_t rows() const { return max_rows != 0 ? max_rows : std::uint64_t{max_batch} * max_q_len; }
  // kInvalidArgument naming the field: a zero maximum, top_k_multiple not dividing
  // max_top_k, max_rows above max_batch x max_q_len, more than 2^31 selections.
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

class EngineStepPlanner {
 public:
  static Result<std::unique_ptr<EngineStepPlanner>> Create(AddressSpace& space, const EngineStepConfig& config);
  ~EngineStepPlanner();
  EngineStepPlanner(const EngineStepPlanner&) = delete;
  EngineStepPlanner& operator=(const EngineStepPlanner&) = delete;

  // The most descriptors one plan can produce (size out_descriptors to it).
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
  // kResourceExhausted (with the numbers; drop requests from the round and ask again),
  // kNotFound (unknown request), kInvalidArgument (another rank's request, listed twice,
  // max_selections past max_q_len x max_top_k), kFailedPrecondition (a plan is pending).
  // Changes nothing: the reservation is the scheduler's commitment, not a hold.
  Result<RoundReservation> ReserveRound(Rank rank, std::span<const RoundDemand> demands) const;

  // Library path: plan, run on the backend, wait, publish, write indices.
  // requests[b] is the request of batch row b: every address of row b must be live for it
  // (the isolation check of selection_run.h: freed, reused or another request's -> kNotFound);
  // the request of a row of padding only is not looked up.
  // REQUIRES (checked): requests.size() == shape.batch; selections.size() == indices.size()
  // == shape.size(). Errors as Plan's; a step whose misses do not fit the device pool (more
  // than max_descriptors() of them, or more than its free and evictable slots) is
  // kResourceExhausted, names the descriptors it needed, and changes nothing.
  Result<StepStats> Step(Rank rank, GroupId group, const StepShape& shape, std::span<const RequestId> requests,
                         std::span<const std::int32_t> selections, std::span<std::int32_t> indices);

  // Engine path, part 1: claims device slots, writes indices (valid once Complete reports
  // no failure) and the descriptors. kInvalidArgument (shape, sizes, an address < -1),
  // kOutOfRange, kNotFound (a request unknown or freed, an address not live for its row's
  // request: freed, reused by another request, or another request's), kResourceExhausted
  // (the misses do not fit the device pool, or out_descriptors has fewer rows than this
  // step's misses: the message names how many it needed), kFailedPrecondition (a plan is
  // pending).
  Result<PlannedStep> Plan(Rank rank, GroupId group, const StepShape& shape, std::span<const RequestId> requests,
                           std::span<const std::int32_t> selections, std::span<std::int32_t> indices,
                           std::span<CopyDescriptor> out_descriptors);
  // Engine path, part 2: status[i] == 0 publishes descriptor i; anything else publishes
  // nothing for it. kNotFound (not the pending fence), kInvalidArgument (status size).
  Result<CompleteReport> Complete(std::uint64_t fence, std::span<const std::uint8_t> status);
  bool has_pending() const;

  // The step's threads and prefetch (StepPlannerOptions, as StepPlanner's): steps 1-3 and,
  // with PB-LRU and enough victims, the victim claims run on options.threads threads; the
  // plan, the indices and the errors are those of one thread. The no-allocation promise
  // below is made (and tested) at one thread.
  // kInvalidArgument for invalid options (the planner keeps its old ones);
  // kFailedPrecondition while a plan is pending.
  Status SetOptions(const StepPlannerOptions& options);
  const StepPlannerOptions& options() const;
  const StepPlannerCounters& counters() const;  // the victim claims, as StepPlanner::counters()

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

  struct Scratch;  // opaque; defined in src/step/engine_step.cc

 private:
  // Plan without handing the descriptors out: checks, DpStep's classify and claim, the
  // indices; refuses a step of more than descriptor_rows misses.
  Result<PlannedStep> Prepare(Rank rank, GroupId group, const StepShape& shape, std::span<const RequestId> requests,
                              std::span<const std::int32_t> selections, std::span<std::int32_t> indices,
                              std::size_t descriptor_rows);
  EngineStepPlanner(AddressSpace& space, const EngineStepConfig& config, std::unique_ptr<Scratch> scratch);

  AddressSpace& space_;
  EngineStepConfig config_;
  std::unique_ptr<Scratch> scratch_;
};

}  // namespace ula
