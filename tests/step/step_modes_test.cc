// Which step form runs which mode: one table over every cell of {DP, TP attention at home,
// TP local buffer} x {host library path, host engine path, device step} x the modes that
// decide it (the base mode: stable new entries, no host shadows, kernel_pb_lru, no kinds;
// then one of them changed at a time). Each cell either runs or is refused at the form's
// Create with the ErrorCode and reason the table states (docs/ARCHITECTURE.md, "Which form
// runs which mode", is this table). A cell that runs takes a short seeded workload through
// the verifier of its topology (src/verify/consistency_verifier.h, src/verify/tp_verifier.h),
// or, for a space with kinds, Create and one step over the request's C4 entries (ula verify
// --model runs the DP verifier over them; tests/step/kind_step_test.cc the loops). A refused cell is created directly from a space in that mode, so
// the table pins the forms' own refusals, not the verifier's.
#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "step/device_step_fixture.h"
#include "test_seed.h"
#include "v4_flash.h"
#include "ula/address_space.h"
#include "ula/backend.h"
#include "ula/device_step.h"
#include "ula/step_planner.h"
#include "ula/tp_address_space.h"
#include "ula/tp_step_planner.h"
#include "verify/consistency_verifier.h"
#include "verify/tp_verifier.h"

namespace ula {
namespace {

#if defined(ULA_EXPENSIVE_CHECKS) || defined(__SANITIZE_THREAD__)
constexpr std::uint64_t kDpOps = 60;
constexpr std::uint64_t kTpOps = 20;
#else
constexpr std::uint64_t kDpOps = 200;
constexpr std::uint64_t kTpOps = 60;
#endif

enum class Topology { kDp, kTpAtHome, kTpLocalBuffer };
enum class Form { kLibrary, kEngine, kDevice };
// The base mode, or the one field changed from it.
enum class Mode { kBase, kUnstableNewEntries, kHostShadows, kPbLru, kKinds };

struct Cell {
  Topology topology;
  Form form;
  Mode mode;
  bool runs;
  ErrorCode code;      // when refused
  const char* reason;  // when refused: a substring of the message
};

constexpr ErrorCode kNone = ErrorCode::kInternal;  // unused: the cell runs
constexpr ErrorCode kPrecondition = ErrorCode::kFailedPrecondition;
constexpr ErrorCode kUnsupported = ErrorCode::kUnsupported;
constexpr const char* kStable = "stable_new_entries is off";
constexpr const char* kShadows = "host_shadows is on";
constexpr const char* kPolicy = "policy kernel_pb_lru";
constexpr const char* kAtHome = "covers attention at home";
constexpr const char* kTpKinds = "TP step over a space with kinds";
constexpr const char* kLocalKinds = "local_buffer with kinds";  // refused by the space's Create

using enum Topology;
using enum Form;
using enum Mode;
// The table. A TP space with kinds at home runs the host steps (library and engine paths)
// and the device step refuses it; a local buffer with kinds is refused by the space's own
// Create (the one mode the library path refuses). Where a space is in two modes a
// form refuses, the first of its checks names it: the device step checks host shadows, then stable new entries, then (TP) the attention, then the policy.
constexpr Cell kCells[] = {
    {kDp, kLibrary, kBase, true, kNone, ""},
    {kDp, kEngine, kBase, true, kNone, ""},
    {kDp, kDevice, kBase, true, kNone, ""},
    {kDp, kLibrary, kUnstableNewEntries, true, kNone, ""},
    {kDp, kEngine, kUnstableNewEntries, false, kPrecondition, kStable},
    {kDp, kDevice, kUnstableNewEntries, false, kPrecondition, kStable},
    {kDp, kLibrary, kHostShadows, true, kNone, ""},
    {kDp, kEngine, kHostShadows, true, kNone, ""},
    {kDp, kDevice, kHostShadows, false, kUnsupported, kShadows},
    {kDp, kLibrary, kPbLru, true, kNone, ""},
    {kDp, kEngine, kPbLru, true, kNone, ""},
    {kDp, kDevice, kPbLru, false, kPrecondition, kPolicy},
    {kDp, kLibrary, kKinds, true, kNone, ""},
    {kDp, kEngine, kKinds, true, kNone, ""},
    {kDp, kDevice, kKinds, true, kNone, ""},

    {kTpAtHome, kLibrary, kBase, true, kNone, ""},
    {kTpAtHome, kEngine, kBase, true, kNone, ""},
    {kTpAtHome, kDevice, kBase, true, kNone, ""},
    {kTpAtHome, kLibrary, kUnstableNewEntries, true, kNone, ""},
    {kTpAtHome, kEngine, kUnstableNewEntries, false, kPrecondition, kStable},
    {kTpAtHome, kDevice, kUnstableNewEntries, false, kPrecondition, kStable},
    {kTpAtHome, kLibrary, kHostShadows, true, kNone, ""},
    {kTpAtHome, kEngine, kHostShadows, true, kNone, ""},
    {kTpAtHome, kDevice, kHostShadows, false, kUnsupported, kShadows},
    {kTpAtHome, kLibrary, kPbLru, true, kNone, ""},
    {kTpAtHome, kEngine, kPbLru, true, kNone, ""},
    {kTpAtHome, kDevice, kPbLru, false, kPrecondition, kPolicy},
    {kTpAtHome, kLibrary, kKinds, true, kNone, ""},
    {kTpAtHome, kEngine, kKinds, true, kNone, ""},
    {kTpAtHome, kDevice, kKinds, false, kUnsupported, kTpKinds},

    {kTpLocalBuffer, kLibrary, kBase, true, kNone, ""},
    {kTpLocalBuffer, kEngine, kBase, true, kNone, ""},
    {kTpLocalBuffer, kDevice, kBase, false, kPrecondition, kAtHome},
    {kTpLocalBuffer, kLibrary, kUnstableNewEntries, true, kNone, ""},
    {kTpLocalBuffer, kEngine, kUnstableNewEntries, false, kPrecondition, kStable},
    {kTpLocalBuffer, kDevice, kUnstableNewEntries, false, kPrecondition, kStable},
    {kTpLocalBuffer, kLibrary, kHostShadows, true, kNone, ""},
    {kTpLocalBuffer, kEngine, kHostShadows, true, kNone, ""},
    {kTpLocalBuffer, kDevice, kHostShadows, false, kUnsupported, kShadows},
    {kTpLocalBuffer, kLibrary, kPbLru, true, kNone, ""},
    {kTpLocalBuffer, kEngine, kPbLru, true, kNone, ""},
    {kTpLocalBuffer, kDevice, kPbLru, false, kPrecondition, kAtHome},
    {kTpLocalBuffer, kLibrary, kKinds, false, kUnsupported, kLocalKinds},
    {kTpLocalBuffer, kEngine, kKinds, false, kUnsupported, kLocalKinds},
    {kTpLocalBuffer, kDevice, kKinds, false, kUnsupported, kLocalKinds},
};

std::string Name(const Cell& c) {
  static constexpr const char* kTopologies[] = {"dp", "tp_at_home", "tp_local_buffer"};
  static constexpr const char* kForms[] = {"library", "engine", "device"};
  static constexpr const char* kModes[] = {"base", "unstable_new_entries", "host_shadows", "pb_lru", "kinds"};
  return std::string(kTopologies[static_cast<int>(c.topology)]) + "/" + kForms[static_cast<int>(c.form)] + "/" +
         kModes[static_cast<int>(c.mode)];
}

PlannerForm VerifierForm(Form f) {
  return f == kLibrary ? PlannerForm::kHost : f == kEngine ? PlannerForm::kEngine : PlannerForm::kDevice;
}

// The mode's three fields of a space config (kinds aside).
struct Fields {
  bool stable_new_entries, host_shadows;
  PolicyKind policy;
};
Fields FieldsOf(Mode m) {
  return {m != kUnstableNewEntries, m == kHostShadows, m == kPbLru ? PolicyKind::kPbLru : PolicyKind::kKernelPbLru};
}

// A running cell: the verifier of its topology, a short seeded workload with device pressure.
void RunThroughVerifier(const Cell& cell, std::uint64_t seed) {
  const Fields f = FieldsOf(cell.mode);
  if (cell.topology == kDp) {
    VerifierConfig c;
    c.seed = seed;
    c.ops = kDpOps;
    c.form = VerifierForm(cell.form);
    c.policy = f.policy;
    c.stable_new_entries = f.stable_new_entries;
    c.host_shadows = f.host_shadows;
    c.group_layers = 2;
    c.device_slots_per_group = 128;
    c.host_slots_per_group = 2048;
    c.top_k = 16;
    auto r = RunConsistencyVerifier(c);
    ASSERT_TRUE(r) << r.error().ToString();
    for (const auto& failure : r->first_failures) ADD_FAILURE() << failure;
    EXPECT_TRUE(r->ok());
    EXPECT_GT(r->steps, 0u);
    return;
  }
  TpVerifierConfig c;
  c.seed = seed;
  c.ops = kTpOps;
  c.num_ranks = 2;
  c.top_k = 16;
  c.initial_requests = 8;
  c.device_slots_per_group = 2 * c.max_batch * c.queries_per_request * c.top_k / c.num_ranks;
  c.attention = cell.topology == kTpAtHome ? TpAttention::kAtHome : TpAttention::kLocalBuffer;
  c.form = VerifierForm(cell.form);
  c.policy = f.policy;
  c.stable_new_entries = f.stable_new_entries;
  c.host_shadows = f.host_shadows;
  auto r = RunTpVerifier(c);
  ASSERT_TRUE(r) << r.error().ToString();
  for (const auto& failure : r->first_failures) ADD_FAILURE() << failure;
  EXPECT_TRUE(r->ok());
  EXPECT_GT(r->steps, 0u);
}

// A TP space with kinds at home (V4-Flash over two ranks): Create and one step of group 0
// over the request's C4 entries, each read on its home a mod P (fresh entries: hits).
void RunTpWithKinds(const Cell& cell) {
  auto backend = MakeCpuBackend({.copy_threads = 1});
  const AddressSpaceConfig flash = test::FlashSpaceConfig(64, 1024, 3);
  TpConfig config;
  config.num_ranks = 2;
  config.num_groups = flash.num_groups;
  config.entry_bytes = flash.entry_bytes;
  config.device_bytes_per_rank = flash.device_bytes_per_rank;
  config.host_bytes_per_rank = flash.host_bytes_per_rank;
  config.page_tokens = flash.page_tokens;
  config.kinds = flash.kinds;
  config.attention = TpAttention::kAtHome;
  config.stable_new_entries = true;
  auto space = TpAddressSpace::Create(config, *backend);
  ASSERT_TRUE(space) << space.error().ToString();
  TpAddressSpace& s = **space;
  const RequestId request(1);
  ASSERT_TRUE(s.AddRequest(request));
  auto made = s.Allocate(request, 64);  // 16 C4 entries
  ASSERT_TRUE(made) << made.error().ToString();
  ASSERT_EQ(made->size(), 16u);
  if (cell.form == kLibrary) {
    TpStepPlanner planner(s);
    const SelectionRun run{request, static_cast<std::uint32_t>(made->size())};
    auto step = planner.Step(GroupId(0), *made, {&run, 1});
    ASSERT_TRUE(step) << step.error().ToString();
    for (std::size_t h = 0; h < step->ranks.size(); ++h) {
      for (std::size_t i = 0; i < made->size(); ++i) {
        const bool home = (*made)[i].value() % 2 == step->ranks[h].value();
        EXPECT_EQ(step->refs[h][i].source == TpReadRef::Source::kShard, home) << "selection " << i;
      }
    }
    return;
  }
  auto planner = TpStepPlanner::Create(s, {.max_batch = 1, .max_q_len = 1, .max_top_k = 16});
  ASSERT_TRUE(planner) << planner.error().ToString();
  std::vector<std::int32_t> selections;
  for (LogicalAddr a : *made) selections.push_back(static_cast<std::int32_t>(a.value()));
  std::vector<std::int32_t> indices(2 * selections.size(), -7);
  std::vector<CopyDescriptor> descriptors((*planner)->max_descriptors());
  auto plan = (*planner)->Plan(GroupId(0), {.batch = 1, .q_len = 1, .top_k = 16}, {&request, 1}, selections, indices,
                               descriptors);
  ASSERT_TRUE(plan) << plan.error().ToString();
  EXPECT_EQ(plan->num_descriptors, 0u);
  auto done = (*planner)->Complete(plan->fence, {});
  ASSERT_TRUE(done) << done.error().ToString();
  for (std::size_t i = 0; i < selections.size(); ++i) {  // rank r's row: its home's slots, -1 elsewhere
    for (std::uint32_t r = 0; r < 2; ++r) {
      EXPECT_EQ(indices[r * selections.size() + i] >= 0, selections[i] % 2 == static_cast<std::int32_t>(r));
    }
  }
}

// A space with kinds: Create and one step of group 0 over the request's C4 entries (fresh
// entries, on device: hits, no copies).
void RunWithKinds(const Cell& cell) {
  if (cell.topology != kDp) return RunTpWithKinds(cell);
  auto backend = MakeCpuBackend({.copy_threads = 1});
  AddressSpaceConfig config = test::FlashSpaceConfig(64, 1024, 3);
  config.policy = PolicyKind::kKernelPbLru;
  auto space = AddressSpace::Create(config, *backend);
  ASSERT_TRUE(space) << space.error().ToString();
  AddressSpace& s = **space;
  const RequestId request(1);
  ASSERT_TRUE(s.AddRequest(request, Rank(0)));
  auto made = s.Allocate(request, 64);  // 16 C4 entries
  ASSERT_TRUE(made) << made.error().ToString();
  ASSERT_EQ(made->size(), 16u);
  if (cell.form == kDevice) {
    auto step = DeviceStep::Create(s, Rank(0), GroupId(0), {.max_top_k = 16});
    ASSERT_TRUE(step) << step.error().ToString();
    testing::DeviceIo io;
    std::vector<std::int32_t> selections;
    for (LogicalAddr a : *made) selections.push_back(static_cast<std::int32_t>(a.value()));
    io.Fill({.batch = 1, .q_len = 1, .top_k = 16, .sel_stride = 16, .idx_stride = 16}, selections, {request},
            (*step)->max_descriptors());
    ASSERT_TRUE((*step)->Plan(io.arrays, nullptr));
    EXPECT_EQ(io.record.error, 0u);
    EXPECT_EQ(io.record.num_descriptors, 0u);
    EXPECT_EQ(io.record.hits, made->size());
    std::vector<std::uint8_t> status((*step)->max_descriptors(), 0);
    ASSERT_TRUE((*step)->Complete(status.data(), nullptr));
    ASSERT_TRUE((*step)->StoreInto(s, nullptr));
    for (std::int32_t i : io.indices) EXPECT_GE(i, 0);
    return;
  }
  if (cell.form == kLibrary) {
    StepPlanner planner(s);
    const SelectionRun run{request, static_cast<std::uint32_t>(made->size())};
    std::vector<SlotId> slots(made->size());
    auto st = planner.Step(StepInput{Rank(0), GroupId(0), *made, {&run, 1}}, slots);
    ASSERT_TRUE(st) << st.error().ToString();
    EXPECT_EQ(st->hits, made->size());
    return;
  }
  auto planner = StepPlanner::Create(s, {.max_batch = 1, .max_q_len = 1, .max_top_k = 16});
  ASSERT_TRUE(planner) << planner.error().ToString();
  std::vector<std::int32_t> selections;
  for (LogicalAddr a : *made) selections.push_back(static_cast<std::int32_t>(a.value()));
  std::vector<std::int32_t> indices(selections.size(), -7);
  std::vector<CopyDescriptor> descriptors((*planner)->max_descriptors());
  auto plan = (*planner)->Plan(Rank(0), GroupId(0), {.batch = 1, .q_len = 1, .top_k = 16}, {&request, 1}, selections,
                               indices, descriptors);
  ASSERT_TRUE(plan) << plan.error().ToString();
  EXPECT_EQ(plan->num_descriptors, 0u);
  auto done = (*planner)->Complete(plan->fence, {});
  ASSERT_TRUE(done) << done.error().ToString();
  for (std::int32_t i : indices) EXPECT_GE(i, 0);
}

// A refused cell: its form's Create from a space in that mode.
Status CreateRefused(const Cell& cell) {
  auto backend = MakeCpuBackend({.copy_threads = 1});
  const Fields f = FieldsOf(cell.mode);
  if (cell.topology == kDp) {
    AddressSpaceConfig config;
    if (cell.mode == kKinds) {
      config = test::FlashSpaceConfig(64, 1024, 3);
    } else {
      config.entry_bytes = 64;
      config.device_bytes_per_rank = 64 * 128;
      config.host_bytes_per_rank = 64 * 1024;
      config.stable_new_entries = f.stable_new_entries;
      config.host_shadows = f.host_shadows;
    }
    config.policy = f.policy;
    auto space = AddressSpace::Create(config, *backend);
    if (!space) return MakeError(ErrorCode::kInternal, "the space: " + space.error().ToString());
    if (cell.form == kEngine) {
      auto made = StepPlanner::Create(**space, {});
      return made ? Ok() : Status(std::unexpected(made.error()));
    }
    auto made = DeviceStep::Create(**space, Rank(0), GroupId(0), {});
    return made ? Ok() : Status(std::unexpected(made.error()));
  }
  TpConfig config;
  config.num_ranks = 2;
  config.entry_bytes = 64;
  config.device_bytes_per_rank = 64 * 128;
  config.host_bytes_per_rank = 64 * 1024;
  if (cell.mode == kKinds) {  // V4-Flash's kinds over two ranks (tp_address_space.h, "Kinds")
    const AddressSpaceConfig flash = test::FlashSpaceConfig(64, 1024, 3);
    config.num_groups = flash.num_groups;
    config.entry_bytes = flash.entry_bytes;
    config.device_bytes_per_rank = flash.device_bytes_per_rank;
    config.host_bytes_per_rank = flash.host_bytes_per_rank;
    config.kinds = flash.kinds;
  }
  config.attention = cell.topology == kTpAtHome ? TpAttention::kAtHome : TpAttention::kLocalBuffer;
  config.buffer_bytes_per_rank = cell.topology == kTpAtHome ? 0 : std::uint64_t{128} * config.entry_bytes * config.num_groups;
  config.policy = f.policy;
  config.buffer_policy = f.policy;
  config.stable_new_entries = f.stable_new_entries;
  config.host_shadows = f.host_shadows;
  auto space = TpAddressSpace::Create(config, *backend);
  if (!space && cell.mode == kKinds) return std::unexpected(space.error());  // the local buffer with kinds
  if (!space) return MakeError(ErrorCode::kInternal, "the space: " + space.error().ToString());
  if (cell.form == kEngine) {
    auto made = TpStepPlanner::Create(**space, {});
    return made ? Ok() : Status(std::unexpected(made.error()));
  }
  auto made = DeviceStep::Create(**space, Rank(0), GroupId(0), {});
  return made ? Ok() : Status(std::unexpected(made.error()));
}

TEST(StepModes, EveryCellRunsOrIsRefusedAtCreateWithItsReason) {
  ULA_TEST_SEEDED(seed, 20261209);
  for (const Cell& cell : kCells) {
    SCOPED_TRACE(Name(cell));
    if (!cell.runs) {
      ASSERT_TRUE(cell.form != kLibrary || (cell.mode == kKinds && cell.topology == kTpLocalBuffer))
          << "the library path refuses no mode but a TP local buffer with kinds";
      const Status st = CreateRefused(cell);
      ASSERT_FALSE(st) << "expected a refusal at Create";
      EXPECT_EQ(st.error().code(), cell.code) << st.error().ToString();
      EXPECT_NE(st.error().message().find(cell.reason), std::string::npos) << st.error().ToString();
    } else if (cell.mode == kKinds) {
      RunWithKinds(cell);
    } else {
      RunThroughVerifier(cell, seed);
    }
  }
}

// The table covers every cell once: 3 forms x 5 modes in DP and in each TP topology.
TEST(StepModes, TheTableCoversEveryCell) {
  std::vector<std::string> seen;
  for (const Cell& cell : kCells) {
    for (const std::string& s : seen) EXPECT_NE(s, Name(cell)) << "listed twice";
    seen.push_back(Name(cell));
  }
  EXPECT_EQ(seen.size(), 3u * 5 + 2 * 3u * 5);
}

}  // namespace
}  // namespace ula
