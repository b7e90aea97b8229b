// Internal state of TpAddressSpace, shared with TpStepPlanner (same component).
// Layout: a replicated directory plus, for every hosted rank, one TpGroupShard per group.
// All per-group state is disjoint, which is what lets steps of different groups run on
// different threads.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <deque>
#include <memory>
#include <unordered_map>
#include <vector>

#include "space/address_refs.h"
#include "space/directory.h"
#include "space/kind_entries.h"
#include "space/pool_arenas.h"
#include "space/shard_pools.h"
#include "backend/slot_pool.h"
#include "ula/error.h"
#include "ula/tp_address_space.h"

namespace ula {

// A shard's home table: a fixed array of Locations, None (all-zero bits) until written. It is
// sized for the most addresses pages can reach (TpConfig::page_tokens), from calloc: the
// OS commits only what is written, so the worst case of partly filled pages costs address
// space, not memory. Fixed, because other ranks read it one-sidedly (tp_fabric.h).
class HomeTable {
 public:
  HomeTable() = default;
  explicit HomeTable(std::size_t n) : data_(static_cast<Location*>(std::calloc(n == 0 ? 1 : n, sizeof(Location)))), size_(n) {
    if (data_ == nullptr) std::abort();
  }
  Location& operator[](std::size_t i) { return data_.get()[i]; }
  const Location& operator[](std::size_t i) const { return data_.get()[i]; }
  const Location* data() const { return data_.get(); }
  std::size_t size() const { return size_; }

 private:
  struct Free {
    void operator()(Location* p) const { std::free(p); }
  };
  std::unique_ptr<Location, Free> data_;
  std::size_t size_ = 0;
};

// A shard's home table as a location record (AddressRecords' Get / Set, by logical address):
// the record MissFills (step/miss_fills.h) plans and publishes a TP home phase through.
struct HomeRecords {
  HomeTable& home;
  std::uint32_t num_ranks;
  Location Get(LogicalAddr a) const { return home[a.value() / num_ranks]; }
  void Set(LogicalAddr a, Location loc) { home[a.value() / num_ranks] = loc; }
};

// One rank's share of one layer group: its pools (shard_pools.h: device and host, policy,
// owner map, shadows, new entries on host) plus the home rule's table and the local buffer.
struct TpGroupShard : ShardPools {
  HomeTable home;                                // [HomeEntries(config)] indexed by address / P
  SlotPool buffer;                               // local buffer, device tier
  std::unique_ptr<ResidencyPolicy> buffer_policy;
  std::vector<LogicalAddr> buffer_owner;         // [buffer capacity]
  std::unordered_map<std::uint32_t, SlotId> buffered;  // address -> buffer slot

  // Drops the buffer copy of `a` if there is one.
  void DropCopy(LogicalAddr a) {
    auto it = buffered.find(a.value());
    if (it == buffered.end()) return;
    buffer_policy->Remove(it->second);
    (void)buffer.Free(it->second);
    buffer_owner[it->second.value()] = LogicalAddr::Invalid();
    buffered.erase(it);
  }
  void AdvanceRound() {
    ShardPools::AdvanceRound();
    buffer_policy->AdvanceRound();
  }
};

struct TpAddressSpace::State {
  State(Backend& backend, std::uint32_t page_tokens)
      : arenas(backend), dir(page_tokens, /*paged=*/page_tokens > 1) {}

  PoolArenas arenas;  // destroyed last: every pool below lives in one of them
  // The directory (directory.h), replicated: every process holds all of it. Paged when
  // page_tokens > 1; with page_tokens == 1 the home rule below mints each address.
  Directory dir;
  // page_tokens == 1: per home rank, a FIFO of freed addresses and the count minted; the
  // next rank to receive a token (round robin over ranks with room).
  std::vector<std::deque<LogicalAddr>> free_addrs;  // [P] FIFO per home rank
  std::vector<std::uint32_t> minted;                // [P] addresses r, r+P, ... handed out once
  std::uint32_t cursor = 0;
  std::vector<std::uint32_t> homed;                 // [P] live addresses per home rank
  std::uint64_t writes = 0;  // sanitizer trees: writes since the last full check (WriteCheckStride)
  bool stable_new_entries = false;  // config.stable_new_entries: fixed at Create
  bool host_shadows = false;        // config.host_shadows: fixed at Create
  // A space with kinds (tp_address_space.h, "Kinds"): rank r's share of every request's kinds
  // (kind_entries.h, "A rank's share"), replicated as the directory is, and each request's
  // window home. Empty without kinds.
  std::vector<KindEntries> kinds;                   // [P]
  std::unordered_map<RequestId, Rank> window_home;  // request -> the rank holding its window and states
  std::vector<std::uint32_t> window_homed;          // [P] requests whose window home is the rank

  // Hosted ranks: shards[r] empty for a rank not hosted here.
  std::vector<std::vector<TpGroupShard>> shards;  // [P][groups]

  TpGroupShard& at(Rank r, GroupId g) { return shards[r.value()][g.value()]; }
  const TpGroupShard& at(Rank r, GroupId g) const { return shards[r.value()][g.value()]; }
};

// The kinds' half of TpAddressSpace (space/tp_kinds.cc, tp_address_space.h "Kinds").
// The rank with the fewest window homes, the lowest on a tie: a new request's window home.
Rank NextWindowHome(const TpAddressSpace::State& st);
// Invariants 5-7 of tp_address_space.h; Ok without kinds.
Status CheckTpKinds(const TpAddressSpace::State& st, const TpConfig& c);
void AddTpKindsToDigest(const TpAddressSpace::State& st, StateDigest& d);

// Home entries of rank r that an address handed out so far can index: [0, n).
inline std::size_t HomeInUse(const TpAddressSpace::State& st, const TpConfig& c, std::uint32_t r) {
  if (c.page_tokens == 1) return st.minted[r];
  const std::uint64_t end = std::uint64_t{st.dir.next_page()} * c.page_tokens;  // addresses [0, end)
  return end > r ? static_cast<std::size_t>((end - r + c.num_ranks - 1) / c.num_ranks) : 0;
}

}  // namespace ula
