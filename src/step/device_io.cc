// DeviceIo (step/device_io.h): the CUDA form through kernels::gpu's memory, stream and event
// calls (src/kernels, the only place that includes CUDA); the OpenMP form hands the host
// arrays through.
#include "step/device_io.h"

#include <fmt/format.h>

#include <algorithm>
#include <type_traits>
#include <vector>

#include "kernels/step_kernels.h"

namespace ula {

std::string KernelErrorText(int error) {
  const auto e = static_cast<kernels::KernelError>(error);
#if defined(ULA_WITH_CUDA_KERNELS)
  const char* text = kernels::gpu::ErrorText(e);
#else
  const char* text = kernels::KernelErrorName(e);
  if (text == nullptr) text = "CUDA error";
#endif
  return fmt::format("{} ({})", text, error);
}

namespace {
// A KernelError of the CUDA form as a Status naming the call.
[[maybe_unused]] Status IoStatus(kernels::KernelError e, const char* what) {  // unused without CUDA
  if (e == kernels::kKernelOk) return Ok();
  const std::string m = fmt::format("DeviceIo::{}: {}", what, KernelErrorText(e));
  switch (e) {
    case kernels::kKernelOutOfMemory: return MakeError(ErrorCode::kResourceExhausted, m);
    case kernels::kKernelNoDevice:
    case kernels::kKernelOldDriver: return MakeError(ErrorCode::kFailedPrecondition, m);
    default: return MakeError(ErrorCode::kIo, m);
  }
}
}  // namespace

Result<std::unique_ptr<DeviceIo>> DeviceIo::Create(bool cuda, const DeviceIoShape& shape) {
  if (shape.max_selections == 0 || shape.max_rows == 0 || shape.max_batch == 0) {
    return MakeError(ErrorCode::kInvalidArgument, "DeviceIo: max_selections, max_rows and max_batch must be >= 1");
  }
  std::unique_ptr<DeviceIo> io(new DeviceIo(cuda, shape));
  if (!cuda) return io;
#if !defined(ULA_WITH_CUDA_KERNELS)
  return MakeError(ErrorCode::kFailedPrecondition, "DeviceIo: the CUDA form: this build has no CUDA (ULA_WITH_CUDA)");
#else
  namespace gpu = kernels::gpu;
  ULA_RETURN_IF_ERROR(IoStatus(gpu::CheckDevice(), "Create"));
  ULA_RETURN_IF_ERROR(IoStatus(gpu::StreamCreate(&io->stream_), "Create (stream)"));
  ULA_RETURN_IF_ERROR(IoStatus(gpu::EventCreate(&io->start_), "Create (event)"));
  ULA_RETURN_IF_ERROR(IoStatus(gpu::EventCreate(&io->stop_), "Create (event)"));
  auto alloc = [](std::size_t bytes, auto** out) {
    void* p = nullptr;
    const kernels::KernelError e = gpu::MemAlloc(bytes, &p);
    *out = static_cast<std::remove_reference_t<decltype(**out)>*>(p);
    return IoStatus(e, "Create (device memory)");
  };
  const std::size_t n = shape.max_selections;
  ULA_RETURN_IF_ERROR(alloc(n * sizeof(std::int32_t), &io->selections_));
  ULA_RETURN_IF_ERROR(alloc(n * sizeof(std::int32_t), &io->indices_));
  ULA_RETURN_IF_ERROR(alloc(shape.max_rows * sizeof(std::int32_t), &io->row_batch_));
  ULA_RETURN_IF_ERROR(alloc(shape.max_batch * sizeof(std::int64_t), &io->requests_));
  ULA_RETURN_IF_ERROR(alloc(std::max<std::size_t>(1, shape.max_descriptors) * sizeof(CopyDescriptor), &io->descriptors_));
  ULA_RETURN_IF_ERROR(alloc(std::max<std::size_t>(1, shape.max_descriptors), &io->status_));
  ULA_RETURN_IF_ERROR(alloc(sizeof(StepRecord), &io->record_));
  ULA_RETURN_IF_ERROR(alloc(sizeof(std::uint32_t), &io->word_));
  return io;
#endif
}

DeviceIo::~DeviceIo() {
#if defined(ULA_WITH_CUDA_KERNELS)
  if (!cuda_) return;
  namespace gpu = kernels::gpu;
  // Teardown: a failed free or destroy has no caller to report to.
  for (void* p : {static_cast<void*>(selections_), static_cast<void*>(indices_), static_cast<void*>(row_batch_),
                  static_cast<void*>(requests_), static_cast<void*>(descriptors_), static_cast<void*>(status_),
                  static_cast<void*>(record_), static_cast<void*>(word_)}) {
    if (p != nullptr) (void)gpu::MemFree(p);
  }
  if (start_ != nullptr) (void)gpu::EventDestroy(start_);
  if (stop_ != nullptr) (void)gpu::EventDestroy(stop_);
  if (stream_ != nullptr) (void)gpu::StreamDestroy(stream_);
#endif
}

Status DeviceIo::Copy(void* dst, const void* src, std::size_t bytes, const char* what) {
#if defined(ULA_WITH_CUDA_KERNELS)
  return IoStatus(kernels::gpu::MemCopy(stream_, dst, src, bytes), what);
#else
  (void)dst, (void)src, (void)bytes, (void)what;
  return MakeError(ErrorCode::kInternal, "DeviceIo: a CUDA copy in a build without CUDA");
#endif
}

Status DeviceIo::Sync(const char* what) {
#if defined(ULA_WITH_CUDA_KERNELS)
  return IoStatus(kernels::gpu::Sync(stream_), what);
#else
  (void)what;
  return Ok();
#endif
}

Result<StepArrays> DeviceIo::Upload(const StepArrays& host) {
  if (host.selections == nullptr || host.requests == nullptr) {
    return MakeError(ErrorCode::kInvalidArgument, "DeviceIo::Upload: selections and requests must not be null");
  }
  if (!cuda_) return host;
  const std::uint64_t sel = std::uint64_t{host.num_rows} * host.selection_stride;
  const std::uint64_t idx = std::uint64_t{host.num_rows} * host.index_stride;
  if (sel > shape_.max_selections || idx > shape_.max_selections || host.num_rows > shape_.max_rows ||
      host.batch > shape_.max_batch || host.max_descriptors > shape_.max_descriptors) {
    return MakeError(ErrorCode::kInvalidArgument,
                     fmt::format("DeviceIo::Upload: a shape past Create's ({} selections, {} indices, {} rows, batch "
                                 "{}, {} descriptors; at most {}, {}, {}, {}, {})", sel, idx, host.num_rows, host.batch,
                                 host.max_descriptors, shape_.max_selections, shape_.max_selections, shape_.max_rows,
                                 shape_.max_batch, shape_.max_descriptors));
  }
  StepArrays d = host;
  d.selections = selections_;
  d.requests = requests_;
  d.row_batch = host.row_batch == nullptr ? nullptr : row_batch_;
  d.indices = indices_;
  d.descriptors = descriptors_;
  d.stats = record_;
  ULA_RETURN_IF_ERROR(Copy(selections_, host.selections, sel * sizeof(std::int32_t), "Upload"));
  ULA_RETURN_IF_ERROR(Copy(requests_, host.requests, std::size_t{host.batch} * sizeof(std::int64_t), "Upload"));
  if (host.row_batch != nullptr) {
    ULA_RETURN_IF_ERROR(Copy(row_batch_, host.row_batch, std::size_t{host.num_rows} * sizeof(std::int32_t), "Upload"));
  }
  return d;
}

Result<const std::uint8_t*> DeviceIo::UploadStatus(std::span<const std::uint8_t> status) {
  if (!cuda_) return status.data();
  if (status.size() > shape_.max_descriptors) {
    return MakeError(ErrorCode::kInvalidArgument, fmt::format("DeviceIo::UploadStatus: {} statuses, at most {}",
                                                              status.size(), shape_.max_descriptors));
  }
  ULA_RETURN_IF_ERROR(Copy(status_, status.data(), status.size(), "UploadStatus"));
  return status_;
}

Status DeviceIo::Download(const StepArrays& device, const StepArrays& host) {
  if (!cuda_) return Ok();
  if (device.stats != record_ || host.stats == nullptr || host.indices == nullptr || host.descriptors == nullptr) {
    return MakeError(ErrorCode::kInvalidArgument,
                     "DeviceIo::Download: `device` must be this object's Upload and `host`'s outputs non-null");
  }
  ULA_RETURN_IF_ERROR(Sync("Download"));
  ULA_RETURN_IF_ERROR(Copy(host.stats, record_, sizeof(StepRecord), "Download"));
  ULA_RETURN_IF_ERROR(Sync("Download"));
  ULA_RETURN_IF_ERROR(Copy(host.indices, indices_,
                           std::size_t{device.num_rows} * device.index_stride * sizeof(std::int32_t), "Download"));
  const std::size_t n = std::min<std::size_t>(host.stats->num_descriptors, device.max_descriptors);
  ULA_RETURN_IF_ERROR(Copy(host.descriptors, descriptors_, n * sizeof(CopyDescriptor), "Download"));
  return Sync("Download");
}

Result<std::uint32_t> DeviceIo::ReadWord(const std::uint32_t* word) {
  if (!cuda_) return *word;
  std::uint32_t v = 0;
  ULA_RETURN_IF_ERROR(Sync("ReadWord"));
  ULA_RETURN_IF_ERROR(Copy(&v, word, sizeof(v), "ReadWord"));
  ULA_RETURN_IF_ERROR(Sync("ReadWord"));
  return v;
}

Result<const std::uint32_t*> DeviceIo::Agreed(std::uint32_t value) {
  host_word_ = value;
  if (!cuda_) return &host_word_;
  ULA_RETURN_IF_ERROR(Copy(word_, &host_word_, sizeof(host_word_), "Agreed"));
  ULA_RETURN_IF_ERROR(Sync("Agreed"));  // host_word_ may change at the next call
  return word_;
}

Status DeviceIo::Start() {
  if (!cuda_) {
    started_ = std::chrono::steady_clock::now();
    return Ok();
  }
#if defined(ULA_WITH_CUDA_KERNELS)
  return IoStatus(kernels::gpu::EventRecord(start_, stream_), "Start");
#else
  return Ok();
#endif
}

Result<double> DeviceIo::StopMs() {
  if (!cuda_) return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - started_).count();
#if defined(ULA_WITH_CUDA_KERNELS)
  ULA_RETURN_IF_ERROR(IoStatus(kernels::gpu::EventRecord(stop_, stream_), "StopMs"));
  float ms = 0;
  ULA_RETURN_IF_ERROR(IoStatus(kernels::gpu::EventElapsedMs(start_, stop_, &ms), "StopMs"));
  return static_cast<double>(ms);
#else
  return 0.0;
#endif
}

