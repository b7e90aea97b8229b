// RankThreads (src/step/rank_threads.h): every call of a Run runs at the same time as the
// others (they meet at a barrier), only indices below the Run's n take part, and the worker
// threads are started once and kept across Runs. Under TSan (THREADED) the hand-off of fn and
// the results between the caller and the workers is checked for races.
#include "step/rank_threads.h"

#include <gtest/gtest.h>

#include <atomic>
#include <barrier>
#include <chrono>
#include <set>
#include <thread>
#include <vector>

namespace ula {
namespace {

TEST(RankThreads, EveryCallRunsAtOnceAndWorkersAreKept) {
  RankThreads threads;
  constexpr std::size_t kRanks = 4;
  for (int run = 0; run < 50; ++run) {
    std::barrier meet(kRanks);  // would wait forever unless all four calls run at once
    std::vector<int> calls(kRanks, 0);
    std::vector<std::thread::id> ids(kRanks);
    threads.Run(kRanks, [&](std::size_t i) {
      meet.arrive_and_wait();
      ++calls[i];
      ids[i] = std::this_thread::get_id();
    });
    EXPECT_EQ(calls, std::vector<int>(kRanks, 1)) << "run " << run;
    EXPECT_EQ(ids[0], std::this_thread::get_id()) << "index 0 runs on the caller";
    EXPECT_EQ(std::set<std::thread::id>(ids.begin(), ids.end()).size(), kRanks);
  }
  EXPECT_EQ(threads.workers_started(), kRanks - 1) << "workers are kept, not started per Run";
}

TEST(RankThreads, RunReturnsOnlyAfterEveryCallHasReturned) {
  RankThreads threads;
  for (int run = 0; run < 3; ++run) {
    std::vector<std::atomic<int>> done(3);
    threads.Run(3, [&](std::size_t i) {
      if (i != 0) std::this_thread::sleep_for(std::chrono::milliseconds(20));  // the caller's call ends first
      done[i].store(1);
    });
    for (std::size_t i = 0; i < 3; ++i) EXPECT_EQ(done[i].load(), 1) << "run " << run << ", rank " << i;
  }
}

TEST(RankThreads, OnlyIndicesBelowNTakePart) {
  RankThreads threads;
  std::vector<std::atomic<int>> calls(4);
  threads.Run(4, [&](std::size_t i) { ++calls[i]; });
  threads.Run(2, [&](std::size_t i) { ++calls[i]; });
  threads.Run(1, [&](std::size_t i) { ++calls[i]; });
  threads.Run(0, [&](std::size_t i) { ++calls[i]; });
  EXPECT_EQ(calls[0].load(), 3);
  EXPECT_EQ(calls[1].load(), 2);
  EXPECT_EQ(calls[2].load(), 1);
  EXPECT_EQ(calls[3].load(), 1);
  threads.Run(6, [&](std::size_t i) { if (i < 4) ++calls[i]; });
  EXPECT_EQ(threads.workers_started(), 5u);
  EXPECT_EQ(calls[3].load(), 2);
}

}  // namespace
}  // namespace ula
