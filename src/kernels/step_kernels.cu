// The CUDA form of the step's kernels: step_kernels.inl compiled by nvcc against the
// toolkit's CCCL (thrust, cub, libcu++), namespace ula::kernels::gpu: the device step's entry
// points only (the host-side kernels read counts back and exist in the OpenMP form). The
// context is the caller's stream (a cudaStream_t passed as void*: no CUDA type crosses
// step_kernels.h). Every thrust call runs on that stream with thrust::cuda::par_nosync, so
// kernels are ordered by the stream alone and nothing here synchronises but Sync.
//
// Errors: every CUDA runtime call's result is checked (scripts/check_cuda_calls.py) and
// returned as a KernelError. thrust reports a failed launch by throwing thrust::system_error
// (and CCCL's allocations std::bad_alloc): the entry points catch every exception, so none
// crosses into the host side. A step's scans take their temporary storage from the arena
// (sized at Create, ScanScratchBytes); before launching anything, an entry point asks cub for
// the bytes its scans need and refuses the step with kKernelArenaOverflow when they do not fit,
// so that refusal leaves nothing enqueued.
#include "kernels/step_kernels.h"

#include <cub/device/device_scan.cuh>
#include <cuda_runtime.h>
#include <thrust/system/cuda/error.h>
#include <thrust/system/cuda/execution_policy.h>
#include <thrust/system_error.h>

#include <new>

namespace ula::kernels::gpu {
namespace {
inline cudaStream_t Stream(void* exec) { return static_cast<cudaStream_t>(exec); }

static_assert(kCudaErrorMemoryAllocation == cudaErrorMemoryAllocation && kCudaErrorStubLibrary == cudaErrorStubLibrary &&
              kCudaErrorInsufficientDriver == cudaErrorInsufficientDriver &&
              kCudaErrorDevicesUnavailable == cudaErrorDevicesUnavailable && kCudaErrorNoDevice == cudaErrorNoDevice);

KernelError Code(cudaError_t e) {
  int driver = 0;
  if (e == cudaErrorInsufficientDriver) {
    const cudaError_t v = cudaDriverGetVersion(&driver);
    if (v != cudaSuccess) driver = 0;  // no version: read as no driver
  }
  return FromCudaError(static_cast<int>(e), driver);
}

// Thrown inside a launch sequence, caught by Guarded.
struct LaunchFailed {
  cudaError_t error;
};
struct ArenaShort {};  // a scan asked for more than its checked need (cannot happen after Fits)

// The storage cub's exclusive scan of n values from `in` under op needs (0 for n == 0). The
// types are the launch's own (launch::CheckScanInput, ClaimScanInput), so the bytes are too.
template <class In, class T, class Op>
cudaError_t ScanBytes(In in, std::uint32_t n, T init, Op op, std::size_t* bytes) {
  *bytes = 0;
  if (n == 0) return cudaSuccess;
  return cub::DeviceScan::ExclusiveScan(nullptr, *bytes, in, static_cast<T*>(nullptr), op, init, n);
}

// out[i] = init op in[0] op ... op in[i - 1] over [0, n), its storage taken from the arena and
// given back.
template <class In, class T, class Op>
void ArenaScan(void* exec, ScratchArena* arena, In in, std::uint32_t n, T* out, T init, Op op) {
  std::size_t bytes = 0;
  if (const cudaError_t e = ScanBytes(in, n, init, op, &bytes); e != cudaSuccess) throw LaunchFailed{e};
  if (n == 0) return;
  char* storage = arena->Take(bytes);
  if (storage == nullptr) throw ArenaShort{};
  struct GiveBack {
    ScratchArena* arena;
    char* p;
    std::size_t bytes;
    ~GiveBack() { arena->Give(p, bytes); }
  } give{arena, storage, bytes};
  if (const cudaError_t e = cub::DeviceScan::ExclusiveScan(storage, bytes, in, out, op, init, n, Stream(exec));
      e != cudaSuccess) {
    throw LaunchFailed{e};
  }
}

// Runs f (launches that may throw) and turns what it threw into a KernelError.
template <class F>
KernelError Guarded(F&& f) noexcept {
  try {
    f();
    return kKernelOk;
  } catch (const LaunchFailed& e) {
    return e.error == cudaSuccess ? kKernelException : Code(e.error);
  } catch (const ArenaShort&) {
    return kKernelException;
  } catch (const thrust::system_error& e) {
    if (e.code().category() == thrust::cuda_category() && e.code().value() != 0) {
      return Code(static_cast<cudaError_t>(e.code().value()));
    }
    return kKernelException;
  } catch (const std::bad_alloc&) {
    return kKernelOutOfMemory;
  } catch (...) {
    return kKernelException;
  }
}

}  // namespace
}  // namespace ula::kernels::gpu

