// StepPlanner::Impl: the DP host step's state (ula/step_planner.h), shared by its two
// sources: step_planner.cc (classify, claim, copy plan, completion, the library path) and
// step_planner_engine.cc (the engine layout, Plan / Complete, engine memory).
//
// The one plan both paths run:
//   - Classify (steps 1-3): every selected address is checked (live, held by its run's
//     request, on this rank), deduplicated by the records' stamps (src/core/address_records.h)
//     and sorted into hits and misses; a hit's slot goes to out[i] in that pass, padding (the
//     engine layout) gets kPadIndex. Then the refusals that need the whole step: a new entry
//     on host and the room check (GroupPools::RefuseMissesWithoutRoom). Changes nothing but
//     the stamps.
//   - Claim (step 4 and the copy plan): the hits are touched, free slots are claimed first,
//     then victims (on the T threads with PB-LRU and at least parallel_claim_min_victims of
//     them, PbLru::ClaimVictimsParallel: the same victims in the same order), and MissFills
//     (step/miss_fills.h) decides and describes the fills. From then on one plan is
//     pending, in MissFills' pending state, and the space knows it (Directory::BeginPlan)
//     until Complete.
//   - the library path: Run on the space's backend, Complete with each descriptor's
//     outcome, WritePublished reads the misses' slots; the engine path: WriteTargets, the
//     engine runs the descriptors, Complete by the engine's statuses.
// Threads (StepPlannerOptions::threads = T): lane t of T owns the addresses of every T-th
// block of 4,096 addresses, so no two threads dedup or write the same record; each scans the
// selections in order and keeps its hits and misses with their selection index; the lists
// are merged by that index, so hits, misses, claimed slots and the copy plan are those of one
// thread, and an error names the same (first) selection.
//
// Thread-safety: the space's driver thread; the step's worker threads run inside Classify,
// Claim and WritePublished only.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "policy/fork_join.h"
#include "step/miss_fills.h"
#include "step/selection_share.h"
#include "ula/address_space.h"
#include "ula/step_planner.h"

namespace ula {

namespace step_lanes {
inline constexpr std::size_t kNoError = ~std::size_t{0};

// A selection's entry, tagged with its index in the input (the merge key).
struct Indexed {
  std::uint32_t index;
  std::uint32_t value;  // a slot (hits) or an address (misses)
};

// One thread's part of steps 1-3.
struct alignas(64) Lane {
  std::vector<Indexed> hits, misses;
  std::vector<std::uint32_t> patch;  // selections of misses: their slots are known after the claim
  std::size_t first_error = kNoError;
};
}  // namespace step_lanes

// The selections of one step: addrs[i] is selection i's logical address; runs name each
// selection's request (selection_run.h) and cover addrs exactly (the caller checked).
struct StepSelections {
  std::span<const std::uint32_t> addrs;
  std::span<const SelectionRun> runs;
  // The engine layout: 0xFFFFFFFF (int32 -1) is padding (output kPadIndex), any other value
  // of the sign bit is refused (kInvalidArgument, "neither an address nor -1").
  bool padding = false;
};

struct StepPlanner::Impl {
  explicit Impl(AddressSpace& s);
  ~Impl();  // a pending plan ends (its claims stay: the space's check reports them)

  // kInvalidArgument for invalid options (Validate): the step keeps its old options.
  Status SetOptions(const StepPlannerOptions& options);
  // Sizes the scratch for steps of up to max_selections selections and max_misses misses
  // over max_addresses addresses (then Classify, Claim and WriteTargets allocate nothing at
  // one thread until the space hands out more addresses; SetOptions keeps the sizes).
  void Reserve(std::size_t max_selections, std::size_t max_misses, std::size_t max_addresses);

