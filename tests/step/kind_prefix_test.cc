// Shared prefixes in a DP space with DeepSeek-V4-Flash's kinds (AddressSpace::SharePrefix;
// src/space/kind_entries.h, "Shared prefixes"). The test plays the engine over a shadow of the
// kinds the space holds no bytes of: a token's hidden state is a hash of the tokens up to it;
// the window row of token t is that hash, written at the block KindPagesOf names; a compressor
// state's row t mod E holds it, and the entry a block's last token completes is a hash of the
// state's rows (C4 through the space's Write in every group, C128 into the shadow). A request
// that resumes from a cached prefix must read every kind (window, C4, C128, the states' filled
// rows) exactly as a twin that computed the whole sequence itself.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <unordered_map>

#include "space/address_space_state.h"
#include "space/space_access.h"
#include "test_seed.h"
#include "kind_engine.h"
#include "v4_flash.h"
#include "ula/address_space.h"
#include "ula/backend.h"

namespace ula {
namespace {

using test::kDrafts;
using test::kUnit;
using Engine = test::KindEngine;

// Requests prefill; prefixes of one are held (a request that adopted it, as a cache holds
// one) at lengths that are multiples of 256, of 128 only, of 4 only, inside a block, and
// past a full C128 block; requests with those prompts resume from the holders, recompute
// the tokens past the share and decode; every kind they read equals a twin's that computed
// everything itself. Then everything is freed in random order and every entry and block of
// every kind returns.
TEST(KindPrefix, ResumedRequestsReadEveryKindAsIfTheyComputedThePrefix) {
  ULA_TEST_SEEDED(seed, 20261206);
  std::mt19937_64 rng(seed);
  Engine e(/*bytes=*/true, /*device_entries=*/1024, /*host_entries=*/6144);
  AddressSpace& s = *e.space;
  std::uint32_t next_id = 1;
  auto make = [&](std::vector<std::uint32_t> tokens) {
    const RequestId r(next_id++);
    EXPECT_TRUE(s.AddRequest(r, Rank(0)));
    e.seq[r.value()] = std::move(tokens);
    return r;
  };
  auto random_tokens = [&](std::uint32_t n) {
    std::vector<std::uint32_t> t(n);
    for (auto& x : t) x = static_cast<std::uint32_t>(rng() % 129280);
    return t;
  };
  // The source prefills 8,448 + x tokens in one round (its ring holds them all until the round
  // ends): the holders adopt their prefixes in that round.
  const std::uint32_t source_tokens = 8448 + static_cast<std::uint32_t>(rng() % 200);
  const RequestId source = make(random_tokens(source_tokens));
  e.Run(source, source_tokens);
  e.Check("source prefill");
  const std::uint32_t lengths[] = {512, 640, 1000, 130, 2051, 8192 + 128, 8448 + 3, source_tokens};
  std::vector<std::pair<std::uint32_t, RequestId>> holders;
  for (const std::uint32_t L : lengths) {
    const RequestId h = make({});
    auto share = s.SharePrefix(h, source, L);
    ASSERT_TRUE(share) << L << ": " << share.error().ToString();
    EXPECT_EQ(share->resume_from, L / kUnit * kUnit) << L;
    e.seq[h.value()].assign(e.seq[source.value()].begin(), e.seq[source.value()].begin() + share->resume_from);
    e.Copy(*share);
    // The C4 entries are the source's addresses; the C128 entries of full blocks its blocks.
    const std::span<const LogicalAddr> mine = *s.AddressesOf(h), theirs = *s.AddressesOf(source);
    ASSERT_EQ(mine.size(), share->resume_from / 4);
    EXPECT_TRUE(std::equal(mine.begin(), mine.end(), theirs.begin()));
    const KindPages c = e.Pages(h, e.c128), src = e.Pages(source, e.c128);
    for (std::uint32_t b = 0; b < c.entries / 64; ++b) EXPECT_EQ(c.blocks[b], src.blocks[b]) << L;
    EXPECT_EQ(share->copies.size(), c.entries % 64 == 0 ? 0u : 1u) << L;
    holders.emplace_back(L, h);
    e.Check("holder");
  }
  s.AdvanceRound();
  e.Check("round");
  // The source decodes on: its ring lets go of what the holders keep.
  for (int i = 0; i < 4; ++i) {
    e.seq[source.value()].push_back(static_cast<std::uint32_t>(rng() % 129280));
    e.Run(source, 1);
    s.AdvanceRound();
  }
  std::vector<RequestId> live = {source};
  std::uint32_t shared_c128_blocks = 0;
  for (const auto& [L, h] : holders) {
    live.push_back(h);
    SCOPED_TRACE(::testing::Message() << "prefix of " << L << " tokens");
    // A prompt that begins with the prefix and goes on its own way.
    std::vector<std::uint32_t> prompt(e.seq[source.value()].begin(), e.seq[source.value()].begin() + L);
    const std::vector<std::uint32_t> own = random_tokens(40 + static_cast<std::uint32_t>(rng() % 100));
    prompt.insert(prompt.end(), own.begin(), own.end());
    const RequestId resumed = make(prompt), twin = make(prompt);
    // The holder holds the prefix's whole blocks: the match the cache hands on.
    auto share = s.SharePrefix(resumed, h, L / kUnit * kUnit);
    ASSERT_TRUE(share) << share.error().ToString();
    ASSERT_EQ(share->resume_from, L / kUnit * kUnit);
    e.Copy(*share);
    e.Check("resume");
    for (std::uint32_t b = 0; b < e.Pages(resumed, e.c128).entries / 64; ++b) {
      const std::uint32_t id = e.Pages(resumed, e.c128).blocks[b];
      EXPECT_GE(StateOf(s).kinds.HoldersOf(e.c128, id), 3u);  // source, holder, resumed
      ++shared_c128_blocks;
    }
    // It recomputes the tokens past the share (a prefill chunk), its twin everything.
    e.Run(resumed, static_cast<std::uint32_t>(prompt.size()) - share->resume_from);
    e.Run(twin, static_cast<std::uint32_t>(prompt.size()));
    s.AdvanceRound();
    e.Check("prefill");
    ASSERT_EQ(e.Reads(resumed), e.Reads(twin)) << "after the prefill";
    for (int step = 0; step < 6; ++step) {
      const std::uint32_t tok = static_cast<std::uint32_t>(rng() % 129280);
      e.seq[resumed.value()].push_back(tok);
      e.seq[twin.value()].push_back(tok);
      e.Run(resumed, 1);
      e.Run(twin, 1);
      s.AdvanceRound();
      e.Check("decode");
      ASSERT_EQ(e.Reads(resumed), e.Reads(twin)) << "decode step " << step;
    }
    // A rollback into the shared prefix is refused, one past it is not.
    const std::uint32_t T = e.Pages(resumed, e.window).tokens;
    if (share->resume_from > 0) {
      const std::uint64_t before = s.DebugDigest();
      EXPECT_EQ(s.Truncate(resumed, share->resume_from - 1).error().code(), ErrorCode::kFailedPrecondition);
      EXPECT_EQ(s.DebugDigest(), before);
    }
    ASSERT_TRUE(s.Truncate(resumed, T - 1));
    e.seq[resumed.value()].pop_back();
    e.Check("rollback");
    ASSERT_TRUE(s.Free(twin));
    e.Check("twin freed");
    live.push_back(resumed);
  }
  EXPECT_GT(shared_c128_blocks, 0u);
  // A cache reference on the source's C4 entries outlives every request.
  const std::vector<LogicalAddr> cached(s.AddressesOf(source)->begin(), s.AddressesOf(source)->begin() + 64);
  ASSERT_TRUE(s.Retain(cached));
  std::shuffle(live.begin(), live.end(), rng);
  for (const RequestId r : live) {
    ASSERT_TRUE(s.Free(r));
    e.Check("free");
  }
  for (const LogicalAddr a : cached) EXPECT_EQ(s.RefCount(a), 1u);
  EXPECT_EQ(s.num_live_addresses(), 64u);
  ASSERT_TRUE(s.Release(cached));
  e.Check("release");
  EXPECT_EQ(s.num_live_addresses(), 0u);
  for (std::uint32_t g = 0; g < s.config().num_groups; ++g) {
    EXPECT_EQ(s.NumUsed(Rank(0), GroupId(g), Tier::kDevice), 0u);
    EXPECT_EQ(s.NumUsed(Rank(0), GroupId(g), Tier::kHost), 0u);
  }
  for (std::uint32_t k = 0; k < s.config().kinds.size(); ++k) EXPECT_EQ(StateOf(s).kinds.BlocksInUse(k), 0u) << k;
}

TEST(KindPrefix, BadInputIsRefusedAndChangesNothing) {
  Engine e(/*bytes=*/false, /*device_entries=*/1024, /*host_entries=*/1024);
  AddressSpace& s = *e.space;
  const RequestId source(1), holder(2), fresh(3), gone(4), busy(5);
  for (const RequestId r : {source, holder, fresh, gone, busy}) ASSERT_TRUE(s.AddRequest(r, Rank(0)));
  ASSERT_TRUE(s.Allocate(source, 600));
  ASSERT_TRUE(s.Allocate(gone, 600));
  ASSERT_TRUE(s.Allocate(busy, 8));
  auto held = s.SharePrefix(holder, source, 600);
  ASSERT_TRUE(held) << held.error().ToString();
  EXPECT_EQ(held->resume_from, 512u);
  ASSERT_TRUE(s.Free(gone));
  s.AdvanceRound();
  // The source decodes past its window: its ring no longer holds the window before 512.
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(s.Allocate(source, 64)), s.AdvanceRound();
  const std::uint64_t before = s.DebugDigest();
  const auto code = [&](RequestId r, RequestId from, std::uint32_t tokens) {
    auto got = s.SharePrefix(r, from, tokens);
    EXPECT_FALSE(got);
    return got ? ErrorCode::kInternal : got.error().code();
  };
  EXPECT_EQ(code(RequestId(9), source, 512), ErrorCode::kNotFound);    // unknown request
  EXPECT_EQ(code(fresh, RequestId(9), 512), ErrorCode::kNotFound);     // unknown source
  EXPECT_EQ(code(fresh, gone, 512), ErrorCode::kNotFound);             // a source no longer live
  EXPECT_EQ(code(fresh, holder, 513), ErrorCode::kOutOfRange);         // longer than the source
  EXPECT_EQ(code(fresh, source, 100000), ErrorCode::kOutOfRange);
  EXPECT_EQ(code(holder, holder, 512), ErrorCode::kInvalidArgument);   // itself
  EXPECT_EQ(code(busy, holder, 512), ErrorCode::kFailedPrecondition);  // holds tokens already
  EXPECT_EQ(code(holder, source, 512), ErrorCode::kFailedPrecondition);  // adopted already
  auto window = s.SharePrefix(fresh, source, 512);  // the source's ring moved on
  ASSERT_FALSE(window);
  EXPECT_EQ(window.error().code(), ErrorCode::kFailedPrecondition);
  EXPECT_NE(window.error().message().find("ring"), std::string::npos) << window.error().message();
  EXPECT_EQ(s.ShareInto(fresh, s.AddressesOf(source)->first(4)).error().code(), ErrorCode::kUnsupported);
  EXPECT_EQ(s.Truncate(holder, 511).error().code(), ErrorCode::kFailedPrecondition);  // into the shared prefix
  EXPECT_EQ(s.DebugDigest(), before);
  e.Check("refusals");
  // The holder still serves the prefix.
  auto ok = s.SharePrefix(fresh, holder, 512);
  ASSERT_TRUE(ok) << ok.error().ToString();
  EXPECT_EQ(ok->resume_from, 512u);
  e.Check("share");
}

// Over kind frames the share is refused: the frames count a block once per owner.
TEST(KindPrefix, ASpaceOverFramesRefusesToShare) {
  std::unique_ptr<Backend> backend = MakeCountingBackend();
  AddressSpaceConfig c = test::FlashSpaceConfig(64, 4096, kDrafts);
  c.kind_frame_bytes = kKindFrameBytes;
  c.device_bytes_per_rank = 16 * kKindFrameBytes;
  auto s = AddressSpace::Create(c, *backend);
  ASSERT_TRUE(s) << s.error().ToString();
  ASSERT_TRUE((*s)->AddRequest(RequestId(1), Rank(0)));
  ASSERT_TRUE((*s)->AddRequest(RequestId(2), Rank(0)));
  ASSERT_TRUE((*s)->Allocate(RequestId(1), 512));
  const std::uint64_t before = (*s)->DebugDigest();
  auto got = (*s)->SharePrefix(RequestId(2), RequestId(1), 512);
  ASSERT_FALSE(got);
  EXPECT_EQ(got.error().code(), ErrorCode::kUnsupported);
  EXPECT_EQ((*s)->DebugDigest(), before);
}

}  // namespace
}  // namespace ula
