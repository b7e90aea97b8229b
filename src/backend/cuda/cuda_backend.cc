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
// Errors are values: every CUDA call's result is checked (cuda_status.h) and becomes a kIo
// Status naming the call and CUDA's message; nothing throws or aborts. A batch that could not
// be enqueued at all (its kernel did not launch, a swap without peer access) fails at Submit
// and exchanged nothing; a batch that failed after part of it was enqueued (one of its
// cudaMemcpyAsync / cudaMemcpyPeerAsync, or its event) gets a fence whose Wait reports the
// error, so that Wait and WaitAll still cover what was enqueued. A failed copy batch's
// destinations are undefined (ula/backend.h).
// Current device: every call that needs a GPU makes it current for its own scope only
// (ScopedDevice): the caller's current device is the same after each call.
// Fences: CUDA events from a per-GPU pool, recorded after the batch's work and returned to
// the pool when the fence is waited on (no event is created once the pool covers the number
// of batches in flight).
// Note: a device arena's `data` is a device pointer; host code must not dereference it (the
// address spaces' Write / Read do: use this backend under the device step and the benches).
// Thread-safety: as Backend. One mutex guards the fence table and the pools; it is never held
// while waiting on an event (Wait and WaitAll wait outside it).
#include <cuda_runtime.h>
#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "backend/arena_registry.h"
#include "backend/cuda/cuda_status.h"
#include "backend/cuda/gather_kernel.h"

namespace ula {
namespace {

using cuda_backend::CudaDiscard;
using cuda_backend::CudaError;
using cuda_backend::CudaStatus;
using cuda_backend::ScopedDevice;

static_assert(sizeof(cuda_backend::RowMove) == sizeof(SlotMove));

class CudaBackend final : public Backend {
 public:
  static Result<std::unique_ptr<Backend>> Create(const CudaBackendOptions& options) {
    int devices = 0;
    if (const cudaError_t e = cudaGetDeviceCount(&devices); e != cudaSuccess || devices == 0) {
      return MakeError(ErrorCode::kFailedPrecondition,
                       fmt::format("cuda backend: no CUDA device is present ({})",
                                   e != cudaSuccess ? fmt::format("{}, {}", cudaGetErrorName(e), cudaGetErrorString(e))
                                                   : std::string("0 devices")));
    }
    auto b = std::unique_ptr<CudaBackend>(new CudaBackend());
    b->peer_.assign(static_cast<std::size_t>(devices) * devices, false);
    b->events_.resize(static_cast<std::size_t>(devices));
    for (int d = 0; d < devices; ++d) {
      auto on = ScopedDevice::Enter(d);
      if (!on) return std::unexpected(on.error());
      cudaStream_t s = nullptr;
      ULA_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
      b->streams_.push_back(s);
      for (int p = 0; p < devices && options.peer_access; ++p) {
        if (p == d) continue;
        int can = 0;
        ULA_CUDA_RETURN_IF_ERROR(cudaDeviceCanAccessPeer(&can, d, p));
        if (can == 0) continue;
        const cudaError_t e = cudaDeviceEnablePeerAccess(p, 0);
        b->peer_[static_cast<std::size_t>(d) * devices + p] = e == cudaSuccess || e == cudaErrorPeerAccessAlreadyEnabled;
        if (e != cudaSuccess) {
          // A refused enable leaves the direct path off (copies fall back to
          // cudaMemcpyPeerAsync); its error must not reach the next launch's check, which
          // reads the last error. Any other pending error is a real one.
          if (const cudaError_t last = cudaGetLastError(); last != cudaSuccess && last != e) {
            return std::unexpected(CudaError(last, "cudaGetLastError after cudaDeviceEnablePeerAccess"));
          }
        }
      }
    }
    return std::unique_ptr<Backend>(std::move(b));
  }

