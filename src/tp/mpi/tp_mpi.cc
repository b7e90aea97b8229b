// MPI engine for TP mode (include/ula/tp_mpi.h). The only file of the project that
// includes mpi.h. Windows: per layer group three — the home table (disp unit 8: one
// Location per address / P), the device pool and the host pool (disp unit 1). Each is
// locked with MPI_Win_lock_all for the whole exposure; reads are MPI_Get + MPI_Win_flush,
// coalesced per batch into one MPI_Get per run of contiguous remote memory.
// The owner writes its window memory only in the planner's home phase, which a Barrier
// (MPI_Win_sync + MPI_Barrier) separates from the other ranks' reads.
#include <fmt/format.h>
#include <mpi.h>

#include <algorithm>
#include <climits>
#include <vector>

#include "ula/location.h"
#include "ula/tp_address_space.h"
#include "ula/tp_mpi.h"

namespace ula {

Result<std::unique_ptr<MpiSession>> MpiSession::Init(int* argc, char*** argv) {
  int provided = 0;
  if (MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS) {
    return MakeError(ErrorCode::kIo, "MPI_Init_thread failed");
  }
  int rank = 0, size = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  return std::unique_ptr<MpiSession>(new MpiSession(static_cast<std::uint32_t>(rank), static_cast<std::uint32_t>(size)));
}

MpiSession::~MpiSession() { MPI_Finalize(); }
double MpiSession::Now() { return MPI_Wtime(); }

namespace {

class MpiFabric final : public TpFabric {
 public:
  MpiFabric(MPI_Comm comm, std::uint32_t rank, std::uint32_t size) : comm_(comm), rank_(rank), size_(size) {}
  ~MpiFabric() override {
    Unexpose();
    MPI_Comm_free(&comm_);
  }

  std::uint32_t num_ranks() const override { return size_; }
  Rank local_rank() const override { return Rank(static_cast<std::uint16_t>(rank_)); }

  Status Expose(const TpAddressSpace& space) override {
    if (!wins_.empty()) return MakeError(ErrorCode::kFailedPrecondition, "fabric: already exposed");
    if (space.config().num_ranks != size_ || !space.Hosts(local_rank()) || space.hosted_ranks().size() != 1) {
      return MakeError(ErrorCode::kInvalidArgument,
                       fmt::format("fabric: the space must have {} ranks and host exactly rank {}", size_, rank_));
    }
    entry_bytes_ = space.config().entry_bytes;
    for (std::uint32_t g = 0; g < space.config().num_groups; ++g) {
      const TpShardMemory mem = space.ShardMemory(local_rank(), GroupId(static_cast<std::uint16_t>(g)));
      Windows w{};
      MPI_Win_create(const_cast<Location*>(mem.home), static_cast<MPI_Aint>(mem.home_entries) * 8, 8, MPI_INFO_NULL,
                     comm_, &w.home);
      MPI_Win_create(mem.device.data, static_cast<MPI_Aint>(mem.device.bytes), 1, MPI_INFO_NULL, comm_, &w.device);
      MPI_Win_create(mem.host.data, static_cast<MPI_Aint>(mem.host.bytes), 1, MPI_INFO_NULL, comm_, &w.host);
      for (MPI_Win win : {w.home, w.device, w.host}) MPI_Win_lock_all(MPI_MODE_NOCHECK, win);
      wins_.push_back(w);
    }
    MPI_Barrier(comm_);
    return Ok();
  }

  void Unexpose() override {
    if (wins_.empty()) return;
    MPI_Barrier(comm_);
    for (Windows& w : wins_) {
      for (MPI_Win* win : {&w.home, &w.device, &w.host}) {
        MPI_Win_unlock_all(*win);
        MPI_Win_free(win);
      }
    }
    wins_.clear();
  }

  bool AllTrue(bool mine) override {
    int in = mine ? 1 : 0, out = 0;
    MPI_Allreduce(&in, &out, 1, MPI_INT, MPI_LAND, comm_);
    return out != 0;
  }

