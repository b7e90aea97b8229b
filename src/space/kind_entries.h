// KindEntries: the entries of a space's kinds as the model makes them (ula/kv_kinds.h;
// docs/ARCHITECTURE.md, "Kinds"). The logical side only: which entries of which kind a
// request holds and the logical blocks they sit in; the bytes behind a block (frames) are
// not here. A DP space with kinds embeds one (space/address_space_state.h).
//
// Entries per kind, for a request of T tokens (a kind of tokens_per_entry E):
//   addressed  the sparse kind and its companions: floor(T / E) entries, the space's logical
//              addresses (the directory's "tokens" in a space with kinds are these entries:
//              the step selects them as in a single-kind space). A companion (an index key)
//              shares its entry's address, so its pages are the directory's pages. The
//              entry of block k appears when token (k + 1) * E - 1 is allocated; until then
//              the block's tokens are counted in the request's compressor state. KindEntries
//              counts them; the directory holds them.
//   kAppend    (not addressed: C128) floor(T / E) entries, in blocks of kKindBlockEntries
//              entries (a 256-token SGLang page holds 64 C4 and 2 C128 entries): entry j in
//              the request's block j / 64 at offset j % 64, the request's blocks
//              [0, ceil(entries / 64)).
//   kRing      (the window, E = 1) the live tokens [first, T). The ring frees by the first
//              token of a round, not its last: an Allocate of n >= 1 tokens at T sets
//              reach = max(reach, T + 1) and first = max(0, reach - ring_tokens)
//              (the window token T reads, [T - window + 1, T], and the ring_draft_tokens before
//              it a rollback may restore), so every token of the round finds its window live
//              (a prefill chunk's first token too), and the round's other n - 1 tokens stay
//              until the round ends (EndRound, at the space's AdvanceRound: reach = most, the
//              tokens no later round and no rollback reads go) or the request's next Allocate:
//              the ring holds at most ring_tokens + n - 1 tokens, n the request's last
//              Allocate, and ring_tokens between rounds (vLLM's SlidingWindowManager frees by
//              the tokens computed before the new ones the same way). A Truncate keeps first.
//              Token t sits in the request's block t / 64 at offset t % 64; its blocks are
//              those holding a live token, [first / 64, ceil(T / 64)): at most
//              ceil((ring_tokens + n - 1) / 64) + 1 blocks from an Allocate of n tokens to the
//              round's end, ceil(ring_tokens / 64) + 1 between rounds (CheckAppend counts a
//              round's blocks exactly, so an admitted Allocate holds them).
//   kPerRequest (compressor state) one entry per request, taken by its first Append and held
//              until Free; its position (tokens of the block still filling) is T % E.
// A rank's share (TP: one KindEntries per rank, each holding only that rank's entries;
// docs/ARCHITECTURE.md, "Kinds under TP"). The constructor's `share` names rank r of P
// (default 0 of 1: every entry, the DP space's):
//   - a kAppend kind that is not addressed (C128) is striped by its entries' index in the
//     request: entry j of the request is held by rank j mod P, as its local entry j / P, so
//     rank r holds StripeEntries(floor(T / E)) of them, in local blocks of 64 (local entry i
//     in block i / 64 at offset i % 64): the formulas above read "entries held here";
//   - the ring and per-request kinds (the window, the compressor states) are held whole by
//     one rank, the request's window home: AddRequest(request, whole) says whether this
//     rank is it; a rank that is not holds no entry of them for the request;
//   - the addressed kinds are the directory's, homed a mod P there (TpAddressSpace).
// Every rank counts the request's tokens, most and reach alike (the scheduler's calls reach
// every rank), so CheckTruncate gives the same answer on every rank.
// Block ids: one logical id pool per non-addressed kind; a freed id is reused lowest first
// (the ids stay dense). A per-request kind's entry takes one id of its pool.
// Over frames (the constructor's `frames`, space/kind_frames.h): the blocks are the frames'
// blocks of one rank's budget (a block id is its byte offset / the kind's padded envelope),
// every kind but the sparse one is held there, its companion too (the index keys, in blocks
// of 64 entries: the request's page j holds the keys of its C4 entries [64j, 64j + 64)), and
// the sparse kind's device share is what they leave: the free frames, in blocks of 64
// entries; its host tier (sparse_host_entries) holds the rest. An Append that does not fit
// is refused (kResourceExhausted) with nothing changed: the resident kinds' new blocks need
// more frames than are free, or the sparse entries would exceed that share plus the host.
//
// Shared prefixes (SharePrefix, as AddressSpace::SharePrefix; docs/ARCHITECTURE.md, "Kinds"). A new
// request (no token yet) adopts the first R tokens of a live source request, R a multiple of
// the share unit A = lcm(every kind's tokens_per_entry, the sparse kind's E x page_tokens,
// kKindBlockEntries) (ShareUnit: 256 tokens for V4 at 64 addresses a page), so that every
// kind's prefix is whole blocks: its C4 entries whole pages of addresses (the directory's,
// shared by address), the ring's tokens [RingFirst(R), R) whole 64-token blocks, every
// compression block closed (no compressor state is shared: it is per request and mutable).
// The adopter's state after SharePrefix is the source's at R, as if it had run those tokens
// (tokens = most = reach = R, not appended: its compressor states are taken by its first
// Append, at position 0) and it holds:
//   kRing      the source's blocks of the tokens [RingFirst(R), R), by reference (the window
//              its token R reads, and the drafts a rollback from R could restore); they are
//              full, and neither holder writes them again (both append past R);
//   kAppend    the source's blocks whose 64 entries all lie below floor(R / E), by reference;
//              when floor(R / E) is not a multiple of 64 the last, partly filled block is a
//              fresh block of its own, and SharePrefix returns the copy of its entries (the source
//              appends into its own block at the same offsets: a shared partial block would be
//              written by both);
//   kPerRequest nothing (taken by its first Append).
// Reference counts: per pool, holders[id] = the requests listing id in their blocks of the
// kind; GiveBlock drops one and frees the id when the last holder goes. A block with more
// than one holder is sealed: all its entries lie below every holder's end (ring: tokens), so
// no Append or Truncate of any holder writes or drops it while another holds it. A request
// with a shared prefix of R tokens refuses Truncate below R (the prefix is immutable; the
// directory refuses dropping its adopted C4 entries too). Over frames SharePrefix is refused (the
// frames count a block once per owner).
//
// Truncate(request, length), a draft rollback to `length` tokens: drops the appended kinds'
// entries of the rejected tokens (keeps floor(length / E)), the ring's tokens past `length`
// and the blocks left without a live token; a compressor state's position follows T. The
// ring's `first` stays. What a rollback may restore depends on the most tokens the request
// held (most), not on how its rounds were cut: a rollback is refused (kFailedPrecondition)
// when the window of the new length, [length - (ring_tokens - ring_draft_tokens), length),
// starts before most - ring_tokens: a rollback of more than ring_draft_tokens tokens from a
// full ring (in total since the ring was full), even while the ring still holds a round's
// tokens. Since reach <= most, what is restored is always live.
//
// Invariants (CheckInvariants):
//  1. Per request and kind: entries == the formula of T above (this rank's share of it);
//     the ring's first == max(0, reach - ring_tokens) <= T, reach and T <= most; its blocks
//     are exactly the request's blocks holding a live entry, so blocks.size() ==
//     ceil(entries_end / 64) - first / 64 (0 when no entry). A request this rank does not
//     hold whole has no ring or per-request entry here.
//  2. Per pool: every id below the pool's extent is either free (listed once, no holder) or
//     listed by exactly holders[id] >= 1 requests' blocks of that kind, at the same block
//     position in each, and sealed (above) when holders[id] > 1; no id at or past the extent
//     is used.
//  5. A request's shared prefix: shared <= tokens, a multiple of the share unit (the space
//     checks the unit: it knows page_tokens).
//  3. A per-request kind's entry is held iff the request was appended to and is held whole.
//  4. Over frames: each kind's blocks in use in the frames are exactly the requests' blocks
//     of that kind; the sparse entries fit the free frames' share plus the host tier.
//
// Failure: every mutating call checks all of its input first; an error changes nothing.
// Thread-safety: plain data under the space's one driver thread.
#pragma once

