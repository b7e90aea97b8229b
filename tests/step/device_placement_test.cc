// Device placement (AddressSpaceConfig::device_placement; ula/device_step.h, "Addresses on the
// host, slots on the device"), the OpenMP form: an engine loop (arrivals, prefill chunks,
// decode tokens, draft rollbacks, finished requests) whose space hands out addresses and
// whose device steps place them (Place, CompletePlace) with no host synchronisation;
// the same seeded workload in today's bracket (StoreInto, host Allocate / Free / AdvanceRound,
// Reload) against it, byte for byte through the steps' indices and location for location at
// checkpoints; bad input changing nothing; failed eviction copies losing nothing.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <optional>
#include <random>
#include <vector>

#include "space/address_space_state.h"
#include "space/space_access.h"
#include "step/device_step_fixture.h"
#include "step/placement_buffers.h"
#include "step/space_fixture.h"
#include "test_seed.h"
#include "ula/address_space.h"
#include "ula/device_step.h"
#include "ula/location_bits.h"
#include "ula/step_planner.h"

namespace ula {
namespace {

using testing::DeviceIo;
using testing::Pattern;
using testing::Shape;

constexpr std::uint32_t kGroups = 2;
constexpr std::uint32_t kEntry = 16;  // one row per entry
constexpr std::uint32_t kDev = 96, kHost = 1024;
constexpr std::uint32_t kMaxBatch = 6, kTopK = 6;
constexpr std::uint32_t kMaxAddresses = 64 * 48, kMaxRequests = 64;
constexpr std::uint32_t kMaxSeats = 256, kMaxReleases = 1024, kMaxRequestChanges = 64;
#if defined(ULA_EXPENSIVE_CHECKS)
constexpr int kIterations = 120;  // the sanitizer trees check the whole space after every call
#else
constexpr int kIterations = 400;
#endif

AddressSpaceConfig Config(bool device_placement) {
  AddressSpaceConfig cfg = testing::EngineModes(testing::SmallConfig(kDev, kHost, 1, kGroups, kEntry));
  cfg.policy = PolicyKind::kKernelPbLru;
  cfg.policy_options.recent_buckets = 2;
  cfg.device_placement = device_placement;
  return cfg;
}

DeviceStepConfig StepConfig(std::uint32_t threads = 1) {
  DeviceStepConfig c;
  c.threads = threads;
  c.max_rows = kMaxBatch;
  c.max_batch = kMaxBatch;
  c.max_top_k = kTopK;
  c.max_addresses = kMaxAddresses;
  c.max_requests = kMaxRequests;
  c.max_place_seats = kMaxSeats;
  c.max_place_releases = kMaxReleases;
  c.max_place_requests = kMaxRequestChanges;
  return c;
}

// The engine's KV pools of one group, as bytes: what attention reads through the indices.
struct Shadow {
  std::vector<std::byte> dev = std::vector<std::byte>(std::size_t{kDev} * kEntry);
  std::vector<std::byte> host = std::vector<std::byte>(std::size_t{kHost} * kEntry);
  std::byte* At(Tier t, std::uint32_t slot) { return (t == Tier::kDevice ? dev.data() : host.data()) + std::size_t{slot} * kEntry; }
  void Run(const CopyDescriptor& d) {
    std::byte* src = At(static_cast<Tier>(d.src_tier), d.src_slot);
    std::byte* dst = At(static_cast<Tier>(d.dst_tier), d.dst_slot);
    if (static_cast<CopyOp>(d.op) == CopyOp::kSwap) std::swap_ranges(src, src + kEntry, dst);
    else std::memcpy(dst, src, kEntry);
  }
};

// What one run saw, to compare the two modes.
struct Trace {
  std::vector<std::uint64_t> steps;  // per step: error, hits, misses, evictions
  std::vector<std::int32_t> indices; // every step's indices
  std::uint64_t hits = 0, misses = 0, evictions = 0;
  std::vector<std::vector<std::uint64_t>> checkpoints;  // every live address's location per group
};

// Two runs made the same decisions: totals, every step, every index and every checkpoint.
void ExpectSameTrace(const Trace& got, const Trace& want) {
  EXPECT_EQ(got.hits, want.hits);
  EXPECT_EQ(got.misses, want.misses);
  EXPECT_EQ(got.evictions, want.evictions);
  EXPECT_EQ(got.steps, want.steps);
  EXPECT_EQ(got.indices, want.indices);
  ASSERT_EQ(got.checkpoints.size(), want.checkpoints.size());
  for (std::size_t c = 0; c < want.checkpoints.size(); ++c) {
    EXPECT_EQ(got.checkpoints[c], want.checkpoints[c]) << "checkpoint " << c;
  }
}

struct Active {
  RequestId id;
  std::uint32_t left = 0;  // tokens still to decode
};

enum class Mode { kBracket, kDevice };

struct Options {
  Mode mode = Mode::kDevice;
  bool checkpoints = true;
  std::uint32_t fail_every = 0;  // device mode: eviction copy k with (k % fail_every == 1) fails
  std::uint32_t threads = 1;     // the OpenMP form's team
  // Device mode: Place reads its counts from memory (PlacementArrays::counts) through one
  // PlacementArrays value for the whole run, as a captured graph replays it.
  bool counts_in_memory = false;
};

class Loop {
 public:
  Loop(std::uint64_t seed, Options opt) : rng_(seed), opt_(opt) {
    backend_ = MakeCountingBackend();
    space_ = AddressSpace::Create(Config(opt.mode == Mode::kDevice), *backend_).value();
    for (std::uint32_t g = 0; g < kGroups; ++g) {
      steps_.push_back(DeviceStep::Create(*space_, Rank(0), GroupId(g), StepConfig(opt.threads)).value());
    }
    if (opt.mode == Mode::kBracket) {  // Allocate's victims: device -> host in the engine's pools
      space_->SetMoveExecutor([this](std::span<const CopyDescriptor> moves) {
        for (const CopyDescriptor& d : moves) shadow_[d.group].Run(d);
        return Ok();
      });
    }
    syncs_after_create_ = SyncsNow();
  }

