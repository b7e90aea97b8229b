// A small DP space over frames for the kind-frames tests (kind_space_frames_test,
// reserve_frames_test): two C4 groups, a window ring, index keys, C128 and a compressor state
// over frames of 32 KiB (4 C4 blocks of 64 x 2 x 64 B: 256 C4 slots per group per frame).
#pragma once

#include <cstdint>

#include "ula/address_space.h"

namespace ula::testing {

// `frames` frames, a host tier of host_c4 C4 entries; the window's ring_tokens and row bytes
// (64 B: four window blocks per frame, 128 B: two).
inline AddressSpaceConfig SmallFramesConfig(std::uint32_t frames, std::uint32_t host_c4,
                                            std::uint32_t ring_tokens = 18, std::uint32_t window_row_bytes = 64) {
  AddressSpaceConfig c;
  c.num_groups = 2;
  c.entry_bytes = 64;
  c.row_bytes = 64;
  c.page_tokens = 64;
  c.stable_new_entries = true;
  c.kinds = {
      {.name = "window", .tokens_per_entry = 1, .lifetime = KindLifetime::kRing, .ring_tokens = ring_tokens,
       .ring_draft_tokens = 2, .layers = 2, .row_bytes = window_row_bytes},
      {.name = "c4", .tokens_per_entry = 4, .lifetime = KindLifetime::kAppend, .layers = 2, .row_bytes = 64,
       .placement = KindPlacement::kSparse},
      {.name = "c4_index_key", .tokens_per_entry = 4, .lifetime = KindLifetime::kAppend, .layers = 2,
       .row_bytes = 16, .companion_of = 1},
      {.name = "c128", .tokens_per_entry = 128, .lifetime = KindLifetime::kAppend, .layers = 1, .row_bytes = 64},
      {.name = "c4_state", .tokens_per_entry = 4, .lifetime = KindLifetime::kPerRequest, .state_rows = 8,
       .layers = 2, .row_bytes = 64},
  };
  c.kind_frame_bytes = 32 * 1024;
  c.device_bytes_per_rank = std::uint64_t{frames} * c.kind_frame_bytes;
  c.host_bytes_per_rank = std::uint64_t{host_c4} * 2 * 64;
  return c;
}

}  // namespace ula::testing
