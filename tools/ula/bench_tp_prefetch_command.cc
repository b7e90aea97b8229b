// `ula bench tp-prefetch [--json]`: how much of TP mode's fetch time the overlap within a
// layer group (TpPrefetcher) hides behind compute, against the same work run serially, in
// the same run. In-process ranks on the cpu backend (real bytes moved by its copy threads).
//
// What can overlap: a group's selection comes from its own indexer on the
// output of the layers before it, so nothing of the next group can be fetched early. Within
// a group the L = --layers layers share one selection: an entry is the L layers side by
// side, each remote miss is copied as L strided per-layer sub-ranges (layer 0 first), layer
// 0 is on the critical path, and layer l computes as soon as its bytes arrived while layers
// l+1.. are still in flight (include/ula/tp_prefetcher.h).
//
// Setup: P ranks, G layer groups, `--entries` live addresses (all resident on device in
// their home shards; no host tier), entries of `--entry-bytes` filled with a pattern.
// Every step, each group selects `--select` addresses: a `--keep` fraction of that group's
// previous selection, the rest uniformly at random (seeded), so the local buffers see
// both hits and misses. Two identical address spaces step the same selections, one step
// at a time in alternation: one layered (per-layer copies overlapping the group's layers),
// one serial (TpPrefetcher::RunStep(..., layered = false): whole-entry copies, then the
// layers).
//
// Simulated compute of layer l of group g (the `compute` callback): every hosted rank reads
// layer l's bytes of all its selected entries through the plan (64-bit sum, compared
// between the two spaces), then busy-waits until
// select x (entry_bytes / L) x P / (compute_gbps x 1e9) seconds have passed since the
// callback began. Reading counts towards that time.
//
// Figures (TpPipelineStats, summed over the measured steps; step 1 only warms the
// buffers): fetch = wall time of the group steps until their last layer arrived (dedup,
// home phase, copies from other ranks), exposed = time from each group's start until its
// layer 0 could compute (the fetch on the critical path), compute = wall time of the
// callbacks, wall = the whole pipeline, overlap = (fetch + compute - wall) / fetch clamped
// to [0, 1].
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <nlohmann/json.hpp>
#include <random>

#include "cli_checks.h"
#include "command_registry.h"
#include "ula/tp_prefetcher.h"