  std::uint64_t SyncsNow() const {
    std::uint64_t s = 0;
    for (const auto& st : steps_) s += st->counters().state.syncs + st->counters().place.syncs + st->counters().Step().syncs;
    return s;
  }
  std::uint64_t syncs_after_create() const { return syncs_after_create_; }
  AddressSpace& space() { return *space_; }
  DeviceStep& step(std::uint32_t g) { return *steps_[g]; }
  const Trace& trace() const { return trace_; }
  std::uint32_t evictions_failed() const { return evictions_failed_; }
  std::uint32_t evictions_run() const { return evictions_run_; }

  void Run(int iterations) {
    for (int it = 0; it < iterations; ++it) {
      Iteration(it);
      if (::testing::Test::HasFatalFailure()) return;
      if (opt_.checkpoints && (it % 50 == 49 || it + 1 == iterations)) Checkpoint();
    }
  }

 private:
  void Iteration(int it) {
    const bool device = opt_.mode == Mode::kDevice;
    // The round's end (the previous iteration's attention ran).
    if (device) {
      for (auto& st : steps_) ASSERT_TRUE(st->AdvanceRound(nullptr));
    } else {
      for (auto& st : steps_) ASSERT_TRUE(st->StoreInto(*space_, nullptr));
      space_->AdvanceRound();
    }
    // Finished requests leave before new tokens arrive (device placement applies releases
    // before seats: the host rule's slots).
    for (std::size_t i = 0; i < active_.size();) {
      if (active_[i].left == 0) {
        ASSERT_TRUE(space_->Free(active_[i].id));
        active_.erase(active_.begin() + static_cast<std::ptrdiff_t>(i));
      } else {
        ++i;
      }
    }
    // A rejected draft: the request's last token is rolled back (its entry released), and
    // its next token takes the same address again.
    for (const Active& a : active_) {
      const std::size_t held = space_->AddressesOf(a.id).value().size();
      if (held >= 2 && rng_() % 8 == 0) {
        ASSERT_TRUE(space_->Truncate(a.id, static_cast<std::uint32_t>(held - 1)));
      }
    }
    while (active_.size() < kMaxBatch && rng_() % 3 != 0) {
      const RequestId id(next_id_++ % kMaxRequests);
      if (std::any_of(active_.begin(), active_.end(), [&](const Active& a) { return a.id == id; })) break;
      ASSERT_TRUE(space_->AddRequest(id, Rank(0)));
      active_.push_back({id, 0});
      pending_prefill_.push_back(static_cast<std::uint32_t>(1 + rng_() % 24));
    }
    // New tokens: a prefill chunk for a new request, one decode token for the others.
    std::vector<LogicalAddr> fresh;
    for (std::size_t i = 0; i < active_.size(); ++i) {
      std::uint32_t n = 1;
      const std::size_t first_new = active_.size() - pending_prefill_.size();
      if (i >= first_new) {
        n = pending_prefill_[i - first_new];
        active_[i].left = static_cast<std::uint32_t>(10 + rng_() % 60);
      }
      auto got = space_->Allocate(active_[i].id, n);
      ASSERT_TRUE(got) << got.error().ToString();
      active_[i].left -= 1;
      for (LogicalAddr a : *got) {
        ++version_[a.value()];
        fresh.push_back(a);
      }
    }
    pending_prefill_.clear();
    if (device) {
      Place(fresh);
    } else {
      for (LogicalAddr a : fresh) {
        for (std::uint32_t g = 0; g < kGroups; ++g) {
          const Location loc = space_->Lookup(a, GroupId(g)).value();
          WriteToken(g, a, loc.tier(), loc.slot().value());
        }
      }
      for (auto& st : steps_) ASSERT_TRUE(st->Reload(*space_, nullptr));
    }
    for (std::uint32_t g = 0; g < kGroups; ++g) StepGroup(g);
  }

