// TpVerifier: the consistency verifier for TP mode (docs/ARCHITECTURE.md invariant 1-5 across
// ranks). It drives a TpAddressSpace with a seeded random workload — requests arrive and
// decode (entries striped over the ranks), the engine rewrites entries, each round steps
// every layer group for two sub-batches under memory pressure (home swaps, local-buffer
// evictions), requests finish — and keeps a shadow of every entry's bytes (float32 values,
// so that the reference attention can read them). After every step it checks, for every
// hosted rank, that the bytes at each returned ref equal the shadow; after the second
// sub-batch of a round it re-checks the first one's refs (current-round entries are never
// evicted); it runs CheckInvariants (exclusive residency; buffer copies equal their home);
// and it feeds bad input and checks that each is refused with nothing changed.
//
// In-process (fabric == nullptr) it hosts every rank. With an MPI fabric every process
// runs the same seeded workload and hosts its own rank only; the counters are per process
// (reduce them across ranks yourself; the MPI test does).
//
// With TpAttention::kAtHome (config.attention) there are no buffer copies: after every
// step AttendAtHome (tp_home_attention.h) runs each hosted rank's partial attention over
// its own shard for every query of the step, exchanges the records by head owner
// (in-process by copying, under MPI with one all-to-all), merges them in rank order, and
// each rank's heads are compared with SparseMlaAttention over the shadow bytes (float
// tolerance: the sums run in another order) — on every step, not only when recording.
//
// Faults (config.fault_rate > 0): the backend is a FaultInjectingBackend (fault_backend.h)
// and, under MPI, the fabric a FaultInjectingFabric (fault_fabric.h), both seeded from
// config.seed (and the rank), failing that fraction of the planner's copy and swap batches
// and remote fetches, some after landing part of their moves; armed only while the planner
// steps. In-process ranks use no fabric: their remote phase copies through the backend, so
// its faults are the backend's; they step on one thread then (parallel_ranks is ignored),
// so that the seed reproduces every fault. A step that fails with kIo is a failed call
// (TpStepPlanner::Step's documented state); afterwards, on every hosted rank, each selected
// entry that the rank would read there — homed here and on device, or buffered here —
// must hold its shadow bytes at that slot (else an early publish: attention would read
// bytes that never arrived), every live hosted entry must read back its shadow (else a lost
// entry), and the invariants must hold. Under MPI the ranks agree after every step whether
// any rank's step failed (one AllTrue), and then skip that step's attention at home (a
// collective the failed rank cannot join with a plan).
//
// Records (config.record): per step and hosted rank the refs and an attention output —
// with local buffers the reference attention of every request's first query read at the
// rank's refs, at home the merged output of the rank's heads for every query — what the
// differential test compares between in-process and MPI ranks.
// Thread-safety: one driver thread (rank workers and copy workers aside).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "config/model_config.h"
#include "ula/error.h"
#include "ula/residency_policy.h"
#include "ula/tp_address_space.h"
#include "verify/planner_form.h"

