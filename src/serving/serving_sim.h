// The serving comparison: for each config of a scenario (hardware x TP/DP x MTP)
// and each system (all-GPU, HiSparse, UlaCache, vLLM's HiSparse; in TP also UlaCache with
// attention at home, DCP as vLLM and SGLang run it, and Helix; baselines.h), the admission limit under the system's
// placement rules and the decode throughput at batch sizes up to it, from continuous
// batching on the same workload, the same selection traces and the same memory budgets.
//
// What is simulated (docs/COST_MODEL.md "What is simulated"): one representative layer
// group of one GPU (DP: rank 0 with ceil(B/P) of the B requests; TP: rank 0 of the striped
// space, or the full copy of the baselines), `warmup_steps` + `measure_steps` decode steps
// per batch size of the grid, batch sizes visited in ascending order on one continuing
// system (requests finish and are replaced as in continuous batching). Counters are scaled
// to all groups by the cost model.
//
// Sharing workloads (a workload config with "sharing"): the same loop over
// the workload's stream with a radix cache for every system and the prefix charged once
// per holder (src/serving/shared_admission.h; docs/COST_MODEL.md "What is simulated" 5);
// each system's SharingResult says what it stored and what prefill it skipped.
//
// Determinism: a pure function of the scenario and the config files (seeded generators,
// single-threaded planners); two runs give identical results.
// Thread-safety: reentrant; runs on the calling thread.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "serving/baselines.h"
#include "serving/cost_model.h"
#include "ula/error.h"
#include "serving/serving_config.h"

namespace ula {

struct CurvePoint {
  std::uint32_t batch = 0;       // target concurrent requests (all GPUs)
  double mean_batch = 0;         // achieved, over the measured steps
  double tput = 0;               // output tokens / s, all GPUs
  double step_ms = 0;            // mean step time
  double tokens_per_step = 0;    // per request
  double hit_rate = 0;           // distinct selections already on the attending GPU's device
                                 // (ulacache_home: of those homed on it, the only ones it reads)
  double h2d_gb = 0, d2h_gb = 0, nvlink_gb = 0;  // per step, per GPU, all groups
  double arriving_gb = 0;        // prefill KV arriving per step per GPU (StepCounts::arriving_*)
  StepTime time;                 // mean breakdown
  std::vector<StepCounts> measured;  // the counts of each measured step (RepriceComparison)
};

// A sharing workload's figures (docs/RESULTS.md "Shared prefixes").
struct SharingResult {
  bool on = false;                       // the scenario's workload shares prefixes
  // At the admission limit (requests admitted in arrival order, none finished):
  double distinct_fraction = 0;          // distinct stored entries / entries the histories name
  std::uint32_t copies_per_node = 1;     // copies of each stored entry in the node (TP baselines: P)
  std::uint64_t prefill_saved_at_limit = 0;  // matched prefix tokens of the admitted requests
  std::uint64_t input_tokens_at_limit = 0;
  double max_rank_load = 0;              // DP: requests on the fullest rank / the mean (routing)
  // Over the decode simulation (every request admitted in it, all ranks):
  std::uint64_t prefill_saved = 0;       // matched tokens: prefill skipped
  std::uint64_t prefill_computed = 0;    // input tokens prefilled
  std::uint64_t recomputed = 0;          // of those, prefix tokens computed before (evicted, or elsewhere)
  std::uint64_t evictions = 0;           // idle prefixes the radix cache dropped for room
};

struct SystemResult {
  SystemKind system = SystemKind::kUlaCache;
  std::uint32_t admitted = 0;  // largest number decoding at once
  std::vector<CurvePoint> curve;
  double peak_tput = 0;
  std::uint32_t peak_batch = 0;
  double tpot_b1_ms = 0;       // step time / tokens per step at batch 1 (0 if not run)
  double hit_b1 = 0;           // hit rate at batch 1 (HiSparse: its per-request buffer's)
  // Admitted requests' KV + index-key bytes (sharing: the distinct stored ones) over the
  // memory the system may use for KV on all GPUs: device budget, plus host with a host tier.
  double fill = 0;
  std::string note;            // why a curve stops early, if it does
  // The system's own budgets per GPU (its PlacementRules: Helix loses its redundant QKV
  // weights, HiSparse's host pool follows its ratio, systems without a host tier get 0).
  double device_budget_bytes = 0, host_budget_bytes = 0;
  SharingResult sharing;
  // configs/systems/availability.json (availability.h): who ships the system, and whether
  // it ships for this config; `why_not` says why not. Not shipping: hypothetical, out of the
  // config's ranking (BestShippingEngine).
  std::string engine;
  bool proposed = false;  // UlaCache's own systems
  bool ships = true;
  std::string why_not;
};

struct ConfigResult {
  ScenarioEntry entry;
  std::string hardware_label;  // "8xH200"
  MemoryBudget budget;
  CostModelInputs cost_inputs;        // what priced its steps
  double mtp_acceptance_rate = 0;     // expected tokens per step come from it
  std::vector<SystemResult> systems;  // in kAllSystems order, those that SystemRunsIn the mode
  // The result of system s, or nullptr if it does not run in this config's mode.
  const SystemResult* Find(SystemKind s) const {
    for (const SystemResult& r : systems) {
      if (r.system == s) return &r;
    }
    return nullptr;
  }
  double seconds = 0;                 // wall time of the simulation
  // The engine system (not proposed) that ships for this config with the highest peak, or
  // nullptr when none ships.
  const SystemResult* BestShippingEngine() const {
    const SystemResult* best = nullptr;
    for (const SystemResult& r : systems) {
      if (!r.proposed && r.ships && (best == nullptr || r.peak_tput > best->peak_tput)) best = &r;
    }
    return best;
  }
};

struct ComparisonResult {
  std::string scenario;
  std::string model;
  std::vector<ConfigResult> configs;
};

struct CompareOptions {
  std::filesystem::path config_dir;
  // Called with one line per finished batch size and system (progress on long runs).
  std::function<void(std::string_view)> progress;
  // UlaCache: clean host shadows (AddressSpaceConfig::host_shadows, TpConfig::host_shadows);
  // an eviction to a live shadow sends nothing over the host link.
  bool host_shadows = false;
};

Result<ComparisonResult> RunComparison(const ScenarioConfig& scenario, const CompareOptions& options);

// The same comparison with every measured step priced again by a cost model whose inputs
// `adjust` changed (kernel rates, link rates, latencies): throughput, step times and peaks
// are recomputed; admission limits, hit rates and bytes moved are the simulation's and stay.
// Only for constants that do not change the simulation (not the activation reserve, which
// changes the budgets, nor the MTP acceptance, which changes the histories).
Result<ComparisonResult> RepriceComparison(const ComparisonResult& result,
                                           const std::function<void(CostModelInputs&)>& adjust);

}  // namespace ula
