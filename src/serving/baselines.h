// The systems of the serving comparison (docs/COST_MODEL.md) and
// their placement rules, plus the HiSparse per-request device buffer as a real policy.
//
// Placement rules, per GPU ("rank"), for a request whose whole history is T tokens
// (kv = KV bytes per token over all layers in use, ix = index-key bytes per token; index
// keys stay on device in every system because the indexer scores all of them every step):
//   all_gpu   device: T*(kv + ix). TP: every rank holds a full copy.
//   hisparse  device: C*kv (fixed per-request buffer, not lendable) + T*ix;
//             host: T*kv (the full history). TP: every rank holds its own copy of both.
//   trtllm_offload  as hisparse with C = its per-request GPU cache (host_history_size per
//             rank: every TP rank its own copy).
//   ulacache  DP: device: T*ix + W*kv (the request's working set, W = min(T, w), w = one step's
//                 expected distinct selections: top_k x (1 + drafts x (1 - draft_keep)),
//                 must fit on device in the step), the rest of T*kv on device or host.
//             TP: the history is striped: each rank holds ceil(T/P) tokens' KV and index
//                 keys (device: ceil(T/P)*ix + ceil(W/P)*kv + buffer B*kv, B = local-buffer
//                 entries per request; the rest on device or host).
//   ulacache_home  TP only (TpAttention::kAtHome: attention computed where the entries
//             live, no local buffer): as ulacache TP without the buffer,
//             device ceil(T/P)*ix + ceil(W/P)*kv, the rest on device or host. In DP mode
//             there is nothing to fetch from other ranks, so it would be ulacache itself:
//             Validate refuses it there and the comparison does not run it.
//   dcp       TP only: device ceil(T/P)*(kv + ix) (vLLM: index keys sharded as the KV).
//   dcp_sglang  TP only: device ceil(T/P)*kv + T*ix (SGLang: index keys replicated).
//   helix     TP only: device n*(kv + ix), n = the busiest rank's tokens when blocks of b
//             tokens are dealt round-robin: ceil(ceil(T/b)/P)*b (b = helix_tokens_per_block).
//   vllm_hisparse  device: T*ix + (C + tail)*kv (hot buffer C = hisparse_buffer_entries,
//             the never-reclaimed tail pages); host: T*kv, in TP one copy for the node
//             (T*kv/P per rank: the TP ranks share one host pool). Admission also needs,
//             for the moment it admits, the request's resident pages up to the in-flight
//             window: (min(T, window) - tail)*kv more free device bytes (device_transient,
//             checked, not reserved: those pages are unpinned to host once written, as
//             vLLM's HiSparseResidentManager.get_num_blocks_to_allocate caps them with
//             apply_admission_cap). Resident GPU pages past that are a cache of the host
//             pool in the device room left over: not part of admission.
// A rank fits a request when device_only + d + t <= D, host_only + h <= H and
// device_only + host_only + either + d + t + h + f <= D + H (d: device-only, t: device bytes
// needed only while admitting, h: host-only, f: either).
// DP places a request on the rank with the most free bytes (lowest index on ties).
//
// Thread-safety: none (plain state); one thread per ledger / buffer set.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "ula/error.h"
#include "serving/serving_config.h"

