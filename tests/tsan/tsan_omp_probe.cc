// Probes of tests/tsan_gomp_annotations.cc, run in the TSan tree only (tests/tsan/CMakeLists.txt).
//   tsan_omp_probe join: the caller fills an array, a team of 2 writes one element per member,
//     crosses a barrier, reads its neighbour's element, and the caller reads the sums after the
//     region. Correct under OpenMP's rules: TSan must report nothing, which it does only when
//     the fork, the barrier and the join are annotated.
//   tsan_omp_probe race: both members write one plain int inside one region with no barrier.
//     TSan must report it: the annotations order the fork and join, never the members.
//     Member 1 writes only after member 0's write is done, told by a relaxed atomic flag:
//     TSan gives a relaxed load no happens-before, so the race stays a race, and the two
//     writes never land together. TSan's shadow check and store are not one atomic step, so
//     two writes at the same instant can both pass unseen; CI once missed the race that way.
#include <omp.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <vector>

namespace {

int Join() {
  std::vector<long> values(2, 0);
  std::vector<long> sums(2, 0);
  for (long i = 0; i < 2; ++i) values[i] = 10 * (i + 1);  // written before the fork
#pragma omp parallel num_threads(2)
  {
    const int t = omp_get_thread_num();
    const int n = omp_get_num_threads();
    values[t] += 1;
#pragma omp barrier
    sums[t] = values[t] + values[(t + 1) % n];
  }
  // Read after the join.
  std::printf("team of 2: sums %ld %ld\n", sums[0], sums[1]);
  return sums[0] == 32 && sums[1] == 32 ? 0 : 1;
}

int Race() {
  int shared = 0;
  std::atomic<int> first_written{0};
  int team = 0;
#pragma omp parallel num_threads(2)
  {
    const int t = omp_get_thread_num();
    if (t == 0) team = omp_get_num_threads();
    if (t == 0) {
      shared = 1;
      first_written.store(1, std::memory_order_relaxed);
    } else if (t == 1) {
      while (first_written.load(std::memory_order_relaxed) == 0) {
      }
      shared = 2;  // after member 0's write in time, unordered with it for TSan
    }
  }
  std::printf("team of %d raced: %d\n", team, shared);
  return team == 2 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 2 && std::strcmp(argv[1], "join") == 0) return Join();
  if (argc == 2 && std::strcmp(argv[1], "race") == 0) return Race();
  std::fprintf(stderr, "usage: tsan_omp_probe join|race\n");
  return 2;
}
