// Micro-benchmarks of the residency policies alone (no address lookup): one round =
// Touch a batch of top-k selections (80% of them repeated from the previous round), claim
// victims for the other 20%, AdvanceRound. Pool: 4 x top-k slots per request, all tracked.
// Args: policy (0 pb_lru, 1 exact_lru_scan, 2 exact_lru_list, 3 clock), batch.
#include <benchmark/benchmark.h>

#include <random>
#include <vector>

#include "ula/residency_policy.h"

namespace ula {
namespace {

constexpr std::uint32_t kTopK = 2048;

void BM_PolicyRound(benchmark::State& state) {
  const auto kind = static_cast<PolicyKind>(state.range(0));
  const auto batch = static_cast<std::uint32_t>(state.range(1));
  const std::uint32_t capacity = 4 * kTopK * batch;
  auto policy = MakePolicy(kind, capacity).value();
  for (std::uint32_t s = 0; s < capacity; ++s) policy->Insert(SlotId(s));
  policy->AdvanceRound();
  std::mt19937 rng(1);
  std::vector<SlotId> touch(std::size_t{kTopK} * batch), victims(touch.size() / 5);
  for (auto& s : touch) s = SlotId(rng() % capacity);
  policy->Touch(touch);
  victims.resize(policy->ClaimVictims(victims));  // all of them: 6 x top-k per request are evictable
  policy->AdvanceRound();
  for (auto _ : state) {
    // Keep 80% of the previous round's selections, replace the rest with the last victims.
    for (std::size_t i = 0; i < victims.size(); ++i) touch[rng() % touch.size()] = victims[i];
    policy->Touch(touch);
    const std::size_t n = policy->ClaimVictims(victims);
    benchmark::DoNotOptimize(n);
    policy->AdvanceRound();
  }
  state.SetLabel(std::string(PolicyKindName(kind)));
  state.SetItemsProcessed(state.iterations() * touch.size());
}
BENCHMARK(BM_PolicyRound)
    ->ArgsProduct({{0, 1, 2, 3}, {1, 4, 16, 64, 256}})
    ->ArgNames({"policy", "batch"})
    ->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace ula
