// A DP space holding DeepSeek-V4-Flash's kinds (SpaceConfigOfModel), through the public
// API: Allocate makes the C4 entries (the space's addresses) at their block boundaries and
// the other kinds' blocks beside them, a draft rollback undoes them, Free releases every
// kind, bad input changes nothing (DebugDigest), and CheckInvariants holds after each call.
#include <gtest/gtest.h>

#include <random>

#include "config/model_kinds.h"
#include "space/address_space_state.h"
#include "space/space_access.h"
#include "test_seed.h"
#include "v4_flash.h"
#include "ula/address_space.h"
#include "ula/backend.h"

namespace ula {
namespace {

constexpr std::uint32_t kDrafts = 3;

struct Flash {
  std::unique_ptr<Backend> backend = MakeCountingBackend();
  std::unique_ptr<AddressSpace> space;
  std::uint32_t window = 0, c4 = 0, key = 0, c128 = 0, s4 = 0, s4i = 0, s128 = 0;

  explicit Flash(std::uint32_t device_entries = 512, std::uint32_t host_entries = 4096) {
    const AddressSpaceConfig c = test::FlashSpaceConfig(device_entries, host_entries, kDrafts);
    auto s = AddressSpace::Create(c, *backend);
    EXPECT_TRUE(s) << s.error().ToString();
    space = std::move(*s);
    for (std::uint32_t k = 0; k < c.kinds.size(); ++k) {
      const std::string& n = c.kinds[k].name;
      (n == "window" ? window : n == "c4" ? c4 : n == "c4_index_key" ? key : n == "c128" ? c128
                     : n == "c4_state" ? s4 : n == "c4_index_state" ? s4i : s128) = k;
    }
  }
  // Registers request r on rank 0 and allocates its first `tokens` tokens.
  void Start(RequestId r, std::uint32_t tokens) {
    EXPECT_TRUE(space->AddRequest(r, Rank(0)));
    auto a = space->Allocate(r, tokens);
    EXPECT_TRUE(a) << a.error().ToString();
  }
  KindPages Pages(RequestId r, std::uint32_t k) const {
    auto p = space->KindPagesOf(r, k);
    EXPECT_TRUE(p) << p.error().ToString();
    return p ? *p : KindPages{};
  }
};

TEST(KindSpace, AllocateMakesTheC4EntriesAtTheirBlockBoundaries) {
  Flash f;
  AddressSpace& s = *f.space;
  const RequestId r(1);
  ASSERT_TRUE(s.AddRequest(r, Rank(0)));
  auto three = s.Allocate(r, 3);
  ASSERT_TRUE(three) << three.error().ToString();
  EXPECT_TRUE(three->empty());  // in the compressor state, no C4 entry yet
  EXPECT_EQ(s.num_live_addresses(), 0u);
  EXPECT_EQ(f.Pages(r, f.s4).filling_tokens, 3u);
  EXPECT_EQ(f.Pages(r, f.s4i).entries, 1u);
  EXPECT_EQ(f.Pages(r, f.window).entries, 3u);
  auto fourth = s.Allocate(r, 1);
  ASSERT_TRUE(fourth);
  ASSERT_EQ(fourth->size(), 1u);
  for (std::uint32_t g = 0; g < s.config().num_groups; ++g) {
    auto loc = s.Lookup((*fourth)[0], GroupId(g));
    ASSERT_TRUE(loc);
    EXPECT_EQ(loc->tier(), Tier::kDevice);  // placed as a single-kind entry, on device
  }
  EXPECT_TRUE(s.CheckInvariants()) << s.CheckInvariants().error().ToString();
  // A prefill: 1000 tokens more, 250 C4 entries in all over ceil(251 / 64) pages.
  auto prefill = s.Allocate(r, 1000);
  ASSERT_TRUE(prefill) << prefill.error().ToString();
  EXPECT_EQ(prefill->size(), 250u);
  const KindPages c4 = f.Pages(r, f.c4);
  EXPECT_EQ(c4.tokens, 1004u);
  EXPECT_EQ(c4.entries, 251u);
  EXPECT_EQ(c4.entries_per_block, s.config().page_tokens);
  EXPECT_EQ(c4.blocks.size(), 4u);
  EXPECT_EQ(c4.blocks[0], (*fourth)[0].value() / s.config().page_tokens);
  EXPECT_EQ(f.Pages(r, f.key), c4);  // the index keys share the C4 entries' addresses
  EXPECT_EQ(f.Pages(r, f.c128).entries, 7u);
  EXPECT_EQ(f.Pages(r, f.c128).filling_tokens, 1004u % 128);
  // The round's tokens stay in the ring until it ends (the window of its first token, 4,
  // reaches back to token 0); then the ring keeps 128 + drafts.
  EXPECT_EQ(f.Pages(r, f.window).entries, 1004u);
  s.AdvanceRound();
  const KindPages w = f.Pages(r, f.window);
  EXPECT_EQ(w.entries, 128u + kDrafts);
  EXPECT_EQ(w.first_offset, (1004u - 131u) % 64);
  EXPECT_EQ(w.blocks.size(), 3u);  // tokens [873, 1004): blocks 13..15
  EXPECT_TRUE(s.CheckInvariants()) << s.CheckInvariants().error().ToString();
}

TEST(KindSpace, DecodeWithDraftsKeepsTheKindsInStep) {
  ULA_TEST_SEEDED(seed, 20261206);
  std::mt19937_64 rng(seed);
  Flash f;
  AddressSpace& s = *f.space;
  for (std::uint32_t q = 1; q <= 3; ++q) ASSERT_TRUE(s.AddRequest(RequestId(q), Rank(0)));
  std::uint32_t tokens[4] = {};
  for (int round = 0; round < 600; ++round) {
    const std::uint32_t q = 1 + static_cast<std::uint32_t>(rng() % 3);
    const RequestId r(q);
    // Verify 1 + kDrafts tokens, accept some, roll the rest back.
    ASSERT_TRUE(s.Allocate(r, 1 + kDrafts));
    const std::uint32_t accepted = 1 + static_cast<std::uint32_t>(rng() % (kDrafts + 1));
    tokens[q] += accepted;
    ASSERT_TRUE(s.Truncate(r, tokens[q])) << "round " << round;
    s.AdvanceRound();
    auto addrs = s.AddressesOf(r);
    ASSERT_TRUE(addrs);
    ASSERT_EQ(addrs->size(), tokens[q] / 4);
    ASSERT_EQ(f.Pages(r, f.c128).entries, tokens[q] / 128);
    // The window of the accepted tokens is all live; the ring never holds more than 128 + drafts.
    const std::uint32_t live = f.Pages(r, f.window).entries;
    ASSERT_GE(live, std::min(tokens[q], 128u)) << "round " << round;
    ASSERT_LE(live, 128u + kDrafts) << "round " << round;
    ASSERT_LE(f.Pages(r, f.window).blocks.size(), 4u);
    ASSERT_EQ(f.Pages(r, f.s128).filling_tokens, tokens[q] % 128);
    ASSERT_TRUE(s.CheckInvariants()) << s.CheckInvariants().error().ToString();
  }
}

// The ring frees by a round's first token (kind_entries.h, kRing): a prefill chunk far longer
// than the drafts finds the window of its first token live and readable at the blocks it was
// written to; the round's end, or the request's next Allocate, frees exactly what no later
// token reads; a rollback is bounded by the drafts whatever the ring still holds.
TEST(KindSpace, APrefillChunkReadsItsFirstTokensWindowAndTheNextRoundFreesTheRest) {
  constexpr std::uint32_t kRingTokens = 128 + kDrafts, kChunk = 200;
  for (const bool end_round : {false, true}) {
    SCOPED_TRACE(end_round ? "freed at AdvanceRound" : "freed by the next Allocate");
    Flash f;
    AddressSpace& s = *f.space;
    const RequestId r(1);
    f.Start(r, 500);
    s.AdvanceRound();
    const KindPages before = f.Pages(r, f.window);  // tokens [369, 500): blocks 5..7
    ASSERT_EQ(before.tokens - before.entries, 500u - kRingTokens);
    ASSERT_TRUE(s.Allocate(r, kChunk));  // the chunk [500, 700)
    const KindPages w = f.Pages(r, f.window);
    // Its first token, 500, reads [373, 500]; a rollback of the drafts before it, 3 more.
    const std::uint32_t first = w.tokens - w.entries;
    EXPECT_EQ(first, 500u + 1 - kRingTokens);
    EXPECT_EQ(w.entries, kRingTokens + kChunk - 1);
    EXPECT_EQ(w.first_offset, first % 64);
    ASSERT_EQ(w.blocks.size(), (700u + 63) / 64 - first / 64);  // blocks 5..10
    EXPECT_LE(w.blocks.size(), (kRingTokens + kChunk - 1 + 63) / 64 + 1);  // the bound of a round
    // The blocks written before the chunk are where they were: the window reads its bytes.
    for (std::size_t i = 0; i < before.blocks.size(); ++i) EXPECT_EQ(w.blocks[i], before.blocks[i]) << i;
    ASSERT_TRUE(s.CheckInvariants()) << s.CheckInvariants().error().ToString();
    // A rollback past the drafts is refused though the ring still holds the tokens.
    const std::uint64_t digest = s.DebugDigest();
    const Status past = s.Truncate(r, 700 - kDrafts - 1);
    ASSERT_FALSE(past);
    EXPECT_EQ(past.error().code(), ErrorCode::kFailedPrecondition);
    EXPECT_NE(past.error().message().find("reaches past the ring"), std::string::npos) << past.error().message();
    EXPECT_EQ(s.Truncate(r, 701).error().code(), ErrorCode::kOutOfRange);
    EXPECT_EQ(s.Allocate(RequestId(9), 1).error().code(), ErrorCode::kNotFound);
    EXPECT_EQ(s.DebugDigest(), digest);
    EXPECT_EQ(f.Pages(r, f.window), w);
    // The next round frees exactly the blocks no later token reads, the rest keep their ids.
    std::uint32_t tokens = 700;
    if (end_round) {
      s.AdvanceRound();  // reads from 700 - 128 - drafts on: blocks 8..10
    } else {
      ASSERT_TRUE(s.Allocate(r, 1));  // token 700 reads [573, 700], a rollback 3 more: blocks 8..10
      ++tokens;
    }
    const KindPages next = f.Pages(r, f.window);
    const std::uint32_t next_first = next.tokens - next.entries;
    EXPECT_EQ(next_first, end_round ? 700u - kRingTokens : 701u - kRingTokens);
    ASSERT_EQ(next.blocks.size(), (tokens + 63) / 64 - next_first / 64);
    ASSERT_EQ(next.blocks.size(), 3u);
    for (std::size_t i = 0; i < next.blocks.size(); ++i) EXPECT_EQ(next.blocks[i], w.blocks[3 + i]) << i;
    ASSERT_TRUE(s.CheckInvariants()) << s.CheckInvariants().error().ToString();
    // Within the drafts the rollback restores the window of its length.
    ASSERT_TRUE(s.Truncate(r, tokens - kDrafts));
    const KindPages back = f.Pages(r, f.window);
    EXPECT_GE(back.entries, 128u);
    ASSERT_TRUE(s.CheckInvariants()) << s.CheckInvariants().error().ToString();
  }
}

TEST(KindSpace, ARollbackPastTheRingIsRefusedAndChangesNothing) {
  Flash f;
  AddressSpace& s = *f.space;
  const RequestId r(1);
  f.Start(r, 400);
  const std::uint64_t before = s.DebugDigest();
  const Status past = s.Truncate(r, 400 - kDrafts - 1);
  ASSERT_FALSE(past);
  EXPECT_EQ(past.error().code(), ErrorCode::kFailedPrecondition);
  EXPECT_NE(past.error().message().find("reaches past the ring"), std::string::npos) << past.error().message();
  EXPECT_EQ(s.DebugDigest(), before);
  // Within the drafts: the C4 entry of tokens [396, 400) goes, its address is free.
  const LogicalAddr last = s.AddressesOf(r)->back();
  ASSERT_TRUE(s.Truncate(r, 400 - kDrafts));
  EXPECT_EQ(s.AddressesOf(r)->size(), 99u);
  EXPECT_FALSE(s.IsLive(last));
  EXPECT_EQ(f.Pages(r, f.s4).filling_tokens, 1u);
  EXPECT_TRUE(s.CheckInvariants()) << s.CheckInvariants().error().ToString();
}

TEST(KindSpace, BadInputIsRefusedAndChangesNothing) {
  Flash f(/*device_entries=*/64, /*host_entries=*/64);
  AddressSpace& s = *f.space;
  const RequestId r(1);
  f.Start(r, 10);
  const std::uint64_t before = s.DebugDigest();
  EXPECT_EQ(s.Allocate(RequestId(9), 4).error().code(), ErrorCode::kNotFound);
  EXPECT_EQ(s.Truncate(r, 11).error().code(), ErrorCode::kOutOfRange);
  EXPECT_EQ(s.Truncate(RequestId(9), 0).error().code(), ErrorCode::kNotFound);
  // 64 + 64 slots per group hold 128 C4 entries: 800 tokens' 200 do not fit, and the other
  // kinds take nothing either.
  auto big = s.Allocate(r, 800);
  ASSERT_FALSE(big);
  EXPECT_EQ(big.error().code(), ErrorCode::kResourceExhausted);
  EXPECT_EQ(s.Allocate(r, 0xffffffffu).error().code(), ErrorCode::kOutOfRange);
  EXPECT_EQ(s.ShareInto(r, *s.AddressesOf(r)).error().code(), ErrorCode::kUnsupported);
  EXPECT_EQ(s.KindPagesOf(r, 7).error().code(), ErrorCode::kOutOfRange);
  EXPECT_EQ(s.KindPagesOf(RequestId(9), f.c4).error().code(), ErrorCode::kNotFound);
  EXPECT_EQ(s.KindPagesOf(RequestId(9), f.window).error().code(), ErrorCode::kNotFound);
  EXPECT_EQ(s.DebugDigest(), before);
  EXPECT_EQ(f.Pages(r, f.window).tokens, 10u);
  EXPECT_TRUE(s.CheckInvariants()) << s.CheckInvariants().error().ToString();
}

TEST(KindSpace, FreeReleasesEveryKind) {
  Flash f;
  AddressSpace& s = *f.space;
  f.Start(RequestId(1), 700);
  f.Start(RequestId(2), 300);
  const KindPages w1 = f.Pages(RequestId(1), f.window);
  const KindPages s1 = f.Pages(RequestId(1), f.s128);
  ASSERT_TRUE(s.Free(RequestId(1)));
  EXPECT_EQ(s.num_live_addresses(), 75u);
  EXPECT_EQ(s.KindPagesOf(RequestId(1), f.window).error().code(), ErrorCode::kNotFound);
  EXPECT_EQ(s.Free(RequestId(1)).error().code(), ErrorCode::kNotFound);
  // A new request gets the freed blocks back, lowest id first.
  f.Start(RequestId(3), 1);
  EXPECT_EQ(f.Pages(RequestId(3), f.s128).blocks, s1.blocks);
  EXPECT_EQ(f.Pages(RequestId(3), f.window).blocks[0], *std::min_element(w1.blocks.begin(), w1.blocks.end()));
  ASSERT_TRUE(s.Free(RequestId(2)));
  ASSERT_TRUE(s.Free(RequestId(3)));
  EXPECT_EQ(s.num_live_addresses(), 0u);
  for (std::uint32_t g = 0; g < s.config().num_groups; ++g) EXPECT_EQ(s.NumUsed(Rank(0), GroupId(g), Tier::kDevice), 0u);
  EXPECT_TRUE(s.CheckInvariants()) << s.CheckInvariants().error().ToString();
}

// The check is not vacuous: kinds that count tokens the directory has no C4 entries for, or
// a request the kinds do not know, fail it.
TEST(KindSpace, CheckInvariantsCatchesTheKindsOutOfStepWithTheAddresses) {
  Flash f;
  AddressSpace& s = *f.space;
  const RequestId r(1);
  f.Start(r, 10);
  ASSERT_TRUE(s.CheckInvariants());
  KindEntries& kinds = StateOf(s).kinds;
  kinds.Append(r, 2);  // 12 tokens: 3 C4 entries, the directory lists 2
  const Status off = s.CheckInvariants();
  ASSERT_FALSE(off);
  EXPECT_NE(off.error().message().find("not its 3 C4 entries"), std::string::npos) << off.error().message();
  kinds.Truncate(r, 10);
  ASSERT_TRUE(s.CheckInvariants());
  ASSERT_TRUE(kinds.Free(r));
  EXPECT_FALSE(s.CheckInvariants());
}

}  // namespace
}  // namespace ula
