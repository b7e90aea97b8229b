// DeviceStep (ula/device_step.h), its OpenMP form, against StepPlanner's engine path on the same
// inputs: the same indices, descriptors in order, StepRecord counts, refusals (as 1 + the
// ErrorCode) and published tables, over randomized steps with injected copy failures and bad
// selections; a failed copy publishes nothing and loses nothing; no allocation after Create
// (a counting global operator new, this binary only).
#include "ula/device_step.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <new>
#include <random>
#include <vector>

#include "kernels/step_kernels.h"
#include "step/device_step_fixture.h"
#include "step/space_fixture.h"
#include "test_seed.h"
#include "ula/step_planner.h"

namespace {
std::atomic<std::uint64_t> g_allocations{0};
}  // namespace

#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
void* operator new(std::size_t n) {
  g_allocations.fetch_add(1, std::memory_order_relaxed);
  if (void* p = std::malloc(n == 0 ? 1 : n)) return p;
  throw std::bad_alloc();
}
void* operator new[](std::size_t n) { return operator new(n); }
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }

namespace ula {
namespace {

using testing::DeviceIo;
using testing::ExpectSameState;
using testing::Shape;
using testing::StepInputs;
using testing::SmallConfig;

constexpr std::uint32_t kGroups = 2;
constexpr std::uint32_t kMaxBatch = 4, kMaxQ = 2, kMaxTopK = 24;

// The same space built twice (one per policy), by the same operations: requests 0..n-1 with
// tokens allocated over several rounds (the device fills, older entries go to host), a few
// adopted (ShareInto) addresses, request 1 freed (an unknown request for the steps).
std::unique_ptr<AddressSpace> BuildSpace(Backend& backend, PolicyKind policy, std::uint32_t recent,
                                         std::uint64_t seed, std::uint32_t dev, std::uint32_t host) {
  // Per-layer pools with groups of 2 and 1 layers of 16-byte rows (entry 32 bytes): a
  // descriptor must move every row of its entry (num_layers, in every layer's coordinates).
  AddressSpaceConfig cfg = testing::EngineModes(SmallConfig(dev, host, 1, kGroups, 32));
  cfg.row_bytes = 16;
  cfg.group_layers = {2, 1};
  cfg.device_bytes_per_rank = std::uint64_t{dev} * 3 * 16;
  cfg.host_bytes_per_rank = std::uint64_t{host} * 3 * 16;
  cfg.policy = policy;
  cfg.policy_options.recent_buckets = recent;
  auto space = AddressSpace::Create(cfg, backend).value();
  std::mt19937_64 rng(seed);
  const std::uint32_t n_req = 5;
  for (std::uint32_t r = 0; r < n_req; ++r) EXPECT_TRUE(space->AddRequest(RequestId(r), Rank(0)));
  for (int round = 0; round < 6; ++round) {
    for (std::uint32_t r = 0; r < n_req; ++r) {
      EXPECT_TRUE(space->Allocate(RequestId(r), 2 + static_cast<std::uint32_t>(rng() % 6)).has_value());
    }
    space->AdvanceRound();
  }
  const auto base = space->AddressesOf(RequestId(0)).value();
  std::vector<LogicalAddr> shared(base.begin(), base.begin() + 4);
  EXPECT_TRUE(space->ShareInto(RequestId(3), shared));
  EXPECT_TRUE(space->Free(RequestId(1)));
  space->AdvanceRound();
  return space;
}

// Random selections for a batch of rows: each row's request's own addresses (with
// duplicates and -1 padding), sometimes one bad selection.
StepInputs RandomStep(std::mt19937_64& rng, const AddressSpace& space, int fault) {
  StepInputs in;
  Shape& s = in.shape;
  s.batch = 1 + static_cast<std::uint32_t>(rng() % kMaxBatch);
  s.q_len = 1 + static_cast<std::uint32_t>(rng() % kMaxQ);
  s.top_k = 8 * (1 + static_cast<std::uint32_t>(rng() % 3));
  s.sel_stride = s.top_k + static_cast<std::uint32_t>(rng() % 3);
  s.idx_stride = s.top_k + static_cast<std::uint32_t>(rng() % 2);
  s.row_batch = rng() % 2 == 0;
  const std::uint32_t live[] = {0, 2, 3, 4};
  for (std::uint32_t b = 0; b < s.batch; ++b) in.requests.push_back(RequestId(live[rng() % 4]));
  in.dense.assign(std::size_t{s.rows()} * s.top_k, -1);
  for (std::uint32_t r = 0; r < s.rows(); ++r) {
    const auto addrs = space.AddressesOf(in.requests[r / s.q_len]).value();
    const std::uint32_t used = 1 + static_cast<std::uint32_t>(rng() % s.top_k);
    for (std::uint32_t c = 0; c < used; ++c) {
      in.dense[std::size_t{r} * s.top_k + c] = static_cast<std::int32_t>(addrs[rng() % addrs.size()].value());
    }
  }
  const std::size_t at = rng() % in.dense.size();
  switch (fault) {
    case 1: in.dense[at] = -5; break;                                    // neither an address nor -1
    case 2: in.dense[at] = 1 << 20; break;                               // not live
    case 3: in.dense[at] = static_cast<std::int32_t>(space.AddressesOf(RequestId(4)).value()[0].value());
            in.requests[at / (std::size_t{s.q_len} * s.top_k)] = RequestId(2); break;  // another request's
    case 4: in.requests[at / (std::size_t{s.q_len} * s.top_k)] = RequestId(1);  // freed request
            in.dense[at] = static_cast<std::int32_t>(space.AddressesOf(RequestId(0)).value()[0].value()); break;
    default: break;
  }
  return in;
}

TEST(DeviceStep, MatchesEngineStepPlannerOnRandomSteps) {
  ULA_TEST_SEEDED(seed, 20261226);
  std::mt19937_64 rng(seed);
  int planned = 0, refused = 0, failed_copies = 0, evictions = 0;
  for (std::uint32_t trial = 0; trial < 4; ++trial) {
    const std::uint32_t recent = trial % 2 == 0 ? 2 : 8;
    const std::uint32_t dev = 40 + static_cast<std::uint32_t>(rng() % 60), host = 256;
    const GroupId g(static_cast<std::uint32_t>(rng() % kGroups));
    const std::uint64_t build_seed = rng();
    auto backend = MakeCountingBackend();
    auto ref = BuildSpace(*backend, PolicyKind::kPbLru, recent, build_seed, dev, host);
    auto twin = BuildSpace(*backend, PolicyKind::kKernelPbLru, recent, build_seed, dev, host);
    ASSERT_EQ(ref->DebugDigest(), twin->DebugDigest()) << "pb_lru and kernel_pb_lru spaces differ after the same build";
    const EngineStepConfig ec{.max_batch = kMaxBatch, .max_q_len = kMaxQ, .max_top_k = kMaxTopK};
    auto ref_planner = StepPlanner::Create(*ref, ec).value();
    auto twin_planner = StepPlanner::Create(*twin, ec).value();
    DeviceStepConfig dc;
    // Teams of 1, 2, 3 and 5: the cooperative grid's chunks, scans and barriers for every
    // split of the steps' index spaces, members with empty chunks included.
    constexpr std::uint32_t kTeams[] = {1, 2, 3, 5};
    dc.threads = kTeams[trial];
    dc.max_rows = kMaxBatch * kMaxQ;
    dc.max_batch = kMaxBatch;
    dc.max_top_k = kMaxTopK;
    auto step = DeviceStep::Create(*twin, Rank(0), g, dc).value();
    ASSERT_EQ(step->max_descriptors(), ref_planner->max_descriptors());
    DeviceIo io;
    std::vector<std::int32_t> ref_indices;
    std::vector<CopyDescriptor> ref_desc(ref_planner->max_descriptors());
    for (int s = 0; s < 40; ++s) {
      const int fault = rng() % 5 == 0 ? 1 + static_cast<int>(rng() % 4) : 0;
      StepInputs in = RandomStep(rng, *ref, fault);
      ref_indices.assign(in.dense.size(), -9);
      auto plan = ref_planner->Plan(Rank(0), g, {in.shape.batch, in.shape.q_len, in.shape.top_k}, in.requests, in.dense,
                                    ref_indices, ref_desc);
      io.Fill(in.shape, in.dense, in.requests, step->max_descriptors());
      const DeviceStepState before = step->ReadState(nullptr).value();
      ASSERT_TRUE(step->Plan(io.arrays, nullptr));
      ASSERT_GE(io.record.done, 1u) << "the StepRecord is written last, done set";
      if (!plan) {
        ++refused;
        ASSERT_EQ(io.record.error, 1 + static_cast<std::uint32_t>(plan.error().code()))
            << plan.error().ToString() << " step " << s << " seed " << seed;
        std::vector<std::uint8_t> none(step->max_descriptors(), 0);
        ASSERT_TRUE(step->Complete(none.data(), nullptr));  // a refused plan's Complete publishes nothing
        for (std::int32_t x : io.indices) ASSERT_EQ(x, -9) << "a refused step writes no index";
        ExpectSameState(before, step->ReadState(nullptr).value(), "a refused step changes nothing");
        continue;
      }
      ++planned;
      ASSERT_EQ(io.record.error, 0u) << "step " << s;
      ASSERT_EQ(io.record.distinct, plan->stats.distinct);
      ASSERT_EQ(io.record.hits, plan->stats.hits);
      ASSERT_EQ(io.record.misses, plan->stats.misses);
      ASSERT_EQ(io.record.evictions, plan->stats.evictions);
      ASSERT_EQ(io.record.bytes_moved, plan->stats.bytes_moved);
      ASSERT_EQ(io.record.num_descriptors, plan->num_descriptors);
      std::uint64_t non_pad = 0;
      for (std::int32_t x : in.dense) non_pad += x != -1;
      ASSERT_EQ(io.record.selections, non_pad);
      evictions += static_cast<int>(plan->stats.evictions);
      for (std::uint32_t i = 0; i < plan->num_descriptors; ++i) {
        ASSERT_EQ(std::memcmp(&io.descriptors[i], &ref_desc[i], sizeof(CopyDescriptor)), 0)
            << "descriptor " << i << " of step " << s << " seed " << seed;
      }
      for (std::uint32_t r = 0; r < in.shape.rows(); ++r) {
        for (std::uint32_t c = 0; c < in.shape.top_k; ++c) {
          ASSERT_EQ(io.indices[std::size_t{r} * in.shape.idx_stride + c], ref_indices[std::size_t{r} * in.shape.top_k + c])
              << "row " << r << " col " << c << " step " << s << " seed " << seed;
        }
      }
      // The engine's copies: some fail (status != 0), the same ones on both sides.
      std::vector<std::uint8_t> status(step->max_descriptors(), 0);
      if (rng() % 3 == 0) {
        for (std::uint32_t i = 0; i < plan->num_descriptors; ++i) status[i] = rng() % 3 == 0 ? 1 : 0;
      }
      auto twin_plan = twin_planner->Plan(Rank(0), g, {in.shape.batch, in.shape.q_len, in.shape.top_k}, in.requests,
                                          in.dense, ref_indices, ref_desc);
      ASSERT_TRUE(twin_plan);
      const std::span<const std::uint8_t> st(status.data(), plan->num_descriptors);
      auto report = ref_planner->Complete(plan->fence, st).value();
      ASSERT_TRUE(twin_planner->Complete(twin_plan->fence, st));
      ASSERT_TRUE(step->Complete(status.data(), nullptr));
      failed_copies += static_cast<int>(report.failed);
      const DeviceStepState after = step->ReadState(nullptr).value();
      EXPECT_EQ(after.published, report.published);
      EXPECT_EQ(after.failed, report.failed);
      // The published tables: every address's location as the reference has it.
      for (std::uint32_t a = 0; a < after.records.size(); ++a) {
        auto loc = ref->Lookup(LogicalAddr(a), g);
        ASSERT_EQ(after.records[a], loc ? loc->bits() : 0u) << "address " << a << " step " << s << " seed " << seed;
      }
      if (rng() % 2 == 0) {
        ref->AdvanceRound();
        twin->AdvanceRound();
        ASSERT_TRUE(step->AdvanceRound(nullptr));
      }
      // The whole device state equals a fresh load of the twin space (StepPlanner's engine path over
      // kernel_pb_lru), and the twin equals the pb_lru reference (digest: tables, pools, policy).
      ASSERT_EQ(ref->DebugDigest(), twin->DebugDigest()) << "step " << s;
      auto fresh = DeviceStep::Create(*twin, Rank(0), g, dc).value();
      ExpectSameState(step->ReadState(nullptr).value(), fresh->ReadState(nullptr).value(), "device state vs the reference's");
      ASSERT_FALSE(::testing::Test::HasFailure()) << "step " << s << " seed " << seed;
    }
  }
  EXPECT_GT(planned, 60);
  EXPECT_GT(refused, 10);
  EXPECT_GT(failed_copies, 5);
  EXPECT_GT(evictions, 20);
}

// Every copy fails: nothing is published, no entry moves, no free slot is lost.
TEST(DeviceStep, FailedCopiesPublishNothingAndLoseNothing) {
  auto backend = MakeCountingBackend();
  auto space = BuildSpace(*backend, PolicyKind::kKernelPbLru, 4, 7, 40, 256);
  DeviceStepConfig dc{.max_rows = 2, .max_batch = 2, .max_top_k = 24};
  auto step = DeviceStep::Create(*space, Rank(0), GroupId(0), dc).value();
  const auto addrs = space->AddressesOf(RequestId(2)).value();
  std::vector<std::int32_t> dense(48, -1);
  for (std::size_t i = 0; i < addrs.size() && i < 48; ++i) dense[i] = static_cast<std::int32_t>(addrs[i].value());
  DeviceIo io;
  io.Fill({.batch = 2, .q_len = 1, .top_k = 24, .sel_stride = 24, .idx_stride = 24}, dense,
          {RequestId(2), RequestId(2)}, step->max_descriptors());
  const DeviceStepState before = step->ReadState(nullptr).value();
  ASSERT_TRUE(step->Plan(io.arrays, nullptr));
  ASSERT_EQ(io.record.error, 0u);
  ASSERT_GT(io.record.misses, 0u) << "the request's entries are partly on host";
  std::vector<std::uint8_t> status(step->max_descriptors(), 1);
  ASSERT_TRUE(step->Complete(status.data(), nullptr));
  const DeviceStepState after = step->ReadState(nullptr).value();
  EXPECT_EQ(after.published, 0u);
  EXPECT_EQ(after.failed, io.record.misses);
  EXPECT_EQ(after.records, before.records) << "a failed copy publishes nothing";
  EXPECT_EQ(after.device_owner, before.device_owner);
  EXPECT_EQ(after.device_free, before.device_free) << "a failed copy's free slot is free again";
  EXPECT_EQ(after.host_free, before.host_free) << "no host slot is freed";
}

// A round whose Allocate found the device full of the round's own entries places the rest on
// host, pinned there for the round (address_space.h, stable_new_entries). The device step
// loads such a space (it used to refuse it at Create) and makes StepPlanner's decision:
// a step that would move a pinned entry is refused with kResourceExhausted and changes
// nothing, though free device slots could take it; after AdvanceRound (on the step) the
// pinned entries move into them.
TEST(DeviceStep, NewEntriesOnHostStayThereForTheRound) {
  auto backend = MakeCpuBackend();
  AddressSpaceConfig cfg = testing::EngineModes(SmallConfig(4, 16, 1, 1, 32));
  cfg.policy = PolicyKind::kKernelPbLru;
  auto space = AddressSpace::Create(cfg, *backend).value();
  auto twin = AddressSpace::Create(cfg, *backend).value();
  for (AddressSpace* s : {space.get(), twin.get()}) {
    ASSERT_TRUE(s->AddRequest(RequestId(0), Rank(0)));
    ASSERT_TRUE(s->AddRequest(RequestId(1), Rank(0)));
    ASSERT_TRUE(s->Allocate(RequestId(1), 2));  // on device, this round's
    auto fresh = s->Allocate(RequestId(0), 4);  // 2 on device, 2 pinned on host
    ASSERT_TRUE(fresh);
    ASSERT_EQ(s->Lookup((*fresh)[3], GroupId(0)).value().tier(), Tier::kHost);
    ASSERT_EQ(s->Lookup((*fresh)[2], GroupId(0)).value().tier(), Tier::kHost);
    ASSERT_TRUE(s->Free(RequestId(1)));  // two device slots free again: room is not what refuses
  }
  const DeviceStepConfig dc{.max_rows = 1, .max_batch = 1, .max_top_k = 8};
  auto step = DeviceStep::Create(*space, Rank(0), GroupId(0), dc);
  ASSERT_TRUE(step) << step.error().ToString();
  auto planner = StepPlanner::Create(*twin, {.max_batch = 1, .max_q_len = 1, .max_top_k = 8}).value();
  const auto mine = space->AddressesOf(RequestId(0)).value();
  std::vector<std::int32_t> dense(8, -1);
  for (std::size_t i = 0; i < mine.size(); ++i) dense[i] = static_cast<std::int32_t>(mine[i].value());
  DeviceIo io;
  io.Fill({.batch = 1, .q_len = 1, .top_k = 8, .sel_stride = 8, .idx_stride = 8}, dense, {RequestId(0)},
          (*step)->max_descriptors());
  const DeviceStepState before = (*step)->ReadState(nullptr).value();
  ASSERT_TRUE((*step)->Plan(io.arrays, nullptr));
  std::vector<std::uint8_t> status((*step)->max_descriptors(), 0);
  ASSERT_TRUE((*step)->Complete(status.data(), nullptr));
  std::vector<std::int32_t> indices(8, 0);
  std::vector<CopyDescriptor> descs(planner->max_descriptors());
  const std::vector<RequestId> reqs{RequestId(0)};
  auto refused = planner->Plan(Rank(0), GroupId(0), {.batch = 1, .q_len = 1, .top_k = 8}, reqs, dense, indices, descs);
  ASSERT_FALSE(refused);
  EXPECT_EQ(refused.error().code(), ErrorCode::kResourceExhausted);
  EXPECT_EQ(io.record.error, 1u + static_cast<std::uint32_t>(refused.error().code())) << "the engine planner's refusal";
  ExpectSameState((*step)->ReadState(nullptr).value(), before, "a refused step changes nothing");
  // The next round the pinned entries are ordinary host entries: the step swaps them in.
  ASSERT_TRUE((*step)->AdvanceRound(nullptr));
  io.Fill({.batch = 1, .q_len = 1, .top_k = 8, .sel_stride = 8, .idx_stride = 8}, dense, {RequestId(0)},
          (*step)->max_descriptors());
  ASSERT_TRUE((*step)->Plan(io.arrays, nullptr));
  EXPECT_EQ(io.record.error, 0u);
  EXPECT_EQ(io.record.misses, 2u);
  EXPECT_EQ(io.record.evictions, 0u) << "into the freed slots";
  ASSERT_TRUE((*step)->Complete(status.data(), nullptr));
}

// The device step is the engine path: it refuses a space whose modes are not the engine's
// (host shadows on, or new entries not stable), with the field to change, and builds nothing.
TEST(DeviceStep, RefusesASpaceWithoutTheEngineModes) {
  auto backend = MakeCpuBackend();
  const DeviceStepConfig dc{.max_rows = 1, .max_batch = 1, .max_top_k = 8};
  AddressSpaceConfig cfg = testing::EngineModes(SmallConfig(4, 16, 1, 1, 32));
  cfg.policy = PolicyKind::kKernelPbLru;
  cfg.host_shadows = true;
  auto shadowed = AddressSpace::Create(cfg, *backend).value();
  auto refused = DeviceStep::Create(*shadowed, Rank(0), GroupId(0), dc);
  ASSERT_FALSE(refused);
  EXPECT_EQ(refused.error().code(), ErrorCode::kUnsupported);
  EXPECT_NE(refused.error().message().find("host_shadows = false"), std::string::npos) << refused.error().ToString();
  cfg.host_shadows = false;
  cfg.stable_new_entries = false;
  auto unstable = AddressSpace::Create(cfg, *backend).value();
  refused = DeviceStep::Create(*unstable, Rank(0), GroupId(0), dc);
  ASSERT_FALSE(refused);
  EXPECT_EQ(refused.error().code(), ErrorCode::kFailedPrecondition);
  EXPECT_NE(refused.error().message().find("stable_new_entries = true"), std::string::npos) << refused.error().ToString();
  cfg.stable_new_entries = true;
  auto ok = AddressSpace::Create(cfg, *backend).value();
  EXPECT_TRUE(DeviceStep::Create(*ok, Rank(0), GroupId(0), dc));
}

TEST(DeviceStep, AllocatesNothingAfterCreate) {
  auto backend = MakeCountingBackend();
  auto space = BuildSpace(*backend, PolicyKind::kKernelPbLru, 4, 11, 40, 256);
  DeviceStepConfig dc{.threads = 2, .max_rows = 8, .max_batch = 4, .max_top_k = 24};
  auto step = DeviceStep::Create(*space, Rank(0), GroupId(1), dc).value();
  std::mt19937_64 rng(5);
  std::vector<StepInputs> inputs;
  std::vector<DeviceIo> ios(12);
  for (int s = 0; s < 12; ++s) {
    inputs.push_back(RandomStep(rng, *space, s % 4 == 3 ? 2 : 0));
    ios[s].Fill(inputs[s].shape, inputs[s].dense, inputs[s].requests, step->max_descriptors());
  }
  std::vector<std::uint8_t> status(step->max_descriptors(), 0);
  std::uint64_t misses = 0;
  const std::uint64_t before = g_allocations.load();
  for (int s = 0; s < 12; ++s) {
    ASSERT_TRUE(step->Plan(ios[s].arrays, nullptr));
    ASSERT_TRUE(step->Complete(status.data(), nullptr));
    if (s % 3 == 2) {
      ASSERT_TRUE(step->AdvanceRound(nullptr));
    }
    misses += ios[s].record.misses;
  }
  EXPECT_EQ(g_allocations.load() - before, 0u) << "Plan, Complete and AdvanceRound allocate nothing";
  EXPECT_EQ(step->arena_overflows(), 0u);
  EXPECT_EQ(step->arena_high_water(), 0u) << "the OpenMP form's scans take no scratch";
  EXPECT_GT(misses, 0u);
}

TEST(DeviceStep, BadArgumentsAreRefusedOnTheHost) {
  auto backend = MakeCountingBackend();
  auto pb = BuildSpace(*backend, PolicyKind::kPbLru, 4, 3, 40, 256);
  DeviceStepConfig dc{.max_rows = 2, .max_batch = 2, .max_top_k = 8};
  auto wrong = DeviceStep::Create(*pb, Rank(0), GroupId(0), dc);
  ASSERT_FALSE(wrong);
  EXPECT_EQ(wrong.error().code(), ErrorCode::kFailedPrecondition);
  EXPECT_EQ(DeviceStep::Create(*pb, Rank(1), GroupId(0), dc).error().code(), ErrorCode::kOutOfRange);
  EXPECT_EQ(DeviceStep::Create(*pb, Rank(0), GroupId(0), DeviceStepConfig{.threads = 0}).error().code(),
            ErrorCode::kInvalidArgument);
  auto space = BuildSpace(*backend, PolicyKind::kKernelPbLru, 4, 3, 40, 256);
  auto step = DeviceStep::Create(*space, Rank(0), GroupId(0), dc).value();
  std::vector<std::uint8_t> status(step->max_descriptors(), 0);
  EXPECT_EQ(step->Complete(status.data(), nullptr).error().code(), ErrorCode::kFailedPrecondition);
  DeviceIo io;
  const std::vector<std::int32_t> dense(16, -1);
  io.Fill({.batch = 2, .q_len = 1, .top_k = 8, .sel_stride = 8, .idx_stride = 8}, dense, {RequestId(0), RequestId(0)},
          step->max_descriptors());
  const DeviceStepState before = step->ReadState(nullptr).value();
  StepArrays big = io.arrays;
  big.top_k = 9;  // past max_top_k
  EXPECT_EQ(step->Plan(big, nullptr).error().code(), ErrorCode::kInvalidArgument);
  StepArrays strided = io.arrays;
  strided.index_stride = 4;
  EXPECT_EQ(step->Plan(strided, nullptr).error().code(), ErrorCode::kInvalidArgument);
  StepArrays rows = io.arrays;
  rows.q_len = 2;  // 2 rows for batch 2 * q_len 2 without row_batch
  EXPECT_EQ(step->Plan(rows, nullptr).error().code(), ErrorCode::kInvalidArgument);
  StepArrays null = io.arrays;
  null.indices = nullptr;
  EXPECT_EQ(step->Plan(null, nullptr).error().code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(io.record.done, 0u) << "a refused Plan enqueues nothing";
  ExpectSameState(before, step->ReadState(nullptr).value(), "refused arguments change nothing");
  ASSERT_TRUE(step->Plan(io.arrays, nullptr));
  EXPECT_EQ(step->Plan(io.arrays, nullptr).error().code(), ErrorCode::kFailedPrecondition) << "a plan is pending";
  EXPECT_EQ(step->AdvanceRound(nullptr).error().code(), ErrorCode::kFailedPrecondition);
  ASSERT_TRUE(step->Complete(status.data(), nullptr));
  EXPECT_EQ(io.record.distinct, 0u) << "padding only";
}

// Create with config.cuda = true: made where a CUDA device is present (MakeCudaBackend finds
// one), refused with kFailedPrecondition (ula/device_step.h) before anything is allocated where
// none is, in a CUDA build (the device check) and in a build without CUDA (Validate) alike. It
// asserts on both kinds of machine and skips on neither (scripts/gpu-check.sh fails a GPU run
// in which a CUDA test skips). The OpenMP form needs no device.
TEST(DeviceStep, CudaFormIsMadeExactlyWhereADeviceIs) {
  const bool device = MakeCudaBackend().has_value();
  auto backend = MakeCountingBackend();
  auto space = BuildSpace(*backend, PolicyKind::kKernelPbLru, 4, 7, 40, 256);
  DeviceStepConfig dc{.cuda = true, .max_rows = kMaxBatch * kMaxQ, .max_batch = kMaxBatch, .max_top_k = kMaxTopK};
  auto made = DeviceStep::Create(*space, Rank(0), GroupId(1), dc);
  if (device) {
    EXPECT_TRUE(made) << "a device is present: " << made.error().ToString();
  } else {
    ASSERT_FALSE(made) << "a CUDA-form step was made without a device";
    EXPECT_EQ(made.error().code(), ErrorCode::kFailedPrecondition) << made.error().ToString();
  }
  dc.cuda = false;
  EXPECT_TRUE(DeviceStep::Create(*space, Rank(0), GroupId(1), dc)) << "the OpenMP form needs no device";
}

// The CUDA form's names for the runtime errors that mean "this machine cannot run it": no
// device and no driver are kKernelNoDevice; a driver older than the runtime (the same
// cudaErrorInsufficientDriver, with a driver installed) is kKernelOldDriver, named apart so
// that an old driver is not reported as a missing GPU.
TEST(DeviceStepKernelError, AnOldDriverIsNotNoDevice) {
  using namespace kernels;
  EXPECT_EQ(FromCudaError(kCudaErrorInsufficientDriver, 12040), kKernelOldDriver);
  EXPECT_EQ(FromCudaError(kCudaErrorInsufficientDriver, 0), kKernelNoDevice) << "no driver installed";
  EXPECT_EQ(FromCudaError(kCudaErrorNoDevice, 13000), kKernelNoDevice);
  EXPECT_EQ(FromCudaError(kCudaErrorStubLibrary, 0), kKernelNoDevice);
  EXPECT_EQ(FromCudaError(kCudaErrorDevicesUnavailable, 13000), kKernelNoDevice);
  EXPECT_EQ(FromCudaError(kCudaErrorMemoryAllocation, 13000), kKernelOutOfMemory);
  EXPECT_EQ(FromCudaError(0, 13000), kKernelOk);
  EXPECT_EQ(FromCudaError(700, 13000), 700) << "other CUDA errors keep their value";
  ASSERT_NE(KernelErrorName(kKernelOldDriver), nullptr);
  EXPECT_NE(std::string(KernelErrorName(kKernelOldDriver)), KernelErrorName(kKernelNoDevice));
}

// The scratch arena's refusal (kernels/step_kernels.h ScratchArena, the CUDA form's scan
// storage): a request past the capacity gets nullptr and changes nothing but the overflow
// count, so the CUDA form's Fits check before a step's launches refuses the step whole. The
// OpenMP form cannot provoke it through DeviceStep: its scans (thrust's OpenMP system) run on
// the calling thread and take no temporary storage, so it has no arena; this checks the
// bookkeeping in host memory instead.
TEST(DeviceStepArena, RefusesPastItsCapacityAndChangesNothing) {
  std::vector<char> bytes(1024);
  kernels::ScratchArena arena;
  arena.base = bytes.data();
  arena.capacity = bytes.size();
  EXPECT_TRUE(arena.Fits(1024));
  EXPECT_FALSE(arena.Fits(1025));
  char* a = arena.Take(100);
  ASSERT_EQ(a, bytes.data());
  EXPECT_FALSE(arena.Fits(1024 - 255)) << "the next request starts at the next 256-byte boundary";
  EXPECT_TRUE(arena.Fits(1024 - 256));
  EXPECT_EQ(arena.Take(1024 - 255), nullptr);
  EXPECT_EQ(arena.used, 100u) << "a refused request changes nothing";
  EXPECT_EQ(arena.overflows, 1u);
  EXPECT_EQ(arena.allocations, 1u);
  EXPECT_EQ(arena.Take(~std::size_t{0} - 64), nullptr) << "a request that wraps the offset is refused";
  EXPECT_EQ(arena.overflows, 2u);
  char* b = arena.Take(1024 - 256);
  ASSERT_EQ(b, bytes.data() + 256);
  EXPECT_EQ(arena.high_water, 1024u);
  arena.Give(b, 1024 - 256);
  arena.Give(a, 100);
  EXPECT_EQ(arena.used, 0u) << "given back in stack order, the arena is empty again";
  EXPECT_EQ(arena.Take(1024), bytes.data());
}

// The CUDA form against the OpenMP form on the same steps (scripts/gpu-check.sh runs it on a
// GPU; skipped where MakeCudaBackend finds no device or the build has no CUDA). The engine's
// arrays live in the cuda backend's pinned, mapped host memory, which the kernels read and
// write directly; the status array too.
TEST(DeviceStep, CudaFormMatchesOpenMpForm) {
  auto cuda = MakeCudaBackend();
  if (!cuda) GTEST_SKIP() << cuda.error().ToString();
  auto backend = MakeCountingBackend();
  auto space = BuildSpace(*backend, PolicyKind::kKernelPbLru, 4, 99, 60, 256);
  DeviceStepConfig dc{.max_rows = kMaxBatch * kMaxQ, .max_batch = kMaxBatch, .max_top_k = kMaxTopK};
  auto host_step = DeviceStep::Create(*space, Rank(0), GroupId(1), dc).value();
  dc.cuda = true;
  auto made = DeviceStep::Create(*space, Rank(0), GroupId(1), dc);
  ASSERT_TRUE(made) << made.error().ToString();
  auto dev_step = std::move(*made);
  const std::uint32_t n = kMaxBatch * kMaxQ * (kMaxTopK + 3);
  const std::uint32_t nd = dev_step->max_descriptors();
  const std::uint64_t bytes = std::uint64_t{n} * 4 * 3 + kMaxBatch * 8 + std::uint64_t{nd} * (sizeof(CopyDescriptor) + 1) +
                              sizeof(StepRecord) + 4096;
  auto arena = (*cuda)->CreateArena(Tier::kHost, Rank(0), bytes).value();
  std::byte* p = arena.data;
  auto carve = [&](std::size_t b) {
    std::byte* at = p;
    p += (b + 63) / 64 * 64;
    return at;
  };
  auto* d_sel = reinterpret_cast<std::int32_t*>(carve(std::size_t{n} * 4));
  auto* d_rows = reinterpret_cast<std::int32_t*>(carve(std::size_t{n} * 4));
  auto* d_idx = reinterpret_cast<std::int32_t*>(carve(std::size_t{n} * 4));
  auto* d_req = reinterpret_cast<std::int64_t*>(carve(kMaxBatch * 8));
  auto* d_desc = reinterpret_cast<CopyDescriptor*>(carve(std::size_t{nd} * sizeof(CopyDescriptor)));
  auto* d_status = reinterpret_cast<std::uint8_t*>(carve(nd));
  auto* d_rec = reinterpret_cast<StepRecord*>(carve(sizeof(StepRecord)));
  std::mt19937_64 rng(13);
  for (int s = 0; s < 30; ++s) {
    StepInputs in = RandomStep(rng, *space, s % 5 == 4 ? 1 + s % 4 : 0);
    DeviceIo io;
    io.Fill(in.shape, in.dense, in.requests, nd);
    std::memcpy(d_sel, io.selections.data(), io.selections.size() * 4);
    std::memcpy(d_rows, io.row_batch.data(), io.row_batch.size() * 4);
    std::memcpy(d_idx, io.indices.data(), io.indices.size() * 4);
    std::memcpy(d_req, io.requests.data(), io.requests.size() * 8);
    *d_rec = StepRecord{};
    StepArrays da = io.arrays;
    da.selections = d_sel;
    da.row_batch = io.arrays.row_batch != nullptr ? d_rows : nullptr;
    da.requests = d_req;
    da.indices = d_idx;
    da.descriptors = d_desc;
    da.stats = d_rec;
    ASSERT_TRUE(host_step->Plan(io.arrays, nullptr));
    ASSERT_TRUE(dev_step->Plan(da, nullptr));
    std::vector<std::uint8_t> status(nd, 0);
    for (std::uint32_t i = 0; i < nd; ++i) status[i] = rng() % 7 == 0 ? 1 : 0;
    std::memcpy(d_status, status.data(), nd);
    ASSERT_TRUE(host_step->Complete(status.data(), nullptr));
    ASSERT_TRUE(dev_step->Complete(d_status, nullptr));
    if (s % 3 == 2) {
      ASSERT_TRUE(host_step->AdvanceRound(nullptr));
      ASSERT_TRUE(dev_step->AdvanceRound(nullptr));
    }
    const DeviceStepState hs = host_step->ReadState(nullptr).value(), ds = dev_step->ReadState(nullptr).value();  // syncs
    ASSERT_EQ(d_rec->done, io.record.done) << "step " << s;
    ASSERT_EQ(d_rec->error, io.record.error) << "step " << s;
    ASSERT_EQ(d_rec->misses, io.record.misses) << "step " << s;
    ASSERT_EQ(d_rec->hits, io.record.hits) << "step " << s;
    ASSERT_EQ(d_rec->evictions, io.record.evictions) << "step " << s;
    ASSERT_EQ(std::memcmp(d_idx, io.indices.data(), io.indices.size() * 4), 0) << "indices, step " << s;
    ASSERT_EQ(std::memcmp(d_desc, io.descriptors.data(), std::size_t{io.record.num_descriptors} * sizeof(CopyDescriptor)), 0)
        << "descriptors, step " << s;
    ExpectSameState(hs, ds, "CUDA form vs OpenMP form");
    ASSERT_EQ(hs.published, ds.published);
    ASSERT_FALSE(::testing::Test::HasFailure()) << "step " << s;
  }
  EXPECT_EQ(dev_step->arena_overflows(), 0u);
  ASSERT_TRUE((*cuda)->DestroyArena(arena.id));
}

}  // namespace
}  // namespace ula
