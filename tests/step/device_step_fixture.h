// Test helpers shared by the device step's DP and TP tests (device_step_test,
// tp_device_step_test): one step's engine-owned arrays in the device step's strided layout,
// and the comparison of two device states.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "ula/device_step.h"
#include "ula/ids.h"
#include "ula/step_arrays.h"

namespace ula::testing {

struct Shape {
  std::uint32_t batch = 1, q_len = 1, top_k = 8;
  std::uint32_t sel_stride = 8, idx_stride = 8;
  bool row_batch = false;
  std::uint32_t rows() const { return batch * q_len; }
};

// One step's inputs, dense: [batch][q_len][top_k] selections and each batch row's request.
struct StepInputs {
  Shape shape;
  std::vector<RequestId> requests;
  std::vector<std::int32_t> dense;  // [batch][q_len][top_k]
};

// One step's engine-owned arrays in the device step's (strided) layout.
struct DeviceIo {
  std::vector<std::int32_t> selections, row_batch, indices;
  std::vector<std::int64_t> requests;
  std::vector<CopyDescriptor> descriptors;
  StepRecord record;
  StepArrays arrays;
  void Fill(const Shape& s, const std::vector<std::int32_t>& dense, const std::vector<RequestId>& reqs,
            std::uint32_t max_descriptors) {
    selections.assign(std::size_t{s.rows()} * s.sel_stride, 777777);  // past top_k: never read
    indices.assign(std::size_t{s.rows()} * s.idx_stride, -9);
    for (std::uint32_t r = 0; r < s.rows(); ++r) {
      for (std::uint32_t c = 0; c < s.top_k; ++c) selections[std::size_t{r} * s.sel_stride + c] = dense[std::size_t{r} * s.top_k + c];
    }
    row_batch.resize(s.rows());
    for (std::uint32_t r = 0; r < s.rows(); ++r) row_batch[r] = static_cast<std::int32_t>(r / s.q_len);
    requests.clear();
    for (RequestId r : reqs) requests.push_back(static_cast<std::int64_t>(r.value()));
    descriptors.assign(max_descriptors, CopyDescriptor{});
    record = StepRecord{};
    arrays = StepArrays{};
    arrays.selections = selections.data();
    arrays.row_batch = s.row_batch ? row_batch.data() : nullptr;
    arrays.requests = requests.data();
    arrays.indices = indices.data();
    arrays.descriptors = descriptors.data();
    arrays.stats = &record;
    arrays.num_rows = s.rows();
    arrays.batch = s.batch;
    arrays.q_len = s.q_len;
    arrays.top_k = s.top_k;
    arrays.selection_stride = s.sel_stride;
    arrays.index_stride = s.idx_stride;
    arrays.max_descriptors = max_descriptors;
  }
};

inline void ExpectSameState(const DeviceStepState& a, const DeviceStepState& b, const std::string& what) {
  EXPECT_EQ(a.records, b.records) << what;
  EXPECT_EQ(a.device_owner, b.device_owner) << what;
  EXPECT_EQ(a.device_free, b.device_free) << what;
  EXPECT_EQ(a.host_free, b.host_free) << what;
  EXPECT_EQ(a.stamps, b.stamps) << what;
  EXPECT_EQ(a.bucket_words, b.bucket_words) << what;
  EXPECT_EQ(a.round, b.round) << what;
  EXPECT_EQ(a.cur, b.cur) << what;
  EXPECT_EQ(a.tracked, b.tracked) << what;
}

}  // namespace ula::testing
