// The counting backend: arenas without memory; a batch only adds to the counters.
#include <atomic>

#include "backend/arena_registry.h"

namespace ula {
namespace {

class CountingBackend final : public Backend {
 public:
  Result<Arena> CreateArena(Tier tier, Rank rank, std::uint64_t bytes) override {
    return registry_.Get(registry_.Add(tier, rank, bytes, nullptr));
  }
  Status DestroyArena(ArenaId id) override { return registry_.Remove(id); }
  Result<Arena> GetArena(ArenaId id) const override { return registry_.Get(id); }
  bool holds_bytes() const override { return false; }

  Result<Fence> Submit(CopyBatch batch) override {
    auto arenas = registry_.Validate(batch);
    if (!arenas) return std::unexpected(arenas.error());
    registry_.Count(arenas->first, arenas->second, batch);
    return ++last_fence_;
  }
  Status Wait(Fence) override { return Ok(); }
  void WaitAll() override {}
  TransferCounters counters() const override { return registry_.counters(); }
  void ResetCounters() override { registry_.ResetCounters(); }

 private:
  backend_internal::ArenaRegistry registry_;
  std::atomic<Fence> last_fence_{0};
};

}  // namespace

std::unique_ptr<Backend> MakeCountingBackend() { return std::make_unique<CountingBackend>(); }

}  // namespace ula
