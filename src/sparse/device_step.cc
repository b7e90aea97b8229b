// DeviceStep (ula/device_step.h): the host side. Create sizes and fills the state and scratch
// in the form's memory (kernels::omp or kernels::gpu MemAlloc), Plan / Complete /
// AdvanceRound check the host-side arguments and enqueue the kernels of
// src/kernels/step_kernels.inl. Nothing here reads device memory during a step.
#include "ula/device_step.h"

#include <fmt/format.h>
#include <omp.h>

#include <algorithm>
#include <cstring>

#include "kernels/step_kernels.h"
#include "policy/kernel_pb_lru.h"
#include "sparse/address_space_state.h"
#include "ula/check.h"
#include "sparse/omp_team.h"

namespace ula {

namespace {
constexpr std::uint64_t kMaxRequestIds = std::uint64_t{1} << 24;


std::uint32_t SummaryWords(std::uint32_t words) { return (words + 63) / 64; }
}  // namespace

Status DeviceStepConfig::Validate() const {
  auto bad = [](std::string m) { return MakeError(ErrorCode::kInvalidArgument, "DeviceStepConfig." + m); };
  if (threads < 1 || threads > 64) return bad(fmt::format("threads = {}: must be in [1, 64]", threads));
  if (max_rows == 0) return bad("max_rows: must be >= 1");
  if (max_batch == 0) return bad("max_batch: must be >= 1");
  if (max_top_k == 0) return bad("max_top_k: must be >= 1");
  if (std::uint64_t{max_rows} * max_top_k > (std::uint64_t{1} << 31)) {
    return bad("max_rows * max_top_k: more than 2^31 selections");
  }
#if !defined(ULA_WITH_CUDA_KERNELS)
  if (cuda) return MakeError(ErrorCode::kFailedPrecondition, "DeviceStepConfig.cuda: this build has no CUDA (ULA_WITH_CUDA)");
#endif
  return Ok();
}

struct DeviceStep::Impl {
  DeviceStepConfig config;
  kernels::DeviceStepArgs args;      // the state and scratch pointers; io filled per Plan
  kernels::ScratchArena arena;
  std::vector<void*> blocks;         // every MemAlloc, freed at destruction
  std::uint32_t max_selections = 0, max_descriptors = 0;
  std::uint32_t device_capacity = 0, host_words = 0;
  bool pending = false;
  std::uint32_t round = 1;           // the host's count of the PB-LRU round (for the rebase)

