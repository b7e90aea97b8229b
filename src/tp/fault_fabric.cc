// FaultInjectingFabric: see src/tp/fault_fabric.h.
#include "tp/fault_fabric.h"

#include <fmt/format.h>

#include <thread>

namespace ula {
namespace {

class FaultFabricImpl final : public FaultInjectingFabric {
 public:
  FaultFabricImpl(TpFabric& inner, const FaultPlan& plan) : inner_(inner), dice_(plan) {}

  std::uint32_t num_ranks() const override { return inner_.num_ranks(); }
  Rank local_rank() const override { return inner_.local_rank(); }
  Status Expose(const TpAddressSpace& space) override { return inner_.Expose(space); }
  void Unexpose() override { inner_.Unexpose(); }
  bool AllTrue(bool mine) override { return inner_.AllTrue(mine); }
  void Barrier() override { inner_.Barrier(); }
  Status AllGather(std::span<const std::byte> mine, std::span<std::byte> all) override {
    return inner_.AllGather(mine, all);
  }
  Status AllToAllV(std::span<const std::byte> send, std::span<const std::size_t> send_counts,
                   std::span<std::byte> recv, std::span<const std::size_t> recv_counts) override {
    return inner_.AllToAllV(send, send_counts, recv, recv_counts);
  }
  FaultStats stats() const override { return dice_.stats(); }
  void set_armed(bool armed) override { dice_.set_armed(armed); }

  Status FetchFromHome(Rank src, GroupId group, std::span<const LogicalAddr> addrs,
                       std::span<std::byte* const> dst) override {
    if (dice_.plan().delay.count() > 0) {
      std::this_thread::sleep_for(dice_.plan().delay);
      dice_.RecordDelay();
    }
    if (!dice_.Roll(FaultInjector::Kind::kFetch)) return inner_.FetchFromHome(src, group, addrs, dst);
    const std::size_t k = std::min(dice_.PartialPrefix(addrs.size()), dst.size());
    if (k > 0) ULA_RETURN_IF_ERROR(inner_.FetchFromHome(src, group, addrs.first(k), dst.first(k)));
    return MakeError(ErrorCode::kIo, fmt::format("injected fault: fetch of {} entries of group {} from rank {} failed "
                                                 "after {} landed", addrs.size(), group.value(), src.value(), k));
  }

 private:
  TpFabric& inner_;
  FaultInjector dice_;
};

}  // namespace

Result<std::unique_ptr<FaultInjectingFabric>> MakeFaultInjectingFabric(TpFabric& inner, const FaultPlan& plan) {
  ULA_RETURN_IF_ERROR(plan.Validate());
  return std::unique_ptr<FaultInjectingFabric>(std::make_unique<FaultFabricImpl>(inner, plan));
}

}  // namespace ula
