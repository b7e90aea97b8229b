// The CUDA form of the step's kernels: step_kernels.inl compiled by nvcc against the
// toolkit's CCCL (thrust, cub, libcu++), namespace ula::kernels::gpu: the device step's entry
// points only (the host-side kernels read counts back and exist in the OpenMP form). The
// context is the caller's stream (a cudaStream_t passed as void*: no CUDA type crosses
// step_kernels.h). Every thrust call runs on that stream with thrust::cuda::par_nosync, so
// kernels are ordered by the stream alone and nothing here synchronises but Sync. The
// device step's phases are cooperative launches (cudaLaunchCooperativeKernel of
// CooperativeKernel<Program>): a grid no larger than what the device holds resident at once
// (the occupancy of that kernel times the SMs), whose barriers are grid.sync().
//
// Errors: every CUDA runtime call's result is checked (scripts/check_cuda_calls.py) and
// returned as a KernelError. thrust reports a failed launch by throwing thrust::system_error
// (and CCCL's allocations std::bad_alloc), a cooperative launch by LaunchFailed: the entry
// points catch every exception, so none crosses into the host side. A cooperative scan's
// per-block partials come from the arena (sized at Create, ScanScratchBytes: the most blocks
// the device can hold resident); before launching anything, an entry point checks that the
// arena holds them and refuses the step with kKernelArenaOverflow when it does not, so that
// refusal leaves nothing enqueued.
#include "kernels/step_kernels.h"

#include <cooperative_groups.h>
#include <cub/block/block_scan.cuh>
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

// The grid of a cooperative launch, kCoopBlock threads a block. ForEach: a grid-stride loop;
// Sync: grid.sync(). Scan: each thread folds a contiguous chunk of [0, n) (threads in grid
// order), a block scan ranks the threads' sums and thread 0 stores the block's total to
// partials[block]; after a grid barrier each block folds the totals of the blocks before it
// (a second block scan over them, in order), each thread writes its chunk's prefixes, and a
// last barrier makes them visible.
constexpr unsigned kCoopBlock = 256;
constexpr std::size_t kCoopValueBytes = 32;  // the largest scan value (StepTally)

struct CudaGrid {
  void* partials;  // [gridDim.x] values of the scan's type

  template <class F>
  __device__ void ForEach(std::uint32_t n, F f) const {
    const std::uint64_t stride = static_cast<std::uint64_t>(gridDim.x) * blockDim.x;
    for (std::uint64_t i = static_cast<std::uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
      f(static_cast<std::uint32_t>(i));
    }
  }
  __device__ void Sync() const { cooperative_groups::this_grid().sync(); }

  template <class In, class T, class Op>
  __device__ void Scan(In in, std::uint32_t n, T* out, T init, Op op) const {
    static_assert(sizeof(T) <= kCoopValueBytes);
    using BlockScan = cub::BlockScan<T, kCoopBlock>;
    __shared__ typename BlockScan::TempStorage temp;
    __shared__ T block_prefix;
    const std::uint64_t threads = static_cast<std::uint64_t>(gridDim.x) * blockDim.x;
    const std::uint64_t t = static_cast<std::uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    const std::uint64_t per = (n + threads - 1) / threads;
    const std::uint64_t begin = t * per < n ? t * per : n;
    const std::uint64_t end = begin + per < n ? begin + per : n;
    T sum = init;
    for (std::uint64_t i = begin; i < end; ++i) sum = op(sum, in[i]);
    T before = init, total = init;
    BlockScan(temp).ExclusiveScan(sum, before, init, op, total);
    T* part = static_cast<T*>(partials);
    if (threadIdx.x == 0) part[blockIdx.x] = total;
    Sync();
    // This block's prefix: the totals of the blocks before it, kCoopBlock at a time in order.
    T carry = init;
    for (unsigned base = 0; base < blockIdx.x; base += kCoopBlock) {
      const unsigned k = base + threadIdx.x;
      const T x = k < blockIdx.x ? part[k] : init;
      T unused = init, chunk = init;
      __syncthreads();  // temp is reused
      BlockScan(temp).ExclusiveScan(x, unused, init, op, chunk);
      carry = op(carry, chunk);
    }
    if (threadIdx.x == 0) block_prefix = carry;
    __syncthreads();
    T run = op(block_prefix, before);
    for (std::uint64_t i = begin; i < end; ++i) {
      const T x = in[i];
      out[i] = run;
      run = op(run, x);
    }
    Sync();
  }
};

template <class P>
__global__ void __launch_bounds__(kCoopBlock) CooperativeKernel(P program, void* partials) {
  const CudaGrid g{partials};
  program(g);
}

// The most blocks of kCoopBlock threads the current device holds resident (the arena's
// bound for the partials of any cooperative launch: a launch never uses more).
cudaError_t MaxResidentBlocks(std::uint32_t* blocks) {
  *blocks = 0;
  int dev = 0, sms = 0, threads = 0;
  if (const cudaError_t e = cudaGetDevice(&dev); e != cudaSuccess) return e;
  if (const cudaError_t e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev); e != cudaSuccess) {
    return e;
  }
  if (const cudaError_t e = cudaDeviceGetAttribute(&threads, cudaDevAttrMaxThreadsPerMultiProcessor, dev);
      e != cudaSuccess) {
    return e;
  }
  *blocks = static_cast<std::uint32_t>(sms) * static_cast<std::uint32_t>(threads / static_cast<int>(kCoopBlock));
  return cudaSuccess;
}
std::size_t PartialsBytes(std::uint32_t blocks) { return static_cast<std::size_t>(blocks) * kCoopValueBytes; }

