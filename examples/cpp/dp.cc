// DP mode: the rank runs the whole model for its own requests. Prefill allocates and
// writes the prompt's entries, its round ends, then every decode step allocates the new
// token, steps the planner per layer group and reads the entries at the returned slots.
#include <cstdio>
#include <vector>

#include "ula/address_space.h"
#include "ula/backend.h"
#include "ula/step_planner.h"

int Fail(const ula::Error& e) {
  std::fprintf(stderr, "dp: %s\n", e.ToString().c_str());
  return 1;
}

int main() {
  auto backend = ula::MakeCpuBackend();  // outlives the space below
  ula::AddressSpaceConfig config;
  config.num_groups = 2;
  config.entry_bytes = 64;                                  // one token, one layer group
  config.device_bytes_per_rank = 8 * 64 * 2;                // 8 entries per group on device
  config.host_bytes_per_rank = 64 * 64 * 2;                 // 64 per group on host
  auto space = ula::AddressSpace::Create(config, *backend);
  if (!space) return Fail(space.error());
  ula::AddressSpace& kv = **space;
  ula::StepPlanner planner(kv);

  const ula::RequestId req(7);
  if (auto s = kv.AddRequest(req, ula::Rank(0)); !s) return Fail(s.error());
  std::vector<ula::LogicalAddr> tokens;
  auto append = [&](std::uint32_t n) -> ula::Status {  // allocate n tokens, write their KV
    auto addrs = kv.Allocate(req, n);
    if (!addrs) return std::unexpected(addrs.error());
    for (ula::LogicalAddr a : *addrs) {
      for (std::uint16_t g = 0; g < config.num_groups; ++g) {
        std::vector<std::byte> entry(config.entry_bytes, std::byte(a.value() + g));
        ULA_RETURN_IF_ERROR(kv.Write(a, ula::GroupId(g), entry));
      }
      tokens.push_back(a);
    }
    return ula::Ok();
  };
  if (auto s = append(20); !s) return Fail(s.error());  // prefill: 20 tokens, 12 on host
  kv.AdvanceRound();  // the prefill's round is over: its entries may be evicted now

  for (int step = 0; step < 3; ++step) {
    if (auto s = append(1); !s) return Fail(s.error());  // the decode token
    // The indexer's top-k of this request (here: the first 2 and the last 4 tokens).
    std::vector<ula::LogicalAddr> selected{tokens[0], tokens[1]};
    selected.insert(selected.end(), tokens.end() - 4, tokens.end());
    const std::vector<ula::SelectionRun> runs{{req, static_cast<std::uint32_t>(selected.size())}};
    std::vector<ula::SlotId> slots(selected.size());
    for (std::uint16_t g = 0; g < config.num_groups; ++g) {
      auto stats = planner.Step({ula::Rank(0), ula::GroupId(g), selected, runs}, slots);
      if (!stats) return Fail(stats.error());
      for (std::size_t i = 0; i < selected.size(); ++i) {  // what the attention kernel reads
        const std::byte* entry = kv.DeviceSlotData(ula::Rank(0), ula::GroupId(g), slots[i]);
        if (entry == nullptr || *entry != std::byte(selected[i].value() + g)) return 1;
      }
    }
    kv.AdvanceRound();  // after the step's attention, once per iteration
  }

  // A selection kept after the request is freed is refused, even once the addresses are
  // reused by another request.
  const std::vector<ula::LogicalAddr> stale{tokens[0]};
  const std::vector<ula::SelectionRun> stale_runs{{req, 1}};
  if (auto s = kv.Free(req); !s) return Fail(s.error());
  if (auto s = kv.AddRequest(ula::RequestId(8), ula::Rank(0)); !s) return Fail(s.error());
  if (auto a = kv.Allocate(ula::RequestId(8), 21); !a) return Fail(a.error());  // reuses them
  std::vector<ula::SlotId> slot(1);
  auto refused = planner.Step({ula::Rank(0), ula::GroupId(0), stale, stale_runs}, slot);
  if (refused) return 1;
  std::printf("dp: 3 decode steps read their entries; a stale selection: %s\n",
              refused.error().ToString().c_str());
  return 0;
}
