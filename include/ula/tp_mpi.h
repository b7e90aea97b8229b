// The MPI engine for TP mode: one process per rank (launched with mpirun). This header
// declares it without including mpi.h — only src/tp/mpi does — so that code above
// the backend layer can use it when the build has MPI (target ula_mpi; the `ula` program
// defines ULA_HAVE_MPI when it links it).
//
//   auto session = MpiSession::Init(&argc, &argv);     // MPI_Init .. MPI_Finalize
//   auto fabric = MakeMpiFabric();                      // MPI_COMM_WORLD, rank = world rank
//   auto space = TpAddressSpace::Create(config, backend, {fabric->local_rank()});
//   fabric->Expose(**space);                            // RMA windows over the shard
//   TpStepPlanner planner(**space, fabric.get());       // every process steps together
//
// Fabric semantics: shard memory (home tables, device and host pools of every group) is
// exposed as MPI-3 RMA windows, locked once for the exposure (MPI_Win_lock_all, shared,
// passive target); FetchFromHome reads the home locations and then the bytes with MPI_Get
// and MPI_Win_flush, batched per source rank. Barrier is MPI_Win_sync on every window plus
// MPI_Barrier; AllTrue is MPI_Allreduce(LAND); AllGather is MPI_Allgather; AllToAllV is MPI_Alltoallv.
// Lifetime: the MpiSession outlives the fabric and everything that uses MPI (its
// destructor finalizes MPI); Unexpose the space before destroying it or the fabric.
// Thread-safety: MPI is initialized with MPI_THREAD_FUNNELED; call from the main thread.
#pragma once

#include <cstdint>
#include <memory>

#include "ula/error.h"
#include "ula/tp_fabric.h"

namespace ula {

class MpiSession {
 public:
  // MPI_Init_thread; kIo if MPI cannot start. One per process.
  static Result<std::unique_ptr<MpiSession>> Init(int* argc, char*** argv);
  ~MpiSession();  // MPI_Finalize
  MpiSession(const MpiSession&) = delete;
  MpiSession& operator=(const MpiSession&) = delete;

  std::uint32_t rank() const { return rank_; }
  std::uint32_t size() const { return size_; }
  static double Now();  // MPI_Wtime

 private:
  MpiSession(std::uint32_t rank, std::uint32_t size) : rank_(rank), size_(size) {}
  std::uint32_t rank_;
  std::uint32_t size_;
};

// A fabric over MPI_COMM_WORLD (duplicated). REQUIRES: an MpiSession exists.
Result<std::unique_ptr<TpFabric>> MakeMpiFabric();

}  // namespace ula
