// A tiny engine-side program built against the installed package: allocate a request,
// write its entries, run one step under memory pressure, and read the slots back.
#include <cstdio>
#include <cstring>
#include <vector>

#include "ula/address_space.h"
#include "ula/backend.h"
#include "ula/step_planner.h"

int main() {
  auto backend = ula::MakeCpuBackend();
  ula::AddressSpaceConfig config;
  config.entry_bytes = 16;
  config.device_bytes_per_rank = 4 * 16;
  config.host_bytes_per_rank = 16 * 16;
  auto space = ula::AddressSpace::Create(config, *backend);
  if (!space) {
    std::fprintf(stderr, "%s\n", space.error().ToString().c_str());
    return 1;
  }
  if (!(*space)->AddRequest(ula::RequestId(1), ula::Rank(0))) return 1;
  auto addrs = (*space)->Allocate(ula::RequestId(1), 10).value();
  for (auto a : addrs) {
    std::vector<std::byte> bytes(16, std::byte(a.value()));
    if (!(*space)->Write(a, ula::GroupId(0), bytes)) return 1;
  }
  (*space)->AdvanceRound();
  ula::StepPlanner planner(**space);
  std::vector<ula::LogicalAddr> sel{addrs[9], addrs[8], addrs[0]};
  std::vector<ula::SlotId> slots(sel.size());
  std::vector<ula::SelectionRun> runs{{ula::RequestId(1), static_cast<std::uint32_t>(sel.size())}};
  auto stats = planner.Step({ula::Rank(0), ula::GroupId(0), sel, runs}, slots);
  if (!stats) return 1;
  for (std::size_t i = 0; i < sel.size(); ++i) {
    const std::byte* p = (*space)->DeviceSlotData(ula::Rank(0), ula::GroupId(0), slots[i]);
    if (p[0] != std::byte(sel[i].value())) return 1;
  }
  std::printf("ula consumer: step of %zu selections, %llu swaps, bytes verified\n", sel.size(),
              static_cast<unsigned long long>(stats->evictions));
  return 0;
}
