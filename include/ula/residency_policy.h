// ResidencyPolicy: which entries of one device slot pool stay on device.
//
// The policy sees slots only. A slot is *tracked* while it holds an entry and *untracked*
// while it is free (free slots are the SlotPool's business; the planner uses them before it
// asks the policy for victims). Time is counted in *rounds*: one round is one scheduling
// iteration (one decode step of the whole batch), ended by AdvanceRound().
//
// Contract shared by every implementation (tests/policy/policy_conformance_test.cc):
//   - A slot used in the current round (Insert, Touch, or returned by ClaimVictims in this
//     round) is never returned by ClaimVictims before the next AdvanceRound(): this step's
//     attention is about to read it (docs/ARCHITECTURE.md invariant 3).
//   - ClaimVictims returns distinct tracked slots, least recently used first by the
//     policy's own notion of recency, and marks them used in the current round (the caller
//     fills them with entries this round reads).
//   - NumEvictable() == tracked slots not used in the current round; ClaimVictims(n)
//     returns min(n, NumEvictable()) slots.
//   - Misuse (Insert of a tracked slot, Remove/Touch of an untracked one, a slot past
//     capacity) is a caller bug: checked with ULA_DCHECK, not an error value. The address
//     space validates the engine's input before it reaches a policy.
//
// Thread-safety: none; one policy per pool, driven by the pool's owner.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string_view>

#include "ula/error.h"
#include "ula/ids.h"

namespace ula {

class ResidencyPolicy {
 public:
  virtual ~ResidencyPolicy() = default;

  virtual std::string_view name() const = 0;
  virtual std::uint32_t capacity() const = 0;

  // A free slot now holds an entry; it counts as used in the current round.
  virtual void Insert(SlotId slot) = 0;
  // The slot's entry is gone (freed or moved off the device); the slot is untracked.
  virtual void Remove(SlotId slot) = 0;
  // These tracked slots are read in the current round. Duplicates are allowed.
  virtual void Touch(std::span<const SlotId> slots) = 0;
  // Picks up to out.size() victims (see contract above). Returns how many were written.
  virtual std::size_t ClaimVictims(std::span<SlotId> out) = 0;
  virtual std::uint64_t NumEvictable() const = 0;
  // Host shadows: the tracked slot's entry has (or no longer has) a clean host
  // copy, so evicting it moves no bytes. A hint: with PolicyOptions::prefer_shadowed PB-LRU
  // claims such slots first among equally old candidates (within one bucket); every other
  // policy, and PB-LRU without the option, ignores it. The DP address space calls it
  // whenever a shadow appears or goes (sparse/host_shadows.h).
  virtual void SetShadowed(SlotId slot, bool shadowed) {
    (void)slot;
    (void)shadowed;
  }
  virtual void AdvanceRound() = 0;

  virtual bool IsTracked(SlotId slot) const = 0;
  virtual bool UsedInCurrentRound(SlotId slot) const = 0;
  virtual Status CheckInvariants() const = 0;
  // Bytes of policy metadata for the whole pool.
  virtual std::size_t MemoryBytes() const = 0;
  // A hash of the whole state that decides future victims (stamps, buckets, list order,
  // clock hand, round counter; not scratch), for tests: equal before and after a call
  // that must change nothing (core/digest.h).
  virtual std::uint64_t DebugDigest() const = 0;
};

enum class PolicyKind : std::uint8_t {
  kPbLru,         // bucketed approximate LRU over hierarchical bitmaps
  kExactLruScan,  // a round stamp per slot, scan for the oldest
  kExactLruList,  // intrusive doubly linked list
  kClock,         // second-chance clock
  kLfuAged,       // frequency-aware: aged use counts, then recency (policy/lfu_aged.h)
  kKernelPbLru,   // PB-LRU as the step kernels' flat arrays (policy/kernel_pb_lru.h): pb_lru's victims
};

struct PolicyOptions {
  // PB-LRU: number of recent buckets in the ring (R), besides the current and cold ones.
  // 0 <= R <= kMaxRecentBuckets. Costs (R + 2) bits + a 32-bit stamp per slot. 64: on the
  // fitted selections of `ula bench policy` (configs/selection/indexer_fit.json) R = 8 loses
  // up to 0.46 pp hit rate to exact LRU (overlap 0.5; 0.10 pp at pool 0.25) and R = 64 at most
  // 0.014 pp (docs/BENCHMARKS.md, "Residency policies"; bytes per entry: "Metadata per entry
  // per group").
  std::uint32_t recent_buckets = 64;
  // PB-LRU, exact_lru_scan: a Touch of at least this many slots is split over OpenMP
  // threads; smaller ones stay on the calling thread (so batch 1 pays no fork). >= 1.
  // 2^22 (batch 2048 at top-k 2048): on the 2-core development machine the team never beat
  // the serial path up to the largest measured touch (batch 256, ~490K slots), with either
  // wait policy (docs/BENCHMARKS.md, "Residency policies"); lower it on a machine with free
  // cores after measuring with `ula bench policy --parallel-min-slots`. The parallel path
  // wants OMP_WAIT_POLICY=passive on a shared machine: libgomp reads it once, at load time,
  // so it cannot be set from here; with spinning workers a batch-4 step took 11.8 ms there
  // against 0.06 ms serial.
  std::uint32_t parallel_min_slots = 1u << 22;
  // lfu_aged: every this many rounds all use counts are halved (0: never). 16: the PB-LRU
  // ring's order of magnitude of history; `ula bench policy` reports the hit rate it buys.
  std::uint32_t lfu_aging_rounds = 16;
  // PB-LRU: among the slots of one bucket (equally old), claim those whose entry has a live
  // host shadow first (ResidencyPolicy::SetShadowed): their eviction moves no bytes. Off:
  // the bucket's slots in slot order. Measured in docs/BENCHMARKS.md, "Host shadows".
  bool prefer_shadowed = false;

  static constexpr std::uint32_t kMaxRecentBuckets = 1024;
  // kInvalidArgument naming the bad field, or Ok.
  Status Validate() const;
};

std::string_view PolicyKindName(PolicyKind kind);
// Accepts the names PolicyKindName returns ("pb_lru", "exact_lru_scan", ...).
Result<PolicyKind> ParsePolicyKind(std::string_view name);
// The policy the step planner uses unless told otherwise.
PolicyKind DefaultPolicyKind();

Result<std::unique_ptr<ResidencyPolicy>> MakePolicy(PolicyKind kind, std::uint32_t capacity,
                                                    const PolicyOptions& options = {});

}  // namespace ula
