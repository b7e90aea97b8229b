// AddressSpace (DP mode): stable logical addresses over exclusive device/host tiers.
//
// This header holds the contract of the space that DP and TP share (docs/ARCHITECTURE.md,
// "The directory"): pages, rounds, isolation, sharing, draft rollback, errors, lifetime, and
// the operations that follow them (AddRequest to Holds, Write/Read, Lookup, AddressesOf,
// AdvanceRound, the occupancy counters, CheckInvariants, DebugDigest). Both spaces run the
// same implementation of it (src/space/directory.h, src/space/shard_pools.h);
// tp_address_space.h states only what TP does differently (the home rule a mod P, the
// replicated directory, the local buffer). "Structure" and "Pools" below are DP's.
//
// Structure. For every rank r and layer group g there is a device pool D[r][g] and a
// host pool H[r][g] of the same number of slots per group, and one LocationTable per group maps a
// logical address to (tier, rank, slot). A request belongs to one rank (DP: each rank runs
// the whole model for its own requests); all of its addresses live on that rank. A logical
// address names one token; it has one entry in every group.
//
// Invariants (CheckInvariants):
//   1. Exclusive residency: a live address has exactly one authoritative location per
//      group, on its request's rank, in a slot that is allocated in that tier's pool; no
//      two live addresses share a slot; every allocated device slot holds exactly one live
//      address, and every allocated host slot holds one or is a host shadow (host_shadows:
//      a clean copy of a device entry, never read, counted free; sparse/host_shadows.h).
//   2. The device owner map is the inverse of the table for device slots; the residency
//      policy tracks exactly the occupied device slots.
//   3. Shared addresses (reference counts): refs[a] = (requests listing a) + (cache
//      references on a); a is live iff refs[a] > 0 and is freed the moment its last
//      holder lets go. A request lists an address at most once; every holder of an address
//      is on the address's rank. The owner tag of a is its allocating request's while that
//      request holds it, "shared" once only adopters or cache references hold it, none
//      when free; each request's adopted set is exactly the addresses of its list it did
//      not allocate. Free addresses have no holder.
//   Device placement (AddressSpaceConfig::device_placement): in 1 and 2, "a live address"
//   reads "a live address with a location": Allocate leaves new addresses unplaced (the
//   device places them, DeviceStep::Place) and only DeviceStep::StoreInto writes locations,
//   so a live address may have none; every location is still a live address's.
// New entries go to device: see Allocate.
//
// Pools (the coordinates of step_arrays.h). Each pool of (rank, group,
// tier) is one region per layer of the group, [PaddedRows(slots)][row_bytes]: slot s of
// layer l at base + l * PaddedRows(slots) * row_bytes + s * row_bytes. So each layer's
// device region is FlashMLA's k_cache[num_blocks][64][1][row_bytes] with stride(1) ==
// row_bytes, and a FlashMLA index is the slot (block * 64 + offset): DeviceLayerBytes.
// The group keeps one lookup (one location per (address, group)): an entry is the rows
// of the same slot in every layer of its group, and moves as one (a descriptor of
// num_layers rows). Write/Read by address take the entry as its layers' rows side by side
// (entry_bytes_of(g) bytes). Groups may have different layer counts (group_layers); every
// group has the same number of slots (one entry per address in every group), and the
// tier bytes are split over the groups by their entry sizes.
//
// A page-structured FP8 format (scales stored after each page's rows, as newer DeepSeek
// layouts do: a 64-token block is [64][row] then [64][scale]) maps onto the same
// coordinates: a slot is still block * 64 + offset, and a layer's region is
// [num_blocks][64 * row + 64 * scale]; an entry's move is then two pieces per layer (its
// row and its scale, both found from the slot) instead of one. Neither UlaCache's pools nor
// its descriptors do that split today: such an engine registers its regions and runs the
// descriptors by slot (descriptor.src_slot / dst_slot), not by offset.
//
// Pages (shared). Addresses come in pages of page_tokens (T, default 64; P is always the number of
// ranks): page p is the addresses [p * T, (p + 1) * T), and every page belongs to one
// request. Token i of a request's list (its position in AddressesOf) gets an address at
// offset i % T of its page, and tokens i and i + 1 share a page unless i + 1 is a multiple
// of T. So the list read as SGLang's page_table_1 row (one address per token position) gives
// page ids at every T-th position: page_table_1[:, ::64] // 64, as SGLang's indexer reads
// its key cache.
// A request's first token, and its first token after a ShareInto, opens a fresh page at
// offset i % T (the offsets before it are never handed out). A prefix adopted in whole
// pages (SGLang's page-aligned radix cache) keeps every page whole; a prefix ending inside
// a page leaves that page's position range split over two pages (the ::64 read then misses
// the tail). Freed pages are reused FIFO: a page whose last live address is freed (its
// request and every sharer and cache reference let go) joins the queue, and a new page
// comes from the queue's front before a never-used page is minted.
//
// The indexer's keys follow the same pages: the engine stores the key of a token (132 B
// for GLM-5's FP8 key and its scale) at the token's address, in a device key cache shaped
// [pages][T][132] like one layer of the KV pool by address, so each request's keys come in
// whole pages and page_table_1[:, ::64] // 64 names the key cache's pages too. (UlaCache's
// CPU indexer, sparse/indexer.h, scores keys by position and needs no layout.)
//
// TP (tp_address_space.h) applies the same pages over its striping (address a homed on
// rank a mod P): a page of T >= P consecutive addresses spans all P ranks.
//
// Errors (shared): unknown/duplicate request, unknown or freed address, out-of-range group, wrong
// byte count, allocation that does not fit, invalid config, adopting an address twice or
// from another rank, releasing a cache reference that is not there — each returns an
// Error and changes nothing (DebugDigest equal before and after).
//
// Rounds (shared; the prefill/decode rule): a round is one scheduler iteration, ended by
// AdvanceRound() after its attention. Entries allocated in a round, and entries a Step
// selects in it, are used in that round and are not evicted before AdvanceRound() (the
// round's attention reads them). An iteration may mix prefill chunks and decode steps:
// Allocate + Write every new token, Step each group with the iteration's selections, then
// AdvanceRound(); a step whose misses do not fit beside the round's used entries fails
// with kResourceExhausted and says so.
//
// Isolation (shared): Step takes the request of every selection (selection_run.h) and refuses an
// address that is not live for that request (freed, reused by another, another's), so no
// request is handed a slot holding another request's entry, even from a stale selection.
// "Live for the request" means the request holds a reference to it: its own allocation or
// an address it adopted with ShareInto (a shared prefix).
//
// Sharing (shared; docs/ARCHITECTURE.md "Shared prefixes"). ShareInto(request, addrs) lets a request adopt
// live addresses of its rank (a cached prefix, another request's prefix): they are
// appended to its list and gain a reference; nothing is copied or moved. Retain/Release
// take and drop references that belong to no request (a prefix cache's nodes,
// sparse_prefix_cache.h). Free(request) drops the request's references: an address another
// holder still references keeps its entry, its location and its bytes. Shared entries
// follow the residency policy like any other (a cold cached prefix drifts to host).
//
// Kinds (DP only; AddressSpaceConfig::kinds; docs/ARCHITECTURE.md, "Kinds"). A space with kinds
// counts a request's tokens T: Allocate(request, n) appends n tokens and returns the new
// addresses, which are the sparse kind's (C4) entries those tokens complete, one per
// tokens_per_entry tokens (none until a block's last token arrives: the tokens before it
// are in the compressor state), placed in the groups as single-kind entries; AddressesOf
// lists the request's C4 entries, Lookup, Write and Read take them, and their index keys
// share them. Beside them the space keeps, per request, the other kinds' logical blocks
// (KindPagesOf): the C128 entries in blocks of 64, the window ring, one entry per compressor
// state from the first Allocate. The ring frees by a round's first token: Allocate(request, n)
// at T tokens keeps the tokens from T + 1 - ring_tokens on (the window token T reads and the
// drafts a rollback may restore), so each of the n tokens finds its window live, a prefill
// chunk's first too; the round's other n - 1 tokens stay until AdvanceRound (which keeps the
// last ring_tokens) or the request's next Allocate. A block is freed once all its tokens are
// older: at most ceil((ring_tokens + n - 1) / 64) + 1 blocks during a round of n tokens,
// ceil(ring_tokens / 64) + 1 between rounds; Allocate's frame check counts the round's blocks.
// SharePrefix(request, source, tokens) adopts a prefix in whole blocks of every kind (below).
// Truncate(request, length) takes tokens: it keeps floor(length / tokens_per_entry) entries
// of each kind and restores the ring, refused (kFailedPrecondition, nothing changed) when
// the window of `length` starts before the most tokens held minus ring_tokens (a rollback of
// more than ring_draft_tokens since the ring was full). Free releases every kind. Without kind_frame_bytes the space's kind blocks are logical ids: the bytes of the
// kinds other than C4 are not held here. With it (one rank), every kind's blocks and the C4
// device slots come from one budget of frames in one buffer (src/space/kind_frames.h,
// frame_share.h): the C4 share is whatever the resident kinds leave; each layer of each kind
// is a strided view of the buffer (DeviceLayerView, KindLayerView); KindBudgetOf reports the
// shares, CompactKind returns sparse frames; docs/ARCHITECTURE.md, "Kinds".
//
// Lifetime (shared): `backend` outlives the space (held by reference; the backend's destructor
// stops the program while a space lives); the space outlives every StepPlanner over it.
// Spans from AddressesOf are valid until the next Allocate/Free of that request.
//
// Thread-safety: none; one thread drives an address space (the engine's scheduler). Data
// copies run on the backend's workers; a location changes only after its copy completed.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "ula/backend.h"
#include "ula/error.h"
#include "ula/ids.h"
#include "ula/kv_kinds.h"
#include "ula/location.h"
#include "ula/residency_policy.h"
#include "ula/step_arrays.h"

