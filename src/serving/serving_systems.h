// SimSystem: one system of the serving comparison, driven by the decode loop
// (serving_sim.cc) for the simulated rank and the representative layer group. Each adapter
// wraps that system's real placement and policy:
//   all_gpu   AdmissionLedger only: every entry is on device, nothing ever moves
//   hisparse  AdmissionLedger + HiSparseBuffers (per-request LRU buffers, host backup)
//   ulacache  DP: AdmissionLedger + AddressSpace/StepPlanner (PB-LRU), counting backend
//             TP: AdmissionLedger + TpAddressSpace/TpStepPlanner hosting rank 0 only, with a
//             no-op fabric (counting backend: no bytes to fetch); ranks are symmetric
//   ulacache_home  TP only: the same with TpAttention::kAtHome (no local buffer; rank 0
//             makes only its own shard's selected entries resident and fetches nothing)
//   dcp, dcp_sglang, helix  AdmissionLedger only: every entry is on the device of its home
//             rank (dcp: position g on rank g mod P; helix: block g / b on rank (g / b) mod P);
//             the step counts the selections homed on rank 0 (dcp, dcp_sglang: symmetric, as
//             ulacache_home) or on the busiest rank (helix: blocks are not symmetric within
//             a step, the newest block sits on one rank); nothing moves
//   vllm_hisparse  AdmissionLedger + HiSparseBuffers as the hot buffers ((q + 1) x top-k
//             rows) + resident pages: of the device room its ledger leaves, a fraction f of
//             every running request's pages (64 tokens) stays resident (f = room / the
//             running histories, capped at 1; which pages is a seeded hash: the pool reuses
//             unpinned pages in free-queue order, not by content) and the newest tail_entries
//             always; a selection on a resident page is a hit, the rest go through the hot
//             buffer; every new token is mirrored to host (eager_host_mirror)
// Sharing workloads: AdmitShared / FinishShared / EvictPrefix (the UlaCache adapters adopt
// and cache prefixes in their real address space; the baselines keep no addresses).
// Admission = the ledger accepts the whole history and (ulacache) the address space can
// allocate it: UlaCache allocates every address of the final history at admission, so a
// request never runs out of room mid-decode.
//
// Thread-safety: none; one driver thread.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "serving/baselines.h"
#include "ula/error.h"

namespace ula::serving_internal {

// Per step of the representative group, entries (not bytes).
// distinct / hits: the selections the simulated GPU's attention reads and how many of them
// were already on its device (ulacache_home: only those homed on it).
struct SimCounters {
  double distinct = 0, hits = 0;
  double h2d = 0, d2h = 0, nvlink = 0;
  // UlaCache TP (both systems): distinct selections of the whole batch, and those homed on
  // the simulated rank (planner: distinct, hits + misses).
  double batch_distinct = 0, home = 0;
  SimCounters& operator+=(const SimCounters& o) {
    distinct += o.distinct, hits += o.hits, h2d += o.h2d, d2h += o.d2h, nvlink += o.nvlink;
    batch_distinct += o.batch_distinct, home += o.home;
    return *this;
  }
};

struct SimSystemConfig {
  PlacementRules rules;            // for the simulated rank (DP: num_ranks 1)
  std::uint32_t group_entry_bytes = 0;
  // Tokens each tier of the simulated rank holds in the representative group (ulacache).
  std::uint64_t device_tokens = 0;
  std::uint64_t host_tokens = 0;
  std::uint64_t buffer_tokens = 0;  // ulacache TP local buffer (must be 0 for ulacache_home)
  // vllm_hisparse: the device bytes per rank its resident pages may use beside what its
  // ledger reserves (the rules' device budget; the sharing loop lifts the rules' own).
  double resident_device_bytes = 0;
  bool host_shadows = false;  // ulacache: AddressSpaceConfig::host_shadows, TpConfig::host_shadows
};

class SimSystem {
 public:
  virtual ~SimSystem() = default;
  // Admits request `id` with `history` tokens written (prefill) and `final_tokens` in all.
  // false: it does not fit now (nothing changed).
  virtual Result<bool> Admit(std::uint64_t id, std::uint32_t history, std::uint32_t final_tokens) = 0;
  virtual Status Finish(std::uint64_t id) = 0;
  // One decode step: sel[i] = every query's selected positions of request ids[i].
  virtual Status Step(std::span<const std::uint64_t> ids, std::span<const std::vector<std::uint32_t>> sel,
                      SimCounters& c) = 0;
  // n new tokens of request id (history grows from `history` to history + n).
  virtual Status Append(std::uint64_t id, std::uint32_t history, std::uint32_t n, SimCounters& c) = 0;
  // Sharing (shared_admission.h). Admits request `id` whose first `matched`
  // positions are its group's cached prefix (UlaCache: adopted with ShareInto, nothing
  // allocated or copied) and, when `cache` > 0, caches its first `cache` positions for its
  // group (UlaCache: one cache reference on each, Retain). The baselines keep no addresses:
  // their prefix bytes are the shared ledger's (serving_sim.cc), so they just Admit.
  virtual Result<bool> AdmitShared(std::uint64_t id, std::uint32_t history, std::uint32_t final_tokens,
                                   std::uint32_t /*group*/, std::uint32_t /*matched*/, std::uint32_t /*cache*/) {
    return Admit(id, history, final_tokens);
  }
  // Finish; `extends` (multi-turn): the request's whole sequence becomes its group's cached
  // prefix, replacing the one before (UlaCache: Retain the new, Release the old).
  virtual Status FinishShared(std::uint64_t id, std::uint32_t /*group*/, bool /*extends*/) { return Finish(id); }
  // The radix cache dropped the group's idle prefix (UlaCache: Release; freed unless a
  // request still holds it).
  virtual Status EvictPrefix(std::uint32_t /*group*/) { return Ok(); }
  // Whether each GPU scores only its own stripe of the index keys.
  virtual bool striped_indexer() const { return false; }
  // Whether each GPU computes attention only over the entries homed on it (ulacache_home).
  virtual bool attention_at_home() const { return false; }
};

Result<std::unique_ptr<SimSystem>> MakeSimSystem(const SimSystemConfig& config);

}  // namespace ula::serving_internal
