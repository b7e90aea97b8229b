// PbLru: parallel bucketed LRU (DESIGN.md Part A, "PB-LRU") over hierarchical bitmaps.
//
// State: R + 1 ring buckets and one cold bucket, each a HierBitmap with one bit per slot.
// ring_[cur_] is the *current* bucket (slots used in this round); ring_[cur_ - a] (mod R+1)
// holds the slots whose last use was a rounds ago, for a = 1..R; cold_ holds every tracked
// slot last used more than R rounds ago.
//
// Invariants (CheckInvariants):
//   - every tracked slot lives in exactly one bucket; an untracked slot in none
//     (the buckets are pairwise disjoint and their counts sum to tracked_);
//   - the Touch scratch (touch_bits_, touched_words_) is empty between calls.
// Operations, all bitmap operations — no per-slot list, no timestamps:
//   - Touch/Insert/ClaimVictims move slots into the current bucket;
//   - AdvanceRound moves the ring by one; the bucket about to be reused (last used R+1
//     rounds ago) is folded into cold_ word by word (cold |= b; b = 0);
//   - victims: cold_ first, then the recent buckets oldest to newest, lowest slot index
//     first inside a bucket; never the current bucket (DESIGN.md invariant 3).
// Touch marks the batch into a scratch word array (this also dedups it), then visits each
// touched 64-slot word once and moves whole words between buckets. When the batch has at
// least PolicyOptions::parallel_min_slots slots, the marking is split over OpenMP threads
// (atomic fetch_or per word); the bucket moves stay on the calling thread.
//
// What PB-LRU approximates. Exact LRU orders tracked slots by the time of their last use.
// PB-LRU keeps that time only at round granularity and only for the last R rounds:
//   1. slots used in the same round are tied; exact LRU (list) orders them by the order of
//      the calls within the round, PB-LRU by slot index;
//   2. all slots last used more than R rounds ago are tied in cold_ (ordered by slot index),
//      where exact LRU still orders them by age.
// Slots of different ages within the last R rounds, and any recent slot versus any cold
// slot, are ordered exactly as by an exact LRU with round stamps. With R >= the age of the
// oldest tracked slot, PB-LRU evicts exactly what ExactLruScan evicts.
//
// Costs: Touch O(batch + touched words * buckets probed), Insert O(1), Remove/IsTracked
// O(R), ClaimVictims(n) O(n + non-empty buckets * levels), AdvanceRound O(non-empty words of
// the folded bucket). Metadata: (R + 2) bits per slot plus summaries, plus one scratch bit.
// Thread-safety: none for callers (one driver thread); Touch uses OpenMP internally.
#pragma once

#include <vector>

#include "policy/fork_join.h"
#include "ula/hier_bitmap.h"
#include "ula/residency_policy.h"

namespace ula::policy {

class PbLru final : public ResidencyPolicy {
 public:
  // REQUIRES: options validated by MakePolicy.
  PbLru(std::uint32_t capacity, const PolicyOptions& options);

  std::string_view name() const override { return "pb_lru"; }
  std::uint32_t capacity() const override { return capacity_; }
  void Insert(SlotId slot) noexcept override;
  void Remove(SlotId slot) noexcept override;
  void Touch(std::span<const SlotId> slots) noexcept override;
  std::size_t ClaimVictims(std::span<SlotId> out) noexcept override;
  std::uint64_t NumEvictable() const noexcept override { return tracked_ - current().Count(); }
  void AdvanceRound() noexcept override;
  bool IsTracked(SlotId slot) const override { return AgeOf(slot) >= 0; }
  bool UsedInCurrentRound(SlotId slot) const override { return current().Test(slot.value()); }
  Status CheckInvariants() const override;
  std::size_t MemoryBytes() const override;

  // The bucket the slot lives in: 0 = current, a in 1..R = used a rounds ago, R + 1 = cold,
  // -1 = untracked. For tests and diagnostics.
  int AgeOf(SlotId slot) const;
  std::uint32_t recent_buckets() const { return static_cast<std::uint32_t>(ring_.size() - 1); }

 private:
  const HierBitmap& current() const { return ring_[cur_]; }
  // The ring bucket of slots last used `age` rounds ago. REQUIRES: age <= R.
  // No division: this runs once per probed bucket per touched word.
  std::size_t RingIndex(std::uint32_t age) const { return cur_ >= age ? cur_ - age : cur_ + ring_.size() - age; }
  HierBitmap& RingAt(std::uint32_t age) { return ring_[RingIndex(age)]; }
  const HierBitmap& RingAt(std::uint32_t age) const { return ring_[RingIndex(age)]; }
  HierBitmap& BucketAt(std::uint32_t age) { return age <= recent_buckets() ? RingAt(age) : cold_; }

  void MarkSerial(std::span<const SlotId> slots) noexcept;
  void MarkParallel(std::span<const SlotId> slots) noexcept;
  // Moves every marked slot into the current bucket and clears the scratch.
  void ApplyMarked() noexcept;
  // Claims up to `need` slots of `bucket` into out[n...]; returns the new n.
  std::size_t TakeFrom(HierBitmap& bucket, std::span<SlotId> out, std::size_t n) noexcept;

  std::uint32_t capacity_;
  std::uint32_t parallel_min_slots_;
  std::vector<HierBitmap> ring_;  // [R + 1] ring_[cur_] = current bucket
  std::size_t cur_ = 0;
  HierBitmap cold_;
  std::uint64_t tracked_ = 0;

  // Touch scratch, empty between calls.
  std::vector<std::uint64_t> touch_bits_;                  // [ceil(capacity / 64)]
  std::vector<std::vector<std::uint32_t>> touched_words_;  // [threads] words that became non-zero
  ForkJoin fork_join_;
};

}  // namespace ula::policy
