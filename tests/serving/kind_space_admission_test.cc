// UlaCache's V4 admission from a run of the space (kind_space_admission.h): it admits what a
// direct run of a space over frames admits (the model's own 21 CSA groups, the same budget),
// it is refused at the first request that does not fit and counts neither that request nor
// any after it, its DP ranks stop at the first refusal of any rank in arrival order, and at
// the same budget it admits more than SGLang's fixed DSV4 pools.
#include <gtest/gtest.h>

#include <cstdio>
#include <random>
#include <vector>

#include "test_seed.h"
#include "config/model_config.h"
#include "config/model_kinds.h"
#include "serving/kind_config.h"
#include "serving/kind_pools.h"
#include "serving/kind_space_admission.h"
#include "space/kind_frames.h"
#include "ula/address_space.h"
#include "ula/backend.h"

namespace ula {
namespace {

ModelConfig Flash() {
  auto m = LoadModelConfigByName("deepseek_v4_flash", DefaultConfigDir());
  EXPECT_TRUE(m) << m.error().ToString();
  return *m;
}

// The sanitizer trees check every invariant inside each Allocate of the direct runs (21
// groups, every C4 entry): they run smaller budgets and host tiers there, the same rules (12
// frames at least: a prefill chunk's round holds the chunk's own window, 8,192 tokens of it,
// and five of the 20,000-token requests below must fit).
#if defined(ULA_EXPENSIVE_CHECKS)
constexpr std::uint32_t kBudgetFrames = 12, kSmallFrames = 8;
constexpr std::uint64_t kHostC4 = 20'000, kSmallHostC4 = 10'000;
#else
constexpr std::uint32_t kBudgetFrames = 16, kSmallFrames = 12;
constexpr std::uint64_t kHostC4 = 100'000, kSmallHostC4 = 50'000;
#endif

// What a space over frames admits, run by hand: V4-Flash without its MTP layer, its 21 CSA
// groups of one layer each (not the run's one group of 21), requests prefilled in chunks of
// 8192 tokens with a round each, until the first Allocate is refused.
struct Direct {
  std::uint32_t admitted = 0;
  KindBudget budget;
};
Direct DirectRun(std::uint32_t frames, std::uint64_t host_c4, const std::vector<std::uint32_t>& tokens) {
  ModelConfig m = Flash();
  m.mtp_layers = 0;
  m.compress_ratios.resize(m.num_layers);
  AddressSpaceConfig base;
  base.device_bytes_per_rank = std::uint64_t{frames} * kKindFrameBytes;
  base.kind_frame_bytes = kKindFrameBytes;
  auto c = SpaceConfigOfModel(m, {}, base);
  EXPECT_TRUE(c) << c.error().ToString();
  EXPECT_EQ(c->num_groups, 21u);
  c->host_bytes_per_rank = host_c4 * c->bytes_per_address();
  auto backend = MakeCountingBackend();
  auto space = AddressSpace::Create(*c, *backend);
  EXPECT_TRUE(space) << space.error().ToString();
  AddressSpace& s = **space;
  Direct d;
  for (std::uint32_t i = 0; i < tokens.size(); ++i) {
    EXPECT_TRUE(s.AddRequest(RequestId(i + 1), Rank(0)));
    bool refused = false;
    for (std::uint32_t done = 0; done < tokens[i] && !refused; done += 8192) {
      auto fresh = s.Allocate(RequestId(i + 1), std::min<std::uint32_t>(8192, tokens[i] - done));
      if (!fresh) {
        EXPECT_EQ(fresh.error().code(), ErrorCode::kResourceExhausted) << fresh.error().ToString();
        refused = true;
      }
      s.AdvanceRound();
    }
    if (refused) {
      EXPECT_TRUE(s.Free(RequestId(i + 1)));
      break;
    }
    ++d.admitted;
    // The budget after the admitted requests, as the admission core reports it: not after the
    // refused request's chunks were freed, whose moves (C4 entries out of the frames its
    // window took) the core does not replay.
    d.budget = *s.KindBudgetOf();
  }
  EXPECT_TRUE(s.CheckInvariants()) << s.CheckInvariants().error().ToString();
  return d;
}

std::vector<std::uint32_t> Lengths(std::uint32_t n, std::uint32_t lo, std::uint32_t hi, std::uint32_t default_seed) {
  const std::uint64_t seed = ::ula::testing::TestSeed(default_seed);
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  std::mt19937 rng(static_cast<std::uint32_t>(seed));
  std::uniform_int_distribution<std::uint32_t> len(lo, hi);
  std::vector<std::uint32_t> out(n);
  for (std::uint32_t& t : out) t = len(rng);
  return out;
}

KindSpaceSetup Dp(std::uint32_t ranks, std::uint32_t frames, std::uint64_t host_c4) {
  return {.mode = ParallelMode::kDp, .num_ranks = ranks, .device_bytes = double(frames) * kKindFrameBytes,
          .host_bytes = double(host_c4) * 21 * 584};
}

TEST(KindSpaceAdmission, AdmitsWhatADirectRunOfTheSpaceAdmitsAndStopsAtTheFirstRefusal) {
  constexpr std::uint32_t kFrames = kBudgetFrames;
  constexpr std::uint64_t kHost = kHostC4;
  const std::vector<std::uint32_t> tokens = Lengths(80, 2'000, 40'000, 58);
  const Direct direct = DirectRun(kFrames, kHost, tokens);
  ASSERT_LT(direct.admitted, tokens.size()) << "the budget never filled";
  auto run = RunKindSpace(Flash(), Dp(1, kFrames, kHost), tokens);
  ASSERT_TRUE(run) << run.error().ToString();
  std::printf("%u of %zu admitted (direct %u), binds %s: %s\n", run->admitted, tokens.size(), direct.admitted,
              run->binds.c_str(), run->refusal.c_str());
  EXPECT_EQ(run->admitted, direct.admitted);
  ASSERT_EQ(run->ranks.size(), 1u);
  const KindBudget& b = run->ranks[0];
  EXPECT_EQ(b.frames, direct.budget.frames);
  EXPECT_EQ(b.free_frames, direct.budget.free_frames);
  EXPECT_EQ(b.frames_of_kind, direct.budget.frames_of_kind);
  EXPECT_EQ(b.c4_entries, direct.budget.c4_entries);
  // The core places C4 entries device-first in the share the frames leave, as the step's
  // policy keeps them once decoding; a direct run right after its prefills may hold fewer there:
  // a chunk's round takes window frames for the chunk's own window, C4 entries move out of them
  // to host, and they come back only when a step selects them.
  EXPECT_GE(b.c4_on_device, direct.budget.c4_on_device);
  EXPECT_LE(b.c4_on_device, b.c4_entries);
  EXPECT_FALSE(run->binds.empty());
  ASSERT_EQ(run->host_share_csa.size(), run->admitted + 1u);
  EXPECT_DOUBLE_EQ(run->host_share_csa.back(), double(b.c4_entries - b.c4_on_device) / double(b.c4_entries));
  // Every request before the refused one fits: all admitted, nothing binds.
  auto all = RunKindSpace(Flash(), Dp(1, kFrames, kHost),
                          std::vector<std::uint32_t>(tokens.begin(), tokens.begin() + run->admitted));
  ASSERT_TRUE(all);
  EXPECT_EQ(all->admitted, run->admitted);
  EXPECT_EQ(all->binds, "");
}

TEST(KindSpaceAdmission, TheFirstRequestThatDoesNotFitIsNotCountedAndLaterOnesWaitBehindIt) {
  constexpr std::uint32_t kFrames = kBudgetFrames;
  constexpr std::uint64_t kHost = kHostC4;
  // Five requests fit, the sixth holds more C4 entries than the whole space, the rest fit.
  std::vector<std::uint32_t> tokens(5, 20'000);
  tokens.push_back(2'000'000);
  for (int i = 0; i < 5; ++i) tokens.push_back(2'000);
  auto run = RunKindSpace(Flash(), Dp(1, kFrames, kHost), tokens);
  ASSERT_TRUE(run) << run.error().ToString();
  EXPECT_EQ(run->admitted, 5u);
  EXPECT_EQ(run->binds, "space") << run->refusal;
  // Without the refused request the later ones fit (a direct run admits them).
  std::vector<std::uint32_t> without = tokens;
  without.erase(without.begin() + 5);
  EXPECT_EQ(DirectRun(kFrames, kHost, without).admitted, without.size());
  // The budget is the five admitted requests' (the refused one's chunks are gone).
  EXPECT_EQ(run->ranks[0].c4_entries, 5u * 20'000 / 4);
}

TEST(KindSpaceAdmission, DpRanksStopAtTheFirstRefusalOfAnyRankInArrivalOrder) {
  constexpr std::uint32_t kFrames = kSmallFrames;
  constexpr std::uint64_t kHost = kSmallHostC4;
  // Rank 1 (odd requests) gets long requests, rank 0 short ones: rank 1 refuses first.
  std::vector<std::uint32_t> tokens;
  for (std::uint32_t i = 0; i < 120; ++i) tokens.push_back(i % 2 == 0 ? 3'000 : 30'000);
  std::vector<std::uint32_t> rank0, rank1;
  for (std::uint32_t i = 0; i < tokens.size(); ++i) (i % 2 == 0 ? rank0 : rank1).push_back(tokens[i]);
  const Direct d1 = DirectRun(kFrames, kHost, rank1);
  ASSERT_LT(d1.admitted, rank1.size());
  auto run = RunKindSpace(Flash(), Dp(2, kFrames, kHost), tokens);
  ASSERT_TRUE(run) << run.error().ToString();
  // Rank 1's refused request is global request 2 * d1.admitted + 1: everything before it.
  EXPECT_EQ(run->admitted, 2 * d1.admitted + 1);
  ASSERT_EQ(run->ranks.size(), 2u);
  EXPECT_EQ(run->ranks[1].c4_entries, d1.budget.c4_entries);
  const Direct d0 = DirectRun(kFrames, kHost, std::vector<std::uint32_t>(rank0.begin(), rank0.begin() + d1.admitted + 1));
  EXPECT_EQ(d0.admitted, d1.admitted + 1);  // rank 0 could have taken more: it stops anyway
  EXPECT_EQ(run->ranks[0].c4_entries, d0.budget.c4_entries);
  EXPECT_EQ(run->ranks[0].frames_of_kind, d0.budget.frames_of_kind);
}

TEST(KindSpaceAdmission, AdmitsMoreThanSglangsFixedPoolsAtTheSameBudget) {
  auto kc = LoadKindCompareConfigByName("deepseek_v4_flash", DefaultConfigDir());
  ASSERT_TRUE(kc);
  const ModelConfig m = Flash();
  const KindShape shape = *MakeKindShape(m, false);
  constexpr std::uint32_t kFrames = 187;  // 20.05 GB, no host tier
  PoolSetup setup;
  setup.mode = ParallelMode::kDp;
  setup.num_ranks = 1;
  setup.device_bytes = double(kFrames) * kKindFrameBytes;
  auto sglang = MakePoolPlan(KindSystem::kSglang, shape, *kc, setup);
  ASSERT_TRUE(sglang);
  for (std::uint32_t len : {1'024u, 32'768u}) {
    const std::vector<std::uint32_t> tokens(4096, len);
    const Admission sg = Admit(*sglang, shape, *kc, setup, tokens);
    auto ula = RunKindSpace(m, Dp(1, kFrames, 0), tokens);
    ASSERT_TRUE(ula) << ula.error().ToString();
    std::printf("%u tokens: sglang_dsv4 %u (%s binds), the space %u (%s)\n", len, sg.admitted, sg.binds.c_str(), ula->admitted,
                ula->binds.c_str());
    EXPECT_GT(ula->admitted, sg.admitted + sg.admitted / 4);
    EXPECT_LT(ula->admitted, tokens.size());
  }
}

TEST(KindSpaceAdmission, TpRunsOneRanksShareOfEachRequest) {
  constexpr std::uint32_t kFrames = kBudgetFrames;
  const std::vector<std::uint32_t> tokens = Lengths(120, 16'000, 160'000, 59);
  KindSpaceSetup tp = Dp(8, kFrames, kHostC4);
  tp.mode = ParallelMode::kTp;
  auto run = RunKindSpace(Flash(), tp, tokens);
  ASSERT_TRUE(run) << run.error().ToString();
  std::vector<std::uint32_t> share;
  for (std::uint32_t t : tokens) share.push_back((t + 7) / 8);
  const Direct d = DirectRun(kFrames, kHostC4, share);
  ASSERT_LT(d.admitted, tokens.size());
  EXPECT_EQ(run->admitted, d.admitted);
  ASSERT_EQ(run->ranks.size(), 1u);
  EXPECT_EQ(run->ranks[0].c4_entries, d.budget.c4_entries);
  EXPECT_FALSE(RunKindSpace(Flash(), Dp(1, 0, 0), tokens).has_value());  // no frame fits
}

}  // namespace
}  // namespace ula
