// libgomp's fork, join and barriers, made visible to ThreadSanitizer (the TSan tree only).
//
// libgomp is not built with TSan, so the ordering it gives is invisible: TSan sees no
// happens-before between what a caller wrote before `#pragma omp parallel` and what the team
// reads, between the team's writes and what the caller reads after the region, nor across
// `#pragma omp barrier`. Code that is correct under OpenMP's rules (thrust's OpenMP system,
// the step's kernels in their OpenMP form) then reports races that are not there, and a
// suppression would hide the real ones with them. LLVM's answer is Archer (an OMPT tool that
// annotates libomp); GCC's libgomp has no OMPT, so this file does the same for the two entry
// points GCC emits for what the library uses (`parallel`, `parallel for`, `barrier`):
//   - GOMP_parallel: the caller releases on the region before the fork, every member
//     acquires it before the body and releases on the region's join after it, and the caller
//     acquires the join after libgomp's own join. The body still runs on libgomp's team.
//   - GOMP_barrier: every member releases before libgomp's barrier and acquires after it.
// Nothing else is annotated: a data race between members of one region (two threads writing
// one element between barriers) is still reported (tsan_omp_race_is_reported checks that,
// tsan_omp_join_is_seen that a correct fork/join is not).
//
// An executable's definition of a symbol comes before the shared library's, so the library's
// and the tests' calls reach these wrappers; the wrappers reach libgomp through
// dlsym(RTLD_NEXT). Linked into every test of the TSan tree (cmake/UlaHelpers.cmake).
#include <dlfcn.h>
#include <sanitizer/tsan_interface.h>

#include <cstdio>
#include <cstdlib>

namespace {

using ParallelFn = void (*)(void (*)(void*), void*, unsigned, unsigned);
using BarrierFn = void (*)();

template <typename Fn>
Fn Next(const char* name) {
  void* fn = dlsym(RTLD_NEXT, name);
  if (fn == nullptr) {
    std::fprintf(stderr, "tsan_gomp_annotations: libgomp's %s not found\n", name);
    std::abort();
  }
  return reinterpret_cast<Fn>(fn);
}

struct Region {
  void (*body)(void*);
  void* data;
  char fork;  // the sync objects TSan orders on: their addresses, not their values
  char join;
};

void RunMember(void* region_ptr) {
  auto* region = static_cast<Region*>(region_ptr);
  __tsan_acquire(&region->fork);
  region->body(region->data);
  __tsan_release(&region->join);
}

char barrier_sync;

}  // namespace

extern "C" {

void GOMP_parallel(void (*body)(void*), void* data, unsigned num_threads, unsigned flags) {
  static const ParallelFn next = Next<ParallelFn>("GOMP_parallel");
  Region region{body, data, 0, 0};
  __tsan_release(&region.fork);
  next(&RunMember, &region, num_threads, flags);
  __tsan_acquire(&region.join);
}

void GOMP_barrier() {
  static const BarrierFn next = Next<BarrierFn>("GOMP_barrier");
  __tsan_release(&barrier_sync);
  next();
  __tsan_acquire(&barrier_sync);
}

}  // extern "C"