#include <cstdint>
#include <algorithm>
#include <set>
#include <span>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/digest.h"
#include "ula/error.h"
#include "ula/ids.h"
#include "space/kind_frames.h"
#include "ula/kv_kinds.h"

namespace ula {

// Rank `rank` of `ranks` (above, "A rank's share"); {0, 1} holds every entry.
struct KindShare {
  std::uint32_t rank = 0;
  std::uint32_t ranks = 1;
};

class KindEntries {
 public:
  // Entries of a non-addressed kind per logical block.
  static constexpr std::uint32_t kBlockEntries = kKindBlockEntries;

  using Share = KindShare;
  // REQUIRES: ValidateKinds(kinds) is Ok; share.rank < share.ranks; frames only with a share
  // of one rank. No kinds: every call but AddRequest is an error.
  // `frames` (over the same kinds; outlives this): hold the blocks there (above).
  explicit KindEntries(std::span<const KvKind> kinds, KindFrames* frames = nullptr,
                       std::uint64_t sparse_host_entries = 0, Share share = {});

  bool empty() const { return kinds_.empty(); }
  std::size_t num_requests() const { return requests_.size(); }
  std::size_t num_kinds() const { return kinds_.size(); }
  // Whether kind k's entries are logical addresses (the sparse kind, its companions).
  bool addressed(std::uint32_t k) const { return addressed_[k]; }
  // The sparse kind's index (its entries are the addresses).
  std::uint32_t sparse_kind() const { return sparse_; }

