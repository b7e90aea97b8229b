// The OpenMP form of the step's kernels: step_kernels.inl compiled by the host compiler with
// thrust's OpenMP device system (THRUST_DEVICE_SYSTEM_OMP, set for this library in
// src/kernels/CMakeLists.txt), with the host-side entry points (TakeLowest, the flat PB-LRU's).
#include "kernels/step_kernels.h"

#include <thrust/scan.h>
#include <thrust/system/omp/execution_policy.h>

#include <omp.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>

// The team: each thrust call forks OpenMP's default team of the calling thread
// (omp_set_num_threads; the device step sets it around a launch, omp_team.h), and so does a
// cooperative launch (OmpGrid below). The context is unused. The arena is not used
// (ScratchArena stays empty): a cooperative scan's partials live on the launching thread's
// stack.
namespace ula::kernels::omp {

// The OpenMP form's grid: one member per thread of one parallel region. A member's share of
// [0, n) is a contiguous chunk (members in thread order); Sync is `#pragma omp barrier` (which
// the TSan tree's libgomp annotations order, tests/tsan_gomp_annotations.cc). Scan: each member
// folds its chunk into partials[member], a barrier, each member folds the partials before its
// own into its first prefix and writes its chunk's prefixes, a barrier.
class OmpGrid {
 public:
  static constexpr int kMaxMembers = 256;
  static constexpr std::size_t kMaxValueBytes = 32;  // the largest scan value (StepTally)

  OmpGrid(std::uint32_t member, std::uint32_t members, unsigned char* partials)
      : member_(member), members_(members), partials_(partials) {}

  template <class F>
  void ForEach(std::uint32_t n, F f) const {
    const auto [begin, end] = Share(n);
    for (std::uint32_t i = begin; i < end; ++i) f(i);
  }
  void Sync() const {
#pragma omp barrier
  }
  template <class In, class T, class Op>
  void Scan(In in, std::uint32_t n, T* out, T init, Op op) const {
    static_assert(sizeof(T) <= kMaxValueBytes && alignof(T) <= 16);
    T* part = reinterpret_cast<T*>(partials_);
    const auto [begin, end] = Share(n);
    T sum = init;
    for (std::uint32_t i = begin; i < end; ++i) sum = op(sum, in[i]);
    part[member_] = sum;
    Sync();
    T run = init;
    for (std::uint32_t k = 0; k < member_; ++k) run = op(run, part[k]);
    for (std::uint32_t i = begin; i < end; ++i) {
      const T x = in[i];
      out[i] = run;
      run = op(run, x);
    }
    Sync();
  }

 private:
  struct Range {
    std::uint32_t begin, end;
  };
  Range Share(std::uint32_t n) const {
    const std::uint64_t per = (static_cast<std::uint64_t>(n) + members_ - 1) / members_;
    const std::uint64_t begin = std::min<std::uint64_t>(n, per * member_);
    return {static_cast<std::uint32_t>(begin), static_cast<std::uint32_t>(std::min<std::uint64_t>(n, begin + per))};
  }
  std::uint32_t member_, members_;
  unsigned char* partials_;
};

// One cooperative launch: program(g) on every thread of one parallel region of the calling
// thread's team (at most kMaxMembers), to completion.
template <class P>
void RunCooperative(const P& program) {
  alignas(16) unsigned char partials[OmpGrid::kMaxMembers * OmpGrid::kMaxValueBytes];
  const int members = std::min(omp_get_max_threads(), OmpGrid::kMaxMembers);
#pragma omp parallel num_threads(members)
  {
    const OmpGrid g(static_cast<std::uint32_t>(omp_get_thread_num()), static_cast<std::uint32_t>(omp_get_num_threads()),
                    partials);
    program(g);
  }
}

}  // namespace ula::kernels::omp

#define ULA_KERNELS_NS omp
#define ULA_KERNELS_EXEC int
#define ULA_KERNELS_POLICY(e) thrust::omp::par
#define ULA_KERNELS_READ(e, dst, src) std::memcpy((dst), (src), sizeof(*(dst)))
#define ULA_KERNELS_COOPERATIVE(e, arena, width, program) ::ula::kernels::omp::RunCooperative(program)
#define ULA_KERNELS_PROGRAM
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
