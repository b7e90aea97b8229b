#include "core/gather.h"

#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "test_seed.h"

namespace ula {
namespace {

TEST(Gather, CopiesEachSelectedEntryInSelectionOrderAndCountsMissingOnes) {
  const std::uint32_t entry = 656, slots = 300;
  std::vector<std::byte> pool(std::size_t{slots} * entry);
  for (std::size_t i = 0; i < pool.size(); ++i) pool[i] = std::byte((i * 7 + i / entry) & 0xff);
  AddressRecords table;
  table.Reserve(slots);
  ULA_TEST_SEEDED(seed, 5);
  std::mt19937 rng(static_cast<std::uint32_t>(seed));
  for (std::uint32_t a = 0; a < slots; ++a) {
    if (a % 10 != 3) table.Set(LogicalAddr(a), Location::Make(Tier::kDevice, Rank(0), SlotId((a * 37) % slots)));
  }
  std::vector<LogicalAddr> sel(1000);
  for (auto& a : sel) a = LogicalAddr(rng() % slots);
  std::vector<std::byte> out(sel.size() * entry, std::byte(0xee));
  const std::size_t missing = GatherEntries(table, sel, pool.data(), entry, out.data());
  std::size_t want_missing = 0;
  std::vector<SlotId> slot_list;
  for (std::size_t i = 0; i < sel.size(); ++i) {
    const Location loc = table.Get(sel[i]);
    if (loc.is_none()) {
      ++want_missing;
      EXPECT_EQ(out[i * entry], std::byte(0xee));
      continue;
    }
    slot_list.push_back(loc.slot());
    EXPECT_EQ(std::memcmp(out.data() + i * entry, pool.data() + std::size_t{loc.slot().value()} * entry, entry), 0);
  }
  EXPECT_EQ(missing, want_missing);
  std::vector<std::byte> out2(slot_list.size() * entry);
  GatherSlots(slot_list, pool.data(), entry, out2.data());
  for (std::size_t i = 0; i < slot_list.size(); ++i) {
    EXPECT_EQ(std::memcmp(out2.data() + i * entry, pool.data() + std::size_t{slot_list[i].value()} * entry, entry), 0);
  }
}

}  // namespace
}  // namespace ula
