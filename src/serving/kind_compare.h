// The per-kind serving comparison (`ula compare --model deepseek_v4_flash`): for each config
// of the kind config's scenario (hardware x TP/DP x MTP, the same workload, traces and
// budgets as the default comparison) and each system of kind_pools.h, the admission limit,
// the fill per kind, and decode throughput and TPOT from kind_step_cost.h over the
// scenario's batch grid; plus a starvation sweep: fixed context lengths at which SGLang's
// window pool or its full / C4 pool fills first.
//
// What this is: the engines' rows are accounting and a roofline (no engine runs: admission
// counts bytes per kind under each engine's pool rules); UlaCache's admission is a run of its
// space over frames at each config's budget (kind_space_admission.h), and its step's host
// fetches come from the C4 entries that run leaves on host at each batch. Every step is priced
// from the kinds' entry counts. Selections that miss a device buffer or tier are the turnover
// of each query's top-k that a run of the kind config's C4 indexer workload measures
// (MeasureKindTurnover; for UlaCache, those of them that land on the C4 entries its space run
// left on host) (docs/COST_MODEL.md "Kinds").
//
// Determinism: a pure function of the configs. Thread-safety: reentrant.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "config/model_config.h"
#include "serving/kind_config.h"
#include "serving/kind_pools.h"
#include "serving/kind_step_cost.h"
#include "serving/serving_config.h"
#include "ula/error.h"

namespace ula {

struct KindCurvePoint {
  std::uint32_t batch = 0;
  double context = 0;      // mean context of the batch's requests (mid-decode)
  double tput = 0;         // output tokens / s, all GPUs
  double host_fetch = 0;   // C4 entries fetched from host per step per GPU
  KindStepTime time;
};

struct KindSystemResult {
  KindSystem system = KindSystem::kUlaCache;
  PoolPlan plan;
  Admission admission;
  std::vector<KindCurvePoint> curve;
  double peak_tput = 0;
  std::uint32_t peak_batch = 0;
  double tpot_b1_ms = 0;
  std::string note;
};

struct KindConfigResult {
  ScenarioEntry entry;
  std::string hardware_label;  // "8xH200"
  std::uint32_t num_ranks = 8;
  double weight_bytes_per_gpu = 0, device_kv_bytes_per_gpu = 0, host_bytes_per_gpu = 0;
  double tokens_per_step = 1;
  std::vector<KindSystemResult> systems;  // kAllKindSystems order, those that run in the mode
  const KindSystemResult* Find(KindSystem s) const {
    for (const KindSystemResult& r : systems) {
      if (r.system == s) return &r;
    }
    return nullptr;
  }
};

// One context length of the starvation sweep, one config.
struct KindStarvationRow {
  ScenarioEntry entry;
  std::uint32_t context = 0;  // input tokens (output: the workload's mean), starvation_requests of them
  struct Cell {
    KindSystem system = KindSystem::kUlaCache;
    Admission admission;
  };
  std::vector<Cell> cells;  // sglang_dsv4, vllm, ulacache
};

// The selection turnover a run of the real indexer over the C4 indexer workload measures
// (workload/calibration.h RunRealIndexer: every request, every step after the first).
struct KindTurnover {
  std::string workload;       // configs/workloads/<workload>.json
  double query_keep = 0;      // the run's drift (the workload's, or the sensitivity's)
  std::uint32_t queries = 1;  // per step in the run: 1 + the workload's draft tokens
  // MTP off: the share of query 0's top-k that query 0 of the previous step did not select
  // (1 - the run's overlap mean).
  double single = 0;
  // MTP on: the entries of a step's union that the previous step's union did not hold, per
  // query of the run (union_turnover / queries): a draft's selection counts only where it
  // adds to the step's union, the workload's definition of a step's selection.
  double per_query = 0;
  double seconds = 0;  // the run's wall time
  double For(bool mtp) const { return mtp ? per_query : single; }
};

// Runs the real indexer over configs/workloads/<kinds.selection_workload>.json (its
// query_keep replaced by `query_keep` if given). kInvalidArgument naming selection_workload
// when the workload is missing, runs another model, is not the model's C4 indexer
// (tokens_per_entry = the CSA ratio), has fewer than 2 decode steps, or a prompt of fewer
// entries than the top-k; the workload's own errors as they are.
Result<KindTurnover> MeasureKindTurnover(const KindCompareConfig& kinds, const std::filesystem::path& config_dir,
                                         std::optional<double> query_keep = std::nullopt);

struct KindComparison {
  std::string model, scenario;
  KindTurnover turnover;  // what every system's host fetches are priced with
  std::vector<KindConfigResult> configs;
  std::vector<KindStarvationRow> starvation;  // MTP-off configs of the first hardware
};

// Loads the scenario and model the kind config names from config_dir, measures the turnover
// (MeasureKindTurnover) and runs the comparison.
Result<KindComparison> RunKindComparison(const KindCompareConfig& kinds, const std::filesystem::path& config_dir);
// The same with a turnover already measured. kInvalidArgument for a turnover outside [0, 1].
Result<KindComparison> RunKindComparison(const KindCompareConfig& kinds, const std::filesystem::path& config_dir,
                                         const KindTurnover& turnover);

}  // namespace ula
