// Test helpers for the engine step API (step_planner.h), shared by its tests:
//   - EngineMemory: engine-owned memory of one pool, one buffer per layer
//     ([slots][layer_bytes] each, as vLLM and SGLang allocate a tensor per layer) at
//     unequally spaced addresses, registered through RegisterEngineMemory's layer_bases form;
//   - FaultStepSpace: a one-rank, one-group DP space on a fault-injecting backend (over the
//     cpu backend) with its planner, and the shadow bytes every live entry must read back.
//     Faults are armed only inside ArmedStep, so set-up and checks never fail.
#pragma once

#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <memory>
#include <vector>

#include "backend/fault_backend.h"
#include "step/space_fixture.h"
#include "ula/step_planner.h"

namespace ula::testing {

// One pool's memory, one buffer per layer as an engine allocates them: the layers lie in
// one arena in descending address order with unequal gaps (layer l after a gap of
// 64 * (l + 1) bytes), so that no base + l * stride describes them.
struct EngineMemory {
  std::uint32_t layers = 1;
  std::uint32_t layer_bytes = 0;
  std::uint32_t slots = 0;
  std::vector<std::byte> arena;
  std::vector<std::uintptr_t> bases;  // [layers]

  EngineMemory() = default;
  EngineMemory(std::uint32_t num_layers, std::uint32_t row_bytes, std::uint32_t num_slots)
      : layers(num_layers), layer_bytes(row_bytes), slots(num_slots) {
    const std::size_t size = std::size_t{slots} * layer_bytes;
    std::vector<std::size_t> offsets(layers);
    std::size_t end = 0;
    for (std::uint32_t k = 0; k < layers; ++k) {  // layer layers-1-k at the k-th position
      end += 64 * (layers - k);
      offsets[layers - 1 - k] = end;
      end += size;
    }
    arena.assign(end, std::byte{0});
    for (std::uint32_t l = 0; l < layers; ++l) bases.push_back(reinterpret_cast<std::uintptr_t>(arena.data() + offsets[l]));
  }
  std::byte* At(std::uint32_t l, std::uint32_t slot) {
    return reinterpret_cast<std::byte*>(bases[l]) + std::size_t{slot} * layer_bytes;
  }
  Status Register(StepPlanner& planner, Tier tier) const {
    return planner.RegisterEngineMemory(tier, Rank(0), GroupId(0), bases, layer_bytes, slots);
  }
  // The entry at `slot`: its layers' rows side by side.
  std::vector<std::byte> Entry(std::uint32_t slot) {
    std::vector<std::byte> out(std::size_t{layers} * layer_bytes);
    for (std::uint32_t l = 0; l < layers; ++l) std::memcpy(out.data() + l * layer_bytes, At(l, slot), layer_bytes);
    return out;
  }
  void SetEntry(std::uint32_t slot, std::span<const std::byte> entry) {
    for (std::uint32_t l = 0; l < layers; ++l) std::memcpy(At(l, slot), entry.data() + l * layer_bytes, layer_bytes);
  }
};

struct FaultStepSpace {
  std::uint32_t entry = 0;
  std::unique_ptr<Backend> cpu;
  std::unique_ptr<FaultInjectingBackend> faults;  // over cpu; disarmed outside ArmedStep
  std::unique_ptr<AddressSpace> space;
  std::unique_ptr<StepPlanner> planner;
  std::map<std::uint32_t, std::vector<std::byte>> shadow;  // [live address] the bytes it must read

  FaultStepSpace(const FaultPlan& plan, std::uint32_t device_slots, std::uint32_t host_slots,
                 std::uint32_t entry_bytes, const EngineStepConfig& ec, const CpuBackendOptions& cpu_options = {})
      : entry(entry_bytes), cpu(MakeCpuBackend(cpu_options)) {
    faults = MakeFaultInjectingBackend(*cpu, plan).value();
    faults->set_armed(false);
    space = AddressSpace::Create(EngineModes(SmallConfig(device_slots, host_slots, 1, 1, entry_bytes)), *faults).value();
    planner = StepPlanner::Create(*space, ec).value();
  }

  // n new entries of `request` (added on first use), written with Pattern(a, 0, entry,
  // version) and recorded in the shadow.
  std::vector<LogicalAddr> Append(RequestId request, std::uint32_t n, std::uint32_t version = 0) {
    if (!space->AddressesOf(request)) {
      EXPECT_TRUE(space->AddRequest(request, Rank(0)));
    }
    auto fresh = space->Allocate(request, n);
    EXPECT_TRUE(fresh) << fresh.error().ToString();
    if (!fresh) return {};
    for (LogicalAddr a : *fresh) {
      shadow[a.value()] = Pattern(a, 0, entry, version);
      EXPECT_TRUE(space->Write(a, GroupId(0), shadow[a.value()]));
    }
    return *fresh;
  }
  void Free(RequestId request) {
    const auto addrs = space->AddressesOf(request);
    ASSERT_TRUE(addrs);
    for (LogicalAddr a : *addrs) shadow.erase(a.value());
    EXPECT_TRUE(space->Free(request));
  }
  // One library Step with faults armed.
  Result<StepStats> ArmedStep(const StepShape& shape, std::span<const RequestId> requests,
                              std::span<const std::int32_t> selections, std::span<std::int32_t> indices) {
    faults->set_armed(true);
    auto r = planner->Step(Rank(0), GroupId(0), shape, requests, selections, indices);
    faults->set_armed(false);
    return r;
  }
  std::vector<Location> Locations(const std::vector<LogicalAddr>& addrs) const {
    std::vector<Location> out;
    for (LogicalAddr a : addrs) out.push_back(space->Lookup(a, GroupId(0)).value());
    return out;
  }
  // Every live entry reads its shadow bytes where the table says it is.
  ::testing::AssertionResult AllIntact() const {
    std::vector<std::byte> bytes(entry);
    for (const auto& [a, want] : shadow) {
      if (!space->Read(LogicalAddr(a), GroupId(0), bytes)) return ::testing::AssertionFailure() << "address " << a << " unreadable";
      if (bytes != want) return ::testing::AssertionFailure() << "address " << a << " does not read its bytes at its location";
    }
    return ::testing::AssertionSuccess();
  }
};

}  // namespace ula::testing
