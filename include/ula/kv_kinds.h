// The kinds of KV one space holds (docs/ARCHITECTURE.md, "Kinds").
//
// A model like DeepSeek-V4 keeps several kinds of memory per request, and the space holds
// every kind in one address space (no pool sized per kind at start-up). A kind states what
// the space must know to hold it:
//   tokens_per_entry  how many tokens make one entry: 1 (window KV), 4 (C4), 128 (C128). An
//                     entry appears when the token completing its block is written; until
//                     then the block's tokens live in the request's compressor state.
//   lifetime          kRing: a window of `ring_tokens` tokens' entries, the window plus the
//                     most draft tokens a rollback may drop (`ring_draft_tokens`), counted back
//                     from a round's first token: an Allocate of n tokens at T keeps the tokens
//                     from T + 1 - ring_tokens on (what token T reads, and what a rollback of
//                     the drafts before it restores), so every token of a prefill chunk finds
//                     its window, and the round's n - 1 later tokens stay until the round ends
//                     (AdvanceRound) or the request's next Allocate: ring_tokens + n - 1 tokens,
//                     at most ceil((ring_tokens + n - 1) / 64) + 1 blocks of 64 during a round,
//                     ring_tokens between rounds (docs/ARCHITECTURE.md, "Kinds"). A rollback of
//                     more than ring_draft_tokens since the ring was full is refused, whatever
//                     the ring still holds. kAppend: kept until
//                     the request frees it (compressed entries). kPerRequest: `state_rows`
//                     rows per layer for the request's whole life (compressor state: the
//                     block still filling).
//   layers, row_bytes one row per layer, in the storage format the model config chose.
//   companion_of      the kind whose entry this one accompanies (an index key and its C4
//                     entry): same logical address, same lifetime, a kind of its own so it
//                     can be placed apart (the indexer scores every key every step, while
//                     the entry itself may sit on host).
//   placement         kSparse: exclusive device/host tiers, the residency policy and the
//                     step (what a top-k selects); kResident: on device, read every step,
//                     never missed.
//
// Rules (ValidateKinds; the error names the field, "kinds[2].companion_of"):
//   - a name, unique; tokens_per_entry a power of two in [1, kMaxTokensPerEntry];
//     layers >= 1, row_bytes >= 1;
//   - kRing: tokens_per_entry 1, ring_tokens >= 1 and ring_draft_tokens < ring_tokens (a
//     window of at least one token); other lifetimes: ring_tokens and ring_draft_tokens 0;
//   - kPerRequest: state_rows >= 1 and resident (the compressor writes it every token);
//     other lifetimes: state_rows 0;
//   - kSparse: lifetime kAppend (a ring or a state is read whole every step); at most one
//     sparse kind (the step takes one selection per request and group);
//   - companion_of: an earlier kind that is no companion itself, with the same
//     tokens_per_entry and lifetime; a companion is resident.
// An empty list means the space's single kind (one entry per token per group), unchanged.
//
// Thread-safety: plain values; ValidateKinds is a pure function.
#pragma once

#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <vector>

#include "ula/error.h"

namespace ula {

enum class KindLifetime : std::uint8_t { kRing = 0, kAppend = 1, kPerRequest = 2 };
enum class KindPlacement : std::uint8_t { kSparse = 0, kResident = 1 };

// The heaviest compression a kind may state: DeepSeek-V4's HCA entry, one per 128 tokens.
inline constexpr std::uint32_t kMaxTokensPerEntry = 128;
inline constexpr std::uint32_t kNoCompanion = std::numeric_limits<std::uint32_t>::max();

struct KvKind {
  std::string name;
  std::uint32_t tokens_per_entry = 1;
  KindLifetime lifetime = KindLifetime::kAppend;
  std::uint32_t ring_tokens = 0;        // kRing only: the window plus ring_draft_tokens, from a round's first token
  std::uint32_t ring_draft_tokens = 0;  // kRing only: the most tokens a rollback may drop
  std::uint32_t state_rows = 0;   // kPerRequest only: rows per layer per request
  std::uint32_t layers = 0;
  std::uint32_t row_bytes = 0;
  std::uint32_t companion_of = kNoCompanion;
  KindPlacement placement = KindPlacement::kResident;

  // Bytes of one entry over the kind's layers (kPerRequest: of one state row).
  std::uint64_t entry_bytes() const { return std::uint64_t{layers} * row_bytes; }
  bool operator==(const KvKind&) const = default;
};

// Entries per logical block of a kind whose entries are not the space's addresses (a
// request's page table of C128 entries or window tokens): SGLang's 256-token page holds 64
// C4 entries and 2 C128 entries, a 64-token block of the window.
inline constexpr std::uint32_t kKindBlockEntries = 64;

// A request's entries of one kind as an engine indexes them (AddressSpace::KindPagesOf).
struct KindPages {
  std::uint32_t tokens = 0;   // the request's tokens
  std::uint32_t entries = 0;  // live entries: floor(tokens / tokens_per_entry); a ring: its
                              // live tokens; a per_request kind: 1 once allocated
  // Entries per block: kKindBlockEntries; the sparse kind and its companions: the space's
  // page_tokens (their blocks are its pages of logical addresses); per_request: 1.
  std::uint32_t entries_per_block = 0;
  std::uint32_t first_offset = 0;    // a ring: offset of its oldest live entry in blocks[0]
  std::uint32_t filling_tokens = 0;  // tokens in no entry yet (the compressor state's position)
  std::vector<std::uint32_t> blocks;  // [ceil((first_offset + entries) / entries_per_block)] ids in order
  bool operator==(const KindPages&) const = default;
};

// A shared prefix in a space with kinds (AddressSpace::SharePrefix; src/space/kind_entries.h,
// "Shared prefixes"). The adopter holds the source's first `resume_from` tokens: their C4
// entries (and index keys) by address, their C128 entries' whole blocks and the window
// ring's blocks by reference; it recomputes its tokens from resume_from on (an Allocate, as a
// prefill chunk), which rebuilds the compressor states of the blocks still filling. copies:
// the C128 entries of the last, partly filled block, which the engine copies (entries [0,
// entries) of src_block to the same offsets of dst_block, on every layer of the kind) before
// the adopter's next step reads them; the space holds no bytes of those kinds.
struct KindBlockCopy {
  std::uint32_t kind = 0;
  std::uint32_t src_block = 0;
  std::uint32_t dst_block = 0;
  std::uint32_t entries = 0;
  bool operator==(const KindBlockCopy&) const = default;
};
struct PrefixShare {
  std::uint32_t resume_from = 0;  // tokens adopted; the request's next Allocate starts here
  std::vector<KindBlockCopy> copies;
};

std::string_view ToString(KindLifetime lifetime);
std::string_view ToString(KindPlacement placement);

// Ok, or kInvalidArgument naming the first bad field ("kinds[i].field") and the rule.
Status ValidateKinds(std::span<const KvKind> kinds);

// Index of the sparse kind, or kinds.size() when there is none.
std::size_t SparseKindIndex(std::span<const KvKind> kinds);

}  // namespace ula