  // kAlreadyExists when known. `whole`: this rank holds the request's ring and per-request
  // kinds (its window home; always, with a share of one rank).
  Status AddRequest(RequestId request, bool whole = true);
  // Of `entries` entries striped j mod P, how many this rank holds (j mod P == rank).
  std::uint32_t StripeEntries(std::uint32_t entries) const {
    return entries / share_.ranks + (entries % share_.ranks > share_.rank ? 1 : 0);
  }
  // The request's tokens; kNotFound.
  Result<std::uint32_t> TokensOf(RequestId request) const;
  // How many addressed entries the request's tokens make: floor(T / E) of the sparse kind.
  Result<std::uint32_t> AddressedEntries(RequestId request) const;

  // What an Append of n_tokens makes: the addressed entries it creates, and over frames the
  // free frames its resident kinds' new blocks may take (a bound, KindFrames::FramesNeeded).
  struct AppendCheck {
    std::uint32_t entries = 0;
    std::uint32_t frames = 0;
  };
  // Checks an Append of n_tokens: kNotFound, kOutOfRange (more than 2^32 - 1 tokens), over
  // frames kResourceExhausted (above).
  Result<AppendCheck> CheckAppend(RequestId request, std::uint32_t n_tokens) const;
  // One scheduler round's Appends (StepPlanner::ReserveRound over frames), in any order:
  // kNotFound, kOutOfRange, over frames kResourceExhausted, as CheckAppend, when they would
  // not all pass it. The round's free frames are what its Appends' resident kinds may take,
  // each request's blocks net of the blocks it gives back itself (a request's gives free room
  // only for its own takes, since another's Append may come first): a single Append's frames
  // are CheckAppend's. entries: [appends.size()], each Append's addressed entries.
  struct RoundAppend {
    RequestId request;
    std::uint32_t n_tokens = 0;
  };
  struct RoundCheck {
    std::vector<std::uint32_t> entries;
    std::uint32_t frames = 0;
  };
  Result<RoundCheck> CheckRound(std::string_view who, std::span<const RoundAppend> appends) const;
  // REQUIRES: CheckAppend(request, n_tokens) is Ok.
  void Append(RequestId request, std::uint32_t n_tokens);
  // Ends the round (AddressSpace::AdvanceRound, after its attention): every ring frees what
  // no later round and no rollback reads, the tokens before most - ring_tokens (reach = most).
  // Returns whether a block was given back.
  bool EndRound();
  // Checks a Truncate: kNotFound, kOutOfRange (length past T), kFailedPrecondition (the
  // rollback reaches past a ring). Returns the addressed entries to keep.
  Result<std::uint32_t> CheckTruncate(RequestId request, std::uint32_t length) const;
  // REQUIRES: CheckTruncate(request, length) is Ok.
  void Truncate(RequestId request, std::uint32_t length);
  // The share unit A of `kinds` at `page_tokens` addresses a page (above, "Shared prefixes").
  static std::uint32_t ShareUnit(std::span<const KvKind> kinds, std::uint32_t page_tokens);
  // Checks SharePrefix(request, source, resume): kNotFound (either unknown), kInvalidArgument
  // (request == source, resume not a multiple of `unit`), kOutOfRange (resume past the
  // source's tokens), kFailedPrecondition (the request holds a token or was appended to; the
  // source's ring no longer holds [RingFirst(resume), resume)), kUnsupported (over frames).
  Status CheckShare(RequestId request, RequestId source, std::uint32_t resume, std::uint32_t unit) const;
  // REQUIRES: CheckShare is Ok. The request adopts the source's prefix of `resume` tokens;
  // returns the copies of partly filled blocks (above).
  std::vector<KindBlockCopy> SharePrefix(RequestId request, RequestId source, std::uint32_t resume);
  // The tokens of the request's shared prefix (0: none). kNotFound.
  Result<std::uint32_t> SharedTokensOf(RequestId request) const;
  // Holders of kind k's block id (0: free). Logical ids only (no frames).
  std::uint32_t HoldersOf(std::uint32_t k, std::uint32_t id) const {
    return id < pools_[k].holders.size() ? pools_[k].holders[id] : 0;
  }
  // Releases all of the request's entries of every kind. kNotFound.
  Status Free(RequestId request);
  // Over frames: compacts kind k's frames (KindFrames::Compact); a moved block keeps its
  // entries and takes its new id in its request's page table. The blocks of `pinned`
  // requests (those a step in flight reads) stay. Returns the frames returned to the budget.
  // kFailedPrecondition without frames, kOutOfRange (k), kInvalidArgument (k addressed).
  Result<std::uint32_t> Compact(std::uint32_t k, std::span<const RequestId> pinned);

