// KindPools: how each engine's KV pools hold a model with layer kinds (DeepSeek-V4: window
// KV in every layer, C4 entries and their index keys in compressed-sparse layers, C128
// entries in heavily-compressed layers; kind_bytes.h), as pure accounting per GPU. One
// concept: which pool a request's kinds draw on, how large each pool is, and how many
// requests fit (docs/COST_MODEL.md "Kinds").
//
//   sglang_dsv4      SGLang's DSV4PoolConfigurator: one budget split once into fixed pools
//                    sized per "full token" F: a full-token index space (pages of
//                    page_size), an SWA pool of swa_full_tokens_ratio x F tokens of window KV
//                    (every layer) plus the C4 compressor-state rings it carries, F/4 C4
//                    entries and index keys, F/128 C128 entries, and a fixed C128 state for
//                    max_running_requests slots. A decoding request holds ceil(L/page) pages
//                    of full tokens and window + page tokens of the SWA pool; whichever pool
//                    is full first refuses it while the other idles.
//   sglang_hisparse  the same with HiSparse: the device C4 pool shrinks by host_to_device_ratio
//                    r, its host pool holds every C4 entry; each request keeps min(C4
//                    entries, its HiSparse buffer) on device. r: the largest whose host pool
//                    fits the host budget, capped at mean_tokens / (4 x buffer) so that the
//                    device C4 pool holds a buffer for every request the full pool admits;
//                    a host budget below even ratio 1's host pool caps the full-token space.
//   vllm             one block pool per GPU shared by every kind (no split): a request holds
//                    ceil(L / block) blocks of C4 KV, index keys and C128 KV, each page padded
//                    to the alignment, and the window's blocks plus one per layer.
//   trtllm_offload   TensorRT-LLM's sparse KV offload: window, C128 and index keys on device,
//                    every C4 entry in host memory, a per-request GPU cache of
//                    gpu_cache_factor x one step's selections + 1, in pages.
//   dcp              TP only: vLLM's pool with every kind's tokens interleaved over the P
//                    ranks (decode context parallel): ceil(L / P) tokens per rank.
//   ulacache         every kind in one space over frames, no split: its plan states the
//                    budget (device + host per GPU); its admission is no formula here but a
//                    run of the space (kind_space_admission.h): Admit and PoolDemand do not
//                    take it.
// TP: the engines' pools replicate MLA KV on every rank (each rank's pools = the node's);
// dcp holds 1/P of each request per rank. DP: requests go round-robin to the
// P ranks, each with its own pools. Admission in arrival order stops at the first request
// that does not fit (the refusing pool is `binds`).
//
// Thread-safety: pure functions of their arguments.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "config/model_config.h"
#include "serving/kind_config.h"
#include "serving/serving_config.h"
#include "ula/address_space.h"
#include "ula/error.h"