  void WriteToken(std::uint32_t g, LogicalAddr a, Tier t, std::uint32_t slot) {
    const auto bytes = Pattern(a, g, kEntry, version_[a.value()]);
    std::memcpy(shadow_[g].At(t, slot), bytes.data(), kEntry);
  }

  void Place(const std::vector<LogicalAddr>& fresh) {
    PlacementBuffers fresh_buffers(kMaxSeats);
    PlacementBuffers& b = opt_.counts_in_memory ? fixed_ : fresh_buffers;
    b.Fill(space_->TakePlacement().value());
    PlacementArrays arrays = b.arrays();
    if (opt_.counts_in_memory) {
      arrays = b.arrays_with_counts();
      if (!first_fixed_) first_fixed_ = arrays;
      // The launch's arguments never change: one captured Place would replay every iteration.
      ASSERT_EQ(std::memcmp(&arrays, &*first_fixed_, sizeof(arrays)), 0) << "the arrays moved";
    }
    ASSERT_EQ(b.seated.size(), fresh.size());  // every new address of the iteration, in Allocate order
    for (std::size_t i = 0; i < fresh.size(); ++i) ASSERT_EQ(b.seated[i], fresh[i].value());
    for (std::uint32_t g = 0; g < kGroups; ++g) {
      std::fill(b.locations.begin(), b.locations.end(), 0);
      std::fill(b.status.begin(), b.status.end(), 0);
      b.error = 7;  // the kernel writes 0
      ASSERT_TRUE(steps_[g]->Place(arrays, nullptr));
      if (opt_.counts_in_memory) {
        ASSERT_EQ(b.error, 0u) << "the device refused a place";
      }
      // The engine's copies (the OpenMP form's "device" memory is host memory: the count is
      // read where a GPU copy kernel would read it on the device).
      for (std::uint32_t k = 0; k < b.num_evictions; ++k) {
        ++evictions_run_;
        if (opt_.fail_every != 0 && evictions_run_ % opt_.fail_every == 1) {
          b.status[k] = 1;  // its bytes never arrive
          ++evictions_failed_;
          continue;
        }
        shadow_[g].Run(b.evictions[k]);
      }
      ASSERT_TRUE(steps_[g]->CompletePlace(b.status.data(), nullptr));
      for (std::size_t i = 0; i < b.seated.size(); ++i) {
        const std::uint64_t loc = b.locations[i];
        ASSERT_NE(loc, 0u) << "seat " << i << " has no location";
        WriteToken(g, LogicalAddr(b.seated[i]), location_bits::OnDevice(loc) ? Tier::kDevice : Tier::kHost,
                   location_bits::SlotOf(loc));
      }
    }
  }

