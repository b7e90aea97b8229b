// Layouts that agree or are refused (docs/INTEGRATION.md "Tensors"): engine memory whose
// layers, row bytes or slots disagree with the space's config is refused with the numbers,
// and the descriptors of a registered layout name its rows. The case: with no
// row_bytes a group is one 1,312-byte layer, and two 656-byte layers used to be accepted
// (only layers x bytes was compared) while the descriptors said one layer of 1,312 bytes.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "ula/address_space.h"
#include "ula/step_planner.h"

namespace ula {
namespace {

AddressSpaceConfig Config(std::uint32_t row_bytes, std::uint32_t slots) {
  AddressSpaceConfig c;
  c.entry_bytes = 1312;
  c.row_bytes = row_bytes;
  c.device_bytes_per_rank = std::uint64_t{slots} * 1312;
  c.host_bytes_per_rank = std::uint64_t{4 * slots} * 1312;
  c.stable_new_entries = true;
  return c;
}

TEST(EngineMemoryLayout, LayersRowsOrSlotsThatDisagreeWithTheConfigAreRefusedWithTheNumbers) {
  auto backend = MakeCountingBackend();
  std::vector<std::byte> mem(std::size_t{4} * 256 * 1312);
  const auto base = reinterpret_cast<std::uintptr_t>(mem.data());
  struct Case {
    std::uint32_t config_row, layers, layer_bytes, slots;
    const char* says;  // empty: accepted
  };
  for (const Case& k : {Case{0, 2, 656, 64, "2 layers of 656-byte rows, but the config's group is 1 layers of 1312"},
                        Case{0, 1, 1312, 64, ""},
                        Case{656, 1, 1312, 64, "1 layers of 1312-byte rows, but the config's group is 2 layers of 656"},
                        Case{656, 4, 328, 64, "4 layers of 328-byte rows"},
                        Case{656, 2, 656, 63, "63 slots per layer, but the device pool has 64"},
                        Case{656, 2, 656, 64, ""},
                        Case{656, 2, 656, 128, ""}}) {
    SCOPED_TRACE(k.says);
    auto space = AddressSpace::Create(Config(k.config_row, 64), *backend).value();
    auto planner = StepPlanner::Create(*space, {.max_batch = 1, .max_q_len = 1, .max_top_k = 4}).value();
    auto s = planner->RegisterEngineMemory(Tier::kDevice, Rank(0), GroupId(0),
                                           EngineRegion{base, std::uint64_t{k.slots} * k.layer_bytes, k.layer_bytes,
                                                        k.layers, k.slots});
    if (*k.says == '\0') {
      EXPECT_TRUE(s) << s.error().ToString();
    } else {
      ASSERT_FALSE(s);
      EXPECT_EQ(s.error().code(), ErrorCode::kInvalidArgument);
      EXPECT_NE(s.error().message().find(k.says), std::string::npos) << s.error().ToString();
    }
  }
}

// Two 656-byte layers registered for a config that says so: every descriptor names one
// row of 656 bytes per layer at slot * 656, and running them over the registered layers
// brings each entry's two rows to the slot its index names.
TEST(EngineMemoryLayout, DescriptorsDescribeTheRegisteredLayers) {
  auto backend = MakeCountingBackend();
  auto space = AddressSpace::Create(Config(656, 64), *backend).value();
  auto planner = StepPlanner::Create(*space, {.max_batch = 1, .max_q_len = 1, .max_top_k = 8}).value();
  std::vector<std::byte> dev(std::size_t{2} * 64 * 656), host(std::size_t{2} * 256 * 656);
  auto region = [](std::vector<std::byte>& m, std::uint32_t slots) {
    return EngineRegion{reinterpret_cast<std::uintptr_t>(m.data()), std::uint64_t{slots} * 656, 656, 2, slots};
  };
  ASSERT_TRUE(planner->RegisterEngineMemory(Tier::kDevice, Rank(0), GroupId(0), region(dev, 64)));
  ASSERT_TRUE(planner->RegisterEngineMemory(Tier::kHost, Rank(0), GroupId(0), region(host, 256)));
  ASSERT_TRUE(space->AddRequest(RequestId(1), Rank(0)));
  auto a = space->Allocate(RequestId(1), 100).value();  // 64 on device, 36 on host
  auto row = [&](Location loc, std::uint32_t l) {
    auto& m = loc.tier() == Tier::kDevice ? dev : host;
    const std::uint32_t slots = loc.tier() == Tier::kDevice ? 64 : 256;
    return m.data() + (std::size_t{l} * slots + loc.slot().value()) * 656;
  };
  for (LogicalAddr x : a) {
    for (std::uint32_t l = 0; l < 2; ++l) std::memset(row(space->Lookup(x, GroupId(0)).value(), l), int(x.value() * 2 + l), 656);
  }
  space->AdvanceRound();
  std::vector<std::int32_t> sel;
  for (std::uint32_t i = 90; i < 98; ++i) sel.push_back(static_cast<std::int32_t>(a[i].value()));
  std::vector<std::int32_t> idx(8);
  std::vector<CopyDescriptor> desc(planner->max_descriptors());
  const std::vector<RequestId> rows{RequestId(1)};
  auto plan = planner->Plan(Rank(0), GroupId(0), {1, 1, 8}, rows, sel, idx, desc);
  ASSERT_TRUE(plan) << plan.error().ToString();
  ASSERT_EQ(plan->num_descriptors, 8u);
  for (std::uint32_t i = 0; i < plan->num_descriptors; ++i) {
    EXPECT_EQ(desc[i].bytes, 656u);
    EXPECT_EQ(desc[i].num_layers, 2u);
    EXPECT_EQ(desc[i].src_offset, std::uint64_t{desc[i].src_slot} * 656);
    EXPECT_EQ(desc[i].dst_offset, std::uint64_t{desc[i].dst_slot} * 656);
  }
  std::vector<std::uint8_t> status(plan->num_descriptors);
  planner->ExecuteOnEngineMemory(std::span(desc).first(plan->num_descriptors), status);
  ASSERT_TRUE(planner->Complete(plan->fence, status));
  for (std::size_t k = 0; k < sel.size(); ++k) {
    for (std::uint32_t l = 0; l < 2; ++l) {
      const std::byte* r = dev.data() + (std::size_t{l} * 64 + static_cast<std::uint32_t>(idx[k])) * 656;
      EXPECT_EQ(r[0], std::byte(sel[k] * 2 + l)) << "selection " << k << " layer " << l;
      EXPECT_EQ(r[655], std::byte(sel[k] * 2 + l));
    }
  }
  EXPECT_TRUE(space->CheckInvariants());
}

}  // namespace
}  // namespace ula
