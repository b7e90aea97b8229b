// PoolArenas: the arenas an address space created on its backend, owned for its lifetime.
// MakePool creates one arena and a SlotPool over it; the destructor waits for every copy
// in flight and destroys the arenas, so a partly built address space (Create failing
// halfway) and a finished one clean up the same way. It is the space's holder of the
// backend (Backend::AddHolder): the backend refuses to be destroyed while it lives.
// Thread-safety: none; owned by one address space.
#pragma once

#include <algorithm>
#include <vector>

#include "ula/backend.h"
#include "backend/slot_pool.h"

namespace ula {

class PoolArenas {
 public:
  explicit PoolArenas(Backend& backend) : backend_(backend) { backend_.AddHolder(); }
  ~PoolArenas() {
    backend_.WaitAll();
    for (ArenaId id : ids_) (void)backend_.DestroyArena(id);
    backend_.RemoveHolder();
  }
  PoolArenas(const PoolArenas&) = delete;
  PoolArenas& operator=(const PoolArenas&) = delete;

  // A new arena of `bytes` bytes on (tier, rank), for pools the caller lays over it.
  Result<Arena> MakeArena(Tier tier, Rank rank, std::uint64_t bytes) {
    auto arena = backend_.CreateArena(tier, rank, bytes);
    if (!arena) return std::unexpected(arena.error());
    ids_.push_back(arena->id);
    return *arena;
  }

  // A new arena of slots * slot_bytes bytes (at least; arena_bytes when larger: a pool of
  // several layers' regions) on (tier, rank), and a SlotPool over its first region.
  Result<SlotPool> MakePool(Tier tier, Rank rank, std::uint32_t slots, std::uint32_t slot_bytes,
                            std::uint64_t arena_bytes = 0) {
    auto arena = backend_.CreateArena(tier, rank, std::max<std::uint64_t>(arena_bytes, std::uint64_t{slots} * slot_bytes));
    if (!arena) return std::unexpected(arena.error());
    ids_.push_back(arena->id);
    return SlotPool::Create(*arena, slot_bytes, slots);
  }

 private:
  Backend& backend_;
  std::vector<ArenaId> ids_;
};

}  // namespace ula
