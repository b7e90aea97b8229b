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
#define ULA_HD
#include "kernels/step_kernels.inl"
