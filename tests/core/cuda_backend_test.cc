// The cuda backend (ula/backend.h, MakeCudaBackend) against the cpu backend, on a GPU. Every
// test is skipped where MakeCudaBackend finds no device; scripts/gpu-check.sh runs this
// program on the GPU machine and fails when any test is skipped there. The tests use only
// as many GPUs as the machine has (one H200 there): what needs two is checked where there
// are two and otherwise checked for its one-GPU answer, never skipped.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstring>
#include <numeric>
#include <random>
#include <thread>

#include "test_seed.h"
#include "ula/backend.h"

namespace ula {
namespace {

std::unique_ptr<Backend> CudaOrSkip(std::string* why) {
  auto b = MakeCudaBackend();
  if (!b) {
    *why = b.error().ToString();
    return nullptr;
  }
  return std::move(*b);
}

#define ULA_CUDA_BACKEND_OR_SKIP(name)                       \
  std::string name##_why;                                    \
  auto name = CudaOrSkip(&name##_why);                       \
  if (!name) GTEST_SKIP() << "no CUDA device: " << name##_why

int CurrentDevice() {
  int d = -1;
  EXPECT_EQ(cudaGetDevice(&d), cudaSuccess);
  return d;
}

// The probe scripts/gpu-check.sh reads: the device, driver and runtime it found. The driver and
// runtime versions are printed before the skip, so that a machine whose driver is older than
// the runtime (cudaErrorInsufficientDriver with a driver > 0) is told from one with no driver
// (driver 0).
TEST(CudaBackend, FindsTheGpu) {
  int driver = 0, runtime = 0;
  if (cudaDriverGetVersion(&driver) != cudaSuccess) driver = 0;
  if (cudaRuntimeGetVersion(&runtime) != cudaSuccess) runtime = 0;
  std::printf("cuda versions: driver %d, runtime %d\n", driver, runtime);
  ULA_CUDA_BACKEND_OR_SKIP(cuda);
  int devices = 0;
  ASSERT_EQ(cudaGetDeviceCount(&devices), cudaSuccess);
  ASSERT_EQ(cudaDriverGetVersion(&driver), cudaSuccess);
  ASSERT_EQ(cudaRuntimeGetVersion(&runtime), cudaSuccess);
  for (int d = 0; d < devices; ++d) {
    cudaDeviceProp prop{};
    ASSERT_EQ(cudaGetDeviceProperties(&prop, d), cudaSuccess);
    std::printf("gpu %d: %s, sm_%d%d, %.1f GiB; driver %d, runtime %d\n", d, prop.name, prop.major, prop.minor,
                static_cast<double>(prop.totalGlobalMem) / (1u << 30), driver, runtime);
  }
  EXPECT_GE(devices, 1);
}

// Random copy and swap batches, 656-byte rows (the gather kernel) and 1 MiB rows (the copy
// engine), host <-> device and device <-> device: the same bytes as the cpu backend, read
// back through a device -> host batch.
TEST(CudaBackend, MatchesTheCpuBackendOnRandomBatches) {
  ULA_TEST_SEEDED(seed, 44);  // before the skip: a malformed ULA_TEST_SEED fails here too
  ULA_CUDA_BACKEND_OR_SKIP(cuda);
  auto cpu = MakeCpuBackend();
  std::mt19937 rng(static_cast<std::uint32_t>(seed));
  for (const std::uint32_t row : {656u, 1u << 20}) {
    const std::uint32_t rows = row == 656u ? 512 : 8;
    const std::uint64_t bytes = std::uint64_t{row} * rows;
    struct Pair {
      Arena host, dev;
    };
    auto make = [&](Backend& b) {
      return Pair{b.CreateArena(Tier::kHost, Rank(0), bytes).value(), b.CreateArena(Tier::kDevice, Rank(0), bytes).value()};
    };
    const Pair c = make(*cpu), g = make(*cuda);
    const Arena back = cuda->CreateArena(Tier::kHost, Rank(0), bytes).value();
    for (std::uint64_t i = 0; i < bytes; ++i) c.host.data[i] = g.host.data[i] = std::byte((i * 131 + i / row) & 0xff);
    Fence last_cpu = 0, last_cuda = 0;
    for (int round = 0; round < 40; ++round) {
      std::vector<std::uint32_t> perm(rows);
      std::iota(perm.begin(), perm.end(), 0u);
      std::shuffle(perm.begin(), perm.end(), rng);
      const std::uint32_t k = 1 + rng() % (rows / 2);
      const int kind = static_cast<int>(rng() % 4);  // 0 H->D, 1 D->H, 2 D->D, 3 swap H<->D or D<->D
      const bool swap = kind == 3;
      const bool same_arena = kind == 2 || (swap && rng() % 2 == 0);
      CopyBatch bc, bg;
      bc.bytes_per_move = bg.bytes_per_move = row;
      bc.swap = bg.swap = swap;
      for (std::uint32_t i = 0; i < k; ++i) {
        // Sources perm[0, k), destinations perm[k, 2k): no slot twice in a batch.
        const SlotMove m{std::uint64_t{perm[i]} * row, std::uint64_t{perm[k + i]} * row};
        bc.moves.push_back(m);
        bg.moves.push_back(m);
      }
      const bool from_host = kind == 0 || (swap && !same_arena);
      bc.src = same_arena || !from_host ? c.dev.id : c.host.id;
      bc.dst = kind == 1 ? c.host.id : c.dev.id;
      bg.src = same_arena || !from_host ? g.dev.id : g.host.id;
      bg.dst = kind == 1 ? g.host.id : g.dev.id;
      auto fc = cpu->Submit(bc);
      auto fg = cuda->Submit(bg);
      ASSERT_TRUE(fc) << fc.error().ToString();
      ASSERT_TRUE(fg) << fg.error().ToString();
      last_cpu = *fc;
      last_cuda = *fg;
      if (round % 8 == 7) {
        ASSERT_TRUE(cpu->Wait(last_cpu));
        ASSERT_TRUE(cuda->Wait(last_cuda));
        auto f = cuda->Submit(CopyBatch{g.dev.id, back.id, static_cast<std::uint32_t>(bytes), false, {{0, 0}}});
        ASSERT_TRUE(f) << f.error().ToString();
        ASSERT_TRUE(cuda->Wait(*f));
        ASSERT_EQ(std::memcmp(back.data, c.dev.data, bytes), 0) << "device arena, row " << row << ", round " << round;
        ASSERT_EQ(std::memcmp(g.host.data, c.host.data, bytes), 0) << "host arena, row " << row << ", round " << round;
      }
    }
    EXPECT_EQ(cuda->counters().batches, cpu->counters().batches + 5) << "the read-back batches";
    for (const Arena& a : {g.host, g.dev, back}) ASSERT_TRUE(cuda->DestroyArena(a.id));
    for (const Arena& a : {c.host, c.dev}) ASSERT_TRUE(cpu->DestroyArena(a.id));
    cpu->ResetCounters();
    cuda->ResetCounters();
  }
}

// No call changes the calling thread's current device, whichever GPU runs the batch.
TEST(CudaBackend, KeepsTheCallersCurrentDevice) {
  ULA_CUDA_BACKEND_OR_SKIP(cuda);
  int devices = 0;
  ASSERT_EQ(cudaGetDeviceCount(&devices), cudaSuccess);
  for (int current = 0; current < devices; ++current) {
    ASSERT_EQ(cudaSetDevice(current), cudaSuccess);
    const Rank other(static_cast<std::uint32_t>(devices - 1 - current));
    auto dev = cuda->CreateArena(Tier::kDevice, other, 4096).value();
    EXPECT_EQ(CurrentDevice(), current) << "CreateArena on GPU " << other.value();
    auto host = cuda->CreateArena(Tier::kHost, other, 4096).value();
    auto f = cuda->Submit(CopyBatch{host.id, dev.id, 656, false, {{0, 656}}});
    ASSERT_TRUE(f) << f.error().ToString();
    EXPECT_EQ(CurrentDevice(), current) << "Submit on GPU " << other.value();
    ASSERT_TRUE(cuda->Wait(*f));
    ASSERT_TRUE(cuda->DestroyArena(dev.id));
    ASSERT_TRUE(cuda->DestroyArena(host.id));
    EXPECT_EQ(CurrentDevice(), current) << "Wait / DestroyArena";
  }
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
}

// Bad batches are refused at Submit and change nothing: no bytes, no counters.
TEST(CudaBackend, RefusesBadBatchesAndChangesNothing) {
  ULA_CUDA_BACKEND_OR_SKIP(cuda);
  int devices = 0;
  ASSERT_EQ(cudaGetDeviceCount(&devices), cudaSuccess);
  auto no_gpu = cuda->CreateArena(Tier::kDevice, Rank(static_cast<std::uint32_t>(devices)), 64);
  ASSERT_FALSE(no_gpu);
  EXPECT_EQ(no_gpu.error().code(), ErrorCode::kOutOfRange);
  auto dev = cuda->CreateArena(Tier::kDevice, Rank(0), 4096).value();
  auto host = cuda->CreateArena(Tier::kHost, Rank(0), 4096).value();
  std::memset(host.data, 0x5a, 4096);
  auto r = cuda->Submit(CopyBatch{dev.id, host.id, 656, false, {{0, 0}, {3500, 656}}});
  ASSERT_FALSE(r);
  EXPECT_EQ(cuda->counters().batches, 0u);
  cuda->WaitAll();
  for (int i = 0; i < 4096; ++i) ASSERT_EQ(host.data[i], std::byte(0x5a)) << "byte " << i;
  if (devices >= 2) {  // a swap between GPUs without peer access: kUnsupported
    auto no_peer = MakeCudaBackend({.peer_access = false}).value();
    auto a = no_peer->CreateArena(Tier::kDevice, Rank(0), 4096).value();
    auto b = no_peer->CreateArena(Tier::kDevice, Rank(1), 4096).value();
    auto s = no_peer->Submit(CopyBatch{a.id, b.id, 656, true, {{0, 0}}});
    ASSERT_FALSE(s);
    EXPECT_EQ(s.error().code(), ErrorCode::kUnsupported);
    auto c = no_peer->Submit(CopyBatch{a.id, b.id, 656, false, {{0, 0}}});  // a copy falls back
    ASSERT_TRUE(c) << c.error().ToString();
    ASSERT_TRUE(no_peer->Wait(*c));
    ASSERT_TRUE(no_peer->DestroyArena(a.id));
    ASSERT_TRUE(no_peer->DestroyArena(b.id));
  }
  ASSERT_TRUE(cuda->DestroyArena(dev.id));
  ASSERT_TRUE(cuda->DestroyArena(host.id));
}

// Threads submitting and waiting at once (Wait waits outside the backend's lock; the fence
// events come from a pool): every thread's bytes land, every fence is waited on.
TEST(CudaBackend, ManyThreadsSubmittingAndWaiting) {
  ULA_CUDA_BACKEND_OR_SKIP(cuda);
  constexpr std::uint64_t kRegion = 64 * 656;
  auto dev = cuda->CreateArena(Tier::kDevice, Rank(0), 4 * kRegion).value();
  auto host = cuda->CreateArena(Tier::kHost, Rank(0), 4 * kRegion).value();
  auto out = cuda->CreateArena(Tier::kHost, Rank(0), 4 * kRegion).value();
  for (std::uint64_t i = 0; i < 4 * kRegion; ++i) host.data[i] = std::byte((i * 7 + 3) & 0xff);
  std::vector<std::thread> threads;
  for (std::uint64_t t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (std::uint64_t i = 0; i < 200; ++i) {
        const std::uint64_t at = t * kRegion + (i % 64) * 656;
        auto f = cuda->Submit(CopyBatch{host.id, dev.id, 656, false, {{at, at}}});
        ASSERT_TRUE(f) << f.error().ToString();
        auto g = cuda->Submit(CopyBatch{dev.id, out.id, 656, false, {{at, at}}});
        ASSERT_TRUE(g) << g.error().ToString();
        ASSERT_TRUE(cuda->Wait(*g));
        ASSERT_EQ(std::memcmp(out.data + at, host.data + at, 656), 0) << "thread " << t << ", batch " << i;
      }
    });
  }
  for (auto& th : threads) th.join();
  cuda->WaitAll();
  EXPECT_EQ(cuda->counters().batches, 1600u);
  for (const Arena& a : {dev, host, out}) ASSERT_TRUE(cuda->DestroyArena(a.id));
}

}  // namespace
}  // namespace ula
