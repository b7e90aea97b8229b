#include "policy/exact_lru_scan.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <string>
#include <utility>

#include "core/digest.h"
#include "ula/check.h"

namespace ula::policy {

ExactLruScan::ExactLruScan(std::uint32_t capacity, const PolicyOptions& options)
    : capacity_(capacity),
      parallel_min_slots_(std::max<std::uint32_t>(1, options.parallel_min_slots)),
      stamp_(capacity, kUntracked),
      fresh_(static_cast<std::size_t>(fork_join_.max_threads()) * 8, 0) {}

void ExactLruScan::Insert(SlotId slot) noexcept {
  const std::uint32_t s = slot.value();
  ULA_DCHECK(s < capacity_ && stamp_[s] == kUntracked);
  stamp_[s] = round_;
  ++tracked_;
  ++used_this_round_;
}

void ExactLruScan::Remove(SlotId slot) noexcept {
  const std::uint32_t s = slot.value();
  ULA_DCHECK(s < capacity_ && stamp_[s] != kUntracked);
  if (stamp_[s] == kUntracked) return;
  if (stamp_[s] == round_) --used_this_round_;
  stamp_[s] = kUntracked;
  --tracked_;
}

void ExactLruScan::Touch(std::span<const SlotId> slots) noexcept {
  const std::uint32_t round = round_;
  std::uint64_t fresh = 0;
  if (slots.size() < parallel_min_slots_) {
    for (SlotId slot : slots) {
      std::uint32_t& stamp = stamp_[slot.value()];
      ULA_DCHECK(slot.value() < capacity_ && stamp != kUntracked);
      fresh += stamp != round;
      stamp = round;
    }
  } else {
    auto body = [&](std::size_t t, std::size_t begin, std::size_t end) {
      std::uint64_t mine = 0;
      for (std::size_t i = begin; i < end; ++i) {
        std::atomic_ref<std::uint32_t> stamp(stamp_[slots[i].value()]);
        if (stamp.load(std::memory_order_relaxed) == round) continue;
        mine += stamp.exchange(round, std::memory_order_relaxed) != round;
      }
      fresh_[t * 8] = mine;  // one cache line per thread
    };
    fork_join_.Run(slots.size(), body);
    for (int t = 0; t < fork_join_.max_threads(); ++t) fresh += std::exchange(fresh_[t * 8], 0);
  }
  used_this_round_ += fresh;
}

std::size_t ExactLruScan::ClaimVictims(std::span<SlotId> out) noexcept {
  const std::uint64_t need = std::min<std::uint64_t>(out.size(), NumEvictable());
  if (need == 0) return 0;
  // Pass 1: how many evictable slots of each age.
  std::array<std::uint64_t, kAgeBins> hist{};
  for (std::uint32_t s = 0; s < capacity_; ++s) {
    const std::uint32_t stamp = stamp_[s];
    if (stamp == kUntracked || stamp == round_) continue;
    ++hist[std::min<std::uint32_t>(round_ - stamp, kAgeBins - 1)];
  }
  // The youngest age that must be taken: slots of age >= min_age are at least `need`.
  std::uint32_t min_age = kAgeBins - 1;
  for (std::uint64_t taken = hist[min_age]; taken < need;) taken += hist[--min_age];
  // Pass 2: collect them, oldest first.
  candidates_.clear();
  for (std::uint32_t s = 0; s < capacity_; ++s) {
    const std::uint32_t stamp = stamp_[s];
    if (stamp == kUntracked || stamp == round_ || round_ - stamp < min_age) continue;
    candidates_.push_back((std::uint64_t{stamp} << 32) | s);
  }
  const auto mid = candidates_.begin() + static_cast<std::ptrdiff_t>(need);
  std::partial_sort(candidates_.begin(), mid, candidates_.end());
  for (std::uint64_t i = 0; i < need; ++i) {
    const auto s = static_cast<std::uint32_t>(candidates_[i]);
    stamp_[s] = round_;
    out[i] = SlotId(s);
  }
  used_this_round_ += need;
  return static_cast<std::size_t>(need);
}

void ExactLruScan::AdvanceRound() noexcept {
  ++round_;
  used_this_round_ = 0;
  if (round_ == kUntracked) {  // wrapped after 2^32 rounds: restamp every tracked slot
    for (auto& stamp : stamp_) {
      if (stamp != kUntracked) stamp = 1;
    }
    round_ = 2;
  }
}

Status ExactLruScan::CheckInvariants() const {
  std::uint64_t tracked = 0, used = 0;
  for (std::uint32_t stamp : stamp_) {
    if (stamp == kUntracked) continue;
    if (stamp > round_) return MakeError(ErrorCode::kInternal, "ExactLruScan: stamp from the future");
    ++tracked;
    used += stamp == round_;
  }
  if (tracked != tracked_ || used != used_this_round_) {
    return MakeError(ErrorCode::kInternal, "ExactLruScan: counters disagree with the stamps (tracked " +
                                               std::to_string(tracked) + " vs " + std::to_string(tracked_) + ")");
  }
  return Ok();
}

std::size_t ExactLruScan::MemoryBytes() const { return stamp_.size() * sizeof(std::uint32_t); }

std::uint64_t ExactLruScan::DebugDigest() const {
  StateDigest d;
  d.AddAll(std::span<const std::uint32_t>(stamp_));
  for (std::uint64_t v : {std::uint64_t{round_}, tracked_, used_this_round_}) d.Add(v);
  return d.value();
}

}  // namespace ula::policy
