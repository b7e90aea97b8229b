// Shared configs of the unified-memory tests. One "unit" is 64 bytes.
#pragma once

#include "unified/fixed_split_allocator.h"
#include "ula/unified_buffer.h"

namespace ula::testing {

inline constexpr std::uint64_t kUnit = 64;
inline constexpr BlockKind kState(0);
inline constexpr BlockKind kKv(1);
inline constexpr BlockKind kSwa(2);

// state = 2 units (low end), kv page = 1 unit (high end), one padding page.
inline UnifiedBufferConfig TwoKindConfig(std::uint64_t units, std::uint32_t padding_pages = 1,
                                         CompactionMode mode = CompactionMode::kLazy) {
  UnifiedBufferConfig c;
  c.capacity_bytes = units * kUnit;
  c.alignment = kUnit;
  c.kinds = {{"state", 2 * kUnit, BufferEnd::kLow}, {"kv", kUnit, BufferEnd::kHigh}};
  c.padding_kind = kKv;
  c.padding_blocks = padding_pages;
  c.compaction = mode;
  return c;
}

inline FixedSplitConfig TwoKindFixed(std::uint64_t units, double state_fraction, std::uint32_t padding_pages = 1) {
  FixedSplitConfig c;
  c.capacity_bytes = units * kUnit;
  c.kinds = {{"state", 2 * kUnit, BufferEnd::kLow}, {"kv", kUnit, BufferEnd::kHigh}};
  c.fractions = {state_fraction, 1.0 - state_fraction};
  c.padding_kind = kKv;
  c.padding_blocks = padding_pages;
  return c;
}

inline Demand RequestDemand(std::uint32_t state_blocks, std::uint32_t kv_pages, std::size_t num_kinds = 2) {
  return Demand::Of(num_kinds).Add(kState, state_blocks).Add(kKv, kv_pages);
}

// Admits requests of `demand` until one does not fit; returns how many were admitted.
inline int AdmitUntilFull(HybridAllocator& a, const Demand& demand) {
  int admitted = 0;
  while (a.CanAllocate(demand)) {
    if (!a.AllocateDemand(demand)) return -1;  // CanAllocate lied
    ++admitted;
  }
  if (a.AllocateDemand(demand)) return -1;  // CanAllocate said no but it fit
  return admitted;
}

// Everything observable, to prove that a failed call changed nothing.
struct Snapshot {
  std::vector<BlockInfo> blocks;
  AllocatorStats stats;
  bool operator==(const Snapshot&) const = default;
};
inline Snapshot Take(const HybridAllocator& a) { return Snapshot{a.LiveBlocks(), a.Stats()}; }

}  // namespace ula::testing
