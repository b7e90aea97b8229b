// DeviceIo: the engine's side of a DeviceStep (ula/device_step.h) for a program that feeds
// the step host arrays and reads its outputs back (`ula bench planner --planner device`, the
// verifiers' device form): a stream, the StepArrays' buffers in the step's memory, the copies
// to and from them, and a timer of the work enqueued between two marks.
//   - OpenMP form (cuda = false): the step reads host memory, so Upload hands back the host
//     arrays themselves, Download and the word copies copy nothing, stream() is null and the
//     timer is the host's steady clock between the marks.
//   - CUDA form: device buffers sized once at Create for the largest shape (no allocation
//     after it), a stream of its own, CUDA events as the timer (the GPU's time between the two
//     marks; StopMs waits for the second).
// These copies are the program's, not the step's: DeviceStep::counters() does not see them.
// Errors: kInvalidArgument (a shape past Create's, a null input), kFailedPrecondition (the
// CUDA form in a build without CUDA or on a machine without a device, named), kIo (a CUDA
// call failed, its message included), kResourceExhausted (device memory).
// Thread-safety: one thread per DeviceIo.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>

#include "kernels/step_kernels.h"
#include "ula/error.h"
#include "ula/step_arrays.h"

namespace ula {

struct DeviceIoShape {
  std::uint64_t max_selections = 1;  // num_rows * selection_stride (and * index_stride) at most
  std::uint32_t max_rows = 1;        // StepArrays::num_rows at most (row_batch)
  std::uint32_t max_batch = 1;       // StepArrays::batch at most (requests)
  std::uint32_t max_descriptors = 0; // the step's max_descriptors()
};

class DeviceIo {
 public:
  static Result<std::unique_ptr<DeviceIo>> Create(bool cuda, const DeviceIoShape& shape);
  ~DeviceIo();
  DeviceIo(const DeviceIo&) = delete;
  DeviceIo& operator=(const DeviceIo&) = delete;

  bool cuda() const { return cuda_; }
  // The stream to pass to the step's calls (null for the OpenMP form).
  void* stream() const { return stream_; }
  // "cuda_events" or "steady_clock": what StopMs measures with.
  const char* timing_source() const { return cuda_ ? "cuda_events" : "steady_clock"; }

  // The arrays the step takes for `host`'s: the same shape, its inputs (selections, row_batch,
  // requests) copied into this object's buffers, its outputs (indices, descriptors, stats)
  // this object's (Download copies them back). Enqueued on stream(); `host` may change once it
  // returns. OpenMP form: `host` itself.
  Result<StepArrays> Upload(const StepArrays& host);
  // The engine's copy statuses for Complete ([max_descriptors]), in the step's memory.
  Result<const std::uint8_t*> UploadStatus(std::span<const std::uint8_t> status);
  // Waits for the stream, then copies `device`'s (Upload's) outputs into `host`'s arrays: the
  // StepRecord, the indices, the descriptors [0, num_descriptors). OpenMP form: nothing.
  Status Download(const StepArrays& device, const StepArrays& host);
  // Waits for the stream and reads one word of the step's memory (a verdict()).
  Result<std::uint32_t> ReadWord(const std::uint32_t* word);
  // A word of the step's memory holding `value` (the agreed verdict that Claim takes).
  Result<const std::uint32_t*> Agreed(std::uint32_t value);

  // The timer: Start marks the stream, StopMs marks it again and returns the milliseconds
  // between the marks (CUDA form: waits for the second mark).
  Status Start();
  Result<double> StopMs();

 private:
  DeviceIo(bool cuda, const DeviceIoShape& shape) : cuda_(cuda), shape_(shape) {}
  Status Copy(void* dst, const void* src, std::size_t bytes, const char* what);
  Status Sync(const char* what);
  bool cuda_;
  DeviceIoShape shape_;
  void* stream_ = nullptr;
  void* start_ = nullptr;  // CUDA events
  void* stop_ = nullptr;
  // The CUDA form's buffers (device memory).
  std::int32_t* selections_ = nullptr;   // [max_selections]
  std::int32_t* row_batch_ = nullptr;    // [max_rows]
  std::int64_t* requests_ = nullptr;     // [max_batch]
  std::int32_t* indices_ = nullptr;      // [max_selections]
  CopyDescriptor* descriptors_ = nullptr;// [max_descriptors]
  std::uint8_t* status_ = nullptr;       // [max_descriptors]
  StepRecord* record_ = nullptr;         // [1]
  std::uint32_t* word_ = nullptr;        // [1] Agreed's
  std::uint32_t host_word_ = 0;          // OpenMP form: Agreed's
  std::chrono::steady_clock::time_point started_{};
};

// One CUDA graph of the work `enqueue` puts on `stream` (an engine iteration: each group's
// Check, Claim, copies and Complete, then AdvanceRound), captured once and replayed by Launch.
// The capture is ended whatever `enqueue` returns, so the stream stays usable. CUDA form only:
// kFailedPrecondition in a build without CUDA; `enqueue`'s own error; kIo naming CUDA's error
// when the capture, the instantiation or a launch fails (a call that is not capturable, such
// as a synchronisation inside `enqueue`, fails the capture).
class StreamGraph {
 public:
  static Result<std::unique_ptr<StreamGraph>> Capture(void* stream, const std::function<Status()>& enqueue);
  ~StreamGraph();
  StreamGraph(const StreamGraph&) = delete;
  StreamGraph& operator=(const StreamGraph&) = delete;
  // Enqueues one replay on `stream` (nothing waits for it).
  Status Launch(void* stream);

 private:
  StreamGraph() = default;
  void* exec_ = nullptr;  // cudaGraphExec_t
};

// The engine's copies of one step as a copy kernel would run them (kernels::gpu::ReferenceCopy):
// `step`'s descriptors [0, its StepRecord's num_descriptors), the count read on the device, over
// one group's `pools`, each status set to 0. One launch of step.max_descriptors blocks on
// `stream`. CUDA form only (kFailedPrecondition in a build without CUDA); kInvalidArgument for
// null arrays. The second form runs one Place's evictions: [0, *place.num_evictions), one
// launch of max_seats blocks (DeviceStepConfig::max_place_seats).
Status EnqueueReferenceCopies(void* stream, const StepArrays& step, const kernels::CopyPools& pools,
                              std::uint8_t* status);
Status EnqueueReferenceCopies(void* stream, const PlacementArrays& place, std::uint32_t max_seats,
                              const kernels::CopyPools& pools, std::uint8_t* status);

// The random-read reference of the GPU check (kernels::gpu::RandomRead): `reads` independent
// 8-byte reads at random indices of a device table of table_bytes (its contents unset), one
// launch per run, timed with CUDA events on a stream of its own; one unmeasured run, then the
// median of `repeats`. CUDA form only: kFailedPrecondition in a build without CUDA or on a
// machine without a device; kInvalidArgument for a table under 8 bytes, no reads or repeats.
struct RandomReadResult {
  std::uint64_t table_bytes = 0, reads = 0;
  double ms_median = 0;
  double ns_per_read = 0;  // ms_median / reads: the throughput cost of one read
  double gbps = 0;         // 8 * reads bytes over ms_median (the bytes asked for, not the sectors moved)
};
Result<RandomReadResult> MeasureRandomRead(std::uint64_t table_bytes, std::uint64_t reads, int repeats,
                                           std::uint64_t seed);

// The text of a step kernel's error code (kernels::KernelError, src/kernels/step_kernels.h):
// CUDA's own message for a CUDA error, the code's name otherwise; the code in parentheses.
std::string KernelErrorText(int error);

}  // namespace ula
