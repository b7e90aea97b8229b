// SelectionRun: which request each selection of a step belongs to (the isolation check).
//
// A step's selections are the top-k picks of every query of every request of the batch,
// concatenated; runs cut them, in order, into consecutive pieces of one request each:
//   selections = [ run 0: runs[0].count addresses of runs[0].request | run 1 | ... ]
// The runs must cover the selections exactly (the counts sum to selections.size(); a run
// of count 0 is allowed). Several runs may name the same request (one run per query, for
// instance).
//
// The isolation guarantee. A planner step (StepPlanner, TpStepPlanner) refuses every
// selection whose address is not live *for the request of its run*: an address that was
// freed, freed and reused by another request, or that belongs to another request, fails
// the whole step with kNotFound before anything changes. So one request's attention can
// never be handed a slot that holds another request's entry through the library: a stale
// selection still holding an address freed with its request is caught even after the
// address was reused. (Write/Read/Lookup name an address alone; an engine keeps its own
// request-to-address table, and the library's is AddressesOf.) Cost: one owner lookup
// per selection (docs/BENCHMARKS.md, "Isolation check").
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "ula/error.h"
#include "ula/ids.h"

namespace ula {

struct SelectionRun {
  RequestId request;
  std::uint32_t count = 0;  // consecutive selections of `request`
};

// Ok iff the runs' counts sum to n_selections; kInvalidArgument (naming both) otherwise.
Status CheckSelectionRuns(std::span<const SelectionRun> runs, std::size_t n_selections);

}  // namespace ula
