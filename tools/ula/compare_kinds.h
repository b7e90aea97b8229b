// `ula compare --model M` for a model with layer kinds (configs/kinds/M.json; the per-kind
// comparison of serving/kind_compare.h): prints the per-config table, the pools' sizing,
// the starvation sweep and the ranking, writes DIR/kinds_summary.csv, DIR/kinds_curve.csv
// and DIR/kinds_starvation.csv; with --sensitivity instead one markdown table of admission
// and peak over each uncertain constant's range. --json prints one JSON object.
#pragma once

#include <filesystem>
#include <string>

namespace ula::cli {

struct CompareKindsOptions {
  std::string model;
  std::filesystem::path config_dir;
  std::filesystem::path out;
  bool json = false;
  bool sensitivity = false;
};

// Returns the process exit code (2: no kind config for the model).
int RunCompareKinds(const CompareKindsOptions& options);

}  // namespace ula::cli