namespace ula {

class TpFabric;

struct TpVerifierConfig {
  std::uint64_t seed = 1;
  std::uint64_t ops = 3000;
  std::uint32_t num_ranks = 4;
  std::uint32_t num_groups = 2;
  std::uint32_t entry_bytes = 64;  // float32 values: kv_lora_rank = entry/4 - 4, rope 4
  std::uint32_t device_slots_per_group = 192;
  std::uint32_t host_slots_per_group = 1024;
  std::uint32_t buffer_slots_per_group = 0;  // 0: just enough for one round (2 x max step);
                                             // attention at home: must be 0 (no buffer)
  std::uint32_t top_k = 32;
  std::uint32_t max_batch = 3;            // requests per sub-batch
  std::uint32_t queries_per_request = 3;  // 1 + 2 speculative drafts
  PolicyKind policy = DefaultPolicyKind();
  TpAttention attention = TpAttention::kLocalBuffer;
  int copy_threads = 1;
  bool parallel_ranks = true;
  bool record = false;
  double fault_rate = 0;  // in [0, 1]; see "Faults" above
  // Requests that arrive before the first op (at most 24, the verifier's live cap): a short
  // run then holds a full workload whatever the seed, so that pools smaller than it are
  // under pressure from the start.
  std::uint32_t initial_requests = 0;
  // > 0: this percentage of the arrivals adopts a cached prefix of a live request (one
  // SparsePrefixCache over the space; verifier_core.h, "Sharing"). In [0, 100].
  std::uint32_t share_percent = 0;
  // The form of the step (planner_form.h), every one with the same workload and checks:
  //   kHost     TpStepPlanner, the serial host step (the reference);
  //   kEngine   TpStepPlanner::Step (its Plan, the copies on the backend, Complete),
  //             both attentions;
  //   kDevice   one DeviceStep (OpenMP form) per hosted rank and group, attention at home:
  //             Reload, Check on every rank, the verdicts' maximum, Claim, the copies on
  //             the backend over the shard pools, Complete, StoreInto.
  // kDevice needs attention at home and in-process ranks; the engine forms need
  // stable_new_entries (TpConfig::stable_new_entries), kDevice also no host shadows and the
  // kernel_pb_lru policy, kEngine with a local buffer in-process ranks. Validate and
  // RunTpVerifier refuse the others with the reason (the forms' own Create refusals).
  PlannerForm form = PlannerForm::kHost;
  // kDevice only: the device steps' CUDA form (DeviceStepConfig::cuda) on the GPU, each hosted
  // rank's arrays there (step/device_io.h), the verdicts read back and their maximum written
  // there for Claim, the copies still the backend's. Validate refuses it with another form.
  bool cuda = false;
  bool stable_new_entries = false;  // TpConfig::stable_new_entries
  // Each shard keeps clean host shadows (TpConfig::host_shadows, sparse/host_shadows.h); the
  // checks are the same (a shadow is never read, so every entry must still read its own
  // bytes), plus CheckInvariants' shadow checks (a shadow equals its entry's device bytes).
  // Not with kDevice (its Create refuses shadows).
  bool host_shadows = false;
  // Drafts rolled back and round reservations, as VerifierConfig's (consistency_verifier.h):
  // TpAddressSpace::Truncate, and TpStepPlanner::ReserveRound (a planner made by Create, in
  // every form; in-process ranks only, and stable_new_entries).
  std::uint32_t draft_reject_percent = 0;
  bool reserve_rounds = false;
  // A model with layer kinds (DeepSeek-V4; docs/ARCHITECTURE.md, "Kinds under TP"): the TP
  // space holds its kinds (SpaceConfigOfModel, queries_per_request - 1 draft tokens in the
  // window ring; TpConfig::kinds), Allocate, Truncate and Free take the model's tokens and the
  // addresses are its C4 entries, each on its home a mod P, so every step at home selects
  // among C4 entries and reads each on its home. num_groups and entry_bytes must be the
  // model's (ApplyModel of consistency_verifier.h gives them, with one layer a group). After
  // every op each request's page table of every kind on every rank (KindPagesOf(request,
  // kind, rank)) is compared with the verifier's model of it (verify/kind_model.h, its rank
  // view: C4 entry i on rank i mod P, C128 entry j on rank j mod P, the window and the
  // compressor states on the window home alone); no step may change one; a rollback past
  // the window ring must be refused with nothing changed; the space's refusals are fed as
  // bad input. Attention at home, the host and engine forms, in-process or under MPI (every
  // process holds every rank's share, so each checks every rank's tables); num_ranks must
  // divide the model's page of 64 C4 entries; not with share_percent > 0.
  std::optional<ModelConfig> model;

