#include "policy/exact_lru_list.h"

#include <string>

#include "core/digest.h"
#include "ula/check.h"

namespace ula::policy {

ExactLruList::ExactLruList(std::uint32_t capacity)
    : capacity_(capacity), prev_(capacity, kNil), next_(capacity, kNil), stamp_(capacity, kUntracked) {}

void ExactLruList::Unlink(std::uint32_t s) {
  const std::uint32_t p = prev_[s], n = next_[s];
  (p == kNil ? head_ : next_[p]) = n;
  (n == kNil ? tail_ : prev_[n]) = p;
  prev_[s] = next_[s] = kNil;
}

void ExactLruList::PushBack(std::uint32_t s) {
  prev_[s] = tail_;
  next_[s] = kNil;
  (tail_ == kNil ? head_ : next_[tail_]) = s;
  tail_ = s;
}

void ExactLruList::MarkUsed(std::uint32_t s) {
  if (stamp_[s] != round_) {
    stamp_[s] = round_;
    ++used_this_round_;
  }
}

void ExactLruList::Insert(SlotId slot) {
  const std::uint32_t s = slot.value();
  ULA_DCHECK(s < capacity_ && stamp_[s] == kUntracked);
  PushBack(s);
  ++tracked_;
  MarkUsed(s);
}

void ExactLruList::Remove(SlotId slot) {
  const std::uint32_t s = slot.value();
  ULA_DCHECK(s < capacity_ && stamp_[s] != kUntracked);
  Unlink(s);
  --tracked_;
  if (stamp_[s] == round_) --used_this_round_;
  stamp_[s] = kUntracked;
}

void ExactLruList::Touch(std::span<const SlotId> slots) {
  for (SlotId slot : slots) {
    const std::uint32_t s = slot.value();
    ULA_DCHECK(s < capacity_ && stamp_[s] != kUntracked);
    if (tail_ != s) {
      Unlink(s);
      PushBack(s);
    }
    MarkUsed(s);
  }
}

std::size_t ExactLruList::ClaimVictims(std::span<SlotId> out) {
  std::size_t n = 0;
  while (n < out.size() && head_ != kNil && stamp_[head_] != round_) {
    const std::uint32_t s = head_;
    Unlink(s);
    PushBack(s);
    MarkUsed(s);
    out[n++] = SlotId(s);
  }
  return n;
}

void ExactLruList::AdvanceRound() {
  ++round_;
  used_this_round_ = 0;
  if (round_ == kUntracked) {  // wrapped after 2^32 rounds: restamp every tracked slot
    round_ = 1;
    for (auto& stamp : stamp_) {
      if (stamp != kUntracked) stamp = 1;
    }
    round_ = 2;
  }
}

Status ExactLruList::CheckInvariants() const {
  std::uint64_t count = 0, used = 0;
  bool seen_current = false;
  for (std::uint32_t s = head_, p = kNil; s != kNil; p = s, s = next_[s]) {
    if (s >= capacity_ || prev_[s] != p || stamp_[s] == kUntracked) {
      return MakeError(ErrorCode::kInternal, "ExactLruList: broken list at slot " + std::to_string(s));
    }
    const bool current = stamp_[s] == round_;
    if (seen_current && !current) {
      return MakeError(ErrorCode::kInternal, "ExactLruList: an older slot follows a current-round slot");
    }
    seen_current |= current;
    used += current;
    if (++count > capacity_) return MakeError(ErrorCode::kInternal, "ExactLruList: cycle in list");
  }
  if (count != tracked_ || used != used_this_round_) {
    return MakeError(ErrorCode::kInternal, "ExactLruList: counters disagree with the list");
  }
  return Ok();
}

std::size_t ExactLruList::MemoryBytes() const {
  return (prev_.size() + next_.size() + stamp_.size()) * sizeof(std::uint32_t);
}

std::uint64_t ExactLruList::DebugDigest() const {
  StateDigest d;
  d.AddAll(std::span<const std::uint32_t>(prev_));
  d.AddAll(std::span<const std::uint32_t>(next_));
  d.AddAll(std::span<const std::uint32_t>(stamp_));
  for (std::uint64_t v : {std::uint64_t{head_}, std::uint64_t{tail_}, std::uint64_t{round_}, tracked_, used_this_round_}) d.Add(v);
  return d.value();
}

}  // namespace ula::policy
