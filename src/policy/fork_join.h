// ForkJoin: runs one body on a team of OpenMP threads, splitting [0, n) into contiguous
// chunks, and makes the fork and the join visible to ThreadSanitizer.
//
// libgomp's barriers and its hand-over of the region's shared-variable block are not
// instrumented, so TSan sees no ordering between what the caller wrote before
// `#pragma omp parallel` and what the team reads, or between the team's writes and what the
// caller reads after the region. Run() therefore passes nothing through the region's
// shared-variable block: the job is published through one process-wide atomic pointer
// (release by the caller, acquire by every member), and each member ends with a release
// store the caller acquires after the join. Runs of different ForkJoin objects are
// serialized by a process-wide mutex (one job pointer).
// Costs: one mutex, two stores and (1 + threads) loads per run besides the OpenMP fork.
//
// Thread-safety: Run() may be called from any thread; runs are serialized.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>

namespace ula::policy {

namespace internal {
struct alignas(64) PaddedEpoch {
  std::atomic<std::uint64_t> value{0};
};
struct ForkJoinJob {
  void (*run)(const void* ctx, std::size_t thread, std::size_t num_threads) noexcept;
  const void* ctx;
  PaddedEpoch* done;  // [threads] each member stores `epoch` when it has finished
  std::uint64_t epoch;
};
// Runs job on a team of `threads` OpenMP threads and returns after all have finished.
void RunTeam(const ForkJoinJob& job, int threads) noexcept;
int MaxTeamThreads() noexcept;
}  // namespace internal

class ForkJoin {
 public:
  ForkJoin() : ForkJoin(internal::MaxTeamThreads()) {}
  // A team of exactly `threads` (>= 1) threads, whatever OpenMP's default.
  explicit ForkJoin(int threads)
      : max_threads_(std::max(1, threads)), done_(new internal::PaddedEpoch[max_threads_]) {}

  int max_threads() const { return max_threads_; }

  // Calls body(thread, begin, end) once per team member, with [begin, end) its chunk of
  // [0, n). thread < max_threads(). Returns after every member has finished.
  template <class Body>
  void Run(std::size_t n, Body& body) noexcept {
    struct Ctx {
      Body* body;
      std::size_t n;
    } ctx{&body, n};
    auto run = [](const void* c, std::size_t t, std::size_t nt) noexcept {
      const auto& x = *static_cast<const Ctx*>(c);
      (*x.body)(t, x.n * t / nt, x.n * (t + 1) / nt);
    };
    internal::RunTeam({run, &ctx, done_.get(), ++epoch_}, max_threads_);
  }

 private:
  int max_threads_;
  std::unique_ptr<internal::PaddedEpoch[]> done_;  // [max_threads_]
  std::uint64_t epoch_ = 0;
};

}  // namespace ula::policy
