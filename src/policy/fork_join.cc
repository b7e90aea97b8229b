#include "policy/fork_join.h"

#include <omp.h>

#include <mutex>

namespace ula::policy::internal {
namespace {
std::atomic<const ForkJoinJob*> g_job{nullptr};
std::mutex g_mutex;
}  // namespace

int MaxTeamThreads() noexcept { return std::max(1, omp_get_max_threads()); }

void RunTeam(const ForkJoinJob& job, int threads) noexcept {
  std::lock_guard<std::mutex> lock(g_mutex);
  g_job.store(&job, std::memory_order_release);
  // The region reads no local variable of this function: everything comes through g_job.
#pragma omp parallel num_threads(threads)
  {
    const ForkJoinJob* j = g_job.load(std::memory_order_acquire);
    const auto t = static_cast<std::size_t>(omp_get_thread_num());
    j->run(j->ctx, t, static_cast<std::size_t>(omp_get_num_threads()));
    j->done[t].value.store(j->epoch, std::memory_order_release);
  }
  for (int t = 0; t < threads; ++t) (void)job.done[t].value.load(std::memory_order_acquire);
  g_job.store(nullptr, std::memory_order_relaxed);
}

}  // namespace ula::policy::internal
