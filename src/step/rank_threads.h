// The in-process engine's hosted ranks, each on a thread of its own, kept for the planner's
// lifetime (TpPlannerOptions::parallel_ranks, include/ula/tp_step_planner.h).
//
// Run(n, fn) calls fn(0) on the calling thread and fn(1) .. fn(n - 1) on n - 1 kept worker
// threads, all at once, and returns when every call has returned. All n calls run
// concurrently, so they may wait for each other (a fabric barrier between ranks). Workers are
// started on the first Run that needs them and joined by the destructor: a TP step's phases
// used to start one thread per rank each, and under the sanitizers those thread starts were
// most of a TP verifier run's system time (docs/BENCHMARKS.md, "The test loop").
//
// Invariants: between Runs no worker is inside fn; a worker takes part in a Run only when its
// index is below that Run's n; Run returns only after each taking part has returned from fn.
// Thread-safety: Run is called by one thread at a time (the planner's own contract); fn must
// not throw.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace ula {

class RankThreads {
 public:
  RankThreads() = default;
  RankThreads(const RankThreads&) = delete;
  RankThreads& operator=(const RankThreads&) = delete;
  ~RankThreads();

  void Run(std::size_t n, const std::function<void(std::size_t)>& fn);

  // Worker threads started so far (for tests: kept, not started per Run).
  std::size_t workers_started() const { return workers_.size(); }

 private:
  void WorkerLoop(std::size_t index, std::uint64_t seen);

  std::mutex mu_;
  std::condition_variable start_, done_;
  std::vector<std::thread> workers_;  // workers_[i] runs index i + 1
  const std::function<void(std::size_t)>* fn_ = nullptr;
  std::uint64_t generation_ = 0;  // one per Run
  std::size_t taking_part_ = 0;   // the current Run's n
  std::size_t running_ = 0;       // workers of the current Run not yet returned from fn
  bool stop_ = false;
};

}  // namespace ula