namespace ula {

// What engines run today (docs/COST_MODEL.md "The systems engines run today"):
//   dcp        vLLM's decode context parallel (-dcp P): latent KV and index keys striped
//              token by token over the TP ranks (token g on rank g mod P), attention at home,
//              index keys sharded with a global top-k merge; no host tier for running KV
//   dcp_sglang SGLang's --dcp: the same striping, index keys replicated on every rank
//   helix      TensorRT-LLM's Helix: KV striped in blocks of helix_tokens_per_block, QKV
//              computed redundantly (q_b and W_UK replicated), one all-to-all of partial
//              outputs + LSE per layer, then TP/EP for the FFN; no host tier
//   vllm_hisparse  vLLM's HiSparse port: the host pool is the source of truth (one copy per
//              DP replica, shared by its TP ranks), GPU-resident pages a write-back cache of
//              it reclaimed under pressure, a per-request hot buffer of
//              (queries + 1) x top-k rows for the rest; admission counts the hot buffer and
//              the index keys on device, the whole history on host
//   trtllm_offload  TensorRT-LLM's sparse KV cache offload (SparseKvCacheOffloadConfig):
//              the history in pinned host memory per rank, each request a GPU cache of
//              gpu_cache_factor x the units one decode step selects plus the unit being
//              written, in whole pages; index keys on device. HiSparse's placement in the
//              third engine (hisparse_buffer_entries = that cache)
enum class SystemKind : std::uint8_t {
  kAllGpu,
  kHiSparse,
  kUlaCache,
  kUlaCacheAtHome,
  kDcp,
  kDcpSglang,
  kHelix,
  kVllmHiSparse,
  kTrtllmOffload,
};
inline constexpr SystemKind kAllSystems[] = {SystemKind::kAllGpu,        SystemKind::kHiSparse, SystemKind::kUlaCache,
                                             SystemKind::kUlaCacheAtHome, SystemKind::kDcp,      SystemKind::kDcpSglang,
                                             SystemKind::kHelix,          SystemKind::kVllmHiSparse,
                                             SystemKind::kTrtllmOffload};
// "all_gpu", "hisparse", "ulacache", "ulacache_home", "dcp", "dcp_sglang", "helix", "vllm_hisparse",
// "trtllm_offload"
std::string_view SystemName(SystemKind s);
// Whether the system exists in this mode (ulacache_home, dcp, dcp_sglang, helix: TP only).
bool SystemRunsIn(SystemKind s, ParallelMode mode);
// Both UlaCache systems (address spaces with a working set on device).
inline bool IsUlaCache(SystemKind s) { return s == SystemKind::kUlaCache || s == SystemKind::kUlaCacheAtHome; }
// The context-parallel systems: KV striped over the TP ranks, attention at home, no host tier.
inline bool IsContextParallel(SystemKind s) {
  return s == SystemKind::kDcp || s == SystemKind::kDcpSglang || s == SystemKind::kHelix;
}
// Whether the system keeps KV in host memory (fill counts the host budget).
inline bool HasHostTier(SystemKind s) {
  return s == SystemKind::kHiSparse || s == SystemKind::kVllmHiSparse || s == SystemKind::kTrtllmOffload || IsUlaCache(s);
}

struct PlacementRules {
  SystemKind system = SystemKind::kUlaCache;
  ParallelMode mode = ParallelMode::kDp;
  std::uint32_t num_ranks = 1;
  double device_bytes_per_rank = 0;  // left for KV after weights and activations
  double host_bytes_per_rank = 0;
  double kv_bytes_per_token = 0;
  double index_bytes_per_token = 0;
  std::uint32_t working_set_entries = 0;     // ulacache, ulacache_home: one step's distinct selections
  std::uint32_t hisparse_buffer_entries = 0;
  std::uint32_t tp_buffer_entries = 0;       // ulacache TP, per request; must be 0 for ulacache_home
  std::uint32_t helix_tokens_per_block = 0;  // helix: tokens of one KV block (the striping unit)
  std::uint32_t tail_entries = 0;            // vllm_hisparse: the newest pages, never reclaimed
  // vllm_hisparse: tokens whose resident pages admission counts (the in-flight window,
  // tail included; 0 = the tail only).
  std::uint32_t admission_window_entries = 0;

  // Names the first bad field (kInvalidArgument); ulacache_home in DP mode is refused.
  Status Validate() const;
};

// Bytes one request needs on one rank it touches.
struct RankDemand {
  double device = 0, host = 0, either = 0;
  double device_transient = 0;  // free device bytes the admission needs, not reserved after it
};
RankDemand DemandOf(const PlacementRules& rules, std::uint32_t history_tokens);
// SGLang HiSparse's host pool under `ratio` (rules: the device and host budgets per rank):
// ratio x D tokens of KV with D = device / (kv + ratio x ix) device-pool tokens, i.e.
// ratio x device x kv / (kv + ratio x ix), capped by the host budget; ratio = +inf: the
// limit device x kv / ix (index keys of ratio x D tokens then fill the device).
double HiSparseHostPoolBytes(const PlacementRules& rules, double ratio);
// The seed's budget rule: the ratio whose pool is the host budget H,
// H kv / (device kv - H ix) (at least 1), or +inf when no ratio reaches H.
double HiSparseMatchedRatio(const PlacementRules& rules);
// Fill: `stored_tokens` tokens of KV + index keys over num_ranks x (device budget +
// `host_budget_bytes`) (0 without a host tier); 0 when there is no memory.
double FillOf(const PlacementRules& rules, double stored_tokens, double host_budget_bytes);
// Helix: tokens of a T-token history on the busiest rank when blocks of `block` tokens are
// dealt round-robin over `ranks` (at most T).
double HelixRankTokens(std::uint32_t t, std::uint32_t block, std::uint32_t ranks);

class AdmissionLedger {
 public:
  static Result<AdmissionLedger> Create(const PlacementRules& rules);

