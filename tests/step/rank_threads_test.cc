// RankThreads (src/step/rank_threads.h): every call of a Run runs at the same time as the
// others (they meet at a barrier), only indices below the Run's n take part, and the worker
// threads are started once and kept across Runs. Under TSan (THREADED) the hand-off of fn and
// the results between the caller and the workers is checked for races. A broken hand-off
// shows as a Run that never returns, so every test runs under a HangGuard that fails it in
// seconds rather than leaving it to ctest's timeout.
#include "step/rank_threads.h"

#include <gtest/gtest.h>

#include <atomic>
#include <barrier>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

namespace ula {
namespace {

// Aborts the test binary, naming the test, when the guarded scope has not ended within
// kHangLimit: a Run waiting for a worker that never reports back fails here.
class HangGuard {
 public:
  static constexpr std::chrono::seconds kHangLimit{10};  // the whole test takes well under 1 s, also under TSan
  HangGuard()
      : watcher_([this] {
          std::unique_lock lock(mu_);
          if (!ended_cv_.wait_for(lock, kHangLimit, [this] { return ended_; })) {
            std::fprintf(stderr, "RankThreads hung: %s did not end within %lld s\n",
                         ::testing::UnitTest::GetInstance()->current_test_info()->name(),
                         static_cast<long long>(kHangLimit.count()));
            std::abort();
          }
        }) {}
  ~HangGuard() {
    {
      std::lock_guard lock(mu_);
      ended_ = true;
    }
    ended_cv_.notify_one();
    watcher_.join();
  }

 private:
  std::mutex mu_;
  std::condition_variable ended_cv_;
  bool ended_ = false;
  std::thread watcher_;
};

TEST(RankThreads, EveryCallRunsAtOnceAndWorkersAreKept) {
  HangGuard guard;
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
  HangGuard guard;
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
  HangGuard guard;
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
