// The OpenMP form of the step's kernels: step_kernels.inl compiled by the host compiler with
// thrust's OpenMP device system (THRUST_DEVICE_SYSTEM_OMP, set for this library in
// src/kernels/CMakeLists.txt).
#include "kernels/step_kernels.h"

#include <thrust/system/omp/execution_policy.h>

#include <cstring>

// The team: each thrust call forks OpenMP's default team of the calling thread
// (omp_set_num_threads; the kernel planner sets it around a step). The context is unused.
#define ULA_KERNELS_NS omp
#define ULA_KERNELS_EXEC int
#define ULA_KERNELS_POLICY(e) thrust::omp::par
#define ULA_KERNELS_READ(e, dst, src) std::memcpy((dst), (src), sizeof(*(dst)))
#include "kernels/step_kernels.inl"

// The OpenMP form's "device" memory is host memory; copies are memcpy, Sync does nothing
// (every thrust call above returned with its work done).
#include <cstdlib>

namespace ula::kernels::omp {
void* MemAlloc(std::size_t bytes) { return std::calloc(bytes == 0 ? 1 : bytes, 1); }
void MemFree(void* p) { std::free(p); }
void MemCopy(int, void* dst, const void* src, std::size_t bytes) {
  if (bytes != 0) std::memcpy(dst, src, bytes);
}
void MemZero(int, void* dst, std::size_t bytes) {
  if (bytes != 0) std::memset(dst, 0, bytes);
}
void Sync(int) {}
}  // namespace ula::kernels::omp