  // Places a request of `history_tokens` (its final length) if it fits: the rank (DP) or
  // rank 0 (TP, where it touches every rank). nullopt if it does not fit now.
  std::optional<std::uint32_t> TryAdmit(std::uint32_t history_tokens);
  // Undoes a TryAdmit. REQUIRES: the same rank and length.
  void Release(std::uint32_t rank, std::uint32_t history_tokens);
  // Whether the request would fit on this rank (DP) / on the ranks (TP).
  bool FitsOn(std::uint32_t rank, std::uint32_t history_tokens) const;
  std::uint32_t admitted() const { return admitted_; }
  // Bytes reserved on a rank: device-only, host-only, and either tier.
  double device_only(std::uint32_t rank) const { return device_[rank]; }
  double host_only(std::uint32_t rank) const { return host_[rank]; }
  double either(std::uint32_t rank) const { return either_[rank]; }
  const PlacementRules& rules() const { return rules_; }

 private:
  explicit AdmissionLedger(const PlacementRules& rules);
  void Add(std::uint32_t rank, const RankDemand& d, double sign);

  PlacementRules rules_;
  std::vector<double> device_, host_, either_;  // [num_ranks] bytes reserved
  std::uint32_t admitted_ = 0;
};

// The largest number of requests that decode at once: requests are admitted in order until
// the first that does not fit (it waits; nothing behind it jumps the queue).
std::uint32_t MaxAdmitted(const PlacementRules& rules, std::span<const std::uint32_t> history_tokens);

// HiSparse device buffers: per request a fixed set of C slots (per layer group) holding
// copies of host-resident entries, exact LRU at round (step) granularity inside it. The full
// history lives in host memory; new tokens are written into the buffer and backed up to host.
// Invariants: each request's slot_of map and its slot table are inverse; at most C entries.
struct HiSparseStepStats {
  std::uint64_t distinct = 0, hits = 0, misses = 0, evictions = 0;
};

class HiSparseBuffers {
 public:
  static Result<HiSparseBuffers> Create(std::uint32_t buffer_entries);

  // Prefill of `history` tokens: all go to host; the newest min(C, history) stay in the
  // buffer. kAlreadyExists / kInvalidArgument (history 0).
  Status AddRequest(std::uint64_t id, std::uint32_t history);
  // n new tokens written to device (buffer, LRU victims) and backed up to host.
  Status Append(std::uint64_t id, std::uint32_t n);
  // One step of one request: the positions its queries selected (duplicates allowed).
  // Misses are fetched from host into free slots, then LRU victims not used this round.
  // kResourceExhausted (nothing changed) if the distinct positions exceed C;
  // kOutOfRange for a position past the history; kNotFound.
  Result<HiSparseStepStats> Step(std::uint64_t id, std::span<const std::uint32_t> positions);
  void AdvanceRound() { ++round_; }
  Status Finish(std::uint64_t id);
  std::uint32_t buffer_entries() const { return capacity_; }
  // Entries of the request in its buffer (kNotFound).
  Result<std::uint32_t> NumBuffered(std::uint64_t id) const;
  Status CheckInvariants() const;

 private:
  struct Request {
    std::uint32_t history = 0;
    std::vector<std::uint32_t> slot_of;    // [history] slot or kNone
    std::vector<std::uint32_t> pos_of;     // [C] position or kNone
    std::vector<std::uint64_t> last_used;  // [C] round stamps
    std::uint32_t used = 0;
  };
  explicit HiSparseBuffers(std::uint32_t c) : capacity_(c) {}
  // Fills `count` slots of r with the given positions (free first, then LRU not in round).
  void Place(Request& r, std::span<const std::uint32_t> positions, HiSparseStepStats* stats);

  std::uint32_t capacity_;
  std::uint64_t round_ = 1;
  std::unordered_map<std::uint64_t, Request> requests_;
  std::vector<std::uint32_t> scratch_, victims_;
  std::vector<char> mark_;  // [C] scratch marks of one Step
};

}  // namespace ula
