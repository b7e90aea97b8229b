// ThreadFabric: a TpFabric for tests whose ranks are threads of one process, each with its
// own TpAddressSpace hosting one rank — the MPI engine's shape (one-sided fetches from the
// exposed home, collectives) without MPI, so it runs in every tree, TSan included.
// Collectives synchronize on one std::barrier; FetchFromHome reads the source rank's
// exposed home table and pools directly (the planner's barriers order it after the home
// phase that writes them).
#pragma once

#include <barrier>
#include <cstring>
#include <vector>

#include "ula/tp_address_space.h"
#include "ula/tp_fabric.h"

namespace ula::testing {

class ThreadFabricHub {
 public:
  explicit ThreadFabricHub(std::uint32_t ranks) : ranks_(ranks), barrier_(ranks), spaces_(ranks), votes_(ranks), mine_(ranks) {}

 private:
  friend class ThreadFabric;
  std::uint32_t ranks_;
  std::barrier<> barrier_;
  std::vector<const TpAddressSpace*> spaces_;
  std::vector<char> votes_;
  std::vector<std::span<const std::byte>> mine_;
};

class ThreadFabric final : public TpFabric {
 public:
  ThreadFabric(ThreadFabricHub& hub, Rank rank) : hub_(hub), rank_(rank) {}

  std::uint32_t num_ranks() const override { return hub_.ranks_; }
  Rank local_rank() const override { return rank_; }
  Status Expose(const TpAddressSpace& space) override {
    hub_.spaces_[rank_.value()] = &space;
    hub_.barrier_.arrive_and_wait();
    return Ok();
  }
  void Unexpose() override {
    hub_.barrier_.arrive_and_wait();
    hub_.spaces_[rank_.value()] = nullptr;
  }
  bool AllTrue(bool mine) override {
    hub_.votes_[rank_.value()] = mine;
    hub_.barrier_.arrive_and_wait();
    bool all = true;
    for (char v : hub_.votes_) all = all && v != 0;
    hub_.barrier_.arrive_and_wait();
    return all;
  }
  void Barrier() override { hub_.barrier_.arrive_and_wait(); }
  Status FetchFromHome(Rank src, GroupId group, std::span<const LogicalAddr> addrs,
                       std::span<std::byte* const> dst) override {
    const TpAddressSpace* space = hub_.spaces_[src.value()];
    if (space == nullptr || addrs.size() != dst.size()) return MakeError(ErrorCode::kInvalidArgument, "thread fabric: bad fetch");
    const TpShardMemory mem = space->ShardMemory(src, group);
    const std::uint32_t bytes = space->config().entry_bytes;
    for (std::size_t i = 0; i < addrs.size(); ++i) {
      const Location loc = mem.home[addrs[i].value() / hub_.ranks_];
      const Arena& arena = loc.tier() == Tier::kDevice ? mem.device : mem.host;
      std::memcpy(dst[i], arena.data + std::uint64_t{loc.slot().value()} * bytes, bytes);
    }
    return Ok();
  }
  Status AllGather(std::span<const std::byte> mine, std::span<std::byte> all) override {
    hub_.mine_[rank_.value()] = mine;
    hub_.barrier_.arrive_and_wait();
    for (std::uint32_t q = 0; q < hub_.ranks_; ++q) {
      std::memcpy(all.data() + q * mine.size(), hub_.mine_[q].data(), mine.size());
    }
    hub_.barrier_.arrive_and_wait();
    return Ok();
  }

 private:
  ThreadFabricHub& hub_;
  Rank rank_;
};

}  // namespace ula::testing