namespace ula {

namespace internal {
struct SpaceAccess;  // src/space/space_access.h: not part of the API
}  // namespace internal

// One layer of a pool's entries as a kernel reads it, a [blocks][rows][row_bytes] tensor with
// a block stride: row r of block b at base + b * block_stride + r * row_bytes.
struct LayerView {
  const std::byte* base = nullptr;  // nullptr on a backend that holds no bytes
  std::uint64_t block_stride = 0;
  std::uint32_t blocks = 0;
  std::uint32_t rows = 0;
  std::uint32_t row_bytes = 0;
  const std::byte* Row(std::uint32_t block, std::uint32_t row) const {
    return base + std::uint64_t{block} * block_stride + std::uint64_t{row} * row_bytes;
  }
};

// How one rank's budget is shared in a space with kind frames (AddressSpace::KindBudgetOf).
struct KindBudget {
  std::uint32_t frames = 0;       // the budget's frames
  std::uint32_t free_frames = 0;  // held by no kind: the C4 share
  std::vector<std::uint32_t> frames_of_kind;  // [kinds] (the sparse kind's: 0)
  std::uint64_t c4_device_slots = 0;  // per group: the free frames' C4 slots
  std::uint64_t c4_entries = 0;       // C4 entries of every request
  std::uint64_t c4_on_device = 0;     // of them on device (the same in every group)
};

struct AddressSpaceConfig {
  std::uint32_t num_ranks = 1;
  std::uint32_t num_groups = 1;
  // Bytes of one entry of one group: all layers' rows of the group (GLM-5: 4 layers x
  // 656 B). With group_layers set: the largest group's entry.
  std::uint32_t entry_bytes = 656;
  // Bytes of one layer's row of an entry (656 for GLM-5's FP8 MLA entry); 0 means
  // entry_bytes, one row per entry. See "Pools" above.
  std::uint32_t row_bytes = 0;
  // Layers of each group, when they differ (GLM-5: 19 groups of 4 layers, one of 2, the MTP
  // layer's group of 1); empty: every group has entry_bytes / row_bytes layers. Group g's
  // entry is group_layers[g] rows of row_bytes.
  std::vector<std::uint32_t> group_layers;
  // KV bytes per rank on each tier, split equally over the groups.
  std::uint64_t device_bytes_per_rank = 0;
  std::uint64_t host_bytes_per_rank = 0;
  PolicyKind policy = DefaultPolicyKind();
  PolicyOptions policy_options;
  // Tokens per page of logical addresses, in [1, 65536] (see "Pages" above): 64, the block
  // size of FlashMLA's paged KV and of SGLang's and vLLM's sparse MLA pools. 1 hands out
  // addresses one by one (the old single counter with a FIFO of freed addresses).
  std::uint32_t page_tokens = 64;
  // New entries' write slots never go stale (Allocate): every new entry
  // is placed on device, evicting, and no step of its round moves it. Off: new entries go
  // to free device slots, then host, and a step of the same round may move them (the
  // library path, where Write goes to the current location, and simulators that allocate
  // a request's future tokens as a reservation). The engine path (StepPlanner::Plan,
  // DeviceStep) needs it on and refuses a space without it: an engine writes KV at the
  // location it looked up.
  bool stable_new_entries = false;
  // Addresses on the host, slots on the device (docs/ARCHITECTURE.md, "The device step"):
  // Allocate hands out logical addresses (pages, owner tags, the request's list) without
  // placing them, Free and Truncate release addresses, and the space records what changed
  // in a placement journal (TakePlacement) that each (rank, group)'s DeviceStep applies with
  // Place, placing the new entries by Allocate's rule for stable_new_entries on the device.
  // The group tables then hold a location only for what a DeviceStep::StoreInto wrote
  // (checkpoints): a live address may be unplaced (CheckInvariants allows it), and Read or
  // Write of an unplaced entry is refused (kFailedPrecondition). Requires
  // stable_new_entries, no host_shadows and no kinds (Validate: kInvalidArgument). Refused
  // here (kUnsupported): ShareInto, Retain, Release, SharePrefix (the device's request table
  // keeps no adopted lists' updates). Refused at Create (kUnsupported) by the forms that
  // place on the host: StepPlanner (src/step/engine_modes.h). TP spaces (TpConfig) have no
  // such field: their device step places on the host between rounds.
  bool device_placement = false;
  // Clean host shadows (src/space/host_shadows.h): a fetched entry's host slot
  // keeps its bytes as a reclaimable copy, counted free everywhere, so that evicting the
  // entry later moves no bytes. Off: exclusive tiers, every eviction copies. The DP
  // StepPlanner (both paths) and Allocate keep them; DeviceStep refuses a space with them
  // (kUnsupported).
  bool host_shadows = false;
  // The kinds of KV the space holds (ula/kv_kinds.h; docs/ARCHITECTURE.md, "Kinds"). Empty:
  // one kind, one entry per token per group, as everything above describes. Otherwise the
  // groups are the selections of the one sparse kind (their layers sum to its layers, row()
  // is its row) and the other kinds sit beside it. Allocate, Truncate and Free take the
  // model's tokens and make and release the entries of every kind ("Kinds" below); the
  // host step (StepPlanner, both paths) selects C4 entries as any addresses;
  // SharePrefix shares a prefix in whole blocks of every kind; ShareInto refuses (kUnsupported).
  std::vector<KvKind> kinds;
  // With kinds: 0 keeps the kinds other than the sparse one as logical block ids (their bytes
  // are the engine's) and device_bytes_per_rank the sparse kind's. Otherwise every kind is
  // carved from one budget, device_bytes_per_rank, cut into frames of this many bytes
  // (kKindFrameBytes suits V4-Flash; "Kinds" below): no kind has a fixed share, the sparse
  // kind's device slots are what the others leave. One rank, no host shadows.
  std::uint64_t kind_frame_bytes = 0;