  // Teardown: errors here have no caller to go to (CudaDiscard).
  ~CudaBackend() override {
    WaitAll();
    for (auto& [bytes, p] : free_moves_) CudaDiscard(cudaFreeHost(p));
    for (void* p : retired_moves_) CudaDiscard(cudaFreeHost(p));
    for (auto& [id, m] : memory_) (void)Release(m);
    for (std::size_t d = 0; d < streams_.size(); ++d) {
      auto on = ScopedDevice::Enter(static_cast<int>(d));
      if (!on) continue;
      for (cudaEvent_t e : events_[d]) CudaDiscard(cudaEventDestroy(e));
      CudaDiscard(cudaStreamDestroy(streams_[d]));
    }
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
      auto on = ScopedDevice::Enter(m.device);
      if (!on) return std::unexpected(on.error());
      if (const cudaError_t e = cudaMalloc(&m.ptr, bytes == 0 ? 1 : bytes); e != cudaSuccess) {
        return MakeError(ErrorCode::kResourceExhausted, fmt::format("cuda backend: cudaMalloc of {} bytes on GPU {}: {}",
                                                                    bytes, m.device, cudaGetErrorString(e)));
      }
      // Zero-filled before any stream (the caller's included) can use it.
      cudaStream_t s = streams_[static_cast<std::size_t>(m.device)];
      Status zeroed = CudaStatus(cudaMemsetAsync(m.ptr, 0, bytes, s), "cudaMemsetAsync of a new device arena");
      if (zeroed) zeroed = CudaStatus(cudaStreamSynchronize(s), "cudaStreamSynchronize after zero-filling an arena");
      if (!zeroed) {
        CudaDiscard(cudaFree(m.ptr));  // clean-up: the error returned is zeroed's
        return std::unexpected(zeroed.error());
      }
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
    Memory m;
    {
      std::lock_guard lock(mu_);
      auto it = memory_.find(id.value());
      if (it == memory_.end()) return Ok();
      m = it->second;
      memory_.erase(it);
    }
    return Release(m);
  }

  Result<Arena> GetArena(ArenaId id) const override { return registry_.Get(id); }
  bool holds_bytes() const override { return true; }

