// Micro-benchmark of one planner step (DP, cpu backend): a batch of requests selecting
// top-k entries with high step-to-step overlap, under memory pressure.
#include <benchmark/benchmark.h>

#include <random>

#include "ula/address_space.h"
#include "ula/step_planner.h"

namespace ula {
namespace {

void BM_PlannerStep(benchmark::State& state) {
  const std::uint32_t batch = static_cast<std::uint32_t>(state.range(0));
  const std::uint32_t top_k = 2048, history = 8192, entry = 656;
  auto backend = MakeCpuBackend({.copy_threads = 1});
  AddressSpaceConfig config;
  config.entry_bytes = entry;
  config.device_bytes_per_rank = std::uint64_t{batch} * top_k * 2 * entry;  // 2x the per-step working set
  config.host_bytes_per_rank = std::uint64_t{batch} * history * entry;
  auto space = AddressSpace::Create(config, *backend).value();
  StepPlanner planner(*space);
  std::vector<std::vector<LogicalAddr>> addrs(batch);
  for (std::uint32_t r = 0; r < batch; ++r) {
    (void)space->AddRequest(RequestId(r), Rank(0));
    addrs[r] = space->Allocate(RequestId(r), history).value();
  }
  std::mt19937 rng(3);
  std::vector<LogicalAddr> sel(std::size_t{batch} * top_k);
  std::vector<SlotId> slots(sel.size());
  std::vector<SelectionRun> runs;  // request r's top-k selections, one run each
  for (std::uint32_t r = 0; r < batch; ++r) runs.push_back(SelectionRun{RequestId(r), top_k});
  for (std::size_t i = 0; i < sel.size(); ++i) sel[i] = addrs[i / top_k][rng() % history];
  std::uint64_t misses = 0;
  for (auto _ : state) {
    // ~10% of each selection changes per step.
    for (std::size_t i = 0; i < sel.size() / 10; ++i) {
      const std::size_t j = rng() % sel.size();
      sel[j] = addrs[j / top_k][rng() % history];
    }
    auto stats = planner.Step({Rank(0), GroupId(0), sel, runs}, slots);
    misses += stats ? stats->misses : 0;
    space->AdvanceRound();
  }
  state.counters["misses_per_step"] = benchmark::Counter(static_cast<double>(misses), benchmark::Counter::kAvgIterations);
  state.SetItemsProcessed(state.iterations() * sel.size());
}
BENCHMARK(BM_PlannerStep)->Arg(1)->Arg(16)->Arg(64)->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace ula
