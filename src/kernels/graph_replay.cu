// What an engine adds around the device step inside one CUDA graph (step_kernels.h,
// "Graphs"): a reference copy kernel that runs a step's descriptors with its count read from
// device-visible memory, and the capture, instantiation and replay of the work enqueued on a
// stream. Every CUDA runtime call's result is checked and returned as a KernelError
// (scripts/check_cuda_calls.py).
//
// ReferenceCopyKernel: one block per descriptor row of the fixed index space
// [max_descriptors] (the same launch for every step, so it captures once), each block's
// threads over one layer's row at a time. Block i does nothing unless i < *count (the
// StepRecord's num_descriptors, which the step's last Claim kernel wrote earlier on the
// stream, or Place's *num_evictions): the count is read on the device at run time, not by the
// host at capture time. Distinct descriptors
// name distinct slots (the step's claim), so the blocks' writes are disjoint; a swap's block
// reads both rows before its threads' writes land (each thread exchanges its own bytes).
#include <cuda_runtime.h>

#include "kernels/step_kernels.h"

namespace ula::kernels::gpu {
namespace {
constexpr std::uint32_t kCopyThreads = 128;

__device__ unsigned char* RowOf(const CopyPools& p, std::uint8_t tier, std::uint32_t slot, std::uint32_t layer) {
  const bool device = tier == 0;
  const std::uint64_t slots = device ? p.device_slots : p.host_slots;
  unsigned char* base = device ? p.device : p.host;
  return base + (std::uint64_t{layer} * slots + slot) * p.row_bytes;
}

__global__ void ReferenceCopyKernel(const CopyDescriptor* __restrict__ descriptors, const std::uint32_t* count,
                                    CopyPools pools, std::uint8_t* __restrict__ status) {
  const std::uint32_t i = blockIdx.x;
  if (i >= *count) return;
  const CopyDescriptor d = descriptors[i];
  for (std::uint32_t l = 0; l < d.num_layers; ++l) {
    unsigned char* src = RowOf(pools, d.src_tier, d.src_slot, l);
    unsigned char* dst = RowOf(pools, d.dst_tier, d.dst_slot, l);
    unsigned char* evict = RowOf(pools, 1, d.evict_slot, l);
    for (std::uint32_t b = threadIdx.x; b < d.bytes; b += blockDim.x) {
      const unsigned char s = src[b], t = dst[b];
      if (d.op == 1) {  // CopyOp::kSwap: the victim's row goes where the wanted one was
        src[b] = t;
      } else if (d.op == 2) {  // CopyOp::kEvict: the victim's row to its host slot first
        evict[b] = t;
      }
      dst[b] = s;
    }
  }
  if (threadIdx.x == 0) status[i] = 0;
}
}  // namespace

KernelError ReferenceCopy(void* stream, const CopyDescriptor* descriptors, const std::uint32_t* count,
                          std::uint32_t max_descriptors, const CopyPools& pools, std::uint8_t* status) {
  if (max_descriptors == 0) return kKernelOk;
  ReferenceCopyKernel<<<max_descriptors, kCopyThreads, 0, static_cast<cudaStream_t>(stream)>>>(descriptors, count,
                                                                                               pools, status);
  if (const cudaError_t e = cudaGetLastError(); e != cudaSuccess) return FromCudaError(static_cast<int>(e), 0);
  return kKernelOk;
}

KernelError GraphCaptureBegin(void* stream) {
  // Thread-local: another thread's unrelated CUDA calls do not invalidate this capture.
  if (const cudaError_t e = cudaStreamBeginCapture(static_cast<cudaStream_t>(stream), cudaStreamCaptureModeThreadLocal);
      e != cudaSuccess) {
    return FromCudaError(static_cast<int>(e), 0);
  }
  return kKernelOk;
}

KernelError GraphCaptureEnd(void* stream, void** graph_exec) {
  *graph_exec = nullptr;
  cudaGraph_t graph = nullptr;
  if (const cudaError_t e = cudaStreamEndCapture(static_cast<cudaStream_t>(stream), &graph); e != cudaSuccess) {
    return FromCudaError(static_cast<int>(e), 0);
  }
  cudaGraphExec_t exec = nullptr;
  const cudaError_t made = cudaGraphInstantiate(&exec, graph, 0);
  // The template is not needed once instantiated (nor when instantiation failed).
  if (const cudaError_t e = cudaGraphDestroy(graph); e != cudaSuccess && made == cudaSuccess) {
    if (const cudaError_t d = cudaGraphExecDestroy(exec); d != cudaSuccess) return FromCudaError(static_cast<int>(d), 0);
    return FromCudaError(static_cast<int>(e), 0);
  }
  if (made != cudaSuccess) return FromCudaError(static_cast<int>(made), 0);
  *graph_exec = exec;
  return kKernelOk;
}

KernelError GraphLaunch(void* graph_exec, void* stream) {
  if (const cudaError_t e = cudaGraphLaunch(static_cast<cudaGraphExec_t>(graph_exec), static_cast<cudaStream_t>(stream));
      e != cudaSuccess) {
    return FromCudaError(static_cast<int>(e), 0);
  }
  return kKernelOk;
}

KernelError GraphDestroy(void* graph_exec) {
  if (graph_exec == nullptr) return kKernelOk;
  if (const cudaError_t e = cudaGraphExecDestroy(static_cast<cudaGraphExec_t>(graph_exec)); e != cudaSuccess) {
    return FromCudaError(static_cast<int>(e), 0);
  }
  return kKernelOk;
}

}  // namespace ula::kernels::gpu
