// Backend: the narrow platform layer under everything else. Three primitives:
//   1. create an arena (a byte range) on (tier, rank);
//   2. submit a batch of equal-size slot copies (or swaps) between two arenas;
//   3. wait on the fence a submit returned.
// Everything above src/backend/ talks only to this interface; nothing above it includes
// MPI or CUDA headers.
//
// Implementations:
//   cpu       real bytes in host memory, copies run on a worker thread (a "copy stream"):
//             batches complete in submission order; Wait(f) returns once batch f and every
//             earlier one has completed and its bytes are visible to the caller.
//   counting  no bytes at all; arenas are sizes, copies only add to the transfer counters.
//             Lets a full-scale simulation (8 ranks, hundreds of 128K-token requests) fit here.
//   cuda      GPU and pinned host memory, one copy kernel per batch on a copy stream, CUDA
//             events as fences (MakeCudaBackend; only where ULA_WITH_CUDA is on).
//
// Contract of a batch: every move lies inside its arenas (checked at Submit: an error,
// nothing submitted); a copy's source and destination ranges never overlap; within one
// swap batch, no slot appears twice. Counters count a swap as two transfers, one per
// direction.
//
// Failed batches (a transfer error, reported by Submit or by Wait on the batch's fence; the
// cpu and counting backends never fail one, FaultInjectingBackend in backend/fault_backend.h
// does on purpose): a failed copy batch leaves its sources untouched and its destinations
// undefined (any of its moves may have landed); a failed swap batch has exchanged nothing
// (a swap batch is applied whole or not at all: a backend that cannot stage it must not
// report the failure as an error value). Callers therefore copy into slots that nothing
// published points at, wait, and publish only what a successful wait covered.
//
// Thread-safety: Submit, Wait and counters() may be called from any thread; arena creation
// and destruction must not race with batches that use the arena.
//
// Lifetime: a backend outlives every object that holds arenas on it (AddressSpace,
// TpAddressSpace: each holds the backend by reference, AddHolder/RemoveHolder). Destroying
// a backend while a holder lives stops the program (ULA_CHECK) with a message saying to
// destroy the spaces first, instead of leaving them with dangling arenas.
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "ula/error.h"
#include "ula/ids.h"

namespace ula {

using ArenaId = StrongId<struct ArenaIdTag, std::uint32_t>;
using Fence = std::uint64_t;

struct Arena {
  ArenaId id;
  Tier tier = Tier::kDevice;
  Rank rank;
  std::uint64_t bytes = 0;
  std::byte* data = nullptr;  // nullptr on the counting backend
};

struct SlotMove {
  std::uint64_t src_offset = 0;
  std::uint64_t dst_offset = 0;
};

struct CopyBatch {
  ArenaId src;
  ArenaId dst;
  std::uint32_t bytes_per_move = 0;
  bool swap = false;             // exchange the two ranges instead of copying src -> dst
  std::vector<SlotMove> moves;
};

// Bytes and entries moved, by (source tier, destination tier, same rank / other rank).
struct TransferCounters {
  // [src tier][dst tier][0 = same rank, 1 = other rank]
  std::array<std::array<std::array<std::uint64_t, 2>, kNumTiers>, kNumTiers> bytes{};
  std::array<std::array<std::array<std::uint64_t, 2>, kNumTiers>, kNumTiers> moves{};
  std::uint64_t batches = 0;

  std::uint64_t Bytes(Tier src, Tier dst, bool cross_rank) const {
    return bytes[static_cast<int>(src)][static_cast<int>(dst)][cross_rank ? 1 : 0];
  }
  std::uint64_t Moves(Tier src, Tier dst, bool cross_rank) const {
    return moves[static_cast<int>(src)][static_cast<int>(dst)][cross_rank ? 1 : 0];
  }
  std::uint64_t TotalBytes() const;
};

class Backend {
 public:
  // ULA_CHECK: no holder is left (see "Lifetime" above).
  virtual ~Backend();
  Backend() = default;
  Backend(const Backend&) = delete;
  Backend& operator=(const Backend&) = delete;

  // A new zero-filled arena (no memory on the counting backend).
  virtual Result<Arena> CreateArena(Tier tier, Rank rank, std::uint64_t bytes) = 0;
  virtual Status DestroyArena(ArenaId id) = 0;
  // The arena's description, or kNotFound.
  virtual Result<Arena> GetArena(ArenaId id) const = 0;
  // Whether arenas hold real bytes (false: counting only).
  virtual bool holds_bytes() const = 0;

  // Validates and enqueues the batch; returns the fence that Wait takes.
  virtual Result<Fence> Submit(CopyBatch batch) = 0;
  // Blocks until the batch with this fence and all earlier ones have completed. Returns the
  // error of batch `fence` itself when it failed (an earlier batch's failure is reported by
  // a Wait on that batch's own fence), Ok when its moves have landed and are visible.
  virtual Status Wait(Fence fence) = 0;
  // Waits for everything submitted so far (teardown); reports no failure.
  virtual void WaitAll() = 0;

  virtual TransferCounters counters() const = 0;
  virtual void ResetCounters() = 0;

  // An object that keeps arenas of this backend for its lifetime registers itself here
  // (constructor / destructor); the backend's destructor checks that none is left.
  void AddHolder() { holders_.fetch_add(1, std::memory_order_relaxed); }
  void RemoveHolder() { holders_.fetch_sub(1, std::memory_order_relaxed); }
  std::uint32_t num_holders() const { return holders_.load(std::memory_order_relaxed); }

 private:
  std::atomic<std::uint32_t> holders_{0};
};

struct CpuBackendOptions {
  // Worker threads that execute copy batches in order. 0: copies run inside Submit.
  int copy_threads = 1;
};

std::unique_ptr<Backend> MakeCpuBackend(const CpuBackendOptions& options = {});

struct CudaBackendOptions {
  bool peer_access = true;  // enable peer access between the process's GPUs where possible
};
// The cuda backend (src/backend/cuda): rank r's device arenas on CUDA device r (cudaMalloc),
// host arenas pinned and mapped (cudaHostAlloc), each batch one gather/scatter kernel on a
// copy stream, fences as CUDA events, GPU-to-GPU batches through peer access. A device
// arena's `data` is a device pointer. kUnsupported in a build without CUDA (ULA_WITH_CUDA),
// kFailedPrecondition when no CUDA device is present.
Result<std::unique_ptr<Backend>> MakeCudaBackend(const CudaBackendOptions& options = {});
std::unique_ptr<Backend> MakeCountingBackend();

}  // namespace ula
