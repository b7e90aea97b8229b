// Micro-benchmark of the device step's round bracket (ula/device_step.h, "The space between
// rounds"), its OpenMP form on one thread: one iteration is one round of one group, a batch
// of requests selecting top-k of their history (~10% of each selection changes per round).
//   BM_DeviceStepRound/<batch>/0: Plan, Complete (every copy landed), step AdvanceRound;
//   BM_DeviceStepRound/<batch>/1: the same, then StoreInto, the space's AdvanceRound, Reload
// (the bracket an engine runs around its host bookkeeping). The two side by side give the
// bracket's cost as a multiple of the step's in the same run.
// BM_DeviceStepDecode/<batch>/<mode>: a decode iteration, every request one new token, the
// two ways a space places it (ula/device_step.h): mode 0, today's bracket (StoreInto, the
// host's Allocate places the tokens, Reload, then Plan, Complete and the step's AdvanceRound);
// mode 1, device placement (the host's Allocate hands out addresses, TakePlacement, Place and
// CompletePlace seat them on the step, then the same Plan, Complete and AdvanceRound). Both
// place by the same rule in the same order, so they make the same decisions (misses_per_round
// equal); the counters give the host synchronisations and the launches per iteration
// (DeviceStepCounters).
#include <benchmark/benchmark.h>

#include <random>
#include <vector>

#include "step/placement_buffers.h"
#include "ula/step_arrays.h"

#include "ula/address_space.h"
#include "ula/device_step.h"

namespace ula {
namespace {

// One group step's arrays for a batch of requests selecting top_k of their history
// (addrs[r]), and the round's change: about a tenth of the selections drawn again.
struct RoundSelections {
  RoundSelections(const std::vector<std::vector<LogicalAddr>>& addrs, std::uint32_t top_k, std::uint32_t history,
                  std::uint32_t max_descriptors)
      : addrs(addrs), top_k(top_k), history(history), sel(addrs.size() * top_k), indices(sel.size()),
        requests(addrs.size()), descriptors(max_descriptors), status(max_descriptors, 0) {
    for (std::size_t i = 0; i < sel.size(); ++i) sel[i] = Draw(i);
    for (std::size_t r = 0; r < requests.size(); ++r) requests[r] = static_cast<std::int64_t>(r);
    const auto batch = static_cast<std::uint32_t>(addrs.size());
    arrays = StepArrays{.selections = sel.data(), .requests = requests.data(), .indices = indices.data(),
                        .descriptors = descriptors.data(), .stats = &record, .num_rows = batch, .batch = batch,
                        .top_k = top_k, .selection_stride = top_k, .index_stride = top_k,
                        .max_descriptors = max_descriptors};
  }
  void NextRound() {
    for (std::size_t i = 0; i < sel.size() / 10; ++i) {
      const std::size_t j = rng() % sel.size();
      sel[j] = Draw(j);
    }
  }
  std::int32_t Draw(std::size_t i) { return static_cast<std::int32_t>(addrs[i / top_k][rng() % history].value()); }

