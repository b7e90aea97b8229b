// The step's conformance suite (DP): every form of the step (docs/ARCHITECTURE.md, "The step's
// forms today") runs the same seeded workload through the consistency verifier
// (src/verify/consistency_verifier.h): requests arrive, grow, rewrite their entries, share
// cached prefixes and finish; steps select overlapping top-k sets under device pressure so
// that victims swap; drafts are rolled back (Truncate) and decodes admitted by round
// reservations (ReserveRound); after every step each selected entry's bytes are compared with the
// shadow copy in every layer's row, Read() and CheckInvariants() are checked, refused steps
// and bad input must change nothing, and injected copy faults must lose nothing and publish
// nothing early.
//
// The forms: the serial host step, the reference (StepPlanner), the engine path (StepPlanner::Plan, copies, Complete) and the device step's OpenMP
// form (DeviceStep: Reload, Plan, copies, Complete, StoreInto), and on a GPU the device step's
// CUDA form (the cells named deviceCuda; skipped where no device is, run by
// scripts/gpu-check.sh). They must agree, not only
// pass: on the same seed every form makes the same decisions, so the counts of steps,
// refusals, hits, fetches and swaps are the host reference's. A form that cannot run a mode is
// refused at its Create with the reason (RefusalsAtCreate), never switched silently. The
// groups hold two layers each, four in MultiLayerGroups (with a larger entry).
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <string>

#include "step/device_io.h"
#include "test_seed.h"
#include "verify/consistency_verifier.h"

