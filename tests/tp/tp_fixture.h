// Test helpers for TP mode: a small in-process TP space on the cpu backend, entries filled
// with bytes derived from (address, group, version), and a snapshot of everything
// observable (home locations, bytes, buffer contents, pool occupancy) to prove that a
// refused call changed nothing.
#pragma once

#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <tuple>
#include <vector>

#include "ula/backend.h"
#include "ula/tp_address_space.h"
#include "ula/tp_step_planner.h"

namespace ula::testing {

inline TpConfig SmallTpConfig(std::uint32_t ranks, std::uint32_t device_slots, std::uint32_t host_slots,
                              std::uint32_t buffer_slots, std::uint32_t groups = 1, std::uint32_t entry_bytes = 32) {
  TpConfig c;
  c.num_ranks = ranks;
  c.num_groups = groups;
  c.entry_bytes = entry_bytes;
  const std::uint64_t per = std::uint64_t{entry_bytes} * groups;
  c.device_bytes_per_rank = per * device_slots;
  c.host_bytes_per_rank = per * host_slots;
  c.buffer_bytes_per_rank = per * buffer_slots;
  return c;
}

// The modes every engine form runs (step/engine_modes.h): stable new entries on, host
// shadows off (TpStepPlanner keeps shadows; DeviceStep refuses them).
inline TpConfig TpEngineModes(TpConfig c) {
  c.stable_new_entries = true;
  c.host_shadows = false;
  return c;
}

inline std::vector<std::byte> TpPattern(LogicalAddr a, std::uint32_t group, std::uint32_t bytes, std::uint32_t version = 0) {
  std::vector<std::byte> v(bytes);
  for (std::uint32_t i = 0; i < bytes; ++i) v[i] = std::byte((a.value() * 131 + group * 17 + version * 7 + i) & 0xff);
  return v;
}

// One run: all n selections of a step belong to `request`.
inline std::vector<SelectionRun> TpRuns(RequestId request, std::size_t n) {
  return {SelectionRun{request, static_cast<std::uint32_t>(n)}};
}

struct TpSnapshot {
  std::map<std::tuple<std::uint32_t, std::uint32_t>, std::pair<std::uint64_t, std::vector<std::byte>>> homes;
  std::map<std::tuple<std::uint32_t, std::uint32_t, std::uint32_t>, std::uint32_t> buffered;  // (rank, group, addr) -> slot
  std::vector<std::uint32_t> counts;
  std::uint64_t live = 0;
  std::uint32_t requests = 0;
  std::uint64_t digest = 0;  // DebugDigest(): policy stamps and buckets, rounds, free lists and their order
  bool operator==(const TpSnapshot&) const = default;
};

inline TpSnapshot TakeTp(const TpAddressSpace& space, const std::vector<RequestId>& requests) {
  TpSnapshot s;
  const auto& cfg = space.config();
  for (RequestId r : requests) {
    auto addrs = space.AddressesOf(r);
    if (!addrs) continue;
    for (LogicalAddr a : *addrs) {
      for (std::uint32_t g = 0; g < cfg.num_groups; ++g) {
        std::vector<std::byte> bytes(cfg.entry_bytes);
        EXPECT_TRUE(space.Read(a, GroupId(g), bytes));
        s.homes[{a.value(), g}] = {space.Lookup(a, GroupId(g)).value().bits(), bytes};
        for (std::uint32_t q = 0; q < cfg.num_ranks; ++q) {
          auto slot = space.BufferSlot(Rank(q), a, GroupId(g)).value();
          if (slot) s.buffered[{q, g, a.value()}] = slot->value();
        }
      }
    }
  }
  for (std::uint32_t q = 0; q < cfg.num_ranks; ++q) {
    for (std::uint32_t g = 0; g < cfg.num_groups; ++g) {
      s.counts.push_back(space.NumFree(Rank(q), GroupId(g), Tier::kDevice));
      s.counts.push_back(space.NumFree(Rank(q), GroupId(g), Tier::kHost));
      s.counts.push_back(space.NumBuffered(Rank(q), GroupId(g)));
    }
    s.counts.push_back(space.NumHomed(Rank(q)));
  }
  s.live = space.num_live_addresses();
  s.requests = space.num_requests();
  s.digest = space.DebugDigest();
  return s;
}

struct TpFixture {
  explicit TpFixture(const TpConfig& config, int copy_threads = 1, bool parallel_ranks = true)
      : backend(MakeCpuBackend({.copy_threads = copy_threads})),
        space(TpAddressSpace::Create(config, *backend).value()),
        planner(*space, nullptr, {.parallel_ranks = parallel_ranks}) {}

  std::vector<LogicalAddr> AddFilled(RequestId r, std::uint32_t n) {
    EXPECT_TRUE(space->AddRequest(r));
    requests.push_back(r);
    return Extend(r, n);
  }
  std::vector<LogicalAddr> Extend(RequestId r, std::uint32_t n) {
    auto addrs = space->Allocate(r, n).value();
    for (LogicalAddr a : addrs) {
      for (std::uint32_t g = 0; g < space->config().num_groups; ++g) {
        EXPECT_TRUE(space->Write(a, GroupId(g), TpPattern(a, g, space->config().entry_bytes)));
      }
    }
    return addrs;
  }
  TpSnapshot Take() const { return TakeTp(*space, requests); }

  // Every hosted rank reads the pattern bytes at its refs.
  void ExpectPlanReadsPattern(const TpStepPlan& plan, GroupId g, std::span<const LogicalAddr> sel) {
    for (std::size_t h = 0; h < plan.ranks.size(); ++h) {
      for (std::size_t j = 0; j < sel.size(); ++j) {
        const std::byte* p = space->RefData(plan.ranks[h], g, plan.refs[h][j]);
        ASSERT_NE(p, nullptr);
        const auto want = TpPattern(sel[j], g.value(), space->config().entry_bytes);
        ASSERT_EQ(std::memcmp(p, want.data(), want.size()), 0)
            << "rank " << plan.ranks[h].value() << " selection " << j << " address " << sel[j].value();
      }
    }
  }

  std::unique_ptr<Backend> backend;
  std::unique_ptr<TpAddressSpace> space;
  TpStepPlanner planner;
  std::vector<RequestId> requests;
};

}  // namespace ula::testing