  void Barrier() override {
    for (Windows& w : wins_) {
      for (MPI_Win win : {w.home, w.device, w.host}) MPI_Win_sync(win);
    }
    MPI_Barrier(comm_);
    for (Windows& w : wins_) {
      for (MPI_Win win : {w.home, w.device, w.host}) MPI_Win_sync(win);
    }
  }

  // Coalesced: the home locations are read in runs of consecutive home-table indices, and
  // the bytes in runs of consecutive slots of one tier (one MPI_Get per run). A run whose
  // destinations are not contiguous gets them through an hindexed origin datatype.
  Status FetchFromHome(Rank src, GroupId group, std::span<const LogicalAddr> addrs,
                       std::span<std::byte* const> dst) override {
    if (group.value() >= wins_.size() || src.value() >= size_ || addrs.size() != dst.size()) {
      return MakeError(ErrorCode::kInvalidArgument, "fabric: bad fetch arguments (not exposed, rank or group)");
    }
    const Windows& w = wins_[group.value()];
    const int target = src.value();
    const std::size_t n = addrs.size();
    if (n == 0) return Ok();
    // 1. Home locations, sorted by home-table index, into locs_ in that order.
    order_.resize(n);
    for (std::size_t i = 0; i < n; ++i) order_[i] = static_cast<std::uint32_t>(i);
    std::sort(order_.begin(), order_.end(),
              [&](std::uint32_t x, std::uint32_t y) { return addrs[x].value() < addrs[y].value(); });
    locs_.resize(n);
    constexpr std::size_t kMaxRunLocs = std::size_t{1} << 27;  // 8-byte locations per get (int count)
    for (std::size_t k = 0; k < n;) {
      const std::uint64_t first = addrs[order_[k]].value() / size_;
      std::size_t len = 1;
      while (k + len < n && len < kMaxRunLocs && addrs[order_[k + len]].value() / size_ == first + len) ++len;
      MPI_Get(&locs_[k], static_cast<int>(len * 8), MPI_BYTE, target, static_cast<MPI_Aint>(first),
              static_cast<int>(len * 8), MPI_BYTE, w.home);
      k += len;
    }
    MPI_Win_flush(target, w.home);
    // 2. The bytes: (tier, slot, destination) sorted by tier then slot.
    reads_.resize(n);
    for (std::size_t k = 0; k < n; ++k) {
      const std::size_t i = order_[k];
      const Location loc = Location::FromBits(locs_[k]);
      if (loc.is_none() || loc.rank() != src) {
        return MakeError(ErrorCode::kInternal,
                         fmt::format("fabric: rank {} has no home for address {}", src.value(), addrs[i].value()));
      }
      reads_[k] = Read{loc.tier() == Tier::kDevice ? 0u : 1u, loc.slot().value(), dst[i]};
    }
    std::sort(reads_.begin(), reads_.end(),
              [](const Read& x, const Read& y) { return x.tier != y.tier ? x.tier < y.tier : x.slot < y.slot; });
    const std::uint64_t eb = entry_bytes_;
    const std::size_t max_run = std::max<std::size_t>(1, static_cast<std::size_t>(INT_MAX) / eb);
    bool used[2] = {false, false};
    std::vector<MPI_Datatype> types;
    for (std::size_t k = 0; k < n;) {
      const Read& r0 = reads_[k];
      std::size_t len = 1;
      bool dst_contiguous = true;
      while (k + len < n && len < max_run && reads_[k + len].tier == r0.tier &&
             reads_[k + len].slot == r0.slot + len) {
        dst_contiguous = dst_contiguous && reads_[k + len].dst == r0.dst + len * eb;
        ++len;
      }
      used[r0.tier] = true;
      const MPI_Win win = r0.tier == 0 ? w.device : w.host;
      const int bytes = static_cast<int>(len * eb);
      const MPI_Aint disp = static_cast<MPI_Aint>(std::uint64_t{r0.slot} * eb);
      if (dst_contiguous) {
        MPI_Get(r0.dst, bytes, MPI_BYTE, target, disp, bytes, MPI_BYTE, win);
      } else {
        displs_.resize(len);
        for (std::size_t j = 0; j < len; ++j) MPI_Get_address(reads_[k + j].dst, &displs_[j]);
        MPI_Datatype type;
        MPI_Type_create_hindexed_block(static_cast<int>(len), static_cast<int>(eb), displs_.data(), MPI_BYTE, &type);
        MPI_Type_commit(&type);
        MPI_Get(MPI_BOTTOM, 1, type, target, disp, bytes, MPI_BYTE, win);
        types.push_back(type);
      }
      k += len;
    }
    if (used[0]) MPI_Win_flush(target, w.device);
    if (used[1]) MPI_Win_flush(target, w.host);
    for (MPI_Datatype& t : types) MPI_Type_free(&t);
    return Ok();
  }

