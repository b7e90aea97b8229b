// A fitted selection-model parameter set stored in configs/selection/<name>.json: the one
// place a calibrated SelectionModelParams lives, read by every consumer (`ula compare` and
// its scenarios through "selection": {"fit": NAME, "seed": S}, `ula bench policy`,
// `ula bench dup`, `ula bench planner`), written by `ula bench trace --write-fit PATH`.
//
// File: {"name", "source" (the command that fitted it), "top_k" (the fit's top-k; a consumer
// replaces it with its model's), "sink_tokens", "recent_tokens", "keep_mean", "keep_stddev",
// "draft_keep", "heavy_skew", "return_fraction", "return_window", "seed"}; every field is
// required and range-checked as SelectionModelParams::Validate does; unknown fields are errors.
//
// Failure contract: a missing file, bad JSON, a missing, unknown or out-of-range field is an
// error naming the file and the field; nothing is returned half-filled.
// Thread-safety: reentrant.
#pragma once

#include <filesystem>
#include <string>
#include <string_view>

#include "ula/error.h"
#include "workload/selection_model.h"

namespace ula {

struct SelectionFit {
  std::string name;
  std::string source;
  SelectionModelParams params;
};

Result<SelectionFit> ParseSelectionFit(std::string_view json_text, std::string_view origin = "selection fit");
Result<SelectionFit> LoadSelectionFit(const std::filesystem::path& path);
// configs/selection/<name>.json under config_dir.
Result<SelectionFit> LoadSelectionFitByName(std::string_view name, const std::filesystem::path& config_dir);
// The file's text (pretty-printed JSON, trailing newline); ParseSelectionFit reads it back
// to the same values (doubles round-trip exactly).
std::string SelectionFitJson(const SelectionFit& fit);

}  // namespace ula