namespace ula {

enum class KindSystem : std::uint8_t { kSglang, kSglangHiSparse, kVllm, kTrtllmOffload, kDcp, kUlaCache };
inline constexpr KindSystem kAllKindSystems[] = {KindSystem::kSglang,        KindSystem::kSglangHiSparse, KindSystem::kVllm,
                                                 KindSystem::kTrtllmOffload, KindSystem::kDcp,            KindSystem::kUlaCache};
std::string_view KindSystemName(KindSystem s);  // "sglang_dsv4", "sglang_hisparse", "vllm", "trtllm_offload", "dcp", "ulacache"
bool KindSystemRunsIn(KindSystem s, ParallelMode mode);  // dcp: TP only

// The kinds of one model in use (MTP layers counted only with MTP on).
struct KindShape {
  std::uint32_t window_layers = 0, csa_layers = 0, hca_layers = 0;
  std::uint32_t main_layers = 0;  // SGLang's target layers (its pools count these, MTP by inflation)
  std::uint32_t window = 0, csa_ratio = 4, hca_ratio = 128, top_k = 0;
  std::uint32_t entry_bytes = 0, key_bytes = 0;  // FP8 packed KV entry, FP8 index key
  std::uint32_t head_dim = 0, index_head_dim = 0;
};
// kFailedPrecondition for a model without layer kinds.
Result<KindShape> MakeKindShape(const ModelConfig& model, bool mtp);

// Bytes of one request of `tokens` tokens per kind (exact entries, kind_bytes.h's rule).
struct KindUse {
  double window = 0, csa = 0, hca = 0, index = 0;
  double total() const { return window + csa + hca + index; }
  KindUse& operator+=(const KindUse& o) {
    window += o.window, csa += o.csa, hca += o.hca, index += o.index;
    return *this;
  }
};
KindUse ExactKindUse(const KindShape& s, double tokens);

struct PoolSetup {
  ParallelMode mode = ParallelMode::kTp;
  std::uint32_t num_ranks = 8;
  bool mtp = false;
  std::uint32_t queries = 1;           // per request per step (1 + draft tokens with MTP)
  double device_bytes = 0;             // per GPU, left for KV
  double host_bytes = 0;               // per GPU
  std::uint32_t hisparse_buffer_entries = 4096;  // per request per layer
  bool hisparse_match_host_budget = true;
  double hisparse_host_to_device_ratio = 2;
  // sglang_hisparse: the workload's mean request length; the device C4 pool must hold one
  // buffer per request the full-token pool holds at that length, which caps the ratio.
  double mean_tokens = 0;
  double trtllm_gpu_cache_factor = 2.0;
  std::uint32_t trtllm_tokens_per_page = 64;
};

// One pool of a system on one GPU.
struct Pool {
  std::string name;
  double capacity = 0;  // its own unit (tokens, entries or bytes)
  double used = 0;
};

// A system's pools on one GPU and what one request draws from them.
struct PoolPlan {
  KindSystem system = KindSystem::kUlaCache;
  std::vector<Pool> pools;      // per GPU
  double memory_bytes = 0;      // the KV memory of one GPU the system may use (device, + host with a host tier)
  double device_bytes = 0, host_bytes = 0;
  KindUse reserved;             // sglang: bytes each kind's fixed pool reserves per GPU (0 for shared pools)
  double state_bytes = 0;       // sglang: compressor-state rings and C128 state per GPU
  double hisparse_ratio = 0;    // sglang_hisparse: the host_to_device_ratio chosen
  std::string derivation;       // one line: how the pools were sized
};

Result<PoolPlan> MakePoolPlan(KindSystem system, const KindShape& shape, const KindCompareConfig& kc, const PoolSetup& setup);
// What one request of `tokens` tokens draws from each of plan.pools on one GPU (same order);
// empty for kUlaCache.
std::vector<double> PoolDemand(const PoolPlan& plan, const KindShape& shape, const KindCompareConfig& kc,
                               const PoolSetup& setup, double tokens);

struct Admission {
  std::uint32_t admitted = 0;
  std::string binds;           // the pool that refused the next request ("" if every request fit)
  KindUse held;                // bytes of each kind the admitted requests hold, all GPUs (exact entries)
  std::vector<double> pool_fill;  // per pool: used / capacity on the fullest GPU
  double fill = 0;             // held.total() / (memory_bytes x GPUs holding distinct data)
  double host_share_csa = 0;   // ulacache: share of the C4 entries that sit in host memory
  // ulacache: each space's budget after the admitted requests (DP: one per rank; TP: the one
  // space every rank runs): frames of each kind, the C4 device share, C4 on device.
  std::vector<KindBudget> space;
  std::vector<std::string> space_kinds;  // [kinds] names of frames_of_kind's entries
};
// Admits requests of `final_tokens` (arrival order) under an engine's plan: TP on one GPU
// (replicated or striped, the same on every GPU), DP round-robin over the ranks. REQUIRES:
// plan.system is not kUlaCache (a run of the space admits it: an empty Admission here).
Admission Admit(const PoolPlan& plan, const KindShape& shape, const KindCompareConfig& kc, const PoolSetup& setup,
                std::span<const std::uint32_t> final_tokens);

}  // namespace ula
