// TP allocation homes new entries round-robin over the ranks and skips a rank whose shard
// is full (src/space/tp_address_space.cc, Allocate).
#include <gtest/gtest.h>

#include <cstring>

#include "tp/tp_fixture.h"
#include "ula/backend.h"
#include "ula/tp_address_space.h"

namespace ula {
namespace {

TEST(TpAllocate, RoundRobinSkipsAFullRank) {
  TpConfig c = testing::SmallTpConfig(/*ranks=*/2, /*device=*/1, /*host=*/1, /*buffer=*/0);
  c.attention = TpAttention::kAtHome;  // no local buffer: 2 entries per shard
  c.page_tokens = 1;                   // the unpaged allocator (tp_address_space.h "Pages")
  auto backend = MakeCpuBackend();
  auto space = TpAddressSpace::Create(c, *backend).value();
  for (std::uint32_t r = 0; r < 4; ++r) ASSERT_TRUE(space->AddRequest(RequestId(r)));
  // A, B, C: ranks 0, 1, 0 (rank 0 is now full); then B freed: rank 1 is empty.
  ASSERT_EQ(space->HomeOf(space->Allocate(RequestId(0), 1).value()[0]), Rank(0));
  ASSERT_EQ(space->HomeOf(space->Allocate(RequestId(1), 1).value()[0]), Rank(1));
  ASSERT_EQ(space->HomeOf(space->Allocate(RequestId(2), 1).value()[0]), Rank(0));
  ASSERT_TRUE(space->Free(RequestId(1)));
  // D, two entries: the cursor is at rank 1, then at the full rank 0, which is skipped.
  auto d = space->Allocate(RequestId(3), 2);
  ASSERT_TRUE(d) << d.error().ToString();
  EXPECT_EQ(space->HomeOf((*d)[0]), Rank(1));
  EXPECT_EQ(space->HomeOf((*d)[1]), Rank(1)) << "the second entry went to the full rank 0";
  EXPECT_EQ(space->NumHomed(Rank(0)), 2u);
  EXPECT_EQ(space->NumHomed(Rank(1)), 2u);
  ASSERT_TRUE(space->CheckInvariants()) << space->CheckInvariants().error().ToString();
  // Both shards full: one more entry is refused.
  EXPECT_FALSE(space->Allocate(RequestId(3), 1));
}

}  // namespace
}  // namespace ula
