// ConsistencyVerifier: proves that no movement changes what attention reads
// (docs/ARCHITECTURE.md invariant 4). It drives a DP AddressSpace on the cpu backend with a seeded
// random workload — requests arrive with a prefill, decode appends tokens, the engine
// rewrites entries, steps select overlapping top-k sets under memory pressure so that swaps
// happen, requests finish — and keeps a shadow copy of every entry's bytes. After every
// step it checks that each selected entry's bytes at the returned device slot equal the
// shadow, that Read() agrees, and that CheckInvariants() holds. It also feeds bad input
// (freed and unknown addresses, double frees, oversize allocations) and checks that each
// is refused and changes nothing. With a model (VerifierConfig::model) the space holds the
// model's kinds and every kind's page tables are checked as well (verify/kind_model.h).
//
// Thread-safety: a verifier run is single-threaded (the backend's copy workers aside).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "config/model_config.h"
#include "ula/error.h"
#include "ula/residency_policy.h"
#include "verify/planner_form.h"

namespace ula {

struct VerifierConfig {
  std::uint64_t seed = 1;
  std::uint64_t ops = 100000;
  std::uint32_t num_ranks = 2;
  std::uint32_t num_groups = 2;
  std::uint32_t entry_bytes = 64;
  std::uint32_t device_slots_per_group = 512;
  std::uint32_t host_slots_per_group = 8192;
  std::uint32_t top_k = 64;
  std::uint32_t max_batch = 3;       // requests per step
  std::uint32_t queries_per_request = 3;  // 1 + 2 speculative drafts
  PolicyKind policy = DefaultPolicyKind();
  int copy_threads = 1;
  // > 0: the backend is a FaultInjectingBackend (fault_backend.h) that fails this seeded
  // fraction of the planner's copy and swap batches, some after landing part of their
  // moves, armed only while the planner steps. A step that fails with kIo is a failed call:
  // afterwards every selected entry that the table puts on device must hold its shadow
  // bytes (else an early publish) and every live entry must read back its shadow (else a
  // lost entry). In [0, 1].
  double fault_rate = 0;
  // > 0: this percentage of the arrivals adopts a cached prefix of a live request
  // (shared addresses and a SparsePrefixCache per rank; verifier_core.h, "Sharing"). In
  // [0, 100]; 0 draws the same numbers as before sharing existed.
  std::uint32_t share_percent = 0;
  // The form of the step under test (docs/ARCHITECTURE.md, "The step's forms today"); every
  // form gets the same workload and the same checks:
  //   kHost     StepPlanner, the serial host step (the reference);
  //   kEngine   StepPlanner's engine path: Plan, the descriptors run on the backend over
  //             the space's pools as an engine runs them, Complete with their statuses;
  //   kDevice   DeviceStep in its OpenMP form, one per (rank, group): Reload from the space,
  //             Plan, the descriptors run on the backend over the space's pools, Complete,
  //             StoreInto the space.
  // Both engine forms' descriptors pass one check (verify/engine_descriptors.h): each names
  // every row of its entry (the group's layers, row() bytes, at slot x row()), else the step
  // fails and publishes nothing.
  // The engine forms need stable_new_entries on, kDevice also host_shadows off and the
  // kernel_pb_lru policy: otherwise their Create refuses, and so does
  // RunConsistencyVerifier, with that reason.
  PlannerForm form = PlannerForm::kHost;
  // kDevice only: the device step's CUDA form (DeviceStepConfig::cuda) on the GPU, the
  // engine's arrays there (step/device_io.h), the copies still the backend's over the space's
  // pools. kInvalidArgument with another form; the CUDA form's Create refusals otherwise (a
  // build without CUDA, no device, an old driver).
  bool cuda = false;
  // true: the space keeps clean host shadows (AddressSpaceConfig::host_shadows,
  // src/space/host_shadows.h); the checks are the same (a shadow is never read, so every
  // entry must still read its reference bytes). kEngine keeps them (its plans evict to
  // shadows and host slots, step_planner.h); kDevice's Create refuses them.
  bool host_shadows = false;
  // AddressSpaceConfig::stable_new_entries (a new token's slot never moves in its round).
  bool stable_new_entries = false;
  // Layers per group: an entry is group_layers rows of entry_bytes / group_layers bytes, one
  // per layer region, and every check compares every layer's row (a move must carry all
  // of an entry's rows). Divides entry_bytes.
  std::uint32_t group_layers = 1;
  // > 0: this percentage of the decodes first rolls back 1..3 of the request's last tokens
  // (AddressSpace::Truncate: drafts the verification rejected, verifier_core.h). In [0, 100];
  // 0 draws the same numbers as without it.
  std::uint32_t draft_reject_percent = 0;
  // true: a decode allocates only once StepPlanner::ReserveRound (a planner made by Create
  // over the space, in every form: the scheduler's admission) admitted its tokens. Needs
  // stable_new_entries.
  bool reserve_rounds = false;
  // A model with layer kinds (DeepSeek-V4; docs/ARCHITECTURE.md, "Kinds"): the space holds
  // its kinds (SpaceConfigOfModel, with queries_per_request - 1 draft tokens in the window
  // ring), Allocate, Truncate and Free take the model's tokens and the addresses are its C4
  // entries, so every step selects among C4 entries. num_groups, entry_bytes and
  // group_layers must be the model's (ApplyModel sets them). Besides the checks of every
  // run, after every op each request's page table of every kind (KindPagesOf) is compared
  // with the verifier's model of it (verify/kind_model.h), no step may change one, a
  // rollback past the window ring must be refused with nothing changed, and the space's own
  // refusals are fed as bad input (ShareInto: kUnsupported). Every form; not with
  // share_percent > 0 (a space with kinds refuses ShareInto).
  std::optional<ModelConfig> model;

