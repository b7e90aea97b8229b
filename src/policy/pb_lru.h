// PbLru: parallel bucketed LRU (docs/ARCHITECTURE.md, "Decisions") over hierarchical bitmaps.
//
// State: R + 1 ring buckets and one cold bucket, each a HierBitmap with one bit per slot.
// ring_[cur_] is the *current* bucket (slots used in this round); ring_[cur_ - a] (mod R+1)
// holds the slots whose last use was a rounds ago, for a = 1..R; cold_ holds every tracked
// slot last used more than R rounds ago. Beside the buckets, stamp_[s] is the round of the
// slot's last use (0 = untracked), so a slot's bucket is known in O(1):
//   age = round_ - stamp_[s];  bucket = age <= R ? ring_[cur_ - age] : cold_.
// The stamp never has to change when the ring advances: a slot's age grows by itself, and
// the fold into cold_ is a bitmap operation only.
//
// Invariants (CheckInvariants):
//   - every tracked slot lives in exactly one bucket; an untracked slot in none
//     (the buckets are pairwise disjoint and their counts sum to tracked_);
//   - a slot is tracked iff stamp_[s] != 0, and the bucket holding it is the one its stamp
//     names (the O(1) age agrees with the bucket scan);
//   - the Touch scratch (touch_bits_, the word and straggler lists) and the parallel claim's
//     taken-word lists are empty between calls.
// Operations, all bitmap operations plus one stamp per used slot — no per-slot list:
//   - Touch/Insert/ClaimVictims move slots into the current bucket and stamp them;
//   - AdvanceRound moves the ring by one; the bucket about to be reused (last used R+1
//     rounds ago) is folded into cold_ word by word (cold |= b; b = 0);
//   - victims: cold_ first, then the recent buckets oldest to newest, lowest slot index
//     first inside a bucket (found through the summary levels); never the current bucket
//     (docs/ARCHITECTURE.md invariant 3).
// Touch, one pass over the batch (branch-free: the data sets the list lengths): stamp each
// slot with the round, mark it in a scratch word array (which dedups the batch: a slot
// whose old stamp is the round is a duplicate or already current) and list the slots that
// were not used in the previous round with their old stamps ("stragglers"). Then each
// straggler is cleared from the bucket its old stamp names (O(1), no probing of R
// buckets), and each touched 64-slot word is taken from the newest recent bucket with one
// AND-NOT (with overlapping selections, most touched slots were used last round) and OR-ed
// into the current bucket. When the batch has at least PolicyOptions::parallel_min_slots
// slots, the pass over the batch is split over OpenMP threads (atomic exchange per stamp,
// atomic fetch_or per scratch word, per-thread lists); the bucket updates stay on the
// calling thread.
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
// Costs: Touch O(batch + touched words), Insert/Remove/IsTracked/AgeOf O(1),
// ClaimVictims(n) O(n + non-empty buckets * levels), AdvanceRound O(non-empty words of the
// folded bucket). Metadata: (R + 2) bits + a 32-bit stamp per slot, plus summaries, plus one
// scratch bit. After 2^32 rounds the stamps are rebased once (O(capacity)).
// Parallel victim claiming (ClaimVictimsParallel): the same victims, in
// the same order, as ClaimVictims, with the per-slot work split over a ForkJoin team of T
// lanes. The demand is first cut into per-bucket quotas from the buckets' counts (O(1) each:
// cold first, then the recent buckets oldest to newest). Each bucket's level-0 words (W per
// bucket) are cut into T consecutive ranges, lane l owning the l-th: for a bucket taken whole
// W*l/T .. W*(l+1)/T; for a bucket of which a quota of q of its c slots is taken, the words
// [0, E) that hold them at the bucket's mean density (E = ceil(q W / c) + 1) are split
// evenly and the last lane's range runs to W (any cut in slot order gives the same result;
// this one shares the work). Pass 1 (parallel): each lane popcounts its words of each
// bucket, walking the summaries, and stops once it has counted the quota. Then (calling
// thread) an exclusive prefix sum over the lanes gives lane l the ranks
// [start_l, start_l + count_l) of the bucket's set bits in slot order (exact below the
// quota); it owns the victims of rank < quota among them. Pass 2 (parallel): each lane writes its victims to
// out[bucket offset + start_l ...], stamps them with the round and records the words it took
// (word, mask). Finally the calling thread clears those bits from their buckets and sets them
// in the current bucket, one AND-NOT and one OR per word (a HierBitmap's summary words and
// count are shared across word ranges, so the bitmap writes stay on one thread). The lanes'
// word ranges, their slots (stamps), their out ranges and their scratch are disjoint, and
// nothing writes a bucket while the lanes run: no atomics, no locks; ForkJoin makes the fork
// and the join visible to ThreadSanitizer. The lanes are fixed by the team's max_threads(),
// not by how many OpenMP threads ran, so the result never depends on the team.
//
// Thread-safety: none for callers (one driver thread); Touch and ClaimVictimsParallel use
// OpenMP internally.
#pragma once