  const std::vector<std::vector<LogicalAddr>>& addrs;
  std::uint32_t top_k, history;
  std::mt19937 rng{3};
  std::vector<std::int32_t> sel, indices;
  std::vector<std::int64_t> requests;
  std::vector<CopyDescriptor> descriptors;
  std::vector<std::uint8_t> status;  // every copy landed
  StepRecord record;
  StepArrays arrays;
};

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
  RoundSelections round(addrs, top_k, history, step->max_descriptors());
  const StepArrays& arrays = round.arrays;
  const StepRecord& record = round.record;
  const std::vector<std::uint8_t>& status = round.status;
  std::uint64_t misses = 0, refused = 0;
  for (auto _ : state) {
    state.PauseTiming();
    round.NextRound();
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

void BM_DeviceStepDecode(benchmark::State& state) {
  const auto batch = static_cast<std::uint32_t>(state.range(0));
  const bool device_placement = state.range(1) != 0;
  const std::uint32_t top_k = 2048, history = 8192, headroom = 512, entry = 656;
  auto backend = MakeCountingBackend();
  AddressSpaceConfig config;
  config.entry_bytes = entry;
  config.policy = PolicyKind::kKernelPbLru;
  config.stable_new_entries = true;
  config.device_placement = device_placement;
  config.device_bytes_per_rank = std::uint64_t{batch} * top_k * 2 * entry;
  config.host_bytes_per_rank = std::uint64_t{batch} * (history + headroom) * entry;
  auto space = AddressSpace::Create(config, *backend).value();
  std::vector<std::vector<LogicalAddr>> addrs(batch);
  for (std::uint32_t r = 0; r < batch; ++r) {
    (void)space->AddRequest(RequestId(r), Rank(0));
    addrs[r] = space->Allocate(RequestId(r), history).value();
  }
  if (!device_placement) space->AdvanceRound();  // device placement: after the history's Place, below
  const std::uint32_t max_addresses = batch * ((history + headroom + 63) / 64 * 64);
  const std::uint32_t max_seats = batch * history;  // the first Place seats the whole history
  DeviceStepConfig dc{.max_rows = batch, .max_batch = batch, .max_top_k = top_k, .max_addresses = max_addresses,
                      .max_requests = batch};
  if (device_placement) {
    dc.max_place_seats = max_seats;
    dc.max_place_releases = 1;
    dc.max_place_requests = batch;
  }
  auto step = DeviceStep::Create(*space, Rank(0), GroupId(0), dc).value();
  // The journal as the step's arrays (device placement), and its Place with every eviction landed.
  PlacementBuffers buffers(device_placement ? max_seats : 0);
  auto place = [&]() -> bool {
    auto journal = space->TakePlacement();
    if (!journal) return false;
    buffers.Fill(*journal);
    return step->Place(buffers.arrays(), nullptr) && step->CompletePlace(buffers.status.data(), nullptr);
  };
  if (device_placement && (!place() || !step->AdvanceRound(nullptr))) {
    state.SkipWithError("the history's Place refused");
    return;
  }
  RoundSelections round(addrs, top_k, history, step->max_descriptors());
  const StepArrays& arrays = round.arrays;
  const StepRecord& record = round.record;
  const std::vector<std::uint8_t>& status = round.status;
  const DeviceStepCounters before = step->counters();
  std::uint64_t misses = 0, refused = 0, iterations = 0;
  for (auto _ : state) {
    state.PauseTiming();
    round.NextRound();
    state.ResumeTiming();
    ++iterations;
    if (device_placement) {
      for (std::uint32_t r = 0; r < batch; ++r) {
        if (!space->Allocate(RequestId(r), 1)) state.SkipWithError("Allocate refused");
      }
      if (!place()) state.SkipWithError("Place refused");
      if (!step->Plan(arrays, nullptr) || !step->Complete(status.data(), nullptr)) state.SkipWithError("step refused");
      if (!step->AdvanceRound(nullptr)) state.SkipWithError("AdvanceRound refused");
    } else {  // the same order: the tokens placed, the step, the round's end
      if (!step->StoreInto(*space, nullptr)) state.SkipWithError("StoreInto refused");
      for (std::uint32_t r = 0; r < batch; ++r) {
        if (!space->Allocate(RequestId(r), 1)) state.SkipWithError("Allocate refused");
      }
      if (!step->Reload(*space, nullptr)) state.SkipWithError("Reload refused");
      if (!step->Plan(arrays, nullptr) || !step->Complete(status.data(), nullptr)) state.SkipWithError("step refused");
      if (!step->AdvanceRound(nullptr)) state.SkipWithError("AdvanceRound refused");
    }
    misses += record.misses;
    refused += record.error != 0;
  }
  const DeviceStepCounters used = step->counters().Since(before);
  const double n = iterations == 0 ? 1.0 : static_cast<double>(iterations);
  state.counters["misses_per_round"] = benchmark::Counter(static_cast<double>(misses), benchmark::Counter::kAvgIterations);
  state.counters["refused"] = static_cast<double>(refused);
  state.counters["host_syncs_per_iteration"] = static_cast<double>(used.Step().syncs + used.state.syncs + used.place.syncs) / n;
  state.counters["launches_per_iteration"] =
      static_cast<double>(used.Step().launches + used.place.launches) / n;
}
// A fixed count: every iteration adds a token per request, within the headroom.
BENCHMARK(BM_DeviceStepDecode)->ArgsProduct({{16, 64}, {0, 1}})->Iterations(256)->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace ula
