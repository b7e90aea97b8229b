// ForkJoin: runs one body on a team of OpenMP threads, splitting [0, n) into contiguous
// chunks, and makes the fork and the join visible to ThreadSanitizer.
//
// libgomp's barriers are not instrumented, so TSan would see no ordering between what the
// calling thread wrote before `#pragma omp parallel` and what the team reads, or between the
// team's writes and what the caller reads after it. Run() adds that ordering with atomics
// TSan understands: a release store before the fork that every member acquires, and a
// release store per member at its end that the caller acquires after the join.
// Costs two uncontended atomic stores and (1 + threads) loads per run.
//
// Thread-safety: Run() is called by one thread at a time (the policy's driver).
#pragma once

#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>

namespace ula::policy {

class ForkJoin {
 public:
  ForkJoin() : max_threads_(std::max(1, omp_get_max_threads())), join_(new Padded[max_threads_]) {}

  int max_threads() const { return max_threads_; }

  // Calls body(thread, begin, end) once per team member, with [begin, end) its chunk of
  // [0, n). thread < max_threads(). Returns after every member has finished.
  template <class Body>
  void Run(std::size_t n, Body&& body) noexcept {
    const std::uint64_t epoch = fork_.load(std::memory_order_relaxed) + 1;
    fork_.store(epoch, std::memory_order_release);
#pragma omp parallel num_threads(max_threads_)
    {
      (void)fork_.load(std::memory_order_acquire);
      const auto t = static_cast<std::size_t>(omp_get_thread_num());
      const auto nt = static_cast<std::size_t>(omp_get_num_threads());
      body(t, n * t / nt, n * (t + 1) / nt);
      join_[t].value.store(epoch, std::memory_order_release);
    }
    for (int t = 0; t < max_threads_; ++t) (void)join_[t].value.load(std::memory_order_acquire);
  }

 private:
  struct alignas(64) Padded {
    std::atomic<std::uint64_t> value{0};
  };
  int max_threads_;
  std::atomic<std::uint64_t> fork_{0};
  std::unique_ptr<Padded[]> join_;  // [max_threads_]
};

}  // namespace ula::policy
