// TP mode with local buffers, every rank in this process: address a lives on rank a mod P;
// a step makes each rank's selected entries readable in its own device memory (its shard,
// or a copy fetched into its local buffer) and says where, per rank and selection.
#include <cstdio>
#include <vector>

#include "ula/backend.h"
#include "ula/tp_address_space.h"
#include "ula/tp_step_planner.h"

int Fail(const ula::Error& e) {
  std::fprintf(stderr, "tp_local_buffer: %s\n", e.ToString().c_str());
  return 1;
}

int main() {
  auto backend = ula::MakeCpuBackend();  // outlives the space, which outlives the planner
  ula::TpConfig config;
  config.num_ranks = 4;
  config.num_groups = 1;
  config.entry_bytes = 64;
  config.attention = ula::TpAttention::kLocalBuffer;
  config.device_bytes_per_rank = 16 * 64;  // per rank: 16 shard entries on device,
  config.host_bytes_per_rank = 32 * 64;    // 32 on host,
  config.buffer_bytes_per_rank = 16 * 64;  // 16 copies of entries homed elsewhere
  auto space = ula::TpAddressSpace::Create(config, *backend);  // hosts all 4 ranks
  if (!space) return Fail(space.error());
  ula::TpAddressSpace& kv = **space;
  ula::TpStepPlanner planner(kv);  // no fabric: every rank is in this process

  const ula::RequestId req(1);
  if (auto s = kv.AddRequest(req); !s) return Fail(s.error());
  std::vector<ula::LogicalAddr> tokens;
  auto append = [&](std::uint32_t n) -> ula::Status {  // allocate n tokens, write their KV
    auto addrs = kv.Allocate(req, n);
    if (!addrs) return std::unexpected(addrs.error());
    for (ula::LogicalAddr a : *addrs) {
      std::vector<std::byte> entry(config.entry_bytes, std::byte(a.value()));
      ULA_RETURN_IF_ERROR(kv.Write(a, ula::GroupId(0), entry));
      tokens.push_back(a);
    }
    return ula::Ok();
  };
  if (auto s = append(100); !s) return Fail(s.error());  // prefill
  kv.AdvanceRound();

  for (int step = 0; step < 3; ++step) {
    if (auto s = append(1); !s) return Fail(s.error());  // the decode token
    std::vector<ula::LogicalAddr> selected(tokens.end() - 8, tokens.end());
    const std::vector<ula::SelectionRun> runs{{req, 8}};
    auto plan = planner.Step(ula::GroupId(0), selected, runs);
    if (!plan) return Fail(plan.error());
    for (std::size_t h = 0; h < plan->ranks.size(); ++h) {  // each rank's attention reads
      for (std::size_t i = 0; i < selected.size(); ++i) {
        const std::byte* entry = kv.RefData(plan->ranks[h], ula::GroupId(0), plan->refs[h][i]);
        if (entry == nullptr || *entry != std::byte(selected[i].value())) return 1;
      }
    }
    kv.AdvanceRound();
  }
  std::printf("tp_local_buffer: 3 decode steps on 4 ranks read their entries\n");
  return 0;
}