#define ULA_KERNELS_NS gpu
#define ULA_KERNELS_EXEC void*
#define ULA_KERNELS_POLICY(e) thrust::cuda::par_nosync.on(Stream(e))
#define ULA_KERNELS_DEVICE_SCAN(e, arena, in, n, out, init, op) \
  ArenaScan((e), (arena), (in), (n), (out), (init), (op))
#include "kernels/step_kernels.inl"

namespace ula::kernels::gpu {
namespace {
// The arena bytes a step's scans need: the tally scan over the selections (DeviceCheck), the
// take's scan over the free and victim blocks (DeviceClaim); each gives its storage back
// before the next.
cudaError_t StepNeed(const DeviceStepArgs& a, std::uint32_t n, bool check, bool claim, std::size_t* need) {
  *need = 0;
  std::size_t b = 0;
  if (check) {
    if (const cudaError_t e = ScanBytes(launch::CheckScanInput(a), n, TallyZero(), TallyPlus{}, &b); e != cudaSuccess) {
      return e;
    }
    *need = b;
  }
  if (claim && n > 0) {
    if (const cudaError_t e = ScanBytes(launch::ClaimScanInput(a), launch::ClaimBlocks(a), std::uint32_t{0},
                                        launch::SumU32{}, &b);
        e != cudaSuccess) {
      return e;
    }
    if (b > *need) *need = b;
  }
  return cudaSuccess;
}

// The arena bytes a Place's scans need (device placement): the free, victim and host takes
// over the summary words, each giving its storage back before the next.
cudaError_t PlaceNeed(const DeviceStepArgs& a, std::size_t* need) {
  *need = 0;
  std::size_t b = 0;
  for (std::uint32_t n : {a.device_free.num_summary, (a.pb.recent + 1) * a.pb.num_summary, a.host_free.num_summary}) {
    if (const cudaError_t e = ScanBytes(a.place.take_counts, n, std::uint32_t{0}, launch::SumU32{}, &b); e != cudaSuccess) {
      return e;
    }
    if (b > *need) *need = b;
  }
  return cudaSuccess;
}

// Refuses (nothing enqueued) when the arena cannot hold the step's scans; else runs f guarded.
template <class F>
KernelError Step(const DeviceStepArgs& a, bool check, bool claim, F&& f) noexcept {
  std::size_t need = 0;
  if (const cudaError_t e = StepNeed(a, a.io.num_rows * a.io.top_k, check, claim, &need); e != cudaSuccess) {
    return Code(e);
  }
  if (need > 0 && (a.arena == nullptr || !a.arena->Fits(need))) {
    if (a.arena != nullptr) ++a.arena->overflows;
    return kKernelArenaOverflow;
  }
  return Guarded(static_cast<F&&>(f));
}
}  // namespace

KernelError DevicePlan(void* exec, const DeviceStepArgs& args) {
  return Step(args, true, true, [&] { launch::DevicePlan(exec, args); });
}
// Check asks for Claim's scan too: a Claim refused by the arena would leave Check's first[]
// and hit marks set (nothing enqueued resets them), so the refusal comes before the Check.
KernelError DeviceCheck(void* exec, const DeviceStepArgs& args) {
  return Step(args, true, true, [&] { launch::DeviceCheck(exec, args); });
}
KernelError DeviceClaim(void* exec, const DeviceStepArgs& args, const std::uint32_t* agreed) {
  return Step(args, false, true, [&] { launch::DeviceClaim(exec, args, agreed); });
}
KernelError DeviceComplete(void* exec, const DeviceStepArgs& args, const std::uint8_t* status) {
  return Guarded([&] { launch::DeviceComplete(exec, args, status); });
}
KernelError DeviceAdvanceRound(void* exec, const DeviceStepArgs& args, bool rebase) {
  return Guarded([&] { launch::DeviceAdvanceRound(exec, args, rebase); });
}

KernelError DevicePlace(void* exec, const DeviceStepArgs& args) {
  std::size_t need = 0;
  if (args.place.io.num_seated > 0) {
    if (const cudaError_t e = PlaceNeed(args, &need); e != cudaSuccess) return Code(e);
  }
  if (need > 0 && (args.arena == nullptr || !args.arena->Fits(need))) {
    if (args.arena != nullptr) ++args.arena->overflows;
    return kKernelArenaOverflow;
  }
  return Guarded([&] { launch::DevicePlace(exec, args); });
}
KernelError DevicePlaceComplete(void* exec, const DeviceStepArgs& args, const std::uint8_t* status) {
  return Guarded([&] { launch::DevicePlaceComplete(exec, args, status); });
}

KernelError MemAlloc(std::size_t bytes, void** out) {
  *out = nullptr;
  if (const cudaError_t e = cudaMalloc(out, bytes == 0 ? 1 : bytes); e != cudaSuccess) {
    *out = nullptr;
    return Code(e);
  }
  return kKernelOk;
}
KernelError MemFree(void* p) {
  if (const cudaError_t e = cudaFree(p); e != cudaSuccess) return Code(e);
  return kKernelOk;
}
KernelError MemCopy(void* exec, void* dst, const void* src, std::size_t bytes) {
  if (bytes == 0) return kKernelOk;
  if (const cudaError_t e = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, Stream(exec)); e != cudaSuccess) {
    return Code(e);
  }
  return kKernelOk;
}
KernelError Sync(void* exec) {
  if (const cudaError_t e = cudaStreamSynchronize(Stream(exec)); e != cudaSuccess) return Code(e);
  return kKernelOk;
}

