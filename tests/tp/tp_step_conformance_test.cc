// The step's conformance suite in TP mode (tests/step/step_conformance_test.cc has DP): the
// TP verifier (src/verify/tp_verifier.h) runs one seeded workload over four in-process ranks
// under device pressure, with injected faults, with shared prefixes, with drafts rolled back
// (Truncate) and with decodes admitted by round reservations (ReserveRound), in every TP mode and
// form: attention at home by the host reference (TpStepPlanner), the engine path
// (TpStepPlanner) and the device step (one DeviceStep per rank, their verdicts agreed);
// the local buffer by the host reference and the engine path. Every run must keep every byte (each rank's refs read the shadow bytes,
// attention at home merges to the dense reference), lose nothing to faults and keep
// isolation, and every form must make the host reference's decisions on the same seed (the
// same counts of steps, refusals, home misses and swaps, selections left to their home,
// failed calls, shares). A mode a form cannot run is refused with the reason (the device
// step with a local buffer, the engine forms without stable new entries, the
// device step without kernel_pb_lru).
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <string>

#include "step/device_io.h"
#include "test_seed.h"
#include "verify/tp_verifier.h"

namespace ula {
namespace {

constexpr std::uint64_t kFullOps = 220;
#if defined(ULA_EXPENSIVE_CHECKS) || defined(__SANITIZE_THREAD__)
constexpr std::uint64_t kOps = 100;
#else
constexpr std::uint64_t kOps = kFullOps;
#endif

TpVerifierConfig Conformance(std::uint64_t seed, TpAttention attention, PlannerForm form) {
  TpVerifierConfig c;
  c.seed = seed;
  c.ops = kOps;
  c.num_ranks = 4;
  c.top_k = 16;
  c.initial_requests = 24;
  // A rank's share of one round's selections: the pools hold less than the workload.
  c.device_slots_per_group = 2 * c.max_batch * c.queries_per_request * c.top_k / c.num_ranks;
  c.attention = attention;
  c.form = form;
  c.policy = PolicyKind::kKernelPbLru;  // the device step's policy
  c.stable_new_entries = true;          // the engine path's mode, so that every form runs it
  return c;
}

struct Counts {
  std::uint64_t steps, rejected, home_misses, home_swaps, left_to_home, failed_calls, shares, rollbacks, reserved,
      deferred;
  bool operator==(const Counts&) const = default;
};
Counts CountsOf(const TpVerifierReport& r) {
  return {r.steps,       r.rejected_steps,  r.home_misses,  r.home_swaps,           r.left_to_home,
          r.failed_calls, r.shares, r.draft_rollbacks, r.reservations, r.reservations_refused};
}
std::string Describe(const Counts& c) {
  return "steps " + std::to_string(c.steps) + ", refused " + std::to_string(c.rejected) + ", home misses " +
         std::to_string(c.home_misses) + ", swaps " + std::to_string(c.home_swaps) + ", left to home " +
         std::to_string(c.left_to_home) + ", failed " + std::to_string(c.failed_calls) + ", shares " +
         std::to_string(c.shares) + ", rollbacks " + std::to_string(c.rollbacks) + ", reserved " +
         std::to_string(c.reserved) + ", deferred " + std::to_string(c.deferred);
}

TpVerifierReport RunOk(const TpVerifierConfig& c, const char* what) {
  auto report = RunTpVerifier(c);
  EXPECT_TRUE(report) << what << ": " << report.error().ToString();
  if (!report) return {};
  for (const auto& f : report->first_failures) ADD_FAILURE() << what << ": " << f;
  EXPECT_TRUE(report->ok()) << what;
  std::printf("%s %s %s: %s; entries checked %llu, attention checks %llu\n", what,
              c.attention == TpAttention::kAtHome ? "at_home" : "local_buffer", PlannerFormName(c.form),
              Describe(CountsOf(*report)).c_str(), static_cast<unsigned long long>(report->entries_checked),
              static_cast<unsigned long long>(report->attention_checks));
  return *report;
}

struct Scenario {
  const char* name;
  double fault_rate;
  std::uint32_t share_percent;
  std::uint32_t draft_reject_percent = 0;  // drafts rolled back (Truncate)
  bool reserve_rounds = false;             // decodes admitted by ReserveRound
  void ApplyTo(TpVerifierConfig& c) const {
    c.share_percent = share_percent;
    c.draft_reject_percent = draft_reject_percent;
    c.reserve_rounds = reserve_rounds;
    if (reserve_rounds) c.device_slots_per_group = c.top_k * c.queries_per_request;  // rounds that do not always fit
  }
  void ExpectExercised(const TpVerifierReport& r) const {
    if (fault_rate > 0) {
      EXPECT_GT(r.failed_calls, 0u) << name;
    }
    if (share_percent > 0) {
      EXPECT_GT(r.shares, 0u) << name;
    }
    if (draft_reject_percent > 0) {
      EXPECT_GT(r.draft_rollbacks, 0u) << name;
    }
    if (reserve_rounds) {
      EXPECT_GT(r.reservations, 0u) << name;
    }
    // The short sanitizer runs may defer none.
    if (reserve_rounds && kOps >= kFullOps) {
      EXPECT_GT(r.reservations_refused, 0u) << name;
    }
  }
};
// No multi-layer scenario here: a TP group has no layer count (TpConfig::entry_bytes is one
// group entry, all its layers, and a TP descriptor moves it whole as one row: DeviceStep::Read
// sets num_layers 1), so the rows of a layered entry are DP's (step_conformance_test.cc,
// MultiLayerGroups).
constexpr Scenario kScenarios[] = {{"pressure", 0, 0},
                                   {"faults", 0.1, 0},
                                   {"sharing", 0, 40},
                                   {"drafts", 0, 20, 40},
                                   {"reservations", 0, 0, 0, true}};

// Local buffers: the host reference and the engine path (TpStepPlanner, Plan with its
// two phases of copies, Complete) make the same decisions.
TEST(TpStepConformance, LocalBufferFormsMakeTheSameDecisions) {
  ULA_TEST_SEEDED(seed, 20261207);
  for (const Scenario& s : kScenarios) {
    TpVerifierConfig c = Conformance(seed, TpAttention::kLocalBuffer, PlannerForm::kHost);
    c.fault_rate = s.fault_rate / 4;  // the local buffer's path fails more often per fault
    s.ApplyTo(c);
    const TpVerifierReport reference = RunOk(c, s.name);
    EXPECT_GT(reference.home_swaps, 0u) << s.name;
    EXPECT_GT(reference.remote_fetches, 0u) << s.name;
    s.ExpectExercised(reference);
    c.form = PlannerForm::kEngine;
    const TpVerifierReport engine = RunOk(c, s.name);
    EXPECT_EQ(engine.entries_lost, 0u) << s.name;
    EXPECT_EQ(engine.early_publishes, 0u) << s.name;
    EXPECT_EQ(CountsOf(engine), CountsOf(reference))
        << s.name << ": engine " << Describe(CountsOf(engine)) << " vs the reference's " << Describe(CountsOf(reference));
  }
}

// Attention at home: the host reference, the engine path and the device step (one per rank, verdicts agreed) make the same decisions.
TEST(TpStepConformance, AttentionAtHomeFormsMakeTheSameDecisions) {
  ULA_TEST_SEEDED(seed, 20261208);
  for (const Scenario& s : kScenarios) {
    TpVerifierConfig c = Conformance(seed, TpAttention::kAtHome, PlannerForm::kHost);
    c.fault_rate = s.fault_rate;
    s.ApplyTo(c);
    const TpVerifierReport reference = RunOk(c, s.name);
    EXPECT_GT(reference.home_swaps, 0u) << s.name;
    EXPECT_GT(reference.left_to_home, 0u) << s.name;
    EXPECT_GT(reference.attention_checks, 0u) << s.name;
    s.ExpectExercised(reference);
    for (PlannerForm f : {PlannerForm::kEngine, PlannerForm::kDevice}) {
      c.form = f;
      const TpVerifierReport r = RunOk(c, s.name);
      EXPECT_EQ(r.entries_lost, 0u) << s.name;
      EXPECT_EQ(r.early_publishes, 0u) << s.name;
      EXPECT_EQ(CountsOf(r), CountsOf(reference)) << s.name << ": " << PlannerFormName(f) << " "
                                                  << Describe(CountsOf(r)) << " vs the reference's "
                                                  << Describe(CountsOf(reference));
    }
  }
}

// Attention at home on a GPU: the device step's CUDA form (one per rank, verdicts agreed)
// makes the host reference's decisions in every scenario. Skipped where no CUDA device is;
// scripts/gpu-check.sh runs it on a GPU, where a skip fails the check.
TEST(TpStepConformance, AttentionAtHomeCudaFormMakesTheSameDecisions) {
  if (!DeviceIo::Create(true, DeviceIoShape{})) GTEST_SKIP() << "no CUDA device";
  ULA_TEST_SEEDED(seed, 20261208);
  for (const Scenario& s : kScenarios) {
    TpVerifierConfig c = Conformance(seed, TpAttention::kAtHome, PlannerForm::kHost);
    c.fault_rate = s.fault_rate;
    s.ApplyTo(c);
    const TpVerifierReport reference = RunOk(c, s.name);
    c.form = PlannerForm::kDevice;
    c.cuda = true;
    const TpVerifierReport r = RunOk(c, s.name);
    EXPECT_EQ(r.entries_lost, 0u) << s.name;
    EXPECT_EQ(r.early_publishes, 0u) << s.name;
    EXPECT_EQ(CountsOf(r), CountsOf(reference)) << s.name << ": device (CUDA) " << Describe(CountsOf(r))
                                                << " vs the reference's " << Describe(CountsOf(reference));
  }
}

TEST(TpStepConformance, RefusedWithTheReason) {
  TpVerifierConfig c = Conformance(1, TpAttention::kLocalBuffer, PlannerForm::kDevice);
  auto r = RunTpVerifier(c);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(r.error().message().find("at home"), std::string::npos) << r.error().ToString();
  for (PlannerForm f : {PlannerForm::kEngine, PlannerForm::kDevice}) {
    c = Conformance(1, TpAttention::kAtHome, f);
    c.stable_new_entries = false;
    r = RunTpVerifier(c);
    ASSERT_FALSE(r) << PlannerFormName(f);
    EXPECT_EQ(r.error().code(), ErrorCode::kFailedPrecondition) << PlannerFormName(f);
    EXPECT_NE(r.error().message().find("stable_new_entries"), std::string::npos) << r.error().ToString();
  }
  c = Conformance(1, TpAttention::kAtHome, PlannerForm::kDevice);
  c.policy = PolicyKind::kPbLru;
  r = RunTpVerifier(c);
  ASSERT_FALSE(r);
  EXPECT_NE(r.error().message().find("kernel_pb_lru"), std::string::npos) << r.error().ToString();
}

}  // namespace
}  // namespace ula
