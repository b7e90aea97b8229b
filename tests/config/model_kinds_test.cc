// The kinds of a space (ula/kv_kinds.h) and DeepSeek-V4-Flash's kinds built from its model
// config (config/model_kinds.h): each rule of a kind refused with the field named, the V4
// kinds with their granularity, lifetime, layers, rows and placement, and the step forms
// taking a space that holds them (the device step refusing only another mode's policy).
#include <gtest/gtest.h>

#include "ula/backend.h"
#include "config/model_kinds.h"
#include "ula/device_step.h"
#include "ula/step_planner.h"
#include "v4_flash.h"

namespace ula {
namespace {

ModelConfig Flash() { return test::FlashModel(); }

const KvKind& Named(const std::vector<KvKind>& kinds, std::string_view name) {
  for (const KvKind& k : kinds) {
    if (k.name == name) return k;
  }
  ADD_FAILURE() << "no kind " << name;
  return kinds.front();
}

TEST(ModelKinds, DeepSeekV4FlashHasEveryKindWithItsRowsAndPlacement) {
  const ModelConfig m = Flash();
  auto kinds = KindsOfModel(m, {.max_draft_tokens = 3});
  ASSERT_TRUE(kinds) << kinds.error().ToString();
  ASSERT_EQ(kinds->size(), 7u);
  const KvKind& window = Named(*kinds, "window");
  EXPECT_EQ(window.lifetime, KindLifetime::kRing);
  EXPECT_EQ(window.ring_tokens, 128u + 3u);  // the window plus the draft a round may roll back
  EXPECT_EQ(window.ring_draft_tokens, 3u);
  EXPECT_EQ(window.layers, 44u);             // 43 layers and the MTP layer
  EXPECT_EQ(window.row_bytes, 584u);         // SGLang's packed FP8 entry
  EXPECT_EQ(window.placement, KindPlacement::kResident);
  const KvKind& c4 = Named(*kinds, "c4");
  EXPECT_EQ(c4.tokens_per_entry, 4u);
  EXPECT_EQ(c4.layers, 21u);
  EXPECT_EQ(c4.placement, KindPlacement::kSparse);
  const KvKind& key = Named(*kinds, "c4_index_key");
  EXPECT_EQ(key.row_bytes, 132u);
  EXPECT_EQ(&(*kinds)[key.companion_of], &c4);
  EXPECT_EQ(key.placement, KindPlacement::kResident);
  const KvKind& c128 = Named(*kinds, "c128");
  EXPECT_EQ(c128.tokens_per_entry, 128u);
  EXPECT_EQ(c128.layers, 20u);
  EXPECT_EQ(c128.placement, KindPlacement::kResident);
  // Compressor state, FP32, [ratio * (1 + overlap), 2 * (1 + overlap) * width] per layer.
  const KvKind& s4 = Named(*kinds, "c4_state");
  EXPECT_EQ(s4.state_rows, 8u);
  EXPECT_EQ(s4.row_bytes, 2u * 2 * 512 * 4);
  EXPECT_EQ(Named(*kinds, "c4_index_state").row_bytes, 2u * 2 * 128 * 4);
  const KvKind& s128 = Named(*kinds, "c128_state");
  EXPECT_EQ(s128.state_rows, 128u);
  EXPECT_EQ(s128.row_bytes, 2u * 512 * 4);
  EXPECT_EQ(s128.lifetime, KindLifetime::kPerRequest);
  // Other formats change the rows, not the kinds.
  auto bf16 = KindsOfModel(m, {.kv_format = KvStorageFormat::kBf16, .index_format = IndexKeyFormat::kFp4});
  ASSERT_TRUE(bf16);
  EXPECT_EQ(Named(*bf16, "c4").row_bytes, 1024u);
  EXPECT_EQ(Named(*bf16, "c4_index_key").row_bytes, 68u);
}

TEST(ModelKinds, ASingleKindModelHasNoKinds) {
  auto m = LoadModelConfigByName("glm5", DefaultConfigDir());
  ASSERT_TRUE(m);
  auto kinds = KindsOfModel(*m, {});
  ASSERT_FALSE(kinds);
  EXPECT_EQ(kinds.error().code(), ErrorCode::kFailedPrecondition);
}

TEST(ModelKinds, TheSpaceConfigGroupsAreTheCompressedSparseLayers) {
  AddressSpaceConfig base;
  base.device_bytes_per_rank = 1 << 24;
  auto c = SpaceConfigOfModel(Flash(), {}, base);
  ASSERT_TRUE(c) << c.error().ToString();
  EXPECT_EQ(c->num_groups, 21u);  // layers_per_group 1: every CSA layer selects on its own
  EXPECT_EQ(c->row(), 584u);
  EXPECT_EQ(c->kinds.size(), 7u);
  EXPECT_TRUE(c->Validate()) << c->Validate().error().ToString();
}

// The kinds of a small valid space: a ring, a sparse kind with its companion, a state.
std::vector<KvKind> ValidKinds() {
  return {
      {.name = "window", .tokens_per_entry = 1, .lifetime = KindLifetime::kRing, .ring_tokens = 8, .layers = 2,
       .row_bytes = 32},
      {.name = "c4", .tokens_per_entry = 4, .lifetime = KindLifetime::kAppend, .layers = 2, .row_bytes = 32,
       .placement = KindPlacement::kSparse},
      {.name = "key", .tokens_per_entry = 4, .lifetime = KindLifetime::kAppend, .layers = 2, .row_bytes = 8,
       .companion_of = 1},
      {.name = "state", .tokens_per_entry = 4, .lifetime = KindLifetime::kPerRequest, .state_rows = 8, .layers = 2,
       .row_bytes = 64},
  };
}

TEST(KvKinds, EachRuleIsRefusedWithItsField) {
  ASSERT_TRUE(ValidateKinds(ValidKinds()));
  struct Case {
    const char* field;
    void (*breaks)(std::vector<KvKind>&);
  };
  const Case cases[] = {
      {"kinds[0].name", [](auto& k) { k[0].name.clear(); }},
      {"kinds[2].name", [](auto& k) { k[2].name = "c4"; }},
      {"kinds[1].tokens_per_entry", [](auto& k) { k[1].tokens_per_entry = 3; }},
      {"kinds[1].tokens_per_entry", [](auto& k) { k[1].tokens_per_entry = 256; }},
      {"kinds[1].tokens_per_entry", [](auto& k) { k[1].tokens_per_entry = 0; }},
      {"kinds[0].tokens_per_entry", [](auto& k) { k[0].tokens_per_entry = 4; }},  // a ring keeps tokens
      {"kinds[0].ring_tokens", [](auto& k) { k[0].ring_tokens = 0; }},
      {"kinds[1].ring_tokens", [](auto& k) { k[1].ring_tokens = 8; }},
      {"kinds[0].ring_draft_tokens", [](auto& k) { k[0].ring_draft_tokens = 8; }},  // no window left
      {"kinds[1].ring_draft_tokens", [](auto& k) { k[1].ring_draft_tokens = 1; }},  // drafts of no ring
      {"kinds[3].state_rows", [](auto& k) { k[3].state_rows = 0; }},
      {"kinds[1].state_rows", [](auto& k) { k[1].state_rows = 2; }},
      {"kinds[0].layers", [](auto& k) { k[0].layers = 0; }},
      {"kinds[0].row_bytes", [](auto& k) { k[0].row_bytes = 0; }},
      {"kinds[0].placement", [](auto& k) { k[0].placement = KindPlacement::kSparse; }},  // a sparse ring
      {"kinds[3].placement", [](auto& k) { k[3].placement = KindPlacement::kSparse; }},  // sparse state
      {"kinds[2].companion_of", [](auto& k) { k[2].companion_of = 2; }},                 // itself
      {"kinds[2].companion_of", [](auto& k) { k[2].companion_of = 3; }},                 // a later kind
      {"kinds[2].companion_of", [](auto& k) { k[2].tokens_per_entry = 1; }},             // another granularity
      {"kinds[2].companion_of", [](auto& k) { k[2].companion_of = 0; }},                 // a ring's companion
      {"kinds[2].placement", [](auto& k) {  // the companion sparse, its entry resident
         k[1].placement = KindPlacement::kResident, k[2].placement = KindPlacement::kSparse;
       }},
      {"kinds[3].companion_of", [](auto& k) { k[3] = k[2], k[3].name = "k2", k[3].companion_of = 2; }},
      {"kinds[3].placement", [](auto& k) {  // a second sparse kind
         k[3] = k[1], k[3].name = "c4b";
       }},
  };
  for (const Case& c : cases) {
    std::vector<KvKind> kinds = ValidKinds();
    c.breaks(kinds);
    const Status s = ValidateKinds(kinds);
    ASSERT_FALSE(s) << c.field;
    EXPECT_EQ(s.error().code(), ErrorCode::kInvalidArgument) << c.field;
    EXPECT_EQ(s.error().message().rfind(c.field, 0), 0u) << c.field << ": " << s.error().message();
  }
}

// A DP space with ValidKinds: its groups are the sparse kind's 2 layers, rows of 32 B.
AddressSpaceConfig KindsSpace() {
  AddressSpaceConfig c;
  c.entry_bytes = 64;
  c.row_bytes = 32;
  c.device_bytes_per_rank = 64 * 64;
  c.host_bytes_per_rank = 64 * 64;
  c.stable_new_entries = true;
  c.kinds = ValidKinds();
  return c;
}

TEST(KvKinds, TheSpaceGroupsMustHoldTheSparseKind) {
  ASSERT_TRUE(KindsSpace().Validate()) << KindsSpace().Validate().error().ToString();
  AddressSpaceConfig rows = KindsSpace();
  rows.row_bytes = 16;  // 4 rows of 16 B: the groups no longer hold 2 layers of 32 B
  const Status r = rows.Validate();
  ASSERT_FALSE(r);
  EXPECT_NE(r.error().message().find("AddressSpaceConfig.row_bytes"), std::string::npos) << r.error().message();
  AddressSpaceConfig layers = KindsSpace();
  layers.num_groups = 2;  // 4 layers over two groups, the kind has 2
  const Status l = layers.Validate();
  ASSERT_FALSE(l);
  EXPECT_NE(l.error().message().find("AddressSpaceConfig.num_groups"), std::string::npos) << l.error().message();
  AddressSpaceConfig none = KindsSpace();
  none.kinds[1].placement = KindPlacement::kResident;  // no sparse kind
  none.kinds.pop_back(), none.kinds.pop_back();        // (and no companion of it)
  const Status n = none.Validate();
  ASSERT_FALSE(n);
  EXPECT_NE(n.error().message().find("no sparse kind"), std::string::npos) << n.error().message();
  AddressSpaceConfig bad = KindsSpace();
  bad.kinds[0].ring_tokens = 0;
  auto refused = AddressSpace::Create(bad, *MakeCpuBackend({.copy_threads = 1}));
  ASSERT_FALSE(refused);
  EXPECT_NE(refused.error().message().find("kinds[0].ring_tokens"), std::string::npos);
}

// Every step form takes a space with kinds (the loops: tests/step/kind_step_test.cc). The
// device step refuses this one for its policy (pb_lru), as any space's, and takes it with
// kernel_pb_lru; neither Create changes the space.
TEST(KvKinds, EveryStepFormTakesASpaceWithKinds) {
  auto backend = MakeCpuBackend({.copy_threads = 1});
  auto space = AddressSpace::Create(KindsSpace(), *backend);
  ASSERT_TRUE(space) << space.error().ToString();
  AddressSpace& s = **space;
  ASSERT_TRUE(s.AddRequest(RequestId(1), Rank(0)));
  // Allocate makes the kinds' entries now (tests/step/kind_space_test.cc): four tokens, one C4 entry.
  auto allocated = s.Allocate(RequestId(1), 4);
  ASSERT_TRUE(allocated) << allocated.error().ToString();
  EXPECT_EQ(allocated->size(), 1u);
  const std::uint64_t before = s.DebugDigest();
  auto device = DeviceStep::Create(s, Rank(0), GroupId(0), {});
  ASSERT_FALSE(device);
  EXPECT_EQ(device.error().code(), ErrorCode::kFailedPrecondition);
  EXPECT_NE(device.error().message().find("kernel_pb_lru"), std::string::npos) << device.error().message();
  EXPECT_EQ(s.DebugDigest(), before);
  {
    AddressSpaceConfig kernel = KindsSpace();
    kernel.policy = PolicyKind::kKernelPbLru;
    auto other = AddressSpace::Create(kernel, *backend);
    ASSERT_TRUE(other) << other.error().ToString();
    ASSERT_TRUE((*other)->AddRequest(RequestId(1), Rank(0)));
    ASSERT_TRUE((*other)->Allocate(RequestId(1), 4));
    const std::uint64_t made = (*other)->DebugDigest();
    auto taken = DeviceStep::Create(**other, Rank(0), GroupId(0), {});
    ASSERT_TRUE(taken) << taken.error().ToString();
    EXPECT_EQ((*other)->DebugDigest(), made);
  }
  EXPECT_TRUE(StepPlanner::Create(s, {}));
  StepPlanner host(s);
  const std::span<const LogicalAddr> one = *s.AddressesOf(RequestId(1));
  const std::vector<SelectionRun> runs{{RequestId(1), 1}};
  std::vector<SlotId> slots(1);
  auto stepped = host.Step({Rank(0), GroupId(0), one, runs}, slots);
  ASSERT_TRUE(stepped) << stepped.error().ToString();
  EXPECT_EQ(stepped->hits, 1u);
  EXPECT_EQ(s.num_live_addresses(), 1u);
  EXPECT_TRUE(s.CheckInvariants());
}

}  // namespace
}  // namespace ula
