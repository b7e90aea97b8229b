// `ula bench planner` (bench_planner_command.cc) and its device rows (bench_planner_device.cc):
// the options both read, and the device step's rows (--planner device, --cuda, --mode tp).
#pragma once

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "ula/address_space.h"
#include "ula/device_step.h"
#include "ula/step_planner.h"
#include "workload/selection_model.h"

namespace ula::cli::planner_bench {

struct PlannerOptions {
  std::string config_dir, summary, compare_csv;
  std::vector<std::string> configs;  // default: the DP configs below (--mode tp: the TP ones)
  std::vector<double> batch_fractions{1.0, 0.5, 0.25};
  double device_fraction = 1.0;
  std::uint32_t steps = 2;   // measured steps per thread count
  std::vector<std::uint32_t> threads{1, 2};
  std::uint32_t prefetch_distance = StepPlannerOptions{}.prefetch_distance;
  std::uint32_t parallel_claim_min_victims = StepPlannerOptions{}.parallel_claim_min_victims;
  std::uint32_t warmup = 4;  // steps first replayed unmeasured (the device pool fills from empty)
  std::uint32_t groups = 0;  // 0: from the model
  std::uint32_t ranks = 8;
  std::uint64_t seed = 1;
  bool json = false;
  bool claim_sweep = false;
  std::string planner = "host";  // host (StepPlanner); device: DeviceStep beside the host planner
  std::string mode = "dp";       // dp; tp: attention at home over `ranks` in-process ranks (--planner device)
  bool cuda = false;             // --planner device: the CUDA form (refused where it cannot run)
  std::string shadows = "off";  // AddressSpaceConfig::host_shadows
  bool prefer_shadowed = false; // PolicyOptions::prefer_shadowed
  double host_free = -1;        // >= 0: host pool sized so that this share is free after the prefill
  std::uint32_t claim_capacity = 1u << 21;
  std::vector<std::uint32_t> claim_demands{1024, 4096, 16384, 65536, 262144};
  std::uint32_t claim_reps = 9;
};

struct ConfigRow {
  std::string config;
  std::uint32_t admitted = 0;
  double device_gb = 0, host_gb = 0;
  bool mtp = false;
};
inline double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// --planner device: one row per (config, batch, T) of the DeviceStep (OpenMP or CUDA form) on the same
// workload as the host planner's row, beside it.
struct DeviceRow {
  std::string config;
  std::string mode = "dp";  // dp; tp: attention at home, `ranks` ranks, one row over all of them
  std::string form = "openmp";        // the device step's form: openmp or cuda (--cuda)
  std::string timing = "steady_clock"; // what timed each group step: the host clock, or cuda_events
  std::uint32_t batch = 0, groups = 0, threads = 1, ranks = 1;
  std::uint64_t distinct = 0, group_steps = 0, misses = 0, evictions = 0;
  double total_ms = 0, group_ms_median = 0, ns_per_distinct = 0, host_ns_per_distinct = 0;
  DeviceStepCounters counts;  // over the measured steps, every group
};

// The device step of every group on an engine-path copy of one host row's workload (DP);
// nullopt with `error` set on a failure (exit 2). bench_planner_device.cc says what is timed.
std::optional<DeviceRow> MeasureDevice(const PlannerOptions& o, AddressSpaceConfig sc, const std::string& name,
                                       std::uint32_t batch, std::uint32_t groups, std::uint32_t queries,
                                       std::uint32_t top_k, const SelectionModelParams& params, std::uint32_t threads,
                                       std::string& error);
// --mode tp: the device step per (rank, group) beside the TP host step on a space built alike.
std::optional<DeviceRow> MeasureDeviceTp(const PlannerOptions& o, const ConfigRow& cfg, std::uint32_t batch,
                                         std::uint32_t groups, std::uint32_t entry, std::uint32_t queries,
                                         std::uint32_t top_k, const SelectionModelParams& params, std::uint32_t threads,
                                         std::string& error);
nlohmann::json DeviceRowJson(const DeviceRow& d);
void PrintDeviceRows(const PlannerOptions& o, const std::vector<DeviceRow>& rows);

}  // namespace ula::cli::planner_bench
