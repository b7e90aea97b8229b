// LfuAged (lfu_aged.h).
#include "policy/lfu_aged.h"

#include <fmt/format.h>

#include <algorithm>

#include "core/digest.h"
#include "ula/check.h"

namespace ula::policy {

LfuAged::LfuAged(std::uint32_t capacity, const PolicyOptions& options)
    : capacity_(capacity), aging_rounds_(options.lfu_aging_rounds), stamp_(capacity, kUntracked), count_(capacity, 0) {}

void LfuAged::Use(std::uint32_t s) {
  if (stamp_[s] == round_) return;
  stamp_[s] = round_;
  ++used_this_round_;
  if (count_[s] < 255) ++count_[s];
}

void LfuAged::Insert(SlotId slot) noexcept {
  const std::uint32_t s = slot.value();
  ULA_DCHECK(s < capacity_ && stamp_[s] == kUntracked);
  ++tracked_;
  count_[s] = 0;
  Use(s);
}

void LfuAged::Remove(SlotId slot) noexcept {
  const std::uint32_t s = slot.value();
  ULA_DCHECK(s < capacity_ && stamp_[s] != kUntracked);
  if (stamp_[s] == round_) --used_this_round_;
  stamp_[s] = kUntracked;
  count_[s] = 0;
  --tracked_;
}

void LfuAged::Touch(std::span<const SlotId> slots) noexcept {
  for (SlotId slot : slots) {
    ULA_DCHECK(slot.value() < capacity_ && stamp_[slot.value()] != kUntracked);
    Use(slot.value());
  }
}

std::size_t LfuAged::ClaimVictims(std::span<SlotId> out) noexcept {
  const std::size_t n = std::min<std::uint64_t>(out.size(), NumEvictable());
  if (n == 0) return 0;
  // Key: count (8 bits) | last use (24 bits of age, capped, older = smaller) | slot (32 bits).
  keys_.clear();
  for (std::uint32_t s = 0; s < capacity_; ++s) {
    const std::uint32_t st = stamp_[s];
    if (st == kUntracked || st == round_) continue;
    const std::uint64_t recency = std::min<std::uint32_t>(round_ - st, (1u << 24) - 1);
    keys_.push_back(std::uint64_t{count_[s]} << 56 | (((1u << 24) - 1) - recency) << 32 | s);
  }
  ULA_DCHECK(keys_.size() == NumEvictable());
  std::nth_element(keys_.begin(), keys_.begin() + static_cast<std::ptrdiff_t>(n - 1), keys_.end());
  std::sort(keys_.begin(), keys_.begin() + static_cast<std::ptrdiff_t>(n));
  for (std::size_t i = 0; i < n; ++i) {
    const auto s = static_cast<std::uint32_t>(keys_[i] & 0xffffffffu);
    out[i] = SlotId(s);
    count_[s] = 0;  // the slot now holds a new entry
    Use(s);
  }
  return n;
}

void LfuAged::AdvanceRound() noexcept {
  ++round_;
  used_this_round_ = 0;
  if (aging_rounds_ > 0 && round_ % aging_rounds_ == 0) {
    for (std::uint8_t& c : count_) c >>= 1;
  }
}

Status LfuAged::CheckInvariants() const {
  std::uint64_t tracked = 0, used = 0;
  for (std::uint32_t s = 0; s < capacity_; ++s) {
    if (stamp_[s] == kUntracked) {
      if (count_[s] != 0) return MakeError(ErrorCode::kInternal, fmt::format("lfu_aged: untracked slot {} has count {}", s, count_[s]));
      continue;
    }
    ++tracked;
    if (stamp_[s] == round_) ++used;
    if (stamp_[s] > round_) return MakeError(ErrorCode::kInternal, fmt::format("lfu_aged: slot {} stamped in the future", s));
  }
  if (tracked != tracked_ || used != used_this_round_) {
    return MakeError(ErrorCode::kInternal, fmt::format("lfu_aged: counted {} tracked / {} used, recorded {} / {}",
                                                       tracked, used, tracked_, used_this_round_));
  }
  return Ok();
}

std::size_t LfuAged::MemoryBytes() const {
  return stamp_.capacity() * sizeof(std::uint32_t) + count_.capacity() + keys_.capacity() * sizeof(std::uint64_t);
}

std::uint64_t LfuAged::DebugDigest() const {
  StateDigest d;
  d.AddAll(std::span<const std::uint32_t>(stamp_));
  d.AddAll(std::span<const std::uint8_t>(count_));
  for (std::uint64_t v : {std::uint64_t{aging_rounds_}, std::uint64_t{round_}, tracked_, used_this_round_}) d.Add(v);
  return d.value();
}

}  // namespace ula::policy
