// KindFrames (src/space/kind_frames.h) under KindEntries: every kind of DeepSeek-V4-Flash in
// one rank's byte budget, no fixed split. Each kind's padded envelope divides the frame and
// pads under 3 %; a frame that empties returns to the budget and another kind takes the same
// bytes; as the batch grows the resident kinds take frames and the C4 device share falls,
// nothing is refused while the total fits, and the first request that does not fit is
// refused with nothing changed; SGLang's fixed pools (DSV4PoolConfigurator, ported in
// src/serving/kind_pools.cc) refuse the same workload sooner; every kind's rows read back
// through its strided layer view while requests come and go.
#include <gtest/gtest.h>

#include <array>
#include <cstring>
#include <map>
#include <random>
#include <tuple>

#include "config/model_kinds.h"
#include "serving/kind_config.h"
#include "serving/kind_pools.h"
#include "space/kind_entries.h"
#include "space/kind_frames.h"
#include "test_seed.h"
#include "v4_flash.h"

namespace ula {
namespace {

constexpr std::uint32_t kDrafts = 3;

std::vector<KvKind> FlashKinds() {
  auto k = KindsOfModel(test::FlashModel(), {.max_draft_tokens = kDrafts});
  EXPECT_TRUE(k) << k.error().ToString();
  return *k;
}

std::uint32_t Named(std::span<const KvKind> kinds, std::string_view name) {
  for (std::uint32_t k = 0; k < kinds.size(); ++k) {
    if (kinds[k].name == name) return k;
  }
  ADD_FAILURE() << "no kind " << name;
  return 0;
}

KindFrames MakeFrames(const std::vector<KvKind>& kinds, std::uint64_t budget, std::uint64_t frame = kKindFrameBytes,
                      std::byte* bytes = nullptr) {
  auto f = KindFrames::Create({.kinds = kinds, .budget_bytes = budget, .frame_bytes = frame}, bytes);
  EXPECT_TRUE(f) << f.error().ToString();
  return std::move(*f);
}

std::uint64_t Digest(const KindEntries& e) {
  StateDigest d;
  e.AddToDigest(d);
  return d.value();
}

TEST(KindFrames, FlashEnvelopesDivideTheFrameAndPadUnderThreePercent) {
  const std::vector<KvKind> kinds = FlashKinds();
  auto env = KindEnvelopes(kinds, kKindFrameBytes);
  ASSERT_TRUE(env) << env.error().ToString();
  std::printf("frame %llu B (%.2f MiB)\n%-16s %10s %10s %9s %8s\n", static_cast<unsigned long long>(kKindFrameBytes),
              kKindFrameBytes / 1048576.0, "kind", "envelope", "padded", "per frame", "padding");
  for (std::uint32_t k = 0; k < kinds.size(); ++k) {
    const KindEnvelope& e = (*env)[k];
    std::printf("%-16s %10llu %10llu %9u %7.2f%%\n", kinds[k].name.c_str(), static_cast<unsigned long long>(e.bytes),
                static_cast<unsigned long long>(e.padded), e.per_frame, 100 * e.padding());
    EXPECT_EQ(kKindFrameBytes % e.padded, 0u) << kinds[k].name;
    EXPECT_EQ(e.padded % kEnvelopeAlign, 0u) << kinds[k].name;
    EXPECT_GE(e.padded, e.bytes) << kinds[k].name;
    EXPECT_EQ(e.per_frame, kKindFrameBytes / e.padded) << kinds[k].name;
    // Under 3 % per kind, so under 3 % of any budget whatever the mix of kinds.
    EXPECT_LT(e.padding(), 0.03) << kinds[k].name;
  }
  // The envelope is 64 entries (a state: its rows) x layers x row.
  const KindEnvelope& c4 = (*env)[Named(kinds, "c4")];
  EXPECT_EQ(c4.bytes, 64ull * 21 * 584);
  const KindEnvelope& s128 = (*env)[Named(kinds, "c128_state")];
  EXPECT_EQ(s128.bytes, 128ull * 20 * 4096);
}

TEST(KindFrames, BlockIndexIsTheOffsetOverTheEnvelopeAndLayersAreStrided) {
  const std::vector<KvKind> kinds = FlashKinds();
  KindFrames f = MakeFrames(kinds, 3 * kKindFrameBytes);
  const std::uint32_t win = Named(kinds, "window"), key = Named(kinds, "c4_index_key");
  const std::uint32_t first = *f.Take(win);
  const std::uint32_t k0 = *f.Take(key);
  EXPECT_EQ(first, 0u);
  EXPECT_EQ(f.Offset(key, k0), kKindFrameBytes);  // the index keys took the next frame
  EXPECT_EQ(k0, kKindFrameBytes / f.envelope(key).padded);
  const StridedLayer l3 = f.Layer(win, 3);
  EXPECT_EQ(l3.block_stride, f.envelope(win).padded);
  EXPECT_EQ(l3.rows, kKindBlockEntries);
  EXPECT_EQ(l3.blocks, 3 * f.envelope(win).per_frame);
  EXPECT_TRUE(f.CheckInvariants("test"));
}

TEST(KindFrames, AFrameThatEmptiesReturnsToTheBudgetForAnotherKind) {
  const std::vector<KvKind> kinds = FlashKinds();
  KindFrames f = MakeFrames(kinds, 2 * kKindFrameBytes);
  const std::uint32_t win = Named(kinds, "window"), c128 = Named(kinds, "c128"), s4 = Named(kinds, "c4_state");
  std::vector<std::uint32_t> window;
  for (int i = 0; i < 5; ++i) window.push_back(*f.Take(win));
  const std::uint32_t h = *f.Take(c128);
  EXPECT_EQ(f.free_frames(), 0u);
  EXPECT_EQ(f.frames_of(win), 1u);
  EXPECT_FALSE(f.Take(s4).has_value());  // no frame for a third kind
  EXPECT_TRUE(f.CheckInvariants("test"));
  for (std::size_t i = 0; i + 1 < window.size(); ++i) f.Give(win, window[i]);
  EXPECT_EQ(f.free_frames(), 0u);  // one window block still lives in it
  f.Give(win, window.back());
  EXPECT_EQ(f.free_frames(), 1u);
  EXPECT_EQ(f.frames_of(win), 0u);
  EXPECT_TRUE(f.CheckInvariants("test"));
  // The compressor state takes the window's bytes.
  const auto s = f.Take(s4);
  ASSERT_TRUE(s.has_value());
  EXPECT_EQ(f.Offset(s4, *s), f.Offset(win, window[0]));
  EXPECT_EQ(f.Offset(c128, h), kKindFrameBytes);
  EXPECT_TRUE(f.CheckInvariants("test"));
}

TEST(KindFrames, CompactionReturnsSparseFramesAroundPinnedRequests) {
  const std::vector<KvKind> kinds = FlashKinds();
  KindFrames f = MakeFrames(kinds, 60 * kKindFrameBytes);  // the states of 300 requests take 35
  KindEntries e(kinds, &f, /*sparse_host_entries=*/1 << 30);
  const std::uint32_t c128 = Named(kinds, "c128");
  // 300 requests of one C128 block each fill three frames (140 blocks a frame)...
  for (std::uint32_t r = 1; r <= 300; ++r) {
    ASSERT_TRUE(e.AddRequest(RequestId(r)));
    ASSERT_TRUE(e.CheckAppend(RequestId(r), 128));
    e.Append(RequestId(r), 128);
  }
  EXPECT_EQ(f.frames_of(c128), 3u);
  // ... and most of them go: 30 stay, 10 in each frame.
  for (std::uint32_t r = 1; r <= 300; ++r) {
    if (r % 10 != 0) {
      ASSERT_TRUE(e.Free(RequestId(r)));
    }
  }
  EXPECT_EQ(f.frames_of(c128), 3u);
  const std::uint32_t free_before = f.free_frames();
  const std::uint64_t share_before = e.SparseDeviceShare();
  // Pin request 10 (frame 0): the two other frames empty into frame 0's room.
  const RequestId pin(10);
  const KindPages pinned = *e.PagesOf(pin, c128);
  auto n = e.Compact(c128, std::span(&pin, 1));
  ASSERT_TRUE(n) << n.error().ToString();
  EXPECT_EQ(*n, 2u);
  EXPECT_EQ(f.frames_of(c128), 1u);
  EXPECT_EQ(f.free_frames(), free_before + 2);
  EXPECT_GT(e.SparseDeviceShare(), share_before);  // the returned frames are the C4 share's
  EXPECT_EQ(*e.PagesOf(pin, c128), pinned);
  EXPECT_TRUE(e.CheckInvariants("compact")) << e.CheckInvariants("compact").error().ToString();
  // Nothing left to return.
  EXPECT_EQ(*e.Compact(c128, {}), 0u);
  EXPECT_EQ(e.Compact(Named(kinds, "c4"), {}).error().code(), ErrorCode::kInvalidArgument);
}

TEST(KindFrames, ABudgetWithoutAFrameOrAnEnvelopeLargerThanAFrameIsRefused) {
  const std::vector<KvKind> kinds = FlashKinds();
  struct Case {
    std::uint64_t budget, frame;
    std::string field;
  };
  const Case cases[] = {
      {kKindFrameBytes - 1, kKindFrameBytes, "KindFramesConfig.budget_bytes"},
      // 8 MiB frames: the C128 state's 10 MiB envelope does not fit.
      {64ull << 20, 8ull << 20, fmt::format("KindFramesConfig.kinds[{}]", Named(kinds, "c128_state"))},
      {kKindFrameBytes, kKindFrameBytes + 1, "KindFramesConfig.frame_bytes"},
  };
  for (const Case& c : cases) {
    auto f = KindFrames::Create({.kinds = kinds, .budget_bytes = c.budget, .frame_bytes = c.frame});
    ASSERT_FALSE(f) << c.field;
    EXPECT_EQ(f.error().code(), ErrorCode::kInvalidArgument);
    EXPECT_EQ(f.error().message().rfind(c.field, 0), 0u) << f.error().message();
  }
}

// One rank's V4-Flash kinds over frames: requests of `tokens` tokens arrive until one is
// refused. Each step's resident frames and C4 device share are recorded.
struct Batch {
  std::vector<KvKind> kinds = FlashKinds();
  KindFrames frames;
  KindEntries entries;
  std::uint32_t admitted = 0;
  Batch(std::uint64_t budget, std::uint64_t host_c4_entries)
      : frames(MakeFrames(kinds, budget)), entries(kinds, &frames, host_c4_entries) {}
  Status Add(std::uint32_t tokens) {
    const RequestId r(admitted + 1);
    ULA_RETURN_IF_ERROR(entries.AddRequest(r));
    auto made = entries.CheckAppend(r, tokens);
    if (!made) {
      EXPECT_TRUE(entries.Free(r));
      return std::unexpected(made.error());
    }
    entries.Append(r, tokens);
    entries.EndRound();  // its prefill was a round: the ring keeps the window and the drafts
    ++admitted;
    return Ok();
  }
  std::uint32_t resident_frames() const { return frames.num_frames() - frames.free_frames(); }
};

// Requests of 16384 tokens at a 16.1 GB budget until one is refused, with a host tier of
// kHostC4 C4 entries.
void GrowTheBatch(std::uint64_t kHostC4) {
  constexpr std::uint64_t kBudget = 150 * kKindFrameBytes;  // 16.1 GB
  constexpr std::uint32_t kTokens = 16384;
  Batch b(kBudget, kHostC4);
  std::uint32_t last_resident = 0;
  std::uint64_t last_share = b.entries.SparseDeviceShare(), first_share = last_share;
  std::uint64_t host_before_refusal = 0;
  Status refused = Ok();
  for (int i = 0; i < 10000 && refused; ++i) {
    const std::uint64_t before = Digest(b.entries);
    refused = b.Add(kTokens);
    ASSERT_TRUE(b.entries.CheckInvariants("batch")) << b.entries.CheckInvariants("batch").error().ToString();
    if (!refused) {
      EXPECT_EQ(Digest(b.entries), before) << "a refused request changed the state";
      break;
    }
    EXPECT_GE(b.resident_frames(), last_resident);
    EXPECT_LE(b.entries.SparseDeviceShare(), last_share);
    last_resident = b.resident_frames();
    last_share = b.entries.SparseDeviceShare();
    host_before_refusal = b.entries.SparseHostEntries();
  }
  ASSERT_FALSE(refused) << "the budget never filled";
  EXPECT_EQ(refused.error().code(), ErrorCode::kResourceExhausted);
  EXPECT_NE(refused.error().message().find("Allocate: request"), std::string::npos) << refused.error().message();
  std::printf("%u requests of %u tokens: resident %u of %u frames, C4 device share %llu -> %llu entries, C4 entries "
              "%llu on device, %llu on host\nrefused: %s\n", b.admitted, kTokens, b.resident_frames(),
              b.frames.num_frames(), static_cast<unsigned long long>(first_share),
              static_cast<unsigned long long>(last_share),
              static_cast<unsigned long long>(b.entries.SparseDeviceEntries()),
              static_cast<unsigned long long>(host_before_refusal), refused.error().message().c_str());
  EXPECT_GT(last_resident, 10u);
  EXPECT_LT(last_share, first_share / 2);
  EXPECT_GT(host_before_refusal, 0u);  // the C4 history spilled to host as the resident kinds grew
  // The count, from the layout by hand: a request of 16384 tokens holds the window's tokens
  // [16253, 16384) in 3 blocks, 128 C128 entries in 2, the keys of 4096 C4 entries in 64
  // blocks, one block of each state, and 4096 C4 entries of 21 x 584 B.
  std::uint64_t resident = 0;
  const std::pair<const char*, std::uint64_t> blocks[] = {{"window", 3}, {"c128", 2}, {"c4_index_key", 64},
                                                          {"c4_state", 1}, {"c4_index_state", 1}, {"c128_state", 1}};
  for (const auto& [name, n] : blocks) resident += n * b.frames.envelope(Named(b.kinds, name)).bytes;
  const std::uint64_t c4 = 4096ull * 21 * 584;
  // Whole requests that fit: the resident kinds on device, padded (< 3 %) and with at most one
  // partly filled frame per kind; the C4 entries in the rest of the device and the host.
  const double slack = double(b.kinds.size() * kKindFrameBytes);
  auto fits = [&](double n, double pad, double frames) {
    return n * resident * (1 + pad) <= kBudget - frames && n * (resident * (1 + pad) + c4) <= kBudget - frames + double(kHostC4) * 21 * 584;
  };
  std::uint32_t surely = 0, at_most = 0;
  while (fits(surely + 1, 0.03, slack)) ++surely;
  while (fits(at_most + 1, 0, 0)) ++at_most;
  std::printf("admitted %u: a hand count fits at least %u and at most %u\n", b.admitted, surely, at_most);
  EXPECT_GE(b.admitted, surely);  // nothing was refused while the total fitted
  EXPECT_LE(b.admitted, at_most);
  EXPECT_LT(double(b.frames.PaddingInUse()), 0.03 * kBudget);
  std::printf("padding in use: %.3f %% of the budget\n", 100.0 * b.frames.PaddingInUse() / kBudget);
}

TEST(KindFrames, AsTheBatchGrowsTheResidentShareRisesAndTheC4DeviceShareFalls) {
  GrowTheBatch(1'000'000);  // 12.3 GB of C4 entries on host: the C4 entries refuse the next request
}

TEST(KindFrames, TheResidentKindsStayOnDeviceWhateverTheHostHolds) {
  GrowTheBatch(4'000'000);  // 49 GB on host: the resident kinds' frames refuse the next request
}

TEST(KindFrames, SglangFixedPoolsRefuseWhereOneBudgetAdmits) {
  // SGLang's DSV4PoolConfigurator (kind_pools.cc, sglang_dsv4): one budget split once into a
  // full-token pool and an SWA pool of swa_full_tokens_ratio of it, with a fixed C128 state.
  // The same device budget, no host tier on either side.
  constexpr std::uint64_t kBudget = 187 * kKindFrameBytes;  // 20.05 GB
  auto kc = LoadKindCompareConfigByName("deepseek_v4_flash", DefaultConfigDir());
  ASSERT_TRUE(kc) << kc.error().ToString();
  const KindShape shape = *MakeKindShape(test::FlashModel(), /*mtp=*/false);
  PoolSetup setup;
  setup.mode = ParallelMode::kDp;
  setup.num_ranks = 1;
  setup.device_bytes = double(kBudget);
  auto plan = MakePoolPlan(KindSystem::kSglang, shape, *kc, setup);
  ASSERT_TRUE(plan) << plan.error().ToString();
  for (std::uint32_t tokens : {1024u, 32768u}) {
    const std::vector<std::uint32_t> workload(4000, tokens);
    const Admission sglang = Admit(*plan, shape, *kc, setup, workload);
    Batch ours(kBudget, /*host_c4_entries=*/0);
    Status refused = Ok();
    while (refused && ours.admitted < workload.size()) refused = ours.Add(tokens);
    std::printf("%u-token requests at %.2f GB: sglang_dsv4 admits %u (the '%s' pool refuses), one budget admits %u "
                "(%s)\n", tokens, kBudget / 1e9, sglang.admitted, sglang.binds.c_str(), ours.admitted,
                refused ? "all" : refused.error().message().c_str());
    EXPECT_GT(ours.admitted, sglang.admitted) << tokens;
  }
}

// Small kinds and frames holding bytes: rows of every resident kind, written once when their
// entry appears, read back through the kind's strided layer view after every operation.
std::vector<KvKind> SmallKinds() {
  return {
      {.name = "window", .tokens_per_entry = 1, .lifetime = KindLifetime::kRing, .ring_tokens = 10,
       .ring_draft_tokens = 2, .layers = 2, .row_bytes = 32},
      {.name = "c4", .tokens_per_entry = 4, .lifetime = KindLifetime::kAppend, .layers = 2, .row_bytes = 32,
       .placement = KindPlacement::kSparse},
      {.name = "key", .tokens_per_entry = 4, .lifetime = KindLifetime::kAppend, .layers = 2, .row_bytes = 8,
       .companion_of = 1},
      {.name = "c16", .tokens_per_entry = 16, .lifetime = KindLifetime::kAppend, .layers = 1, .row_bytes = 32},
      {.name = "state", .tokens_per_entry = 4, .lifetime = KindLifetime::kPerRequest, .state_rows = 4, .layers = 2,
       .row_bytes = 16},
  };
}

std::uint8_t Pattern(std::uint32_t request, std::uint32_t kind, std::uint32_t entry, std::uint32_t layer,
                     std::uint32_t stamp, std::uint32_t i) {
  return static_cast<std::uint8_t>(request * 131 + kind * 61 + entry * 29 + layer * 17 + stamp * 7 + i * 3);
}

TEST(KindFrames, EveryKindsRowsReadBackThroughItsStridedViewAsRequestsComeAndGo) {
  ULA_TEST_SEEDED(seed, 20261205);
  std::mt19937_64 rng(seed);
  const std::vector<KvKind> kinds = SmallKinds();
  constexpr std::uint64_t kFrame = 16384, kBudget = 12 * kFrame;
  std::vector<std::byte> memory(kBudget);
  KindFrames frames = MakeFrames(kinds, kBudget, kFrame, memory.data());
  KindEntries e(kinds, &frames, /*sparse_host_entries=*/1 << 20);
  // (request, kind, entry) -> the stamp its rows were written with.
  std::map<std::tuple<std::uint32_t, std::uint32_t, std::uint32_t>, std::uint32_t> shadow;
  std::vector<std::uint32_t> live;
  std::uint32_t next = 1, stamp = 0, checked = 0, returned = 0;
  auto row = [&](std::uint32_t r, std::uint32_t k, std::uint32_t entry, std::uint32_t layer) -> std::byte* {
    const KindPages p = *e.PagesOf(RequestId(r), k);
    const StridedLayer view = frames.Layer(k, layer);
    if (kinds[k].lifetime == KindLifetime::kPerRequest) return view.Row(p.blocks[0], entry);
    const std::uint32_t first = (p.tokens - p.filling_tokens) / kinds[k].tokens_per_entry - p.entries;  // oldest live entry
    return view.Row(p.blocks[entry / 64 - first / 64], entry % 64);
  };
  auto live_entries = [&](std::uint32_t r, std::uint32_t k) {
    const KindPages p = *e.PagesOf(RequestId(r), k);
    const std::uint32_t end = kinds[k].lifetime == KindLifetime::kPerRequest
                                  ? kinds[k].state_rows
                                  : (p.tokens - p.filling_tokens) / kinds[k].tokens_per_entry;
    const std::uint32_t first = kinds[k].lifetime == KindLifetime::kPerRequest ? 0 : end - p.entries;
    return std::pair{first, end};
  };
  for (int op = 0; op < 3000; ++op) {
    const int what = static_cast<int>(rng() % 10);
    if (live.empty() || what < 2) {
      ASSERT_TRUE(e.AddRequest(RequestId(next)));
      live.push_back(next++);
    } else if (what < 7) {
      const std::uint32_t r = live[rng() % live.size()];
      const std::uint32_t n = 1 + static_cast<std::uint32_t>(rng() % 24);
      if (e.CheckAppend(RequestId(r), n)) e.Append(RequestId(r), n);
    } else if (what < 7) {
      const std::uint32_t r = live[rng() % live.size()];
      const std::uint32_t t = *e.TokensOf(RequestId(r));
      const std::uint32_t keep = t - std::min<std::uint32_t>(t, rng() % 3);
      if (e.CheckTruncate(RequestId(r), keep)) e.Truncate(RequestId(r), keep);
    } else if (what < 8) {
      // Compaction, one request pinned: its page table does not change.
      const std::uint32_t k = std::array{0u, 2u, 3u, 4u}[rng() % 4];
      const RequestId pin(live[rng() % live.size()]);
      const KindPages before = *e.PagesOf(pin, k);
      auto n = e.Compact(k, std::span(&pin, 1));
      ASSERT_TRUE(n) << n.error().ToString();
      returned += *n;
      EXPECT_EQ(*e.PagesOf(pin, k), before) << "a pinned request's block moved";
    } else {
      const std::size_t i = rng() % live.size();
      ASSERT_TRUE(e.Free(RequestId(live[i])));
      live.erase(live.begin() + static_cast<std::ptrdiff_t>(i));
    }
    ASSERT_TRUE(e.CheckInvariants("bytes")) << e.CheckInvariants("bytes").error().ToString();
    ++stamp;
    // Forget the entries that are gone, check the rows of those that stay, write the new.
    std::map<std::tuple<std::uint32_t, std::uint32_t, std::uint32_t>, std::uint32_t> now;
    for (std::uint32_t r : live) {
      for (std::uint32_t k = 0; k < kinds.size(); ++k) {
        if (k == 1 || *e.TokensOf(RequestId(r)) == 0) continue;  // c4: the space's groups hold it
        const auto [first, end] = live_entries(r, k);
        for (std::uint32_t entry = first; entry < end; ++entry) {
          auto it = shadow.find({r, k, entry});
          const std::uint32_t s = it == shadow.end() ? stamp : it->second;
          for (std::uint32_t l = 0; l < kinds[k].layers; ++l) {
            auto* bytes = reinterpret_cast<std::uint8_t*>(row(r, k, entry, l));
            for (std::uint32_t i = 0; i < kinds[k].row_bytes; ++i) {
              if (it == shadow.end()) {
                bytes[i] = Pattern(r, k, entry, l, s, i);
              } else {
                ASSERT_EQ(bytes[i], Pattern(r, k, entry, l, s, i))
                    << "request " << r << " kind " << kinds[k].name << " entry " << entry << " layer " << l << " op " << op;
                ++checked;
              }
            }
          }
          now[{r, k, entry}] = s;
        }
      }
    }
    shadow = std::move(now);
  }
  std::printf("%u bytes checked, %u frames returned by compaction, %u frames of %u in use at the end\n", checked,
              returned, frames.num_frames() - frames.free_frames(), frames.num_frames());
  EXPECT_GT(checked, 100000u);
  EXPECT_GT(returned, 10u);
}

}  // namespace
}  // namespace ula
