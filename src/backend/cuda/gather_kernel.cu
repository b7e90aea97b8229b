#include "backend/cuda/gather_kernel.h"

namespace ula::cuda_backend {
namespace {

constexpr unsigned kWarp = 32;
constexpr unsigned kThreads = 256;  // 8 moves per block

__global__ void GatherRows(GatherArgs a) {
  const std::uint64_t warp = (std::uint64_t{blockIdx.x} * blockDim.x + threadIdx.x) / kWarp;
  const unsigned lane = threadIdx.x % kWarp;
  if (warp >= a.n) return;
  const RowMove m = a.moves[warp];
  std::byte* s = a.src + m.src_offset;
  std::byte* d = a.dst + m.dst_offset;
  const bool vec = ((reinterpret_cast<std::uintptr_t>(s) | reinterpret_cast<std::uintptr_t>(d) | a.bytes) & 15) == 0;
  if (vec) {
    auto* s4 = reinterpret_cast<uint4*>(s);
    auto* d4 = reinterpret_cast<uint4*>(d);
    for (unsigned i = lane; i < a.bytes / 16; i += kWarp) {
      const uint4 v = s4[i];
      if (a.swap) s4[i] = d4[i];
      d4[i] = v;
    }
    return;
  }
  for (unsigned i = lane; i < a.bytes; i += kWarp) {
    const std::byte v = s[i];
    if (a.swap) s[i] = d[i];
    d[i] = v;
  }
}

}  // namespace

cudaError_t LaunchGather(const GatherArgs& args, cudaStream_t stream) {
  if (args.n == 0) return cudaSuccess;
  const std::uint64_t threads = std::uint64_t{args.n} * kWarp;
  const auto blocks = static_cast<unsigned>((threads + kThreads - 1) / kThreads);
  GatherRows<<<blocks, kThreads, 0, stream>>>(args);
  return cudaGetLastError();
}

}  // namespace ula::cuda_backend
