// Engine memory for the tests that run a step's descriptors themselves, as an engine's copy
// kernel would: one pool per (tier, group) of `layers` regions of `slots` rows of `row` bytes
// (slot s of layer l at l * slots * row + s * row: the group's layers one after the other),
// registered with StepPlanner::RegisterEngineMemory or run on by a twin's executor.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <vector>

#include "ula/address_space.h"
#include "ula/error.h"
#include "ula/location.h"
#include "ula/step_arrays.h"
#include "ula/step_planner.h"

namespace ula::testing {

struct EnginePool {
  EnginePool(std::uint32_t slots, std::uint32_t row, std::uint32_t layers = 1)
      : slots(slots), row(row), layers(layers), bytes(std::size_t{slots} * row * layers) {}
  std::uint32_t slots = 0;
  std::uint32_t row = 0;
  std::uint32_t layers = 1;
  std::vector<std::byte> bytes;  // [layers][slots][row]
  std::byte* Row(std::uint32_t slot, std::uint32_t layer = 0) {
    return bytes.data() + (std::size_t{layer} * slots + slot) * row;
  }
  EngineRegion Region() {
    return EngineRegion{reinterpret_cast<std::uintptr_t>(bytes.data()), std::uint64_t{slots} * row, row, layers, slots};
  }
};
using EngineMemory = std::vector<EnginePool>[kNumTiers];

// Runs one step's (or one Allocate's) descriptors on `mem`, every layer of the group.
inline void RunOnEngineMemory(std::span<const CopyDescriptor> desc, EngineMemory& mem) {
  for (const CopyDescriptor& c : desc) {
    EnginePool& from = mem[c.src_tier][c.group];
    for (std::uint32_t l = 0; l < from.layers; ++l) {
      std::byte* src = from.Row(c.src_slot, l);
      std::byte* dst = mem[c.dst_tier][c.group].Row(c.dst_slot, l);
      switch (static_cast<CopyOp>(c.op)) {
        case CopyOp::kCopy: std::memcpy(dst, src, from.row); break;
        case CopyOp::kSwap: std::swap_ranges(src, src + from.row, dst); break;
        case CopyOp::kEvict:
          std::memcpy(mem[static_cast<int>(Tier::kHost)][c.group].Row(c.evict_slot, l), dst, from.row);
          std::memcpy(dst, src, from.row);
          break;
      }
    }
  }
}

// Allocate's victims moving in `mem` (AddressSpace::SetMoveExecutor), as the planner's registered
// memory does for a reference space: a twin's engine memory. REQUIRES: mem outlives the space's use.
inline AddressSpace::MoveExecutor MovesOnEngineMemory(EngineMemory& mem) {
  return [&mem](std::span<const CopyDescriptor> moves) -> Status {
    RunOnEngineMemory(moves, mem);
    return Ok();
  };
}

}  // namespace ula::testing
