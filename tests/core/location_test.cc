#include "ula/location.h"

#include <gtest/gtest.h>

#include "core/location_table.h"

namespace ula {
namespace {

TEST(Location, PacksTierRankAndSlotInto64Bits) {
  const auto loc = Location::Make(Tier::kHost, Rank(513), SlotId(0xfffffffe));
  EXPECT_FALSE(loc.is_none());
  EXPECT_EQ(loc.tier(), Tier::kHost);
  EXPECT_EQ(loc.rank(), Rank(513));
  EXPECT_EQ(loc.slot(), SlotId(0xfffffffe));
  const auto dev = Location::Make(Tier::kDevice, Rank(0), SlotId(0));
  EXPECT_FALSE(dev.is_none());
  EXPECT_EQ(dev.tier(), Tier::kDevice);
  EXPECT_TRUE(Location::None().is_none());
}

TEST(LocationTable, TranslatesABatchAndReportsUnknownAddressesAsNone) {
  LocationTable table;
  table.Reserve(10);
  table.Set(LogicalAddr(3), Location::Make(Tier::kDevice, Rank(1), SlotId(7)));
  std::vector<LogicalAddr> addrs{LogicalAddr(3), LogicalAddr(4), LogicalAddr(1000)};
  std::vector<Location> out(3);
  table.Translate(addrs, out);
  EXPECT_EQ(out[0].slot(), SlotId(7));
  EXPECT_TRUE(out[1].is_none());
  EXPECT_TRUE(out[2].is_none());
  table.Erase(LogicalAddr(3));
  EXPECT_TRUE(table.Get(LogicalAddr(3)).is_none());
  EXPECT_EQ(LocationTable::kBytesPerEntry, 8u);
}

}  // namespace
}  // namespace ula