#include <algorithm>
#include <vector>

#include "policy/fork_join.h"
#include "core/hier_bitmap.h"
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
  // PolicyOptions::prefer_shadowed: the hint is kept (one bit per slot) and ClaimVictims
  // takes each bucket's shadowed slots before its others. Off: ignored.
  void SetShadowed(SlotId slot, bool shadowed) noexcept override {
    if (shadowed_.empty()) return;
    const std::uint64_t bit = std::uint64_t{1} << (slot.value() & 63);
    if (shadowed) shadowed_[slot.value() >> 6] |= bit;
    else shadowed_[slot.value() >> 6] &= ~bit;
  }
  bool prefers_shadowed() const { return !shadowed_.empty(); }
  // Claims exactly out.size() victims: the slots ClaimVictims(out) would claim, in the same
  // order, with the same state after, the work split over `team`'s lanes (header comment).
  // kResourceExhausted if out.size() > NumEvictable(): nothing changes.
  // Costs: per lane and pass O(planned buckets * levels + its non-zero words up to the
  // quota), about O(need / T) slot writes per lane when the bucket's density is even, then
  // O(claimed words) bitmap word operations and O(T * planned buckets) on the calling thread,
  // plus two fork/joins (the floor that makes small demands cheaper serial).
  Status ClaimVictimsParallel(std::span<SlotId> out, ForkJoin& team);
  std::uint64_t NumEvictable() const noexcept override { return tracked_ - current().Count(); }
  void AdvanceRound() noexcept override;
  bool IsTracked(SlotId slot) const override { return slot.value() < capacity_ && stamp_[slot.value()] != 0; }
  bool UsedInCurrentRound(SlotId slot) const override { return stamp_[slot.value()] == round_; }
  Status CheckInvariants() const override;
  std::size_t MemoryBytes() const override;
  std::uint64_t DebugDigest() const override;

  // The bucket the slot lives in: 0 = current, a in 1..R = used a rounds ago, R + 1 = cold,
  // -1 = untracked. O(1), from the stamp.
  int AgeOf(SlotId slot) const noexcept {
    const std::uint32_t s = slot.value();
    if (s >= capacity_ || stamp_[s] == 0) return -1;
    return static_cast<int>(std::min(round_ - stamp_[s], recent_buckets() + 1));
  }
  // The same, found by testing every bucket (O(R)); for tests of the O(1) path.
  int AgeOfByScan(SlotId slot) const;
  // Rebases the round counter to `round` (>= R + 2) keeping every slot's age; what the
  // wrap after 2^32 rounds does. For tests of that wrap.
  void RebaseRoundsForTesting(std::uint32_t round) noexcept { RebaseRounds(round); }
  std::uint32_t recent_buckets() const { return static_cast<std::uint32_t>(ring_.size() - 1); }
  // The buckets a victim may come from, in ClaimVictims' order — cold, then the recent buckets
  // oldest to newest, never the current one — as their level-0 words ([capacity / 64] each)
  // and counts, for the step's kernels (src/kernels: the victims are the lowest set bits of
  // these words read in this order). Replaces the lists' contents; the pointers are valid
  // until the next non-const call. Claiming the slots found there is Touch(victims).
  void VictimBuckets(std::vector<const std::uint64_t*>& words, std::vector<std::uint64_t>& counts) const {
    words.clear();
    counts.clear();
    words.push_back(cold_.words());
    counts.push_back(cold_.Count());
    for (std::uint32_t age = recent_buckets(); age >= 1; --age) {
      words.push_back(RingAt(age).words());
      counts.push_back(RingAt(age).Count());
    }
  }
  // VictimBuckets' buckets' first summary levels (HierBitmap::summary_words: null for a
  // bitmap of one level), in the same order.
  void VictimBucketSummaries(std::vector<const std::uint64_t*>& summaries) const {
    summaries.clear();
    summaries.push_back(cold_.summary_words());
    for (std::uint32_t age = recent_buckets(); age >= 1; --age) summaries.push_back(RingAt(age).summary_words());
  }

 private:
  const HierBitmap& current() const { return ring_[cur_]; }
  // The ring bucket of slots last used `age` rounds ago. REQUIRES: age <= R.
  // No division: this runs once per probed bucket per touched word.
  std::size_t RingIndex(std::uint32_t age) const { return cur_ >= age ? cur_ - age : cur_ + ring_.size() - age; }
  HierBitmap& RingAt(std::uint32_t age) { return ring_[RingIndex(age)]; }
  const HierBitmap& RingAt(std::uint32_t age) const { return ring_[RingIndex(age)]; }
  HierBitmap& BucketAt(std::uint32_t age) { return age <= recent_buckets() ? RingAt(age) : cold_; }

  // Claims up to out.size() - n slots of `bucket` into out[n..], lowest first; with `mask`,
  // only slots whose mask bit is set. Returns the new n.
  std::size_t TakeFromMasked(HierBitmap& bucket, std::span<SlotId> out, std::size_t n, const std::uint64_t* mask) noexcept;
  void MarkSerial(std::span<const SlotId> slots) noexcept;
  void MarkParallel(std::span<const SlotId> slots) noexcept;
  // Moves every marked slot into the current bucket, stamps it, and clears the scratch.
  void ApplyMarked() noexcept;
  void RebaseRounds(std::uint32_t round) noexcept;
  // Claims up to `need` slots of `bucket` into out[n...]; returns the new n.
  std::size_t TakeFrom(HierBitmap& bucket, std::span<SlotId> out, std::size_t n) noexcept;

  std::uint32_t capacity_;
  std::uint32_t parallel_min_slots_;
  std::vector<HierBitmap> ring_;  // [R + 1] ring_[cur_] = current bucket
  std::size_t cur_ = 0;
  HierBitmap cold_;
  std::uint64_t tracked_ = 0;
  std::uint32_t round_ = 1;            // rounds start at 1; 0 marks an untracked slot
  std::vector<std::uint32_t> stamp_;  // [capacity] round of last use, 0 = untracked
  std::vector<std::uint64_t> shadowed_;  // [capacity / 64] prefer_shadowed: slots with a live host shadow (else empty)

  // Touch scratch, empty between calls.
  std::vector<std::uint64_t> touch_bits_;  // [ceil(capacity / 64)] marked slots of the batch
  std::vector<std::uint32_t> word_list_;   // [ceil(capacity / 64) + 1] words that became non-zero
  std::vector<std::uint64_t> stragglers_;  // [>= batch] (old stamp << 32 | slot), not last used last round
  std::size_t num_words_ = 0, num_stragglers_ = 0;  // used prefixes of the two lists above
  ForkJoin fork_join_;
  std::vector<std::vector<std::uint32_t>> parallel_words_;       // [threads] MarkParallel's lists
  std::vector<std::vector<std::uint64_t>> parallel_stragglers_;  // [threads]

  // ClaimVictimsParallel scratch (meaningful only during a call).
  struct ClaimQuota {
    HierBitmap* bucket;
    std::size_t offset;  // first index in out of this bucket's victims
    std::size_t take;    // victims taken from it, <= its count
    std::size_t span;    // words [0, span) split evenly over the lanes (the last lane's range ends at W)
  };
  struct TakenWord {
    std::uint32_t quota;  // index in claim_quotas_
    std::uint32_t word;
    std::uint64_t mask;   // bits of the word taken
  };
  std::vector<ClaimQuota> claim_quotas_;
  std::vector<std::uint64_t> claim_first_;            // [quotas * lanes] exclusive prefix: lane l's first rank
  std::vector<std::uint64_t> claim_lane_counts_;      // [quotas * lanes] pass 1's counts
  std::vector<std::vector<TakenWord>> claim_taken_;   // [lanes] words taken by each lane
};

}  // namespace ula::policy