  Status Validate() const;
  std::uint32_t buffer_slots() const;
};

struct TpStepRecord {
  std::uint64_t step = 0;
  std::uint16_t group = 0;
  std::uint16_t rank = 0;
  std::vector<TpReadRef> refs;
  std::vector<float> attention;  // [requests][heads * kv_lora_rank]
  bool operator==(const TpStepRecord&) const = default;
};

struct TpVerifierReport {
  std::uint64_t seed = 0;
  std::uint64_t ops = 0;
  std::uint64_t rounds = 0;          // step ops with a non-empty batch (each steps every group)
  std::uint64_t sub_batches = 0;     // non-empty sub-batches of those rounds, per group:
                                     // steps + rejected_steps + failed_calls == sub_batches * num_groups
  std::uint64_t steps = 0;           // successful group steps (all hosted ranks)
  std::uint64_t rejected_steps = 0;  // refused for lack of room (checked unchanged)
  std::uint64_t entries_checked = 0;
  std::uint64_t mismatches = 0;
  std::uint64_t invariant_failures = 0;
  std::uint64_t bad_input_checks = 0;
  std::uint64_t bad_input_failures = 0;
  std::uint64_t home_swaps = 0;
  std::uint64_t home_misses = 0;            // home entries brought host -> device
  std::uint64_t home_shadow_evictions = 0;  // host_shadows: home evictions that moved no bytes
  std::uint64_t host_bytes = 0;             // bytes over the host link in the home phases
  std::uint64_t buffer_hits = 0;
  std::uint64_t remote_fetches = 0;
  std::uint64_t buffer_evictions = 0;
  std::uint64_t left_to_home = 0;           // at home: selections covered by another rank
  std::uint64_t attention_checks = 0;       // at home: (query, rank with heads) outputs compared
  std::uint64_t partial_bytes_sent = 0;     // at home: partial records sent to other ranks (hosted)
  std::uint64_t attention_mismatches = 0;   // at home: outside the tolerance
  double max_attention_error = 0.0;         // at home: largest |merged - reference|
  std::uint64_t faults_injected = 0;        // fault_rate > 0: batches and fetches failed (hosted ranks)
  std::uint64_t failed_calls = 0;           // steps that failed with kIo on this process
  std::uint64_t entries_lost = 0;           // after a failed call: live entries that no longer read their bytes
  std::uint64_t early_publishes = 0;        // after a failed call: refs published without their bytes
  std::uint64_t shares = 0;                 // sharing: requests that adopted a cached prefix
  std::uint64_t sharer_checks = 0;          // sharing: adopted / still-shared entries checked
  std::uint64_t cache_evictions = 0;        // sharing: cache evictions run
  std::uint64_t locked_checks = 0;          // sharing: locked matches checked after an eviction
  std::uint64_t sharing_failures = 0;       // sharing: an entry a sharer's free or an eviction lost or moved
  std::uint64_t draft_rollbacks = 0;        // draft_reject_percent: decodes that rolled back drafts first
  std::uint64_t reservations = 0;           // reserve_rounds: decodes ReserveRound admitted
  std::uint64_t reservations_refused = 0;   // reserve_rounds: decodes it deferred (kResourceExhausted)
  // model: what the kinds did and how they were checked (verify/kind_model.h), over every rank.
  std::uint64_t kind_failures = 0;          // a page table or address list not the model's, or changed by a step
  std::uint64_t kind_pages_checked = 0;     // (request, kind, rank) page tables compared with the model
  std::uint64_t c4_made = 0;                // C4 entries (addresses) Allocate made
  std::uint64_t c4_freed = 0;               // C4 entries a rollback or a Free released
  std::uint64_t c128_made = 0;              // C128 entries that appeared (summed over the ranks)
  std::uint64_t ring_blocks_freed = 0;      // window blocks the ring freed at its front (window homes)
  std::uint64_t rollbacks_refused = 0;      // rollbacks past the window ring, refused with nothing changed
  std::vector<std::string> first_failures;  // up to 10
  std::vector<TpStepRecord> records;

  bool ok() const {
    return mismatches == 0 && invariant_failures == 0 && bad_input_failures == 0 && attention_mismatches == 0 &&
           entries_lost == 0 && early_publishes == 0 && sharing_failures == 0 && kind_failures == 0;
  }
};

// fabric: nullptr for in-process ranks; otherwise a fabric of config.num_ranks ranks
// (collective: every rank calls it with the same config).
Result<TpVerifierReport> RunTpVerifier(const TpVerifierConfig& config, TpFabric* fabric = nullptr);

}  // namespace ula
