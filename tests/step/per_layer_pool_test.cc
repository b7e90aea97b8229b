// UlaCache's own pools per layer, [slots padded to 64][row_bytes] for
// every layer of a group, groups of any layer count (GLM-5's last group of 2 layers, its
// 1-layer MTP group), descriptors in those coordinates (step_arrays.h), and FlashMLA's
// top-k % 64 rule when asked for.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "step/space_fixture.h"

#include "ula/address_space.h"
#include "ula/step_planner.h"

namespace ula {
namespace {

constexpr std::uint32_t kRow = 656;

// Row l of the entry of (a, g): the dense reference.
std::vector<std::byte> Entry(LogicalAddr a, std::uint32_t g, std::uint32_t layers) {
  std::vector<std::byte> v(std::size_t{layers} * kRow);
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = std::byte((a.value() * 37 + g * 101 + i * 7 + i / kRow) & 0xff);
  return v;
}

// Two groups: 2 layers and 1 layer of 656-byte rows; 100 device and 300 host slots each.
AddressSpaceConfig TwoAndOne() {
  AddressSpaceConfig c;
  c.num_groups = 2;
  c.row_bytes = kRow;
  c.group_layers = {2, 1};
  c.entry_bytes = 2 * kRow;  // the largest group's entry
  c.device_bytes_per_rank = 100ull * 3 * kRow;
  c.host_bytes_per_rank = 300ull * 3 * kRow;
  return c;
}

TEST(PerLayerPools, EachLayerIsAFlashMlaRegionAndEntriesReadBack) {
  auto backend = MakeCpuBackend();
  auto space = AddressSpace::Create(TwoAndOne(), *backend).value();
  ASSERT_EQ(space->config().device_slots_per_group(), 100u);
  ASSERT_EQ(space->config().host_slots_per_group(), 300u);
  ASSERT_TRUE(space->AddRequest(RequestId(1), Rank(0)));
  auto addrs = space->Allocate(RequestId(1), 150).value();
  const std::uint32_t layers[2] = {2, 1};
  for (LogicalAddr a : addrs) {
    for (std::uint32_t g = 0; g < 2; ++g) ASSERT_TRUE(space->Write(a, GroupId(g), Entry(a, g, layers[g])));
  }
  for (std::uint32_t g = 0; g < 2; ++g) {
    // Layer regions: 128 rows (100 slots padded to two 64-token blocks) of 656 bytes.
    EXPECT_EQ(space->DevicePoolBytes(Rank(0), GroupId(g)).size(), layers[g] * 128u * kRow);
    for (std::uint32_t l = 0; l < layers[g]; ++l) EXPECT_EQ(space->DeviceLayerBytes(Rank(0), GroupId(g), l).size(), 128u * kRow);
    EXPECT_TRUE(space->DeviceLayerBytes(Rank(0), GroupId(g), layers[g]).empty());
    for (LogicalAddr a : addrs) {
      const auto want = Entry(a, g, layers[g]);
      std::vector<std::byte> got(want.size());
      ASSERT_TRUE(space->Read(a, GroupId(g), got));
      ASSERT_EQ(got, want);
      const Location loc = space->Lookup(a, GroupId(g)).value();
      if (loc.tier() != Tier::kDevice) continue;
      // FlashMLA: k_cache[layer].view(num_blocks, 64, 1, 656)[slot / 64][slot % 64].
      for (std::uint32_t l = 0; l < layers[g]; ++l) {
        const std::byte* row = space->DeviceLayerBytes(Rank(0), GroupId(g), l).data() +
                               (std::size_t{loc.slot().value() / 64} * 64 + loc.slot().value() % 64) * kRow;
        ASSERT_EQ(std::memcmp(row, want.data() + l * kRow, kRow), 0) << "address " << a.value() << " layer " << l;
      }
    }
  }
  // The wrong entry size is refused and writes nothing.
  const LogicalAddr a0 = addrs[0];
  auto bad = space->Write(a0, GroupId(1), Entry(a0, 1, 2));
  ASSERT_FALSE(bad);
  EXPECT_EQ(bad.error().code(), ErrorCode::kInvalidArgument);
  std::vector<std::byte> got(kRow);
  ASSERT_TRUE(space->Read(a0, GroupId(1), got));
  EXPECT_EQ(got, Entry(a0, 1, 1));
  EXPECT_TRUE(space->CheckInvariants());
}

TEST(PerLayerPools, BadLayerConfigsAreRefusedByName) {
  auto backend = MakeCountingBackend();
  struct Case {
    const char* field;
    void (*mutate)(AddressSpaceConfig&);
  };
  const Case cases[] = {
      {"group_layers", [](AddressSpaceConfig& c) { c.group_layers = {2}; }},
      {"group_layers", [](AddressSpaceConfig& c) { c.group_layers = {2, 0}; }},
      {"entry_bytes", [](AddressSpaceConfig& c) { c.entry_bytes = 3 * kRow; }},
      {"row_bytes", [](AddressSpaceConfig& c) { c.row_bytes = 0; }},
      {"row_bytes", [](AddressSpaceConfig& c) { c.group_layers.clear(); c.row_bytes = 600; }},
  };
  for (const Case& c : cases) {
    AddressSpaceConfig config = TwoAndOne();
    c.mutate(config);
    auto space = AddressSpace::Create(config, *backend);
    ASSERT_FALSE(space) << c.field;
    EXPECT_EQ(space.error().code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(space.error().message().find(c.field), std::string::npos) << space.error().message();
  }
}

// Descriptors name slots; their offsets are slot * 656 in every layer's region, bytes one
// row, num_layers the group's layers. The library step moves the same rows, so a FlashMLA
// gather through the indices of either path reads the reference rows.
TEST(PerLayerPools, DescriptorsAreInPerLayerCoordinates) {
  auto backend = MakeCpuBackend();
  auto space = AddressSpace::Create(testing::EngineModes(TwoAndOne()), *backend).value();
  ASSERT_TRUE(space->AddRequest(RequestId(1), Rank(0)));
  auto addrs = space->Allocate(RequestId(1), 250).value();
  const std::uint32_t layers[2] = {2, 1};
  for (LogicalAddr a : addrs) {
    for (std::uint32_t g = 0; g < 2; ++g) ASSERT_TRUE(space->Write(a, GroupId(g), Entry(a, g, layers[g])));
  }
  space->AdvanceRound();
  auto planner = StepPlanner::Create(*space, {.max_batch = 1, .max_q_len = 1, .max_top_k = 64}).value();
  std::vector<std::int32_t> sel(64), idx(64);
  for (std::uint32_t k = 0; k < 64; ++k) sel[k] = static_cast<std::int32_t>(addrs[(k * 7) % 250].value());
  const std::vector<RequestId> rows{RequestId(1)};
  std::vector<CopyDescriptor> desc(planner->max_descriptors());
  for (std::uint32_t g = 0; g < 2; ++g) {
    // The engine path's plan, checked, then failed (nothing published) ...
    auto plan = planner->Plan(Rank(0), GroupId(g), {1, 1, 64}, rows, sel, idx, desc);
    ASSERT_TRUE(plan) << plan.error().ToString();
    ASSERT_GT(plan->num_descriptors, 0u);
    for (std::uint32_t i = 0; i < plan->num_descriptors; ++i) {
      const CopyDescriptor& d = desc[i];
      EXPECT_EQ(d.bytes, kRow);
      EXPECT_EQ(d.num_layers, layers[g]);
      EXPECT_EQ(d.src_offset, std::uint64_t{d.src_slot} * kRow);
      EXPECT_EQ(d.dst_offset, std::uint64_t{d.dst_slot} * kRow);
    }
    ASSERT_TRUE(planner->Complete(plan->fence, std::vector<std::uint8_t>(plan->num_descriptors, 1)));
    // ... then the library path moves them.
    auto st = planner->Step(Rank(0), GroupId(g), {1, 1, 64}, rows, sel, idx);
    ASSERT_TRUE(st) << st.error().ToString();
    EXPECT_EQ(st->bytes_moved % (std::uint64_t{layers[g]} * kRow), 0u);
    for (std::uint32_t k = 0; k < 64; ++k) {
      const auto want = Entry(LogicalAddr(static_cast<std::uint32_t>(sel[k])), g, layers[g]);
      for (std::uint32_t l = 0; l < layers[g]; ++l) {
        const std::byte* row = space->DeviceLayerBytes(Rank(0), GroupId(g), l).data() + std::size_t{static_cast<std::uint32_t>(idx[k])} * kRow;
        ASSERT_EQ(std::memcmp(row, want.data() + l * kRow, kRow), 0) << "group " << g << " layer " << l << " k " << k;
      }
    }
  }
  EXPECT_TRUE(space->CheckInvariants());
}

// Engine memory for groups of any layer count: 2 x 656 against the 2-layer group and
// 1 x 656 against the MTP-like 1-layer group; a region of the other group's shape is refused.
TEST(PerLayerPools, EngineRegionsOfEachGroupsLayerCount) {
  auto backend = MakeCountingBackend();
  auto space = AddressSpace::Create(testing::EngineModes(TwoAndOne()), *backend).value();
  auto planner = StepPlanner::Create(*space, {}).value();
  std::vector<std::byte> two(2ull * 128 * kRow), one(128ull * kRow);
  const auto base2 = reinterpret_cast<std::uintptr_t>(two.data()), base1 = reinterpret_cast<std::uintptr_t>(one.data());
  EXPECT_TRUE(planner->RegisterEngineMemory(Tier::kDevice, Rank(0), GroupId(0), {base2, 128ull * kRow, kRow, 2, 128}));
  EXPECT_TRUE(planner->RegisterEngineMemory(Tier::kDevice, Rank(0), GroupId(1), {base1, 128ull * kRow, kRow, 1, 128}));
  auto wrong = planner->RegisterEngineMemory(Tier::kDevice, Rank(0), GroupId(1), {base2, 128ull * kRow, kRow, 2, 128});
  ASSERT_FALSE(wrong);
  EXPECT_EQ(wrong.error().code(), ErrorCode::kInvalidArgument);
}

// FlashMLA's SM90 sparse decode reads index rows in tiles of 64: with top_k_multiple 64,
// any other top_k is refused and changes nothing.
TEST(PerLayerPools, TopKMultipleOf64IsEnforcedWhenAsked) {
  auto backend = MakeCpuBackend();
  auto space = AddressSpace::Create(testing::EngineModes(TwoAndOne()), *backend).value();
  ASSERT_TRUE(space->AddRequest(RequestId(1), Rank(0)));
  auto addrs = space->Allocate(RequestId(1), 100).value();
  EXPECT_FALSE(StepPlanner::Create(*space, {.max_top_k = 100, .top_k_multiple = 64}));
  auto planner = StepPlanner::Create(*space, {.max_top_k = 128, .top_k_multiple = 64}).value();
  std::vector<std::int32_t> sel(100, -1), idx(100);
  sel[0] = static_cast<std::int32_t>(addrs[0].value());
  const std::vector<RequestId> rows{RequestId(1)};
  const std::uint64_t before = space->DebugDigest();
  auto refused = planner->Step(Rank(0), GroupId(0), {1, 1, 100}, rows, sel, idx);
  ASSERT_FALSE(refused);
  EXPECT_EQ(refused.error().code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(refused.error().message().find("multiple of 64"), std::string::npos) << refused.error().ToString();
  EXPECT_EQ(space->DebugDigest(), before);
  sel.resize(64);
  idx.resize(64);
  EXPECT_TRUE(planner->Step(Rank(0), GroupId(0), {1, 1, 64}, rows, sel, idx));
}

}  // namespace
}  // namespace ula
