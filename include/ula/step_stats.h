// StepStats: what one step of one layer group did on one rank, the one stats type of every
// step (DP and TP, every form; docs/ARCHITECTURE.md invariant 6). The engine's StepRecord
// (ula/step_arrays.h) is the same counts as the device writes them. Fields a mode does not
// have stay 0: the local buffer's (buffer_hits .. source_batches) and `elsewhere` in DP, the
// host shadows' without them.
#pragma once

#include <cstdint>

namespace ula {

struct StepStats {
  std::uint64_t selections = 0;   // non-padding selections read
  std::uint64_t distinct = 0;     // distinct addresses (TP: homed here, plus the local buffer's)
  std::uint64_t hits = 0;         // distinct entries already on device (TP: homed here)
  std::uint64_t misses = 0;       // distinct entries brought from host (TP: homed here)
  std::uint64_t into_free = 0;    // misses placed in free device slots
  std::uint64_t evictions = 0;    // misses that displaced a victim
  std::uint64_t bytes_moved = 0;  // over the host link, both directions
  // Host shadows (host_shadows in the space's config): victims evicted by the table alone
  // (their clean host copy survived: no bytes), and victims copied device -> host into a
  // host slot of their own (a free slot or a reclaimed shadow) before their slot was filled.
  // evictions - shadow_evictions - evict_copies were swaps.
  std::uint64_t shadow_evictions = 0;
  std::uint64_t evict_copies = 0;
  // TP, the local buffer (TpAttention::kLocalBuffer): entries homed elsewhere.
  std::uint64_t buffer_hits = 0;       // found in the local buffer
  std::uint64_t remote_fetches = 0;    // fetched from the home rank
  std::uint64_t buffer_evictions = 0;  // fetches that replaced an older buffer copy
  std::uint64_t remote_bytes = 0;      // bytes fetched from other ranks
  std::uint64_t source_batches = 0;    // fetch batches (one per source rank with misses)
  // TP, attention at home: selections homed elsewhere, left to their home rank's partial.
  std::uint64_t elsewhere = 0;

  StepStats& operator+=(const StepStats& o) {
    selections += o.selections;
    distinct += o.distinct;
    hits += o.hits;
    misses += o.misses;
    into_free += o.into_free;
    evictions += o.evictions;
    bytes_moved += o.bytes_moved;
    shadow_evictions += o.shadow_evictions;
    evict_copies += o.evict_copies;
    buffer_hits += o.buffer_hits;
    remote_fetches += o.remote_fetches;
    buffer_evictions += o.buffer_evictions;
    remote_bytes += o.remote_bytes;
    source_batches += o.source_batches;
    elsewhere += o.elsewhere;
    return *this;
  }
  bool operator==(const StepStats&) const = default;
};

}  // namespace ula
