// The cpu backend: arenas in host memory, copy batches executed in submission order by
// worker threads (one FIFO "copy stream"). With copy_threads = 0 a batch runs inside Submit.
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <thread>

#include "backend/arena_registry.h"
#include "core/huge_page_allocator.h"

namespace ula {
namespace {

void RunBatch(const Arena& src, const Arena& dst, const CopyBatch& batch) {
  const std::size_t n = batch.bytes_per_move;
  if (!batch.swap) {
    for (const SlotMove& m : batch.moves) {
      std::memcpy(dst.data + m.dst_offset, src.data + m.src_offset, n);
    }
    return;
  }
  std::byte tmp[4096];
  for (const SlotMove& m : batch.moves) {
    std::byte* a = src.data + m.src_offset;
    std::byte* b = dst.data + m.dst_offset;
    for (std::size_t done = 0; done < n; done += sizeof(tmp)) {
      const std::size_t len = std::min(sizeof(tmp), n - done);
      std::memcpy(tmp, a + done, len);
      std::memcpy(a + done, b + done, len);
      std::memcpy(b + done, tmp, len);
    }
  }
}

// Arena memory: 2 MiB aligned and advised to use transparent huge pages when large, as a
// pinned-host or device allocator would give. A random 656-byte gather over 4 KiB pages
// takes a TLB miss per entry; with 2 MiB pages it streams (docs/BENCHMARKS.md, gather).
struct FreeDeleter {
  void operator()(std::byte* p) const { FreeHugePageMemory(p); }
};
using ArenaMemory = std::unique_ptr<std::byte[], FreeDeleter>;

ArenaMemory AllocateArenaMemory(std::uint64_t bytes) {
  auto* p = static_cast<std::byte*>(AllocateHugePageMemory(bytes));
  if (p != nullptr) std::memset(p, 0, bytes);
  return ArenaMemory(p);
}

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(const CpuBackendOptions& options) {
    for (int i = 0; i < options.copy_threads; ++i) workers_.emplace_back([this] { WorkerLoop(); });
  }
  ~CpuBackend() override {
    {
      std::lock_guard lock(mu_);
      stopping_ = true;
    }
    work_cv_.notify_all();
    for (auto& t : workers_) t.join();
  }

  Result<Arena> CreateArena(Tier tier, Rank rank, std::uint64_t bytes) override {
    ArenaMemory memory = AllocateArenaMemory(bytes);
    if (!memory) {
      return MakeError(ErrorCode::kResourceExhausted, "cannot allocate " + std::to_string(bytes) + " bytes");
    }
    const ArenaId id = registry_.Add(tier, rank, bytes, memory.get());
    std::lock_guard lock(mu_);
    memory_[id.value()] = std::move(memory);
    return registry_.Get(id);
  }

  Status DestroyArena(ArenaId id) override {
    ULA_RETURN_IF_ERROR(registry_.Remove(id));
    std::lock_guard lock(mu_);
    memory_.erase(id.value());
    return Ok();
  }

  Result<Arena> GetArena(ArenaId id) const override { return registry_.Get(id); }
  bool holds_bytes() const override { return true; }

  Result<Fence> Submit(CopyBatch batch) override {
    auto arenas = registry_.Validate(batch);
    if (!arenas) return std::unexpected(arenas.error());
    registry_.Count(arenas->first, arenas->second, batch);
    if (workers_.empty()) {
      RunBatch(arenas->first, arenas->second, batch);
      std::lock_guard lock(mu_);
      completed_ = ++submitted_;
      return completed_;
    }
    Fence fence;
    {
      std::lock_guard lock(mu_);
      fence = ++submitted_;
      queue_.push_back(Job{fence, arenas->first, arenas->second, std::move(batch)});
    }
    work_cv_.notify_one();
    return fence;
  }

  Status Wait(Fence fence) override {
    std::unique_lock lock(mu_);
    done_cv_.wait(lock, [&] { return completed_ >= fence; });
    return Ok();
  }

  void WaitAll() override {
    std::unique_lock lock(mu_);
    const Fence target = submitted_;
    done_cv_.wait(lock, [&] { return completed_ >= target; });
  }

  TransferCounters counters() const override { return registry_.counters(); }
  void ResetCounters() override { registry_.ResetCounters(); }

 private:
  struct Job {
    Fence fence;
    Arena src, dst;
    CopyBatch batch;
  };

  // Jobs complete in fence order: a worker takes the next job only when it is the next
  // one to run, so with several workers batches still never reorder.
  void WorkerLoop() {
    std::unique_lock lock(mu_);
    while (true) {
      work_cv_.wait(lock, [&] { return stopping_ || (!queue_.empty() && !running_); });
      if (queue_.empty()) return;
      Job job = std::move(queue_.front());
      queue_.pop_front();
      running_ = true;
      lock.unlock();
      RunBatch(job.src, job.dst, job.batch);
      lock.lock();
      running_ = false;
      completed_ = job.fence;
      done_cv_.notify_all();
      work_cv_.notify_one();
    }
  }

  backend_internal::ArenaRegistry registry_;
  std::mutex mu_;
  std::condition_variable work_cv_, done_cv_;
  std::deque<Job> queue_;
  bool running_ = false;
  bool stopping_ = false;
  Fence submitted_ = 0;
  Fence completed_ = 0;
  std::unordered_map<std::uint32_t, ArenaMemory> memory_;
  std::vector<std::thread> workers_;
};

}  // namespace

std::unique_ptr<Backend> MakeCpuBackend(const CpuBackendOptions& options) {
  return std::make_unique<CpuBackend>(options);
}

}  // namespace ula
