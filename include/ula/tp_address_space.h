// TpAddressSpace (TP mode, docs/ARCHITECTURE.md "TP attention at home"): one distributed address
// space over all P ranks, instead of a full copy of the latent KV on every rank.
//
// The contract it shares with AddressSpace is stated once, in address_space.h: pages,
// rounds, isolation, sharing, draft rollback (Truncate), errors (each refused call changes
// nothing), lifetime, and what stable_new_entries and host_shadows mean. Both spaces run
// one implementation of it (src/space/directory.h, src/space/shard_pools.h). This header
// states only what TP does differently: where an entry lives (its home rank), the
// replicated directory, the local buffer.
//
// Structure.
//   - Directory (replicated: every process of an MPI run holds the same one, because every
//     rank sees the same scheduler calls): requests -> their logical addresses, and the
//     address pages. Address a has its home on rank a mod P. Call every mutating method
//     (Allocate, Free, Truncate, ShareInto, Retain, Release, Write, AdvanceRound) on every
//     process.
//   - Shard of rank r, group g (held only for the ranks this object hosts: all of them
//     in-process, one per process under MPI): the pools of one DP rank (exclusive device
//     and host tiers, the residency policy, the owner map, host shadows) plus the home
//     table  home[a / P] = location of a  (a fixed array: its memory is what other ranks
//     read one-sidedly).
//   - Local buffer of rank r, group g: a device SlotPool of read-only copies of entries
//     homed on other ranks, with its own residency policy, an owner map and an index
//     address -> buffer slot. Empty (no slots) with TpAttention::kAtHome, where each
//     rank's attention covers only its own shard.
//
// Pages and striping (address_space.h "Pages" is the rule). Pages and striping agree:
// address a stays homed on rank a mod P, so a page of T >= P consecutive addresses spans
// all P ranks, T / P of its addresses on each when P divides T (rank (p*T + o) mod P for
// offset o), and a request's consecutive tokens go round robin over the ranks. A new
// token's rank is its address's: Allocate refuses (kResourceExhausted, nothing changes)
// when a rank that one of its tokens lands on has no room, even if other ranks have. T = 1
// keeps the unpaged allocator: a new token goes to the next rank, round robin, that has
// room, and freed addresses are reused FIFO per rank.
//
// Invariants (CheckInvariants, for every hosted rank):
//   1. Exclusive residency: each live address homed on r has exactly one home location per
//      group, on r, in an allocated slot no other address uses; pools hold nothing else.
//   2. Local-buffer entries are copies of live addresses homed on other ranks; each buffer
//      slot holds one, the index and the owner map agree, and (when the home is hosted here
//      and bytes exist) the copy's bytes equal the home's.
//   3. The policies track exactly the occupied device / buffer slots.
//   4. Directory: free pages hold no live address (T = 1: freed addresses sit in their home
//      rank's free list); every live address
//      has a holder: a request that lists it (a list names it at most once) or a cache
//      reference. Reference counts and owner tags as in DP mode (address_space.h,
//      "Sharing"; src/space/address_refs.h).
//
// Kinds (TpConfig::kinds; docs/ARCHITECTURE.md, "Kinds under TP"). A TP space with kinds holds
// DeepSeek-V4's kinds as the DP space does (address_space.h, "Kinds": Allocate, Truncate and
// Free take the model's tokens; the directory's addresses are the C4 entries), and every entry
// of every kind on exactly one rank:
//   - C4 entries and their index keys: the directory's addresses, homed a mod P as above;
//   - C128 entries: striped by their index j in the request, entry j on rank j mod P (the rank
//     a C4 address at the same offset of a page has when P divides page_tokens);
//   - the window ring and the compressor states: whole on the request's window home, the rank
//     with the fewest window homes when AddRequest registers it (the lowest such rank);
//     the compressor state completes each block, whose C4 / C128 entry goes to its own home.
// Structure: per rank r, a KindEntries (src/space/kind_entries.h) holding rank r's share of
// every request: its C128 stripe in local blocks of 64, and the window and states of the
// requests whose window home it is; the window homes per request. Like the directory it is
// replicated (logical block ids, no bytes): every process holds every rank's share.
// KindPagesOf(request, kind, rank) is rank r's page table of the kind. Invariants, beside 1-4
// (CheckInvariants, a rule per kind):
//   5. Each rank's share satisfies KindEntries's invariants; every rank counts the request's
//      tokens alike; the request lists exactly floor(T / 4) C4 addresses (none adopted).
//   6. C128: the ranks' entries of a request sum to floor(T / 128), rank r holding those
//      j mod P == r: no entry on two ranks, none missing.
//   7. Window and compressor states: no rank but the request's window home holds any of them;
//      the home holds one state per compressing kind once the request was allocated to, and
//      the window's ring; the window homes counted per rank match the requests.
// The step: TpStepPlanner (attention at home) selects a request's C4 entries, each on its
// home a mod P, as in a space without kinds; the other kinds never move.
// Not built (refused, naming the reason): the local buffer with kinds (Create:
// TpConfig.attention must be at_home), the device step over a TP space with kinds
// (DeviceStep::Create), prefix sharing (ShareInto; DP's SharePrefix has no TP form), kind frames.
//
// Sharing, errors, rounds and isolation: address_space.h. What differs: a shared prefix
// stays striped a mod P where it was allocated, stored once (never once per rank, both
// attention strategies); a Write or Free of an address drops every hosted buffer copy of it
// first, so a copy never outlives or disagrees with its home; the step that refuses an
// address not live for its selection's request is TpStepPlanner::Step.
//
// Lifetime: `backend` outlives the space (the backend's destructor stops the program while
// a space lives); the space outlives its planners, prefetchers and its exposure on a
// fabric (TpFabric::Unexpose first). RefData pointers: see RefData.
//
// Thread-safety: one driver thread calls the mutating methods. TpStepPlanner::Step may run
// the hosted ranks of one group on worker threads, and steps of different groups may run
// concurrently (they touch disjoint per-group state); no other call may overlap a Step.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string_view>
#include <span>
#include <vector>

