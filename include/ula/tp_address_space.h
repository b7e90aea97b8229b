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

  // kAlreadyExists.
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
  Result<std::vector<LogicalAddr>> Allocate(RequestId request, std::uint32_t n_tokens);
  // As AddressSpace::Free; an address freed loses its home slots and hosted buffer copies.
  Status Free(RequestId request);
  // Draft rollback, as AddressSpace::Truncate (its contract and errors); the freed tokens'
  // hosted buffer copies go too, and with page_tokens 1 their addresses join their home
  // rank's free FIFO. The freed addresses of a page come back with their homes.
  Status Truncate(RequestId request, std::uint32_t length);
  // Sharing, as AddressSpace's (contract and errors), except that ShareInto has no rank
  // check: every address is homed where its stripe says.
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
  bool IsLive(LogicalAddr addr) const;
  // Ends the current round of every hosted policy: once per scheduler iteration, after
  // its attention (on every process under MPI).
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