Result<std::unique_ptr<StreamGraph>> StreamGraph::Capture(void* stream, const std::function<Status()>& enqueue) {
#if !defined(ULA_WITH_CUDA_KERNELS)
  (void)stream, (void)enqueue;
  return MakeError(ErrorCode::kFailedPrecondition, "StreamGraph: this build has no CUDA (ULA_WITH_CUDA)");
#else
  namespace gpu = kernels::gpu;
  ULA_RETURN_IF_ERROR(IoStatus(gpu::GraphCaptureBegin(stream), "StreamGraph::Capture (begin)"));
  const Status enqueued = enqueue();
  std::unique_ptr<StreamGraph> graph(new StreamGraph());
  const kernels::KernelError ended = gpu::GraphCaptureEnd(stream, &graph->exec_);
  if (!enqueued) return std::unexpected(enqueued.error());
  ULA_RETURN_IF_ERROR(IoStatus(ended, "StreamGraph::Capture (end and instantiate)"));
  return graph;
#endif
}

StreamGraph::~StreamGraph() {
#if defined(ULA_WITH_CUDA_KERNELS)
  (void)kernels::gpu::GraphDestroy(exec_);  // teardown: no caller to report to
#endif
}

Status StreamGraph::Launch(void* stream) {
#if !defined(ULA_WITH_CUDA_KERNELS)
  (void)stream;
  return MakeError(ErrorCode::kFailedPrecondition, "StreamGraph: this build has no CUDA (ULA_WITH_CUDA)");
#else
  return IoStatus(kernels::gpu::GraphLaunch(exec_, stream), "StreamGraph::Launch");
#endif
}

