// Micro-benchmarks of the CPU indexer over DeepSeek-V4-Flash's C4 keys (shape from
// configs/models/deepseek_v4_flash.json: 64 heads x 128 dims, top-k 512): one query's
// single-rank top-k over n C4 entries, and one rank's share of the striped top-k at P ranks
// (its n / P keys scored, its k candidates padded, the P x k gathered candidates merged;
// the gather itself is not timed). Keys and queries: seeded uniform values.
#include <benchmark/benchmark.h>

#include <random>
#include <vector>

#include "config/model_config.h"
#include "indexer/striped_indexer.h"

namespace ula {
namespace {

struct C4Keys {
  IndexerShape shape;
  std::vector<float> query, weights, keys;  // [H * D], [H], [n * D]
};

C4Keys MakeKeys(std::uint32_t n) {
  C4Keys c;
  c.shape = LoadModelConfigByName("deepseek_v4_flash", DefaultConfigDir()).value().indexer_shape();
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  c.query.resize(std::size_t{c.shape.num_heads} * c.shape.head_dim);
  c.weights.resize(c.shape.num_heads);
  c.keys.resize(std::size_t{n} * c.shape.head_dim);
  for (float& v : c.query) v = u(rng);
  for (float& v : c.weights) v = u(rng);
  for (float& v : c.keys) v = u(rng);
  return c;
}

void BM_C4IndexerSingleRank(benchmark::State& state) {
  const auto n = static_cast<std::uint32_t>(state.range(0));
  const C4Keys c = MakeKeys(n);
  auto indexer = Indexer::Create(c.shape).value();
  std::vector<std::uint32_t> out;
  for (auto _ : state) {
    (void)indexer.Select({c.query, c.weights}, c.keys, out);
    benchmark::DoNotOptimize(out.data());
  }
  state.SetItemsProcessed(state.iterations() * n);
}
BENCHMARK(BM_C4IndexerSingleRank)->Arg(2048)->Arg(16384)->Unit(benchmark::kMicrosecond);

// Rank 0 of P: C4 entry j at address j, so rank 0 holds entries 0, P, 2P, ...
void BM_C4IndexerStripedRank(benchmark::State& state) {
  const auto n = static_cast<std::uint32_t>(state.range(0));
  const auto ranks = static_cast<std::uint32_t>(state.range(1));
  const C4Keys c = MakeKeys(n);
  const std::uint32_t k = c.shape.top_k, dim = c.shape.head_dim;
  std::vector<std::vector<float>> keys(ranks);
  std::vector<std::vector<std::uint32_t>> positions(ranks);
  for (std::uint32_t j = 0; j < n; ++j) {
    positions[j % ranks].push_back(j);
    keys[j % ranks].insert(keys[j % ranks].end(), c.keys.begin() + std::size_t{j} * dim,
                           c.keys.begin() + std::size_t{j + 1} * dim);
  }
  std::vector<IndexCandidate> gathered(std::size_t{ranks} * k), mine;
  for (std::uint32_t r = 1; r < ranks; ++r) {  // the other ranks' blocks, as the gather brings them
    (void)LocalCandidates(c.shape, {c.query, c.weights}, keys[r], positions[r], mine);
    PadCandidates(mine, k);
    std::copy(mine.begin(), mine.end(), gathered.begin() + std::size_t{r} * k);
  }
  std::vector<std::uint32_t> out;
  for (auto _ : state) {
    (void)LocalCandidates(c.shape, {c.query, c.weights}, keys[0], positions[0], mine);
    PadCandidates(mine, k);
    std::copy(mine.begin(), mine.end(), gathered.begin());
    MergeCandidates(gathered, k, out);
    benchmark::DoNotOptimize(out.data());
  }
  state.SetItemsProcessed(state.iterations() * n);
  state.counters["gather_bytes_per_rank"] = static_cast<double>(std::size_t{k} * sizeof(IndexCandidate));
}
BENCHMARK(BM_C4IndexerStripedRank)
    ->Args({2048, 1})->Args({2048, 8})->Args({16384, 1})->Args({16384, 8})
    ->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace ula
