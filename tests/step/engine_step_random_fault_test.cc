// StepPlanner's engine path under faults: a library Step on a fault-injecting
// backend (src/backend/fault_backend.h), and a Complete with failed statuses on engine-run
// descriptors, publish nothing they did not copy and lose no entry's bytes: after every
// step, under random faults (seeded, printed), every live entry reads back its shadow
// bytes, and the indices of a step that succeeded read the selected entries.
#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <random>
#include <vector>

#include "step/engine_step_fixture.h"
#include "test_seed.h"

namespace ula {
namespace {

using testing::EngineMemory;
using testing::FaultStepSpace;
using testing::Pattern;
using testing::SmallConfig;

constexpr std::uint32_t kLayers = 2;
constexpr std::uint32_t kLayerBytes = 24;
constexpr std::uint32_t kEntry = kLayers * kLayerBytes;
constexpr std::uint32_t kRequests = 3;

// Random selections [batch = kRequests][q_len = 2][top_k = 8] of each row's request, with
// some padding.
std::vector<std::int32_t> Select(std::mt19937_64& rng, const std::vector<std::vector<LogicalAddr>>& addrs) {
  std::vector<std::int32_t> sel(kRequests * 2 * 8, kPadIndex);
  for (std::uint32_t r = 0; r < kRequests; ++r) {
    for (std::uint32_t q = 0; q < 2; ++q) {
      auto pool = addrs[r];
      std::shuffle(pool.begin(), pool.end(), rng);
      const std::uint32_t k = 8 - static_cast<std::uint32_t>(rng() % 3);
      for (std::uint32_t j = 0; j < k; ++j) sel[(r * 2 + q) * 8 + j] = static_cast<std::int32_t>(pool[j].value());
    }
  }
  return sel;
}

TEST(EngineStepFaults, LibraryStepPublishesNothingItDidNotCopyAndLosesNothing) {
  ULA_TEST_SEEDED(seed, 20261201);
  std::mt19937_64 rng(seed);
  FaultStepSpace f(FaultPlan{.seed = seed, .fail_fraction = 0.3, .partial = true}, /*device=*/48, /*host=*/160, kEntry,
                   {kRequests, 2, 8});
  std::vector<std::vector<LogicalAddr>> addrs(kRequests);
  std::vector<RequestId> requests;
  for (std::uint32_t r = 0; r < kRequests; ++r) {
    requests.push_back(RequestId(r));
    addrs[r] = f.Append(RequestId(r), 30);
  }
  f.space->AdvanceRound();
  const auto pool = [&] { return f.space->DevicePoolBytes(Rank(0), GroupId(0)); };
  std::uint32_t failed = 0, succeeded = 0;
  for (std::uint32_t step = 0; step < 60; ++step) {
    const auto sel = Select(rng, addrs);
    std::vector<std::int32_t> indices(sel.size(), kPadIndex);
    auto r = f.ArmedStep({kRequests, 2, 8}, requests, sel, indices);
    if (r) {
      ++succeeded;
      for (std::size_t i = 0; i < sel.size(); ++i) {
        ASSERT_EQ(indices[i] < 0, sel[i] < 0);
        if (sel[i] < 0) continue;
        const std::byte* row = pool().data() + std::size_t(indices[i]) * kEntry;
        ASSERT_EQ(std::memcmp(row, f.shadow[sel[i]].data(), kEntry), 0) << "step " << step << " selection " << i;
      }
    } else {
      ++failed;
      ASSERT_EQ(r.error().code(), ErrorCode::kIo) << r.error().message();
      ASSERT_NE(r.error().message().find("failed"), std::string::npos);
      ASSERT_FALSE(f.planner->has_pending());
    }
    ASSERT_TRUE(f.AllIntact()) << "after step " << step;
    ASSERT_TRUE(f.space->CheckInvariants());
    if (step % 10 == 9) {
      for (std::uint32_t q = 0; q < kRequests; ++q) {  // decode tokens
        for (LogicalAddr a : f.Append(RequestId(q), 1, step)) addrs[q].push_back(a);
      }
    }
    f.space->AdvanceRound();
  }
  EXPECT_GT(failed, 5u);
  EXPECT_GT(succeeded, 5u);
  EXPECT_GT(f.faults->stats().injected, 0u);
}

TEST(EngineStepFaults, CompleteWithFailedStatusesPublishesNothingAndLosesNothing) {
  ULA_TEST_SEEDED(seed, 20261202);
  std::mt19937_64 rng(seed);
  constexpr std::uint32_t kDev = 48, kHost = 160;
  auto counting = MakeCountingBackend();
  AddressSpaceConfig cfg = testing::EngineModes(SmallConfig(kDev, kHost, 1, 1, kEntry));
  cfg.row_bytes = kLayerBytes;  // kLayers layers of kLayerBytes, as the engine memory registers them
  auto space = AddressSpace::Create(cfg, *counting).value();
  auto planner = StepPlanner::Create(*space, {kRequests, 2, 8}).value();
  // Each layer's buffer on its own, not equally spaced (engine_step_fixture.h).
  EngineMemory mem[2] = {EngineMemory(kLayers, kLayerBytes, kDev), EngineMemory(kLayers, kLayerBytes, kHost)};
  ASSERT_TRUE(mem[0].Register(*planner, Tier::kDevice));
  ASSERT_TRUE(mem[1].Register(*planner, Tier::kHost));
  std::map<std::uint32_t, std::vector<std::byte>> shadow;
  std::vector<std::vector<LogicalAddr>> addrs(kRequests);
  std::vector<RequestId> requests;
  auto entry_at = [&](LogicalAddr a) {
    const Location loc = space->Lookup(a, GroupId(0)).value();
    return mem[loc.tier() == Tier::kDevice ? 0 : 1].Entry(loc.slot().value());
  };
  for (std::uint32_t r = 0; r < kRequests; ++r) {
    ASSERT_TRUE(space->AddRequest(RequestId(r), Rank(0)));
    requests.push_back(RequestId(r));
    const auto fresh = space->Allocate(RequestId(r), 30).value();
    for (LogicalAddr a : fresh) {
      addrs[r].push_back(a);
      shadow[a.value()] = Pattern(a, 0, kEntry);
      const Location loc = space->Lookup(a, GroupId(0)).value();  // the engine's KV write
      mem[loc.tier() == Tier::kDevice ? 0 : 1].SetEntry(loc.slot().value(), shadow[a.value()]);
    }
  }
  space->AdvanceRound();
  std::vector<CopyDescriptor> desc(planner->max_descriptors());
  std::uint32_t failed_total = 0, clean_steps = 0;
  for (std::uint32_t step = 0; step < 60; ++step) {
    const auto sel = Select(rng, addrs);
    std::vector<std::int32_t> indices(sel.size(), kPadIndex);
    auto planned = planner->Plan(Rank(0), GroupId(0), {kRequests, 2, 8}, requests, sel, indices, desc);
    ASSERT_TRUE(planned) << planned.error().message();
    std::vector<std::uint8_t> status(planned->num_descriptors, 0);
    std::uint32_t fail = 0;
    for (std::uint32_t i = 0; i < planned->num_descriptors; ++i) {
      const bool bad = rng() % 4 == 0;
      if (!bad) {
        planner->ExecuteOnEngineMemory(std::span(&desc[i], 1), std::span(&status[i], 1));
        ASSERT_EQ(status[i], 0);
        continue;
      }
      status[i] = 1 + static_cast<std::uint8_t>(rng() % 200);
      ++fail;
      if (desc[i].op == static_cast<std::uint8_t>(CopyOp::kCopy)) {
        // A failed copy may leave garbage in its free destination slot.
        for (std::uint32_t l = 0; l < kLayers; ++l) std::memset(mem[0].At(l, desc[i].dst_slot), 0xAB, kLayerBytes);
      }  // a failed swap leaves both ranges as they were
    }
    auto report = planner->Complete(planned->fence, status);
    ASSERT_TRUE(report);
    ASSERT_EQ(report->failed, fail);
    ASSERT_EQ(report->published, planned->num_descriptors - fail);
    failed_total += fail;
    for (const auto& [a, bytes] : shadow) {
      ASSERT_EQ(entry_at(LogicalAddr(a)), bytes) << "address " << a << " after step " << step;
    }
    if (fail == 0) {
      ++clean_steps;
      for (std::size_t i = 0; i < sel.size(); ++i) {
        if (sel[i] < 0) continue;
        for (std::uint32_t l = 0; l < kLayers; ++l) {
          ASSERT_EQ(std::memcmp(mem[0].At(l, static_cast<std::uint32_t>(indices[i])),
                                shadow[sel[i]].data() + l * kLayerBytes, kLayerBytes),
                    0);
        }
      }
    }
    ASSERT_TRUE(space->CheckInvariants());
    space->AdvanceRound();
  }
  EXPECT_GT(failed_total, 10u);
  EXPECT_GT(clean_steps, 0u);
}

}  // namespace
}  // namespace ula