  // Names the first bad field.
  Status Validate() const;
  std::uint32_t device_slots_per_group() const;
  std::uint32_t host_slots_per_group() const;
  // One layer's row (row_bytes, or entry_bytes when row_bytes is 0).
  std::uint32_t row() const { return row_bytes != 0 ? row_bytes : entry_bytes; }
  // Layers of group g (REQUIRES g < num_groups) and its entry's bytes (layers x row).
  std::uint32_t layers_of(GroupId g) const {
    return group_layers.empty() ? entry_bytes / row() : group_layers[g.value()];
  }
  std::uint32_t entry_bytes_of(GroupId g) const { return layers_of(g) * row(); }
  // Bytes of one address's entries in every group (the pools' slot arithmetic).
  std::uint64_t bytes_per_address() const;
};

// Rows of every layer region of a pool: the slots rounded up to whole 64-token blocks
// (FlashMLA's k_cache[num_blocks][64][1][row_bytes]); the padding rows are never used.
inline constexpr std::uint32_t kPoolBlockTokens = 64;
inline constexpr std::uint64_t PaddedRows(std::uint32_t slots) {
  return (std::uint64_t{slots} + kPoolBlockTokens - 1) / kPoolBlockTokens * kPoolBlockTokens;
}

// Bytes of metadata per live entry per group, by part.
struct MetadataReport {
  double location_table = 0;   // 8 B per address per group
  double device_owner = 0;     // reverse map, 4 B per device slot
  double policy = 0;           // residency policy state
  double free_bitmaps = 0;     // slot pool free bitmaps
  double request_lists = 0;    // 4 B list + 4 B owner tag + 4 B reference counts per address, shared by all groups
  double host_shadows = 0;     // host_shadows on: 12 B per host slot + 4 B per device slot
  double total() const { return location_table + device_owner + policy + free_bitmaps + request_lists + host_shadows; }
};

// What the device must apply to its state in device placement mode
// (AddressSpaceConfig::device_placement), in this order: retired requests' tags cleared, new
// requests' tags set, released addresses' entries freed, seated addresses placed (in
// Allocate order, the device's rule for new entries: DeviceStep::Place). An address seated
// and released before the journal was taken appears in neither list; a request added and
// freed likewise. Every rank's steps take the requests; rank r's take seated[r] and released[r].
struct PlacementJournal {
  struct NewRequest {
    RequestId id;
    std::uint32_t tag = 0;  // its owner tag (non-zero)
    Rank rank;
  };
  struct Seat {
    LogicalAddr addr;
    std::uint32_t tag = 0;  // its request's owner tag
  };
  std::vector<NewRequest> new_requests;
  std::vector<RequestId> retired;
  std::vector<std::vector<Seat>> seated;           // [num_ranks] in Allocate order
  std::vector<std::vector<LogicalAddr>> released;  // [num_ranks]
  bool empty() const;
};

class StepPlanner;

class AddressSpace {
 public:
  static Result<std::unique_ptr<AddressSpace>> Create(const AddressSpaceConfig& config, Backend& backend);
  ~AddressSpace();
  AddressSpace(const AddressSpace&) = delete;
  AddressSpace& operator=(const AddressSpace&) = delete;

