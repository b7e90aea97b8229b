// CopyPublish (backend/copy_publish.h) on its own, over a fault-injecting cpu backend whose
// batches run only when a wait reaches their fence: each batch is waited on its own fence,
// a failed batch reports failed and publishes nothing, a failed copy's slot is reclaimed,
// a failed swap's victim keeps its bytes, and the error names each failed batch.
#include "backend/copy_publish.h"

#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "backend/fault_backend.h"

namespace ula {
namespace {

constexpr std::uint32_t kBytes = 8;
constexpr std::uint32_t kSlots = 8;

// Host and device arenas of rank 0: host slot s holds bytes 0x10 + s, device slot s 0x80 + s.
// Moves: copies host 0.. -> device 0..; swaps host 4.. <-> device 4...
struct Fixture {
  std::unique_ptr<Backend> inner = MakeCpuBackend({.copy_threads = 1});
  std::unique_ptr<FaultInjectingBackend> fb;
  Arena host, device;

  explicit Fixture(FaultPlan plan) {
    plan.delay = std::chrono::microseconds(1);  // a batch runs only when a wait reaches its fence
    fb = MakeFaultInjectingBackend(*inner, plan).value();
    host = fb->CreateArena(Tier::kHost, Rank(0), kSlots * kBytes).value();
    device = fb->CreateArena(Tier::kDevice, Rank(0), kSlots * kBytes).value();
    for (std::uint32_t s = 0; s < kSlots; ++s) {
      std::memset(host.data + s * kBytes, 0x10 + s, kBytes);
      std::memset(device.data + s * kBytes, 0x80 + s, kBytes);
    }
  }
  ~Fixture() {
    fb->WaitAll();
    (void)fb->DestroyArena(host.id);
    (void)fb->DestroyArena(device.id);
  }
  CopyPublish Make(std::size_t copies, std::size_t swaps) {
    CopyPublish cp(host.id, device.id, kBytes, copies, swaps);
    for (std::size_t i = 0; i < copies; ++i) cp.Add({i * kBytes, i * kBytes});
    for (std::size_t i = 0; i < swaps; ++i) cp.Add({(4 + i) * kBytes, (4 + i) * kBytes});
    return cp;
  }
  int DeviceByte(std::uint32_t s) const { return static_cast<int>(device.data[s * kBytes]); }
  int HostByte(std::uint32_t s) const { return static_cast<int>(host.data[s * kBytes]); }
};

struct Outcome {
  std::vector<std::size_t> published, reclaimed;
};

Outcome Publish(const CopyPublish& cp) {
  Outcome o;
  std::vector<bool> swaps;
  const std::size_t n = PublishArrived(
      cp,
      [&](std::size_t i, bool swap) {
        o.published.push_back(i);
        swaps.push_back(swap);
      },
      [&](std::size_t i) { o.reclaimed.push_back(i); });
  EXPECT_EQ(n, o.published.size());
  for (std::size_t k = 0; k < swaps.size(); ++k) EXPECT_EQ(swaps[k], cp.is_swap(o.published[k]));
  return o;
}

TEST(CopyPublish, BothBatchesArriveBeforeRunReturns) {
  Fixture f(FaultPlan{});
  f.fb->set_armed(false);
  CopyPublish cp = f.Make(2, 3);
  EXPECT_EQ(cp.bytes_moved(), (2 + 2 * 3) * kBytes);
  cp.Run(*f.fb);
  EXPECT_TRUE(cp.all_arrived());
  // The bytes of both batches are there when Run returns (each batch waited on).
  for (std::uint32_t s = 0; s < 2; ++s) EXPECT_EQ(f.DeviceByte(s), 0x10 + static_cast<int>(s));
  for (std::uint32_t s = 4; s < 7; ++s) {
    EXPECT_EQ(f.DeviceByte(s), 0x10 + static_cast<int>(s));
    EXPECT_EQ(f.HostByte(s), 0x80 + static_cast<int>(s));
  }
  const Outcome o = Publish(cp);
  EXPECT_EQ(o.published, (std::vector<std::size_t>{0, 1, 2, 3, 4}));
  EXPECT_TRUE(o.reclaimed.empty());
}

TEST(CopyPublish, FailedSwapAtItsWaitPublishesOnlyTheCopies) {
  Fixture f(FaultPlan{.fail_every_nth = 1, .copies = false, .at_submit = false});
  CopyPublish cp = f.Make(2, 3);
  cp.Run(*f.fb);
  EXPECT_TRUE(cp.copies_arrived());
  EXPECT_FALSE(cp.swaps_arrived());
  EXPECT_FALSE(cp.all_arrived());
  EXPECT_EQ(f.fb->stats().waits_failed, 1u);
  for (std::uint32_t s = 4; s < 7; ++s) {  // the victims keep their bytes, the entries theirs
    EXPECT_EQ(f.DeviceByte(s), 0x80 + static_cast<int>(s));
    EXPECT_EQ(f.HostByte(s), 0x10 + static_cast<int>(s));
  }
  const Outcome o = Publish(cp);
  EXPECT_EQ(o.published, (std::vector<std::size_t>{0, 1}));
  EXPECT_TRUE(o.reclaimed.empty());  // a failed swap reclaims nothing: its victims stay
  const Error e = cp.Failure("rank 0 group 0");
  EXPECT_EQ(e.code(), ErrorCode::kIo);
  EXPECT_EQ(e.message().rfind("rank 0 group 0: host<->device swap of 3 entries failed (injected fault", 0), 0u)
      << e.message();
  EXPECT_EQ(e.message().find("host->device copy"), std::string::npos) << e.message();
}

TEST(CopyPublish, FailedCopyAtSubmitIsReclaimedAndTheSwapsPublished) {
  Fixture f(FaultPlan{.fail_every_nth = 1, .swaps = false, .at_wait = false});
  CopyPublish cp = f.Make(3, 2);
  cp.Run(*f.fb);
  EXPECT_FALSE(cp.copies_arrived());
  EXPECT_TRUE(cp.swaps_arrived());
  for (std::uint32_t s = 4; s < 6; ++s) EXPECT_EQ(f.DeviceByte(s), 0x10 + static_cast<int>(s));
  const Outcome o = Publish(cp);
  EXPECT_EQ(o.published, (std::vector<std::size_t>{3, 4}));
  EXPECT_EQ(o.reclaimed, (std::vector<std::size_t>{0, 1, 2}));
  const Error e = cp.Failure("ctx");
  EXPECT_EQ(e.message().rfind("ctx: host->device copy of 3 entries failed (injected fault", 0), 0u) << e.message();
  EXPECT_EQ(e.message().find("swap"), std::string::npos) << e.message();
}

TEST(CopyPublish, FailedCopyAtItsWaitIsNotHiddenByTheSwapsWait) {
  // The swap batch's wait also completes the earlier copy batch, but reports only its own
  // outcome: the copy's failure is seen only on the copy's own fence.
  Fixture f(FaultPlan{.fail_every_nth = 1, .partial = true, .swaps = false, .at_submit = false});
  CopyPublish cp = f.Make(3, 2);
  cp.Run(*f.fb);
  EXPECT_FALSE(cp.copies_arrived());
  EXPECT_TRUE(cp.swaps_arrived());
  const Outcome o = Publish(cp);
  EXPECT_EQ(o.published, (std::vector<std::size_t>{3, 4}));
  EXPECT_EQ(o.reclaimed, (std::vector<std::size_t>{0, 1, 2}));
}

TEST(CopyPublish, BothFailedAreNamed) {
  Fixture f(FaultPlan{.fail_every_nth = 1});
  CopyPublish cp = f.Make(1, 2);
  cp.Run(*f.fb);
  EXPECT_FALSE(cp.copies_arrived());
  EXPECT_FALSE(cp.swaps_arrived());
  const Outcome o = Publish(cp);
  EXPECT_TRUE(o.published.empty());
  EXPECT_EQ(o.reclaimed, (std::vector<std::size_t>{0}));
  const std::string m = cp.Failure("ctx").message();
  EXPECT_NE(m.find("ctx: host->device copy of 1 entries failed (injected fault"), std::string::npos) << m;
  EXPECT_NE(m.find("; host<->device swap of 2 entries failed (injected fault"), std::string::npos) << m;
}

TEST(CopyPublish, EmptyBatchesAreNotSubmitted) {
  Fixture f(FaultPlan{.fail_every_nth = 1});  // any submitted batch would fail
  CopyPublish none = f.Make(0, 0);
  none.Run(*f.fb);
  EXPECT_TRUE(none.all_arrived());
  CopyPublish swaps_only = f.Make(0, 2);
  swaps_only.Run(*f.fb);
  EXPECT_TRUE(swaps_only.copies_arrived());
  EXPECT_FALSE(swaps_only.swaps_arrived());
  EXPECT_EQ(f.fb->stats().operations, 1u);
}

}  // namespace
}  // namespace ula
