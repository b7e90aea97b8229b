// A TP space holding DeepSeek-V4-Flash's kinds (SpaceConfigOfModel's kinds over P ranks;
// include/ula/tp_address_space.h, "Kinds"; docs/ARCHITECTURE.md, "Kinds under TP"): every
// entry of every kind on exactly one rank. C4 entries and index keys on their address's rank
// (a mod P), C128 entry j on rank j mod P, the window and the compressor states whole on the
// request's window home, the rank with the fewest. Checked through the public API against a
// per-token model of what each rank must hold, CheckInvariants after every call; bad input and
// a rollback past the ring change nothing (DebugDigest); per-rank memory stays within a bound
// derived from the placement; what this stage does not build is refused at Create.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "test_seed.h"
#include "tp/tp_fixture.h"
#include "v4_flash.h"
#include "ula/backend.h"
#include "ula/device_step.h"
#include "ula/tp_address_space.h"
#include "ula/tp_step_planner.h"

namespace ula {
namespace {

constexpr std::uint32_t kDrafts = 3;
// The sanitizer trees check the whole space after every call (ULA_EXPENSIVE_CHECKS): fewer
// operations, and in the memory run fewer, shorter requests over smaller shards.
#if defined(ULA_EXPENSIVE_CHECKS)
constexpr int kRandomOps = 100;
constexpr int kMemorySteps = 12;
constexpr std::uint32_t kLive = 12, kMemoryDevice = 1024, kMemoryHost = 4096, kMemorySpread = 2048;
#else
constexpr int kRandomOps = 400;
constexpr int kMemorySteps = 100;
constexpr std::uint32_t kLive = 32, kMemoryDevice = 4096, kMemoryHost = 16384, kMemorySpread = 6144;
#endif

// V4-Flash's kinds over `ranks` ranks (attention at home, the engine's modes), each rank's
// shard holding the given C4 entries per group and tier.
TpConfig FlashTpConfig(std::uint32_t ranks, std::uint32_t device_entries, std::uint32_t host_entries) {
  return test::FlashTpConfig(ranks, device_entries, host_entries, kDrafts);
}

std::uint32_t Stripe(std::uint32_t entries, std::uint32_t p, std::uint32_t r) {
  return entries / p + (entries % p > r ? 1 : 0);
}
std::uint32_t Blocks(std::uint32_t entries) { return (entries + 63) / 64; }

struct TpFlash {
  std::unique_ptr<Backend> backend = MakeCountingBackend();
  std::unique_ptr<TpAddressSpace> space;
  std::uint32_t p = 0;
  std::uint32_t window = 0, c4 = 0, key = 0, c128 = 0, s4 = 0, s4i = 0, s128 = 0;
  std::uint32_t ring = 0;  // the window ring's tokens: window + drafts

