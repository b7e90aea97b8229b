// DeviceStep::StoreInto / Reload (ula/device_step.h, "The space between rounds"): an engine
// loop in which the device steps plan every group and the host space allocates, frees and
// shares between rounds, against the same loop over StepPlanner's engine path on a twin space (the
// same results, and the same space digest after every round); the refusals (a space changed
// behind the step's back, another space, unstored moves, a space past the step's maxima, a
// pending plan) change neither the space nor the step.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "step/device_step_fixture.h"
#include "step/space_fixture.h"
#include "test_seed.h"
#include "ula/device_step.h"
#include "ula/step_planner.h"

namespace ula {
namespace {

using testing::DeviceIo;
using testing::ExpectSameState;
using testing::Shape;
using testing::SmallConfig;

constexpr std::uint32_t kGroups = 2;
constexpr std::uint32_t kMaxBatch = 4, kTopK = 16;

AddressSpaceConfig LoopConfig(PolicyKind policy, std::uint32_t dev, std::uint32_t host) {
  AddressSpaceConfig cfg = SmallConfig(dev, host, 1, kGroups, 32);
  cfg.policy = policy;
  cfg.policy_options.recent_buckets = 3;
  cfg.page_tokens = 8;
  cfg.stable_new_entries = true;
  return cfg;
}

DeviceStepConfig LoopStepConfig() {
  DeviceStepConfig dc;
  dc.max_rows = kMaxBatch;
  dc.max_batch = kMaxBatch;
  dc.max_top_k = kTopK;
  dc.max_addresses = 4096;
  dc.max_requests = 64;
  dc.max_adopted = 512;
  return dc;
}

// One batch of random selections over the live requests' own and adopted addresses.
struct Batch {
  Shape shape;
  std::vector<RequestId> requests;
  std::vector<std::int32_t> dense;
};
Batch RandomBatch(std::mt19937_64& rng, const AddressSpace& space, const std::vector<RequestId>& live) {
  Batch b;
  b.shape.batch = 1 + static_cast<std::uint32_t>(rng() % std::min<std::size_t>(kMaxBatch, live.size()));
  b.shape.top_k = kTopK;
  b.shape.sel_stride = b.shape.idx_stride = kTopK;
  b.dense.assign(std::size_t{b.shape.batch} * kTopK, -1);
  for (std::uint32_t r = 0; r < b.shape.batch; ++r) {
    const RequestId req = live[rng() % live.size()];
    b.requests.push_back(req);
    const auto addrs = space.AddressesOf(req).value();
    const std::uint32_t used = 1 + static_cast<std::uint32_t>(rng() % kTopK);
    for (std::uint32_t c = 0; c < used; ++c) {
      b.dense[std::size_t{r} * kTopK + c] = static_cast<std::int32_t>(addrs[rng() % addrs.size()].value());
    }
  }
  return b;
}

TEST(DeviceStepStore, ServesAnEngineLoopWithHostBookkeepingBetweenRounds) {
  ULA_TEST_SEEDED(seed, 20261203);
  std::mt19937_64 rng(seed);
  auto backend = MakeCountingBackend();
  auto ref = AddressSpace::Create(LoopConfig(PolicyKind::kPbLru, 48, 1024), *backend).value();
  auto twin = AddressSpace::Create(LoopConfig(PolicyKind::kKernelPbLru, 48, 1024), *backend).value();
  auto planner = StepPlanner::Create(*ref, EngineStepConfig{.max_batch = kMaxBatch, .max_q_len = 1, .max_top_k = kTopK})
                     .value();
  std::vector<RequestId> live;
  std::uint64_t next_id = 0;
  auto add_request = [&](std::uint32_t tokens) {
    const RequestId id(next_id++);
    ASSERT_TRUE(ref->AddRequest(id, Rank(0)));
    ASSERT_TRUE(twin->AddRequest(id, Rank(0)));
    auto a = ref->Allocate(id, tokens);
    auto b = twin->Allocate(id, tokens);
    ASSERT_TRUE(a && b);
    ASSERT_EQ(*a, *b);
    live.push_back(id);
  };
  for (int r = 0; r < 3; ++r) add_request(6 + static_cast<std::uint32_t>(rng() % 10));
  ref->AdvanceRound();
  twin->AdvanceRound();
  std::vector<std::unique_ptr<DeviceStep>> steps;
  for (std::uint32_t g = 0; g < kGroups; ++g) steps.push_back(DeviceStep::Create(*twin, Rank(0), GroupId(g), LoopStepConfig()).value());
  const std::vector<const std::uint32_t*> verdicts = {steps[0]->verdict(), steps[1]->verdict()};

  int planned = 0, refused = 0, failed = 0, evictions = 0, freed = 0, shared = 0;
  std::vector<CopyDescriptor> ref_desc(planner->max_descriptors() + 1);
  for (int round = 0; round < 40; ++round) {
    // The host's bookkeeping, the same on both spaces: a decode token per request, now and
    // then a new request, a finished one, a request adopting another's prefix.
    if (round > 0) {
      for (RequestId id : live) {
        auto a = ref->Allocate(id, 1);
        auto b = twin->Allocate(id, 1);
        ASSERT_EQ(a.has_value(), b.has_value());
        if (a) {
          ASSERT_EQ(*a, *b);
        }
      }
      if (rng() % 4 == 0 || live.size() < 2) add_request(4 + static_cast<std::uint32_t>(rng() % 12));
      if (rng() % 5 == 0 && live.size() > 2) {
        const std::size_t k = rng() % live.size();
        ASSERT_TRUE(ref->Free(live[k]));
        ASSERT_TRUE(twin->Free(live[k]));
        live.erase(live.begin() + static_cast<std::ptrdiff_t>(k));
        ++freed;
      }
      if (rng() % 5 == 0) {
        const auto src = ref->AddressesOf(live[rng() % live.size()]).value();
        const std::vector<LogicalAddr> prefix(src.begin(), src.begin() + std::min<std::size_t>(4, src.size()));
        const RequestId id(next_id++);
        ASSERT_TRUE(ref->AddRequest(id, Rank(0)));
        ASSERT_TRUE(twin->AddRequest(id, Rank(0)));
        ASSERT_TRUE(ref->ShareInto(id, prefix));
        ASSERT_TRUE(twin->ShareInto(id, prefix));
        ASSERT_EQ(ref->Allocate(id, 2).value(), twin->Allocate(id, 2).value());
        live.push_back(id);
        ++shared;
      }
    }
    for (auto& step : steps) ASSERT_TRUE(step->Reload(*twin, nullptr)) << "round " << round;
    // The round's steps: the device steps plan the twin, StepPlanner's engine path the reference.
    for (int s = 0; s < 3; ++s) {
      const GroupId g(static_cast<std::uint32_t>(rng() % kGroups));
      Batch b = RandomBatch(rng, *ref, live);
      std::vector<std::int32_t> ref_indices(b.dense.size(), -9);
      auto plan = planner->Plan(Rank(0), g, {b.shape.batch, 1, kTopK}, b.requests, b.dense, ref_indices, ref_desc);
      DeviceIo io;
      io.Fill(b.shape, b.dense, b.requests, steps[g.value()]->max_descriptors());
      ASSERT_TRUE(steps[g.value()]->Plan(io.arrays, nullptr));
      std::vector<std::uint8_t> status(steps[g.value()]->max_descriptors(), 0);
      if (!plan) {
        ++refused;
        ASSERT_EQ(io.record.error, 1 + static_cast<std::uint32_t>(plan.error().code())) << plan.error().ToString();
        ASSERT_TRUE(steps[g.value()]->Complete(status.data(), nullptr));
        continue;
      }
      ++planned;
      ASSERT_EQ(io.record.error, 0u) << "round " << round << " seed " << seed;
      ASSERT_EQ(io.record.num_descriptors, plan->num_descriptors);
      for (std::uint32_t i = 0; i < plan->num_descriptors; ++i) {
        ASSERT_EQ(std::memcmp(&io.descriptors[i], &ref_desc[i], sizeof(CopyDescriptor)), 0) << "descriptor " << i;
      }
      for (std::size_t i = 0; i < b.dense.size(); ++i) ASSERT_EQ(io.indices[i], ref_indices[i]) << "selection " << i;
      evictions += static_cast<int>(plan->stats.evictions);
      if (rng() % 3 == 0) {
        for (std::uint32_t i = 0; i < plan->num_descriptors; ++i) status[i] = rng() % 3 == 0 ? 1 : 0;
      }
      auto report = planner->Complete(plan->fence, std::span<const std::uint8_t>(status.data(), plan->num_descriptors));
      ASSERT_TRUE(report);
      failed += static_cast<int>(report->failed);
      ASSERT_TRUE(steps[g.value()]->Complete(status.data(), nullptr));
    }
    for (auto& step : steps) ASSERT_TRUE(step->StoreInto(*twin, nullptr)) << "round " << round;
    ref->AdvanceRound();
    twin->AdvanceRound();
    ASSERT_EQ(ref->DebugDigest(), twin->DebugDigest()) << "round " << round << " seed " << seed;
    auto inv = twin->CheckInvariants();
    ASSERT_TRUE(inv) << inv.error().ToString();
  }
  // Reload wrote into the buffers of Create: the pointers an engine captured stay valid.
  EXPECT_EQ(steps[0]->verdict(), verdicts[0]);
  EXPECT_EQ(steps[1]->verdict(), verdicts[1]);
  EXPECT_GT(planned, 60);
  EXPECT_GT(evictions, 20);
  EXPECT_GT(failed, 3);
  EXPECT_GT(freed, 2);
  EXPECT_GT(shared, 2);
  EXPECT_GT(planned + refused, 100);
}

// A host-only twin of one step: the space an engine changed behind the step's back.
struct OneStep {
  std::unique_ptr<Backend> backend = MakeCountingBackend();
  std::unique_ptr<AddressSpace> space;
  std::unique_ptr<DeviceStep> step;
  std::vector<LogicalAddr> addrs;
  explicit OneStep(const DeviceStepConfig& dc) {
    space = AddressSpace::Create(LoopConfig(PolicyKind::kKernelPbLru, 16, 256), *backend).value();
    EXPECT_TRUE(space->AddRequest(RequestId(1), Rank(0)));
    addrs = space->Allocate(RequestId(1), 40).value();  // 16 on device, the rest on host
    space->AdvanceRound();
    step = DeviceStep::Create(*space, Rank(0), GroupId(0), dc).value();
  }
  // One planned step over 8 host-resident addresses (16..39 went to host), its copies landed.
  void StepOnce() {
    std::vector<std::int32_t> dense(kTopK, -1);
    for (int i = 0; i < 8; ++i) dense[i] = static_cast<std::int32_t>(addrs[20 + i].value());
    DeviceIo io;
    io.Fill({.batch = 1, .q_len = 1, .top_k = kTopK, .sel_stride = kTopK, .idx_stride = kTopK}, dense, {RequestId(1)},
            step->max_descriptors());
    ASSERT_TRUE(step->Plan(io.arrays, nullptr));
    ASSERT_EQ(io.record.error, 0u);
    ASSERT_GT(io.record.misses, 0u);
    std::vector<std::uint8_t> ok(step->max_descriptors(), 0);
    ASSERT_TRUE(step->Complete(ok.data(), nullptr));
  }
};

TEST(DeviceStepStore, StoreIntoRefusesAChangedSpaceAndChangesNothing) {
  OneStep t(LoopStepConfig());
  t.StepOnce();
  // The engine allocated before storing: the step's moves and the space's change collide.
  ASSERT_TRUE(t.space->Allocate(RequestId(1), 1));
  const std::uint64_t digest = t.space->DebugDigest();
  const DeviceStepState before = t.step->ReadState(nullptr).value();
  auto st = t.step->StoreInto(*t.space, nullptr);
  ASSERT_FALSE(st);
  EXPECT_EQ(st.error().code(), ErrorCode::kFailedPrecondition);
  EXPECT_NE(st.error().ToString().find("changed since the step loaded it"), std::string::npos) << st.error().ToString();
  EXPECT_EQ(t.space->DebugDigest(), digest) << "a refused StoreInto changes nothing";
  ExpectSameState(before, t.step->ReadState(nullptr).value(), "a refused StoreInto keeps the step's state");
  EXPECT_EQ(t.step->Reload(*t.space, nullptr).error().code(), ErrorCode::kFailedPrecondition)
      << "the step's moves are not stored: no reload over them";
}

TEST(DeviceStepStore, StoreIntoRefusesAnotherSpaceOrAPendingPlan) {
  OneStep t(LoopStepConfig());
  OneStep other(LoopStepConfig());
  const std::uint64_t digest = other.space->DebugDigest();
  EXPECT_EQ(t.step->StoreInto(*other.space, nullptr).error().code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(t.step->Reload(*other.space, nullptr).error().code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(other.space->DebugDigest(), digest);
  std::vector<std::int32_t> dense(kTopK, -1);
  dense[0] = static_cast<std::int32_t>(t.addrs[30].value());
  DeviceIo io;
  io.Fill({.batch = 1, .q_len = 1, .top_k = kTopK, .sel_stride = kTopK, .idx_stride = kTopK}, dense, {RequestId(1)},
          t.step->max_descriptors());
  ASSERT_TRUE(t.step->Plan(io.arrays, nullptr));
  const std::uint64_t own = t.space->DebugDigest();
  EXPECT_EQ(t.step->StoreInto(*t.space, nullptr).error().code(), ErrorCode::kFailedPrecondition) << "a plan is pending";
  EXPECT_EQ(t.space->DebugDigest(), own);
  std::vector<std::uint8_t> ok(t.step->max_descriptors(), 0);
  ASSERT_TRUE(t.step->Complete(ok.data(), nullptr));
  ASSERT_TRUE(t.step->StoreInto(*t.space, nullptr));
  EXPECT_TRUE(t.space->Lookup(t.addrs[30], GroupId(0)).value().tier() == Tier::kDevice) << "the move is stored";
  auto inv = t.space->CheckInvariants();
  EXPECT_TRUE(inv) << inv.error().ToString();
}

TEST(DeviceStepStore, ReloadRefusesUnstoredMovesAndASpacePastTheMaxima) {
  DeviceStepConfig dc = LoopStepConfig();
  dc.max_addresses = 48;  // the space's 40 addresses in pages of 8, and one page more
  dc.max_requests = 3;
  OneStep t(dc);
  t.StepOnce();
  const DeviceStepState moved = t.step->ReadState(nullptr).value();
  auto st = t.step->Reload(*t.space, nullptr);
  ASSERT_FALSE(st);
  EXPECT_EQ(st.error().code(), ErrorCode::kFailedPrecondition);
  ExpectSameState(moved, t.step->ReadState(nullptr).value(), "a refused Reload drops no move");
  ASSERT_TRUE(t.step->StoreInto(*t.space, nullptr));
  ASSERT_TRUE(t.step->Reload(*t.space, nullptr)) << "stored: the step is clean";
  ExpectSameState(moved, t.step->ReadState(nullptr).value(), "store then reload is the same state");
  // One page more fits; a second does not (a new round: Allocate places them on device).
  t.space->AdvanceRound();
  ASSERT_TRUE(t.space->Allocate(RequestId(1), 8));
  ASSERT_TRUE(t.step->Reload(*t.space, nullptr));
  t.space->AdvanceRound();
  ASSERT_TRUE(t.space->Allocate(RequestId(1), 1));
  const DeviceStepState full = t.step->ReadState(nullptr).value();
  st = t.step->Reload(*t.space, nullptr);
  ASSERT_FALSE(st);
  EXPECT_EQ(st.error().code(), ErrorCode::kResourceExhausted);
  EXPECT_NE(st.error().ToString().find("max_addresses"), std::string::npos) << st.error().ToString();
  ExpectSameState(full, t.step->ReadState(nullptr).value(), "a refused Reload changes nothing");
  // Request ids past max_requests.
  OneStep r(dc);
  ASSERT_TRUE(r.space->AddRequest(RequestId(3), Rank(0)));
  st = r.step->Reload(*r.space, nullptr);
  ASSERT_FALSE(st);
  EXPECT_EQ(st.error().code(), ErrorCode::kResourceExhausted);
  EXPECT_NE(st.error().ToString().find("max_requests"), std::string::npos) << st.error().ToString();
  EXPECT_EQ(DeviceStep::Create(*r.space, Rank(0), GroupId(0), DeviceStepConfig{.max_requests = (1u << 24) + 1})
                .error()
                .code(),
            ErrorCode::kInvalidArgument);
}

}  // namespace
}  // namespace ula
