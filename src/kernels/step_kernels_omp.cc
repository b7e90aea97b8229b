// The OpenMP form of the step's kernels: step_kernels.inl compiled by the host compiler with
// thrust's OpenMP device system (THRUST_DEVICE_SYSTEM_OMP, set for this library in
// src/kernels/CMakeLists.txt), with the host-side entry points (TakeLowest, the flat PB-LRU's).
#include "kernels/step_kernels.h"

#include <thrust/scan.h>
#include <thrust/system/omp/execution_policy.h>

#include <cstdlib>
#include <cstring>

// The team: each thrust call forks OpenMP's default team of the calling thread
// (omp_set_num_threads; the device step sets it around a launch, omp_team.h). The context is unused.
// The scans are thrust's OpenMP system's, which run on the calling thread and take no
// temporary storage: the arena is not used (ScratchArena stays empty).
#define ULA_KERNELS_NS omp
#define ULA_KERNELS_EXEC int
#define ULA_KERNELS_POLICY(e) thrust::omp::par
#define ULA_KERNELS_READ(e, dst, src) std::memcpy((dst), (src), sizeof(*(dst)))
#define ULA_KERNELS_DEVICE_SCAN(e, arena, in, n, out, init, op) \
  thrust::exclusive_scan(thrust::omp::par, (in), (in) + (n), (out), (init), (op))
#define ULA_KERNELS_HOST_PLANNER 1
#include "kernels/step_kernels.inl"

// The device step's entry points: every launch above returned with its work done and none
// can fail, so each returns kKernelOk. The OpenMP form's "device" memory is host memory;
// copies are memcpy, Sync does nothing.
namespace ula::kernels::omp {
KernelError DevicePlan(int exec, const DeviceStepArgs& args) {
  launch::DevicePlan(exec, args);
  return kKernelOk;
}
KernelError DeviceCheck(int exec, const DeviceStepArgs& args) {
  launch::DeviceCheck(exec, args);
  return kKernelOk;
}
KernelError DeviceClaim(int exec, const DeviceStepArgs& args, const std::uint32_t* agreed) {
  launch::DeviceClaim(exec, args, agreed);
  return kKernelOk;
}
KernelError DeviceComplete(int exec, const DeviceStepArgs& args, const std::uint8_t* status) {
  launch::DeviceComplete(exec, args, status);
  return kKernelOk;
}
KernelError DeviceAdvanceRound(int exec, const DeviceStepArgs& args, bool rebase) {
  launch::DeviceAdvanceRound(exec, args, rebase);
  return kKernelOk;
}

KernelError DevicePlace(int exec, const DeviceStepArgs& args) {
  launch::DevicePlace(exec, args);
  return kKernelOk;
}
KernelError DevicePlaceComplete(int exec, const DeviceStepArgs& args, const std::uint8_t* status) {
  launch::DevicePlaceComplete(exec, args, status);
  return kKernelOk;
}

KernelError MemAlloc(std::size_t bytes, void** out) {
  *out = std::calloc(bytes == 0 ? 1 : bytes, 1);
  return *out != nullptr ? kKernelOk : kKernelOutOfMemory;
}
KernelError MemFree(void* p) {
  std::free(p);
  return kKernelOk;
}
KernelError MemCopy(int, void* dst, const void* src, std::size_t bytes) {
  if (bytes != 0) std::memcpy(dst, src, bytes);
  return kKernelOk;
}
KernelError Sync(int) { return kKernelOk; }
}  // namespace ula::kernels::omp
