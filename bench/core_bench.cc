// Micro-benchmarks of the core structures: slot allocate/free and location lookup.
#include <benchmark/benchmark.h>

#include <random>

#include "core/address_records.h"
#include "backend/slot_pool.h"

namespace ula {
namespace {

void BM_SlotPoolAllocateFree(benchmark::State& state) {
  const auto capacity = static_cast<std::uint32_t>(state.range(0));
  auto pool = SlotPool::Create(Arena{ArenaId(0), Tier::kDevice, Rank(0), std::uint64_t{capacity} * 656, nullptr},
                               656, capacity)
                  .value();
  // Half full, scattered, so that the search has to use the summaries.
  std::vector<SlotId> held;
  for (std::uint32_t i = 0; i < capacity; ++i) held.push_back(pool.Allocate().value());
  for (std::uint32_t i = 0; i < capacity; i += 2) (void)pool.Free(held[i]);
  for (auto _ : state) {
    auto s = pool.Allocate().value();
    benchmark::DoNotOptimize(s);
    (void)pool.Free(s);
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_SlotPoolAllocateFree)->Arg(1 << 12)->Arg(1 << 20)->Arg(1 << 24);

// A step's lookups: one Get per selection, at random over a 4 Mi-address table.
void BM_LocationLookup(benchmark::State& state) {
  const std::uint32_t n = 1 << 22;
  AddressRecords table;
  table.Reserve(n);
  for (std::uint32_t a = 0; a < n; ++a) table.Set(LogicalAddr(a), Location::Make(Tier::kDevice, Rank(0), SlotId(a)));
  std::mt19937 rng(1);
  std::vector<LogicalAddr> addrs(static_cast<std::size_t>(state.range(0)));
  for (auto& a : addrs) a = LogicalAddr(rng() % n);
  std::vector<Location> out(addrs.size());
  for (auto _ : state) {
    for (std::size_t i = 0; i < addrs.size(); ++i) out[i] = table.Get(addrs[i]);
    benchmark::DoNotOptimize(out.data());
  }
  state.SetItemsProcessed(state.iterations() * addrs.size());
}
BENCHMARK(BM_LocationLookup)->Arg(2048)->Arg(2048 * 64);

}  // namespace
}  // namespace ula