namespace ula {
namespace {

constexpr std::uint64_t kFullOps = 1200;
#if defined(ULA_EXPENSIVE_CHECKS) || defined(__SANITIZE_THREAD__) || defined(ULA_VERIFIER_TEST_SANITIZER_OPS)
constexpr std::uint64_t kOps = 350;
#else
constexpr std::uint64_t kOps = kFullOps;
#endif

// The mode every form can run: the engine path's (stable new entries, exclusive tiers), the
// policy the device step keeps in flat arrays, two ranks, two groups of two layers each (a
// descriptor must move both rows of an entry), a device pool small enough to swap.
VerifierConfig Conformance(std::uint64_t seed, PlannerForm form) {
  VerifierConfig c;
  c.seed = seed;
  c.ops = kOps;
  c.form = form;
  c.policy = PolicyKind::kKernelPbLru;
  c.stable_new_entries = true;
  c.group_layers = 2;
  c.entry_bytes = 64;
  c.device_slots_per_group = 256;
  c.host_slots_per_group = 4096;
  c.top_k = 32;
  return c;
}

struct Counts {
  std::uint64_t steps, rejected, hits, fetches, swaps, failed_calls, shares, rollbacks, reserved, deferred;
  bool operator==(const Counts&) const = default;
};
Counts CountsOf(const VerifierReport& r) {
  return {r.steps, r.rejected_steps, r.hits, r.fetches, r.swaps, r.failed_calls, r.shares, r.draft_rollbacks,
          r.reservations, r.reservations_refused};
}
std::string Describe(const Counts& c) {
  return "steps " + std::to_string(c.steps) + ", refused " + std::to_string(c.rejected) + ", hits " +
         std::to_string(c.hits) + ", fetches " + std::to_string(c.fetches) + ", swaps " + std::to_string(c.swaps) +
         ", failed " + std::to_string(c.failed_calls) + ", shares " + std::to_string(c.shares) + ", rollbacks " +
         std::to_string(c.rollbacks) + ", reserved " + std::to_string(c.reserved) + ", deferred " +
         std::to_string(c.deferred);
}

VerifierReport RunOk(const VerifierConfig& c, const char* what) {
  auto report = RunConsistencyVerifier(c);
  EXPECT_TRUE(report) << what << ": " << report.error().ToString();
  if (!report) return {};
  for (const auto& f : report->first_failures) ADD_FAILURE() << what << " (" << PlannerFormName(c.form) << "): " << f;
  EXPECT_TRUE(report->ok()) << what << " (" << PlannerFormName(c.form) << ")";
  std::printf("%s %-8s %s; entries checked %llu\n", what, PlannerFormName(c.form), Describe(CountsOf(*report)).c_str(),
              static_cast<unsigned long long>(report->entries_checked));
  return *report;
}

// A cell of the suite: a form, and for the device step its CUDA form (on a GPU).
struct Cell {
  PlannerForm form;
  bool cuda = false;
};
class StepConformance : public ::testing::TestWithParam<Cell> {
 protected:
  // The CUDA cell needs a device: skipped without one (scripts/gpu-check.sh runs the cells
  // on a GPU, where a skip of a test named Cuda fails the check).
  void SetUp() override {
    if (GetParam().cuda && !DeviceIo::Create(true, DeviceIoShape{})) GTEST_SKIP() << "no CUDA device";
  }
  // `c` run in this cell's form.
  static VerifierConfig InCell(VerifierConfig c) {
    c.form = GetParam().form;
    c.cuda = GetParam().cuda;
    return c;
  }
};

// Pressure: every form keeps every byte and decides as the host reference does.
TEST_P(StepConformance, SameDecisionsUnderPressure) {
  ULA_TEST_SEEDED(seed, 20261204);
  const VerifierReport reference = RunOk(Conformance(seed, PlannerForm::kHost), "pressure");
  const VerifierReport r = RunOk(InCell(Conformance(seed, PlannerForm::kHost)), "pressure");
  EXPECT_GT(r.swaps, kOps / 20) << "the workload must swap for the check to mean anything";
  EXPECT_EQ(CountsOf(r), CountsOf(reference)) << Describe(CountsOf(r)) << " vs the reference's "
                                              << Describe(CountsOf(reference));
}

// Injected copy faults: a failed copy publishes nothing and loses nothing, in every form, and
// every form fails the same steps (the fault plan is a function of the seed and the batches).
TEST_P(StepConformance, FaultsLoseNothing) {
  ULA_TEST_SEEDED(seed, 20261205);
  VerifierConfig c = Conformance(seed, PlannerForm::kHost);
  c.fault_rate = 0.15;
  const VerifierReport reference = RunOk(c, "faults");
  const VerifierReport r = RunOk(InCell(c), "faults");
  EXPECT_GT(r.failed_calls, 0u);
  EXPECT_EQ(r.entries_lost, 0u);
  EXPECT_EQ(r.early_publishes, 0u);
  EXPECT_EQ(CountsOf(r), CountsOf(reference)) << Describe(CountsOf(r)) << " vs the reference's "
                                              << Describe(CountsOf(reference));
}

// Shared prefixes (adopted addresses, a SparsePrefixCache per rank): isolation holds and
// every sharer reads its bytes in every form.
TEST_P(StepConformance, SharedPrefixes) {
  ULA_TEST_SEEDED(seed, 20261206);
  VerifierConfig c = Conformance(seed, PlannerForm::kHost);
  c.share_percent = 40;
  c.form = PlannerForm::kHost;
  const VerifierReport reference = RunOk(c, "sharing");
  const VerifierReport r = RunOk(InCell(c), "sharing");
  EXPECT_GT(r.shares, 0u);
  EXPECT_GT(r.sharer_checks, 0u);
  EXPECT_EQ(CountsOf(r), CountsOf(reference)) << Describe(CountsOf(r)) << " vs the reference's "
                                              << Describe(CountsOf(reference));
}

// Drafts rolled back: a share of the decodes first truncates 1..3 of the request's last
// tokens (rejected drafts that steps may have selected and moved), with shared prefixes
// (whose entries no rollback reaches): every form decides as the host reference does.
TEST_P(StepConformance, DraftsRolledBack) {
  ULA_TEST_SEEDED(seed, 20261210);
  VerifierConfig c = Conformance(seed, PlannerForm::kHost);
  c.draft_reject_percent = 40;
  c.share_percent = 20;
  const VerifierReport reference = RunOk(c, "drafts");
  const VerifierReport r = RunOk(InCell(c), "drafts");
  EXPECT_GT(r.draft_rollbacks, kOps / 50);
  EXPECT_EQ(CountsOf(r), CountsOf(reference)) << Describe(CountsOf(r)) << " vs the reference's "
                                              << Describe(CountsOf(reference));
}

// Round reservations: a decode allocates only once ReserveRound admitted it, so a form whose
// rounds used other slots would admit other decodes; every form decides as the host
// reference does.
TEST_P(StepConformance, RoundsReserved) {
  ULA_TEST_SEEDED(seed, 20261211);
  VerifierConfig c = Conformance(seed, PlannerForm::kHost);
  c.reserve_rounds = true;
  const VerifierReport reference = RunOk(c, "reservations");
  const VerifierReport r = RunOk(InCell(c), "reservations");
  EXPECT_GT(r.reservations, 0u);
  if (kOps >= kFullOps) {  // the short sanitizer runs may defer none
    EXPECT_GT(r.reservations_refused, 0u) << "the workload must defer decodes for the check to mean anything";
  }
  EXPECT_EQ(CountsOf(r), CountsOf(reference)) << Describe(CountsOf(r)) << " vs the reference's "
                                              << Describe(CountsOf(reference));
}

// Groups of four layers and a larger entry (four rows of 128 bytes), with copy faults and
// drafts rolled back: a descriptor must move every layer's row of its entry, a failed one
// publish none of them, and every form decides as the host reference does. The sanitizer
// trees run it at a fifth of their ops (it checks four rows per entry).
TEST_P(StepConformance, MultiLayerGroups) {
  ULA_TEST_SEEDED(seed, 20261212);
  VerifierConfig c = Conformance(seed, PlannerForm::kHost);
  c.ops = kOps >= kFullOps ? kOps : kOps / 5;
  c.group_layers = 4;
  c.entry_bytes = 512;
  c.fault_rate = 0.1;
  c.draft_reject_percent = 20;
  const VerifierReport reference = RunOk(c, "layers");
  const VerifierReport r = RunOk(InCell(c), "layers");
  EXPECT_GT(r.swaps, c.ops / 20) << "the workload must swap for the check to mean anything";
  EXPECT_GT(r.failed_calls, 0u);
  EXPECT_GT(r.draft_rollbacks, 0u);
  EXPECT_EQ(r.entries_lost, 0u);
  EXPECT_EQ(r.early_publishes, 0u);
  EXPECT_EQ(CountsOf(r), CountsOf(reference)) << Describe(CountsOf(r)) << " vs the reference's "
                                              << Describe(CountsOf(reference));
}

INSTANTIATE_TEST_SUITE_P(Forms, StepConformance,
                         ::testing::Values(Cell{PlannerForm::kHost}, Cell{PlannerForm::kEngine}, Cell{PlannerForm::kDevice},
                                           Cell{PlannerForm::kDevice, true}),
                         [](const auto& info) {
                           return std::string(PlannerFormName(info.param.form)) + (info.param.cuda ? "Cuda" : "");
                         });

// Host shadows, with injected faults: the engine path (its plans evict to shadows and to
// host slots of the victims' own, step_planner.h) decides as the host step does: the same
// steps, refusals, hits, fetches, swaps and evictions to a shadow, and loses nothing.
TEST(StepConformanceShadows, TheEnginePathDecidesAsTheHostStep) {
  ULA_TEST_SEEDED(seed, 20261207);
  for (double fault_rate : {0.0, 0.15}) {
    VerifierConfig c = Conformance(seed, PlannerForm::kHost);
    c.host_shadows = true;
    c.host_slots_per_group = 1200;  // room for evictions, and reclaimed shadows
    c.fault_rate = fault_rate;
    const VerifierReport reference = RunOk(c, "shadows");
    c.form = PlannerForm::kEngine;
    const VerifierReport r = RunOk(c, "shadows");
    EXPECT_GT(r.shadow_evictions, kOps / 20) << "the workload must evict to shadows for the check to mean anything";
    EXPECT_EQ(r.shadow_evictions, reference.shadow_evictions);
    EXPECT_EQ(r.entries_lost, 0u);
    EXPECT_EQ(r.early_publishes, 0u);
    EXPECT_EQ(CountsOf(r), CountsOf(reference)) << Describe(CountsOf(r)) << " vs the reference's "
                                                << Describe(CountsOf(reference));
  }
}

// A mode a form cannot run is refused when the form is created, with the reason; nothing
// switches the mode behind the caller's back.
TEST(StepConformanceRefusals, RefusalsAtCreate) {
  VerifierConfig c = Conformance(1, PlannerForm::kEngine);
  c.ops = 10;
  c.stable_new_entries = false;
  auto r = RunConsistencyVerifier(c);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code(), ErrorCode::kFailedPrecondition);
  EXPECT_NE(r.error().message().find("stable_new_entries"), std::string::npos) << r.error().ToString();