  // Registers a request served by `rank`. kAlreadyExists / kOutOfRange.
  Status AddRequest(RequestId request, Rank rank);
  // Appends n_tokens new addresses to the request (prefill or decode) and returns them, in
  // pages ("Pages" above). With stable_new_entries (config) a new token's write slot never goes stale:
  // every new entry is placed on device, in a free slot or else in the slot of an entry
  // this round has not used, chosen by the residency policy and moved to host first (the
  // move executor below); being used in this round, it stays where it is until
  // AdvanceRound(), so the location Lookup gives right after Allocate is where the engine
  // writes the token's KV and where this round's steps read it (a hit). Only when the
  // device holds nothing but this round's entries (a prefill chunk larger than the device
  // pool) does the rest go to host, and stay there for the round: a step of this round
  // that selects one is refused (kResourceExhausted; select it from the next round on).
  // Without it, new entries go to free device slots, then host (the library path).
  // (Why this and not "Step returns each row's write slots": SGLang computes out_cache_loc
  // once at schedule time and every layer writes there, and HiSparse keeps every running
  // request's newest token on device the same way; FlashMLA's sparse decode has no input
  // for a token outside the cache.)
  // With kinds, n_tokens are the model's tokens and the addresses their new C4 entries
  // ("Kinds" above). kResourceExhausted if the rank cannot hold them in every group; kIo if moving the
  // victims failed (nothing allocated then; the victims stay on device, counted as used in
  // this round: the policy has no "unclaim").
  Result<std::vector<LogicalAddr>> Allocate(RequestId request, std::uint32_t n_tokens);

