// The random-read reference of the GPU check (step_kernels.h, RandomRead): the cost of an
// independent 8-byte read at a random index of a table as large as a group's location table,
// the memory-bound floor that the device step's ns per distinct selection is compared with
// (docs/BENCHMARKS.md, "GPU check"). Arrays: table [num_entries] (read only), sink [threads]
// (written only where a thread's fold hits kSinkMark: practically never). No atomics; the
// result (the sink) does not depend on the schedule: each thread folds a fixed set of reads.
#include <cuda_runtime.h>

#include "kernels/step_kernels.h"

namespace ula::kernels::gpu {
namespace {
constexpr std::uint32_t kBlock = 256;
constexpr std::uint32_t kBlocks = 2048;
constexpr std::uint64_t kSinkMark = 0x9e3779b97f4a7c15ull;

__device__ std::uint64_t Mix(std::uint64_t x) {  // splitmix64's finaliser
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

__global__ void RandomReadKernel(const std::uint64_t* __restrict__ table, std::uint64_t num_entries,
                                 std::uint64_t reads, std::uint64_t seed, std::uint64_t* __restrict__ sink) {
  const std::uint64_t thread = std::uint64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  const std::uint64_t stride = std::uint64_t{gridDim.x} * blockDim.x;
  std::uint64_t fold = 0;
  for (std::uint64_t i = thread; i < reads; i += stride) fold += table[Mix(seed ^ i) % num_entries];
  if (fold == kSinkMark) sink[thread] = fold;
}
}  // namespace

std::uint32_t RandomReadThreads() { return kBlock * kBlocks; }

KernelError RandomRead(void* stream, const std::uint64_t* table, std::uint64_t num_entries, std::uint64_t reads,
                       std::uint64_t seed, std::uint64_t* sink) {
  if (num_entries == 0) return kKernelException;
  RandomReadKernel<<<kBlocks, kBlock, 0, static_cast<cudaStream_t>(stream)>>>(table, num_entries, reads, seed, sink);
  if (const cudaError_t e = cudaGetLastError(); e != cudaSuccess) return FromCudaError(static_cast<int>(e), 0);
  return kKernelOk;
}

}  // namespace ula::kernels::gpu
