// The device step inside one CUDA graph (ula/device_step.h, "Decode loop"; docs/ARCHITECTURE.md,
// "The device step"): an engine iteration — for every group Check, Claim, the engine's copies
// (a reference copy kernel that reads its descriptor count from device memory) and Complete,
// then every group's AdvanceRound — captured once on a non-blocking stream and replayed N
// times against the OpenMP form running the same iterations call by call. After every replay
// each group's StepRecord, indices, descriptors, state and both pools' bytes equal the OpenMP
// form's, and every selection's index reads its own entry's bytes in every layer. Every CUDA
// call's error is checked (StreamGraph, EnqueueReferenceCopies); the replays are timed by CUDA
// events. scripts/gpu-check.sh runs it on a GPU, where a skip fails the check. Where
// MakeCudaBackend finds no device (or the build has no CUDA) the same harness runs with the
// OpenMP form in place of the graph (see the test), so its checks are themselves checked here.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <functional>
#include <random>
#include <vector>

#include "step/device_io.h"
#include "step/device_step_fixture.h"
#include "step/engine_pools.h"
#include "step/placement_buffers.h"
#include "step/space_fixture.h"
#include "test_seed.h"
#include "ula/device_step.h"
#include "ula/location.h"
#include "ula/location_bits.h"

namespace ula {
namespace {

constexpr std::uint32_t kGroups = 2, kRow = 16;
constexpr std::uint32_t kBatch = 4, kTopK = 16;
constexpr std::uint32_t kDeviceSlots = 96, kHostSlots = 1024;
constexpr int kReplays = 24;
const std::uint32_t kLayers[kGroups] = {2, 1};

std::uint8_t TokenByte(std::uint32_t addr, std::uint32_t group, std::uint32_t layer, std::uint32_t b) {
  return static_cast<std::uint8_t>(addr * 131 + group * 17 + layer * 7 + b);
}

// Four requests of 60 to 90 tokens over several rounds: most of them on host, so that the
// steps fetch, and the device pool fills, so that they swap.
std::unique_ptr<AddressSpace> BuildSpace(Backend& backend) {
  AddressSpaceConfig cfg = testing::EngineModes(testing::SmallConfig(kDeviceSlots, kHostSlots, 1, kGroups, 32));
  cfg.row_bytes = kRow;
  cfg.group_layers = {kLayers[0], kLayers[1]};
  cfg.device_bytes_per_rank = std::uint64_t{kDeviceSlots} * 3 * kRow;
  cfg.host_bytes_per_rank = std::uint64_t{kHostSlots} * 3 * kRow;
  cfg.policy = PolicyKind::kKernelPbLru;
  cfg.policy_options.recent_buckets = 2;
  auto space = AddressSpace::Create(cfg, backend).value();
  for (std::uint32_t r = 0; r < kBatch; ++r) EXPECT_TRUE(space->AddRequest(RequestId(r), Rank(0)));
  for (int round = 0; round < 6; ++round) {
    for (std::uint32_t r = 0; r < kBatch; ++r) EXPECT_TRUE(space->Allocate(RequestId(r), 10 + 5 * r).has_value());
    space->AdvanceRound();
  }
  return space;
}

// One group's arrays in pinned, mapped host memory (the CUDA form's kernels read and write it
// directly), carved from one arena of the cuda backend.
struct PinnedGroup {
  std::int32_t* selections = nullptr;
  std::int64_t* requests = nullptr;
  std::int32_t* indices = nullptr;
  CopyDescriptor* descriptors = nullptr;
  std::uint8_t* status = nullptr;
  StepRecord* record = nullptr;
  kernels::CopyPools pools;
  StepArrays arrays;
};

// The CUDA form's arrays and pools: one pinned, mapped host arena of the cuda backend (the
// kernels read and write it directly), or host memory where there is no device; carved in
// 64-byte pieces, zeroed, the arena destroyed with this.
class PinnedBytes {
 public:
  PinnedBytes(Backend* cuda, std::uint64_t bytes) : cuda_(cuda), bytes_(bytes) {
    if (cuda_ != nullptr) {
      arena_ = cuda_->CreateArena(Tier::kHost, Rank(0), bytes).value();
      std::memset(arena_.data, 0, bytes);
    } else {
      host_.assign(bytes, std::byte{0});
      arena_.data = host_.data();
    }
    next_ = arena_.data;
  }
  ~PinnedBytes() {
    if (cuda_ != nullptr) {
      EXPECT_TRUE(cuda_->DestroyArena(arena_.id));
    }
  }
  PinnedBytes(const PinnedBytes&) = delete;
  PinnedBytes& operator=(const PinnedBytes&) = delete;
  template <class T>
  T* Carve(std::size_t n) {
    std::byte* at = next_;
    next_ += (n * sizeof(T) + 63) / 64 * 64;
    EXPECT_LE(next_, arena_.data + bytes_) << "the arena is too small";
    return reinterpret_cast<T*>(at);
  }