  explicit TpFlash(std::uint32_t ranks, std::uint32_t device_entries = 512, std::uint32_t host_entries = 1024)
      : p(ranks) {
    const TpConfig c = FlashTpConfig(ranks, device_entries, host_entries);
    auto s = TpAddressSpace::Create(c, *backend);
    EXPECT_TRUE(s) << s.error().ToString();
    space = std::move(*s);
    for (std::uint32_t k = 0; k < c.kinds.size(); ++k) {
      const std::string& n = c.kinds[k].name;
      (n == "window" ? window : n == "c4" ? c4 : n == "c4_index_key" ? key : n == "c128" ? c128
                     : n == "c4_state" ? s4 : n == "c4_index_state" ? s4i : s128) = k;
    }
    ring = c.kinds[window].ring_tokens;
  }
  KindPages Pages(RequestId r, std::uint32_t k, std::uint32_t rank) const {
    auto pages = space->KindPagesOf(r, k, Rank(static_cast<std::uint16_t>(rank)));
    EXPECT_TRUE(pages) << pages.error().ToString();
    return pages ? *pages : KindPages{};
  }
  std::uint32_t Home(RequestId r) const {
    auto h = space->WindowHomeOf(r);
    EXPECT_TRUE(h) << h.error().ToString();
    return h ? h->value() : 0;
  }
  void Check() const {
    const Status ok = space->CheckInvariants();
    ASSERT_TRUE(ok) << ok.error().ToString();
  }
};

// What a request holds, as the model makes it (kind_entries.h): its tokens, the most it held,
// its rounds' reach and the ring's first live token, and its window home.
struct Model {
  std::uint32_t tokens = 0, most = 0, reach = 0, first = 0, home = 0;
  bool allocated = false;
};

// Every kind's page table on every rank against the model.
void ExpectPlacement(const TpFlash& f, RequestId id, const Model& m, const std::string& where) {
  SCOPED_TRACE(where + ", request " + std::to_string(id.value()));
  const std::uint32_t t = m.tokens;
  auto addrs = f.space->AddressesOf(id);
  ASSERT_TRUE(addrs);
  ASSERT_EQ(addrs->size(), t / 4);
  std::uint32_t c4_sum = 0;
  for (std::uint32_t r = 0; r < f.p; ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    // C4 entry i sits at offset i % 64 of a page of its own: rank i mod P (P divides 64).
    const KindPages c4 = f.Pages(id, f.c4, r);
    std::uint32_t on_rank = 0;
    for (LogicalAddr a : *addrs) on_rank += a.value() % f.p == r;
    ASSERT_EQ(c4.entries, on_rank);
    ASSERT_EQ(c4.entries, Stripe(t / 4, f.p, r));
    ASSERT_EQ(f.Pages(id, f.key, r), c4);  // the index keys share their entries' addresses
    c4_sum += c4.entries;
    const KindPages c128 = f.Pages(id, f.c128, r);
    ASSERT_EQ(c128.entries, Stripe(t / 128, f.p, r));
    ASSERT_EQ(c128.blocks.size(), Blocks(c128.entries));
    ASSERT_EQ(c128.filling_tokens, t % 128);
    const KindPages w = f.Pages(id, f.window, r);
    const bool home = r == m.home;
    if (!home) {
      ASSERT_EQ(w.entries, 0u);
      ASSERT_TRUE(w.blocks.empty());
    } else {
      ASSERT_EQ(w.entries, t - m.first);
      ASSERT_EQ(w.first_offset, m.first % 64);
      ASSERT_EQ(w.blocks.size(), t == m.first ? 0 : (t + 63) / 64 - m.first / 64);
    }
    for (std::uint32_t s : {f.s4, f.s4i, f.s128}) {
      const KindPages state = f.Pages(id, s, r);
      ASSERT_EQ(state.entries, home && m.allocated ? 1u : 0u);
      ASSERT_EQ(state.blocks.size(), state.entries);
    }
    ASSERT_EQ(f.Pages(id, f.s128, r).filling_tokens, t % 128);
    ASSERT_EQ(f.Pages(id, f.s4, r).filling_tokens, t % 4);
  }
  ASSERT_EQ(c4_sum, t / 4);
}

// The model's side of an Allocate of n >= 1 tokens and of a round's end (kind_entries.h, kRing).
void ModelAllocate(Model& m, std::uint32_t n, std::uint32_t ring) {
  m.reach = std::max(m.reach, m.tokens + 1);
  m.tokens += n;
  m.most = std::max(m.most, m.tokens);
  m.first = std::max(m.first, m.reach > ring ? m.reach - ring : 0);
  m.allocated = true;
}
void ModelEndRound(std::map<std::uint32_t, Model>& models, std::uint32_t ring) {
  for (auto& [id, m] : models) {
    m.reach = m.most;
    m.first = std::max(m.first, m.reach > ring ? m.reach - ring : 0);
  }
}
// Whether a rollback to `length` stays within the drafts since the ring was full.
bool RollbackAllowed(const Model& m, std::uint32_t length, std::uint32_t ring) {
  if (length == m.tokens) return true;
  const std::uint32_t window = ring - kDrafts;
  const std::uint32_t need = length > window ? length - window : 0;
  return need >= (m.most > ring ? m.most - ring : 0);
}

TEST(TpKindSpace, EachKindLandsOnItsRanks) {
  for (const std::uint32_t p : {2u, 4u}) {
    SCOPED_TRACE("P = " + std::to_string(p));
    TpFlash f(p);
    TpAddressSpace& s = *f.space;
    std::map<std::uint32_t, Model> models;
    // P + 1 requests: the window homes go round the ranks, the last one back to rank 0.
    for (std::uint32_t q = 1; q <= p + 1; ++q) {
      const RequestId r(q);
      ASSERT_TRUE(s.AddRequest(r));
      EXPECT_EQ(f.Home(r), (q - 1) % p);
      Model& m = models[q];
      m.home = (q - 1) % p;
      const std::uint32_t n = 1000 + 37 * q;
      auto made = s.Allocate(r, n);
      ASSERT_TRUE(made) << made.error().ToString();
      EXPECT_EQ(made->size(), n / 4);
      ModelAllocate(m, n, f.ring);
    }
    f.Check();
    for (const auto& [q, m] : models) ExpectPlacement(f, RequestId(q), m, "after the prefills");
    // The first request's 1,037 tokens: 259 C4 entries, 8 C128 entries striped j mod P, the
    // window's 1,037 tokens (its round is not over) on rank 0 alone.
    EXPECT_EQ(f.Pages(RequestId(1), f.c128, 0).entries, 8 / p);
    EXPECT_EQ(f.Pages(RequestId(1), f.window, 0).entries, 1037u);
    s.AdvanceRound();
    ModelEndRound(models, f.ring);
    f.Check();
    for (const auto& [q, m] : models) ExpectPlacement(f, RequestId(q), m, "after the round");
    EXPECT_EQ(f.Pages(RequestId(1), f.window, 0).entries, f.ring);
    // A freed request's home is the next request's: the fewest homes, the lowest rank.
    ASSERT_TRUE(s.Free(RequestId(2)));
    models.erase(2);
    ASSERT_TRUE(s.AddRequest(RequestId(50)));
    EXPECT_EQ(f.Home(RequestId(50)), 1u);
    f.Check();
  }
}

TEST(TpKindSpace, RandomOpsMatchAPerTokenModelOnEveryRank) {
  ULA_TEST_SEEDED(seed, 20261206);
  for (const std::uint32_t p : {2u, 4u}) {
    SCOPED_TRACE("P = " + std::to_string(p));
    std::mt19937_64 rng(seed + p);
    TpFlash f(p, /*device_entries=*/512, /*host_entries=*/1536);
    TpAddressSpace& s = *f.space;
    std::map<std::uint32_t, Model> models;
    std::vector<std::uint32_t> homes(p, 0);
    std::uint32_t next_id = 1, refused = 0, rollbacks = 0;
    for (int op = 0; op < kRandomOps; ++op) {
      const std::string where = "op " + std::to_string(op);
      const std::uint32_t dice = static_cast<std::uint32_t>(rng() % 100);
      if (models.size() < 3 || (dice < 10 && models.size() < 8)) {  // a request arrives, prefilled
        const RequestId r(next_id);
        ASSERT_TRUE(s.AddRequest(r));
        Model& m = models[next_id++];
        m.home = static_cast<std::uint32_t>(std::min_element(homes.begin(), homes.end()) - homes.begin());
        ++homes[m.home];
        ASSERT_EQ(f.Home(r), m.home) << where;
        const std::uint32_t n = 1 + static_cast<std::uint32_t>(rng() % 700);
        ASSERT_TRUE(s.Allocate(r, n)) << where;
        ModelAllocate(m, n, f.ring);
      } else {
        auto it = models.begin();
        std::advance(it, static_cast<long>(rng() % models.size()));
        const RequestId r(it->first);
        Model& m = it->second;
        if (dice < 16) {  // it finishes
          ASSERT_TRUE(s.Free(r)) << where;
          --homes[m.home];
          models.erase(it);
        } else if (dice < 24) {  // a rollback past the drafts: refused, nothing changed
          const std::uint32_t back = kDrafts + 1 + static_cast<std::uint32_t>(rng() % 40);
          const std::uint32_t length = m.tokens > back ? m.tokens - back : 0;
          const std::uint64_t before = s.DebugDigest();
          const Status st = s.Truncate(r, length);
          ASSERT_EQ(static_cast<bool>(st), RollbackAllowed(m, length, f.ring)) << where << " length " << length;
          if (!st) {
            ++refused;
            EXPECT_EQ(st.error().code(), ErrorCode::kFailedPrecondition);
            ASSERT_EQ(s.DebugDigest(), before) << where;
          } else {
            m.tokens = length;
          }
        } else if (dice < 34) {  // the round ends
          s.AdvanceRound();
          ModelEndRound(models, f.ring);
        } else {  // a decode step verifying 1 + d tokens, the rejected drafts rolled back
          const std::uint32_t d = static_cast<std::uint32_t>(rng() % (kDrafts + 1));
          ASSERT_TRUE(s.Allocate(r, 1 + d)) << where;
          ModelAllocate(m, 1 + d, f.ring);
          const std::uint32_t keep = m.tokens - d + static_cast<std::uint32_t>(rng() % (d + 1));
          ASSERT_TRUE(RollbackAllowed(m, keep, f.ring));
          ASSERT_TRUE(s.Truncate(r, keep)) << where;
          rollbacks += keep < m.tokens;
          m.tokens = keep;
        }
      }
      ASSERT_NO_FATAL_FAILURE(f.Check()) << where;
      for (const auto& [q, m] : models) ASSERT_NO_FATAL_FAILURE(ExpectPlacement(f, RequestId(q), m, where));
    }
    EXPECT_GT(refused, 0u);
    EXPECT_GT(rollbacks, 0u);
    std::printf("[ P = %u ] %u requests, %u rollbacks, %u refused past the ring\n", p, next_id - 1, rollbacks,
                refused);
  }
}

// A long request's window, through prefill chunks and decodes with drafts, never leaves its
// home: every block of it on one rank, the other ranks holding none, at every step.
TEST(TpKindSpace, ARequestsWindowStaysWholeOnOneRank) {
  constexpr std::uint32_t kP = 4;
  TpFlash f(kP, /*device_entries=*/512, /*host_entries=*/512);
  TpAddressSpace& s = *f.space;
  for (std::uint32_t q = 1; q <= 6; ++q) ASSERT_TRUE(s.AddRequest(RequestId(q)));
  const RequestId r(6);  // the sixth: rank 1, after one request on every rank
  ASSERT_EQ(f.Home(r), 1u);
  std::uint32_t tokens = 0, most = 0;
  for (int round = 0; round < 120; ++round) {
    const std::uint32_t n = round < 4 ? 300 : 1 + kDrafts;
    ASSERT_TRUE(s.Allocate(r, n));
    tokens += n;
    most = std::max(most, tokens);
    if (round >= 4) {
      ASSERT_TRUE(s.Truncate(r, tokens -= round % (kDrafts + 1)));
    }
    s.AdvanceRound();
    std::uint32_t holders = 0;
    for (std::uint32_t rank = 0; rank < kP; ++rank) {
      const KindPages w = f.Pages(r, f.window, rank);
      holders += w.entries > 0;
      if (rank == 1) {
        ASSERT_EQ(w.entries, tokens - (most > f.ring ? most - f.ring : 0)) << "round " << round;
      } else {
        ASSERT_TRUE(w.blocks.empty()) << "round " << round << " rank " << rank;
      }
    }
    ASSERT_EQ(holders, 1u);
    ASSERT_NO_FATAL_FAILURE(f.Check());
  }
  EXPECT_GT(tokens, 1200u);
}

TEST(TpKindSpace, ARollbackPastTheRingIsRefusedAndChangesNothing) {
  TpFlash f(2);
  TpAddressSpace& s = *f.space;
  const RequestId r(1);
  ASSERT_TRUE(s.AddRequest(r));
  ASSERT_TRUE(s.Allocate(r, 400));
  const std::uint64_t before = s.DebugDigest();
  const Status past = s.Truncate(r, 400 - kDrafts - 1);
  ASSERT_FALSE(past);
  EXPECT_EQ(past.error().code(), ErrorCode::kFailedPrecondition);
  EXPECT_NE(past.error().message().find("reaches past the ring"), std::string::npos) << past.error().message();
  EXPECT_EQ(s.DebugDigest(), before);
  // Within the drafts: the C4 entry of tokens [396, 400) goes, on its rank.
  const LogicalAddr last = s.AddressesOf(r)->back();
  ASSERT_TRUE(s.Truncate(r, 400 - kDrafts));
  EXPECT_FALSE(s.IsLive(last));
  EXPECT_EQ(f.Pages(r, f.c4, last.value() % 2).entries + f.Pages(r, f.c4, 1 - last.value() % 2).entries, 99u);
  EXPECT_EQ(f.Pages(r, f.s4, 0).filling_tokens, 1u);
  f.Check();
}

TEST(TpKindSpace, BadInputIsRefusedAndChangesNothing) {
  TpFlash f(2, /*device_entries=*/64, /*host_entries=*/64);
  TpAddressSpace& s = *f.space;
  const RequestId r(1);
  ASSERT_TRUE(s.AddRequest(r));
  ASSERT_TRUE(s.Allocate(r, 10));
  const std::uint64_t before = s.DebugDigest();
  EXPECT_EQ(s.AddRequest(r).error().code(), ErrorCode::kAlreadyExists);
  EXPECT_EQ(s.Allocate(RequestId(9), 4).error().code(), ErrorCode::kNotFound);
  EXPECT_EQ(s.Truncate(r, 11).error().code(), ErrorCode::kOutOfRange);
  EXPECT_EQ(s.Truncate(RequestId(9), 0).error().code(), ErrorCode::kNotFound);
  EXPECT_EQ(s.Free(RequestId(9)).error().code(), ErrorCode::kNotFound);
  // Each rank's shard holds 128 C4 entries per group: 2,000 tokens' 500 do not fit on either
  // rank, and no kind takes anything.
  auto big = s.Allocate(r, 2000);
  ASSERT_FALSE(big);
  EXPECT_EQ(big.error().code(), ErrorCode::kResourceExhausted);
  EXPECT_EQ(s.Allocate(r, 0xffffffffu).error().code(), ErrorCode::kOutOfRange);
  // Prefix sharing across kinds is built for the DP space only (SharePrefix): refused, saying so.
  const auto share = s.ShareInto(r, *s.AddressesOf(r));
  ASSERT_FALSE(share);
  EXPECT_EQ(share.error().code(), ErrorCode::kUnsupported);
  EXPECT_NE(share.error().message().find("built for the DP space only"), std::string::npos) << share.error().message();
  EXPECT_EQ(s.KindPagesOf(r, 7, Rank(0)).error().code(), ErrorCode::kOutOfRange);
  EXPECT_EQ(s.KindPagesOf(r, f.window, Rank(2)).error().code(), ErrorCode::kOutOfRange);
  EXPECT_EQ(s.KindPagesOf(RequestId(9), f.c4, Rank(0)).error().code(), ErrorCode::kNotFound);
  EXPECT_EQ(s.KindPagesOf(RequestId(9), f.window, Rank(0)).error().code(), ErrorCode::kNotFound);
  EXPECT_EQ(s.WindowHomeOf(RequestId(9)).error().code(), ErrorCode::kNotFound);
  EXPECT_EQ(s.DebugDigest(), before);
  EXPECT_EQ(f.Pages(r, f.window, 0).tokens, 10u);
  f.Check();
  // A space without kinds has no page tables of kinds.
  auto plain = TpAddressSpace::Create(testing::SmallTpConfig(2, 8, 8, 8), *f.backend);
  ASSERT_TRUE(plain);
  ASSERT_TRUE((*plain)->AddRequest(r));
  EXPECT_EQ((*plain)->KindPagesOf(r, 0, Rank(0)).error().code(), ErrorCode::kFailedPrecondition);
  EXPECT_EQ((*plain)->WindowHomeOf(r).error().code(), ErrorCode::kFailedPrecondition);
}

// What this stage does not build is refused where it would start, naming the reason.
TEST(TpKindSpace, CreateRefusesWhatIsNotBuilt) {
  auto backend = MakeCountingBackend();
  TpConfig local = FlashTpConfig(2, 256, 256);
  local.attention = TpAttention::kLocalBuffer;
  local.buffer_bytes_per_rank = std::uint64_t{64} * local.entry_bytes * local.num_groups;
  auto buffered = TpAddressSpace::Create(local, *backend);
  ASSERT_FALSE(buffered);
  EXPECT_EQ(buffered.error().code(), ErrorCode::kUnsupported);
  EXPECT_NE(buffered.error().message().find("local_buffer with kinds"), std::string::npos)
      << buffered.error().message();
  TpConfig groups = FlashTpConfig(2, 256, 256);
  groups.num_groups = 20;  // 20 layers of C4 in the groups, the kind has 21
  auto wrong = TpAddressSpace::Create(groups, *backend);
  ASSERT_FALSE(wrong);
  EXPECT_EQ(wrong.error().code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(wrong.error().message().find("TpConfig.num_groups"), std::string::npos) << wrong.error().message();

  // The host step at home runs over it (tp_kind_step_test.cc); the device step does not.
  auto space = TpAddressSpace::Create(FlashTpConfig(2, 256, 256), *backend);
  ASSERT_TRUE(space) << space.error().ToString();
  const std::uint64_t before = (*space)->DebugDigest();
  auto device = DeviceStep::Create(**space, Rank(0), GroupId(0), DeviceStepConfig{});
  ASSERT_FALSE(device);
  EXPECT_EQ(device.error().code(), ErrorCode::kUnsupported);
  EXPECT_NE(device.error().message().find("TP step over a space with kinds"), std::string::npos)
      << device.error().message();
  EXPECT_EQ((*space)->DebugDigest(), before);
}

// Memory per rank over many requests arriving and finishing: every kind's blocks and entries
// in bytes, as the ranks hold them. The placement bounds how far the fullest rank is above
// the mean: the window homes differ by at most one request (least-loaded), each holding at
// most one window of 4 blocks and the states; a rank's homes hold at most one window block
// more each than another's (a ring of 131 tokens spans 3 or 4 blocks); and per request the
// striped kinds differ by at most one C4 entry with its key and one C128 block.
TEST(TpKindSpace, MemoryPerRankStaysWithinThePlacementsBound) {
  ULA_TEST_SEEDED(seed, 20261206);
  std::mt19937_64 rng(seed);
  for (const std::uint32_t p : {4u, 8u}) {
    SCOPED_TRACE("P = " + std::to_string(p));
    TpFlash f(p, kMemoryDevice, kMemoryHost);
    TpAddressSpace& s = *f.space;
    const std::vector<KvKind>& kinds = s.config().kinds;
    auto block_bytes = [&](std::uint32_t k) { return std::uint64_t{64} * kinds[k].entry_bytes(); };
    auto state_bytes = [&](std::uint32_t k) { return std::uint64_t{kinds[k].state_rows} * kinds[k].entry_bytes(); };
    const std::uint64_t states = state_bytes(f.s4) + state_bytes(f.s4i) + state_bytes(f.s128);
    const std::uint64_t striped_slack = kinds[f.c4].entry_bytes() + kinds[f.key].entry_bytes() + block_bytes(f.c128);
    std::vector<std::uint32_t> live;
    std::uint32_t next = 1;
    double worst_ratio = 0, worst_bound = 0;
    for (int step = 0; step < kMemorySteps; ++step) {
      while (live.size() < kLive) {  // arrivals, prefilled in one round
        const RequestId r(next);
        ASSERT_TRUE(s.AddRequest(r));
        ASSERT_TRUE(s.Allocate(r, 2048 + static_cast<std::uint32_t>(rng() % kMemorySpread)));
        live.push_back(next++);
      }
      s.AdvanceRound();
      std::vector<std::uint64_t> bytes(p, 0);
      std::vector<std::uint32_t> homes(p, 0);
      for (std::uint32_t q : live) {
        ++homes[f.Home(RequestId(q))];
        for (std::uint32_t r = 0; r < p; ++r) {
          bytes[r] += std::uint64_t{f.Pages(RequestId(q), f.c4, r).entries} *
                      (kinds[f.c4].entry_bytes() + kinds[f.key].entry_bytes());
          bytes[r] += f.Pages(RequestId(q), f.c128, r).blocks.size() * block_bytes(f.c128);
          bytes[r] += f.Pages(RequestId(q), f.window, r).blocks.size() * block_bytes(f.window);
          for (std::uint32_t k : {f.s4, f.s4i, f.s128}) bytes[r] += f.Pages(RequestId(q), k, r).entries * state_bytes(k);
        }
      }
      const auto [lo, hi] = std::minmax_element(homes.begin(), homes.end());
      ASSERT_LE(*hi - *lo, 1u) << "step " << step;
      double mean = 0;
      for (std::uint64_t b : bytes) mean += static_cast<double>(b) / p;
      const double top = static_cast<double>(*std::max_element(bytes.begin(), bytes.end()));
      const double bound = static_cast<double>(states + 4 * block_bytes(f.window)) +
                           static_cast<double>(*hi) * static_cast<double>(block_bytes(f.window)) +
                           static_cast<double>(kLive) * static_cast<double>(striped_slack);
      ASSERT_LE(top - mean, bound) << "step " << step;
      worst_ratio = std::max(worst_ratio, top / mean);
      worst_bound = std::max(worst_bound, (mean + bound) / mean);
      // One to four requests finish, any of them.
      for (std::uint32_t k = 1 + static_cast<std::uint32_t>(rng() % 4); k > 0; --k) {
        const std::size_t i = rng() % live.size();
        ASSERT_TRUE(s.Free(RequestId(live[i])));
        live.erase(live.begin() + static_cast<long>(i));
      }
    }
    f.Check();
    std::printf("[ P = %u ] %u requests, %u live: the fullest rank at most %.4fx the mean (bound %.4fx)\n", p,
                next - 1, kLive, worst_ratio, worst_bound);
  }
}

}  // namespace
}  // namespace ula