  Result<Fence> Submit(CopyBatch batch) override {
    auto arenas = registry_.Validate(batch);
    if (!arenas) return std::unexpected(arenas.error());
    const Arena& src = arenas->first;
    const Arena& dst = arenas->second;
    if (src.tier == Tier::kHost && dst.tier == Tier::kHost) {  // no GPU involved
      RunOnHost(src, dst, batch);
      std::lock_guard lock(mu_);
      registry_.Count(src, dst, batch);
      return ++submitted_;
    }
    const int device = static_cast<int>(dst.tier == Tier::kDevice ? dst.rank.value() : src.rank.value());
    const bool cross = src.tier == Tier::kDevice && dst.tier == Tier::kDevice && src.rank != dst.rank;
    const bool direct = !cross || peer_[static_cast<std::size_t>(device) * streams_.size() + src.rank.value()];
    if (!direct && batch.swap) {
      return MakeError(ErrorCode::kUnsupported, fmt::format("cuda backend: a swap between GPUs {} and {} needs peer "
                                                            "access, which is not enabled", src.rank.value(), device));
    }
    auto on = ScopedDevice::Enter(device);
    if (!on) return std::unexpected(on.error());
    std::lock_guard lock(mu_);
    cudaStream_t stream = streams_[static_cast<std::size_t>(device)];
    Pending p;
    p.device = device;
    Status enqueued = Ok();  // the first error after part of the batch may have been enqueued
    if (!direct) {
      for (const SlotMove& m : batch.moves) {
        enqueued = CudaStatus(cudaMemcpyPeerAsync(dst.data + m.dst_offset, device, src.data + m.src_offset,
                                                  static_cast<int>(src.rank.value()), batch.bytes_per_move, stream),
                              "cudaMemcpyPeerAsync");
        if (!enqueued) break;
      }
    } else if (!batch.swap && batch.bytes_per_move >= kBulkBytes) {
      // Few large moves: the copy engine (cudaMemcpyAsync, any direction over UVA).
      for (const SlotMove& m : batch.moves) {
        enqueued = CudaStatus(cudaMemcpyAsync(dst.data + m.dst_offset, src.data + m.src_offset, batch.bytes_per_move,
                                              cudaMemcpyDefault, stream),
                              "cudaMemcpyAsync");
        if (!enqueued) break;
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
      if (const cudaError_t e = cuda_backend::LaunchGather(g, stream); e != cudaSuccess) {
        free_moves_.emplace(p.moves_bytes, p.moves);  // nothing was enqueued: nothing exchanged
        return std::unexpected(CudaError(e, "gather kernel launch"));
      }
    }
    p.status = std::move(enqueued);
    if (Status fenced = RecordFence(p, stream); !fenced) {
      // No event covers the batch: finish it here, so that no later wait misses it.
      if (p.status) p.status = std::move(fenced);
      if (Status drained = CudaStatus(cudaStreamSynchronize(stream), "cudaStreamSynchronize of an unfenced batch");
          !drained && p.moves != nullptr) {
        retired_moves_.push_back(p.moves);  // the kernel may still read it: never reused
        p.moves = nullptr;
      }
    }
    if (p.status) registry_.Count(src, dst, batch);
    const Fence fence = ++submitted_;
    pending_.emplace(fence, std::move(p));
    return fence;
  }

  Status Wait(Fence fence) override {
    WaitUpTo(fence);
    std::lock_guard lock(mu_);
    auto it = failed_.find(fence);
    if (it == failed_.end()) return Ok();
    Status s = std::move(it->second);
    failed_.erase(it);
    return s;
  }

  void WaitAll() override {
    Fence last = 0;
    {
      std::lock_guard lock(mu_);
      last = submitted_;
    }
    WaitUpTo(last);
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
    int device = 0;
    cudaEvent_t event = nullptr;  // from events_[device]; nullptr: finished at Submit
    void* moves = nullptr;        // pinned, mapped (from free_moves_)
    std::size_t moves_bytes = 0;
    Status status = Ok();         // an enqueue error
  };
  // Moves of this many bytes or more per move (a bulk copy) go to cudaMemcpyAsync.
  static constexpr std::uint32_t kBulkBytes = 1u << 20;

  CudaBackend() = default;

  // REQUIRES: mu_ held, p.device current. Records an event from the device's pool after the
  // batch's work on `stream` into p.event; on failure p.event stays nullptr.
  Status RecordFence(Pending& p, cudaStream_t stream) {
    auto& pool = events_[static_cast<std::size_t>(p.device)];
    cudaEvent_t e = nullptr;
    if (!pool.empty()) {
      e = pool.back();
      pool.pop_back();
    } else {
      ULA_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    }
    if (Status s = CudaStatus(cudaEventRecord(e, stream), "cudaEventRecord of a batch's fence"); !s) {
      pool.push_back(e);
      return s;
    }
    p.event = e;
    return Ok();
  }

  // Blocks until every batch up to `fence` has completed; finishes those still pending (their
  // events and move buffers back to the pools) and files each failure in failed_ under its
  // fence. The events are waited on outside mu_: an event another waiter finished meanwhile
  // and the pool handed to a later batch only makes this wait longer (events are never
  // destroyed before the backend).
  void WaitUpTo(Fence fence) {
    struct Waiting {
      Fence fence;
      cudaEvent_t event;
      Status synced = Ok();
    };
    std::vector<Waiting> waits;
    {
      std::lock_guard lock(mu_);
      for (auto it = pending_.begin(); it != pending_.end() && it->first <= fence; ++it) {
        waits.push_back({it->first, it->second.event});
      }
    }
    for (Waiting& w : waits) {
      if (w.event != nullptr) w.synced = CudaStatus(cudaEventSynchronize(w.event), "batch");
    }
    std::lock_guard lock(mu_);
    for (Waiting& w : waits) {
      auto it = pending_.find(w.fence);
      if (it == pending_.end()) continue;  // another waiter finished it
      Pending& p = it->second;
      Status s = std::move(p.status);
      if (s) s = std::move(w.synced);
      if (p.event != nullptr) events_[static_cast<std::size_t>(p.device)].push_back(p.event);
      if (p.moves != nullptr) free_moves_.emplace(p.moves_bytes, p.moves);
      if (!s) failed_.emplace(w.fence, std::move(s));
      pending_.erase(it);
    }
  }

  // REQUIRES: mu_ held. A pinned, mapped buffer of at least `bytes` for a batch's moves: a
  // free one, or a new one (buffers are reused, never freed before the backend: Submit
  // allocates only while the number and size of in-flight batches grow).
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

  static Status Release(const Memory& m) {
    if (m.pinned) return CudaStatus(cudaFreeHost(m.ptr), "cudaFreeHost of a host arena");
    auto on = ScopedDevice::Enter(m.device);
    if (!on) return std::unexpected(on.error());
    return CudaStatus(cudaFree(m.ptr), "cudaFree of a device arena");
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
  std::mutex mu_;                           // guards everything below but streams_ and peer_
  std::vector<cudaStream_t> streams_;       // [devices] copy streams (fixed at Create)
  std::vector<bool> peer_;                  // [devices][devices] d reads p's memory directly
  std::vector<std::vector<cudaEvent_t>> events_;  // [devices] free fence events
  std::unordered_map<std::uint32_t, Memory> memory_;
  std::map<Fence, Pending> pending_;
  std::map<Fence, Status> failed_;          // failed batches finished, until waited on
  std::multimap<std::size_t, void*> free_moves_;  // reusable move buffers by size
  std::vector<void*> retired_moves_;        // buffers a failed batch may still read
  Fence submitted_ = 0;
};

}  // namespace

Result<std::unique_ptr<Backend>> MakeCudaBackend(const CudaBackendOptions& options) {
  return CudaBackend::Create(options);
}

}  // namespace ula