  // The request's page table of a non-addressed kind k (kind_entries.h above; the
  // addressed kinds' pages are the directory's): kNotFound, kOutOfRange (k),
  // kInvalidArgument (k addressed).
  Result<KindPages> PagesOf(RequestId request, std::uint32_t k) const;
  // Ids of kind k's pool in use / minted (for tests and reports; over frames, the frames').
  std::uint32_t BlocksInUse(std::uint32_t k) const;
  std::uint32_t BlockExtent(std::uint32_t k) const { return pools_[k].extent; }
  // The sparse kind's entries of every request, and where they sit over frames: on device
  // up to the free frames' share, the rest on host.
  std::uint64_t SparseEntries() const { return sparse_entries_; }
  std::uint64_t SparseDeviceShare() const;
  std::uint64_t SparseDeviceEntries() const { return std::min(sparse_entries_, SparseDeviceShare()); }
  std::uint64_t SparseHostEntries() const { return sparse_entries_ - SparseDeviceEntries(); }
  // The frames the blocks sit in; nullptr without.
  const KindFrames* frames() const { return frames_; }

  Status CheckInvariants(std::string_view who) const;
  void AddToDigest(StateDigest& d) const;

 private:
  struct KindState {        // one request's entries of one non-addressed kind
    std::uint32_t first = 0;  // first live entry (ring); 0 otherwise
    std::uint32_t end = 0;    // entries made: live entries are [first, end)
    std::vector<std::uint32_t> blocks;  // [ceil(end / 64) - first / 64] ids, the request's blocks in order
  };
  struct Request {
    std::uint32_t tokens = 0;
    std::uint32_t most = 0;         // the most tokens it ever held (what a rollback may restore)
    std::uint32_t reach = 0;        // 1 + the first token of its latest round (what the ring frees by)
    bool appended = false;          // appended to (its per-request entries are held, if whole)
    bool whole = true;              // this rank holds its ring and per-request kinds
    bool round_pending = false;     // listed in round_pending_ (reach < most since an Append)
    std::uint32_t shared = 0;       // tokens of its shared prefix (SharePrefix): Truncate stays at or above
    std::vector<KindState> kinds;   // [num_kinds] (addressed kinds: unused)
  };
  struct Pool {  // one kind's logical block ids
    std::uint32_t extent = 0;        // ids [0, extent) were minted
    std::set<std::uint32_t> free;    // minted, not in use; the lowest is reused first
    std::vector<std::uint32_t> holders;  // [extent] requests listing the id; 0 iff free
    std::uint32_t Take();
    // Drops one holder; the id is free when the last goes.
    void Give(std::uint32_t id) {
      if (--holders[id] == 0) free.insert(id);
    }
    void Hold(std::uint32_t id) { ++holders[id]; }
  };