  c = Conformance(1, PlannerForm::kDevice);
  c.ops = 10;
  c.stable_new_entries = false;
  r = RunConsistencyVerifier(c);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code(), ErrorCode::kFailedPrecondition);
  EXPECT_NE(r.error().message().find("stable_new_entries"), std::string::npos) << r.error().ToString();

  c = Conformance(1, PlannerForm::kDevice);
  c.ops = 10;
  c.host_shadows = true;
  r = RunConsistencyVerifier(c);
  ASSERT_FALSE(r) << "the device step moves exclusive entries only";
  EXPECT_EQ(r.error().code(), ErrorCode::kUnsupported);
  EXPECT_NE(r.error().message().find("host_shadows"), std::string::npos) << r.error().ToString();

  c = Conformance(1, PlannerForm::kDevice);
  c.ops = 10;
  c.policy = PolicyKind::kPbLru;
  r = RunConsistencyVerifier(c);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code(), ErrorCode::kFailedPrecondition);
  EXPECT_NE(r.error().message().find("kernel_pb_lru"), std::string::npos) << r.error().ToString();

  EXPECT_EQ(ParsePlannerForm("gpu").error().code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(ParsePlannerForm("cpu").error().code(), ErrorCode::kInvalidArgument) << "the host form is named host";
  EXPECT_EQ(ParsePlannerForm("kernels").error().code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(ParsePlannerForm("host").value(), PlannerForm::kHost);
  EXPECT_EQ(ParsePlannerForm("device").value(), PlannerForm::kDevice);
}

}  // namespace
}  // namespace ula
