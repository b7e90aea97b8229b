// Op sequences against the TP address space and its step planner, every rank in this
// process (CPU backend), with local buffers or attention at home: requests added and
// freed, entries allocated, written and read, decode steps with arbitrary (also duplicate
// and dead) selections, round changes. Properties after every op: CheckInvariants; every
// live entry reads back the bytes last written; after a step every read ref a rank gets
// (shard or local buffer) holds its selection's bytes, and kElsewhere only at home; a
// refused call changes nothing observable (live count, requests, homed and free counts).
#include <cstring>
#include <map>
#include <memory>
#include <vector>

#include "fuzz_input.h"
#include "ula/backend.h"
#include "ula/tp_address_space.h"
#include "ula/tp_step_planner.h"

namespace ula {
namespace {

constexpr std::uint32_t kEntry = 32;

std::vector<std::byte> Bytes(std::uint32_t addr, std::uint32_t group, std::uint32_t version) {
  std::vector<std::byte> v(kEntry);
  for (std::uint32_t i = 0; i < kEntry; ++i) v[i] = std::byte((addr * 131 + group * 17 + version * 7 + i) & 0xff);
  return v;
}

std::vector<std::uint64_t> Observe(const TpAddressSpace& s) {
  std::vector<std::uint64_t> o{s.num_live_addresses(), s.num_requests()};
  for (std::uint32_t r = 0; r < s.config().num_ranks; ++r) {
    o.push_back(s.NumHomed(Rank(static_cast<std::uint16_t>(r))));
    for (std::uint32_t g = 0; g < s.config().num_groups; ++g) {
      const Rank rank(static_cast<std::uint16_t>(r));
      o.push_back(s.NumFree(rank, GroupId(g), Tier::kDevice));
      o.push_back(s.NumFree(rank, GroupId(g), Tier::kHost));
      o.push_back(s.NumBuffered(rank, GroupId(g)));
    }
  }
  return o;
}

}  // namespace
}  // namespace ula

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace ula;
  fuzz::FuzzInput in(data, size);
  TpConfig c;
  c.num_ranks = in.In(1, 4);
  c.num_groups = in.In(1, 2);
  c.entry_bytes = kEntry;
  c.attention = in.Bool() ? TpAttention::kAtHome : TpAttention::kLocalBuffer;
  const std::uint32_t device = in.In(2, 16), host = in.In(0, 32), buffer = in.In(1, 32);
  c.device_bytes_per_rank = std::uint64_t{device} * kEntry * c.num_groups;
  c.host_bytes_per_rank = std::uint64_t{host} * kEntry * c.num_groups;
  c.buffer_bytes_per_rank = c.attention == TpAttention::kAtHome ? 0 : std::uint64_t{buffer} * kEntry * c.num_groups;
  c.policy = static_cast<PolicyKind>(in.In(0, 3));
  c.buffer_policy = static_cast<PolicyKind>(in.In(0, 3));
  c.policy_options.recent_buckets = in.In(0, 3);
  auto backend = MakeCpuBackend({.copy_threads = static_cast<int>(in.In(0, 1))});
  auto created = TpAddressSpace::Create(c, *backend);
  if (!created) return 0;
  TpAddressSpace& space = **created;
  TpStepPlanner planner(space, nullptr, TpPlannerOptions{.parallel_ranks = in.Bool()});
  std::map<std::pair<std::uint32_t, std::uint32_t>, std::uint32_t> version;
  std::vector<std::uint32_t> seen_addrs;
  std::uint32_t next_version = 1;

  auto check_all = [&] {
    FUZZ_OK(space.CheckInvariants());
    std::vector<std::byte> out(kEntry);
    for (const auto& [key, v] : version) {
      FUZZ_OK(space.Read(LogicalAddr(key.first), GroupId(key.second), out));
      FUZZ_CHECK(out == Bytes(key.first, key.second, v), "entry " + std::to_string(key.first) + " lost its bytes");
    }
  };
  auto pick_addr = [&]() -> std::uint32_t {
    if (seen_addrs.empty() || in.Byte() < 16) return in.In(0, 300);
    return seen_addrs[in.In(0, static_cast<std::uint32_t>(seen_addrs.size() - 1))];
  };

  for (int op = 0; op < 200 && !in.empty(); ++op) {
    const auto before = Observe(space);
    bool refused = false;
    switch (in.Byte() % 7) {
      case 0:
        refused = !space.AddRequest(RequestId(in.In(0, 7)));
        break;
      case 1: {
        auto addrs = space.Allocate(RequestId(in.In(0, 7)), in.In(0, 24));
        refused = !addrs;
        if (addrs) {
          for (LogicalAddr a : *addrs) {
            seen_addrs.push_back(a.value());
            for (std::uint32_t g = 0; g < c.num_groups; ++g) {
              const std::uint32_t v = next_version++;
              FUZZ_OK(space.Write(a, GroupId(g), Bytes(a.value(), g, v)));
              version[{a.value(), g}] = v;
            }
          }
        }
        break;
      }
      case 2: {
        const RequestId r(in.In(0, 7));
        auto addrs = space.AddressesOf(r);
        std::vector<LogicalAddr> gone;
        if (addrs) gone.assign(addrs->begin(), addrs->end());
        refused = !space.Free(r);
        if (!refused) {
          for (LogicalAddr a : gone) {
            for (std::uint32_t g = 0; g < c.num_groups; ++g) version.erase({a.value(), g});
          }
        }
        break;
      }
      case 3: {
        const std::uint32_t a = pick_addr(), g = in.In(0, 2), v = next_version++;
        const bool valid = g < c.num_groups && space.IsLive(LogicalAddr(a));
        refused = !space.Write(LogicalAddr(a), GroupId(g), Bytes(a, g, v));
        FUZZ_CHECK(refused == !valid, "a write to a live entry is accepted, any other refused");
        if (!refused) version[{a, g}] = v;
        break;
      }
      case 4: {
        const GroupId group(in.In(0, 2));
        // Mostly live entries (duplicates included), now and then one bad one.
        std::vector<std::uint32_t> live;
        for (const auto& [key, v] : version) {
          if (key.second == group.value()) live.push_back(key.first);
        }
        std::vector<LogicalAddr> sel(in.In(0, 40));
        for (auto& a : sel) {
          a = LogicalAddr(live.empty() ? pick_addr() : live[in.In(0, static_cast<std::uint32_t>(live.size() - 1))]);
        }
        if (!sel.empty() && in.Byte() < 32) sel[in.In(0, static_cast<std::uint32_t>(sel.size() - 1))] = LogicalAddr(pick_addr());
        const auto runs = fuzz::RunsOf(space, sel);
        auto plan = planner.Step(group, sel, runs);
        refused = !plan;
        if (plan) {
          FUZZ_CHECK(plan->ranks.size() == c.num_ranks, "a plan covers every hosted rank");
          for (std::size_t h = 0; h < plan->ranks.size(); ++h) {
            for (std::size_t i = 0; i < sel.size(); ++i) {
              const TpReadRef ref = plan->refs[h][i];
              const Rank home = space.HomeOf(sel[i]);
              if (ref.source == TpReadRef::Source::kElsewhere) {
                FUZZ_CHECK(c.attention == TpAttention::kAtHome && home != plan->ranks[h], "kElsewhere only at home");
                continue;
              }
              const std::byte* p = space.RefData(plan->ranks[h], group, ref);
              FUZZ_CHECK(p != nullptr, "a read ref without bytes");
              const auto want = Bytes(sel[i].value(), group.value(), version.at({sel[i].value(), group.value()}));
              FUZZ_CHECK(std::memcmp(p, want.data(), kEntry) == 0, "a read ref holds the wrong bytes");
            }
          }
        }
        break;
      }
      case 5:
        space.AdvanceRound();
        break;
      default: {
        std::vector<std::byte> out(kEntry);
        const std::uint32_t a = pick_addr(), g = in.In(0, 2);
        const bool ok = space.Read(LogicalAddr(a), GroupId(g), out).has_value();
        FUZZ_CHECK(ok == version.contains({a, g}), "read of a dead or bad entry");
        break;
      }
    }
    if (refused) FUZZ_CHECK(Observe(space) == before, "a refused call changed the space");
    check_all();
  }
  return 0;
}
