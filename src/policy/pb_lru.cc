#include "policy/pb_lru.h"

#include <algorithm>
#include <atomic>
#include <bit>
#include <string>

#include "ula/check.h"

namespace ula::policy {

PbLru::PbLru(std::uint32_t capacity, const PolicyOptions& options)
    : capacity_(capacity),
      parallel_min_slots_(std::max<std::uint32_t>(1, options.parallel_min_slots)),
      cold_(capacity),
      touch_bits_((std::uint64_t{capacity} + 63) / 64, 0) {
  ring_.reserve(options.recent_buckets + 1);
  for (std::uint32_t i = 0; i <= options.recent_buckets; ++i) ring_.emplace_back(capacity);
  touched_words_.resize(static_cast<std::size_t>(fork_join_.max_threads()));
}

int PbLru::AgeOf(SlotId slot) const {
  const std::uint32_t s = slot.value();
  if (s >= capacity_) return -1;
  for (std::uint32_t age = 0; age <= recent_buckets(); ++age) {
    if (RingAt(age).Test(s)) return static_cast<int>(age);
  }
  return cold_.Test(s) ? static_cast<int>(recent_buckets() + 1) : -1;
}

void PbLru::Insert(SlotId slot) noexcept {
  ULA_DCHECK(slot.value() < capacity_ && AgeOf(slot) < 0);
  ring_[cur_].Set(slot.value());
  ++tracked_;
}

void PbLru::Remove(SlotId slot) noexcept {
  const int age = AgeOf(slot);
  ULA_DCHECK(age >= 0);
  if (age < 0) return;
  BucketAt(static_cast<std::uint32_t>(age)).Clear(slot.value());
  --tracked_;
}

void PbLru::Touch(std::span<const SlotId> slots) noexcept {
  if (slots.empty()) return;
  if (slots.size() >= parallel_min_slots_ && touched_words_.size() > 1) {
    MarkParallel(slots);
  } else {
    MarkSerial(slots);
  }
  ApplyMarked();
}

void PbLru::MarkSerial(std::span<const SlotId> slots) noexcept {
  auto& words = touched_words_[0];
  for (SlotId slot : slots) {
    const std::uint32_t s = slot.value();
    ULA_DCHECK(s < capacity_);
    std::uint64_t& word = touch_bits_[s >> 6];
    if (word == 0) words.push_back(s >> 6);
    word |= std::uint64_t{1} << (s & 63);
  }
}

void PbLru::MarkParallel(std::span<const SlotId> slots) noexcept {
  auto body = [&](std::size_t t, std::size_t begin, std::size_t end) {
    auto& words = touched_words_[t];
    for (std::size_t i = begin; i < end; ++i) {
      const std::uint32_t s = slots[i].value();
      const std::uint64_t bit = std::uint64_t{1} << (s & 63);
      std::atomic_ref<std::uint64_t> word(touch_bits_[s >> 6]);
      if (word.load(std::memory_order_relaxed) & bit) continue;  // duplicate: skip the RMW
      // Exactly one thread sees the word go from zero to non-zero and records it.
      if (word.fetch_or(bit, std::memory_order_relaxed) == 0) words.push_back(s >> 6);
    }
  };
  fork_join_.Run(slots.size(), body);
}

void PbLru::ApplyMarked() noexcept {
  HierBitmap& cur = ring_[cur_];
  const std::uint32_t r = recent_buckets();
  for (auto& words : touched_words_) {
    for (std::uint32_t w : words) {
      const std::uint64_t marked = touch_bits_[w];
      touch_bits_[w] = 0;
      std::uint64_t missing = marked & ~cur.word(w);  // marked, not yet in the current bucket
      const std::uint64_t moving = missing;
      // Newest bucket first: with overlapping selections most slots were used last round.
      for (std::uint32_t age = 1; age <= r && missing != 0; ++age) {
        HierBitmap& b = RingAt(age);
        if (const std::uint64_t x = b.word(w) & missing; x != 0) {
          b.AndNotWord(w, x);
          missing &= ~x;
        }
      }
      if (missing != 0) {
        if (const std::uint64_t x = cold_.word(w) & missing; x != 0) {
          cold_.AndNotWord(w, x);
          missing &= ~x;
        }
      }
      ULA_DCHECK(missing == 0);  // every touched slot is tracked
      if (moving & ~missing) cur.OrWord(w, moving & ~missing);
    }
    words.clear();
  }
}

std::size_t PbLru::TakeFrom(HierBitmap& bucket, std::span<SlotId> out, std::size_t n) noexcept {
  HierBitmap& cur = ring_[cur_];
  std::size_t from = 0;
  while (n < out.size()) {
    const auto w = bucket.NextNonZeroWord(from);
    if (!w) break;
    std::uint64_t bits = bucket.word(*w);
    const std::size_t need = out.size() - n;
    std::uint64_t take = bits;
    if (static_cast<std::size_t>(std::popcount(bits)) > need) {
      take = 0;
      for (std::size_t k = 0; k < need; ++k) {
        const std::uint64_t low = bits & (~bits + 1);
        take |= low;
        bits ^= low;
      }
    }
    bucket.AndNotWord(*w, take);
    cur.OrWord(*w, take);
    for (; take != 0; take &= take - 1) {
      out[n++] = SlotId(static_cast<std::uint32_t>((*w << 6) | std::countr_zero(take)));
    }
    from = *w;  // a partly taken word ends the loop; a fully taken one is now zero
  }
  return n;
}

std::size_t PbLru::ClaimVictims(std::span<SlotId> out) noexcept {
  std::size_t n = TakeFrom(cold_, out, 0);
  for (std::uint32_t age = recent_buckets(); age >= 1 && n < out.size(); --age) {
    n = TakeFrom(RingAt(age), out, n);
  }
  return n;
}

void PbLru::AdvanceRound() noexcept {
  cur_ = cur_ + 1 == ring_.size() ? 0 : cur_ + 1;
  // The bucket about to be reused holds slots last used R + 1 rounds ago: fold it into cold.
  HierBitmap& reused = ring_[cur_];
  for (auto w = reused.NextNonZeroWord(0); w; w = reused.NextNonZeroWord(*w + 1)) {
    const std::uint64_t bits = reused.word(*w);
    cold_.OrWord(*w, bits);
    reused.AndNotWord(*w, bits);
  }
}

Status PbLru::CheckInvariants() const {
  std::vector<const HierBitmap*> buckets;
  for (const auto& b : ring_) buckets.push_back(&b);
  buckets.push_back(&cold_);
  std::uint64_t total = 0;
  for (std::size_t i = 0; i < buckets.size(); ++i) {
    const HierBitmap& b = *buckets[i];
    if (b.size() != capacity_) return MakeError(ErrorCode::kInternal, "PbLru: bucket of the wrong size");
    ULA_RETURN_IF_ERROR(b.CheckInvariants());
    total += b.Count();
    for (auto w = b.NextNonZeroWord(0); w; w = b.NextNonZeroWord(*w + 1)) {
      for (std::size_t j = i + 1; j < buckets.size(); ++j) {
        if (const std::uint64_t both = b.word(*w) & buckets[j]->word(*w); both != 0) {
          return MakeError(ErrorCode::kInternal,
                           "PbLru: slot " + std::to_string((*w << 6) | std::countr_zero(both)) +
                               " lives in two buckets");
        }
      }
    }
  }
  if (total != tracked_) {
    return MakeError(ErrorCode::kInternal, "PbLru: buckets hold " + std::to_string(total) + " slots but " +
                                               std::to_string(tracked_) + " are tracked");
  }
  for (const auto& words : touched_words_) {
    if (!words.empty()) return MakeError(ErrorCode::kInternal, "PbLru: touch scratch not empty");
  }
  for (std::uint64_t word : touch_bits_) {
    if (word != 0) return MakeError(ErrorCode::kInternal, "PbLru: touch scratch bits not clear");
  }
  return Ok();
}

std::size_t PbLru::MemoryBytes() const {
  std::size_t bytes = cold_.MemoryBytes() + touch_bits_.size() * sizeof(std::uint64_t);
  for (const auto& b : ring_) bytes += b.MemoryBytes();
  return bytes;
}

}  // namespace ula::policy
