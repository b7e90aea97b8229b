// The CUDA form of the step's kernels: step_kernels.inl compiled by nvcc against the
// toolkit's CCCL (thrust, cub, libcu++), namespace ula::kernels::gpu. The context is the
// caller's stream (a cudaStream_t passed as void*: no CUDA type crosses step_kernels.h).
// Every thrust call runs on that stream with thrust::cuda::par_nosync, so kernels are
// ordered by the stream alone; the entry points that return a count (Classify, Compact,
// TakeLowest) read it back with one 4-byte copy and a stream synchronisation — the device
// step (no host sync) keeps those counts on the device instead (not built yet, issue 26).
#include "kernels/step_kernels.h"

#include <cuda_runtime.h>
#include <thrust/system/cuda/execution_policy.h>

ULA_KERNELS_DECLARE(gpu, void*)

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

#define ULA_KERNELS_NS gpu
#define ULA_KERNELS_EXEC void*
#define ULA_KERNELS_POLICY(e) thrust::cuda::par_nosync.on(Stream(e))
#define ULA_KERNELS_READ(e, dst, src) ReadBack((e), (dst), (src))
#define ULA_HD __host__ __device__
#include "kernels/step_kernels.inl"
