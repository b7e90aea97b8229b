// The cuda backend's copy kernel: one launch per CopyBatch, one warp per move, 16-byte vector
// loads and stores where the row and both offsets are 16-byte aligned (656-byte rows: 41 per
// lane group), bytes otherwise. Sources and destinations are UVA pointers (device memory of
// this or a peer GPU, or mapped pinned host memory), so one kernel serves device<->device,
// host<->device and GPU<->GPU batches. A swap exchanges the two ranges lane by lane (within a
// batch no slot appears twice: the warps' ranges are disjoint).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace ula::cuda_backend {

struct RowMove {  // SlotMove's layout (ula/backend.h)
  std::uint64_t src_offset;
  std::uint64_t dst_offset;
};

struct GatherArgs {
  std::byte* src = nullptr;            // base of the source arena
  std::byte* dst = nullptr;            // base of the destination arena
  const RowMove* moves = nullptr;      // [n] readable by the device (mapped pinned memory)
  std::uint32_t n = 0;
  std::uint32_t bytes = 0;             // per move
  bool swap = false;
};

// Enqueues the batch on `stream`; returns the launch's error (cudaSuccess when enqueued).
[[nodiscard]] cudaError_t LaunchGather(const GatherArgs& args, cudaStream_t stream);

}  // namespace ula::cuda_backend
