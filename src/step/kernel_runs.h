// The selection runs of a step (ula/selection_run.h) as the arrays the classify kernel reads
// (kernels::ClassifyArgs): each run's first selection, its holder's owner tag and the holder's
// adopted addresses, sorted, one list after another. Shared by KernelStepPlanner (DP holders:
// RequestState) and TpKernelStepPlanner (TP holders: TpAddressSpace::State::Holder); both
// have `tag` and a sorted `adopted`. A run of an unknown request ends the selections the
// kernels see: its first selection fails, unless an earlier one does.
// Thread-safety: plain data of one planner.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "kernels/step_kernels.h"
#include "ula/selection_run.h"

namespace ula {

template <class Holder>
struct KernelRuns {
  std::vector<std::uint32_t> starts, tags, adopted_starts, adopted;
  std::vector<const Holder*> holders;  // [runs up to the unknown one] null for a run of 0
  std::size_t end = 0;                 // selections the kernels see
  std::size_t bad_run = 0;             // the unknown request's run, when end < selections
  bool complete = true;                // every run's request is known

  // find(request) -> const Holder*, or nullptr for an unknown request.
  template <class Find>
  void Build(std::span<const SelectionRun> runs, std::size_t num_selections, Find&& find) {
    starts.clear();
    tags.clear();
    adopted_starts.assign(1, 0);
    adopted.clear();
    holders.clear();
    end = num_selections;
    bad_run = 0;
    complete = true;
    std::uint32_t first = 0;
    for (std::size_t r = 0; r < runs.size(); ++r) {
      const Holder* h = nullptr;
      if (runs[r].count != 0) {
        h = find(runs[r].request);
        if (h == nullptr) {
          end = first;
          bad_run = r;
          complete = false;
          break;
        }
      }
      holders.push_back(h);
      starts.push_back(first);
      tags.push_back(h != nullptr ? h->tag : 0);
      if (h != nullptr) {
        for (auto a : h->adopted) adopted.push_back(a.value());
      }
      adopted_starts.push_back(static_cast<std::uint32_t>(adopted.size()));
      first += runs[r].count;
    }
    starts.push_back(first);
  }
  std::uint32_t num_runs() const { return static_cast<std::uint32_t>(tags.size()); }
  // The runs' fields of a classify (the arrays stay owned here).
  void FillRuns(kernels::ClassifyArgs& args) const {
    args.run_starts = starts.data();
    args.num_runs = num_runs();
    args.run_tags = tags.data();
    args.adopted_starts = adopted_starts.data();
    args.adopted = adopted.data();
  }
};

}  // namespace ula
