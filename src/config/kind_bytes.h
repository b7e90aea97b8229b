// KV bytes per kind of a model with layer kinds (model_config.h; docs/ARCHITECTURE.md
// "kinds"): what one request of a given length holds in window KV, compressed-sparse (C4)
// entries, heavily-compressed (C128) entries and index keys, in a chosen storage format.
//
// Counting rule (a request of `tokens` tokens, summed over every layer, MTP layers included):
//   window entries      min(tokens, sliding_window) per layer, every layer whatever its kind
//   C4 entries          floor(tokens / compress_rate_csa) per compressed-sparse layer
//   index keys          one per C4 entry
//   C128 entries        floor(tokens / compress_rate_hca) per heavily-compressed layer
// The tokens of a block not yet full are compressor state, not entries (not counted here).
// Compressed entries use the same per-entry layout as the window KV (SGLang's DSV4 pools do).
//
// Thread-safety: pure functions.
#pragma once

#include <cstdint>

#include "config/model_config.h"
#include "ula/error.h"

namespace ula {

enum class KvStorageFormat : std::uint8_t {
  kFp8Packed = 0,   // nope FP8 + scales + rope BF16 (kv_entry_bytes_per_layer)
  kFp8Uniform = 1,  // every value e4m3, no in-cache scale
  kBf16 = 2,
};
enum class IndexKeyFormat : std::uint8_t {
  kFp8 = 0,  // index_key_bytes_per_layer
  kFp4 = 1,  // index_key_bytes_fp4
};

struct KindCounts {
  std::uint64_t window_entries = 0;
  std::uint64_t csa_entries = 0;
  std::uint64_t hca_entries = 0;
  std::uint64_t index_keys = 0;
  bool operator==(const KindCounts&) const = default;
};

struct KindBytes {
  std::uint64_t window_kv = 0;
  std::uint64_t csa_kv = 0;
  std::uint64_t hca_kv = 0;
  std::uint64_t index_keys = 0;
  std::uint64_t total() const { return window_kv + csa_kv + hca_kv + index_keys; }
  bool operator==(const KindBytes&) const = default;
};

// The largest request length the functions accept (the byte totals then fit in 64 bits).
inline constexpr std::uint64_t kMaxKindTokens = std::uint64_t{1} << 40;

// Bytes of one entry / one index key in a format (REQUIRES model.Validate() passed).
std::uint32_t KvEntryBytes(const ModelConfig& model, KvStorageFormat format);
std::uint32_t IndexKeyBytes(const ModelConfig& model, IndexKeyFormat format);

// kFailedPrecondition for a model without layer kinds; kInvalidArgument for tokens >
// kMaxKindTokens or a model that fails Validate().
Result<KindCounts> CountKindEntries(const ModelConfig& model, std::uint64_t tokens);
Result<KindBytes> BytesPerKind(const ModelConfig& model, std::uint64_t tokens, KvStorageFormat kv_format,
                               IndexKeyFormat index_format);

// Compressed entries one page of `page_tokens` full tokens holds at `ratio` tokens per entry
// (SGLang's 256-token page: 64 C4 entries, 2 C128 entries). kInvalidArgument unless ratio >= 1
// and page_tokens is a positive multiple of ratio.
Result<std::uint32_t> EntriesPerPage(std::uint32_t page_tokens, std::uint32_t ratio);

}  // namespace ula
