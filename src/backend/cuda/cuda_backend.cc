// The cuda backend (ula/backend.h, MakeCudaBackend): device arenas in GPU memory (cudaMalloc
// on the GPU of the arena's rank: rank r = CUDA device r), host arenas in pinned, mapped host
// memory (cudaHostAlloc), every batch one gather/scatter kernel (gather_kernel.h) on the copy
// stream of the GPU it runs on, each fence a CUDA event recorded after its kernel.
//
// Which GPU runs a batch: the destination's when it is a device arena, else the source's.
// GPU-to-GPU batches of one process read the peer's memory directly when peer access could be
// enabled (cudaDeviceEnablePeerAccess at creation); without it a copy batch falls back to one
// cudaMemcpyPeerAsync per move and a swap batch is refused (kUnsupported). Host-to-host
// batches run on the calling thread (memcpy), complete at Submit.
// Each batch's moves go to a pinned, mapped buffer the kernel reads over the bus (16 bytes per
// 656-byte row), back to a free list when its fence is waited on. A batch of moves of 1 MiB
// or more runs on the copy engine instead (cudaMemcpyAsync per move).
// Failure: a launch or event error fails that batch (kIo with CUDA's message): a copy batch's
// destinations are then undefined, and a swap kernel that did not launch exchanged nothing.
// Note: a device arena's `data` is a device pointer; host code must not dereference it (the
// address spaces' Write / Read do: use this backend under the device step and the benches).
// Thread-safety: as Backend (one mutex around the fence table).
#include <cuda_runtime.h>
#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "backend/arena_registry.h"
#include "backend/cuda/gather_kernel.h"

namespace ula {
namespace {

static_assert(sizeof(cuda_backend::RowMove) == sizeof(SlotMove));

Error CudaError(cudaError_t e, const char* what) {
  return Error(ErrorCode::kIo, fmt::format("cuda backend: {}: {} ({})", what, cudaGetErrorString(e), static_cast<int>(e)));
}

class CudaBackend final : public Backend {
 public:
  static Result<std::unique_ptr<Backend>> Create(const CudaBackendOptions& options) {
    int devices = 0;
    if (const cudaError_t e = cudaGetDeviceCount(&devices); e != cudaSuccess || devices == 0) {
      return MakeError(ErrorCode::kFailedPrecondition,
                       fmt::format("cuda backend: no CUDA device is present ({})",
                                   e != cudaSuccess ? cudaGetErrorString(e) : "0 devices"));
    }
    auto b = std::unique_ptr<CudaBackend>(new CudaBackend());
    b->peer_.assign(static_cast<std::size_t>(devices) * devices, false);
    for (int d = 0; d < devices; ++d) {
      cudaSetDevice(d);
      cudaStream_t s = nullptr;
      if (const cudaError_t e = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking); e != cudaSuccess) {
        return std::unexpected(CudaError(e, "cudaStreamCreateWithFlags"));
      }
      b->streams_.push_back(s);
      for (int p = 0; p < devices && options.peer_access; ++p) {
        int can = 0;
        if (p != d && cudaDeviceCanAccessPeer(&can, d, p) == cudaSuccess && can != 0) {
          const cudaError_t e = cudaDeviceEnablePeerAccess(p, 0);
          b->peer_[static_cast<std::size_t>(d) * devices + p] = e == cudaSuccess || e == cudaErrorPeerAccessAlreadyEnabled;
          cudaGetLastError();  // clear a sticky "already enabled"
        }
      }
    }
    return std::unique_ptr<Backend>(std::move(b));
  }

  ~CudaBackend() override {
    WaitAll();
    for (auto& [bytes, p] : free_moves_) cudaFreeHost(p);
    for (auto& [id, m] : memory_) Release(m);
    for (cudaStream_t s : streams_) cudaStreamDestroy(s);
  }

