// Selection traces: per decode step, per layer group, per query of each request, the
// selected entries — saved to a compact binary file and replayed, so that every policy and
// baseline sees the identical access sequence.
//
// Values are either token positions inside the request (kPosition: what the indexer and the
// selection model produce; a replayer maps them through its request-to-token table) or
// logical addresses of one AddressSpace (kLogicalAddress). A record's order is selection
// order (attention reads in that order), so it is kept, not sorted.
//
// File format, version 1 (all fixed-width integers little-endian):
//   header  "ULATRACE" (8 bytes) | u32 version = 1 | u8 kind | 3 zero bytes
//           | u32 num_groups | u32 queries_per_step | u64 num_steps | u64 num_records
//           | u64 num_values
//   body    per step:   varint record_count, then per record:
//                       varint request | varint group | varint query | varint context_len
//                       | varint count | count x zigzag-varint (value - previous value;
//                       the first from 0)
//   trailer u64 FNV-1a-64 of every byte before it
// varint = LEB128 (7 bits a byte, low first, at most 10 bytes). A decoded trace re-encodes
// to the same bytes (replay is byte-for-byte). Reading checks every count against the
// header and the bytes left, every group/query against the header, kPosition values
// against context_len, the checksum, and trailing bytes: a truncated or corrupt file is a
// kInvalidArgument error, never a crash or an unbounded allocation.
//
// Thread-safety: reentrant.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <span>
#include <vector>

#include "ula/error.h"

namespace ula {

enum class TraceValueKind : std::uint8_t {
  kPosition = 0,        // token position inside the request, < context_len
  kLogicalAddress = 1,  // LogicalAddr::value() of one AddressSpace
};

struct TraceRecord {
  std::uint64_t request = 0;
  std::uint32_t group = 0;
  std::uint32_t query = 0;        // 0 = the decoded token, 1.. = draft tokens
  std::uint32_t context_len = 0;  // tokens of the request at this step
  std::vector<std::uint32_t> values;

  bool operator==(const TraceRecord&) const = default;
};

struct TraceStep {
  std::vector<TraceRecord> records;
  bool operator==(const TraceStep&) const = default;
};

struct Trace {
  TraceValueKind kind = TraceValueKind::kPosition;
  std::uint32_t num_groups = 1;
  std::uint32_t queries_per_step = 1;
  std::vector<TraceStep> steps;

  // Every record inside the header's bounds (and kPosition values < context_len).
  Status Validate() const;
  std::uint64_t num_records() const;
  std::uint64_t num_values() const;
  bool operator==(const Trace&) const = default;
};

inline constexpr std::uint32_t kTraceFormatVersion = 1;

Result<std::vector<std::byte>> EncodeTrace(const Trace& trace);
Result<Trace> DecodeTrace(std::span<const std::byte> bytes);
Status WriteTraceFile(const std::filesystem::path& path, const Trace& trace);
Result<Trace> ReadTraceFile(const std::filesystem::path& path);

}  // namespace ula
