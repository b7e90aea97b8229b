// Micro-benchmark of the device step's round bracket (ula/device_step.h, "The space between
// rounds"), its OpenMP form on one thread: one iteration is one round of one group, a batch
// of requests selecting top-k of their history (~10% of each selection changes per round).
//   BM_DeviceStepRound/<batch>/0: Plan, Complete (every copy landed), step AdvanceRound;
//   BM_DeviceStepRound/<batch>/1: the same, then StoreInto, the space's AdvanceRound, Reload
// (the bracket an engine runs around its host bookkeeping). The two side by side give the
// bracket's cost as a multiple of the step's in the same run.
#include <benchmark/benchmark.h>

#include <random>
#include <vector>

#include "ula/address_space.h"
#include "ula/device_step.h"

namespace ula {
namespace {

void BM_DeviceStepRound(benchmark::State& state) {
  const auto batch = static_cast<std::uint32_t>(state.range(0));
  const bool bracket = state.range(1) != 0;
  const std::uint32_t top_k = 2048, history = 8192, entry = 656;
  auto backend = MakeCountingBackend();
  AddressSpaceConfig config;
  config.entry_bytes = entry;
  config.policy = PolicyKind::kKernelPbLru;
  config.stable_new_entries = true;
  config.device_bytes_per_rank = std::uint64_t{batch} * top_k * 2 * entry;  // 2x the per-round working set
  config.host_bytes_per_rank = std::uint64_t{batch} * history * entry;
  auto space = AddressSpace::Create(config, *backend).value();
  std::vector<std::vector<LogicalAddr>> addrs(batch);
  for (std::uint32_t r = 0; r < batch; ++r) {
    (void)space->AddRequest(RequestId(r), Rank(0));
    addrs[r] = space->Allocate(RequestId(r), history).value();
    space->AdvanceRound();
  }
  auto step = DeviceStep::Create(*space, Rank(0), GroupId(0),
                                 DeviceStepConfig{.max_rows = batch, .max_batch = batch, .max_top_k = top_k})
                  .value();
  std::mt19937 rng(3);
  std::vector<std::int32_t> sel(std::size_t{batch} * top_k), indices(sel.size());
  for (std::size_t i = 0; i < sel.size(); ++i) sel[i] = static_cast<std::int32_t>(addrs[i / top_k][rng() % history].value());
  std::vector<std::int64_t> requests(batch);
  for (std::uint32_t r = 0; r < batch; ++r) requests[r] = r;
  std::vector<CopyDescriptor> descriptors(step->max_descriptors());
  std::vector<std::uint8_t> status(step->max_descriptors(), 0);
  StepRecord record;
  StepArrays arrays{.selections = sel.data(), .requests = requests.data(), .indices = indices.data(),
                    .descriptors = descriptors.data(), .stats = &record, .num_rows = batch, .batch = batch,
                    .top_k = top_k, .selection_stride = top_k, .index_stride = top_k,
                    .max_descriptors = step->max_descriptors()};
  std::uint64_t misses = 0, refused = 0;
  for (auto _ : state) {
    state.PauseTiming();
    for (std::size_t i = 0; i < sel.size() / 10; ++i) {
      const std::size_t j = rng() % sel.size();
      sel[j] = static_cast<std::int32_t>(addrs[j / top_k][rng() % history].value());
    }
    state.ResumeTiming();
    if (!step->Plan(arrays, nullptr) || !step->Complete(status.data(), nullptr)) state.SkipWithError("step refused");
    misses += record.misses;
    refused += record.error != 0;
    if (bracket) {
      if (!step->StoreInto(*space, nullptr)) state.SkipWithError("StoreInto refused");
      space->AdvanceRound();
      if (!step->Reload(*space, nullptr)) state.SkipWithError("Reload refused");
    } else if (!step->AdvanceRound(nullptr)) {
      state.SkipWithError("AdvanceRound refused");
    }
  }
  state.counters["misses_per_round"] = benchmark::Counter(static_cast<double>(misses), benchmark::Counter::kAvgIterations);
  state.counters["refused"] = static_cast<double>(refused);
  state.counters["table_entries"] = static_cast<double>(std::uint64_t{batch} * history);
}
BENCHMARK(BM_DeviceStepRound)->ArgsProduct({{16, 64}, {0, 1}})->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace ula