  Status AllGather(std::span<const std::byte> mine, std::span<std::byte> all) override {
    if (all.size() != mine.size() * size_) {
      return MakeError(ErrorCode::kInvalidArgument, fmt::format("fabric: all-gather of {} B into {} B", mine.size(), all.size()));
    }
    MPI_Allgather(mine.data(), static_cast<int>(mine.size()), MPI_BYTE, all.data(), static_cast<int>(mine.size()), MPI_BYTE,
                  comm_);
    return Ok();
  }

  Status AllToAllV(std::span<const std::byte> send, std::span<const std::size_t> send_counts, std::span<std::byte> recv,
                   std::span<const std::size_t> recv_counts) override {
    if (send_counts.size() != size_ || recv_counts.size() != size_) {
      return MakeError(ErrorCode::kInvalidArgument, fmt::format("fabric: all-to-all needs {} counts each way", size_));
    }
    std::vector<int> sc(size_), sd(size_), rc(size_), rd(size_);
    std::size_t s_total = 0, r_total = 0;
    for (std::uint32_t q = 0; q < size_; ++q) {
      if (send_counts[q] > INT_MAX || recv_counts[q] > INT_MAX || s_total > INT_MAX || r_total > INT_MAX) {
        return MakeError(ErrorCode::kInvalidArgument, "fabric: all-to-all block over 2 GiB");
      }
      sc[q] = static_cast<int>(send_counts[q]);
      sd[q] = static_cast<int>(s_total);
      rc[q] = static_cast<int>(recv_counts[q]);
      rd[q] = static_cast<int>(r_total);
      s_total += send_counts[q];
      r_total += recv_counts[q];
    }
    if (s_total != send.size() || r_total != recv.size()) {
      return MakeError(ErrorCode::kInvalidArgument,
                       fmt::format("fabric: all-to-all counts add to {} / {} B, buffers hold {} / {} B", s_total, r_total,
                                   send.size(), recv.size()));
    }
    MPI_Alltoallv(send.data(), sc.data(), sd.data(), MPI_BYTE, recv.data(), rc.data(), rd.data(), MPI_BYTE, comm_);
    return Ok();
  }

 private:
  struct Windows {
    MPI_Win home, device, host;
  };
  MPI_Comm comm_;
  std::uint32_t rank_, size_;
  std::uint32_t entry_bytes_ = 0;
  std::vector<Windows> wins_;  // [groups]
  struct Read {
    std::uint32_t tier;  // 0 device, 1 host
    std::uint32_t slot;
    std::byte* dst;
  };
  std::vector<std::uint64_t> locs_;  // home locations, in order_
  std::vector<std::uint32_t> order_;
  std::vector<Read> reads_;
  std::vector<MPI_Aint> displs_;
};

}  // namespace

Result<std::unique_ptr<TpFabric>> MakeMpiFabric() {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) return MakeError(ErrorCode::kFailedPrecondition, "MakeMpiFabric: MPI is not initialized");
  MPI_Comm comm;
  MPI_Comm_dup(MPI_COMM_WORLD, &comm);
  int rank = 0, size = 0;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);
  if (size > 65534) return MakeError(ErrorCode::kOutOfRange, "MakeMpiFabric: more than 65534 ranks");
  return std::unique_ptr<TpFabric>(new MpiFabric(comm, static_cast<std::uint32_t>(rank), static_cast<std::uint32_t>(size)));
}

}  // namespace ula