  // Runs the victims' moves of Allocate: device -> host kCopy descriptors (step_arrays.h),
  // one per (victim, group), to complete before Allocate returns; Ok if every one landed.
  // Null (the default) runs them on the space's backend (its own pools). An engine that
  // owns the memory installs its copy here (StepPlanner::RegisterEngineMemory
  // installs ExecuteOnEngineMemory over the registered regions).
  using MoveExecutor = std::function<Status(std::span<const CopyDescriptor>)>;
  void SetMoveExecutor(MoveExecutor executor);
  // Drops the request's reference on every address it holds and forgets it; an address
  // no other request or cache reference holds is freed. kNotFound for an unknown request
  // (including a second Free).
  Status Free(RequestId request);
  // Draft rollback: frees the request's tokens [length, AddressesOf(request).size()), its
  // last ones (rejected MTP / EAGLE drafts, as SGLang frees a verify's rejected
  // out_cache_loc and vLLM rolls num_computed_tokens back). Each freed address loses its
  // entry in every group at once (its slots are free, its bytes unreachable). Pages: the
  // request's next token (position `length`) continues the page of its token length - 1
  // (when that is its own allocation) at offset length % T, so the freed addresses of
  // that page are the ones its next tokens get back, token i still at offset i % T ("Pages"
  // above); a page left with no live address joins the free FIFO like any freed page.
  // The re-allocated tokens are new entries (Allocate): with stable_new_entries their
  // slots never go stale in their round, whatever the truncated entries' were.
  // Rounds: call it after the round's verification read the drafts (its attention ran,
  // the step's plan completed), before or after AdvanceRound(); the freed entries may have
  // been allocated or selected in this round, and their slots may be reused by the same
  // round's next Allocate (the round's attention already ran over them).
  // Errors, nothing changed: kNotFound (unknown request), kOutOfRange (length past its
  // tokens), kFailedPrecondition (a token to free is adopted (ShareInto) or has another
  // holder (a sharer or a cache reference): shared entries are immutable, so a shared
  // prefix cannot be rolled back; or an engine step's plan is pending). O(freed tokens).
  // With kinds, `length` is in tokens ("Kinds" above); also kFailedPrecondition when the
  // rollback reaches past the window ring.
  Status Truncate(RequestId request, std::uint32_t length);
  // The request adopts live addresses (a shared prefix): appended to its list in order,
  // one more reference each. kNotFound (unknown request, an address not live),
  // kInvalidArgument (an address of another rank, one listed twice), kAlreadyExists (the
  // request already holds one), kUnsupported (a space with kinds: SharePrefix): nothing
  // changes. O(addrs log addrs + adopted).
  Status ShareInto(RequestId request, std::span<const LogicalAddr> addrs);
  // A space with kinds (no kind frames): a new request adopts the prefix of `tokens` tokens of
  // a live source request on its rank, in whole blocks of every kind (src/space/kind_entries.h,
  // "Shared prefixes"): the first resume_from = floor(tokens / A) * A tokens, A the share unit
  // (lcm of the kinds' tokens per entry, a C4 page's tokens and the ring's 64-token block: 256
  // for V4 at page_tokens 64). Their C4 entries and index keys by address (one more reference
  // each, as ShareInto), their C128 entries' full blocks and the window ring's blocks of
  // [resume_from - ring_tokens, resume_from) by reference; the last, partly filled C128 block
  // is the request's own, with the copy of its entries returned for the engine to run. The
  // request then continues with Allocate from token resume_from: it recomputes the tokens
  // [resume_from, tokens) of its prompt (the compressor states, per request, fill again from
  // position 0), reading the adopted window. Free, Retain and Release keep every kind's counts:
  // a shared entry or block is freed when its last holder goes; Truncate below resume_from is
  // refused. A cache holds a prefix of kinds by a request that adopted it and never allocates
  // (the source's ring frees its window as it decodes on).
  // Errors, nothing changed: kFailedPrecondition (no kinds; the request holds a token; the
  // source's ring no longer holds the window before resume_from; a plan pending), kNotFound
  // (either request unknown), kInvalidArgument (request == source, another rank), kOutOfRange
  // (tokens past the source's), kUnsupported (kind frames).
  Result<PrefixShare> SharePrefix(RequestId request, RequestId source, std::uint32_t tokens);
  // One cache reference more / less on each address (a prefix cache node's). Release frees
  // an address whose last reference it drops. kNotFound (an address not live),
  // kInvalidArgument (listed twice), Release: kFailedPrecondition (an address without a
  // cache reference, e.g. released twice), kResourceExhausted (more than 255 cache
  // references or 2^24 - 1 requests on one address): nothing changes.
  Status Retain(std::span<const LogicalAddr> addrs);
  Status Release(std::span<const LogicalAddr> addrs);
  // Holders of an address (requests + cache references); 0 when free or never allocated.
  std::uint32_t RefCount(LogicalAddr addr) const;
  // Whether the request holds a reference to the address (the isolation check's rule).
  bool Holds(RequestId request, LogicalAddr addr) const;

