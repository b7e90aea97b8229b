#include "ula/selection_run.h"

#include <fmt/format.h>

namespace ula {

Status CheckSelectionRuns(std::span<const SelectionRun> runs, std::size_t n_selections) {
  std::uint64_t covered = 0;
  for (const SelectionRun& run : runs) covered += run.count;
  if (covered != n_selections) {
    return MakeError(ErrorCode::kInvalidArgument,
                     fmt::format("the selection runs cover {} selections but the step has {}: give one run "
                                 "{{request, count}} per consecutive piece of one request's selections",
                                 covered, n_selections));
  }
  return Ok();
}

}  // namespace ula
