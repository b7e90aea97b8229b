#include "core/gather.h"

#include <cstring>

namespace ula {
namespace {

constexpr std::size_t kDistance = 8;  // entries prefetched ahead of the copy

inline void PrefetchEntry(const std::byte* p, std::uint32_t entry_bytes) noexcept {
  for (std::uint32_t off = 0; off < entry_bytes; off += 64) __builtin_prefetch(p + off, 0, 1);
  __builtin_prefetch(p + entry_bytes - 1, 0, 1);
}

}  // namespace

std::size_t GatherEntries(const AddressRecords& table, std::span<const LogicalAddr> addrs, const std::byte* pool,
                          std::uint32_t entry_bytes, std::byte* out) noexcept {
  const std::size_t n = addrs.size();
  std::size_t missing = 0;
  auto slot_ptr = [&](std::size_t i, bool& live) -> const std::byte* {
    const Location loc = table.Get(addrs[i]);
    live = !loc.is_none();
    return pool + std::uint64_t{loc.slot().value()} * entry_bytes;
  };
  for (std::size_t i = 0; i < n; ++i) {
    if (i + 4 * kDistance < n) table.Prefetch(addrs[i + 4 * kDistance]);
    if (i + kDistance < n) {
      bool live;
      const std::byte* ahead = slot_ptr(i + kDistance, live);
      if (live) PrefetchEntry(ahead, entry_bytes);
    }
    bool live;
    const std::byte* src = slot_ptr(i, live);
    if (!live) {
      ++missing;
      continue;
    }
    std::memcpy(out + i * entry_bytes, src, entry_bytes);
  }
  return missing;
}

void GatherSlots(std::span<const SlotId> slots, const std::byte* pool, std::uint32_t entry_bytes,
                 std::byte* out) noexcept {
  const std::size_t n = slots.size();
  for (std::size_t i = 0; i < n; ++i) {
    if (i + kDistance < n) PrefetchEntry(pool + std::uint64_t{slots[i + kDistance].value()} * entry_bytes, entry_bytes);
    std::memcpy(out + i * entry_bytes, pool + std::uint64_t{slots[i].value()} * entry_bytes, entry_bytes);
  }
}

}  // namespace ula
