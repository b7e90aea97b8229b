// Probes of tests/tsan_gomp_annotations.cc, run in the TSan tree only (tests/tsan/CMakeLists.txt).
//   tsan_omp_probe join: the caller fills an array, a team of 2 writes one element per member,
//     crosses a barrier, reads its neighbour's element, and the caller reads the sums after the
//     region. Correct under OpenMP's rules: TSan must report nothing, which it does only when
//     the fork, the barrier and the join are annotated.
//   tsan_omp_probe race: both members write one plain int inside one region with no barrier.
//     TSan must report it: the annotations order the fork and join, never the members.
#include <omp.h>

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
#pragma omp parallel num_threads(2)
  {
    shared = omp_get_thread_num() + 1;  // both members, no ordering between them
  }
  std::printf("raced: %d\n", shared);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 2 && std::strcmp(argv[1], "join") == 0) return Join();
  if (argc == 2 && std::strcmp(argv[1], "race") == 0) return Race();
  std::fprintf(stderr, "usage: tsan_omp_probe join|race\n");
  return 2;
}
