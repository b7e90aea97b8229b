// The kernel planner against the CPU reference planner: two identical spaces
// driven by the same random operations, one stepped by StepPlanner and one by
// KernelStepPlanner (the step's kernels in their OpenMP form). Every step must give the same
// result (or the same error), stats, out_slots and state (entries, locations, free counts,
// DebugDigest: policy buckets and stamps, pools), and the kernel planner's descriptors must
// name exactly the entries the step brought in, copies first, in first-occurrence order.
#include "step/kernel_step_planner.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <set>

#include "backend/fault_backend.h"
#include "space_fixture.h"
#include "test_seed.h"

namespace ula {
namespace {

using testing::Pattern;
using testing::SmallConfig;

struct TwinOptions {
  PolicyKind policy = PolicyKind::kPbLru;
  std::uint32_t recent_buckets = 2;
  std::uint32_t threads = 1;
  double fault_fraction = 0.0;
  int steps = 300;
};

// One side: a space on a (possibly faulty) cpu backend.
struct Side {
  Side(const AddressSpaceConfig& cfg, const FaultPlan& plan)
      : inner(MakeCpuBackend({.copy_threads = 0})), faults(MakeFaultInjectingBackend(*inner, plan).value()),
        space(AddressSpace::Create(cfg, *faults).value()) {
    faults->set_armed(false);
  }
  std::unique_ptr<Backend> inner;
  std::unique_ptr<FaultInjectingBackend> faults;
  std::unique_ptr<AddressSpace> space;
};

void RunTwins(std::uint64_t seed, const TwinOptions& o) {
  SCOPED_TRACE(::testing::Message() << "policy " << static_cast<int>(o.policy) << " threads " << o.threads
                                    << " faults " << o.fault_fraction);
  // Per-layer pools, groups of 2 and 1 layers of 16-byte rows: a descriptor moves every row
  // of its entry, or the two sides' bytes differ.
  AddressSpaceConfig cfg = SmallConfig(/*device_slots=*/150, /*host_slots=*/600, /*ranks=*/2, /*groups=*/2);
  cfg.row_bytes = 16;
  cfg.group_layers = {2, 1};
  cfg.device_bytes_per_rank = 150ull * 3 * 16;
  cfg.host_bytes_per_rank = 600ull * 3 * 16;
  cfg.policy = o.policy;
  cfg.policy_options.recent_buckets = o.recent_buckets;
  const FaultPlan plan{.seed = seed + 7, .fail_fraction = o.fault_fraction, .partial = true};
  Side cpu(cfg, plan), ker(cfg, plan);
  StepPlanner reference(*cpu.space);
  KernelStepPlanner kernels(*ker.space);
  ASSERT_TRUE(kernels.SetOptions({.threads = o.threads}));
  std::mt19937_64 rng(seed);
  struct Req {
    RequestId id;
    Rank rank;
    std::vector<LogicalAddr> addrs;
  };
  std::vector<Req> live;
  std::vector<LogicalAddr> freed;  // addresses of freed requests: stale selections
  std::vector<RequestId> all;
  std::uint64_t next_id = 1;
  int compared = 0, errors = 0, io = 0, with_swaps = 0;
  auto both = [&](auto&& f) {
    f(*cpu.space);
    f(*ker.space);
  };
  for (int step = 0; step < o.steps; ++step) {
    const std::uint64_t op = rng() % 100;
    if (op < 12 || live.size() < 2) {  // a new request
      const Rank rank(static_cast<std::uint16_t>(rng() % 2));
      const std::uint32_t n = 5 + static_cast<std::uint32_t>(rng() % 60);
      Req r{RequestId(next_id++), rank, {}};
      bool ok = true;
      both([&](AddressSpace& s) {
        ASSERT_TRUE(s.AddRequest(r.id, rank));  // both sides make every call
        auto a = s.Allocate(r.id, n);
        if (!a) {
          ok = false;
          return;
        }
        r.addrs = *a;
        for (LogicalAddr x : r.addrs) {
          for (std::uint16_t g = 0; g < 2; ++g) ASSERT_TRUE(s.Write(x, GroupId(g), Pattern(x, g, 32 - 16 * g)));
        }
      });
      if (ok) {
        live.push_back(r);
        all.push_back(r.id);
      } else {
        both([&](AddressSpace& s) { (void)s.Free(r.id); });
      }
      continue;
    }
    if (op < 18) {  // free one
      const std::size_t k = rng() % live.size();
      both([&](AddressSpace& s) { ASSERT_TRUE(s.Free(live[k].id)); });
      freed.insert(freed.end(), live[k].addrs.begin(), live[k].addrs.end());
      live.erase(live.begin() + static_cast<std::ptrdiff_t>(k));
      continue;
    }
    if (op < 40) {
      both([&](AddressSpace& s) { s.AdvanceRound(); });
      continue;
    }
    // A step of one rank's requests: runs of a few requests, selections with repeats;
    // now and then a stale, foreign or out-of-range address.
    const Rank rank(static_cast<std::uint16_t>(rng() % 2));
    const GroupId group(static_cast<std::uint16_t>(rng() % 2));
    std::vector<LogicalAddr> sel;
    std::vector<SelectionRun> runs;
    for (int q = 0, nq = 1 + static_cast<int>(rng() % 4); q < nq; ++q) {
      std::vector<const Req*> mine;
      for (const Req& r : live) {
        if (r.rank == rank) mine.push_back(&r);
      }
      if (mine.empty()) break;
      const Req& r = *mine[rng() % mine.size()];
      const std::uint32_t k = static_cast<std::uint32_t>(rng() % 24);
      for (std::uint32_t i = 0; i < k; ++i) sel.push_back(r.addrs[rng() % r.addrs.size()]);
      runs.push_back({r.id, k});
    }
    if (runs.empty()) continue;
    if (rng() % 25 == 0 && !sel.empty()) {
      const std::uint64_t kind = rng() % 3;
      LogicalAddr& victim = sel[rng() % sel.size()];
      if (kind == 0 && !freed.empty()) victim = freed[rng() % freed.size()];
      if (kind == 1) victim = live[rng() % live.size()].addrs[0];  // maybe another request's / rank's
      if (kind == 2) victim = LogicalAddr(1u << 30);
    }
    std::vector<SlotId> out_cpu(sel.size()), out_ker(sel.size());
    cpu.faults->set_armed(true);
    ker.faults->set_armed(true);
    auto a = reference.Step({rank, group, sel, runs}, out_cpu);
    auto b = kernels.Step({rank, group, sel, runs}, out_ker);
    cpu.faults->set_armed(false);
    ker.faults->set_armed(false);
    ++compared;
    ASSERT_EQ(a.has_value(), b.has_value()) << "step " << step << ": " << (a ? b.error().ToString() : a.error().ToString());
    if (!a) {
      ++errors;
      io += a.error().code() == ErrorCode::kIo;
      ASSERT_EQ(a.error().code(), b.error().code()) << "step " << step;
      ASSERT_EQ(a.error().message(), b.error().message()) << "step " << step;
    } else {
      ASSERT_EQ(a->selections, b->selections);
      ASSERT_EQ(a->distinct, b->distinct);
      ASSERT_EQ(a->hits, b->hits);
      ASSERT_EQ(a->misses, b->misses);
      ASSERT_EQ(a->into_free, b->into_free);
      ASSERT_EQ(a->evictions, b->evictions) << "step " << step;
      ASSERT_EQ(a->bytes_moved, b->bytes_moved);
      ASSERT_EQ(out_cpu, out_ker) << "step " << step;
      with_swaps += a->evictions > 0;
      // Descriptors: one per missed address, in first-occurrence order, copies first; each
      // lands where the reference planner published the address.
      const auto d = kernels.descriptors();
      ASSERT_EQ(d.size(), a->misses);
      std::set<std::uint32_t> seen;
      std::vector<std::uint32_t> order;
      for (LogicalAddr x : sel) {
        if (seen.insert(x.value()).second) order.push_back(x.value());
      }
      std::size_t next = 0;
      for (std::size_t i = 0; i < d.size(); ++i) {
        ASSERT_EQ(d[i].op, static_cast<std::uint8_t>(i < a->into_free ? CopyOp::kCopy : CopyOp::kSwap)) << i;
        while (next < order.size() && order[next] != d[i].addr) ++next;
        ASSERT_LT(next, order.size()) << "descriptor " << i << " out of first-occurrence order";
        const Location loc = cpu.space->Lookup(LogicalAddr(d[i].addr), group).value();
        ASSERT_EQ(loc.tier(), Tier::kDevice);
        ASSERT_EQ(loc.slot().value(), d[i].dst_slot);
        ASSERT_EQ(d[i].dst_offset, std::uint64_t{d[i].dst_slot} * 16) << "slot * row_bytes in every layer's region";
        ASSERT_EQ(d[i].num_layers, group.value() == 0 ? 2u : 1u) << "every row of the entry";
        ASSERT_EQ(d[i].group, group.value());
      }
    }
    ASSERT_EQ(testing::Take(*cpu.space, all), testing::Take(*ker.space, all)) << "step " << step;
    ASSERT_TRUE(ker.space->CheckInvariants()) << "step " << step;
  }
  // The run must have exercised what it compares.
  EXPECT_GT(compared, o.steps / 3);
  EXPECT_GT(errors, 0);
  EXPECT_GT(with_swaps, 0);
  if (o.fault_fraction > 0) EXPECT_GT(io, 0);
}

TEST(KernelStepPlanner, MatchesTheCpuPlannerOnRandomStepsWithPbLru) {
  ULA_TEST_SEEDED(seed, 20261201);
  for (std::uint32_t threads : {1u, 2u}) RunTwins(seed, {.threads = threads});
}

TEST(KernelStepPlanner, MatchesTheCpuPlannerWithManyRecentBuckets) {
  ULA_TEST_SEEDED(seed, 20261202);
  for (std::uint32_t threads : {1u, 2u}) RunTwins(seed, {.recent_buckets = 8, .threads = threads});
}

TEST(KernelStepPlanner, MatchesTheCpuPlannerWithOtherPolicies) {
  ULA_TEST_SEEDED(seed, 20261203);
  for (PolicyKind p : {PolicyKind::kExactLruScan, PolicyKind::kExactLruList, PolicyKind::kClock}) {
    RunTwins(seed, {.policy = p, .threads = 2});
  }
}

// Injected faults: a failed copy or swap publishes nothing and loses nothing — the same
// state, after every step, as the CPU planner's, which the fault tests hold to that contract.
TEST(KernelStepPlanner, FailedCopiesPublishNothingAsTheCpuPlanner) {
  ULA_TEST_SEEDED(seed, 20261204);
  RunTwins(seed, {.threads = 2, .fault_fraction = 0.2});
}

TEST(KernelStepPlanner, NeverEvictsTheCurrentBucket) {
  // One group, 4 device slots, PB-LRU: touch two, then a step that needs two victims must
  // take the two untouched ones, never the ones used in this round.
  auto backend = MakeCpuBackend();
  auto space = AddressSpace::Create(SmallConfig(4, 16), *backend).value();
  ASSERT_TRUE(space->AddRequest(RequestId(1), Rank(0)));
  const auto a = space->Allocate(RequestId(1), 8).value();
  for (LogicalAddr x : a) ASSERT_TRUE(space->Write(x, GroupId(0), Pattern(x, 0, 32)));
  space->AdvanceRound();
  KernelStepPlanner planner(*space);
  std::vector<LogicalAddr> first;
  for (LogicalAddr x : a) {
    if (space->Lookup(x, GroupId(0))->tier() == Tier::kDevice && first.size() < 2) first.push_back(x);
  }
  ASSERT_EQ(first.size(), 2u);
  std::vector<SlotId> out(2);
  ASSERT_TRUE(planner.Step({Rank(0), GroupId(0), first, testing::Runs(RequestId(1), 2)}, out));
  std::vector<LogicalAddr> host;
  for (LogicalAddr x : a) {
    if (space->Lookup(x, GroupId(0))->tier() == Tier::kHost && host.size() < 2) host.push_back(x);
  }
  ASSERT_EQ(host.size(), 2u);
  std::vector<SlotId> out2(2);
  ASSERT_TRUE(planner.Step({Rank(0), GroupId(0), host, testing::Runs(RequestId(1), 2)}, out2));
  for (LogicalAddr x : first) {
    EXPECT_EQ(space->Lookup(x, GroupId(0))->tier(), Tier::kDevice) << "address " << x.value()
                                                                  << " was used in this round and was evicted";
  }
  ASSERT_TRUE(space->CheckInvariants());
}

TEST(KernelStepPlanner, RefusesBadOptionsAndKeepsItsOwn) {
  auto backend = MakeCpuBackend();
  auto space = AddressSpace::Create(SmallConfig(4, 16), *backend).value();
  KernelStepPlanner planner(*space);
  ASSERT_TRUE(planner.SetOptions({.threads = 2}));
  auto st = planner.SetOptions({.threads = 0});
  ASSERT_FALSE(st);
  EXPECT_EQ(st.error().code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(planner.options().threads, 2u);
}

}  // namespace
}  // namespace ula