#include "ula/backend.h"
#include "ula/error.h"
#include "ula/ids.h"
#include "ula/kv_kinds.h"
#include "ula/location.h"
#include "ula/residency_policy.h"

namespace ula {

namespace internal {
struct SpaceAccess;  // src/space/space_access.h: not part of the API
}  // namespace internal

// Where the attention over entries homed on other ranks runs (docs/ARCHITECTURE.md, "TP
// attention at home").
enum class TpAttention : std::uint8_t {
  // The local buffer: every rank fetches the selected entries homed elsewhere into its local
  // buffer and computes attention over the whole selection.
  kLocalBuffer = 0,
  // Every rank computes the attention of all heads over the selected entries of its own
  // shard only; the partial outputs are merged by their log-sum-exp (partial_attention.h).
  // No local buffer: no entry is ever stored twice and no KV moves between ranks.
  kAtHome = 1,
};
std::string_view TpAttentionName(TpAttention a);
// "local_buffer" or "at_home"; kInvalidArgument otherwise.
Result<TpAttention> ParseTpAttention(std::string_view name);

struct TpConfig {
  std::uint32_t num_ranks = 2;
  std::uint32_t num_groups = 1;
  std::uint32_t entry_bytes = 656;  // one group entry (all layers of the group)
  TpAttention attention = TpAttention::kLocalBuffer;
  // Per rank, split equally over the groups: the shard's device pool, its host extension,
  // and the local buffer (device memory too; must be 0 with TpAttention::kAtHome).
  std::uint64_t device_bytes_per_rank = 0;
  std::uint64_t host_bytes_per_rank = 0;
  std::uint64_t buffer_bytes_per_rank = 0;
  PolicyKind policy = DefaultPolicyKind();         // shard device pool
  PolicyKind buffer_policy = DefaultPolicyKind();  // local buffer
  PolicyOptions policy_options;
  // As AddressSpaceConfig's (address_space.h): tokens per page ("Pages"; 1: the unpaged
  // allocator above), and new entries whose write slot never goes stale (the engine path,
  // TpStepPlanner::Create and DeviceStep, needs it on; Allocate below says what differs).
  std::uint32_t page_tokens = 64;
  bool stable_new_entries = false;
  // Clean host shadows per shard (src/space/host_shadows.h), as in DP: a home
  // entry fetched host -> device keeps its host slot as a reclaimable copy, counted free in
  // every capacity figure, so that evicting it later moves no bytes. TpStepPlanner's two
  // paths (Step: every rank, the fabric included; Plan / Complete: one home plan,
  // step/miss_fills.h, as DP's) and Allocate keep them; DeviceStep refuses a space with
  // them (kUnsupported). Off: exclusive tiers, every eviction copies.
  bool host_shadows = false;
  // The kinds of KV the space holds ("Kinds" above; ula/kv_kinds.h). Empty: one kind. Otherwise
  // as AddressSpaceConfig::kinds: the groups are the selections of the one sparse kind, each
  // group's entry_bytes / its row_bytes layers, all groups' layers its layers; attention
  // must be at_home (Create refuses the local buffer with kinds: not built).
  std::vector<KvKind> kinds;

