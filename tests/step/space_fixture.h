// Test helpers for the DP address space: a small space on the cpu backend, entries filled
// with bytes derived from (address, group, version), and a snapshot of everything
// observable (plus the full-state DebugDigest) to prove that a refused call changed nothing.
#pragma once

#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <tuple>
#include <vector>

#include "ula/address_space.h"
#include "ula/backend.h"
#include "ula/step_planner.h"

namespace ula::testing {

inline AddressSpaceConfig SmallConfig(std::uint32_t device_slots, std::uint32_t host_slots, std::uint32_t ranks = 1,
                                      std::uint32_t groups = 1, std::uint32_t entry_bytes = 32) {
  AddressSpaceConfig c;
  c.num_ranks = ranks;
  c.num_groups = groups;
  c.entry_bytes = entry_bytes;
  c.device_bytes_per_rank = std::uint64_t{device_slots} * entry_bytes * groups;
  c.host_bytes_per_rank = std::uint64_t{host_slots} * entry_bytes * groups;
  return c;
}

// The modes the engine path requires of a space (step/engine_modes.h): stable new entries
// on, host shadows off. StepPlanner's engine path and DeviceStep refuse any other space.
inline AddressSpaceConfig EngineModes(AddressSpaceConfig c) {
  c.stable_new_entries = true;
  c.host_shadows = false;
  return c;
}

inline std::vector<std::byte> Pattern(LogicalAddr a, std::uint32_t group, std::uint32_t bytes, std::uint32_t version = 0) {
  std::vector<std::byte> v(bytes);
  for (std::uint32_t i = 0; i < bytes; ++i) v[i] = std::byte((a.value() * 131 + group * 17 + version * 7 + i) & 0xff);
  return v;
}

// One run: all n selections of a step belong to `request`.
inline std::vector<SelectionRun> Runs(RequestId request, std::size_t n) {
  return {SelectionRun{request, static_cast<std::uint32_t>(n)}};
}

struct Snapshot {
  std::map<std::tuple<std::uint32_t, std::uint32_t>, std::pair<std::uint64_t, std::vector<std::byte>>> entries;
  std::vector<std::uint32_t> free_counts;
  std::uint64_t live = 0;
  std::uint32_t requests = 0;
  std::uint64_t digest = 0;  // DebugDigest(): policy stamps and buckets, rounds, free lists and their order
  bool operator==(const Snapshot&) const = default;
};

inline Snapshot Take(const AddressSpace& space, const std::vector<RequestId>& requests) {
  Snapshot s;
  const auto& cfg = space.config();
  for (RequestId r : requests) {
    auto addrs = space.AddressesOf(r);
    if (!addrs) continue;
    for (LogicalAddr a : *addrs) {
      for (std::uint32_t g = 0; g < cfg.num_groups; ++g) {
        std::vector<std::byte> bytes(cfg.entry_bytes_of(GroupId(g)));
        EXPECT_TRUE(space.Read(a, GroupId(g), bytes));
        s.entries[{a.value(), g}] = {space.Lookup(a, GroupId(g)).value().bits(), bytes};
      }
    }
  }
  for (std::uint32_t r = 0; r < cfg.num_ranks; ++r) {
    for (std::uint32_t g = 0; g < cfg.num_groups; ++g) {
      s.free_counts.push_back(space.NumFree(Rank(r), GroupId(g), Tier::kDevice));
      s.free_counts.push_back(space.NumFree(Rank(r), GroupId(g), Tier::kHost));
    }
  }
  s.live = space.num_live_addresses();
  s.requests = space.num_requests();
  s.digest = space.DebugDigest();
  return s;
}

struct SpaceFixture {
  explicit SpaceFixture(const AddressSpaceConfig& config, int copy_threads = 1)
      : backend(MakeCpuBackend({.copy_threads = copy_threads})),
        space(AddressSpace::Create(config, *backend).value()),
        planner(*space) {}

  std::vector<LogicalAddr> AddFilled(RequestId r, Rank rank, std::uint32_t n) {
    EXPECT_TRUE(space->AddRequest(r, rank));
    requests.push_back(r);
    return Extend(r, n);
  }
  std::vector<LogicalAddr> Extend(RequestId r, std::uint32_t n) {
    auto addrs = space->Allocate(r, n).value();
    for (LogicalAddr a : addrs) {
      for (std::uint32_t g = 0; g < space->config().num_groups; ++g) {
        EXPECT_TRUE(space->Write(a, GroupId(g), Pattern(a, g, space->config().entry_bytes)));
      }
    }
    return addrs;
  }
  Snapshot Take() const { return testing::Take(*space, requests); }

  std::unique_ptr<Backend> backend;
  std::unique_ptr<AddressSpace> space;
  StepPlanner planner;
  std::vector<RequestId> requests;
};

}  // namespace ula::testing
