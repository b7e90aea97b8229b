// `ula bench tp-fetch` (run under mpirun, one process per rank): the MPI engine's
// one-sided fetch bandwidth against memcpy, measured side by side in the same processes.
// Each rank fetches `--entries` entries homed on the next rank into its local buffer
// (TpFabric::FetchFromHome: MPI_Get of the home locations, then of the bytes, one get per
// run of contiguous remote memory) and, in the same run, memcpy-gathers the same number of entries from its
// own shard into the same buffer slots. Rank 0 prints its figures and the slowest rank's.
// The first repeat's fetched bytes are checked entry by entry against their address's
// pattern ("fetched bytes verified").
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <nlohmann/json.hpp>

#include "cli_checks.h"
#include "command_registry.h"
#include "ula/tp_address_space.h"
#ifdef ULA_HAVE_MPI
#include "ula/tp_mpi.h"
#endif

namespace ula::cli {
namespace {

struct FetchOptions {
  std::uint32_t entries = 16384, entry_bytes = 2624, repeats = 5, stride = 1;
  bool json = false;
};

int RunFetch(const FetchOptions& o) {
#ifndef ULA_HAVE_MPI
  fmt::print(stderr, "ula bench tp-fetch: this `ula` was built without MPI (see src/tp/mpi)\n");
  return 2;
#else
  auto session = MpiSession::Init(nullptr, nullptr);
  if (!session) {
    fmt::print(stderr, "ula bench tp-fetch: {}\n", session.error().ToString());
    return 2;
  }
  int rc = 0;
  {
    auto fabric = MakeMpiFabric();
    if (!fabric) {
      fmt::print(stderr, "ula bench tp-fetch: {}\n", fabric.error().ToString());
      return 2;
    }
    TpFabric& f = **fabric;
    const std::uint32_t p = f.num_ranks(), me = f.local_rank().value();
    if (p < 2) {
      fmt::print(stderr, "ula bench tp-fetch: needs at least 2 ranks (mpirun -np N, N >= 2)\n");
      return 2;
    }
    auto backend = MakeCpuBackend({.copy_threads = 0});
    TpConfig c;
    c.num_ranks = p;
    c.num_groups = 1;
    c.entry_bytes = o.entry_bytes;
    c.device_bytes_per_rank = std::uint64_t{o.entries} * o.entry_bytes;
    c.buffer_bytes_per_rank = std::uint64_t{o.entries} * o.entry_bytes;
    const Rank mine = f.local_rank();
    auto space = TpAddressSpace::Create(c, *backend, std::span(&mine, 1));
    if (!space) {
      fmt::print(stderr, "ula bench tp-fetch: {}\n", space.error().ToString());
      return 2;
    }
    TpAddressSpace& s = **space;
    (void)s.AddRequest(RequestId(0));
    auto addrs = s.Allocate(RequestId(0), o.entries * p).value();
    // Each entry's bytes derive from its address, so the check below sees misplaced entries.
    auto pattern = [&](LogicalAddr a, std::vector<std::byte>& v) {
      v.resize(o.entry_bytes);
      for (std::uint32_t i = 0; i < o.entry_bytes; ++i) v[i] = std::byte((a.value() * 131 + i * 7) & 0xff);
    };
    std::vector<std::byte> fill;
    for (LogicalAddr a : addrs) {
      pattern(a, fill);
      (void)s.Write(a, GroupId(0), fill);
    }
    if (auto e = f.Expose(s); !e) {
      fmt::print(stderr, "ula bench tp-fetch: {}\n", e.error().ToString());
      return 2;
    }
    const Rank src(static_cast<std::uint16_t>((me + 1) % p));
    std::vector<LogicalAddr> remote, local;
    for (LogicalAddr a : addrs) (s.HomeOf(a) == src ? remote : local).push_back(a);
    if (s.HomeOf(local.front()) != mine) local.clear();
    std::vector<LogicalAddr> own;
    for (LogicalAddr a : addrs) {
      if (s.HomeOf(a) == mine) own.push_back(a);
    }
    // --stride k: every k-th entry only (k > 1: no two fetched entries are adjacent in
    // remote memory, so the coalesced fetch issues one get per entry).
    auto thin = [&](std::vector<LogicalAddr>& v) {
      std::size_t m = 0;
      for (std::size_t i = 0; i < v.size(); i += o.stride) v[m++] = v[i];
      v.resize(m);
    };
    thin(remote);
    thin(own);
    const TpShardMemory mem = s.ShardMemory(mine, GroupId(0));
    std::vector<std::byte> buffer(std::uint64_t{o.entries} * o.entry_bytes);
    std::vector<std::byte*> dst(o.entries);
    for (std::uint32_t i = 0; i < o.entries; ++i) dst[i] = buffer.data() + std::uint64_t{i} * o.entry_bytes;
    using Clock = std::chrono::steady_clock;
    double mpi_s = 0, memcpy_s = 0;
    bool bytes_ok = true;
    for (std::uint32_t rep = 0; rep < o.repeats; ++rep) {
      f.Barrier();
      auto t0 = Clock::now();
      if (auto e = f.FetchFromHome(src, GroupId(0), remote, std::span(dst).first(remote.size())); !e) {
        fmt::print(stderr, "ula bench tp-fetch: {}\n", e.error().ToString());
        rc = 1;
      }
      mpi_s += std::chrono::duration<double>(Clock::now() - t0).count();
      if (rep == 0) {  // every fetched entry, outside the timing
        for (std::size_t i = 0; i < remote.size() && bytes_ok; ++i) {
          pattern(remote[i], fill);
          bytes_ok = std::memcmp(dst[i], fill.data(), o.entry_bytes) == 0;
        }
      }
      t0 = Clock::now();
      for (std::uint32_t i = 0; i < own.size(); ++i) {
        const Location loc = mem.home[own[i].value() / p];
        std::memcpy(dst[i], mem.device.data + std::uint64_t{loc.slot().value()} * o.entry_bytes, o.entry_bytes);
      }
      memcpy_s += std::chrono::duration<double>(Clock::now() - t0).count();
    }
    const double bytes = double(remote.size()) * o.entry_bytes * o.repeats;
    const double mpi_bw = bytes / mpi_s, cpy_bw = bytes / memcpy_s;
    // Slowest rank's MPI bandwidth, via the fabric's all-gather.
    std::vector<double> all(p);
    (void)f.AllGather(std::as_bytes(std::span(&mpi_bw, 1)), std::as_writable_bytes(std::span(all)));
    const double slowest = *std::min_element(all.begin(), all.end());
    f.Unexpose();
    if (me == 0) {
      if (o.json) {
        nlohmann::json j{{"ranks", p}, {"entries", o.entries}, {"entry_bytes", o.entry_bytes}, {"repeats", o.repeats}, {"stride", o.stride},
                         {"mpi_get_bytes_per_s", mpi_bw}, {"memcpy_bytes_per_s", cpy_bw},
                         {"mpi_over_memcpy", mpi_bw / cpy_bw}, {"slowest_rank_mpi_get_bytes_per_s", slowest},
                         {"bytes_ok", bytes_ok}};
        fmt::print("{}\n", j.dump());
      } else {
        fmt::print("ula bench tp-fetch: {} ranks, {} entries of {} B (stride {}) x {} repeats per rank\n", p,
                   remote.size(), o.entry_bytes, o.stride, o.repeats);
        fmt::print("  MPI one-sided fetch (rank 0 <- rank 1): {:.2f} GB/s; slowest rank {:.2f} GB/s\n", mpi_bw / 1e9,
                   slowest / 1e9);
        fmt::print("  memcpy gather, same entries, same run: {:.2f} GB/s; MPI / memcpy = {:.3f}\n", cpy_bw / 1e9,
                   mpi_bw / cpy_bw);
        fmt::print("  fetched bytes {}\n", bytes_ok ? "verified" : "WRONG");
      }
    }
    if (!bytes_ok) rc = 1;
  }
  return rc;
#endif
}

Action SetupFetch(CLI::App& app) {
  auto o = std::make_shared<FetchOptions>();
  app.add_option("--entries", o->entries, "entries fetched per rank per repeat")->capture_default_str()
      ->check(IntIn(1, 1 << 30));
  app.add_option("--entry-bytes", o->entry_bytes, "bytes per entry (GLM-5 group: 2624)")->capture_default_str()
      ->check(IntIn(1, 1 << 24));
  app.add_option("--repeats", o->repeats, "repeats")->capture_default_str()->check(IntIn(1, 10000));
  app.add_option("--stride", o->stride, "fetch every k-th remote entry (k > 1: no contiguous runs)")
      ->capture_default_str()->check(IntIn(1, 1 << 20));
  app.add_flag("--json", o->json, "print one JSON object (rank 0)");
  return [o]() -> int { return RunFetch(*o); };
}

ULA_REGISTER_COMMAND(bench_tp_fetch, "bench", "tp-fetch",
                     "TP over MPI: one-sided fetch bandwidth vs memcpy (run under mpirun)", SetupFetch);

}  // namespace
}  // namespace ula::cli
