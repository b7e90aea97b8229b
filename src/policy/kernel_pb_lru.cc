#include "policy/kernel_pb_lru.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <string>

#include "core/digest.h"
#include "kernels/omp_team.h"
#include "ula/check.h"

namespace ula::policy {

KernelPbLru::KernelPbLru(std::uint32_t capacity, const PolicyOptions& options)
    : capacity_(capacity),
      recent_(options.recent_buckets),
      parallel_min_slots_(std::max<std::uint32_t>(1, options.parallel_min_slots)),
      num_words_((capacity + 63) / 64),
      num_summary_((num_words_ + 63) / 64),
      words_(std::size_t{recent_ + 2} * num_words_, 0),
      summary_(std::size_t{recent_ + 2} * num_summary_, 0),
      counts_(recent_ + 2, 0),
      stamps_(capacity, 0),
      block_counts_(std::size_t{recent_ + 1} * num_summary_),
      block_offsets_(block_counts_.size()) {}

kernels::PbLruArrays KernelPbLru::arrays() const {
  return const_cast<KernelPbLru*>(this)->mutable_arrays();
}

kernels::PbLruArrays KernelPbLru::mutable_arrays() {
  kernels::PbLruArrays a;
  a.words = words_.data();
  a.summary = summary_.data();
  a.counts = counts_.data();
  a.stamps = stamps_.data();
  a.clock = &clock_;
  a.recent = recent_;
  a.capacity = capacity_;
  a.num_words = num_words_;
  a.num_summary = num_summary_;
  return a;
}

void KernelPbLru::LoadFrom(const kernels::PbLruArrays& src) {
  ULA_CHECK(src.capacity == capacity_ && src.recent == recent_);
  std::memcpy(words_.data(), src.words, words_.size() * sizeof(std::uint64_t));
  std::memcpy(summary_.data(), src.summary, summary_.size() * sizeof(std::uint64_t));
  std::memcpy(counts_.data(), src.counts, counts_.size() * sizeof(std::uint64_t));
  std::memcpy(stamps_.data(), src.stamps, stamps_.size() * sizeof(std::uint32_t));
  clock_ = *src.clock;
}

void KernelPbLru::Insert(SlotId slot) noexcept {
  ULA_DCHECK(slot.value() < capacity_ && stamps_[slot.value()] == 0);
  const std::uint32_t s = slot.value();
  const OmpTeam one(1);
  kernels::omp::PbInsert(0, mutable_arrays(), &s, 1, nullptr);
}

void KernelPbLru::Remove(SlotId slot) noexcept {
  ULA_DCHECK(IsTracked(slot));
  if (!IsTracked(slot)) return;
  const OmpTeam one(1);
  kernels::omp::PbRemove(0, mutable_arrays(), slot.value());
}

void KernelPbLru::Touch(std::span<const SlotId> slots) noexcept {
  static_assert(sizeof(SlotId) == sizeof(std::uint32_t));
  const OmpTeam team(TeamFor(slots.size()));
  kernels::omp::PbTouch(0, mutable_arrays(), reinterpret_cast<const std::uint32_t*>(slots.data()),
                        static_cast<std::uint32_t>(slots.size()), nullptr);
}

std::size_t KernelPbLru::ClaimVictims(std::span<SlotId> out) noexcept {
  const auto need = static_cast<std::uint32_t>(std::min<std::uint64_t>(out.size(), NumEvictable()));
  if (need == 0) return 0;
  auto* slots = reinterpret_cast<std::uint32_t*>(out.data());
  const kernels::PbLruArrays pb = mutable_arrays();
  const OmpTeam team(TeamFor(need));
  kernels::omp::PbTakeVictims(0, pb, need, nullptr, block_counts_.data(), block_offsets_.data(), slots);
  kernels::omp::PbTouch(0, pb, slots, need, nullptr);  // claimed: used in this round
  return need;
}

void KernelPbLru::AdvanceRound() noexcept {
  const kernels::PbLruArrays pb = mutable_arrays();
  const OmpTeam team(TeamFor(capacity_));
  if (clock_.round == ~std::uint32_t{0}) kernels::omp::PbRebase(0, pb);
  kernels::omp::PbAdvance(0, pb);
}

std::uint32_t KernelPbLru::TeamFor(std::size_t slots) const noexcept {
  return slots >= parallel_min_slots_ ? static_cast<std::uint32_t>(omp_get_max_threads()) : 1;
}

void KernelPbLru::SetRoundForTesting(std::uint32_t round) noexcept {
  // Keep every age: stamps move with the round (cold ages clamp to R + 1).
  for (std::uint32_t& s : stamps_) {
    if (s == 0) continue;
    const std::uint32_t age = std::min(clock_.round - s, recent_ + 1);
    s = round - age;
  }
  clock_.round = round;
}

int KernelPbLru::AgeOf(SlotId slot) const noexcept {
  const std::uint32_t s = slot.value();
  if (s >= capacity_ || stamps_[s] == 0) return -1;
  return static_cast<int>(std::min(clock_.round - stamps_[s], recent_ + 1));
}

Status KernelPbLru::CheckInvariants() const {
  auto bad = [](const std::string& m) { return MakeError(ErrorCode::kInternal, "KernelPbLru: " + m); };
  const std::uint32_t buckets = recent_ + 2;
  std::uint64_t total = 0;
  for (std::uint32_t b = 0; b < buckets; ++b) {
    const std::uint64_t* w = words_.data() + std::size_t{b} * num_words_;
    const std::uint64_t* sum = summary_.data() + std::size_t{b} * num_summary_;
    std::uint64_t count = 0;
    for (std::uint32_t i = 0; i < num_words_; ++i) {
      count += static_cast<std::uint64_t>(std::popcount(w[i]));
      if (((sum[i >> 6] >> (i & 63)) & 1) != (w[i] != 0 ? 1u : 0u)) {
        return bad("bucket " + std::to_string(b) + " summary bit of word " + std::to_string(i) + " is wrong");
      }
    }
    for (std::uint32_t k = 0; k < num_summary_; ++k) {
      const std::uint32_t valid = std::min<std::uint32_t>(64, num_words_ - k * 64);
      if (valid < 64 && (sum[k] >> valid) != 0) return bad("summary bit past the last word");
    }
    if (capacity_ % 64 != 0 && num_words_ > 0 && (w[num_words_ - 1] >> (capacity_ % 64)) != 0) {
      return bad("a bit at or past capacity is set");
    }
    if (count != counts_[b]) return bad("bucket " + std::to_string(b) + " count differs from its popcount");
    total += count;
  }
  if (total != clock_.tracked) return bad("bucket counts do not sum to the tracked count");
  if (clock_.cur > recent_ || clock_.round == 0) return bad("clock out of range");
  // Each set bit's stamp names its bucket; each slot is set in one bucket iff it is tracked.
  std::vector<std::uint8_t> seen(capacity_, 0);
  for (std::uint32_t b = 0; b < buckets; ++b) {
    const std::uint64_t* w = words_.data() + std::size_t{b} * num_words_;
    for (std::uint32_t i = 0; i < num_words_; ++i) {
      for (std::uint64_t bits = w[i]; bits != 0; bits &= bits - 1) {
        const std::uint32_t s = (i << 6) | static_cast<std::uint32_t>(std::countr_zero(bits));
        if (seen[s]++ != 0) return bad("slot " + std::to_string(s) + " is in two buckets");
        if (stamps_[s] == 0 || stamps_[s] > clock_.round) return bad("slot " + std::to_string(s) + " is bucketed but its stamp is not a past round");
        const std::uint32_t age = std::min(clock_.round - stamps_[s], recent_ + 1);
        const std::uint32_t want = age <= recent_ ? (clock_.cur >= age ? clock_.cur - age : clock_.cur + recent_ + 1 - age)
                                                  : recent_ + 1;
        if (b != want) return bad("slot " + std::to_string(s) + " is not in the bucket its stamp names");
      }
    }
  }
  for (std::uint32_t s = 0; s < capacity_; ++s) {
    if ((seen[s] != 0) != (stamps_[s] != 0)) return bad("slot " + std::to_string(s) + " tracked and bucketed disagree");
  }
  return Ok();
}

std::size_t KernelPbLru::MemoryBytes() const {
  return (words_.capacity() + summary_.capacity() + counts_.capacity()) * sizeof(std::uint64_t) +
         stamps_.capacity() * sizeof(std::uint32_t) +
         (block_counts_.capacity() + block_offsets_.capacity() + slots_.capacity()) * sizeof(std::uint32_t);
}

std::uint64_t KernelPbLru::DebugDigest() const {
  // PbLru::DebugDigest's sequence: ring size, cur, each ring bucket (size, count, words), cold,
  // tracked, round, stamps.
  StateDigest d;
  d.Add(std::uint64_t{recent_} + 1);
  d.Add(clock_.cur);
  for (std::uint32_t b = 0; b < recent_ + 2; ++b) {
    d.Add(capacity_);
    d.Add(counts_[b]);
    for (std::uint32_t i = 0; i < num_words_; ++i) d.Add(words_[std::size_t{b} * num_words_ + i]);
  }
  d.Add(clock_.tracked);
  d.Add(clock_.round);
  d.AddAll(std::span<const std::uint32_t>(stamps_));
  return d.value();
}

}  // namespace ula::policy
