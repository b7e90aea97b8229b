// StepRows: a library-path step input (selections in runs, one run per request;
// ula/selection_run.h) as the engine path's rows (ula/step_arrays.h): one batch row per run,
// its selections then -1 padding to the longest run. The verifiers drive the engine forms of
// the step (VerifierConfig::form, TpVerifierConfig::form) through it, so that every form gets
// the same workload.
#pragma once

#include <algorithm>
#include <cstdint>
#include <span>
#include <vector>

#include "ula/step_planner.h"
#include "ula/error.h"
#include "ula/selection_run.h"
#include "ula/step_arrays.h"

namespace ula::verify_internal {

struct StepRows {
  StepShape shape;
  std::vector<std::int32_t> rows;       // [batch][top_k]
  std::vector<RequestId> requests;      // [batch]
  std::vector<std::int64_t> request_ids;  // [batch], StepArrays' dtype

  // kInvalidArgument for runs that do not cover the selections or a run longer than max_top_k.
  Status Fill(std::span<const LogicalAddr> selections, std::span<const SelectionRun> runs, std::uint32_t max_top_k) {
    shape = StepShape{.batch = static_cast<std::uint32_t>(runs.size()), .q_len = 1, .top_k = 1};
    std::size_t covered = 0;
    for (const SelectionRun& r : runs) {
      shape.top_k = std::max(shape.top_k, r.count);
      covered += r.count;
    }
    if (covered != selections.size() || shape.top_k > max_top_k) {
      return MakeError(ErrorCode::kInvalidArgument, "runs that do not cover the selections");
    }
    rows.assign(shape.size(), kPadIndex);
    requests.clear();
    request_ids.clear();
    std::size_t i = 0;
    for (std::size_t b = 0; b < runs.size(); ++b) {
      requests.push_back(runs[b].request);
      request_ids.push_back(static_cast<std::int64_t>(runs[b].request.value()));
      for (std::uint32_t c = 0; c < runs[b].count; ++c) rows[b * shape.top_k + c] = static_cast<std::int32_t>(selections[i++].value());
    }
    return Ok();
  }
  // indices [batch][top_k] back in selection order: out[i] = f(index of selection i).
  template <class F>
  void Gather(std::span<const SelectionRun> runs, std::span<const std::int32_t> indices, F&& f) const {
    std::size_t i = 0;
    for (std::size_t b = 0; b < runs.size(); ++b) {
      for (std::uint32_t c = 0; c < runs[b].count; ++c) f(i++, indices[b * shape.top_k + c]);
    }
  }
  // StepArrays over these rows and the caller's outputs.
  StepArrays Arrays(std::span<std::int32_t> indices, std::span<CopyDescriptor> descriptors, StepRecord* stats) const {
    return StepArrays{.selections = rows.data(), .row_batch = nullptr, .requests = request_ids.data(),
                      .indices = indices.data(), .descriptors = descriptors.data(), .stats = stats,
                      .num_rows = shape.batch, .batch = shape.batch, .q_len = 1, .top_k = shape.top_k,
                      .selection_stride = shape.top_k, .index_stride = shape.top_k,
                      .max_descriptors = static_cast<std::uint32_t>(descriptors.size())};
  }
};

}  // namespace ula::verify_internal