  // Entry bytes by logical address (the engine's KV write; verification reads).
  // data.size() must equal entry_bytes. kUnsupported on a counting backend. Write refuses
  // an address with more than one holder (kFailedPrecondition): a shared entry is
  // immutable, so every sharer reads the bytes it adopted.
  Status Write(LogicalAddr addr, GroupId group, std::span<const std::byte> data);
  Status Read(LogicalAddr addr, GroupId group, std::span<std::byte> out) const;

  Result<Location> Lookup(LogicalAddr addr, GroupId group) const;
  Result<std::span<const LogicalAddr>> AddressesOf(RequestId request) const;
  // A space with kinds ("Kinds" above): the request's entries of kind `kind` as an engine
  // indexes them: its tokens, live entries, block ids in order, the ring's first live
  // offset, the tokens still filling a block. The sparse kind and its companions: the pages
  // of AddressesOf (page_tokens entries each). kFailedPrecondition (no kinds), kNotFound
  // (unknown request), kOutOfRange (kind).
  Result<KindPages> KindPagesOf(RequestId request, std::uint32_t kind) const;
  Result<Rank> RankOf(RequestId request) const;
  bool IsLive(LogicalAddr addr) const;

  // Device placement mode (AddressSpaceConfig::device_placement): what changed since the
  // last call, for the device steps to apply (PlacementJournal, DeviceStep::Place); the
  // journal starts empty again. kFailedPrecondition outside the mode.
  Result<PlacementJournal> TakePlacement();

