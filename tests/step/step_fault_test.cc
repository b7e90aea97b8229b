// DP StepPlanner under injected transfer failures (backend/fault_backend.h): after every step,
// failed or not, every entry reads its own bytes at its published location (none lost,
// none published before its bytes arrived) and every invariant holds; a failed step
// reports kIo naming the batch.
#include <gtest/gtest.h>

#include <cstdlib>
#include <random>

#include "step/space_fixture.h"
#include "backend/fault_backend.h"
#include "test_seed.h"

namespace ula {
namespace {

using testing::Pattern;
using testing::SmallConfig;


TEST(StepPlannerFault, FailedSwapBatchMovesNothingAndTheRetrySucceeds) {
  auto inner = MakeCpuBackend({.copy_threads = 1});
  auto fb = MakeFaultInjectingBackend(*inner, FaultPlan{.fail_every_nth = 1, .copies = false}).value();
  auto space = AddressSpace::Create(SmallConfig(4, 12), *fb).value();
  StepPlanner planner(*space);
  fb->set_armed(false);
  ASSERT_TRUE(space->AddRequest(RequestId(1), Rank(0)));
  const auto addrs = space->Allocate(RequestId(1), 16).value();  // 4 on device, 12 on host
  for (LogicalAddr a : addrs) ASSERT_TRUE(space->Write(a, GroupId(0), Pattern(a, 0, 32)));
  space->AdvanceRound();
  const std::vector<LogicalAddr> sel(addrs.end() - 3, addrs.end());
  std::vector<Location> before;
  for (LogicalAddr a : addrs) before.push_back(space->Lookup(a, GroupId(0)).value());
  fb->set_armed(true);
  std::vector<SlotId> out(sel.size());
  const std::vector<SelectionRun> runs{{RequestId(1), static_cast<std::uint32_t>(sel.size())}};
  auto failed = planner.Step({Rank(0), GroupId(0), sel, runs}, out);
  ASSERT_FALSE(failed);
  EXPECT_EQ(failed.error().code(), ErrorCode::kIo);
  EXPECT_NE(failed.error().message().find("swap of 3 entries failed"), std::string::npos) << failed.error().message();
  fb->set_armed(false);
  for (std::size_t i = 0; i < addrs.size(); ++i) {
    EXPECT_EQ(space->Lookup(addrs[i], GroupId(0)).value(), before[i]) << "address " << addrs[i].value() << " moved";
    std::vector<std::byte> bytes(32);
    ASSERT_TRUE(space->Read(addrs[i], GroupId(0), bytes));
    EXPECT_EQ(bytes, Pattern(addrs[i], 0, 32));
  }
  EXPECT_TRUE(space->CheckInvariants());
  space->AdvanceRound();
  auto retry = planner.Step({Rank(0), GroupId(0), sel, runs}, out);
  ASSERT_TRUE(retry) << retry.error().ToString();
  EXPECT_EQ(retry->evictions, 3u);
}

TEST(StepPlannerFault, RandomStepsLoseNothingAndPublishNothingEarly) {
  ULA_TEST_SEEDED(seed, 424243);
  for (int copy_threads : {0, 1}) {
    auto inner = MakeCpuBackend({.copy_threads = copy_threads});
    auto fb = MakeFaultInjectingBackend(*inner, FaultPlan{.seed = seed, .fail_fraction = 0.15, .partial = true,
                                                          .delay = std::chrono::microseconds(copy_threads)}).value();
    auto space = AddressSpace::Create(SmallConfig(10, 40, /*ranks=*/2, /*groups=*/2), *fb).value();
    StepPlanner planner(*space);
    std::mt19937_64 rng(seed + copy_threads);
    std::vector<LogicalAddr> addrs[2];
    fb->set_armed(false);
    for (std::uint16_t r = 0; r < 2; ++r) {
      ASSERT_TRUE(space->AddRequest(RequestId(r + 1), Rank(r)));
      addrs[r] = space->Allocate(RequestId(r + 1), 30).value();
      for (LogicalAddr a : addrs[r]) {
        for (std::uint16_t g = 0; g < 2; ++g) ASSERT_TRUE(space->Write(a, GroupId(g), Pattern(a, g, 32)));
      }
    }
    int ok = 0, failed = 0;
    // Churn: a second request per rank, freed and later re-added, leaves free device slots
    // for a while (host->device copies, not only swaps).
    std::uint64_t next_request = 3;
    std::uint64_t extra[2] = {0, 0};
    std::vector<LogicalAddr> extra_addrs[2];
    for (int step = 0; step < 240; ++step) {
      if (step % 20 == 0) {
        const std::uint16_t r = static_cast<std::uint16_t>(step / 20 % 2);
        if (extra[r] != 0) {
          ASSERT_TRUE(space->Free(RequestId(extra[r])));
          extra[r] = 0;
          extra_addrs[r].clear();
        } else {
          extra[r] = next_request++;
          ASSERT_TRUE(space->AddRequest(RequestId(extra[r]), Rank(r)));
          const auto fresh = space->Allocate(RequestId(extra[r]), 15).value();
          extra_addrs[r] = fresh;
          for (LogicalAddr a : fresh) {
            for (std::uint16_t g = 0; g < 2; ++g) ASSERT_TRUE(space->Write(a, GroupId(g), Pattern(a, g, 32)));
          }
        }
      }
      const Rank rank(static_cast<std::uint16_t>(rng() % 2));
      const GroupId g(static_cast<std::uint16_t>(rng() % 2));
      std::vector<LogicalAddr> sel;
      std::vector<SelectionRun> runs;  // one per selection: the rank's request or its extra one
      std::vector<LogicalAddr> pool = addrs[rank.value()];
      pool.insert(pool.end(), extra_addrs[rank.value()].begin(), extra_addrs[rank.value()].end());
      for (int i = 0, n = 3 + static_cast<int>(rng() % 8); i < n; ++i) {
        const std::size_t k = rng() % pool.size();
        sel.push_back(pool[k]);
        runs.push_back(SelectionRun{RequestId(k < addrs[rank.value()].size() ? rank.value() + 1 : extra[rank.value()]), 1});
      }
      std::vector<SlotId> out(sel.size());
      fb->set_armed(true);
      auto st = planner.Step({rank, g, sel, runs}, out);
      fb->set_armed(false);
      if (st) {
        ++ok;
        // The slots handed to attention hold the selected entries' bytes (the device pool
        // itself, against the bytes this test wrote), and the table agrees.
        for (std::size_t j = 0; j < sel.size(); ++j) {
          const std::byte* slot = space->DeviceSlotData(rank, g, out[j]);
          ASSERT_NE(slot, nullptr);
          ASSERT_EQ(std::vector<std::byte>(slot, slot + 32), Pattern(sel[j], g.value(), 32))
              << "step " << step << ": slot " << out[j].value() << " handed out for address " << sel[j].value()
              << " does not hold its bytes";
          const Location loc = space->Lookup(sel[j], g).value();
          ASSERT_EQ(loc.tier(), Tier::kDevice);
          ASSERT_EQ(loc.slot(), out[j]);
        }
      } else if (st.error().code() == ErrorCode::kIo) {
        ++failed;
      } else {
        ASSERT_EQ(st.error().code(), ErrorCode::kResourceExhausted) << st.error().ToString();
      }
      ASSERT_TRUE(space->CheckInvariants()) << "step " << step;
      std::vector<std::byte> bytes(32);
      for (const auto& list : addrs) {
        for (LogicalAddr a : list) {
          for (std::uint16_t gg = 0; gg < 2; ++gg) {
            ASSERT_TRUE(space->Read(a, GroupId(gg), bytes));
            ASSERT_EQ(bytes, Pattern(a, gg, 32)) << "step " << step << " (copy threads " << copy_threads
                                                 << "): address " << a.value() << " group " << gg
                                                 << " does not read its bytes at its location";
          }
        }
      }
      if (rng() % 2 == 0) space->AdvanceRound();
    }
    const FaultStats s = fb->stats();
    std::printf("dp fault (copy threads %d): %d steps ok, %d failed; %llu faults (%llu copies, %llu partial, %llu at the wait) of %llu batches\n",
                copy_threads, ok, failed, (unsigned long long)s.injected, (unsigned long long)s.copies_failed, (unsigned long long)s.partial,
                (unsigned long long)s.waits_failed, (unsigned long long)s.operations);
    EXPECT_GT(failed, 10);
    EXPECT_GT(ok, 50);
    EXPECT_GT(s.partial, 0u);
    EXPECT_GT(s.swaps_failed, 0u);
    EXPECT_GT(s.waits_failed, 0u);
  }
}

}  // namespace
}  // namespace ula
