// KindModel: the consistency verifier's own account of a space with kinds
// (docs/ARCHITECTURE.md, "Kinds"), from which every kind's page table follows. Per request it
// keeps the tokens T, the most tokens it ever held (a rollback may restore the window of
// most - ring_draft_tokens tokens, no further), the first token of its latest round plus one
// (reach: the window ring frees by it, so a round's tokens stay until the round ends or the
// request's next Allocate) and whether it
// was ever appended to, and per kind the page table last read (KindPagesOf).
//
// What a request of T tokens must hold, kind by kind (E its tokens per entry):
//   the sparse kind and its companions  floor(T / E) entries, the request's addresses, in
//                                       pages of the space's page_tokens;
//   append (C128)                       floor(T / E) entries in blocks of kKindBlockEntries;
//   ring (the window)                   the tokens [first, T), first = max(0, reach - ring_tokens),
//                                       in the blocks [first / 64, ceil(T / 64));
//   per request (compressor state)      one entry from the first append, T mod E filling.
// and no block that still holds a live entry changes id between two reads (a resident
// block never moves; the window ring frees only its front). A rollback to `length` is
// accepted iff the window of `length`, [length - (ring_tokens - ring_draft_tokens), length),
// starts at or after most - ring_tokens (what the ring restores, whatever it still holds).
//
// Check reads every kind of one request, compares it with the above, and counts what
// changed since the previous read: C128 entries made, ring blocks freed at the front.
//
// A rank view (TP, docs/ARCHITECTURE.md "Kinds under TP"): over P ranks, rank r's page table
// of each kind is its share of the above. With n = floor(T / 4) C4 entries, entry i of the
// request on rank i mod P (pages of page_tokens opened per request; P divides page_tokens):
//   the sparse kind and its companions  the n entries with i mod P == r, in the pages that hold
//                                       one: ceil((n - r) / page_tokens) of them (0 if n <= r);
//   append (C128)                       entry j on rank j mod P: the rank's stripe of floor(T / E)
//                                       entries, in local blocks of kKindBlockEntries;
//   ring and per request                the whole table on the request's window home; no entry
//                                       and no block on any other rank.
// DP is the view of one rank (P = 1, r = 0, the home 0): the table above.
//
// Thread-safety: none; the verifier's one thread.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "ula/address_space.h"
#include "ula/error.h"
#include "ula/ids.h"
#include "ula/kv_kinds.h"
#include "ula/tp_address_space.h"

namespace ula::verify_internal {

class KindModel {
 public:
  struct Counts {
    std::uint64_t c4_made = 0;            // sparse entries Allocate made
    std::uint64_t c4_freed = 0;           // sparse entries a rollback or a Free released
    std::uint64_t c128_made = 0;          // append-kind (not addressed) entries that appeared
    std::uint64_t ring_blocks_freed = 0;  // window blocks the ring gave back at its front
    std::uint64_t rollbacks_refused = 0;  // rollbacks past the ring, refused as predicted
    std::uint64_t pages_checked = 0;      // (request, kind) page tables compared with the model
  };

  // The page table of (kind, rank) a space reports (AddressSpace / TpAddressSpace::KindPagesOf).
  using PagesReader = std::function<Result<KindPages>(std::uint32_t kind, std::uint32_t rank)>;

  // REQUIRES: ValidateKinds(kinds) is Ok, with a sparse kind; ranks >= 1 divides page_tokens.
  KindModel(std::span<const KvKind> kinds, std::uint32_t page_tokens, std::uint32_t ranks = 1);

  void Added(RequestId request);
  // An Allocate of n tokens that made `made` addresses; a description if `made` is not the
  // number of sparse blocks the tokens completed.
  std::optional<std::string> Appended(RequestId request, std::uint32_t n_tokens, std::size_t made);
  std::uint32_t TokensOf(RequestId request) const { return requests_.at(request).tokens; }
  // Whether Truncate(request, length) must be accepted (the ring still holds its window).
  bool RollbackAllowed(RequestId request, std::uint32_t length) const;
  void Truncated(RequestId request, std::uint32_t length);
  void Freed(RequestId request);
  // AdvanceRound: every ring frees what no later round reads (reach = most).
  void RoundEnded();
  // The addresses a request of `tokens` tokens holds.
  std::uint32_t AddressesAt(std::uint32_t tokens) const { return tokens / sparse_tokens_; }
  // Tokens per address (the sparse kind's tokens_per_entry).
  std::uint32_t sparse_tokens() const { return sparse_tokens_; }

  // Compares every kind of `request` (space.KindPagesOf) and its addresses with the model;
  // the description of the first difference, if any.
  std::optional<std::string> Check(const AddressSpace& space, RequestId request, std::span<const LogicalAddr> addrs);
  // The same over every rank of a TP space (the rank view above; the request's window home
  // is the space's WindowHomeOf).
  std::optional<std::string> Check(const TpAddressSpace& space, RequestId request, std::span<const LogicalAddr> addrs);
  // A digest of every kind's page table of the requests (what no step may change).
  static std::uint64_t PagesDigest(const AddressSpace& space, std::span<const RequestId> requests);
  static std::uint64_t PagesDigest(const TpAddressSpace& space, std::span<const RequestId> requests);

  const Counts& counts() const { return counts_; }
  Counts& counts() { return counts_; }

 private:
  struct Request {
    std::uint32_t tokens = 0;
    std::uint32_t most = 0;   // the most tokens ever held
    std::uint32_t reach = 0;  // 1 + the first token of the latest Allocate of at least one token
    bool appended = false;
    std::vector<KindPages> last;  // [ranks * kinds] the page tables last read
  };
  // The page table kind k of `r` must have on `rank`, whose window home is `home` (blocks:
  // only their number is set).
  KindPages Expected(std::uint32_t k, const Request& r, std::uint32_t rank, std::uint32_t home) const;
  // Check's body: `listed` is the space's AddressesOf, `home` its window home.
  std::optional<std::string> CheckRanks(RequestId request, std::span<const LogicalAddr> addrs,
                                        Result<std::span<const LogicalAddr>> listed, std::uint32_t home,
                                        const PagesReader& read);
  static std::uint64_t Digest(std::span<const RequestId> requests, std::uint32_t kinds, std::uint32_t ranks,
                              const std::function<Result<KindPages>(RequestId, std::uint32_t, std::uint32_t)>& read);
  // The index of blocks[0] among the request's blocks of kind k (the ring's first block).
  std::uint32_t BaseBlock(std::uint32_t k, const KindPages& p) const;
  // Blocks that hold a live entry in both reads keep their ids; counts what changed.
  std::optional<std::string> CheckStable(std::uint32_t k, const KindPages& before, const KindPages& now);

  std::vector<KvKind> kinds_;
  std::vector<bool> addressed_;  // [kinds] the sparse kind and its companions
  std::uint32_t sparse_tokens_ = 1;
  std::uint32_t page_tokens_ = 1;
  std::uint32_t ranks_ = 1;
  std::unordered_map<RequestId, Request> requests_;
  Counts counts_;
};

}  // namespace ula::verify_internal
