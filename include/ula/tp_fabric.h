// TpFabric: how the ranks of one TP address space reach each other when they are not in
// the same process. In-process ranks (the default) need no fabric: the planner reads the
// other ranks' home tables directly and moves bytes with cross-rank backend batches. The
// MPI engine (src/tp/mpi, MakeMpiFabric in ula/tp_mpi.h) implements it with one
// process per rank: shard memory exposed as MPI-3 RMA windows and read with passive-target
// one-sided gets; agreement, barriers and the indexer's candidate gather are collectives.
//
// Every method marked "collective" must be called by every rank, in the same order.
// Thread-safety: one thread per process calls the fabric.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "ula/error.h"
#include "ula/ids.h"

namespace ula {

class TpAddressSpace;

class TpFabric {
 public:
  virtual ~TpFabric() = default;

  virtual std::uint32_t num_ranks() const = 0;
  // The rank this process hosts.
  virtual Rank local_rank() const = 0;

  // Collective: makes this rank's shard memory (home tables, device and host pools of
  // every group) readable by the other ranks. REQUIRES: space hosts local_rank() and
  // outlives the exposure (until Unexpose or the fabric's destruction).
  virtual Status Expose(const TpAddressSpace& space) = 0;
  // Collective: ends the exposure.
  virtual void Unexpose() = 0;
  // Collective: true iff every rank passed true.
  virtual bool AllTrue(bool mine) = 0;
  // Collective: no rank leaves before every rank's earlier local writes to its exposed
  // memory are visible to the others.
  virtual void Barrier() = 0;
  // Copies the home bytes of each addrs[i] (live, homed on src, group g) into dst[i]
  // (entry_bytes each). One-sided: src does not take part. Returns when bytes are in dst.
  virtual Status FetchFromHome(Rank src, GroupId group, std::span<const LogicalAddr> addrs,
                               std::span<std::byte* const> dst) = 0;
  // Collective: all.size() == num_ranks() * mine.size(); rank q's bytes land at q * mine.size().
  virtual Status AllGather(std::span<const std::byte> mine, std::span<std::byte> all) = 0;
  // Collective personalized exchange: send_counts[q] bytes of `send` (blocks in rank
  // order) go to rank q, and recv holds recv_counts[q] bytes from each rank q, in rank
  // order (recv_counts[q] must equal what q sends here). Used by the attention at home to
  // hand every head's partial records to the rank that owns the head. kInvalidArgument
  // for sizes that do not add up; kUnsupported from a fabric that moves no bytes (the
  // simulator's counting fabric).
  virtual Status AllToAllV(std::span<const std::byte> send, std::span<const std::size_t> send_counts,
                           std::span<std::byte> recv, std::span<const std::size_t> recv_counts) {
    (void)send, (void)send_counts, (void)recv, (void)recv_counts;
    return MakeError(ErrorCode::kUnsupported, "this fabric has no all-to-all");
  }
};

}  // namespace ula
