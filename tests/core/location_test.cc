#include "ula/location.h"

#include <gtest/gtest.h>

#include "core/address_records.h"

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

// The dedup stamp shares the record with the location (core/address_records.h): a stamp
// never shows in a location, a Set keeps the stamp, and unknown addresses read as none.
TEST(AddressRecords, StampsNeverShowInALocationAndSetKeepsTheStamp) {
  AddressRecords table;
  table.Reserve(10);
  const Location loc = Location::Make(Tier::kHost, Rank(0xffff), SlotId(0xffffffffu));
  table.Set(LogicalAddr(3), loc);
  const std::uint32_t epoch = table.NextEpoch();
  std::uint64_t& record = table.data()[3];
  record = AddressRecords::WithStamp(record, epoch);
  EXPECT_EQ(table.Get(LogicalAddr(3)), loc) << "the stamp leaked into the location";
  const Location moved = Location::Make(Tier::kDevice, Rank(1), SlotId(7));
  table.Set(LogicalAddr(3), moved);
  EXPECT_EQ(table.Get(LogicalAddr(3)), moved);
  EXPECT_EQ(AddressRecords::StampOf(table.data()[3]), epoch) << "a publish cleared the step's stamp";
  EXPECT_TRUE(table.Get(LogicalAddr(4)).is_none());
  EXPECT_TRUE(table.Get(LogicalAddr(1000)).is_none());
  table.Erase(LogicalAddr(3));
  EXPECT_TRUE(table.Get(LogicalAddr(3)).is_none());
  EXPECT_EQ(table.data()[3], 0u);
}

}  // namespace
}  // namespace ula