  // The entries [first, end) kind k holds at `tokens` tokens, given the ring's first so far.
  void Resize(std::uint32_t k, KindState& s, std::uint32_t first, std::uint32_t end);
  // Blocks a Resize to [first, end) takes and gives back.
  struct BlockDelta {
    std::uint32_t takes = 0, gives = 0;
  };
  // Blocks of s to give back from the front for [first, end): all older than `first`.
  static std::size_t DropFront(const KindState& s, std::uint32_t first, std::uint32_t end);
  static BlockDelta ResizeDelta(const KindState& s, std::uint32_t first, std::uint32_t end);
  // Kind k's [first, end) at `tokens` tokens, a ring freed by `reach` (REQUIRES: not
  // addressed, not per-request).
  // A ring of a request not held whole here: [0, 0).
  std::pair<std::uint32_t, std::uint32_t> RangeAt(std::uint32_t k, const Request& req, const KindState& s,
                                                  std::uint32_t reach, std::uint32_t tokens) const;
  // A ring's first live token once its rounds reached `reach`: reach - ring_tokens (or 0).
  static std::uint32_t RingFirst(const KvKind& kind, std::uint32_t reach);
  // The request's reach after an Allocate of n_tokens more (its first token's position + 1).
  static std::uint32_t ReachAfter(const Request& req, std::uint32_t n_tokens);
  std::uint32_t TakeBlock(std::uint32_t k);
  void GiveBlock(std::uint32_t k, std::uint32_t id);
  Status CheckFrames(std::string_view who) const;
  std::uint32_t EntriesAt(std::uint32_t k, std::uint32_t tokens) const {
    return tokens / kinds_[k].tokens_per_entry;
  }
  // This rank's entries of the kAppend kind k (not addressed) at `tokens` tokens.
  std::uint32_t HeldAt(std::uint32_t k, std::uint32_t tokens) const { return StripeEntries(EntriesAt(k, tokens)); }

  std::vector<KvKind> kinds_;
  std::vector<bool> addressed_;  // [num_kinds]
  std::uint32_t sparse_ = 0;
  std::vector<Pool> pools_;      // [num_kinds] (addressed kinds: unused)
  std::unordered_map<RequestId, Request> requests_;
  // The requests whose rings hold a round's tokens EndRound frees (reach < most after an
  // Append; a freed one is skipped): EndRound visits these, not every request (visiting all
  // made a prefill of N requests in chunks quadratic in N).
  std::vector<RequestId> round_pending_;
  KindFrames* frames_ = nullptr;          // null: logical ids (pools_)
  std::uint64_t sparse_host_entries_ = 0;  // over frames: the sparse kind's host tier
  std::uint64_t sparse_entries_ = 0;      // the sparse kind's entries of every request
  Share share_;                           // the rank whose entries these are
};

}  // namespace ula