  // Ends the current round of every group's residency policy: once per scheduler
  // iteration, after its attention (see "Rounds" above). A space with kinds: every window
  // ring frees the round's tokens no later round and no rollback reads ("Kinds" above).
  void AdvanceRound();

  const AddressSpaceConfig& config() const { return config_; }
  Backend& backend() const { return backend_; }
  // Distinct live addresses (a shared one counts once).
  std::uint64_t num_live_addresses() const;
  std::uint32_t num_requests() const;
  // Entries of (rank, group) on a tier; 0 for an out-of-range rank or group. A host shadow
  // is free (it is reclaimable): NumUsed(host) counts authoritative entries only.
  std::uint32_t NumUsed(Rank rank, GroupId group, Tier tier) const;
  std::uint32_t NumFree(Rank rank, GroupId group, Tier tier) const;
  // Live host shadows of (rank, group) (0 with host_shadows off or out of range).
  std::uint32_t NumHostShadows(Rank rank, GroupId group) const;
  // Pointer to a device slot's row of layer 0 of (rank, group) — what an attention kernel
  // reads after a step; layer l's row is DeviceLayerBytes(rank, group, l)[slot * row]. nullptr for an out-of-range rank or group, a slot past the pool (also
  // SlotId::Invalid()), a free slot, or on a counting backend. Valid while the space lives;
  // the slot holds the entry the step placed there until the next Step of that (rank,
  // group) after AdvanceRound(), or the entry's Free.
  const std::byte* DeviceSlotData(Rank rank, GroupId group, SlotId slot) const;
  // The whole device pool of (rank, group): its layers' regions one after the other ("Pools"
  // above). Empty for an out-of-range rank or group or on a counting backend. Valid while
  // the space lives.
  std::span<const std::byte> DevicePoolBytes(Rank rank, GroupId group) const;
  // One layer's device region of (rank, group): PaddedRows(capacity) rows of row bytes,
  // slot s at s * row — FlashMLA's k_cache of that layer, indexed by the slots a step
  // returns. Empty for an out-of-range rank, group or layer, on a counting backend, or in a
  // space with kind frames (its layers are strided: DeviceLayerView).
  std::span<const std::byte> DeviceLayerBytes(Rank rank, GroupId group, std::uint32_t layer) const;
  // Layer `layer` of (rank, group)'s device slots in blocks of 64 (FlashMLA's paged KV, block
  // size 64): slot s is row s % 64 of block s / 64, in any space (a space with kind frames:
  // C4's blocks among the other kinds' in the budget's buffer). kOutOfRange.
  Result<LayerView> DeviceLayerView(Rank rank, GroupId group, std::uint32_t layer) const;
  // A space with kind frames: layer `layer` of kind `kind` (not the sparse one) over the
  // budget's buffer, its blocks the ids KindPagesOf gives. kFailedPrecondition (no frames),
  // kOutOfRange, kInvalidArgument (the sparse kind: DeviceLayerView).
  Result<LayerView> KindLayerView(std::uint32_t kind, std::uint32_t layer) const;
  // A space with kind frames: how its budget is shared now. kFailedPrecondition without.
  Result<KindBudget> KindBudgetOf() const;
  // Compacts kind `kind`'s frames (src/space/kind_frames.h, Compact): its sparsest frames are
  // emptied into the room of its others, each block copied before its request's page table
  // names the new block, and return to the budget, where the C4 share gets them back.
  // Returns the frames returned. kFailedPrecondition (no kind frames, a plan pending),
  // kOutOfRange (kind), kInvalidArgument (the sparse kind: its entries are the addresses).
  Result<std::uint32_t> CompactKind(std::uint32_t kind);
  MetadataReport Metadata() const;
  Status CheckInvariants() const;
  // A hash of the whole state (tables, pools and their free bitmaps, residency policies,
  // requests, the free-address FIFO in order): equal before and after a refused call.
  // For tests; O(state). core/digest.h.
  std::uint64_t DebugDigest() const;

  struct State;  // opaque; defined in src/space

 private:
  friend struct internal::SpaceAccess;  // the step's forms reach the state through it
  AddressSpace(const AddressSpaceConfig& config, Backend& backend, std::unique_ptr<State> state);
  Status RunMoves(std::span<const CopyDescriptor> moves);

  AddressSpaceConfig config_;
  Backend& backend_;
  std::unique_ptr<State> state_;
};

}  // namespace ula
