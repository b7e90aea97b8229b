#include "step/rank_threads.h"

namespace ula {

RankThreads::~RankThreads() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  start_.notify_all();
  for (std::thread& t : workers_) t.join();
}

void RankThreads::Run(std::size_t n, const std::function<void(std::size_t)>& fn) {
  if (n == 0) return;
  {
    std::lock_guard lock(mu_);
    while (workers_.size() + 1 < n) workers_.emplace_back(&RankThreads::WorkerLoop, this, workers_.size() + 1, generation_);
    fn_ = &fn;
    taking_part_ = n;
    running_ = n - 1;
    ++generation_;
  }
  start_.notify_all();
  fn(0);
  std::unique_lock lock(mu_);
  done_.wait(lock, [this] { return running_ == 0; });
  fn_ = nullptr;
}

void RankThreads::WorkerLoop(std::size_t index, std::uint64_t seen) {
  std::unique_lock lock(mu_);
  for (;;) {
    start_.wait(lock, [&] { return stop_ || generation_ != seen; });
    if (stop_) return;
    seen = generation_;
    if (index >= taking_part_) continue;
    const std::function<void(std::size_t)>& fn = *fn_;
    lock.unlock();
    fn(index);
    lock.lock();
    if (--running_ == 0) done_.notify_one();
  }
}

}  // namespace ula
