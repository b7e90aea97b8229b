// Op sequences against the DP address space and its step planner (CPU backend, copies on
// worker threads): requests added and freed, entries allocated, written and read, decode
// steps with arbitrary (also duplicate, dead and foreign) selections, round changes.
// Properties after every op: CheckInvariants; every live entry reads back the bytes last
// written; after a step every output slot holds its selection's bytes; a refused call
// changes nothing observable (live count, requests, free slots of every pool).
#include <cstring>
#include <map>
#include <memory>
#include <vector>

#include "fuzz_input.h"
#include "ula/address_space.h"
#include "ula/backend.h"
#include "ula/step_planner.h"

namespace ula {
namespace {

constexpr std::uint32_t kEntry = 32;

std::vector<std::byte> Bytes(std::uint32_t addr, std::uint32_t group, std::uint32_t version) {
  std::vector<std::byte> v(kEntry);
  for (std::uint32_t i = 0; i < kEntry; ++i) v[i] = std::byte((addr * 131 + group * 17 + version * 7 + i) & 0xff);
  return v;
}

struct Observable {
  std::uint64_t live = 0;
  std::uint32_t requests = 0;
  std::vector<std::uint32_t> free;
  bool operator==(const Observable&) const = default;
};

Observable Observe(const AddressSpace& s) {
  Observable o{s.num_live_addresses(), s.num_requests(), {}};
  for (std::uint32_t r = 0; r < s.config().num_ranks; ++r) {
    for (std::uint32_t g = 0; g < s.config().num_groups; ++g) {
      o.free.push_back(s.NumFree(Rank(r), GroupId(g), Tier::kDevice));
      o.free.push_back(s.NumFree(Rank(r), GroupId(g), Tier::kHost));
    }
  }
  return o;
}

}  // namespace
}  // namespace ula

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace ula;
  fuzz::FuzzInput in(data, size);
  AddressSpaceConfig c;
  c.num_ranks = in.In(1, 2);
  c.num_groups = in.In(1, 2);
  c.entry_bytes = kEntry;
  const std::uint32_t device = in.In(2, 24), host = in.In(0, 48);
  c.device_bytes_per_rank = std::uint64_t{device} * kEntry * c.num_groups;
  c.host_bytes_per_rank = std::uint64_t{host} * kEntry * c.num_groups;
  c.policy = static_cast<PolicyKind>(in.In(0, 3));
  c.policy_options.recent_buckets = in.In(0, 3);
  auto backend = MakeCpuBackend({.copy_threads = static_cast<int>(in.In(0, 1))});
  auto created = AddressSpace::Create(c, *backend);
  if (!created) return 0;  // a refused config is fine
  AddressSpace& space = **created;
  StepPlanner planner(space);
  std::map<std::pair<std::uint32_t, std::uint32_t>, std::uint32_t> version;  // (addr, group) -> version
  std::vector<std::uint32_t> seen_addrs;  // every address handed out (some freed since)
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
    const Observable before = Observe(space);
    bool refused = false;
    switch (in.Byte() % 7) {
      case 0:
        refused = !space.AddRequest(RequestId(in.In(0, 7)), Rank(static_cast<std::uint16_t>(in.In(0, 2))));
        break;
      case 1: {
        const RequestId r(in.In(0, 7));
        auto addrs = space.Allocate(r, in.In(0, 24));
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
        const Rank rank(static_cast<std::uint16_t>(in.In(0, 2)));
        const GroupId group(in.In(0, 2));
        // Mostly the live entries of this rank (duplicates included), now and then one bad one.
        std::vector<std::uint32_t> mine;
        for (const auto& [key, v] : version) {
          if (key.second == group.value() && space.Lookup(LogicalAddr(key.first), group)->rank() == rank) {
            mine.push_back(key.first);
          }
        }
        std::vector<LogicalAddr> sel(in.In(0, 40));
        for (auto& a : sel) {
          a = LogicalAddr(mine.empty() ? pick_addr() : mine[in.In(0, static_cast<std::uint32_t>(mine.size() - 1))]);
        }
        if (!sel.empty() && in.Byte() < 32) sel[in.In(0, static_cast<std::uint32_t>(sel.size() - 1))] = LogicalAddr(pick_addr());
        std::vector<SlotId> slots(sel.size());
        const auto runs = fuzz::RunsOf(space, sel);
        auto stats = planner.Step(StepInput{rank, group, sel, runs}, slots);
        refused = !stats;
        if (stats) {
          for (std::size_t i = 0; i < sel.size(); ++i) {
            const std::byte* p = space.DeviceSlotData(rank, group, slots[i]);
            FUZZ_CHECK(p != nullptr, "no device bytes for a selection");
            const auto want = Bytes(sel[i].value(), group.value(), version.at({sel[i].value(), group.value()}));
            FUZZ_CHECK(std::memcmp(p, want.data(), kEntry) == 0, "a step output slot holds the wrong bytes");
          }
        }
        break;
      }
      case 5:
        space.AdvanceRound();
        break;
      default: {
        std::vector<std::byte> out(in.In(0, 1) ? kEntry : kEntry - 1);
        const std::uint32_t a = pick_addr(), g = in.In(0, 2);
        const bool ok = space.Read(LogicalAddr(a), GroupId(g), out).has_value();
        FUZZ_CHECK(ok == (out.size() == kEntry && version.contains({a, g})), "read of a dead or bad entry");
        break;
      }
    }
    if (refused) FUZZ_CHECK(Observe(space) == before, "a refused call changed the space");
    check_all();
  }
  return 0;
}
