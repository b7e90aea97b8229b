// DeviceIo (step/device_io.h), the engine's side of a DeviceStep for a program that feeds it
// host arrays, and MeasureRandomRead. Its refusals, the OpenMP form's hand-through, and the
// CUDA form made exactly where a device is: each test asserts on both kinds of machine and
// skips on neither (scripts/gpu-check.sh runs this binary on the GPU and fails a CUDA test
// that skips there).
#include "step/device_io.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <tuple>
#include <vector>

#include "ula/backend.h"

namespace ula {
namespace {

bool HasDevice() { return MakeCudaBackend().has_value(); }

constexpr DeviceIoShape kShape{.max_selections = 64, .max_rows = 4, .max_batch = 2, .max_descriptors = 8};

TEST(DeviceIo, RefusesAnEmptyShape) {
  for (DeviceIoShape bad : {DeviceIoShape{.max_selections = 0}, DeviceIoShape{.max_rows = 0},
                            DeviceIoShape{.max_batch = 0}}) {
    for (bool cuda : {false, true}) {
      auto io = DeviceIo::Create(cuda, bad);
      ASSERT_FALSE(io);
      EXPECT_EQ(io.error().code(), ErrorCode::kInvalidArgument) << io.error().ToString();
    }
  }
}

// The OpenMP form's step reads host memory: Upload and UploadStatus hand back the caller's
// arrays, Download copies nothing, the agreed word and ReadWord are host words, the timer the
// host clock; null inputs are refused.
TEST(DeviceIo, OpenMpFormHandsTheHostArraysThrough) {
  auto io = DeviceIo::Create(false, kShape);
  ASSERT_TRUE(io) << io.error().ToString();
  EXPECT_EQ((*io)->stream(), nullptr);
  EXPECT_STREQ((*io)->timing_source(), "steady_clock");
  std::vector<std::int32_t> sel(8, -1), idx(8, 5);
  std::vector<std::int64_t> req{0, 1};
  std::vector<CopyDescriptor> desc(8);
  StepRecord rec;
  const StepArrays host{.selections = sel.data(), .requests = req.data(), .indices = idx.data(),
                        .descriptors = desc.data(), .stats = &rec, .num_rows = 2, .batch = 2, .q_len = 1,
                        .top_k = 4, .selection_stride = 4, .index_stride = 4, .max_descriptors = 8};
  auto dev = (*io)->Upload(host);
  ASSERT_TRUE(dev) << dev.error().ToString();
  EXPECT_EQ(dev->selections, host.selections);
  EXPECT_EQ(dev->indices, host.indices);
  EXPECT_EQ(dev->stats, host.stats);
  EXPECT_TRUE((*io)->Download(*dev, host));
  EXPECT_EQ(idx[0], 5) << "Download copies nothing in the OpenMP form";
  std::vector<std::uint8_t> status(8, 0);
  auto st = (*io)->UploadStatus(status);
  ASSERT_TRUE(st);
  EXPECT_EQ(*st, status.data());
  auto agreed = (*io)->Agreed(7);
  ASSERT_TRUE(agreed);
  EXPECT_EQ(**agreed, 7u);
  EXPECT_EQ((*io)->ReadWord(*agreed).value(), 7u);
  ASSERT_TRUE((*io)->Start());
  auto ms = (*io)->StopMs();
  ASSERT_TRUE(ms);
  EXPECT_GE(*ms, 0.0);
  StepArrays no_selections = host;
  no_selections.selections = nullptr;
  auto refused = (*io)->Upload(no_selections);
  ASSERT_FALSE(refused);
  EXPECT_EQ(refused.error().code(), ErrorCode::kInvalidArgument);
}

// The CUDA form: made where a device is (its own stream, CUDA events; a shape past Create's is
// refused, a word round-trips through device memory), refused with kFailedPrecondition where
// none is or the build has no CUDA.
TEST(DeviceIo, CudaFormIsMadeExactlyWhereADeviceIs) {
  auto io = DeviceIo::Create(true, kShape);
  if (!HasDevice()) {
    ASSERT_FALSE(io) << "a CUDA-form DeviceIo was made without a device";
    EXPECT_EQ(io.error().code(), ErrorCode::kFailedPrecondition) << io.error().ToString();
    return;
  }
  ASSERT_TRUE(io) << io.error().ToString();
  EXPECT_STREQ((*io)->timing_source(), "cuda_events");
  EXPECT_NE((*io)->stream(), nullptr);
  std::vector<std::int32_t> sel(128, -1), idx(128, -1);
  std::vector<std::int64_t> req{0, 1, 2};
  std::vector<CopyDescriptor> desc(8);
  StepRecord rec;
  StepArrays host{.selections = sel.data(), .requests = req.data(), .indices = idx.data(),
                  .descriptors = desc.data(), .stats = &rec, .num_rows = 2, .batch = 2, .q_len = 1,
                  .top_k = 4, .selection_stride = 4, .index_stride = 4, .max_descriptors = 8};
  auto dev = (*io)->Upload(host);
  ASSERT_TRUE(dev) << dev.error().ToString();
  EXPECT_NE(dev->selections, host.selections) << "the CUDA form's arrays are its own";
  StepArrays too_many_rows = host, too_large_a_batch = host, too_many_descriptors = host;
  too_many_rows.num_rows = 32;  // 32 x 4 selections, Create's 64 at most
  too_large_a_batch.batch = 3;
  too_many_descriptors.max_descriptors = 9;
  for (const StepArrays& past : {too_many_rows, too_large_a_batch, too_many_descriptors}) {
    auto refused = (*io)->Upload(past);
    ASSERT_FALSE(refused);
    EXPECT_EQ(refused.error().code(), ErrorCode::kInvalidArgument) << refused.error().ToString();
  }
  auto agreed = (*io)->Agreed(41);
  ASSERT_TRUE(agreed) << agreed.error().ToString();
  EXPECT_EQ((*io)->ReadWord(*agreed).value(), 41u) << "the word went to the device and back";
}

// The random-read reference: bad arguments refused on any machine; it runs where a device is
// and is refused with kFailedPrecondition where none is.
TEST(RandomRead, CudaFormRunsExactlyWhereADeviceIs) {
  for (auto [bytes, reads, repeats] : {std::tuple<std::uint64_t, std::uint64_t, int>{4, 16, 1}, {64, 0, 1}, {64, 16, 0}}) {
    auto r = MeasureRandomRead(bytes, reads, repeats, 1);
    ASSERT_FALSE(r);
    EXPECT_EQ(r.error().code(), ErrorCode::kInvalidArgument) << r.error().ToString();
  }
  auto r = MeasureRandomRead(std::uint64_t{1} << 20, 1u << 16, 3, 1);
  if (!HasDevice()) {
    ASSERT_FALSE(r);
    EXPECT_EQ(r.error().code(), ErrorCode::kFailedPrecondition) << r.error().ToString();
    return;
  }
  ASSERT_TRUE(r) << r.error().ToString();
  EXPECT_EQ(r->table_bytes, std::uint64_t{1} << 20);
  EXPECT_EQ(r->reads, 1u << 16);
  EXPECT_GT(r->gbps, 0.0);
  EXPECT_GT(r->ns_per_read, 0.0);
}

}  // namespace
}  // namespace ula