  ~Impl() {
    for (void* p : blocks) Free(p);
  }
  void* Alloc(std::size_t bytes) {
#if defined(ULA_WITH_CUDA_KERNELS)
    void* p = config.cuda ? kernels::gpu::MemAlloc(bytes) : kernels::omp::MemAlloc(bytes);
#else
    void* p = kernels::omp::MemAlloc(bytes);
#endif
    if (p != nullptr) blocks.push_back(p);
    return p;
  }
  void Free(void* p) const {
#if defined(ULA_WITH_CUDA_KERNELS)
    if (config.cuda) return kernels::gpu::MemFree(p);
#endif
    kernels::omp::MemFree(p);
  }
  void Copy(void* stream, void* dst, const void* src, std::size_t bytes) const {
#if defined(ULA_WITH_CUDA_KERNELS)
    if (config.cuda) return kernels::gpu::MemCopy(stream, dst, src, bytes);
#endif
    (void)stream;
    kernels::omp::MemCopy(0, dst, src, bytes);
  }
  void Sync(void* stream) const {
#if defined(ULA_WITH_CUDA_KERNELS)
    if (config.cuda) return kernels::gpu::Sync(stream);
#endif
    (void)stream;
  }
  // A device array holding `values` (nullptr when allocation failed).
  template <class T>
  T* Upload(const std::vector<T>& values, std::size_t min_count = 1) {
    const std::size_t n = std::max(values.size(), min_count);
    auto* p = static_cast<T*>(Alloc(n * sizeof(T)));
    if (p != nullptr && !values.empty()) Copy(nullptr, p, values.data(), values.size() * sizeof(T));
    return p;
  }
  template <class T>
  T* Zeroed(std::size_t count) {
    return Upload(std::vector<T>(std::max<std::size_t>(count, 1), T{}));
  }
};

DeviceStep::DeviceStep(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
DeviceStep::~DeviceStep() = default;

std::uint32_t DeviceStep::max_descriptors() const { return impl_->max_descriptors; }
std::uint64_t DeviceStep::arena_high_water() const { return impl_->arena.high_water; }
std::uint64_t DeviceStep::arena_overflows() const { return impl_->arena.overflows; }

Result<std::unique_ptr<DeviceStep>> DeviceStep::Create(const AddressSpace& space, Rank rank, GroupId group,
                                                       const DeviceStepConfig& config) {
  ULA_RETURN_IF_ERROR(config.Validate());
  const AddressSpace::State& st = *space.state_;
  const AddressSpaceConfig& cfg = space.config();
  if (rank.value() >= cfg.num_ranks) {
    return MakeError(ErrorCode::kOutOfRange, fmt::format("rank {} is out of range ({} ranks)", rank.value(), cfg.num_ranks));
  }
  if (group.value() >= cfg.num_groups) {
    return MakeError(ErrorCode::kOutOfRange, fmt::format("group {} is out of range ({} groups)", group.value(), cfg.num_groups));
  }
  const GroupPools& gp = st.at(rank, group);
  const auto* pb = dynamic_cast<const policy::KernelPbLru*>(gp.policy.get());
  if (pb == nullptr) {
    return MakeError(ErrorCode::kFailedPrecondition,
                     fmt::format("rank {} group {}: the device step holds PB-LRU as flat bitmaps: create the space "
                                 "with policy kernel_pb_lru (it has {})", rank.value(), group.value(), gp.policy->name()));
  }
  if (!gp.new_on_host.empty()) {
    return MakeError(ErrorCode::kFailedPrecondition,
                     fmt::format("rank {} group {}: {} entries were placed on host by this round's Allocate: create "
                                 "the device step after AdvanceRound()", rank.value(), group.value(), gp.new_on_host.size()));
  }
  std::uint64_t max_id = 0;
  for (const auto& [id, req] : st.requests) max_id = std::max(max_id, id.value());
  if (!st.requests.empty() && max_id >= kMaxRequestIds) {
    return MakeError(ErrorCode::kFailedPrecondition,
                     fmt::format("request id {}: the device step's request table is indexed by id, ids must be below "
                                 "2^24", max_id));
  }

  auto impl = std::make_unique<Impl>();
  impl->config = config;
  Impl& m = *impl;
  kernels::DeviceStepArgs& a = m.args;
  const AddressRecords& table = st.tables[group.value()];
  m.max_selections = config.max_rows * config.max_top_k;
  m.device_capacity = gp.device.capacity();
  m.max_descriptors = std::min(m.max_selections, m.device_capacity);
  bool ok = true;
  auto need = [&](const void* p) { ok = ok && p != nullptr; };

  // The state.
  std::vector<std::uint64_t> records(table.data(), table.data() + table.size());
  for (std::uint64_t& r : records) r &= AddressRecords::kLocationMask;
  a.table_size = table.size();
  need(a.records = m.Upload(records));
  std::vector<std::uint32_t> owner(st.owner.begin(), st.owner.end());
  owner.resize(a.table_size, 0);
  need(a.owner = m.Upload(owner));
  a.num_requests = st.requests.empty() ? 0 : static_cast<std::uint32_t>(max_id + 1);
  std::vector<std::uint32_t> tags(a.num_requests, 0), adopted_starts(a.num_requests + 1, 0), adopted;
  {
    std::vector<const RequestState*> by_id(a.num_requests, nullptr);
    for (const auto& [id, req] : st.requests) by_id[id.value()] = &req;
    for (std::uint32_t r = 0; r < a.num_requests; ++r) {
      if (by_id[r] != nullptr) {
        tags[r] = by_id[r]->tag;
        for (LogicalAddr x : by_id[r]->adopted) adopted.push_back(x.value());
      }
      adopted_starts[r + 1] = static_cast<std::uint32_t>(adopted.size());
    }
  }
  need(a.request_tags = m.Upload(tags));
  need(a.adopted_starts = m.Upload(adopted_starts));
  need(a.adopted = m.Upload(adopted));
  auto flat = [&](const HierBitmap& b, kernels::FlatBitmap& f) {
    f.num_words = static_cast<std::uint32_t>(b.num_words());
    f.num_summary = SummaryWords(f.num_words);
    std::vector<std::uint64_t> words(b.words(), b.words() + b.num_words()), summary(f.num_summary, 0);
    for (std::uint32_t w = 0; w < f.num_words; ++w) {
      if (words[w] != 0) summary[w >> 6] |= std::uint64_t{1} << (w & 63);
    }
    need(f.words = m.Upload(words));
    need(f.summary = m.Upload(summary));
    need(f.count = m.Upload(std::vector<std::uint64_t>{b.Count()}));
  };
  flat(gp.device.free_bitmap(), a.device_free);
  flat(gp.host.free_bitmap(), a.host_free);
  m.host_words = a.host_free.num_words;
  {
    const kernels::PbLruArrays src = pb->arrays();
    kernels::PbLruArrays& d = a.pb;
    d = src;
    const std::size_t buckets = src.recent + 2;
    need(d.words = m.Upload(std::vector<std::uint64_t>(src.words, src.words + buckets * src.num_words)));
    need(d.summary = m.Upload(std::vector<std::uint64_t>(src.summary, src.summary + buckets * src.num_summary)));
    need(d.counts = m.Upload(std::vector<std::uint64_t>(src.counts, src.counts + buckets)));
    need(d.stamps = m.Upload(std::vector<std::uint32_t>(src.stamps, src.stamps + src.capacity)));
    need(d.clock = m.Upload(std::vector<kernels::PbLruClock>{*src.clock}));
    m.round = src.clock->round;
  }
  std::vector<std::uint32_t> device_owner(gp.device_owner.size());
  for (std::size_t s = 0; s < device_owner.size(); ++s) device_owner[s] = gp.device_owner[s].value();
  need(a.device_owner = m.Upload(device_owner));
  a.rank = rank.value();
  a.group = group.value();
  a.row_bytes = cfg.row();
  a.num_layers = gp.num_layers;
  a.entry_bytes = cfg.entry_bytes_of(group);
  a.codes.invalid_argument = 1 + static_cast<std::uint32_t>(ErrorCode::kInvalidArgument);
  a.codes.not_found = 1 + static_cast<std::uint32_t>(ErrorCode::kNotFound);
  a.codes.resource_exhausted = 1 + static_cast<std::uint32_t>(ErrorCode::kResourceExhausted);

  // The scratch, for the largest shape.
  need(a.first = m.Upload(std::vector<std::uint32_t>(a.table_size, kernels::kNoSelection)));
  need(a.kind = m.Zeroed<std::uint8_t>(m.max_selections));
  need(a.hit_flag = m.Zeroed<std::uint32_t>(m.max_selections));
  need(a.miss_flag = m.Zeroed<std::uint32_t>(m.max_selections));
  need(a.hit_pos = m.Zeroed<std::uint32_t>(m.max_selections));
  need(a.miss_pos = m.Zeroed<std::uint32_t>(m.max_selections));
  need(a.hits = m.Zeroed<std::uint32_t>(m.max_selections));
  need(a.missed = m.Zeroed<std::uint32_t>(m.max_selections));
  need(a.targets = m.Zeroed<std::uint32_t>(m.max_descriptors));
  const std::size_t blocks = std::max<std::size_t>(std::size_t{a.pb.recent + 1} * a.pb.num_summary,
                                                   a.device_free.num_summary);
  need(a.take_counts = m.Zeroed<std::uint32_t>(blocks));
  need(a.take_offsets = m.Zeroed<std::uint32_t>(blocks));
  need(a.ctl = m.Upload(std::vector<kernels::DeviceStepControl>{kernels::DeviceStepControl{}}));
  // CCCL's decoupled look-back scans (CUDA form) need a few bytes per tile of items; the
  // OpenMP form's scans are sequential and take nothing.
  if (config.cuda) {
    m.arena.capacity = (std::size_t{1} << 20) + std::size_t{16} * std::max(m.max_selections, static_cast<std::uint32_t>(blocks));
    need(m.arena.base = static_cast<char*>(m.Alloc(m.arena.capacity)));
  }
  a.arena = &m.arena;
  if (!ok) {
    return MakeError(ErrorCode::kResourceExhausted, "DeviceStep: the state and scratch do not fit in device memory");
  }
  m.Sync(nullptr);
  return std::unique_ptr<DeviceStep>(new DeviceStep(std::move(impl)));
}

Status DeviceStep::Plan(const StepArrays& arrays, void* stream) {
  Impl& m = *impl_;
  auto bad = [](std::string msg) { return MakeError(ErrorCode::kInvalidArgument, "DeviceStep::Plan: " + msg); };
  if (m.pending) return MakeError(ErrorCode::kFailedPrecondition, "DeviceStep::Plan: a plan is pending: Complete it first");
  if (arrays.selections == nullptr || arrays.requests == nullptr || arrays.indices == nullptr ||
      arrays.descriptors == nullptr || arrays.stats == nullptr) {
    return bad("selections, requests, indices, descriptors and stats must not be null");
  }
  if (arrays.top_k == 0 || arrays.top_k > m.config.max_top_k) {
    return bad(fmt::format("top_k = {}: must be in [1, {}]", arrays.top_k, m.config.max_top_k));
  }
  if (arrays.num_rows > m.config.max_rows || arrays.batch > m.config.max_batch || arrays.q_len == 0) {
    return bad(fmt::format("{} rows of a batch of {} (q_len {}) exceed the step's maximum of {} rows, batch {}",
                           arrays.num_rows, arrays.batch, arrays.q_len, m.config.max_rows, m.config.max_batch));
  }
  if (arrays.selection_stride < arrays.top_k || arrays.index_stride < arrays.top_k) {
    return bad(fmt::format("strides {} (selections) and {} (indices) must be >= top_k = {}", arrays.selection_stride,
                           arrays.index_stride, arrays.top_k));
  }
  if (arrays.row_batch == nullptr && std::uint64_t{arrays.num_rows} != std::uint64_t{arrays.batch} * arrays.q_len) {
    return bad(fmt::format("{} rows without row_batch: must be batch * q_len = {}", arrays.num_rows,
                           std::uint64_t{arrays.batch} * arrays.q_len));
  }
  m.args.io = arrays;
#if defined(ULA_WITH_CUDA_KERNELS)
  if (m.config.cuda) {
    kernels::gpu::DevicePlan(stream, m.args);
    m.pending = true;
    return Ok();
  }
#endif
  (void)stream;
  OmpTeam team(m.config.threads);
  kernels::omp::DevicePlan(0, m.args);
  m.pending = true;
  return Ok();
}

Status DeviceStep::Complete(const std::uint8_t* status, void* stream) {
  Impl& m = *impl_;
  if (!m.pending) return MakeError(ErrorCode::kFailedPrecondition, "DeviceStep::Complete: no plan is pending");
  if (status == nullptr && m.args.io.max_descriptors > 0) {
    return MakeError(ErrorCode::kInvalidArgument, "DeviceStep::Complete: status must not be null");
  }
  m.pending = false;
#if defined(ULA_WITH_CUDA_KERNELS)
  if (m.config.cuda) {
    kernels::gpu::DeviceComplete(stream, m.args, status);
    return Ok();
  }
#endif
  (void)stream;
  OmpTeam team(m.config.threads);
  kernels::omp::DeviceComplete(0, m.args, status);
  return Ok();
}

Status DeviceStep::AdvanceRound(void* stream) {
  Impl& m = *impl_;
  if (m.pending) return MakeError(ErrorCode::kFailedPrecondition, "DeviceStep::AdvanceRound: a plan is pending");
  const bool rebase = m.round == ~std::uint32_t{0};
  m.round = (rebase ? m.args.pb.recent + 2 : m.round) + 1;
#if defined(ULA_WITH_CUDA_KERNELS)
  if (m.config.cuda) {
    if (rebase) kernels::gpu::PbRebase(stream, m.args.pb);
    kernels::gpu::PbAdvance(stream, m.args.pb);
    return Ok();
  }
#endif
  (void)stream;
  OmpTeam team(m.config.threads);
  if (rebase) kernels::omp::PbRebase(0, m.args.pb);
  kernels::omp::PbAdvance(0, m.args.pb);
  return Ok();
}

DeviceStepState DeviceStep::ReadState(void* stream) const {
  const Impl& m = *impl_;
  const kernels::DeviceStepArgs& a = m.args;
  m.Sync(stream);
  DeviceStepState s;
  auto read = [&](auto& v, const auto* src, std::size_t n) {
    v.resize(n);
    m.Copy(stream, v.data(), src, n * sizeof(v[0]));
  };
  read(s.records, a.records, a.table_size);
  read(s.device_owner, a.device_owner, m.device_capacity);
  read(s.device_free, a.device_free.words, a.device_free.num_words);
  read(s.host_free, a.host_free.words, a.host_free.num_words);
  read(s.stamps, a.pb.stamps, a.pb.capacity);
  read(s.bucket_words, a.pb.words, std::size_t{a.pb.recent + 2} * a.pb.num_words);
  kernels::PbLruClock clock;
  kernels::DeviceStepControl ctl;
  m.Copy(stream, &clock, a.pb.clock, sizeof(clock));
  m.Copy(stream, &ctl, a.ctl, sizeof(ctl));
  m.Sync(stream);
  s.round = clock.round;
  s.cur = clock.cur;
  s.tracked = clock.tracked;
  s.published = ctl.published;
  s.failed = ctl.failed;
  return s;
}

}  // namespace ula
