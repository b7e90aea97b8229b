#include "policy/clock.h"

#include <algorithm>
#include <bit>
#include <string>

#include "core/digest.h"
#include "ula/check.h"

namespace ula::policy {

Clock::Clock(std::uint32_t capacity)
    : capacity_(capacity), stamp_(capacity, kUntracked), ref_((std::uint64_t{capacity} + 63) / 64, 0) {}

void Clock::MarkUsed(std::uint32_t s) {
  SetReferenced(s);
  if (stamp_[s] != round_) {
    stamp_[s] = round_;
    ++used_this_round_;
  }
}

void Clock::Insert(SlotId slot) noexcept {
  const std::uint32_t s = slot.value();
  ULA_DCHECK(s < capacity_ && stamp_[s] == kUntracked);
  ++tracked_;
  MarkUsed(s);
}

void Clock::Remove(SlotId slot) noexcept {
  const std::uint32_t s = slot.value();
  ULA_DCHECK(s < capacity_ && stamp_[s] != kUntracked);
  if (stamp_[s] == kUntracked) return;
  if (stamp_[s] == round_) --used_this_round_;
  stamp_[s] = kUntracked;
  ClearReferenced(s);
  --tracked_;
}

void Clock::Touch(std::span<const SlotId> slots) noexcept {
  for (SlotId slot : slots) {
    ULA_DCHECK(slot.value() < capacity_ && stamp_[slot.value()] != kUntracked);
    MarkUsed(slot.value());
  }
}

std::size_t Clock::ClaimVictims(std::span<SlotId> out) noexcept {
  const std::uint64_t need = std::min<std::uint64_t>(out.size(), NumEvictable());
  std::size_t n = 0;
  while (n < need) {
    const std::uint32_t s = hand_;
    hand_ = hand_ + 1 == capacity_ ? 0 : hand_ + 1;
    const std::uint32_t stamp = stamp_[s];
    if (stamp == kUntracked || stamp == round_) continue;
    if (Referenced(s)) {
      ClearReferenced(s);  // second chance
      continue;
    }
    MarkUsed(s);
    out[n++] = SlotId(s);
  }
  return n;
}

void Clock::AdvanceRound() noexcept {
  ++round_;
  used_this_round_ = 0;
  if (round_ == kUntracked) {  // wrapped after 2^32 rounds
    for (auto& stamp : stamp_) {
      if (stamp != kUntracked) stamp = 1;
    }
    round_ = 2;
  }
}

Status Clock::CheckInvariants() const {
  std::uint64_t tracked = 0, used = 0;
  for (std::uint32_t s = 0; s < capacity_; ++s) {
    if (stamp_[s] == kUntracked) {
      if (Referenced(s)) return MakeError(ErrorCode::kInternal, "Clock: untracked slot " + std::to_string(s) + " is referenced");
      continue;
    }
    ++tracked;
    used += stamp_[s] == round_;
  }
  if (capacity_ % 64 != 0 && !ref_.empty() && (ref_.back() >> (capacity_ % 64)) != 0) {
    return MakeError(ErrorCode::kInternal, "Clock: reference bit past the end");
  }
  if (tracked != tracked_ || used != used_this_round_) {
    return MakeError(ErrorCode::kInternal, "Clock: counters disagree with the stamps");
  }
  if (capacity_ > 0 && hand_ >= capacity_) return MakeError(ErrorCode::kInternal, "Clock: hand out of range");
  return Ok();
}

std::size_t Clock::MemoryBytes() const {
  return stamp_.size() * sizeof(std::uint32_t) + ref_.size() * sizeof(std::uint64_t);
}

std::uint64_t Clock::DebugDigest() const {
  StateDigest d;
  d.AddAll(std::span<const std::uint32_t>(stamp_));
  d.AddAll(std::span<const std::uint64_t>(ref_));
  for (std::uint64_t v : {std::uint64_t{hand_}, std::uint64_t{round_}, tracked_, used_this_round_}) d.Add(v);
  return d.value();
}

}  // namespace ula::policy
