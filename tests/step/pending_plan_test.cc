// No abort from misuse (docs/ARCHITECTURE.md "Draft rollback and the engine
// step's contract with the scheduler"): between StepPlanner::Plan
// and Complete the space refuses every call that could change an entry, slot or victim the
// plan's descriptors name (Free, Truncate, Allocate, Write, ShareInto, Release, another
// planner's Plan, a StepPlanner's Step) with kFailedPrecondition and nothing changed; AdvanceRound keeps the
// plan valid (Complete publishes it into the next round). Before the refusal, a Free there
// made Complete abort the process (its ULA_CHECK on the wanted entries).
#include <gtest/gtest.h>

#include <vector>

#include "step/space_fixture.h"
#include "tp/tp_fixture.h"
#include "ula/address_space.h"
#include "ula/step_planner.h"
#include "ula/tp_address_space.h"
#include "ula/tp_step_planner.h"

namespace ula {
namespace {

template <class Space>
void ExpectEveryMutationRefused(Space& space, RequestId owner, std::span<const LogicalAddr> addrs) {
  const std::uint64_t before = space.DebugDigest();
  const std::vector<std::byte> bytes(space.config().entry_bytes);
  auto refused = [&](Status s, const char* call) {
    ASSERT_FALSE(s) << call;
    EXPECT_EQ(s.error().code(), ErrorCode::kFailedPrecondition) << call << ": " << s.error().ToString();
    EXPECT_NE(s.error().message().find("plan is pending"), std::string::npos) << s.error().ToString();
    EXPECT_EQ(space.DebugDigest(), before) << call;
  };
  refused(space.Free(owner), "Free");
  refused(space.Truncate(owner, 1), "Truncate");
  auto alloc = space.Allocate(owner, 1);
  refused(alloc ? Status{} : Status(std::unexpected(alloc.error())), "Allocate");
  refused(space.Write(addrs[0], GroupId(0), bytes), "Write");
  refused(space.ShareInto(RequestId(77), addrs.first(1)), "ShareInto");
  refused(space.Release(addrs.first(1)), "Release");
}

TEST(PendingPlan, EveryCallThatWouldInvalidateItIsRefusedAndChangesNothing) {
  auto backend = MakeCpuBackend();
  auto space = AddressSpace::Create(testing::EngineModes(testing::SmallConfig(4, 32)), *backend).value();
  auto planner = StepPlanner::Create(*space, {.max_batch = 1, .max_q_len = 1, .max_top_k = 4}).value();
  auto other = StepPlanner::Create(*space, {.max_batch = 1, .max_q_len = 1, .max_top_k = 4}).value();
  ASSERT_TRUE(space->AddRequest(RequestId(1), Rank(0)));
  ASSERT_TRUE(space->AddRequest(RequestId(77), Rank(0)));
  auto a = space->Allocate(RequestId(1), 12).value();
  for (LogicalAddr x : a) ASSERT_TRUE(space->Write(x, GroupId(0), testing::Pattern(x, 0, 32)));
  ASSERT_TRUE(space->Retain(std::span(a).first(1)));
  space->AdvanceRound();
  const std::vector<RequestId> rows{RequestId(1)};
  const std::vector<std::int32_t> sel{8, 9, 10, 11};  // on host: four descriptors
  std::vector<std::int32_t> idx(4), idx2(4);
  std::vector<CopyDescriptor> desc(planner->max_descriptors());
  auto plan = planner->Plan(Rank(0), GroupId(0), {1, 1, 4}, rows, sel, idx, desc);
  ASSERT_TRUE(plan) << plan.error().ToString();
  ASSERT_EQ(plan->num_descriptors, 4u);
  ExpectEveryMutationRefused(*space, RequestId(1), a);
  auto second = other->Plan(Rank(0), GroupId(0), {1, 1, 4}, rows, sel, idx2, desc);
  ASSERT_FALSE(second);
  EXPECT_EQ(second.error().code(), ErrorCode::kFailedPrecondition) << second.error().ToString();
  // The library path is the same plan: a StepPlanner's Step would claim the pending plan's
  // slots and victims again.
  StepPlanner library(*space);
  const std::vector<LogicalAddr> lib_sel{a[8], a[4]};
  const std::vector<SelectionRun> lib_runs{{RequestId(1), 2}};
  std::vector<SlotId> lib_out(2);
  const std::uint64_t before = space->DebugDigest();
  auto lib = library.Step({Rank(0), GroupId(0), lib_sel, lib_runs}, lib_out);
  ASSERT_FALSE(lib);
  EXPECT_EQ(lib.error().code(), ErrorCode::kFailedPrecondition) << lib.error().ToString();
  EXPECT_NE(lib.error().message().find("StepPlanner::Step"), std::string::npos) << lib.error().ToString();
  EXPECT_EQ(space->DebugDigest(), before);
  // AdvanceRound keeps the plan valid: Complete publishes it (into the next round).
  space->AdvanceRound();
  std::vector<std::uint8_t> status(plan->num_descriptors);
  planner->ExecuteOnEngineMemory(std::span(desc).first(plan->num_descriptors), status);  // none registered: all fail
  auto done = planner->Complete(plan->fence, status);
  ASSERT_TRUE(done) << done.error().ToString();
  EXPECT_EQ(done->failed, 4u);
  ASSERT_TRUE(space->CheckInvariants());
  // Completed: the calls run again.
  ASSERT_TRUE(space->Truncate(RequestId(1), 10));
  ASSERT_TRUE(space->Release(std::span(a).first(1)));
  ASSERT_TRUE(space->Free(RequestId(1)));
  EXPECT_TRUE(space->CheckInvariants());
}

TEST(PendingPlan, APlannerDestroyedWithAPlanPendingReleasesTheSpace) {
  auto backend = MakeCpuBackend();
  auto space = AddressSpace::Create(testing::EngineModes(testing::SmallConfig(4, 32)), *backend).value();
  ASSERT_TRUE(space->AddRequest(RequestId(1), Rank(0)));
  auto a = space->Allocate(RequestId(1), 4).value();
  space->AdvanceRound();
  {
    auto planner = StepPlanner::Create(*space, {.max_batch = 1, .max_q_len = 1, .max_top_k = 4}).value();
    const std::vector<RequestId> rows{RequestId(1)};
    const std::vector<std::int32_t> sel{0, 1, 2, 3};
    std::vector<std::int32_t> idx(4);
    std::vector<CopyDescriptor> desc(planner->max_descriptors());
    ASSERT_TRUE(planner->Plan(Rank(0), GroupId(0), {1, 1, 4}, rows, sel, idx, desc));  // all hits: nothing claimed
    EXPECT_FALSE(space->Free(RequestId(1)));
  }
  EXPECT_TRUE(space->Free(RequestId(1)));
}

TEST(PendingPlan, TpSpaceRefusesTheSameCallsWhileATpPlanIsPending) {
  auto backend = MakeCpuBackend();
  auto space = TpAddressSpace::Create(testing::TpEngineModes(testing::SmallTpConfig(2, 4, 32, 8)), *backend).value();
  auto planner = TpStepPlanner::Create(*space, {.max_batch = 1, .max_q_len = 1, .max_top_k = 4}).value();
  ASSERT_TRUE(space->AddRequest(RequestId(1)));
  ASSERT_TRUE(space->AddRequest(RequestId(77)));
  auto a = space->Allocate(RequestId(1), 20).value();
  ASSERT_TRUE(space->Retain(std::span(a).first(1)));
  space->AdvanceRound();
  const std::vector<RequestId> rows{RequestId(1)};
  const std::vector<std::int32_t> sel{static_cast<std::int32_t>(a[16].value()), static_cast<std::int32_t>(a[17].value()),
                                      static_cast<std::int32_t>(a[18].value()), static_cast<std::int32_t>(a[19].value())};
  std::vector<std::int32_t> idx(planner->ranks().size() * 4);
  std::vector<CopyDescriptor> desc(planner->max_descriptors());
  auto plan = planner->Plan(GroupId(0), {1, 1, 4}, rows, sel, idx, desc);
  ASSERT_TRUE(plan) << plan.error().ToString();
  ExpectEveryMutationRefused(*space, RequestId(1), a);
  std::vector<std::uint8_t> status(plan->num_descriptors);
  planner->ExecuteOnShards(std::span(desc).first(plan->num_descriptors), status);
  ASSERT_TRUE(planner->Complete(plan->fence, status));
  ASSERT_TRUE(space->Free(RequestId(1)));
  EXPECT_TRUE(space->CheckInvariants());
}

}  // namespace
}  // namespace ula
