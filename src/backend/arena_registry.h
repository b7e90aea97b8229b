// ArenaRegistry: the bookkeeping every backend shares — which arenas exist, where they
// are, and the transfer counters. Validation of a batch against its arenas lives here so
// that every backend rejects the same bad batches with the same errors.
//
// Thread-safety: all members lock `mu_`; arena memory itself is owned by the backend.
#pragma once

#include <mutex>
#include <unordered_map>

#include "ula/backend.h"

namespace ula::backend_internal {

class ArenaRegistry {
 public:
  ArenaId Add(Tier tier, Rank rank, std::uint64_t bytes, std::byte* data);
  Status Remove(ArenaId id);
  Result<Arena> Get(ArenaId id) const;
  // Checks that every move lies inside both arenas and that sizes are sane; returns the
  // two arenas on success.
  Result<std::pair<Arena, Arena>> Validate(const CopyBatch& batch) const;
  void Count(const Arena& src, const Arena& dst, const CopyBatch& batch);
  TransferCounters counters() const;
  void ResetCounters();

 private:
  mutable std::mutex mu_;
  std::uint32_t next_id_ = 0;
  std::unordered_map<std::uint32_t, Arena> arenas_;
  TransferCounters counters_;
};

}  // namespace ula::backend_internal