Status EnqueueReferenceCopies(void* stream, const StepArrays& step, const kernels::CopyPools& pools,
                              std::uint8_t* status) {
  if (step.descriptors == nullptr || step.stats == nullptr || status == nullptr || pools.device == nullptr ||
      pools.host == nullptr) {
    return MakeError(ErrorCode::kInvalidArgument,
                     "EnqueueReferenceCopies: descriptors, stats, status and both pools must not be null");
  }
#if !defined(ULA_WITH_CUDA_KERNELS)
  (void)stream;
  return MakeError(ErrorCode::kFailedPrecondition, "EnqueueReferenceCopies: this build has no CUDA (ULA_WITH_CUDA)");
#else
  return IoStatus(kernels::gpu::ReferenceCopy(stream, step.descriptors, &step.stats->num_descriptors,
                                              step.max_descriptors, pools, status),
                  "EnqueueReferenceCopies");
#endif
}

Status EnqueueReferenceCopies(void* stream, const PlacementArrays& place, std::uint32_t max_seats,
                              const kernels::CopyPools& pools, std::uint8_t* status) {
  if (place.evictions == nullptr || place.num_evictions == nullptr || status == nullptr || pools.device == nullptr ||
      pools.host == nullptr) {
    return MakeError(ErrorCode::kInvalidArgument,
                     "EnqueueReferenceCopies: evictions, num_evictions, status and both pools must not be null");
  }
#if !defined(ULA_WITH_CUDA_KERNELS)
  (void)stream, (void)max_seats;
  return MakeError(ErrorCode::kFailedPrecondition, "EnqueueReferenceCopies: this build has no CUDA (ULA_WITH_CUDA)");
#else
  return IoStatus(kernels::gpu::ReferenceCopy(stream, place.evictions, place.num_evictions, max_seats, pools, status),
                  "EnqueueReferenceCopies");
#endif
}

