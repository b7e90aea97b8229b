// The CUDA form of the step's kernels: step_kernels.inl compiled by nvcc against the
// toolkit's CCCL (thrust, cub, libcu++), namespace ula::kernels::gpu. The context is the
// caller's stream (a cudaStream_t passed as void*: no CUDA type crosses step_kernels.h).
// Every thrust call runs on that stream with thrust::cuda::par_nosync, so kernels are
// ordered by the stream alone; the entry points that return a count (Classify, Compact,
// TakeLowest) read it back with one 4-byte copy and a stream synchronisation — the device
// step (DevicePlan / DeviceComplete: no host sync) keeps its counts on the device instead.
#include "kernels/step_kernels.h"

#include <cuda_runtime.h>
#include <thrust/system/cuda/execution_policy.h>

#include <cstdio>
#include <cstdlib>

namespace ula::kernels::gpu {
namespace {
inline cudaStream_t Stream(void* exec) { return static_cast<cudaStream_t>(exec); }
template <class T>
void ReadBack(void* exec, T* dst, const T* src) {
  cudaMemcpyAsync(dst, src, sizeof(T), cudaMemcpyDeviceToHost, Stream(exec));
  cudaStreamSynchronize(Stream(exec));
}
}  // namespace
}  // namespace ula::kernels::gpu

// CCCL's scans take their temporary storage from the device step's arena (sized at Create),
// so that a step allocates nothing and can be captured in a CUDA graph.
namespace ula::kernels::gpu {
namespace {
class ArenaAllocator {
 public:
  using value_type = char;
  explicit ArenaAllocator(ScratchArena* arena) : arena_(arena) {}
  char* allocate(std::ptrdiff_t n) {
    const std::size_t at = (arena_->used + 255) & ~std::size_t{255};
    ++arena_->allocations;
    if (at + static_cast<std::size_t>(n) > arena_->capacity) {
      ++arena_->overflows;
      std::fprintf(stderr, "ula device step: scratch arena of %zu bytes cannot serve %td more bytes\n",
                   arena_->capacity, n);
      std::abort();
    }
    arena_->used = at + static_cast<std::size_t>(n);
    if (arena_->used > arena_->high_water) arena_->high_water = arena_->used;
    return arena_->base + at;
  }
  void deallocate(char* p, std::size_t n) {
    if (p + n == arena_->base + arena_->used) arena_->used = static_cast<std::size_t>(p - arena_->base);
  }

 private:
  ScratchArena* arena_;
};
}  // namespace

void* MemAlloc(std::size_t bytes) {
  void* p = nullptr;
  return cudaMalloc(&p, bytes == 0 ? 1 : bytes) == cudaSuccess ? p : nullptr;
}
void MemFree(void* p) { cudaFree(p); }
void MemCopy(void* exec, void* dst, const void* src, std::size_t bytes) {
  if (bytes != 0) cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, Stream(exec));
}
void MemZero(void* exec, void* dst, std::size_t bytes) {
  if (bytes != 0) cudaMemsetAsync(dst, 0, bytes, Stream(exec));
}
void Sync(void* exec) { cudaStreamSynchronize(Stream(exec)); }
}  // namespace ula::kernels::gpu

#define ULA_KERNELS_SCAN_POLICY(e, arena) thrust::cuda::par_nosync(ArenaAllocator(arena)).on(Stream(e))
#define ULA_KERNELS_NS gpu
#define ULA_KERNELS_EXEC void*
#define ULA_KERNELS_POLICY(e) thrust::cuda::par_nosync.on(Stream(e))
#define ULA_KERNELS_READ(e, dst, src) ReadBack((e), (dst), (src))
#include "kernels/step_kernels.inl"
