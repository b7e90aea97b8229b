// TpKernelStepPlanner (src/step/tp_kernel_step_planner.h): the kernels' OpenMP form of TP
// attention at home against TpStepPlanner, the reference, on twin spaces: under memory
// pressure, with requests freed and allocated between rounds and sharing, every step returns
// the same plan (refs and stats) or the same refusal, and both spaces end in the same state
// (DebugDigest), on 1 and 2 threads. Under injected faults, a failed batch publishes nothing
// and loses nothing.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <vector>

#include "backend/fault_backend.h"
#include "step/tp_kernel_step_planner.h"
#include "test_seed.h"
#include "tp/tp_fixture.h"
#include "ula/tp_step_planner.h"

namespace ula {
namespace {

constexpr std::uint32_t kEntry = 48;

TpConfig Config(std::uint32_t ranks) {
  TpConfig c = testing::SmallTpConfig(ranks, /*device=*/24, /*host=*/160, /*buffer=*/0, /*groups=*/2, kEntry);
  c.attention = TpAttention::kAtHome;
  return c;
}

struct Twins {
  std::unique_ptr<Backend> backend_a = MakeCpuBackend(), backend_b = MakeCpuBackend();
  std::unique_ptr<TpAddressSpace> kernel, reference;
  std::vector<TpAddressSpace*> both() { return {kernel.get(), reference.get()}; }
};

// Random selections of the live requests' addresses (a few duplicates, a stale one now and
// then to be refused alike).
struct Driver {
  std::mt19937_64 rng;
  std::vector<RequestId> live;
  std::uint64_t next_request = 1;
};

void ExpectSamePlan(const Result<TpStepPlan>& got, const Result<TpStepPlan>& want, int step) {
  ASSERT_EQ(got.has_value(), want.has_value()) << "step " << step << ": "
                                               << (got ? want.error().message() : got.error().message());
  if (!got) {
    EXPECT_EQ(got.error().code(), want.error().code()) << "step " << step;
    EXPECT_EQ(got.error().message(), want.error().message()) << "step " << step;
    return;
  }
  EXPECT_EQ(got->ranks, want->ranks);
  EXPECT_EQ(got->stats, want->stats) << "step " << step;
  ASSERT_EQ(got->refs.size(), want->refs.size());
  for (std::size_t h = 0; h < got->refs.size(); ++h) EXPECT_EQ(got->refs[h], want->refs[h]) << "step " << step << " rank " << h;
}

void RunDifferential(std::uint32_t ranks, std::uint32_t threads, std::uint64_t seed) {
  Twins t;
  t.kernel = TpAddressSpace::Create(Config(ranks), *t.backend_a).value();
  t.reference = TpAddressSpace::Create(Config(ranks), *t.backend_b).value();
  TpKernelStepPlanner kernels(*t.kernel);
  ASSERT_TRUE(kernels.SetOptions({.threads = threads}));
  TpStepPlanner reference(*t.reference, nullptr, {.parallel_ranks = false});
  Driver d;
  d.rng.seed(seed);
  std::uint64_t swaps = 0, copies = 0, refused = 0, elsewhere = 0;
  for (int step = 0; step < 160; ++step) {
    // Between rounds: admit or finish a request (alike in both spaces), share a prefix.
    if (step % 4 == 0) {
      if (d.live.size() < 4 || (d.rng() % 3 == 0 && d.live.size() < 7)) {
        const RequestId r(d.next_request++);
        const auto tokens = static_cast<std::uint32_t>(20 + d.rng() % 50);
        for (TpAddressSpace* s : t.both()) {
          ASSERT_TRUE(s->AddRequest(r));
          auto a = s->Allocate(r, tokens);
          ASSERT_TRUE(a) << a.error().message();
          for (LogicalAddr x : *a) {
            for (std::uint32_t g = 0; g < 2; ++g) ASSERT_TRUE(s->Write(x, GroupId(g), testing::TpPattern(x, g, kEntry)));
          }
        }
        if (d.live.size() >= 2 && d.rng() % 2 == 0) {  // the new request adopts an older one's first tokens
          auto prefix = t.kernel->AddressesOf(d.live[0]).value();
          const std::vector<LogicalAddr> shared(prefix.begin(), prefix.begin() + std::min<std::size_t>(8, prefix.size()));
          const RequestId adopter(d.next_request++);
          for (TpAddressSpace* s : t.both()) {
            ASSERT_TRUE(s->AddRequest(adopter));
            ASSERT_TRUE(s->ShareInto(adopter, shared));
          }
          d.live.push_back(adopter);
        }
        d.live.push_back(r);
      } else {
        const std::size_t k = d.rng() % d.live.size();
        for (TpAddressSpace* s : t.both()) ASSERT_TRUE(s->Free(d.live[k]));
        d.live.erase(d.live.begin() + static_cast<std::ptrdiff_t>(k));
      }
    }
    // A step of one group: a few selections per request, sometimes too many to fit.
    const GroupId group(static_cast<std::uint16_t>(step % 2));
    std::vector<LogicalAddr> sel;
    std::vector<SelectionRun> runs;
    const std::uint32_t per = step % 23 == 7 ? 40 : 1 + static_cast<std::uint32_t>(d.rng() % 6);
    for (RequestId r : d.live) {
      auto list = t.kernel->AddressesOf(r).value();
      std::uint32_t count = 0;
      for (std::uint32_t k = 0; k < per && !list.empty(); ++k) {
        sel.push_back(list[d.rng() % list.size()]);
        ++count;
      }
      runs.push_back({r, count});
    }
    if (step % 31 == 5 && !sel.empty()) sel[d.rng() % sel.size()] = LogicalAddr(999999);  // not live: refused
    if (step % 29 == 13 && !runs.empty() && runs[0].count > 0) {  // another request's address: refused
      for (RequestId other : d.live) {
        const auto list = t.kernel->AddressesOf(other).value();  // a span into the space, named: the Result is a temporary
        for (LogicalAddr x : list) {
          if (!t.kernel->Holds(runs[0].request, x)) {
            sel[0] = x;
            break;
          }
        }
        if (!t.kernel->Holds(runs[0].request, sel[0])) break;
      }
    }
    const auto before = t.kernel->DebugDigest();
    auto got = kernels.Step(group, sel, runs);
    auto want = reference.Step(group, sel, runs);
    ExpectSamePlan(got, want, step);
    if (::testing::Test::HasFailure()) return;
    if (!got) {
      ++refused;
      EXPECT_EQ(t.kernel->DebugDigest(), before) << "a refused step changed the state";
    } else {
      for (std::size_t h = 0; h < got->stats.size(); ++h) {
        swaps += got->stats[h].evictions;
        copies += got->stats[h].misses - got->stats[h].evictions;
        elsewhere += got->stats[h].elsewhere;
      }
    }
    ASSERT_EQ(t.kernel->DebugDigest(), t.reference->DebugDigest()) << "step " << step;
    if (step % 2 == 1) {
      for (TpAddressSpace* s : t.both()) s->AdvanceRound();
    }
  }
  ASSERT_TRUE(t.kernel->CheckInvariants());
  EXPECT_GT(swaps, 50u) << "under memory pressure";
  EXPECT_GT(copies, 20u);
  EXPECT_GT(refused, 3u);
  EXPECT_GT(elsewhere, 100u);
  std::printf("ranks %u threads %u: %llu swaps, %llu copies, %llu refused steps\n", ranks, threads,
              static_cast<unsigned long long>(swaps), static_cast<unsigned long long>(copies),
              static_cast<unsigned long long>(refused));
}

TEST(TpKernelStepPlanner, MatchesTheTpPlannerStepForStep) {
  ULA_TEST_SEEDED(seed, 20261204);
  for (std::uint32_t ranks : {2u, 3u}) {
    for (std::uint32_t threads : {1u, 2u}) {
      RunDifferential(ranks, threads, seed + ranks);
      if (::testing::Test::HasFailure()) return;
    }
  }
}

// Under a fault-injecting backend (a quarter of the batches fail, partly landed) every
// entry still reads its bytes after every step, every invariant holds, and every home ref of
// a published plan reads its entry.
TEST(TpKernelStepPlanner, FailedBatchesPublishNothingAndLoseNothing) {
  ULA_TEST_SEEDED(seed, 20261205);
  auto inner = MakeCpuBackend();
  auto faults = MakeFaultInjectingBackend(*inner, FaultPlan{.seed = seed, .fail_fraction = 0.25, .partial = true}).value();
  faults->set_armed(false);
  auto space = TpAddressSpace::Create(Config(2), *faults).value();
  TpKernelStepPlanner kernels(*space);
  std::mt19937_64 rng(seed);
  std::vector<LogicalAddr> all;
  for (std::uint32_t r = 0; r < 3; ++r) {
    ASSERT_TRUE(space->AddRequest(RequestId(r)));
    auto a = space->Allocate(RequestId(r), 60).value();
    for (LogicalAddr x : a) {
      for (std::uint32_t g = 0; g < 2; ++g) ASSERT_TRUE(space->Write(x, GroupId(g), testing::TpPattern(x, g, kEntry)));
    }
    all.insert(all.end(), a.begin(), a.end());
  }
  space->AdvanceRound();
  faults->set_armed(true);
  std::uint64_t failed = 0, published = 0;
  std::vector<std::byte> got(kEntry);
  for (int step = 0; step < 60; ++step) {
    const GroupId group(static_cast<std::uint16_t>(step % 2));
    std::vector<LogicalAddr> sel;
    std::vector<SelectionRun> runs;
    for (std::uint32_t r = 0; r < 3; ++r) {
      for (int k = 0; k < 6; ++k) sel.push_back(all[r * 60 + rng() % 60]);
      runs.push_back({RequestId(r), 6});
    }
    auto plan = kernels.Step(group, sel, runs);
    if (!plan) {
      ASSERT_EQ(plan.error().code(), ErrorCode::kIo) << plan.error().message();
      ++failed;
    } else {
      ++published;
      for (std::size_t h = 0; h < plan->refs.size(); ++h) {
        for (std::size_t j = 0; j < sel.size(); ++j) {
          const TpReadRef& ref = plan->refs[h][j];
          if (ref.source == TpReadRef::Source::kElsewhere) continue;
          const std::byte* bytes = space->RefData(plan->ranks[h], group, ref);
          ASSERT_NE(bytes, nullptr);
          ASSERT_EQ(std::vector<std::byte>(bytes, bytes + kEntry), testing::TpPattern(sel[j], group.value(), kEntry));
        }
      }
    }
    faults->set_armed(false);
    ASSERT_TRUE(space->CheckInvariants()) << space->CheckInvariants().error().message();
    for (LogicalAddr x : all) {
      ASSERT_TRUE(space->Read(x, group, got));
      ASSERT_EQ(got, testing::TpPattern(x, group.value(), kEntry)) << "address " << x.value() << " step " << step;
    }
    faults->set_armed(true);
    space->AdvanceRound();
  }
  EXPECT_GT(failed, 5u);
  EXPECT_GT(published, 5u);
}

// The room bound, exactly: a rank whose device pool has 4 evictable slots takes 4 misses
// and refuses 5 (kResourceExhausted, nothing changed), in both planners alike.
TEST(TpKernelStepPlanner, TheRoomBoundIsExact) {
  auto backend_a = MakeCpuBackend(), backend_b = MakeCpuBackend();
  TpConfig c = testing::SmallTpConfig(2, /*device=*/4, /*host=*/16, 0, /*groups=*/2, kEntry);
  c.attention = TpAttention::kAtHome;
  auto a = TpAddressSpace::Create(c, *backend_a).value();
  auto b = TpAddressSpace::Create(c, *backend_b).value();
  for (TpAddressSpace* s : {a.get(), b.get()}) {
    ASSERT_TRUE(s->AddRequest(RequestId(1)));
    ASSERT_TRUE(s->Allocate(RequestId(1), 24));  // 12 per rank: 4 on device, 8 on host
    s->AdvanceRound();
  }
  std::vector<LogicalAddr> on_host;  // rank 0's entries on host
  const auto list = a->AddressesOf(RequestId(1)).value();  // named: the Result is a temporary
  for (LogicalAddr x : list) {
    if (a->HomeOf(x) == Rank(0) && a->Lookup(x, GroupId(0))->tier() == Tier::kHost) on_host.push_back(x);
  }
  ASSERT_GE(on_host.size(), 5u);
  TpKernelStepPlanner kernels(*a);
  TpStepPlanner reference(*b, nullptr, {.parallel_ranks = false});
  for (std::size_t k : {5u, 4u}) {
    const std::vector<LogicalAddr> sel(on_host.begin(), on_host.begin() + static_cast<std::ptrdiff_t>(k));
    const std::vector<SelectionRun> runs{{RequestId(1), static_cast<std::uint32_t>(k)}};
    const auto before = a->DebugDigest();
    auto got = kernels.Step(GroupId(0), sel, runs);
    auto want = reference.Step(GroupId(0), sel, runs);
    ASSERT_EQ(got.has_value(), k == 4) << k << " misses";
    ExpectSamePlan(got, want, static_cast<int>(k));
    if (k == 5) {
      EXPECT_EQ(got.error().code(), ErrorCode::kResourceExhausted);
      EXPECT_EQ(a->DebugDigest(), before);
    }
    EXPECT_EQ(a->DebugDigest(), b->DebugDigest());
  }
}

TEST(TpKernelStepPlanner, RefusesWhatItDoesNotCover) {
  auto backend = MakeCpuBackend();
  TpConfig lb = Config(2);
  lb.attention = TpAttention::kLocalBuffer;
  lb.buffer_bytes_per_rank = std::uint64_t{kEntry} * 2 * 8;
  auto local_buffer = TpAddressSpace::Create(lb, *backend).value();
  ASSERT_TRUE(local_buffer->AddRequest(RequestId(1)));
  const auto a = local_buffer->Allocate(RequestId(1), 4).value();
  const std::vector<SelectionRun> runs{{RequestId(1), 1}};
  TpKernelStepPlanner on_lb(*local_buffer);
  auto r = on_lb.Step(GroupId(0), std::span(a).first(1), runs);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code(), ErrorCode::kFailedPrecondition);
  const Rank only[1] = {Rank(0)};
  auto one = TpAddressSpace::Create(Config(2), *backend, only).value();
  TpKernelStepPlanner on_one(*one);
  r = on_one.Step(GroupId(0), {}, {});
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code(), ErrorCode::kFailedPrecondition);
  EXPECT_FALSE(on_one.SetOptions({.threads = 0}));
  auto space = TpAddressSpace::Create(Config(2), *backend).value();
  TpKernelStepPlanner planner(*space);
  r = planner.Step(GroupId(2), {}, {});
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code(), ErrorCode::kOutOfRange);
}

}  // namespace
}  // namespace ula
