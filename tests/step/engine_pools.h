// Engine memory for the tests that run a step's descriptors themselves, as an engine's copy
// kernel would: one pool per (tier, group) of `slots` rows of `row` bytes (a group of one
// layer), registered with StepPlanner::RegisterEngineMemory or run on by a twin's executor.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <vector>

#include "ula/location.h"
#include "ula/step_arrays.h"
#include "ula/step_planner.h"

namespace ula::testing {

struct EnginePool {
  EnginePool(std::uint32_t slots, std::uint32_t row) : slots(slots), row(row), bytes(std::size_t{slots} * row) {}
  std::uint32_t slots = 0;
  std::uint32_t row = 0;
  std::vector<std::byte> bytes;
  std::byte* Row(std::uint32_t slot) { return bytes.data() + std::size_t{slot} * row; }
  EngineRegion Region() {
    return EngineRegion{reinterpret_cast<std::uintptr_t>(bytes.data()), std::uint64_t{slots} * row, row, 1, slots};
  }
};
using EngineMemory = std::vector<EnginePool>[kNumTiers];

// Runs one step's (or one Allocate's) descriptors on `mem`.
inline void RunOnEngineMemory(std::span<const CopyDescriptor> desc, EngineMemory& mem) {
  for (const CopyDescriptor& c : desc) {
    EnginePool& from = mem[c.src_tier][c.group];
    std::byte* src = from.Row(c.src_slot);
    std::byte* dst = mem[c.dst_tier][c.group].Row(c.dst_slot);
    switch (static_cast<CopyOp>(c.op)) {
      case CopyOp::kCopy: std::memcpy(dst, src, from.row); break;
      case CopyOp::kSwap: std::swap_ranges(src, src + from.row, dst); break;
      case CopyOp::kEvict:
        std::memcpy(mem[static_cast<int>(Tier::kHost)][c.group].Row(c.evict_slot), dst, from.row);
        std::memcpy(dst, src, from.row);
        break;
    }
  }
}

}  // namespace ula::testing