// One cooperative launch of program on the stream: blocks = min(resident, width / kCoopBlock
// rounded up), its partials taken from the arena and given back once enqueued (the next
// launch on the stream reuses them after this one).
template <class P>
void RunCooperative(void* exec, ScratchArena* arena, std::uint32_t width, const P& program) {
  int dev = 0, sms = 0, per_sm = 0;
  if (const cudaError_t e = cudaGetDevice(&dev); e != cudaSuccess) throw LaunchFailed{e};
  if (const cudaError_t e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev); e != cudaSuccess) {
    throw LaunchFailed{e};
  }
  if (const cudaError_t e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, CooperativeKernel<P>,
                                                                          static_cast<int>(kCoopBlock), 0);
      e != cudaSuccess) {
    throw LaunchFailed{e};
  }
  if (per_sm < 1) throw LaunchFailed{cudaErrorCooperativeLaunchTooLarge};
  const std::uint32_t resident = static_cast<std::uint32_t>(sms) * static_cast<std::uint32_t>(per_sm);
  const std::uint32_t wanted = (width + kCoopBlock - 1) / kCoopBlock;
  const std::uint32_t blocks = wanted < resident ? (wanted < 1 ? 1 : wanted) : resident;
  if (arena == nullptr) throw ArenaShort{};
  const std::size_t bytes = PartialsBytes(blocks);
  char* storage = arena->Take(bytes);
  if (storage == nullptr) throw ArenaShort{};
  struct GiveBack {
    ScratchArena* arena;
    char* p;
    std::size_t bytes;
    ~GiveBack() { arena->Give(p, bytes); }
  } give{arena, storage, bytes};
  void* partials = storage;
  P copy = program;
  void* params[] = {&copy, &partials};
  if (const cudaError_t e = cudaLaunchCooperativeKernel(reinterpret_cast<const void*>(&CooperativeKernel<P>),
                                                        dim3(blocks), dim3(kCoopBlock), params, 0, Stream(exec));
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
#define ULA_KERNELS_COOPERATIVE(e, arena, width, program) RunCooperative((e), (arena), (width), (program))
#define ULA_KERNELS_PROGRAM __device__
#include "kernels/step_kernels.inl"

namespace ula::kernels::gpu {
namespace {
// Refuses (nothing enqueued) when the arena cannot hold the partials of the largest grid;
// else runs f guarded.
template <class F>
KernelError Step(const DeviceStepArgs& a, F&& f) noexcept {
  std::uint32_t blocks = 0;
  if (const cudaError_t e = MaxResidentBlocks(&blocks); e != cudaSuccess) return Code(e);
  if (a.arena == nullptr || !a.arena->Fits(PartialsBytes(blocks))) {
    if (a.arena != nullptr) ++a.arena->overflows;
    return kKernelArenaOverflow;
  }
  return Guarded(static_cast<F&&>(f));
}
}  // namespace

// Every entry point that makes a cooperative launch first checks the arena (Step): a refusal
// enqueues nothing. Check is refused before it runs when Claim would be (the same bound), so
// that no Check leaves first[] and the hit marks set for a Claim that never comes.
KernelError DevicePlan(void* exec, const DeviceStepArgs& args) {
  return Step(args, [&] { launch::DevicePlan(exec, args); });
}
KernelError DeviceCheck(void* exec, const DeviceStepArgs& args) {
  return Step(args, [&] { launch::DeviceCheck(exec, args); });
}
KernelError DeviceClaim(void* exec, const DeviceStepArgs& args, const std::uint32_t* agreed) {
  return Step(args, [&] { launch::DeviceClaim(exec, args, agreed); });
}
KernelError DeviceComplete(void* exec, const DeviceStepArgs& args, const std::uint8_t* status) {
  return Guarded([&] { launch::DeviceComplete(exec, args, status); });
}
KernelError DeviceAdvanceRound(void* exec, const DeviceStepArgs& args, bool rebase) {
  return Step(args, [&] { launch::DeviceAdvanceRound(exec, args, rebase); });
}

KernelError DevicePlace(void* exec, const DeviceStepArgs& args) {
  return Step(args, [&] { launch::DevicePlace(exec, args); });
}
KernelError DevicePlaceComplete(void* exec, const DeviceStepArgs& args, const std::uint8_t* status) {
  return Step(args, [&] { launch::DevicePlaceComplete(exec, args, status); });
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

std::size_t ScanScratchBytes(const DeviceStepArgs&, std::uint32_t, KernelError* error) {
  std::uint32_t blocks = 0;
  if (const cudaError_t e = MaxResidentBlocks(&blocks); e != cudaSuccess) {
    *error = Code(e);
    return 0;
  }
  *error = kKernelOk;
  return PartialsBytes(blocks);
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