  Result<Arena> CreateArena(Tier tier, Rank rank, std::uint64_t bytes) override {
    Memory m;
    m.pinned = tier == Tier::kHost;
    m.device = static_cast<int>(rank.value());
    if (!m.pinned) {
      if (rank.value() >= streams_.size()) {
        return MakeError(ErrorCode::kOutOfRange, fmt::format("cuda backend: rank {} has no GPU ({} devices)",
                                                             rank.value(), streams_.size()));
      }
      cudaSetDevice(m.device);
      if (const cudaError_t e = cudaMalloc(&m.ptr, bytes == 0 ? 1 : bytes); e != cudaSuccess) {
        return MakeError(ErrorCode::kResourceExhausted, fmt::format("cuda backend: cudaMalloc of {} bytes on GPU {}: {}",
                                                                    bytes, m.device, cudaGetErrorString(e)));
      }
      cudaMemset(m.ptr, 0, bytes);
      cudaDeviceSynchronize();
    } else {
      if (const cudaError_t e = cudaHostAlloc(&m.ptr, bytes == 0 ? 1 : bytes, cudaHostAllocPortable | cudaHostAllocMapped);
          e != cudaSuccess) {
        return MakeError(ErrorCode::kResourceExhausted, fmt::format("cuda backend: cudaHostAlloc of {} bytes: {}", bytes,
                                                                    cudaGetErrorString(e)));
      }
      std::memset(m.ptr, 0, bytes);
    }
    const ArenaId id = registry_.Add(tier, rank, bytes, static_cast<std::byte*>(m.ptr));
    std::lock_guard lock(mu_);
    memory_[id.value()] = m;
    return registry_.Get(id);
  }

  Status DestroyArena(ArenaId id) override {
    ULA_RETURN_IF_ERROR(registry_.Remove(id));
    WaitAll();  // no batch may still use it
    std::lock_guard lock(mu_);
    auto it = memory_.find(id.value());
    if (it != memory_.end()) {
      Release(it->second);
      memory_.erase(it);
    }
    return Ok();
  }

  Result<Arena> GetArena(ArenaId id) const override { return registry_.Get(id); }
  bool holds_bytes() const override { return true; }

  Result<Fence> Submit(CopyBatch batch) override {
    auto arenas = registry_.Validate(batch);
    if (!arenas) return std::unexpected(arenas.error());
    const Arena& src = arenas->first;
    const Arena& dst = arenas->second;
    std::lock_guard lock(mu_);
    const Fence fence = ++submitted_;
    if (src.tier == Tier::kHost && dst.tier == Tier::kHost) {  // no GPU involved
      RunOnHost(src, dst, batch);
      registry_.Count(src, dst, batch);
      return fence;
    }
    const int device = static_cast<int>(dst.tier == Tier::kDevice ? dst.rank.value() : src.rank.value());
    const bool cross = src.tier == Tier::kDevice && dst.tier == Tier::kDevice && src.rank != dst.rank;
    cudaSetDevice(device);
    Pending p;
    if (cross && !peer_[static_cast<std::size_t>(device) * streams_.size() + src.rank.value()]) {
      if (batch.swap) {
        return MakeError(ErrorCode::kUnsupported, fmt::format("cuda backend: a swap between GPUs {} and {} needs peer "
                                                              "access, which is not enabled", src.rank.value(), device));
      }
      for (const SlotMove& m : batch.moves) {
        cudaMemcpyPeerAsync(dst.data + m.dst_offset, device, src.data + m.src_offset, static_cast<int>(src.rank.value()),
                            batch.bytes_per_move, streams_[device]);
      }
    } else if (!batch.swap && batch.bytes_per_move >= kBulkBytes) {
      // Few large moves: the copy engine (cudaMemcpyAsync, any direction over UVA).
      for (const SlotMove& m : batch.moves) {
        cudaMemcpyAsync(dst.data + m.dst_offset, src.data + m.src_offset, batch.bytes_per_move, cudaMemcpyDefault,
                        streams_[device]);
      }
    } else if (!batch.moves.empty()) {
      const std::size_t bytes = batch.moves.size() * sizeof(SlotMove);
      auto buf = TakeMoveBuffer(bytes);
      if (!buf) return std::unexpected(buf.error());
      p.moves = buf->first;
      p.moves_bytes = buf->second;
      std::memcpy(p.moves, batch.moves.data(), bytes);
      cuda_backend::GatherArgs g;
      g.src = src.data;
      g.dst = dst.data;
      g.moves = static_cast<const cuda_backend::RowMove*>(p.moves);
      g.n = static_cast<std::uint32_t>(batch.moves.size());
      g.bytes = batch.bytes_per_move;
      g.swap = batch.swap;
      if (const cudaError_t e = cuda_backend::LaunchGather(g, streams_[device]); e != cudaSuccess) {
        free_moves_.emplace(p.moves_bytes, p.moves);
        return std::unexpected(CudaError(e, "gather kernel launch"));
      }
    }
    cudaEventCreateWithFlags(&p.event, cudaEventDisableTiming);
    if (const cudaError_t e = cudaEventRecord(p.event, streams_[device]); e != cudaSuccess) {
      p.status = std::unexpected(CudaError(e, "cudaEventRecord"));
    }
    registry_.Count(src, dst, batch);
    pending_.emplace(fence, p);
    return fence;
  }

