// The engine's side of a DP step's descriptors (ula/step_arrays.h), as the verifier plays it
// for the forms that hand descriptors to an engine: the engine path and the device step
// (docs/ARCHITECTURE.md, "One decode step of one layer group"). An engine moves what a
// descriptor names and nothing else: num_layers rows of `bytes` each, at src_offset and
// dst_offset in every layer's region. So the one check of a step's descriptors is that each
// names every row of its entry: the group's layers, rows of AddressSpaceConfig::row() bytes,
// at slot * row. Fewer rows would leave the others behind; more rows, other bytes or other
// offsets would move another entry's bytes.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "ula/address_space.h"
#include "ula/error.h"
#include "ula/step_arrays.h"

namespace ula::verify_internal {

// The first of `descriptors` (of `form`'s step of rank, group) that does not name every row of
// its entry, as a message; nullopt when each does.
std::optional<std::string> MisdescribedRows(AddressSpace& space, Rank rank, GroupId group,
                                            std::span<const CopyDescriptor> descriptors, std::string_view form);

// Runs `descriptors` of (rank, group) on the space's pools through its backend, in the
// batches an engine's copies make: the kEvict victims' device rows to their host slots
// first (a failed batch fails those descriptors and fills none of their slots), then the
// copies, then the swaps. status[i] gets descriptor i's outcome (kDescriptorDone,
// kEvictLanded, kDescriptorFailed); the error says what failed.
// REQUIRES: MisdescribedRows found none; status.size() == descriptors.size(); the swaps
// after every other descriptor (the plans' order).
Status RunDescriptors(AddressSpace& space, Rank rank, GroupId group, std::span<const CopyDescriptor> descriptors,
                      std::span<std::uint8_t> status);

}  // namespace ula::verify_internal
