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
#include "v4_flash.h"
#include "ula/address_space.h"
#include "ula/backend.h"

namespace ula {
namespace {

constexpr std::uint32_t kDrafts = 3;
constexpr std::uint32_t kUnit = 256;  // V4 at 64 addresses a page: lcm(128, 4 x 64, 64)

std::uint64_t Mix(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

struct Engine {
  std::unique_ptr<Backend> backend;
  std::unique_ptr<AddressSpace> space;
  std::uint32_t window = 0, c4 = 0, c128 = 0, s4 = 0, s4i = 0, s128 = 0;
  std::unordered_map<std::uint64_t, std::uint64_t> shadow;  // (kind, block, row) -> the row's value
  std::unordered_map<std::uint32_t, std::vector<std::uint32_t>> seq;  // request -> its tokens

  explicit Engine(bool bytes, std::uint32_t device_entries, std::uint32_t host_entries)
      : backend(bytes ? MakeCpuBackend({.copy_threads = 0}) : MakeCountingBackend()) {
    const AddressSpaceConfig c = test::FlashSpaceConfig(device_entries, host_entries, kDrafts);
    auto s = AddressSpace::Create(c, *backend);
    EXPECT_TRUE(s) << s.error().ToString();
    space = std::move(*s);
    for (std::uint32_t k = 0; k < c.kinds.size(); ++k) {
      const std::string& n = c.kinds[k].name;
      if (n == "window") window = k;
      if (n == "c4") c4 = k;
      if (n == "c128") c128 = k;
      if (n == "c4_state") s4 = k;
      if (n == "c4_index_state") s4i = k;
      if (n == "c128_state") s128 = k;
    }
  }
  static std::uint64_t Key(std::uint32_t kind, std::uint32_t block, std::uint32_t row) {
    return (std::uint64_t{kind} << 48) | (std::uint64_t{block} << 8) | row;
  }
  std::uint64_t Shadow(std::uint32_t kind, std::uint32_t block, std::uint32_t row) const {
    auto it = shadow.find(Key(kind, block, row));
    return it == shadow.end() ? 0 : it->second;
  }
  KindPages Pages(RequestId r, std::uint32_t k) const {
    auto p = space->KindPagesOf(r, k);
    EXPECT_TRUE(p) << p.error().ToString();
    return p ? *p : KindPages{};
  }
  // The window ring's block of token t: its live tokens are [tokens - entries, tokens).
  static std::uint32_t RingBlock(const KindPages& w, std::uint32_t t) {
    const std::uint32_t first = w.tokens - w.entries;
    return w.blocks.at(t / kKindBlockEntries - first / kKindBlockEntries);
  }
  std::uint64_t Hidden(RequestId r, std::uint32_t t) const {
    std::uint64_t h = 0;
    const std::vector<std::uint32_t>& s = seq.at(r.value());
    for (std::uint32_t i = 0; i <= t; ++i) h = Mix(h ^ s[i]);
    return h;
  }
  std::vector<std::byte> EntryBytes(std::uint64_t v, GroupId g) const {
    std::vector<std::byte> out(space->config().entry_bytes_of(g));
    for (std::size_t i = 0; i < out.size(); i += 8) {
      const std::uint64_t w = Mix(v ^ (std::uint64_t{g.value()} << 32) ^ i);
      for (std::size_t b = 0; b < 8 && i + b < out.size(); ++b) out[i + b] = std::byte(w >> (8 * b));
    }
    return out;
  }
  // A compressor's entry of its state's rows [0, E): what completes a block.
  std::uint64_t Compress(std::uint32_t state, std::uint32_t block, std::uint32_t E) const {
    std::uint64_t v = E;
    for (std::uint32_t i = 0; i < E; ++i) v = Mix(v ^ Shadow(state, block, i));
    return v;
  }
  // Allocates n tokens of r's sequence and computes them, as a prefill chunk or a decode.
  void Run(RequestId r, std::uint32_t n) {
    const std::uint32_t from = Pages(r, window).tokens;
    auto made = space->Allocate(r, n);
    ASSERT_TRUE(made) << made.error().ToString();
    const KindPages w = Pages(r, window), st4 = Pages(r, s4), st4i = Pages(r, s4i), st128 = Pages(r, s128);
    std::uint64_t h = from == 0 ? 0 : Hidden(r, from - 1);
    for (std::uint32_t t = from; t < from + n; ++t) {
      h = Mix(h ^ seq.at(r.value())[t]);
      shadow[Key(window, RingBlock(w, t), t % 64)] = h;
      shadow[Key(s4, st4.blocks[0], t % 4)] = h;
      shadow[Key(s4i, st4i.blocks[0], t % 4)] = ~h;
      shadow[Key(s128, st128.blocks[0], t % 128)] = h;
      if (t % 4 == 3) {
        const std::uint64_t v = Compress(s4, st4.blocks[0], 4);
        const LogicalAddr a = (*space->AddressesOf(r))[t / 4];
        for (std::uint32_t g = 0; g < space->config().num_groups; ++g) {
          ASSERT_TRUE(space->Write(a, GroupId(g), EntryBytes(v, GroupId(g))));
        }
      }
      if (t % 128 == 127) {
        const KindPages c = Pages(r, c128);
        const std::uint32_t j = t / 128;
        shadow[Key(c128, c.blocks.at(j / 64), j % 64)] = Compress(s128, st128.blocks[0], 128);
      }
    }
  }
  // The engine runs a share's copies (the last C128 block's entries).
  void Copy(const PrefixShare& share) {
    for (const KindBlockCopy& c : share.copies) {
      for (std::uint32_t i = 0; i < c.entries; ++i) {
        shadow[Key(c.kind, c.dst_block, i)] = Shadow(c.kind, c.src_block, i);
      }
    }
  }
  // Everything r's next token reads: the window, every C4 entry (every group's bytes), every
  // C128 entry, the compressor states' filled rows.
  std::vector<std::uint64_t> Reads(RequestId r) const {
    std::vector<std::uint64_t> out;
    const KindPages w = Pages(r, window), c = Pages(r, c128);
    const std::uint32_t T = w.tokens;
    for (std::uint32_t t = T > 127 ? T - 127 : 0; t < T; ++t) out.push_back(Shadow(window, RingBlock(w, t), t % 64));
    const std::span<const LogicalAddr> addrs = *space->AddressesOf(r);
    EXPECT_EQ(addrs.size(), T / 4);
    for (const LogicalAddr a : addrs) {
      std::uint64_t v = 0;
      for (std::uint32_t g = 0; g < space->config().num_groups; ++g) {
        std::vector<std::byte> bytes(space->config().entry_bytes_of(GroupId(g)));
        EXPECT_TRUE(space->Read(a, GroupId(g), bytes));
        for (std::byte b : bytes) v = v * 131 + static_cast<std::uint8_t>(b);
      }
      out.push_back(v);
    }
    EXPECT_EQ(c.entries, T / 128);
    for (std::uint32_t j = 0; j < c.entries; ++j) out.push_back(Shadow(c128, c.blocks.at(j / 64), j % 64));
    const KindPages st4 = Pages(r, s4), st4i = Pages(r, s4i), st128 = Pages(r, s128);
    for (std::uint32_t i = 0; i < T % 4; ++i) {
      out.push_back(Shadow(s4, st4.blocks.at(0), i));
      out.push_back(Shadow(s4i, st4i.blocks.at(0), i));
    }
    for (std::uint32_t i = 0; i < T % 128; ++i) out.push_back(Shadow(s128, st128.blocks.at(0), i));
    return out;
  }
  void Check(const char* where) const {
    const Status ok = space->CheckInvariants();
    ASSERT_TRUE(ok) << where << ": " << ok.error().ToString();
  }
};

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
