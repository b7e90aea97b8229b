// `ula compare --sensitivity`: how each config's admission limits and peak ratios move when
// one uncertain constant of the cost model takes the ends of a stated range (,
// item 10). Constants that only price the steps (kernel rate, head padding, scattered-PCIe
// rate, collective latency, planner per-selection time) re-price the base run's measured
// steps (RepriceComparison); those that change the simulation (MTP acceptance, activation
// reserve) run the comparison again. Prints one markdown table on stdout.
#pragma once

#include "serving/serving_config.h"
#include "serving/serving_sim.h"

namespace ula::cli {

// Returns the process exit code.
int RunCompareSensitivity(const ScenarioConfig& scenario, const CompareOptions& options);

}  // namespace ula::cli