  void StepGroup(std::uint32_t g) {
    Shape shape;
    shape.batch = static_cast<std::uint32_t>(active_.size());
    shape.top_k = shape.sel_stride = shape.idx_stride = kTopK;
    if (shape.batch == 0) return;
    std::vector<std::int32_t> dense(std::size_t{shape.rows()} * kTopK, -1);
    std::vector<RequestId> reqs;
    for (std::uint32_t b = 0; b < shape.batch; ++b) {
      reqs.push_back(active_[b].id);
      const auto addrs = space_->AddressesOf(active_[b].id).value();
      // The newest token half the time (a fail_every run may have put it on host: a step
      // that selects it is refused, in both modes alike), then random older ones.
      std::uint32_t c = 0;
      if (rng_() % 2 == 0) dense[b * kTopK + c++] = static_cast<std::int32_t>(addrs.back().value());
      for (; c < kTopK && addrs.size() > 1; ++c) {
        if (rng_() % 5 == 0) continue;  // a pad
        dense[b * kTopK + c] = static_cast<std::int32_t>(addrs[rng_() % (addrs.size() - 1)].value());
      }
    }
    DeviceIo io;
    io.Fill(shape, dense, reqs, steps_[g]->max_descriptors());
    ASSERT_TRUE(steps_[g]->Plan(io.arrays, nullptr));
    for (std::uint32_t i = 0; i < io.record.num_descriptors; ++i) shadow_[g].Run(io.descriptors[i]);
    const std::vector<std::uint8_t> status(steps_[g]->max_descriptors(), 0);
    ASSERT_TRUE(steps_[g]->Complete(status.data(), nullptr));
    const StepRecord& r = io.record;
    trace_.steps.insert(trace_.steps.end(), {r.error, r.hits, r.misses, r.evictions});
    trace_.indices.insert(trace_.indices.end(), io.indices.begin(), io.indices.end());
    if (r.error != 0) return;
    trace_.hits += r.hits;
    trace_.misses += r.misses;
    trace_.evictions += r.evictions;
    // What attention reads: every selection's bytes through its index.
    for (std::uint32_t j = 0; j < shape.rows() * kTopK; ++j) {
      if (dense[j] < 0) continue;
      const std::int32_t idx = io.indices[j];
      ASSERT_GE(idx, 0);
      const auto want = Pattern(LogicalAddr(static_cast<std::uint32_t>(dense[j])), g, kEntry,
                                version_[static_cast<std::uint32_t>(dense[j])]);
      ASSERT_EQ(std::memcmp(shadow_[g].At(Tier::kDevice, static_cast<std::uint32_t>(idx)), want.data(), kEntry), 0)
          << "group " << g << " selection " << j << " address " << dense[j] << " index " << idx;
    }
  }

  // Both modes: the space holds the steps' state; every live address's bytes are at its
  // location (nothing lost), the invariants hold, and the locations are recorded.
  void Checkpoint() {
    if (opt_.mode == Mode::kDevice) {
      const PlacementJournal left = space_->TakePlacement().value();
      ASSERT_TRUE(left.empty());  // every journal was applied
      for (auto& st : steps_) ASSERT_TRUE(st->StoreInto(*space_, nullptr));
    } else {
      for (auto& st : steps_) ASSERT_TRUE(st->StoreInto(*space_, nullptr));
    }
    ASSERT_TRUE(space_->CheckInvariants()) << space_->CheckInvariants().error().ToString();
    std::vector<std::uint64_t> locs;
    for (const Active& a : active_) {
      const auto listed = space_->AddressesOf(a.id);
      ASSERT_TRUE(listed);
      for (LogicalAddr x : *listed) {
        for (std::uint32_t g = 0; g < kGroups; ++g) {
          const Location loc = space_->Lookup(x, GroupId(g)).value();
          locs.push_back(loc.bits());
          const auto want = Pattern(x, g, kEntry, version_[x.value()]);
          ASSERT_EQ(std::memcmp(shadow_[g].At(loc.tier(), loc.slot().value()), want.data(), kEntry), 0)
              << "address " << x.value() << " group " << g;
        }
      }
    }
    trace_.checkpoints.push_back(std::move(locs));
    if (opt_.mode == Mode::kBracket) {
      for (auto& st : steps_) ASSERT_TRUE(st->Reload(*space_, nullptr));
    }
  }

