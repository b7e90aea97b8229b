// Kinds in a DP space's config (ula/kv_kinds.h; docs/ARCHITECTURE.md, "Kinds").
//
// A space with kinds holds the sparse kind's entries in its groups (one group per selection:
// DeepSeek-V4's compressed-sparse layers, each with its own indexer) and every other kind
// beside them. Allocate, Truncate and Free make and release every kind's entries
// (space/kind_entries.h). Every step form (StepPlanner's two paths, DeviceStep) selects the
// sparse kind's entries as any space's addresses and leaves the other kinds alone.
//
// Thread-safety: pure functions.
#pragma once

#include "ula/address_space.h"
#include "ula/error.h"

namespace ula {

// Ok for no kinds. Otherwise ValidateKinds, then exactly one sparse kind whose layers and row
// the config's groups describe: the groups' layers sum to its layers and row() is its
// row_bytes. kInvalidArgument naming the field.
Status ValidateSpaceKinds(const AddressSpaceConfig& config);

}  // namespace ula