Result<RandomReadResult> MeasureRandomRead(std::uint64_t table_bytes, std::uint64_t reads, int repeats,
                                           std::uint64_t seed) {
  if (table_bytes < 8 || reads == 0 || repeats < 1) {
    return MakeError(ErrorCode::kInvalidArgument,
                     fmt::format("MeasureRandomRead: table_bytes {} (at least 8), reads {} and repeats {} (at least 1)",
                                 table_bytes, reads, repeats));
  }
#if !defined(ULA_WITH_CUDA_KERNELS)
  (void)seed;
  return MakeError(ErrorCode::kFailedPrecondition, "MeasureRandomRead: this build has no CUDA (ULA_WITH_CUDA)");
#else
  namespace gpu = kernels::gpu;
  // The stream, the events and their teardown: a DeviceIo of the smallest shape.
  auto io = DeviceIo::Create(true, DeviceIoShape{});
  if (!io) return std::unexpected(io.error());
  const std::uint64_t entries = table_bytes / 8;
  void* table = nullptr;
  void* sink = nullptr;
  struct Free {
    void*& a;
    void*& b;
    ~Free() {
      if (a != nullptr) (void)kernels::gpu::MemFree(a);
      if (b != nullptr) (void)kernels::gpu::MemFree(b);
    }
  } free_both{table, sink};
  ULA_RETURN_IF_ERROR(IoStatus(gpu::MemAlloc(entries * 8, &table), "MeasureRandomRead (table)"));
  ULA_RETURN_IF_ERROR(IoStatus(gpu::MemAlloc(std::size_t{gpu::RandomReadThreads()} * 8, &sink), "MeasureRandomRead (sink)"));
  std::vector<double> ms;
  for (int rep = 0; rep <= repeats; ++rep) {  // run 0 warms up
    ULA_RETURN_IF_ERROR((*io)->Start());
    ULA_RETURN_IF_ERROR(IoStatus(gpu::RandomRead((*io)->stream(), static_cast<const std::uint64_t*>(table), entries,
                                                 reads, seed + static_cast<std::uint64_t>(rep),
                                                 static_cast<std::uint64_t*>(sink)),
                                 "MeasureRandomRead"));
    auto t = (*io)->StopMs();
    if (!t) return std::unexpected(t.error());
    if (rep > 0) ms.push_back(*t);
  }
  std::sort(ms.begin(), ms.end());
  RandomReadResult r;
  r.table_bytes = entries * 8;
  r.reads = reads;
  r.ms_median = ms[ms.size() / 2];
  r.ns_per_read = r.ms_median * 1e6 / static_cast<double>(reads);
  r.gbps = r.ms_median > 0 ? 8.0 * static_cast<double>(reads) / (r.ms_median * 1e6) : 0.0;
  return r;
#endif
}

}  // namespace ula