  std::mt19937_64 rng_;
  Options opt_;
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<AddressSpace> space_;
  std::vector<std::unique_ptr<DeviceStep>> steps_;
  Shadow shadow_[kGroups];
  std::vector<Active> active_;
  std::vector<std::uint32_t> pending_prefill_;
  std::map<std::uint32_t, std::uint32_t> version_;
  std::uint64_t next_id_ = 0;
  Trace trace_;
  std::uint64_t syncs_after_create_ = 0;
  std::uint32_t evictions_failed_ = 0, evictions_run_ = 0;
  PlacementBuffers fixed_{kMaxSeats, kMaxReleases, kMaxRequestChanges};
  std::optional<PlacementArrays> first_fixed_;
};

// (a) The engine loop in device placement: no host synchronisation after Create, no
// StoreInto or Reload, the device pool under pressure (evictions), every selection's bytes right.
TEST(DevicePlacement, EngineLoopHasNoHostSync) {
  ULA_TEST_SEEDED(seed, 20261206);
  Loop loop(seed, {.mode = Mode::kDevice, .checkpoints = false});
  const std::uint64_t before = loop.SyncsNow();
  loop.Run(kIterations);
  EXPECT_EQ(loop.SyncsNow(), before);
  EXPECT_EQ(before, loop.syncs_after_create());
  for (std::uint32_t g = 0; g < kGroups; ++g) {
    EXPECT_EQ(loop.step(g).counters().place.syncs, 0u);
    EXPECT_GT(loop.step(g).counters().place.launches, 0u);
  }
  EXPECT_GT(loop.evictions_run(), 0u) << "the workload never pressed the device pool";
  EXPECT_GT(loop.trace().evictions, 0u);
}

// (b) The same seeded workload in the bracket (host placement) and in device placement: the
// same steps (errors, counts, indices) and, at checkpoints, the same locations, since the
// device applies Allocate's rule for stable new entries.
TEST(DevicePlacement, SameAsHostPlacement) {
  ULA_TEST_SEEDED(seed, 20261207);
  Loop host(seed, {.mode = Mode::kBracket});
  host.Run(kIterations);
  Loop device(seed, {.mode = Mode::kDevice});
  device.Run(kIterations);
  ASSERT_FALSE(::testing::Test::HasFatalFailure());
  ExpectSameTrace(device.trace(), host.trace());
  EXPECT_GT(device.evictions_run(), 0u);
}

// The counts in memory (PlacementArrays::counts): one PlacementArrays value, and so one
// launch, for the whole run, each iteration's counts written into memory before Place; the
// same steps, indices and checkpointed locations as counts passed by value, failed
// evictions included.
TEST(DevicePlacement, CountsInMemoryServeEveryIteration) {
  ULA_TEST_SEEDED(seed, 20261210);
  Loop by_value(seed, {.mode = Mode::kDevice, .fail_every = 5});
  by_value.Run(kIterations / 2);
  Loop in_memory(seed, {.mode = Mode::kDevice, .fail_every = 5, .counts_in_memory = true});
  in_memory.Run(kIterations / 2);
  ASSERT_FALSE(::testing::Test::HasFatalFailure());
  ExpectSameTrace(in_memory.trace(), by_value.trace());
  EXPECT_GT(in_memory.evictions_run(), 0u);
  EXPECT_GT(in_memory.evictions_failed(), 0u);
}

// (d) Failed eviction copies lose nothing: the victim stays on device, the new address takes
// the reserved host slot (new on host this round); every selection and every live address
// reads its own bytes.
TEST(DevicePlacement, FailedEvictionLosesNothing) {
  ULA_TEST_SEEDED(seed, 20261208);
  Loop loop(seed, {.mode = Mode::kDevice, .fail_every = 3});
  loop.Run(kIterations / 2);
  EXPECT_GT(loop.evictions_failed(), 0u);  // the checkpoints read every live address's bytes
}

// Determinism: the team's size changes nothing (every slot is a rank in a scan, every shared
// update an atomic that commutes), failed evictions included.
TEST(DevicePlacement, SameForAnyTeam) {
  ULA_TEST_SEEDED(seed, 20261209);
  Loop one(seed, {.mode = Mode::kDevice, .fail_every = 4, .threads = 1});
  one.Run(kIterations / 4);
  Loop three(seed, {.mode = Mode::kDevice, .fail_every = 4, .threads = 3});
  three.Run(kIterations / 4);
  ASSERT_FALSE(::testing::Test::HasFatalFailure());
  ExpectSameTrace(three.trace(), one.trace());
  EXPECT_GT(one.evictions_run(), 0u);
}

// (c) Bad input changes nothing, and the forms and calls that do not have the mode refuse it.
TEST(DevicePlacement, RefusalsChangeNothing) {
  auto backend = MakeCountingBackend();
  {  // Validate names the field.
    AddressSpaceConfig cfg = Config(true);
    cfg.stable_new_entries = false;
    auto bad = AddressSpace::Create(cfg, *backend);
    ASSERT_FALSE(bad);
    EXPECT_EQ(bad.error().code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(bad.error().message().find("device_placement"), std::string::npos);
    cfg = Config(true);
    cfg.host_shadows = true;
    EXPECT_EQ(AddressSpace::Create(cfg, *backend).error().code(), ErrorCode::kInvalidArgument);
  }
  auto space = AddressSpace::Create(Config(true), *backend).value();
  // The host step places on the host: refused at Create, with its reason.
  {
    EngineStepConfig ec;
    ec.max_top_k = kTopK;
    auto planner = StepPlanner::Create(*space, ec);
    ASSERT_FALSE(planner);
    EXPECT_EQ(planner.error().code(), ErrorCode::kUnsupported);
    EXPECT_NE(planner.error().message().find("device_placement"), std::string::npos);
  }
  auto step = DeviceStep::Create(*space, Rank(0), GroupId(0), StepConfig()).value();
  ASSERT_TRUE(space->AddRequest(RequestId(1), Rank(0)));
  ASSERT_TRUE(space->AddRequest(RequestId(2), Rank(0)));
  const auto addrs = space->Allocate(RequestId(1), 4).value();
  // The host step's library path (no Create) refuses at Step, before it reads a location.
  {
    StepPlanner library(*space);
    const std::vector<SelectionRun> runs = {SelectionRun{RequestId(1), 2}};
    std::vector<SlotId> out(2);
    auto stepped = library.Step(StepInput{Rank(0), GroupId(0), std::span(addrs.data(), 2), runs}, out);
    ASSERT_FALSE(stepped);
    EXPECT_EQ(stepped.error().code(), ErrorCode::kUnsupported) << stepped.error().ToString();
    EXPECT_NE(stepped.error().message().find("StepPlanner::Step"), std::string::npos);
  }
  // Unplaced: live, no location; Read, Write and Lookup say so.
  EXPECT_TRUE(space->IsLive(addrs[0]));
  EXPECT_EQ(space->Lookup(addrs[0], GroupId(0)).error().code(), ErrorCode::kFailedPrecondition);
  std::vector<std::byte> buf(kEntry);
  EXPECT_EQ(space->Read(addrs[0], GroupId(0), buf).error().code(), ErrorCode::kFailedPrecondition);
  EXPECT_EQ(space->Write(addrs[0], GroupId(0), buf).error().code(), ErrorCode::kFailedPrecondition);
  EXPECT_TRUE(space->CheckInvariants());
  // Sharing is refused, with its reason.
  const std::vector<LogicalAddr> prefix(addrs.begin(), addrs.begin() + 2);
  for (Status st : {space->ShareInto(RequestId(2), prefix), space->Retain(prefix), space->Release(prefix)}) {
    ASSERT_FALSE(st);
    EXPECT_EQ(st.error().code(), ErrorCode::kUnsupported);
    EXPECT_NE(st.error().message().find("device_placement"), std::string::npos);
  }
  EXPECT_EQ(space->SharePrefix(RequestId(2), RequestId(1), 2).error().code(), ErrorCode::kUnsupported);
  // A journal not applied: StoreInto refuses, nothing stored.
  EXPECT_EQ(step->StoreInto(*space, nullptr).error().code(), ErrorCode::kFailedPrecondition);

  PlacementJournal j = space->TakePlacement().value();
  ASSERT_EQ(j.seated[0].size(), 4u);
  ASSERT_EQ(j.new_requests.size(), 2u);
  PlacementBuffers b(kMaxSeats);
  b.Fill(j);
  const std::vector<std::uint32_t>&seated = b.seated, &tags = b.seated_tags, &req_ids = b.new_requests;
  const std::vector<std::uint64_t>& locations = b.locations;
  const std::vector<std::uint8_t>& status = b.status;
  const std::uint32_t& num_evictions = b.num_evictions;
  const PlacementArrays p = b.arrays();

  const DeviceStepState before = step->ReadState(nullptr).value();
  auto expect_unchanged = [&](const char* what) {
    const DeviceStepState now = step->ReadState(nullptr).value();
    testing::ExpectSameState(before, now, what);
    EXPECT_EQ(before.owner, now.owner) << what;
    EXPECT_EQ(before.request_tags, now.request_tags) << what;
  };
  {  // a count past the maxima
    PlacementArrays q = p;
    q.num_seated = kMaxSeats + 1;
    auto st = step->Place(q, nullptr);
    ASSERT_FALSE(st);
    EXPECT_EQ(st.error().code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(st.error().message().find("max_place_seats"), std::string::npos);
    expect_unchanged("count past max_place_seats");
  }
  {  // an address past max_addresses
    std::vector<std::uint32_t> far = seated;
    far[2] = kMaxAddresses + 5;
    PlacementArrays q = p;
    q.seated = far.data();
    auto st = step->Place(q, nullptr);
    ASSERT_FALSE(st);
    EXPECT_EQ(st.error().code(), ErrorCode::kResourceExhausted);
    EXPECT_NE(st.error().message().find("max_addresses"), std::string::npos);
    expect_unchanged("address past max_addresses");
  }
  {  // a request id past max_requests, a zero tag
    std::vector<std::uint32_t> far = req_ids;
    far[0] = kMaxRequests;
    PlacementArrays q = p;
    q.new_requests = far.data();
    EXPECT_EQ(step->Place(q, nullptr).error().code(), ErrorCode::kResourceExhausted);
    std::vector<std::uint32_t> zero = tags;
    zero[1] = 0;
    q = p;
    q.seated_tags = zero.data();
    EXPECT_EQ(step->Place(q, nullptr).error().code(), ErrorCode::kInvalidArgument);
    expect_unchanged("bad request id, zero tag");
  }
  {  // counts in memory: without an error to write the device's refusal to, refused on the host
    std::uint32_t counts[4] = {0, 2, 0, 4};
    PlacementArrays q = p;
    q.counts = counts;
    auto st = step->Place(q, nullptr);
    ASSERT_FALSE(st);
    EXPECT_EQ(st.error().code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(st.error().message().find("error must not be null"), std::string::npos);
    expect_unchanged("counts without error");
    // A count one past its capacity (the seats': capacity 4, count 5) is the device's refusal
    // of the whole place: the call is enqueued, the kernel applies nothing, writes no eviction
    // and says why; its CompletePlace publishes nothing. A count at its capacity is not refused
    // (the place below takes all four).
    std::uint32_t error = 0, evictions = 9;
    counts[3] = 5;
    q.error = &error;
    q.num_evictions = &evictions;
    ASSERT_TRUE(step->Place(q, nullptr));
    EXPECT_EQ(error, 1u + static_cast<std::uint32_t>(ErrorCode::kInvalidArgument));
    EXPECT_EQ(evictions, 0u);
    ASSERT_TRUE(step->CompletePlace(status.data(), nullptr));
    expect_unchanged("a count past its capacity");
    counts[3] = 4;
    counts[1] = 3;  // the new requests' (capacity 2)
    ASSERT_TRUE(step->Place(q, nullptr));
    EXPECT_EQ(error, 1u + static_cast<std::uint32_t>(ErrorCode::kInvalidArgument));
    ASSERT_TRUE(step->CompletePlace(status.data(), nullptr));
    expect_unchanged("the new requests' count past its capacity");
  }
  // The step's calls around a pending place, then the place itself, its counts in memory,
  // each at its capacity (every list full: not a refusal).
  std::uint32_t at_capacity[4] = {0, 2, 0, 4}, place_error = 9;
  PlacementArrays full = p;
  full.counts = at_capacity;
  full.error = &place_error;
  EXPECT_EQ(step->CompletePlace(status.data(), nullptr).error().code(), ErrorCode::kFailedPrecondition);
  const DeviceStepCounters counted = step->counters();
  ASSERT_TRUE(step->Place(full, nullptr));
  EXPECT_EQ(place_error, 0u);
  EXPECT_EQ(step->AdvanceRound(nullptr).error().code(), ErrorCode::kFailedPrecondition);
  EXPECT_EQ(step->Place(p, nullptr).error().code(), ErrorCode::kFailedPrecondition);
  ASSERT_TRUE(step->CompletePlace(status.data(), nullptr));
  // docs/ARCHITECTURE.md ("The device step"): one cooperative launch for a Place (whatever
  // its lists hold), one for CompletePlace; no synchronisation and nothing outside the place
  // phase.
  const DeviceStepCounters placed = step->counters().Since(counted);
  EXPECT_EQ(placed.place, (DeviceStepCounts{.launches = 1 + 1, .syncs = 0}));
  EXPECT_EQ(placed.Step(), DeviceStepCounts{});
  EXPECT_EQ(placed.state, DeviceStepCounts{});
  EXPECT_EQ(num_evictions, 0u);
  for (std::uint32_t i = 0; i < 4; ++i) {  // the lowest free device slots, in seat order
    EXPECT_TRUE(location_bits::OnDevice(locations[i]));
    EXPECT_EQ(location_bits::SlotOf(locations[i]), i);
  }
  // Group 1 has no step here: StoreInto of group 0 alone, then the space's group 0 has them.
  ASSERT_TRUE(step->StoreInto(*space, nullptr));
  EXPECT_EQ(space->Lookup(addrs[3], GroupId(0)).value().slot().value(), 3u);
  EXPECT_EQ(space->TakePlacement().value().empty(), true);
  // Outside the mode: TakePlacement and Place refuse.
  auto plain = AddressSpace::Create(Config(false), *backend).value();
  EXPECT_EQ(plain->TakePlacement().error().code(), ErrorCode::kFailedPrecondition);
  auto plain_step = DeviceStep::Create(*plain, Rank(0), GroupId(0), StepConfig()).value();
  EXPECT_EQ(plain_step->Place(p, nullptr).error().code(), ErrorCode::kFailedPrecondition);
}

// Seats past the device's free slots and victims go to host, new on host for the round: a
// step of that round that selects one is refused (its KV was written there), a step of the
// next round moves it.
TEST(DevicePlacement, NewOnHostForOneRound) {
  auto backend = MakeCountingBackend();
  auto space = AddressSpace::Create(Config(true), *backend).value();
  auto step = DeviceStep::Create(*space, Rank(0), GroupId(0), StepConfig()).value();
  ASSERT_TRUE(space->AddRequest(RequestId(1), Rank(0)));
  const auto addrs = space->Allocate(RequestId(1), kDev + 4).value();  // a prefill chunk past the pool
  PlacementBuffers b(kMaxSeats);
  b.Fill(space->TakePlacement().value());
  ASSERT_EQ(b.new_requests, std::vector<std::uint32_t>{1});
  const std::vector<std::uint64_t>& locations = b.locations;
  const std::vector<std::uint8_t>& status = b.status;
  const std::uint32_t& num_evictions = b.num_evictions;
  const PlacementArrays p = b.arrays();
  ASSERT_TRUE(step->Place(p, nullptr));
  ASSERT_TRUE(step->CompletePlace(status.data(), nullptr));
  EXPECT_EQ(num_evictions, 0u);  // every device entry is this round's: no victim
  for (std::uint32_t i = 0; i < kDev + 4; ++i) {
    EXPECT_EQ(location_bits::OnDevice(locations[i]), i < kDev) << i;
    EXPECT_EQ(location_bits::SlotOf(locations[i]), i < kDev ? i : i - kDev) << i;  // the lowest slots, in order
  }
  auto plan = [&](LogicalAddr a) {
    Shape shape;
    shape.top_k = shape.sel_stride = shape.idx_stride = 1;
    DeviceIo io;
    io.Fill(shape, {static_cast<std::int32_t>(a.value())}, {RequestId(1)}, step->max_descriptors());
    EXPECT_TRUE(step->Plan(io.arrays, nullptr));
    EXPECT_TRUE(step->Complete(status.data(), nullptr));
    return io.record;
  };
  const LogicalAddr on_host = addrs[kDev + 1];
  EXPECT_EQ(plan(on_host).error, 1 + static_cast<std::uint32_t>(ErrorCode::kResourceExhausted));
  ASSERT_TRUE(step->AdvanceRound(nullptr));
  const StepRecord next = plan(on_host);  // the next round moves it (a swap with a victim)
  EXPECT_EQ(next.error, 0u);
  EXPECT_EQ(next.misses, 1u);
  EXPECT_EQ(next.evictions, 1u);
  ASSERT_TRUE(step->StoreInto(*space, nullptr));
  EXPECT_TRUE(space->CheckInvariants());
}

// The journal cancels what the device never saw: a seat released and a request freed before
// the take are in neither list; a released placed address is.
TEST(DevicePlacement, JournalCancels) {
  auto backend = MakeCountingBackend();
  auto space = AddressSpace::Create(Config(true), *backend).value();
  ASSERT_TRUE(space->AddRequest(RequestId(1), Rank(0)));
  ASSERT_TRUE(space->Allocate(RequestId(1), 3));
  ASSERT_TRUE(space->Truncate(RequestId(1), 1));
  ASSERT_TRUE(space->AddRequest(RequestId(2), Rank(0)));
  ASSERT_TRUE(space->Allocate(RequestId(2), 2));
  ASSERT_TRUE(space->Free(RequestId(2)));
  PlacementJournal j = space->TakePlacement().value();
  ASSERT_EQ(j.seated[0].size(), 1u);
  ASSERT_EQ(j.new_requests.size(), 1u);
  EXPECT_EQ(j.new_requests[0].id, RequestId(1));
  EXPECT_TRUE(j.released[0].empty());
  EXPECT_TRUE(j.retired.empty());
  ASSERT_TRUE(space->Free(RequestId(1)));
  j = space->TakePlacement().value();
  ASSERT_EQ(j.released[0].size(), 1u);
  ASSERT_EQ(j.retired.size(), 1u);
  EXPECT_TRUE(space->CheckInvariants());
  // The owner tags wrap (2^32 - 2 requests): the host would renumber the tags the device
  // holds, so the request is refused and nothing changes.
  ASSERT_TRUE(space->AddRequest(RequestId(3), Rank(0)));
  StateOf(*space).dir.set_next_tag_for_test(refs::kSharedTag);
  const std::uint64_t before = space->DebugDigest();
  const Status wrapped = space->AddRequest(RequestId(4), Rank(0));
  ASSERT_FALSE(wrapped);
  EXPECT_EQ(wrapped.error().code(), ErrorCode::kResourceExhausted);
  EXPECT_EQ(space->DebugDigest(), before);
  EXPECT_EQ(space->num_requests(), 1u);
}

}  // namespace
}  // namespace ula