  Status Validate() const;
};

struct VerifierReport {
  std::uint64_t seed = 0;
  std::uint64_t ops = 0;
  std::uint64_t steps = 0;             // successful planner steps (one group, one rank)
  std::uint64_t rejected_steps = 0;    // steps refused for lack of device room (checked unchanged)
  std::uint64_t entries_checked = 0;   // selected entries compared with the shadow
  std::uint64_t mismatches = 0;
  std::uint64_t invariant_failures = 0;
  std::uint64_t bad_input_checks = 0;  // bad calls refused with nothing changed
  std::uint64_t bad_input_failures = 0;
  std::uint64_t swaps = 0;             // victim evictions (device <-> host exchanges)
  std::uint64_t shadow_evictions = 0;  // host_shadows: of those, evicted to their shadow (no bytes)
  std::uint64_t fetches = 0;           // misses placed into free device slots
  std::uint64_t hits = 0;
  std::uint64_t faults_injected = 0;   // fault_rate > 0: batches the backend failed
  std::uint64_t failed_calls = 0;      // steps that failed with kIo
  std::uint64_t entries_lost = 0;      // after a failed call: live entries that no longer read their bytes
  std::uint64_t early_publishes = 0;   // after a failed call: device slots published without their bytes
  std::uint64_t shares = 0;            // sharing: requests that adopted a cached prefix
  std::uint64_t sharer_checks = 0;     // sharing: adopted / still-shared entries checked (bytes, place)
  std::uint64_t cache_evictions = 0;   // sharing: cache evictions run
  std::uint64_t locked_checks = 0;     // sharing: locked matches checked after an eviction
  std::uint64_t sharing_failures = 0;  // sharing: an entry a sharer's free or an eviction lost or moved
  std::uint64_t draft_rollbacks = 0;   // draft_reject_percent: decodes that rolled back drafts first
  std::uint64_t reservations = 0;      // reserve_rounds: decodes ReserveRound admitted
  std::uint64_t reservations_refused = 0;  // reserve_rounds: decodes it deferred (kResourceExhausted)
  // model: what the kinds did and how they were checked (verify/kind_model.h).
  std::uint64_t kind_failures = 0;       // a page table or address list not the model's, or changed by a step
  std::uint64_t kind_pages_checked = 0;  // (request, kind) page tables compared with the model
  std::uint64_t c4_made = 0;             // C4 entries (addresses) Allocate made
  std::uint64_t c4_freed = 0;            // C4 entries a rollback or a Free released
  std::uint64_t c128_made = 0;           // C128 entries that appeared
  std::uint64_t ring_blocks_freed = 0;   // window blocks the ring freed at its front
  std::uint64_t rollbacks_refused = 0;   // rollbacks past the window ring, refused with nothing changed
  std::vector<std::string> first_failures;  // up to 10 descriptions

  bool ok() const {
    return mismatches == 0 && invariant_failures == 0 && bad_input_failures == 0 && entries_lost == 0 &&
           early_publishes == 0 && sharing_failures == 0 && kind_failures == 0;
  }
};

// Sets config.model and the model's space shape: num_groups (one per CSA layer),
// entry_bytes and group_layers. kFailedPrecondition for a model without layer kinds or
// compressed-sparse layers; kInvalidArgument for groups of unequal layers (the verifier's
// entries are group_layers rows each). Nothing changes on an error.
Status ApplyModel(VerifierConfig& config, const ModelConfig& model);

Result<VerifierReport> RunConsistencyVerifier(const VerifierConfig& config);

}  // namespace ula
