#include "backend/arena_registry.h"

#include <fmt/format.h>

namespace ula {

std::uint64_t TransferCounters::TotalBytes() const {
  std::uint64_t total = 0;
  for (const auto& by_src : bytes)
    for (const auto& by_dst : by_src)
      for (std::uint64_t b : by_dst) total += b;
  return total;
}

namespace backend_internal {

ArenaId ArenaRegistry::Add(Tier tier, Rank rank, std::uint64_t bytes, std::byte* data) {
  std::lock_guard lock(mu_);
  const ArenaId id(next_id_++);
  arenas_[id.value()] = Arena{id, tier, rank, bytes, data};
  return id;
}

Status ArenaRegistry::Remove(ArenaId id) {
  std::lock_guard lock(mu_);
  if (arenas_.erase(id.value()) == 0) {
    return MakeError(ErrorCode::kNotFound, fmt::format("arena {} does not exist", id.value()));
  }
  return Ok();
}

Result<Arena> ArenaRegistry::Get(ArenaId id) const {
  std::lock_guard lock(mu_);
  auto it = arenas_.find(id.value());
  if (it == arenas_.end()) {
    return MakeError(ErrorCode::kNotFound, fmt::format("arena {} does not exist", id.value()));
  }
  return it->second;
}

Result<std::pair<Arena, Arena>> ArenaRegistry::Validate(const CopyBatch& batch) const {
  auto src = Get(batch.src);
  if (!src) return std::unexpected(src.error());
  auto dst = Get(batch.dst);
  if (!dst) return std::unexpected(dst.error());
  if (batch.bytes_per_move == 0 && !batch.moves.empty()) {
    return MakeError(ErrorCode::kInvalidArgument, "copy batch with bytes_per_move = 0");
  }
  const std::uint64_t n = batch.bytes_per_move;
  for (const SlotMove& m : batch.moves) {
    if (m.src_offset > src->bytes || src->bytes - m.src_offset < n ||
        m.dst_offset > dst->bytes || dst->bytes - m.dst_offset < n) {
      return MakeError(ErrorCode::kOutOfRange,
                       fmt::format("move {}->{} of {} bytes lies outside arena {} ({} B) or {} ({} B)",
                                   m.src_offset, m.dst_offset, n, src->id.value(), src->bytes,
                                   dst->id.value(), dst->bytes));
    }
    if (batch.src == batch.dst && m.src_offset < m.dst_offset + n && m.dst_offset < m.src_offset + n &&
        m.src_offset != m.dst_offset) {
      return MakeError(ErrorCode::kInvalidArgument,
                       fmt::format("overlapping move {}->{} inside one arena", m.src_offset, m.dst_offset));
    }
  }
  return std::pair{*src, *dst};
}

void ArenaRegistry::Count(const Arena& src, const Arena& dst, const CopyBatch& batch) {
  std::lock_guard lock(mu_);
  const int cross = src.rank == dst.rank ? 0 : 1;
  const std::uint64_t moves = batch.moves.size();
  const std::uint64_t bytes = moves * batch.bytes_per_move;
  const int s = static_cast<int>(src.tier), d = static_cast<int>(dst.tier);
  counters_.bytes[s][d][cross] += bytes;
  counters_.moves[s][d][cross] += moves;
  if (batch.swap) {
    counters_.bytes[d][s][cross] += bytes;
    counters_.moves[d][s][cross] += moves;
  }
  ++counters_.batches;
}

TransferCounters ArenaRegistry::counters() const {
  std::lock_guard lock(mu_);
  return counters_;
}

void ArenaRegistry::ResetCounters() {
  std::lock_guard lock(mu_);
  counters_ = TransferCounters{};
}

}  // namespace backend_internal
}  // namespace ula
