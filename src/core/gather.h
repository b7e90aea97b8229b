// Gather: translate a step's selected logical addresses and copy their entries from a
// slot pool into one contiguous buffer (what a kernel's input staging does on the CPU
// backend, and the CPU reference for a GPU gather kernel).
//
// The loop is software-pipelined: while entry i is copied, the table entry of i + 4D and
// the bytes of entry i + D are prefetched (D = 8), so that random 656-byte entries stream at close
// to memcpy bandwidth instead of waiting on one DRAM round trip each.
// Thread-safety: reads only; safe to run concurrently with other readers.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "ula/ids.h"
#include "core/address_records.h"

namespace ula {

// out[i * entry_bytes, (i + 1) * entry_bytes) = bytes of slot table[addrs[i]].slot() in pool.
// Returns the number of addresses that were not live (their output is left untouched).
// REQUIRES: out holds addrs.size() * entry_bytes bytes; live slots lie inside the pool.
std::size_t GatherEntries(const AddressRecords& table, std::span<const LogicalAddr> addrs, const std::byte* pool,
                          std::uint32_t entry_bytes, std::byte* out) noexcept;

// The same for slots already translated (e.g. the planner's output).
void GatherSlots(std::span<const SlotId> slots, const std::byte* pool, std::uint32_t entry_bytes,
                 std::byte* out) noexcept;

}  // namespace ula