  // Steps 1-3 and the refusals above. Out is SlotId (the library path) or std::int32_t (the
  // engine's indices: Classify leaves them alone, WriteTargets writes them all; SlotId
  // output gets the hits' slots here and is unspecified after an error). kNotFound,
  // kInvalidArgument (the first failing selection's error), kResourceExhausted (no room, or
  // a new entry on host selected): nothing changed but the dedup stamps.
  // REQUIRES: rank and group in range; out has sel.addrs.size() elements; no plan pending.
  template <class Out>
  Result<StepStats> Classify(Rank rank, GroupId group, const StepSelections& sel, Out* out);
  // Step 4 and the copy plan; adds the planned counters to stats; the engine path's
  // descriptors go to out as they are made (MissFills::Describe). The plan is pending.
  // REQUIRES: the last Classify succeeded and nothing changed the space since; out, if
  // any, takes the step's misses.
  void Claim(StepStats& stats, const DescriptorSink* out = nullptr);
  std::span<const CopyDescriptor> descriptors() const { return fills.descriptors(); }  // the pending plan's
  // The engine path: the indices of the last Classify<std::int32_t> into out: the hits'
  // slots, kPadIndex for padding, each miss's claimed slot (read once Complete published
  // it). REQUIRES: a plan pending; out as in Classify.
  void WriteTargets(std::int32_t* out);
  // The library path: runs the pending plan on the space's backend (MissFills::Run), each
  // descriptor's outcome into status. REQUIRES: status.size() == descriptors().size().
  Status Run(std::span<std::uint8_t> status);
  // Publishes the pending plan by status (MissFills::Publish) and ends it. Returns the
  // descriptors published. REQUIRES: a plan pending; status.size() == descriptors().size().
  std::size_t Complete(std::span<const std::uint8_t> status);
  // The library path, after Complete: each miss's selection reads its published slot.
  void WritePublished(SlotId* out);

  // Runs f(lane) for every lane, on the T threads when T > 1.
  template <class F>
  void ForLanes(F&& f) {
    if (lanes.size() == 1) {
      f(std::size_t{0});
      return;
    }
    auto body = [&](std::size_t, std::size_t begin, std::size_t stop) {
      for (std::size_t lane = begin; lane < stop; ++lane) f(lane);
    };
    fork_join->Run(lanes.size(), body);
  }

  AddressSpace& space;
  StepPlannerOptions options;
  StepPlannerCounters counters;
  std::vector<step_lanes::Lane> lanes = std::vector<step_lanes::Lane>(1);
  std::unique_ptr<policy::ForkJoin> fork_join = std::make_unique<policy::ForkJoin>(1);
  std::vector<const RequestState*> run_holders;  // [runs] each run's request (null: unknown, or a run of count 0)
  std::vector<LogicalAddr> missed;                // [misses] in selection order
  std::vector<SlotId> hit_slots, target_slots;    // [distinct hits], [misses]
  std::vector<std::int32_t> slot_of;              // [addresses] WriteTargets' scratch: a miss's claimed slot
  std::vector<std::int32_t> staged;               // [selections] the engine's indices until Classify passed
  std::size_t reserved = 0;                       // Reserve's max_selections
  std::span<const std::uint32_t> addrs;           // the last Classify's selections
  MissFills fills;                                // the copy plan (pending between Claim and Complete)
  std::vector<std::uint8_t> status;               // [descriptors] the library path's outcomes
  Rank rank;
  GroupId group;
  bool pending = false;
  std::uint64_t fence = 0;

  // The engine path (Create): its config and scratch.
  std::optional<EngineStepConfig> engine;
  SelectionShare share;  // ReserveRound's measurement (reserve = kQuantile)
  std::vector<SelectionRun> runs;  // [max batch] row b: top_k x q_len selections of requests[b]
  std::uint32_t max_descriptors = 0;
  // One registered pool: layer l's rows at bases[l] + slot * layer_bytes.
  struct Pool {
    std::vector<std::uintptr_t> bases;  // [num_layers]; empty: nothing registered
    std::uint32_t layer_bytes = 0;
    std::uint32_t slots = 0;
  };
  std::vector<Pool> regions;  // [tier][rank][group]
};

}  // namespace ula