namespace ula::cli {
namespace {

struct PrefetchOptions {
  std::uint32_t ranks = 4, groups = 4, entries = 16384, select = 2048, steps = 6, entry_bytes = 2624, layers = 4;
  std::uint32_t copy_threads = 1;
  double keep = 0.5, compute_gbps = 2.0, buffer_factor = 2.0;
  std::uint64_t seed = 7;
  bool json = false;
};

struct Side {
  std::unique_ptr<Backend> backend;
  std::unique_ptr<TpAddressSpace> space;
  std::unique_ptr<TpPrefetcher> prefetcher;
  TpPipelineStats sum;
  std::uint64_t checksum = 0;
};

int Fail(const std::string& what) {
  fmt::print(stderr, "ula bench tp-prefetch: {}\n", what);
  return 2;
}

int RunPrefetch(const PrefetchOptions& o) {
  using Clock = std::chrono::steady_clock;
  const std::uint32_t p = o.ranks;
  TpConfig c;
  c.num_ranks = p;
  c.num_groups = o.groups;
  c.entry_bytes = o.entry_bytes;
  const std::uint64_t shard = (std::uint64_t{o.entries} + p - 1) / p + 16;
  const std::uint64_t buffer = static_cast<std::uint64_t>(o.buffer_factor * o.select);
  c.device_bytes_per_rank = shard * o.entry_bytes * o.groups;
  c.buffer_bytes_per_rank = buffer * o.entry_bytes * o.groups;
  Side sides[2];  // [0] serial, [1] layered
  std::vector<LogicalAddr> addrs;
  for (Side& s : sides) {
    s.backend = MakeCpuBackend({.copy_threads = static_cast<int>(o.copy_threads)});
    auto space = TpAddressSpace::Create(c, *s.backend);
    if (!space) return Fail(space.error().ToString());
    s.space = std::move(*space);
    s.prefetcher = std::make_unique<TpPrefetcher>(*s.space, o.layers);
    if (auto e = s.space->AddRequest(RequestId(0)); !e) return Fail(e.error().ToString());
    auto a = s.space->Allocate(RequestId(0), o.entries);
    if (!a) return Fail(a.error().ToString());
    addrs = *a;  // identical in both spaces (same config, same calls)
    std::vector<std::byte> bytes(o.entry_bytes);
    for (LogicalAddr x : addrs) {
      for (std::uint32_t g = 0; g < o.groups; ++g) {
        for (std::uint32_t i = 0; i < o.entry_bytes; ++i) bytes[i] = std::byte((x.value() * 131 + g * 17 + i) & 0xff);
        if (auto e = s.space->Write(x, GroupId(static_cast<std::uint16_t>(g)), bytes); !e) return Fail(e.error().ToString());
      }
    }
    s.space->AdvanceRound();
  }
  const std::uint32_t layer_bytes = o.entry_bytes / o.layers;
  const double compute_target_s = double(o.select) * layer_bytes * p / (o.compute_gbps * 1e9);  // per layer
  std::mt19937_64 rng(o.seed);
  std::vector<std::vector<LogicalAddr>> sel(o.groups);
  for (std::uint32_t step = 0; step < o.steps; ++step) {
    for (auto& s : sel) {
      const std::size_t kept = step == 0 ? 0 : static_cast<std::size_t>(o.keep * s.size());
      std::shuffle(s.begin(), s.end(), rng);
      s.resize(kept);
      while (s.size() < o.select) s.push_back(addrs[rng() % addrs.size()]);
    }
    for (int side = 0; side < 2; ++side) {
      Side& sd = sides[side];
      std::uint64_t sum = 0;
      auto compute = [&](GroupId g, std::uint32_t layer, const TpStepPlan& plan) {
        const auto deadline = Clock::now() + std::chrono::duration<double>(compute_target_s);
        for (std::size_t h = 0; h < plan.ranks.size(); ++h) {
          for (const TpReadRef& ref : plan.refs[h]) {
            const std::byte* d = sd.space->RefData(plan.ranks[h], g, ref) + std::size_t{layer} * layer_bytes;
            for (std::uint32_t i = 0; i + 8 <= layer_bytes; i += 8) {
              std::uint64_t w;
              std::memcpy(&w, d + i, 8);
              sum += w;
            }
          }
        }
        while (Clock::now() < deadline) {
        }
      };
      std::vector<std::vector<SelectionRun>> runs(o.groups);  // one request
      for (std::uint32_t g = 0; g < o.groups; ++g) runs[g] = {{RequestId(0), static_cast<std::uint32_t>(sel[g].size())}};
      auto stats = sd.prefetcher->RunStep(sel, runs, compute, side == 1);
      if (!stats) return Fail(stats.error().ToString());
      sd.checksum += sum;
      if (step > 0) {
        sd.sum.wall_s += stats->wall_s;
        sd.sum.fetch_s += stats->fetch_s;
        sd.sum.exposed_s += stats->exposed_s;
        sd.sum.compute_s += stats->compute_s;
        sd.sum.totals += stats->totals;
      }
      sd.space->AdvanceRound();
    }
  }
  for (Side& s : sides) {
    if (auto e = s.space->CheckInvariants(); !e) return Fail(e.error().ToString());
  }
  const bool same = sides[0].checksum == sides[1].checksum;
  const std::uint32_t measured = o.steps > 1 ? o.steps - 1 : 1;
  const StepStats& t = sides[1].sum.totals;
  const double hit = t.buffer_hits + t.remote_fetches == 0 ? 0 : double(t.buffer_hits) / (t.buffer_hits + t.remote_fetches);
  if (o.json) {
    nlohmann::json j;
    j["scenario"] = {{"ranks", p}, {"groups", o.groups}, {"entries", o.entries}, {"entry_bytes", o.entry_bytes},
                     {"select", o.select}, {"keep", o.keep}, {"steps", o.steps}, {"measured_steps", measured},
                     {"layers", o.layers}, {"layer_bytes", layer_bytes},
                     {"compute_gbps", o.compute_gbps}, {"compute_target_s_per_layer", compute_target_s},
                     {"copy_threads", o.copy_threads}, {"seed", o.seed}};
    for (int side = 0; side < 2; ++side) {
      const TpPipelineStats& s = sides[side].sum;
      j[side ? "layered" : "serial"] = {{"fetch_s", s.fetch_s}, {"exposed_s", s.exposed_s}, {"compute_s", s.compute_s},
                                        {"wall_s", s.wall_s}, {"overlap", s.overlap()}};
    }
    j["remote_bytes_per_step"] = double(t.remote_bytes) / measured;
    j["local_buffer_hit_rate"] = hit;
    j["checksums_equal"] = same;
    fmt::print("{}\n", j.dump());
  } else {
    fmt::print("ula bench tp-prefetch: {} in-process ranks, {} groups, {} entries of {} B, {} selections/group/step "
               "(keep {:.2f}), {} steps ({} measured), cpu backend ({} copy threads)\n",
               p, o.groups, o.entries, o.entry_bytes, o.select, o.keep, o.steps, measured, o.copy_threads);
    fmt::print("compute per layer ({} layers of {} B per entry): read the layer's bytes of every selected entry on every "
               "rank, then busy-wait to {:.3f} ms ({} x {} B x {} ranks at {:.2f} GB/s)\n",
               o.layers, layer_bytes, compute_target_s * 1e3, o.select, layer_bytes, p, o.compute_gbps);
    fmt::print("remote fetch per step: {:.1f} MB all ranks; local-buffer hit rate {:.4f}\n",
               double(t.remote_bytes) / measured / 1e6, hit);
    fmt::print("{:<9} {:>10} {:>10} {:>10} {:>10} {:>8}\n", "pipeline", "fetch s", "exposed s", "compute s", "wall s",
               "overlap");
    for (int side = 0; side < 2; ++side) {
      const TpPipelineStats& s = sides[side].sum;
      fmt::print("{:<9} {:>10.4f} {:>10.4f} {:>10.4f} {:>10.4f} {:>8.3f}\n", side ? "layered" : "serial", s.fetch_s,
                 s.exposed_s, s.compute_s, s.wall_s, s.overlap());
    }
    fmt::print("layered wall / serial wall = {:.3f}; attention checksums {}\n",
               sides[1].sum.wall_s / sides[0].sum.wall_s, same ? "equal" : "DIFFER");
  }
  return same ? 0 : 1;
}

Action SetupPrefetch(CLI::App& app) {
  auto o = std::make_shared<PrefetchOptions>();
  app.add_option("--ranks", o->ranks, "in-process ranks")->capture_default_str()->check(IntIn(1, 1024));
  app.add_option("--groups", o->groups, "layer groups")->capture_default_str()->check(IntIn(1, 1024));
  app.add_option("--entries", o->entries, "live addresses")->capture_default_str()->check(IntIn(1, 1 << 30));
  app.add_option("--entry-bytes", o->entry_bytes, "bytes per group entry (GLM-5: 2624)")->capture_default_str()
      ->check(IntIn(1, 1 << 24));
  app.add_option("--layers", o->layers, "layers per group sharing its selection (GLM-5: 4 of 656 B)")
      ->capture_default_str()->check(IntIn(1, 1024));
  app.add_option("--select", o->select, "selections per group per step")->capture_default_str()
      ->check(IntIn(1, 1 << 30));
  app.add_option("--keep", o->keep, "fraction of a group's selection kept from the previous step")
      ->capture_default_str()
      ->check(RealIn(0, 1));
  app.add_option("--steps", o->steps, "steps (the first warms the local buffers)")->capture_default_str()
      ->check(IntIn(1, 1000000));
  app.add_option("--compute-gbps", o->compute_gbps, "simulated compute speed over the selected bytes")
      ->capture_default_str()
      ->check(RealIn(0, 1e6, true));
  app.add_option("--buffer-factor", o->buffer_factor, "local buffer slots per group / --select")->capture_default_str()
      ->check(RealIn(0, 1000, true));
  app.add_option("--copy-threads", o->copy_threads, "cpu backend copy threads")->capture_default_str()
      ->check(IntIn(0, 256));
  app.add_option("--seed", o->seed, "selection seed")->capture_default_str()->check(Seed());
  app.add_flag("--json", o->json, "print one JSON object");
  return [o]() -> int {
    if (o->ranks < 2 || o->groups == 0 || o->entries < o->ranks || o->select == 0 || o->steps == 0 ||
        o->compute_gbps <= 0 || o->keep < 0 || o->keep > 1 || o->buffer_factor < 1.0 || o->entry_bytes % o->layers != 0) {
      return Fail("need --ranks >= 2, --groups/--select/--steps > 0, --entries >= --ranks, --compute-gbps > 0, "
                  "--keep in [0, 1], --buffer-factor >= 1, --layers dividing --entry-bytes");
    }
    return RunPrefetch(*o);
  };
}

ULA_REGISTER_COMMAND(bench_tp_prefetch, "bench", "tp-prefetch",
                     "TP overlap within a layer group: per-layer copies behind simulated compute, layered vs serial", SetupPrefetch);

}  // namespace
}  // namespace ula::cli