  Status Wait(Fence fence) override {
    std::lock_guard lock(mu_);
    Status mine = Ok();
    while (!pending_.empty() && pending_.begin()->first <= fence) {
      auto it = pending_.begin();
      Status s = Finish(it->second, free_moves_);
      if (it->first == fence) mine = std::move(s);
      pending_.erase(it);
    }
    return mine;
  }

  void WaitAll() override {
    std::lock_guard lock(mu_);
    for (auto& [f, p] : pending_) (void)Finish(p, free_moves_);
    pending_.clear();
  }

  TransferCounters counters() const override { return registry_.counters(); }
  void ResetCounters() override { registry_.ResetCounters(); }

 private:
  struct Memory {
    void* ptr = nullptr;
    bool pinned = false;
    int device = 0;
  };
  struct Pending {
    cudaEvent_t event = nullptr;
    void* moves = nullptr;  // pinned, mapped (from free_moves_)
    std::size_t moves_bytes = 0;
    Status status = Ok();
  };
  // Moves of this many bytes or more per move (a bulk copy) go to cudaMemcpyAsync.
  static constexpr std::uint32_t kBulkBytes = 1u << 20;

  // A pinned, mapped buffer of at least `bytes` for a batch's moves: a free one, or a new
  // one (buffers are reused, never freed before the backend: Submit allocates only while the
  // number and size of in-flight batches grow).
  Result<std::pair<void*, std::size_t>> TakeMoveBuffer(std::size_t bytes) {
    if (auto it = free_moves_.lower_bound(bytes); it != free_moves_.end()) {
      auto got = std::make_pair(it->second, it->first);
      free_moves_.erase(it);
      return got;
    }
    void* p = nullptr;
    const std::size_t size = std::max<std::size_t>(bytes, 4096);
    if (const cudaError_t e = cudaHostAlloc(&p, size, cudaHostAllocPortable | cudaHostAllocMapped); e != cudaSuccess) {
      return std::unexpected(CudaError(e, "cudaHostAlloc of a batch's moves"));
    }
    return std::make_pair(p, size);
  }

  CudaBackend() = default;

  static void Release(const Memory& m) {
    if (m.pinned) {
      cudaFreeHost(m.ptr);
    } else {
      cudaSetDevice(m.device);
      cudaFree(m.ptr);
    }
  }
  static Status Finish(Pending& p, std::multimap<std::size_t, void*>& free_moves) {
    Status s = std::move(p.status);
    if (p.event != nullptr) {
      if (const cudaError_t e = cudaEventSynchronize(p.event); e != cudaSuccess && s) s = std::unexpected(CudaError(e, "batch"));
      cudaEventDestroy(p.event);
    }
    if (p.moves != nullptr) free_moves.emplace(p.moves_bytes, p.moves);
    return s;
  }
  static void RunOnHost(const Arena& src, const Arena& dst, const CopyBatch& batch) {
    std::vector<std::byte> tmp(batch.bytes_per_move);
    for (const SlotMove& m : batch.moves) {
      if (batch.swap) {
        std::memcpy(tmp.data(), src.data + m.src_offset, batch.bytes_per_move);
        std::memcpy(src.data + m.src_offset, dst.data + m.dst_offset, batch.bytes_per_move);
        std::memcpy(dst.data + m.dst_offset, tmp.data(), batch.bytes_per_move);
      } else {
        std::memcpy(dst.data + m.dst_offset, src.data + m.src_offset, batch.bytes_per_move);
      }
    }
  }

  backend_internal::ArenaRegistry registry_;
  std::mutex mu_;
  std::vector<cudaStream_t> streams_;       // [devices] copy streams
  std::vector<bool> peer_;                  // [devices][devices] d reads p's memory directly
  std::unordered_map<std::uint32_t, Memory> memory_;
  std::map<Fence, Pending> pending_;
  std::multimap<std::size_t, void*> free_moves_;  // reusable move buffers by size
  Fence submitted_ = 0;
};

}  // namespace

Result<std::unique_ptr<Backend>> MakeCudaBackend(const CudaBackendOptions& options) {
  return CudaBackend::Create(options);
}

}  // namespace ula