  // Names the first bad field.
  Status Validate() const;
  std::uint32_t device_slots_per_group() const;
  std::uint32_t host_slots_per_group() const;
  std::uint32_t buffer_slots_per_group() const;
  // Entries one rank's shard can hold in one group (device + host).
  std::uint32_t shard_slots_per_group() const { return device_slots_per_group() + host_slots_per_group(); }
};

// Where a rank's attention reads one selected entry: its own shard's device pool or its
// local buffer (both device memory of that rank); kElsewhere (TpAttention::kAtHome only):
// homed on another rank, whose partial attention covers it (slot invalid).
// `reader` is the rank whose plan row holds the ref: RefData refuses a ref of another rank.
struct TpReadRef {
  enum class Source : std::uint8_t { kShard = 0, kBuffer = 1, kElsewhere = 2 };
  Source source = Source::kShard;
  SlotId slot;
  Rank reader;
  bool operator==(const TpReadRef&) const = default;
};

// The memory of one (rank, group) shard that other ranks read: the home table
// (Location bits indexed by address / P: shard_slots_per_group * page_tokens entries, plus
// page_tokens when paged, from lazily committed memory) and the two pool arenas.
struct TpShardMemory {
  const Location* home = nullptr;
  std::uint32_t home_entries = 0;
  Arena device;
  Arena host;
};

class TpStepPlanner;

class TpAddressSpace {
 public:
  // Hosts every rank when hosted_ranks is empty (in-process ranks), otherwise only those
  // (one per process under MPI).
  static Result<std::unique_ptr<TpAddressSpace>> Create(const TpConfig& config, Backend& backend,
                                                        std::span<const Rank> hosted_ranks = {});
  ~TpAddressSpace();
  TpAddressSpace(const TpAddressSpace&) = delete;
  TpAddressSpace& operator=(const TpAddressSpace&) = delete;

  static Rank HomeOf(LogicalAddr a, std::uint32_t num_ranks) {
    return Rank(static_cast<std::uint16_t>(a.value() % num_ranks));
  }
  Rank HomeOf(LogicalAddr a) const { return HomeOf(a, config_.num_ranks); }
  bool Hosts(Rank r) const;
  std::span<const Rank> hosted_ranks() const { return hosted_; }

  // kAlreadyExists. With kinds, the request's window home is chosen here ("Kinds" above).
  Status AddRequest(RequestId request);
  // n_tokens new addresses in the request's pages, striped a mod P ("Pages" above; T = 1:
  // round robin over the ranks with room). On its home rank each entry goes to a free
  // device slot, else to host. With stable_new_entries (config) a new token's write slot never goes stale, as DP's Allocate
  // (address_space.h): once the rank's device pool is full, an entry goes into the slot of
  // a victim this round has not used (the shard policy's choice; the victims of one rank
  // and group are moved device -> host in one batch, waited on, before any is published),
  // and only when the device holds nothing but this round's entries does it go to host,
  // pinned there for the round: a step of the round that must move it onto device is
  // refused (kResourceExhausted, agreed by every rank as any misses-do-not-fit refusal;
  // select it after AdvanceRound()). So the location Lookup gives right after Allocate is
  // where the engine writes the token's KV and where the round's steps read it.
  // A failed victim batch differs from DP on purpose: the victims stay on device (their
  // bytes and homes unchanged) and that batch's tokens go to host, pinned, and Allocate
  // succeeds. The directory is replicated and Allocate has no collective, so a mover fault
  // on one process must not change what Allocate returns there; the pinned tokens surface
  // at the round's step instead, whose refusal every rank agrees on (NumNewOnHost counts
  // them). kNotFound, kResourceExhausted (a rank one of the tokens lands on is full, or the
  // address space is exhausted; nothing allocated then).
  // With kinds, n_tokens are the model's tokens and the addresses their new C4 entries, as
  // DP's; every rank's share of the other kinds follows ("Kinds" above); also kOutOfRange
  // (more than 2^32 - 1 tokens).
  Result<std::vector<LogicalAddr>> Allocate(RequestId request, std::uint32_t n_tokens);
  // As AddressSpace::Free; an address freed loses its home slots and hosted buffer copies.
  Status Free(RequestId request);
  // Draft rollback, as AddressSpace::Truncate (its contract and errors); the freed tokens'
  // hosted buffer copies go too, and with page_tokens 1 their addresses join their home
  // rank's free FIFO. The freed addresses of a page come back with their homes. With kinds,
  // `length` is in tokens and a rollback past the window ring is refused, as DP's.
  Status Truncate(RequestId request, std::uint32_t length);
  // Sharing, as AddressSpace's (contract and errors), except that ShareInto has no rank
  // check: every address is homed where its stripe says. A space with kinds refuses ShareInto
  // (kUnsupported): prefix sharing across kinds is DP's SharePrefix, not built for TP.
  Status ShareInto(RequestId request, std::span<const LogicalAddr> addrs);
  Status Retain(std::span<const LogicalAddr> addrs);
  Status Release(std::span<const LogicalAddr> addrs);
  std::uint32_t RefCount(LogicalAddr addr) const;
  bool Holds(RequestId request, LogicalAddr addr) const;