 private:
  Backend* cuda_;
  std::uint64_t bytes_;
  Arena arena_;
  std::vector<std::byte> host_;
  std::byte* next_ = nullptr;
};

// The reference copy kernel's rule on the host (kernels::gpu::ReferenceCopy): the stand-in
// for the graph's copies where no device is, so that the harness below runs everywhere.
void ReferenceCopyOnHost(const StepArrays& step, const kernels::CopyPools& p, std::uint8_t* status) {
  for (std::uint32_t i = 0; i < step.stats->num_descriptors; ++i) {
    const CopyDescriptor& d = step.descriptors[i];
    auto row = [&](std::uint8_t tier, std::uint32_t slot, std::uint32_t l) {
      return (tier == 0 ? p.device : p.host) + (std::size_t{l} * (tier == 0 ? p.device_slots : p.host_slots) + slot) * p.row_bytes;
    };
    for (std::uint32_t l = 0; l < d.num_layers; ++l) {
      unsigned char* src = row(d.src_tier, d.src_slot, l);
      unsigned char* dst = row(d.dst_tier, d.dst_slot, l);
      if (d.op == static_cast<std::uint8_t>(CopyOp::kSwap)) std::swap_ranges(src, src + d.bytes, dst);
      else std::memcpy(dst, src, d.bytes);
    }
    status[i] = 0;
  }
}

// On a GPU (MakeCudaBackend finds one): the CUDA form, its arrays and pools in pinned mapped
// memory, the iteration captured once and replayed. Without one: the same harness with a
// second OpenMP-form step in place of the CUDA one and the iteration's function called in
// place of a replay (it checks the harness and the iteration's order, not a graph; the line
// it prints says which ran).
TEST(DeviceStepCudaGraph, ReplayedIterationsMatchTheOpenMpForm) {
  auto cuda = MakeCudaBackend();
  const bool gpu = cuda.has_value();
  auto backend = MakeCountingBackend();
  auto space = BuildSpace(*backend);
  DeviceStepConfig dc{.max_rows = kBatch, .max_batch = kBatch, .max_top_k = kTopK};
  std::vector<std::unique_ptr<DeviceStep>> ref, dev;
  for (std::uint32_t g = 0; g < kGroups; ++g) {
    ref.push_back(DeviceStep::Create(*space, Rank(0), GroupId(g), dc).value());
    DeviceStepConfig cc = dc;
    cc.cuda = gpu;
    auto made = DeviceStep::Create(*space, Rank(0), GroupId(g), cc);
    ASSERT_TRUE(made) << made.error().ToString();
    dev.push_back(std::move(*made));
  }
  const std::uint32_t nd = dev[0]->max_descriptors();
  ASSERT_EQ(nd, ref[0]->max_descriptors());
  auto io = DeviceIo::Create(gpu, DeviceIoShape{});  // CUDA: a non-blocking stream and the event timer
  ASSERT_TRUE(io) << io.error().ToString();
  void* stream = (*io)->stream();

  // The OpenMP form's engine memory and arrays, and the CUDA form's pinned twins.
  testing::EngineMemory mem;
  for (std::uint32_t g = 0; g < kGroups; ++g) {
    mem[static_cast<int>(Tier::kDevice)].emplace_back(kDeviceSlots, kRow, kLayers[g]);
    mem[static_cast<int>(Tier::kHost)].emplace_back(kHostSlots, kRow, kLayers[g]);
  }
  std::vector<testing::DeviceIo> host_io(kGroups);
  const testing::Shape shape{.batch = kBatch, .q_len = 1, .top_k = kTopK, .sel_stride = kTopK, .idx_stride = kTopK};
  std::vector<RequestId> reqs;
  for (std::uint32_t r = 0; r < kBatch; ++r) reqs.push_back(RequestId(r));
  const std::uint64_t per_group = 4096 + std::uint64_t{kBatch} * kTopK * 8 + kBatch * 8 + nd * (sizeof(CopyDescriptor) + 1) +
                                  sizeof(StepRecord) + std::uint64_t{kDeviceSlots + kHostSlots} * 2 * kRow + 8 * 64;
  PinnedBytes pinned(gpu ? cuda->get() : nullptr, per_group * kGroups);
  std::vector<PinnedGroup> pin(kGroups);
  const std::vector<std::int32_t> no_selections(std::size_t{kBatch} * kTopK, -1);
  for (std::uint32_t g = 0; g < kGroups; ++g) {
    PinnedGroup& p = pin[g];
    p.selections = pinned.Carve<std::int32_t>(std::size_t{kBatch} * kTopK);
    p.requests = pinned.Carve<std::int64_t>(kBatch);
    p.indices = pinned.Carve<std::int32_t>(std::size_t{kBatch} * kTopK);
    p.descriptors = pinned.Carve<CopyDescriptor>(nd);
    p.status = pinned.Carve<std::uint8_t>(nd);
    p.record = pinned.Carve<StepRecord>(1);
    p.pools.device = pinned.Carve<unsigned char>(std::size_t{kDeviceSlots} * kLayers[g] * kRow);
    p.pools.host = pinned.Carve<unsigned char>(std::size_t{kHostSlots} * kLayers[g] * kRow);
    p.pools.device_slots = kDeviceSlots;
    p.pools.host_slots = kHostSlots;
    p.pools.row_bytes = kRow;
    host_io[g].Fill(shape, no_selections, reqs, nd);
    p.arrays = host_io[g].arrays;
    p.arrays.selections = p.selections;
    p.arrays.requests = p.requests;
    p.arrays.indices = p.indices;
    p.arrays.descriptors = p.descriptors;
    p.arrays.stats = p.record;
    for (std::uint32_t b = 0; b < kBatch; ++b) p.requests[b] = b;
    *p.record = StepRecord{};
  }

  // Every live entry's bytes at its location, in both forms' pools.
  for (std::uint32_t g = 0; g < kGroups; ++g) {
    const DeviceStepState s = ref[g]->ReadState(nullptr).value();
    for (std::uint32_t a = 0; a < s.records.size(); ++a) {
      const Location loc = Location::FromBits(s.records[a]);
      if (s.records[a] == 0) continue;
      const bool on_device = loc.tier() == Tier::kDevice;
      testing::EnginePool& pool = mem[static_cast<int>(loc.tier())][g];
      unsigned char* pinned = on_device ? pin[g].pools.device : pin[g].pools.host;
      const std::uint32_t slots = on_device ? kDeviceSlots : kHostSlots;
      for (std::uint32_t l = 0; l < kLayers[g]; ++l) {
        for (std::uint32_t b = 0; b < kRow; ++b) {
          const std::uint8_t v = TokenByte(a, g, l, b);
          pool.Row(loc.slot().value(), l)[b] = std::byte(v);
          pinned[(std::size_t{l} * slots + loc.slot().value()) * kRow + b] = v;
        }
      }
    }
  }

  // The iteration, captured once.
  std::vector<DeviceStepCounters> before;
  for (auto& d : dev) before.push_back(d->counters());
  const std::function<Status()> iteration = [&]() -> Status {
    for (std::uint32_t g = 0; g < kGroups; ++g) {
      ULA_RETURN_IF_ERROR(dev[g]->Check(pin[g].arrays, stream));
      ULA_RETURN_IF_ERROR(dev[g]->Claim(dev[g]->verdict(), stream));
      if (gpu) {
        ULA_RETURN_IF_ERROR(EnqueueReferenceCopies(stream, pin[g].arrays, pin[g].pools, pin[g].status));
      } else {
        ReferenceCopyOnHost(pin[g].arrays, pin[g].pools, pin[g].status);
      }
      ULA_RETURN_IF_ERROR(dev[g]->Complete(pin[g].status, stream));
    }
    for (auto& d : dev) ULA_RETURN_IF_ERROR(d->AdvanceRound(stream));
    return Ok();
  };
  std::unique_ptr<StreamGraph> graph;
  if (gpu) {
    auto captured = StreamGraph::Capture(stream, iteration);
    ASSERT_TRUE(captured) << captured.error().ToString();
    graph = std::move(*captured);
  }
  std::uint64_t step_launches = 0, syncs = 0;
  for (std::uint32_t g = 0; g < kGroups; ++g) {
    const DeviceStepCounters c = dev[g]->counters().Since(before[g]);
    step_launches += c.Step().launches;
    syncs += c.Step().syncs + c.state.syncs;
  }
  EXPECT_EQ(syncs, 0u) << "a synchronisation inside the capture";
  if (!gpu) {
    EXPECT_EQ(step_launches, 0u) << "nothing ran yet";
  }

  ULA_TEST_SEEDED(seed, 20261206);
  std::mt19937_64 rng(seed);
  std::vector<double> ms;
  std::uint64_t misses = 0, evictions = 0, refused = 0, reads = 0;
  for (int it = 0; it < kReplays; ++it) {
    // The next iteration's selections: each request's own addresses, repeats and padding.
    for (std::uint32_t g = 0; g < kGroups; ++g) {
      std::vector<std::int32_t> dense(std::size_t{kBatch} * kTopK, -1);
      for (std::uint32_t b = 0; b < kBatch; ++b) {
        const auto addrs = space->AddressesOf(RequestId(b)).value();
        const std::uint32_t used = kTopK / 2 + static_cast<std::uint32_t>(rng() % (kTopK / 2 + 1));
        for (std::uint32_t c = 0; c < used; ++c) {
          dense[std::size_t{b} * kTopK + c] = static_cast<std::int32_t>(addrs[rng() % addrs.size()].value());
        }
      }
      host_io[g].Fill(shape, dense, reqs, nd);
      std::memcpy(pin[g].selections, host_io[g].selections.data(), host_io[g].selections.size() * 4);
    }
    // The OpenMP form, call by call.
    for (std::uint32_t g = 0; g < kGroups; ++g) {
      testing::DeviceIo& h = host_io[g];
      ASSERT_TRUE(ref[g]->Check(h.arrays, nullptr));
      ASSERT_TRUE(ref[g]->Claim(ref[g]->verdict(), nullptr));
      testing::RunOnEngineMemory(std::span<const CopyDescriptor>(h.descriptors.data(), h.record.num_descriptors), mem);
      const std::vector<std::uint8_t> ok(nd, 0);
      ASSERT_TRUE(ref[g]->Complete(ok.data(), nullptr));
    }
    for (auto& r : ref) ASSERT_TRUE(r->AdvanceRound(nullptr));
    // The CUDA form: one replay.
    ASSERT_TRUE((*io)->Start());
    if (gpu) {
      ASSERT_TRUE(graph->Launch(stream));
    } else {
      ASSERT_TRUE(iteration());
    }
    auto t = (*io)->StopMs();  // waits for the replay
    ASSERT_TRUE(t) << t.error().ToString();
    ms.push_back(*t);
    for (std::uint32_t g = 0; g < kGroups; ++g) {
      const testing::DeviceIo& h = host_io[g];
      const PinnedGroup& p = pin[g];
      const std::string at = "replay " + std::to_string(it) + " group " + std::to_string(g);
      ASSERT_EQ(p.record->done, h.record.done) << at;
      ASSERT_EQ(p.record->error, h.record.error) << at;
      ASSERT_EQ(p.record->hits, h.record.hits) << at;
      ASSERT_EQ(p.record->misses, h.record.misses) << at;
      ASSERT_EQ(p.record->evictions, h.record.evictions) << at;
      ASSERT_EQ(p.record->num_descriptors, h.record.num_descriptors) << at;
      ASSERT_EQ(std::memcmp(p.indices, h.indices.data(), h.indices.size() * 4), 0) << at << ": indices";
      ASSERT_EQ(std::memcmp(p.descriptors, h.descriptors.data(), std::size_t{h.record.num_descriptors} * sizeof(CopyDescriptor)), 0)
          << at << ": descriptors";
      testing::ExpectSameState(ref[g]->ReadState(nullptr).value(), dev[g]->ReadState(stream).value(), at);
      const auto& dpool = mem[static_cast<int>(Tier::kDevice)][g].bytes;
      const auto& hpool = mem[static_cast<int>(Tier::kHost)][g].bytes;
      ASSERT_EQ(std::memcmp(p.pools.device, dpool.data(), dpool.size()), 0) << at << ": device pool bytes";
      ASSERT_EQ(std::memcmp(p.pools.host, hpool.data(), hpool.size()), 0) << at << ": host pool bytes";
      if (h.record.error != 0) {
        ++refused;
        continue;
      }
      // What attention reads: each selection's index, in every layer, holds its entry's bytes.
      for (std::uint32_t j = 0; j < kBatch * kTopK; ++j) {
        const std::int32_t a = h.selections[j];
        if (a < 0) continue;
        const std::int32_t slot = p.indices[j];
        ASSERT_GE(slot, 0) << at;
        for (std::uint32_t l = 0; l < kLayers[g]; ++l) {
          for (std::uint32_t b = 0; b < kRow; ++b) {
            ASSERT_EQ(p.pools.device[(std::size_t{l} * kDeviceSlots + slot) * kRow + b],
                      TokenByte(static_cast<std::uint32_t>(a), g, l, b))
                << at << ": address " << a << " layer " << l;
          }
        }
        ++reads;
      }
      misses += h.record.misses;
      evictions += h.record.evictions;
    }
  }
  EXPECT_GT(misses, 0u) << "the replays fetched nothing: the test would not see a stale count";
  EXPECT_GT(evictions, 0u) << "the replays swapped nothing";
  std::sort(ms.begin(), ms.end());
  if (!gpu) {  // the per-iteration launches, counted as they ran
    step_launches = 0;
    for (std::uint32_t g = 0; g < kGroups; ++g) step_launches += dev[g]->counters().Since(before[g]).Step().launches;
    step_launches /= kReplays;
  }
  std::printf("%s: %u groups, %u step launches + %u copy launches per iteration, %d replays, median %.3f ms per "
              "replay (%s); %llu misses, %llu evictions, %llu refused steps, %llu selections read equal\n",
              gpu ? "graph" : "no device, the OpenMP form uncaptured", kGroups, static_cast<unsigned>(step_launches), kGroups, kReplays, ms[ms.size() / 2], (*io)->timing_source(),
              static_cast<unsigned long long>(misses), static_cast<unsigned long long>(evictions),
              static_cast<unsigned long long>(refused), static_cast<unsigned long long>(reads));
}

// Device placement inside the graph: an iteration of Place (its counts in memory,
// PlacementArrays::counts), the engine's eviction copies (the reference copy kernel, the count
// read from *num_evictions on the device), CompletePlace and AdvanceRound, captured once and
// replayed while requests arrive, decode and finish on the host (their journal copied into the
// same pinned buffers before each replay), against the OpenMP form given each journal's
// counts by value. After every replay: the same error (0), evictions, locations, state and
// pool bytes, and every live address's bytes at its location. Without a device, the same
// harness with an OpenMP-form step in place of the graph.
void CopyOnHost(const CopyDescriptor* descriptors, std::uint32_t count, const kernels::CopyPools& p, std::uint8_t* status) {
  StepRecord record;
  record.num_descriptors = count;
  StepArrays step;
  step.descriptors = const_cast<CopyDescriptor*>(descriptors);
  step.stats = &record;
  ReferenceCopyOnHost(step, p, status);
}

TEST(DeviceStepCudaGraph, PlaceReplaysWithCountsInMemory) {
  constexpr std::uint32_t kDev = 48, kHost = 1024, kSeats = 64, kReleases = 512, kRequestChanges = 16;
  constexpr std::uint32_t kLive = 6;  // requests at once
  auto cuda = MakeCudaBackend();
  const bool gpu = cuda.has_value();
  auto backend = MakeCountingBackend();
  AddressSpaceConfig cfg = testing::EngineModes(testing::SmallConfig(kDev, kHost, 1, 1, kRow));
  cfg.policy = PolicyKind::kKernelPbLru;
  cfg.policy_options.recent_buckets = 2;
  cfg.device_placement = true;
  auto space = AddressSpace::Create(cfg, *backend).value();
  DeviceStepConfig dc{.max_rows = 1, .max_batch = 1, .max_top_k = 1, .max_addresses = 4096, .max_requests = 64,
                      .max_place_seats = kSeats, .max_place_releases = kReleases,
                      .max_place_requests = kRequestChanges};
  auto ref = DeviceStep::Create(*space, Rank(0), GroupId(0), dc).value();
  DeviceStepConfig cc = dc;
  cc.cuda = gpu;
  auto made = DeviceStep::Create(*space, Rank(0), GroupId(0), cc);
  ASSERT_TRUE(made) << made.error().ToString();
  std::unique_ptr<DeviceStep> dev = std::move(*made);
  auto io = DeviceIo::Create(gpu, DeviceIoShape{});
  ASSERT_TRUE(io) << io.error().ToString();
  void* stream = (*io)->stream();

  // The CUDA form's arrays and pools in pinned mapped memory (host memory without a device).
  const std::size_t bytes = 4096 + std::size_t{kRequestChanges} * 12 + std::size_t{kReleases} * 4 + std::size_t{kSeats} * 8 +
                            16 + std::size_t{kSeats} * (8 + sizeof(CopyDescriptor) + 1) + 64 +
                            std::size_t{kDev + kHost} * kRow + 20 * 64;
  PinnedBytes pinned(gpu ? cuda->get() : nullptr, bytes);
  auto u32 = [&](std::size_t n) { return pinned.Carve<std::uint32_t>(n); };
  std::uint32_t *retired = u32(kRequestChanges), *new_requests = u32(kRequestChanges), *new_tags = u32(kRequestChanges);
  std::uint32_t *released = u32(kReleases), *seated = u32(kSeats), *seated_tags = u32(kSeats);
  std::uint32_t *counts = u32(4), *error = u32(1), *num_evictions = u32(1);
  auto* locations = pinned.Carve<std::uint64_t>(kSeats);
  auto* evictions = pinned.Carve<CopyDescriptor>(kSeats);
  auto* status = pinned.Carve<std::uint8_t>(kSeats);
  kernels::CopyPools pools;
  pools.device = pinned.Carve<unsigned char>(std::size_t{kDev} * kRow);
  pools.host = pinned.Carve<unsigned char>(std::size_t{kHost} * kRow);
  pools.device_slots = kDev;
  pools.host_slots = kHost;
  pools.row_bytes = kRow;
  const PlacementArrays fixed{.retired = retired, .new_requests = new_requests, .new_tags = new_tags,
                              .released = released, .seated = seated, .seated_tags = seated_tags,
                              .num_retired = kRequestChanges, .num_new_requests = kRequestChanges,
                              .num_released = kReleases, .num_seated = kSeats, .locations = locations,
                              .evictions = evictions, .num_evictions = num_evictions, .counts = counts,
                              .error = error};
  // The OpenMP form's pools (the reference).
  std::vector<unsigned char> ref_dev(std::size_t{kDev} * kRow), ref_host(std::size_t{kHost} * kRow);
  const kernels::CopyPools ref_pools{.device = ref_dev.data(), .host = ref_host.data(), .device_slots = kDev,
                                     .host_slots = kHost, .row_bytes = kRow};

  const std::function<Status()> iteration = [&]() -> Status {
    ULA_RETURN_IF_ERROR(dev->Place(fixed, stream));
    if (gpu) {
      ULA_RETURN_IF_ERROR(EnqueueReferenceCopies(stream, fixed, kSeats, pools, status));
    } else {
      CopyOnHost(evictions, *num_evictions, pools, status);
    }
    ULA_RETURN_IF_ERROR(dev->CompletePlace(status, stream));
    return dev->AdvanceRound(stream);
  };
  std::unique_ptr<StreamGraph> graph;
  DeviceStepCounters before = dev->counters();
  if (gpu) {
    auto captured = StreamGraph::Capture(stream, iteration);
    ASSERT_TRUE(captured) << captured.error().ToString();
    graph = std::move(*captured);
  }
  // Counted once at capture on a GPU (the replays enqueue nothing through the step), per
  // iteration as they ran without one.
  const DeviceStepCounters captured = dev->counters().Since(before);
  before = dev->counters();

  ULA_TEST_SEEDED(seed, 20261211);
  std::mt19937_64 rng(seed);
  struct Live {
    RequestId id;
    std::uint32_t left;
  };
  std::vector<Live> live;
  std::uint32_t next_id = 0;
  std::vector<std::uint32_t> stamp(4096, 0);  // the replay that wrote each address's bytes
  auto byte_of = [](std::uint32_t addr, std::uint32_t version, std::uint32_t b) {
    return static_cast<unsigned char>(addr * 29 + version * 13 + b);
  };
  std::vector<double> ms;
  std::uint64_t seats = 0, evicted = 0, releases = 0, reads = 0;
  for (int it = 1; it <= kReplays; ++it) {
    // The host: finished requests leave, new ones arrive with a prefill chunk, the others
    // decode one token.
    for (std::size_t i = 0; i < live.size();) {
      if (live[i].left == 0) {
        releases += space->AddressesOf(live[i].id).value().size();
        ASSERT_TRUE(space->Free(live[i].id));
        live.erase(live.begin() + static_cast<std::ptrdiff_t>(i));
      } else {
        ++i;
      }
    }
    std::vector<std::uint32_t> chunk(live.size(), 1);
    while (live.size() < kLive && rng() % 2 == 0) {
      const RequestId id(next_id++ % 64);
      ASSERT_TRUE(space->AddRequest(id, Rank(0)));
      live.push_back({id, static_cast<std::uint32_t>(3 + rng() % 12)});
      chunk.push_back(static_cast<std::uint32_t>(1 + rng() % 12));
    }
    for (std::size_t i = 0; i < live.size(); ++i) {
      ASSERT_TRUE(space->Allocate(live[i].id, chunk[i]));
      --live[i].left;
    }
    PlacementBuffers b(kSeats);
    b.Fill(space->TakePlacement().value());
    ASSERT_LE(b.retired.size(), kRequestChanges);
    ASSERT_LE(b.new_requests.size(), kRequestChanges);
    ASSERT_LE(b.released.size(), kReleases);
    ASSERT_LE(b.seated.size(), kSeats);
    auto put = [](std::uint32_t* to, const std::vector<std::uint32_t>& from) {
      std::copy(from.begin(), from.end(), to);
    };
    put(retired, b.retired), put(new_requests, b.new_requests), put(new_tags, b.new_tags);
    put(released, b.released), put(seated, b.seated), put(seated_tags, b.seated_tags);
    std::copy(b.counts, b.counts + 4, counts);
    *error = 7;
    // The OpenMP form, counts by value.
    ASSERT_TRUE(ref->Place(b.arrays(), nullptr));
    CopyOnHost(b.evictions.data(), b.num_evictions, ref_pools, b.status.data());
    ASSERT_TRUE(ref->CompletePlace(b.status.data(), nullptr));
    ASSERT_TRUE(ref->AdvanceRound(nullptr));
    // The CUDA form: one replay.
    ASSERT_TRUE((*io)->Start());
    if (gpu) {
      ASSERT_TRUE(graph->Launch(stream));
    } else {
      ASSERT_TRUE(iteration());
    }
    auto t = (*io)->StopMs();
    ASSERT_TRUE(t) << t.error().ToString();
    ms.push_back(*t);
    const std::string at = "replay " + std::to_string(it);
    ASSERT_EQ(*error, 0u) << at;
    ASSERT_EQ(*num_evictions, b.num_evictions) << at;
    ASSERT_EQ(std::memcmp(locations, b.locations.data(), b.seated.size() * 8), 0) << at << ": locations";
    ASSERT_EQ(std::memcmp(evictions, b.evictions.data(), std::size_t{b.num_evictions} * sizeof(CopyDescriptor)), 0)
        << at << ": evictions";
    const DeviceStepState want = ref->ReadState(nullptr).value(), got = dev->ReadState(stream).value();
    testing::ExpectSameState(want, got, at);
    ASSERT_EQ(want.owner, got.owner) << at;
    ASSERT_EQ(want.request_tags, got.request_tags) << at;
    ASSERT_EQ(std::memcmp(pools.device, ref_dev.data(), ref_dev.size()), 0) << at << ": device pool bytes";
    ASSERT_EQ(std::memcmp(pools.host, ref_host.data(), ref_host.size()), 0) << at << ": host pool bytes";
    seats += b.seated.size();
    evicted += b.num_evictions;
    // The engine writes the new tokens' KV at their locations (both forms' pools).
    for (std::size_t i = 0; i < b.seated.size(); ++i) {
      const std::uint64_t loc = b.locations[i];
      ASSERT_NE(loc, 0u) << at << ": seat " << i;
      const bool on_device = location_bits::OnDevice(loc);
      const std::size_t off = std::size_t{location_bits::SlotOf(loc)} * kRow;
      stamp[b.seated[i]] = static_cast<std::uint32_t>(it);
      for (std::uint32_t x = 0; x < kRow; ++x) {
        const unsigned char v = byte_of(b.seated[i], static_cast<std::uint32_t>(it), x);
        (on_device ? pools.device : pools.host)[off + x] = v;
        (on_device ? ref_dev.data() : ref_host.data())[off + x] = v;
      }
    }
    // Every live address's bytes at its location (the evictions moved real bytes).
    for (std::uint32_t a = 0; a < got.records.size(); ++a) {
      if (got.records[a] == 0 || got.owner[a] == 0) continue;
      const std::uint64_t loc = location_bits::Of(got.records[a]);
      const bool on_device = location_bits::OnDevice(loc);
      const unsigned char* row = (on_device ? pools.device : pools.host) + std::size_t{location_bits::SlotOf(loc)} * kRow;
      for (std::uint32_t x = 0; x < kRow; ++x) ASSERT_EQ(row[x], byte_of(a, stamp[a], x)) << at << ": address " << a;
      ++reads;
    }
  }
  EXPECT_GT(evicted, 0u) << "the replays evicted nothing: the count read on the device was never tested";
  EXPECT_GT(releases, 0u) << "no request finished";
  const DeviceStepCounters used = dev->counters().Since(before);
  EXPECT_EQ(used.place.syncs + used.Step().syncs + captured.place.syncs + captured.Step().syncs, 0u);
  const std::uint64_t place_launches = gpu ? captured.place.launches : used.place.launches / kReplays;
  const std::uint64_t step_launches = gpu ? captured.Step().launches : used.Step().launches / kReplays;
  EXPECT_EQ(place_launches, 2u) << "Place and CompletePlace: one cooperative launch each";
  EXPECT_EQ(step_launches, 1u) << "AdvanceRound";
  std::sort(ms.begin(), ms.end());
  std::printf("%s: %llu place launches (Place, CompletePlace) + %llu step launch (AdvanceRound) + 1 copy launch per "
              "iteration, %d replays, median %.3f ms per replay (%s); %llu seats, %llu evictions, %llu releases, %llu live "
              "entries read equal\n",
              gpu ? "graph place" : "no device, the OpenMP form uncaptured (place)",
              static_cast<unsigned long long>(place_launches), static_cast<unsigned long long>(step_launches), kReplays,
              ms[ms.size() / 2], (*io)->timing_source(), static_cast<unsigned long long>(seats),
              static_cast<unsigned long long>(evicted), static_cast<unsigned long long>(releases),
              static_cast<unsigned long long>(reads));
}

// A capture whose enqueue fails returns that error and leaves the stream out of capture mode
// (a second capture on it succeeds and replays); without CUDA (a build without it, or no
// device) the capture is refused with kFailedPrecondition before anything runs. Bad
// arguments to the reference copies are refused in every build.
TEST(DeviceStepGraph, AFailedCaptureLeavesTheStreamUsable) {
  const kernels::CopyPools none;
  StepArrays empty;
  EXPECT_EQ(EnqueueReferenceCopies(nullptr, empty, none, nullptr).error().code(), ErrorCode::kInvalidArgument);
  bool ran = false;
  const auto planted = [&]() -> Status {
    ran = true;
    return MakeError(ErrorCode::kInternal, "planted");
  };
  if (!MakeCudaBackend()) {
    auto graph = StreamGraph::Capture(nullptr, planted);
    ASSERT_FALSE(graph);
    EXPECT_EQ(graph.error().code(), ErrorCode::kFailedPrecondition) << graph.error().ToString();
    EXPECT_FALSE(ran) << "nothing is enqueued without CUDA";
    return;
  }
  auto io = DeviceIo::Create(true, DeviceIoShape{});
  ASSERT_TRUE(io) << io.error().ToString();
  auto failed = StreamGraph::Capture((*io)->stream(), planted);
  ASSERT_FALSE(failed);
  EXPECT_TRUE(ran);
  EXPECT_EQ(failed.error().code(), ErrorCode::kInternal) << "the enqueue's own error: " << failed.error().ToString();
  auto graph = StreamGraph::Capture((*io)->stream(), [] { return Ok(); });
  ASSERT_TRUE(graph) << "the stream is still capturing: " << graph.error().ToString();
  ASSERT_TRUE((*graph)->Launch((*io)->stream()));
  ASSERT_TRUE((*io)->Start());
  EXPECT_TRUE((*io)->StopMs());
}

}  // namespace
}  // namespace ula
