// `ula bench gather`: translate + gather of selected entries into one contiguous buffer
// (what an attention kernel's input staging does), against memcpy of the same number of
// bytes, measured side by side in one run. Beside the ratio it reports, from the same run,
// how much of the pool, table and buffers the kernel backed with transparent huge pages
// (AnonHugePages of the process, before and after they were touched), the random-read
// cost of `bench planner` over an array as large as the location table, and the CPU model:
// the ratio depends on all three (docs/BENCHMARKS.md, "gather").
// --backend cuda --pattern random: instead of the gather, the memory-bound reference of the
// device step (step/device_io.h, MeasureRandomRead): independent 8-byte reads at random
// indices of a device table of --table-mib (a group's location table), in GB/s and ns per
// read, beside the device-to-device copy of the same run (docs/BENCHMARKS.md, "GPU check").
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <nlohmann/json.hpp>
#include <random>
#include <string>

#include "bench_memory.h"
#include "cli_checks.h"
#include "command_registry.h"
#include "ula/backend.h"
#include "core/gather.h"
#include "core/address_records.h"
#include "step/device_io.h"

namespace ula::cli {
namespace {

struct GatherOptions {
  std::uint32_t entry_bytes = 656;
  std::uint64_t pool_mib = 1024;   // device pool the entries are gathered from
  std::uint32_t selections = 2048 * 64;  // top-k 2048 x batch 64
  int repeats = 15;
  std::uint64_t seed = 7;
  bool json = false;
  std::string backend = "cpu";  // cpu: translate + gather on the host; cuda: the cuda backend's gather kernel
  std::string pattern = "gather";  // gather; random (--backend cuda): random 8-byte reads of a table
  std::uint64_t table_mib = 256;   // --pattern random: the table read
  std::uint64_t reads = std::uint64_t{1} << 26;  // --pattern random: reads per run
};


double MedianSeconds(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// --backend cuda: the cuda backend's gather kernel (one batch of `selections` moves of
// entry_bytes from random slots of a device pool into a contiguous device buffer) against a
// device-to-device copy of the same bytes (one bulk move: cudaMemcpyAsync), each timed from
// Submit to the end of Wait on the host, median of `repeats`. The move list (16 bytes per
// row) is read by the kernel from pinned host memory: part of the gather's cost here.
int RunGatherCuda(const GatherOptions& o) {
  auto made = MakeCudaBackend();
  if (!made) {
    fmt::print(stderr, "ula bench gather --backend cuda: {}\n", made.error().ToString());
    return 2;
  }
  Backend& backend = **made;
  const std::uint64_t slots = o.pool_mib * 1024 * 1024 / o.entry_bytes;
  const std::uint64_t bytes = std::uint64_t{o.selections} * o.entry_bytes;
  if (bytes > 0xffffffffu) {
    fmt::print(stderr, "ula bench gather --backend cuda: {} bytes per run: at most 2^32 - 1\n", bytes);
    return 2;
  }
  auto pool = backend.CreateArena(Tier::kDevice, Rank(0), slots * o.entry_bytes);
  auto src = backend.CreateArena(Tier::kDevice, Rank(0), bytes);
  auto out = backend.CreateArena(Tier::kDevice, Rank(0), bytes);
  if (!pool || !src || !out) {
    fmt::print(stderr, "ula bench gather --backend cuda: cannot allocate the buffers on GPU 0\n");
    return 2;
  }
  std::mt19937_64 rng(o.seed);
  CopyBatch gather{pool->id, out->id, o.entry_bytes, false, {}};
  gather.moves.resize(o.selections);
  for (std::uint32_t i = 0; i < o.selections; ++i) {
    gather.moves[i] = {(rng() % slots) * o.entry_bytes, std::uint64_t{i} * o.entry_bytes};
  }
  const CopyBatch copy{src->id, out->id, static_cast<std::uint32_t>(bytes), false, {{0, 0}}};
  auto timed = [&](const CopyBatch& b) -> double {
    const auto t0 = std::chrono::steady_clock::now();
    auto f = backend.Submit(b);
    if (!f || !backend.Wait(*f)) return -1.0;
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  std::vector<double> t_copy, t_gather;
  for (int rep = 0; rep < o.repeats + 1; ++rep) {  // the first run of each warms up
    const double c = timed(copy), g = o.pattern == "random" ? 1.0 : timed(gather);  // random: no gather
    if (c < 0 || g < 0) {
      fmt::print(stderr, "ula bench gather --backend cuda: a batch failed\n");
      return 1;
    }
    if (rep > 0) t_copy.push_back(c), t_gather.push_back(g);
  }
  const double copy_gbps = double(bytes) / MedianSeconds(t_copy) / 1e9;
  const double gather_gbps = double(bytes) / MedianSeconds(t_gather) / 1e9;
  if (o.pattern == "random") {
    auto r = MeasureRandomRead(o.table_mib << 20, o.reads, o.repeats, o.seed);
    if (!r) {
      fmt::print(stderr, "ula bench gather --backend cuda --pattern random: {}\n", r.error().ToString());
      return 2;
    }
    if (o.json) {
      nlohmann::json j{{"backend", "cuda"}, {"pattern", "random"}, {"table_mib", o.table_mib}, {"reads", r->reads},
                       {"repeats", o.repeats}, {"timing", "cuda_events"}, {"random_read_ms", r->ms_median},
                       {"random_read_ns", r->ns_per_read}, {"random_read_gbps", r->gbps},
                       {"copy_bytes", bytes}, {"copy_gbps", copy_gbps}, {"ratio", r->gbps / copy_gbps}};
      fmt::print("{}\n", j.dump());
    } else {
      fmt::print("cuda random reads: {} reads of 8 B at random indices of a {} MiB device table, median of {} runs "
                 "(CUDA events)\n", r->reads, o.table_mib, o.repeats);
      fmt::print("  device-to-device copy  {:8.2f} GB/s ({:.1f} MiB)\n", copy_gbps, bytes / 1048576.0);
      fmt::print("  random 8-byte reads    {:8.2f} GB/s, {:.3f} ns per read\n", r->gbps, r->ns_per_read);
      fmt::print("  ratio                  {:8.3f}\n", r->gbps / copy_gbps);
    }
    return 0;
  }
  if (o.json) {
    nlohmann::json j{{"backend", "cuda"}, {"entry_bytes", o.entry_bytes}, {"selections", o.selections},
                     {"pool_mib", o.pool_mib}, {"bytes", bytes}, {"repeats", o.repeats},
                     {"copy_gbps", copy_gbps}, {"gather_gbps", gather_gbps}, {"ratio", gather_gbps / copy_gbps}};
    fmt::print("{}\n", j.dump());
  } else {
    fmt::print("cuda gather of {} entries x {} B ({:.1f} MiB) from a {} MiB device pool, median of {} runs\n",
               o.selections, o.entry_bytes, bytes / 1048576.0, o.pool_mib, o.repeats);
    fmt::print("  device-to-device copy  {:8.2f} GB/s\n", copy_gbps);
    fmt::print("  gather kernel          {:8.2f} GB/s\n", gather_gbps);
    fmt::print("  ratio                  {:8.3f}\n", gather_gbps / copy_gbps);
  }
  return 0;
}

int RunGather(const GatherOptions& o) {
  if (o.pattern == "random" && o.backend != "cuda") {
    fmt::print(stderr, "ula bench gather: --pattern random reads a device table: it needs --backend cuda\n");
    return 2;
  }
  if (o.backend == "cuda") return RunGatherCuda(o);
  // Every buffer is an arena of the cpu backend, so both sides see the same memory.
  const std::int64_t huge_before = AnonHugePagesKiB();
  auto backend = MakeCpuBackend();
  const std::uint64_t slots = o.pool_mib * 1024 * 1024 / o.entry_bytes;
  const std::size_t bytes = std::size_t{o.selections} * o.entry_bytes;
  auto pool = backend->CreateArena(Tier::kDevice, Rank(0), slots * o.entry_bytes);
  auto src = backend->CreateArena(Tier::kDevice, Rank(0), bytes);
  auto out = backend->CreateArena(Tier::kDevice, Rank(0), bytes);
  if (!pool || !src || !out) {
    fmt::print(stderr, "ula bench gather: cannot allocate the buffers\n");
    return 2;
  }
  for (std::size_t i = 0; i < slots * o.entry_bytes; i += 4096) pool->data[i] = std::byte(i >> 12);
  std::memset(src->data, 1, bytes);
  // Logical addresses map to scattered device slots, as after many steps of eviction.
  const std::uint32_t n_addr = static_cast<std::uint32_t>(slots);
  std::vector<std::uint32_t> perm(n_addr);
  for (std::uint32_t i = 0; i < n_addr; ++i) perm[i] = i;
  std::mt19937_64 rng(o.seed);
  std::shuffle(perm.begin(), perm.end(), rng);
  AddressRecords table;
  table.Reserve(n_addr);
  for (std::uint32_t a = 0; a < n_addr; ++a) table.Set(LogicalAddr(a), Location::Make(Tier::kDevice, Rank(0), SlotId(perm[a])));
  const std::int64_t huge_after = AnonHugePagesKiB();
  const double huge_mib = huge_before < 0 || huge_after < 0 ? -1.0 : (huge_after - huge_before) / 1024.0;
  // Touched by now: the pool, the source buffer and the table (the output buffer is not).
  const double touched_mib = (double(slots * o.entry_bytes) + double(bytes) + double(n_addr) * sizeof(Location)) / 1048576.0;
  const double read_ns = RandomReadNs(std::size_t{n_addr} * sizeof(Location), o.seed);
  std::vector<LogicalAddr> selected(o.selections);
  for (auto& a : selected) a = LogicalAddr(static_cast<std::uint32_t>(rng() % n_addr));
  std::vector<std::byte> flush(64 << 20);  // rewritten between runs to evict the caches
  std::vector<double> t_memcpy, t_gather;
  for (int rep = 0; rep < o.repeats; ++rep) {
    std::memset(flush.data(), rep, flush.size());
    auto t0 = std::chrono::steady_clock::now();
    std::memcpy(out->data, src->data, bytes);
    auto t1 = std::chrono::steady_clock::now();
    std::memset(flush.data(), rep + 1, flush.size());
    auto t2 = std::chrono::steady_clock::now();
    const std::size_t missing = GatherEntries(table, selected, pool->data, o.entry_bytes, out->data);
    auto t3 = std::chrono::steady_clock::now();
    if (missing != 0) return 1;
    t_memcpy.push_back(std::chrono::duration<double>(t1 - t0).count());
    t_gather.push_back(std::chrono::duration<double>(t3 - t2).count());
  }
  const double memcpy_gbps = bytes / MedianSeconds(t_memcpy) / 1e9;
  const double gather_gbps = bytes / MedianSeconds(t_gather) / 1e9;
  const double ratio = gather_gbps / memcpy_gbps;
  if (o.json) {
    nlohmann::json j{{"entry_bytes", o.entry_bytes}, {"selections", o.selections}, {"pool_mib", o.pool_mib},
                     {"bytes", bytes},               {"repeats", o.repeats},       {"memcpy_gbps", memcpy_gbps},
                     {"gather_gbps", gather_gbps},   {"ratio", ratio},
                     {"huge_page_mib", huge_mib},    {"huge_page_candidate_mib", touched_mib},
                     {"random_read_ns", read_ns},    {"cpu_model", CpuModel()}};
    fmt::print("{}\n", j.dump());
  } else {
    fmt::print("gather of {} entries x {} B ({:.1f} MiB) from a {} MiB pool, median of {} runs\n", o.selections,
               o.entry_bytes, bytes / 1048576.0, o.pool_mib, o.repeats);
    fmt::print("  memcpy            {:8.2f} GB/s\n", memcpy_gbps);
    fmt::print("  translate+gather  {:8.2f} GB/s\n", gather_gbps);
    fmt::print("  ratio             {:8.3f}\n", ratio);
    fmt::print("  huge pages        {:8.1f} MiB of {:.1f} MiB of pool, source buffer and table{}\n", huge_mib, touched_mib,
               huge_mib < 0 ? " (AnonHugePages unreadable)" : huge_mib < 0.5 * touched_mib ? " (mostly 4 KiB pages)" : "");
    fmt::print("  random read       {:8.2f} ns (an array as large as the location table, {:.1f} MiB)\n", read_ns,
               n_addr * sizeof(Location) / 1048576.0);
    fmt::print("  cpu               {}\n", CpuModel());
  }
  return 0;
}

Action SetupGather(CLI::App& app) {
  auto o = std::make_shared<GatherOptions>();
  app.add_option("--entry-bytes", o->entry_bytes, "bytes per entry")->capture_default_str()->check(IntIn(1, 1 << 24));
  app.add_option("--pool-mib", o->pool_mib, "size of the pool gathered from, MiB")->capture_default_str()
      ->check(IntIn(1, 1 << 20));
  app.add_option("--selections", o->selections, "entries gathered per run")->capture_default_str()
      ->check(IntIn(1, 1 << 30));
  app.add_option("--repeats", o->repeats, "runs (the median is reported)")->capture_default_str()
      ->check(IntIn(1, 10000));
  app.add_option("--seed", o->seed, "random seed")->capture_default_str()->check(Seed());
  app.add_flag("--json", o->json, "print one JSON object");
  app.add_option("--backend", o->backend,
                 "cpu: translate + gather vs memcpy on the host; cuda: the cuda backend's gather kernel vs a "
                 "device-to-device copy of the same bytes (needs a CUDA device)")
      ->capture_default_str()->check(CLI::IsMember({"cpu", "cuda"}));
  app.add_option("--pattern", o->pattern,
                 "gather; random (--backend cuda): random 8-byte reads of a --table-mib device table (the device "
                 "step's memory-bound reference) instead of the gather, beside the device-to-device copy")
      ->capture_default_str()->check(CLI::IsMember({"gather", "random"}));
  app.add_option("--table-mib", o->table_mib, "--pattern random: the table read, MiB")->capture_default_str()
      ->check(IntIn(1, 1 << 20));
  app.add_option("--reads", o->reads, "--pattern random: reads per run")->capture_default_str()
      ->check(IntIn(1, std::uint64_t{1} << 34));
  return [o] { return RunGather(*o); };
}

ULA_REGISTER_COMMAND(bench_gather, "bench", "gather", "translate + gather of selected entries vs memcpy", SetupGather);

}  // namespace
}  // namespace ula::cli