  // As AddressSpace::Write (its errors), after dropping the hosted buffer copies; the home
  // bytes are written where the home is hosted (call it on every process; the others only
  // drop copies).
  Status Write(LogicalAddr addr, GroupId group, std::span<const std::byte> data);
  // The home bytes. kUnsupported if the home is not hosted here or on a counting backend.
  Status Read(LogicalAddr addr, GroupId group, std::span<std::byte> out) const;
  // The home location (kUnsupported if the home is not hosted here).
  Result<Location> Lookup(LogicalAddr addr, GroupId group) const;
  // The buffer slot of `rank`'s copy of addr, or nullopt. kOutOfRange / kNotFound /
  // kUnsupported (rank not hosted).
  Result<std::optional<SlotId>> BufferSlot(Rank rank, LogicalAddr addr, GroupId group) const;
  // Bytes an attention kernel on `rank` reads for ref; nullptr if rank or group is out of
  // range or not hosted, ref.reader != rank (a ref of another rank's plan row), kElsewhere,
  // a slot past its pool or free, or on a counting backend. The pointer is valid while the
  // space lives; the slot holds the planned entry until the next Step of that group after
  // AdvanceRound(), or a Write/Free of the entry.
  const std::byte* RefData(Rank rank, GroupId group, TpReadRef ref) const;

  Result<std::span<const LogicalAddr>> AddressesOf(RequestId request) const;
  // A space with kinds ("Kinds" above): rank `rank`'s page table of the request's entries of
  // kind `kind`. The window and compressor states: the window home's whole table, on every
  // other rank no entry and no block; C128: the rank's stripe (local entry i is the request's
  // entry i * P + rank, in block i / 64 at offset i % 64); C4 and index keys: the request's
  // addresses homed on the rank (entries), in the directory's pages that hold one of them
  // (blocks: page ids, page_tokens entries each; the entry at offset o of page b is on rank
  // (b * page_tokens + o) mod P). kFailedPrecondition (no kinds), kNotFound (request),
  // kOutOfRange (kind, rank).
  Result<KindPages> KindPagesOf(RequestId request, std::uint32_t kind, Rank rank) const;
  // The rank that holds the request's window and compressor states. kFailedPrecondition (no
  // kinds), kNotFound.
  Result<Rank> WindowHomeOf(RequestId request) const;
  bool IsLive(LogicalAddr addr) const;
  // Ends the current round of every hosted policy: once per scheduler iteration, after
  // its attention (on every process under MPI). With kinds, every window ring frees the
  // round's tokens no later round reads (address_space.h, "Kinds").
  void AdvanceRound();

  const TpConfig& config() const { return config_; }
  Backend& backend() const { return backend_; }
  std::uint64_t num_live_addresses() const;
  std::uint32_t num_requests() const;
  // Live addresses homed on rank r (directory; known for every rank).
  std::uint32_t NumHomed(Rank r) const;
  // Occupancy of a hosted rank's pools (0 for a rank not hosted).
  std::uint32_t NumUsed(Rank rank, GroupId group, Tier tier) const;
  std::uint32_t NumFree(Rank rank, GroupId group, Tier tier) const;
  std::uint32_t NumBuffered(Rank rank, GroupId group) const;
  // New entries of this round pinned on a hosted rank's host pool (stable_new_entries:
  // the device held only this round's entries, or a victim batch failed); 0 after
  // AdvanceRound() and for a rank not hosted.
  std::uint32_t NumNewOnHost(Rank rank, GroupId group) const;
  // Host shadows of the shard (TpConfig::host_shadows; NumFree counts them free).
  std::uint32_t NumHostShadows(Rank rank, GroupId group) const;
  // Empty (home == nullptr) unless Hosts(rank) and group < num_groups.
  TpShardMemory ShardMemory(Rank rank, GroupId group) const;
  Status CheckInvariants() const;
  // A hash of the whole state of the hosted ranks (directory, free-address FIFOs in order,
  // home tables, pools and their free bitmaps, local buffers, residency policies): equal
  // before and after a refused call. For tests; O(state). core/digest.h.
  std::uint64_t DebugDigest() const;

  struct State;  // opaque; src/space/tp_state.h

 private:
  friend struct internal::SpaceAccess;  // the step's forms reach the state through it
  TpAddressSpace(const TpConfig& config, Backend& backend, std::vector<Rank> hosted, std::unique_ptr<State> state);
  // Frees an address whose last holder let go (home slots, hosted copies, directory).
  void FreeAddress(LogicalAddr a);

  TpConfig config_;
  Backend& backend_;
  std::vector<Rank> hosted_;
  std::unique_ptr<State> state_;
};

}  // namespace ula