KernelError CheckDevice() {
  int count = 0;
  if (const cudaError_t e = cudaGetDeviceCount(&count); e != cudaSuccess) return Code(e);
  return count > 0 ? kKernelOk : kKernelNoDevice;
}

std::size_t ScanScratchBytes(const DeviceStepArgs& args, std::uint32_t n, KernelError* error) {
  std::size_t need = 0;
  if (const cudaError_t e = StepNeed(args, n, true, true, &need); e != cudaSuccess) {
    *error = Code(e);
    return 0;
  }
  std::size_t place = 0;  // device placement's takes (DevicePlace)
  if (args.place.ctl != nullptr) {
    if (const cudaError_t e = PlaceNeed(args, &place); e != cudaSuccess) {
      *error = Code(e);
      return 0;
    }
  }
  if (place > need) need = place;
  *error = kKernelOk;
  return need;
}

KernelError StreamCreate(void** stream) {
  *stream = nullptr;
  cudaStream_t s = nullptr;
  if (const cudaError_t e = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking); e != cudaSuccess) return Code(e);
  *stream = s;
  return kKernelOk;
}
KernelError StreamDestroy(void* stream) {
  if (const cudaError_t e = cudaStreamDestroy(Stream(stream)); e != cudaSuccess) return Code(e);
  return kKernelOk;
}
KernelError EventCreate(void** event) {
  *event = nullptr;
  cudaEvent_t ev = nullptr;
  if (const cudaError_t e = cudaEventCreate(&ev); e != cudaSuccess) return Code(e);
  *event = ev;
  return kKernelOk;
}
KernelError EventDestroy(void* event) {
  if (const cudaError_t e = cudaEventDestroy(static_cast<cudaEvent_t>(event)); e != cudaSuccess) return Code(e);
  return kKernelOk;
}
KernelError EventRecord(void* event, void* stream) {
  if (const cudaError_t e = cudaEventRecord(static_cast<cudaEvent_t>(event), Stream(stream)); e != cudaSuccess) {
    return Code(e);
  }
  return kKernelOk;
}
KernelError EventElapsedMs(void* start, void* end, float* ms) {
  *ms = 0;
  if (const cudaError_t e = cudaEventSynchronize(static_cast<cudaEvent_t>(end)); e != cudaSuccess) return Code(e);
  if (const cudaError_t e = cudaEventElapsedTime(ms, static_cast<cudaEvent_t>(start), static_cast<cudaEvent_t>(end));
      e != cudaSuccess) {
    return Code(e);
  }
  return kKernelOk;
}

const char* ErrorText(KernelError e) {
  if (e > 0) return cudaGetErrorString(static_cast<cudaError_t>(e));
  const char* name = KernelErrorName(e);
  return name != nullptr ? name : "unknown error";
}

}  // namespace ula::kernels::gpu
