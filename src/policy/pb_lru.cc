#include "policy/pb_lru.h"

#include <algorithm>
#include <atomic>
#include <bit>
#include <string>

#include "core/digest.h"
#include "ula/check.h"

namespace ula::policy {
namespace {
constexpr std::size_t kPrefetchAhead = 16;  // Touch: slots between a stamp prefetch and its use
}  // namespace

PbLru::PbLru(std::uint32_t capacity, const PolicyOptions& options)
    : capacity_(capacity),
      parallel_min_slots_(std::max<std::uint32_t>(1, options.parallel_min_slots)),
      cold_(capacity),
      stamp_(capacity, 0),
      touch_bits_((std::uint64_t{capacity} + 63) / 64, 0) {
  if (options.prefer_shadowed) shadowed_.assign(touch_bits_.size(), 0);
  ring_.reserve(options.recent_buckets + 1);
  for (std::uint32_t i = 0; i <= options.recent_buckets; ++i) ring_.emplace_back(capacity);
  word_list_.resize(touch_bits_.size() + 1);  // + 1: MarkSerial's branch-free append writes one past the count
  parallel_words_.resize(static_cast<std::size_t>(fork_join_.max_threads()));
  parallel_stragglers_.resize(parallel_words_.size());
}

int PbLru::AgeOfByScan(SlotId slot) const {
  const std::uint32_t s = slot.value();
  if (s >= capacity_) return -1;
  for (std::uint32_t age = 0; age <= recent_buckets(); ++age) {
    if (RingAt(age).Test(s)) return static_cast<int>(age);
  }
  return cold_.Test(s) ? static_cast<int>(recent_buckets() + 1) : -1;
}

void PbLru::Insert(SlotId slot) noexcept {
  ULA_DCHECK(slot.value() < capacity_ && stamp_[slot.value()] == 0);
  ring_[cur_].Set(slot.value());
  stamp_[slot.value()] = round_;
  ++tracked_;
}

void PbLru::Remove(SlotId slot) noexcept {
  const int age = AgeOf(slot);
  ULA_DCHECK(age >= 0);
  if (age < 0) return;
  BucketAt(static_cast<std::uint32_t>(age)).Clear(slot.value());
  stamp_[slot.value()] = 0;
  SetShadowed(slot, false);
  --tracked_;
}

void PbLru::Touch(std::span<const SlotId> slots) noexcept {
  if (slots.empty()) return;
  if (slots.size() >= parallel_min_slots_ && parallel_words_.size() > 1) {
    MarkParallel(slots);
  } else {
    MarkSerial(slots);
  }
  ApplyMarked();
}

void PbLru::MarkSerial(std::span<const SlotId> slots) noexcept {
  if (stragglers_.size() < slots.size()) stragglers_.resize(slots.size());
  const std::uint32_t round = round_;
  // Age of the slots ApplyMarked takes word-wise from the newest bucket; 0 (= none) if R = 0.
  const std::uint32_t newest_age = recent_buckets() >= 1 ? 1 : 0;
  const SlotId* p = slots.data();
  const std::size_t n = slots.size();
  // Four distinct arrays: __restrict lets the compiler keep loads across the stores.
  std::uint32_t* __restrict stamp = stamp_.data();
  std::uint64_t* __restrict bits = touch_bits_.data();
  std::uint32_t* __restrict words = word_list_.data();
  std::uint64_t* __restrict stragglers = stragglers_.data();
  std::size_t nw = 0, ns = 0;
  // Branch-free appends: the data decides the counts, never the control flow.
  auto mark = [&](std::size_t i) {
    const std::uint32_t s = p[i].value();
    ULA_DCHECK(s < capacity_ && stamp[s] != 0);
    const std::uint32_t age = round - stamp[s];  // 0: a duplicate, or already current
    stragglers[ns] = (std::uint64_t{round - age} << 32) | s;
    ns += (age != 0) & (age != newest_age);
    stamp[s] = round;
    std::uint64_t& word = bits[s >> 6];
    words[nw] = s >> 6;
    nw += word == 0;
    word |= std::uint64_t{1} << (s & 63);
  };
  std::size_t i = 0;
  for (; i + kPrefetchAhead < n; ++i) {
    __builtin_prefetch(stamp + p[i + kPrefetchAhead].value());
    mark(i);
  }
  for (; i < n; ++i) mark(i);
  num_words_ = nw;
  num_stragglers_ = ns;
}

void PbLru::MarkParallel(std::span<const SlotId> slots) noexcept {
  const std::uint32_t round = round_;
  const bool has_newest = recent_buckets() >= 1;
  auto body = [&](std::size_t t, std::size_t begin, std::size_t end) {
    auto& words = parallel_words_[t];
    auto& stragglers = parallel_stragglers_[t];
    for (std::size_t i = begin; i < end; ++i) {
      if (i + kPrefetchAhead < end) __builtin_prefetch(&stamp_[slots[i + kPrefetchAhead].value()]);
      const std::uint32_t s = slots[i].value();
      std::atomic_ref<std::uint32_t> stamp(stamp_[s]);
      if (stamp.load(std::memory_order_relaxed) == round) continue;  // duplicate: skip the RMWs
      // Exactly one thread sees the old stamp; exactly one sees the word go non-zero.
      const std::uint32_t old = stamp.exchange(round, std::memory_order_relaxed);
      if (old == round) continue;
      if ((round - old != 1) || !has_newest) stragglers.push_back((std::uint64_t{old} << 32) | s);
      std::atomic_ref<std::uint64_t> word(touch_bits_[s >> 6]);
      if (word.fetch_or(std::uint64_t{1} << (s & 63), std::memory_order_relaxed) == 0) words.push_back(s >> 6);
    }
  };
  fork_join_.Run(slots.size(), body);
  std::size_t nw = 0, ns = 0;
  if (stragglers_.size() < slots.size()) stragglers_.resize(slots.size());
  for (std::size_t t = 0; t < parallel_words_.size(); ++t) {
    for (std::uint32_t w : parallel_words_[t]) word_list_[nw++] = w;
    for (std::uint64_t x : parallel_stragglers_[t]) stragglers_[ns++] = x;
    parallel_words_[t].clear();
    parallel_stragglers_[t].clear();
  }
  num_words_ = nw;
  num_stragglers_ = ns;
}

void PbLru::ApplyMarked() noexcept {
  HierBitmap& cur = ring_[cur_];
  const std::uint32_t round = round_;
  // Slots not last used in the previous round go straight to the bucket their old stamp
  // names: O(1) each, no probing of the R buckets.
  for (std::size_t i = 0; i < num_stragglers_; ++i) {
    const std::uint64_t x = stragglers_[i];
    [[maybe_unused]] const bool was_set = BucketAt(round - static_cast<std::uint32_t>(x >> 32)).Clear(x & 0xffffffffu);
    ULA_DCHECK(was_set);  // every touched slot is tracked
  }
  // The others (most of them, with overlapping selections) were used last round: one word
  // operation per touched word takes them from the newest recent bucket. Marked slots that
  // were already current are in no other bucket, so the AND leaves them alone.
  HierBitmap* newest = recent_buckets() >= 1 ? &RingAt(1) : nullptr;
  for (std::size_t i = 0; i < num_words_; ++i) {
    const std::uint32_t w = word_list_[i];
    const std::uint64_t marked = touch_bits_[w];
    touch_bits_[w] = 0;
    if (newest != nullptr) {
      if (const std::uint64_t x = newest->word(w) & marked; x != 0) newest->AndNotWord(w, x);
    }
    cur.OrWord(w, marked);
  }
  num_words_ = num_stragglers_ = 0;
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
      const auto s = static_cast<std::uint32_t>((*w << 6) | std::countr_zero(take));
      stamp_[s] = round_;
      out[n++] = SlotId(s);
    }
    from = *w;  // a partly taken word ends the loop; a fully taken one is now zero
  }
  return n;
}

std::size_t PbLru::TakeFromMasked(HierBitmap& bucket, std::span<SlotId> out, std::size_t n,
                                  const std::uint64_t* mask) noexcept {
  HierBitmap& cur = ring_[cur_];
  for (auto w = bucket.NextNonZeroWord(0); w && n < out.size(); w = bucket.NextNonZeroWord(*w + 1)) {
    std::uint64_t bits = bucket.word(*w) & mask[*w];
    std::uint64_t take = 0;
    for (; bits != 0 && n < out.size(); bits &= bits - 1) {
      const std::uint64_t low = bits & (~bits + 1);
      take |= low;
      const auto s = static_cast<std::uint32_t>((*w << 6) | std::countr_zero(low));
      stamp_[s] = round_;
      out[n++] = SlotId(s);
    }
    if (take == 0) continue;
    bucket.AndNotWord(*w, take);
    cur.OrWord(*w, take);
  }
  return n;
}

std::size_t PbLru::ClaimVictims(std::span<SlotId> out) noexcept {
  if (!shadowed_.empty()) {  // prefer_shadowed: each bucket's shadowed slots, then its others
    std::size_t n = cold_.Empty() ? 0 : TakeFrom(cold_, out, TakeFromMasked(cold_, out, 0, shadowed_.data()));
    for (std::uint32_t age = recent_buckets(); age >= 1 && n < out.size(); --age) {
      if (HierBitmap& b = RingAt(age); !b.Empty()) n = TakeFrom(b, out, TakeFromMasked(b, out, n, shadowed_.data()));
    }
    return n;
  }
  std::size_t n = cold_.Empty() ? 0 : TakeFrom(cold_, out, 0);
  for (std::uint32_t age = recent_buckets(); age >= 1 && n < out.size(); --age) {
    if (HierBitmap& b = RingAt(age); !b.Empty()) n = TakeFrom(b, out, n);
  }
  return n;
}

Status PbLru::ClaimVictimsParallel(std::span<SlotId> out, ForkJoin& team) {
  const std::size_t need = out.size();
  if (need > NumEvictable()) {
    return MakeError(ErrorCode::kResourceExhausted, "PbLru: " + std::to_string(need) + " victims asked for, " +
                                                        std::to_string(NumEvictable()) + " evictable");
  }
  if (need == 0) return Ok();
  // Quotas, in victim order: cold first, then the recent buckets oldest to newest.
  claim_quotas_.clear();
  std::size_t left = need, offset = 0;
  auto plan = [&](HierBitmap& b) {
    if (left == 0 || b.Empty()) return;
    const std::size_t take = std::min<std::size_t>(left, b.Count());
    claim_quotas_.push_back({&b, offset, take, 0});
    offset += take;
    left -= take;
  };
  plan(cold_);
  for (std::uint32_t age = recent_buckets(); age >= 1 && left > 0; --age) plan(RingAt(age));
  ULA_CHECK(left == 0);  // NumEvictable() counts exactly these buckets
  const auto lanes = static_cast<std::size_t>(team.max_threads());
  const std::size_t nq = claim_quotas_.size();
  const std::size_t words = touch_bits_.size();  // level-0 words of every bucket
  claim_lane_counts_.assign(nq * lanes, 0);
  claim_first_.assign(nq * lanes, 0);
  if (claim_taken_.size() < lanes) claim_taken_.resize(lanes);
  // Lane l's words of quota q's bucket: [Begin(q, l), Begin(q, l + 1)), in slot order, the
  // last lane's up to the end. A quota that takes part of its bucket needs only about
  // take / count of its words (the first ones): the words [0, E) its victims are expected in
  // (E from the bucket's mean density) are split evenly, so the lanes share the work.
  for (ClaimQuota& quota : claim_quotas_) {
    const std::uint64_t count = quota.bucket->Count();
    quota.span = quota.take == count ? words
                                     : std::min<std::size_t>(words, (quota.take * words + count - 1) / count + 1);
  }
  auto range_begin = [&](std::size_t q, std::size_t l) {
    return l == lanes ? words : claim_quotas_[q].span * l / lanes;
  };
  // Pass 1: each lane counts its set bits of each planned bucket, stopping at the quota
  // (a lane that holds `take` bits leaves none of the first `take` ranks to the later lanes).
  auto count = [&](std::size_t, std::size_t begin, std::size_t end) {
    for (std::size_t l = begin; l < end; ++l) {
      for (std::size_t q = 0; q < nq; ++q) {
        const std::size_t wb = range_begin(q, l), we = range_begin(q, l + 1);
        const HierBitmap& b = *claim_quotas_[q].bucket;
        const std::uint64_t take = claim_quotas_[q].take;
        std::uint64_t c = 0;
        for (auto w = b.NextNonZeroWord(wb); c < take && w && *w < we; w = b.NextNonZeroWord(*w + 1)) {
          c += static_cast<std::uint64_t>(std::popcount(b.word(*w)));
        }
        claim_lane_counts_[q * lanes + l] = c;
      }
    }
  };
  team.Run(lanes, count);
  // Exclusive prefix sum over the lanes, per bucket: lane l's first rank (exact while below
  // the quota: only a lane at or past the quota stopped counting early).
  for (std::size_t q = 0; q < nq; ++q) {
    std::uint64_t sum = 0;
    for (std::size_t l = 0; l < lanes; ++l) {
      claim_first_[q * lanes + l] = sum;
      sum += claim_lane_counts_[q * lanes + l];
    }
    ULA_DCHECK(sum >= claim_quotas_[q].take);
  }
  // Pass 2: each lane takes the victims of rank < quota among its own bits.
  const std::uint32_t round = round_;
  auto claim = [&](std::size_t, std::size_t begin, std::size_t end) {
    for (std::size_t l = begin; l < end; ++l) {
      auto& taken = claim_taken_[l];
      taken.clear();
      for (std::size_t q = 0; q < nq; ++q) {
        const std::size_t wb = range_begin(q, l), we = range_begin(q, l + 1);
        const ClaimQuota& quota = claim_quotas_[q];
        const std::uint64_t first = claim_first_[q * lanes + l];
        if (first >= quota.take) continue;
        std::uint64_t k = std::min<std::uint64_t>(claim_lane_counts_[q * lanes + l], quota.take - first);
        SlotId* dst = out.data() + quota.offset + first;
        const HierBitmap& b = *quota.bucket;
        for (auto w = b.NextNonZeroWord(wb); k > 0 && w && *w < we; w = b.NextNonZeroWord(*w + 1)) {
          std::uint64_t bits = b.word(*w);
          std::uint64_t take = bits;
          if (static_cast<std::uint64_t>(std::popcount(bits)) > k) {
            take = 0;
            for (std::uint64_t j = 0; j < k; ++j) {
              const std::uint64_t low = bits & (~bits + 1);
              take |= low;
              bits ^= low;
            }
          }
          k -= static_cast<std::uint64_t>(std::popcount(take));
          taken.push_back({static_cast<std::uint32_t>(q), static_cast<std::uint32_t>(*w), take});
          for (; take != 0; take &= take - 1) {
            const auto s = static_cast<std::uint32_t>((*w << 6) | std::countr_zero(take));
            stamp_[s] = round;
            *dst++ = SlotId(s);
          }
        }
      }
    }
  };
  team.Run(lanes, claim);
  // The bitmap writes, on this thread: taken bits leave their buckets for the current one.
  HierBitmap& cur = ring_[cur_];
  for (std::size_t l = 0; l < lanes; ++l) {
    for (const TakenWord& t : claim_taken_[l]) {
      claim_quotas_[t.quota].bucket->AndNotWord(t.word, t.mask);
      cur.OrWord(t.word, t.mask);
    }
    claim_taken_[l].clear();
  }
  return Ok();
}

void PbLru::RebaseRounds(std::uint32_t round) noexcept {
  ULA_DCHECK(round >= recent_buckets() + 2);
  const std::uint32_t cold_age = recent_buckets() + 1;
  for (std::uint32_t& stamp : stamp_) {
    if (stamp != 0) stamp = round - std::min(round_ - stamp, cold_age);
  }
  round_ = round;
}

void PbLru::AdvanceRound() noexcept {
  // Stamps are 32-bit: before the counter wraps, rebase it keeping every age (cold ages
  // clamp to R + 1, which names the same bucket).
  if (round_ == ~std::uint32_t{0}) RebaseRounds(recent_buckets() + 2);
  ++round_;
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
    // Bucket i (ring first, cold last) must be the bucket each of its slots' stamps names.
    const int age = i + 1 == buckets.size()
                        ? static_cast<int>(recent_buckets() + 1)
                        : static_cast<int>(cur_ >= i ? cur_ - i : cur_ + ring_.size() - i);
    std::string bad_stamp;
    b.ForEachSet([&](std::uint64_t s) {
      if (bad_stamp.empty() && AgeOf(SlotId(static_cast<std::uint32_t>(s))) != age) {
        bad_stamp = "PbLru: slot " + std::to_string(s) + " lives in the bucket of age " + std::to_string(age) +
                    " but its stamp says " + std::to_string(AgeOf(SlotId(static_cast<std::uint32_t>(s))));
      }
    });
    if (!bad_stamp.empty()) return MakeError(ErrorCode::kInternal, bad_stamp);
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
  std::uint64_t stamped = 0;
  for (std::uint32_t stamp : stamp_) {
    if (stamp == 0) continue;
    if (stamp > round_) return MakeError(ErrorCode::kInternal, "PbLru: stamp from the future");
    ++stamped;
  }
  if (stamped != tracked_) {
    return MakeError(ErrorCode::kInternal, "PbLru: " + std::to_string(stamped) + " slots stamped but " +
                                               std::to_string(tracked_) + " are tracked");
  }
  if (num_words_ != 0 || num_stragglers_ != 0) return MakeError(ErrorCode::kInternal, "PbLru: touch scratch not empty");
  for (std::size_t t = 0; t < parallel_words_.size(); ++t) {
    if (!parallel_words_[t].empty() || !parallel_stragglers_[t].empty()) {
      return MakeError(ErrorCode::kInternal, "PbLru: parallel touch scratch not empty");
    }
  }
  for (const auto& taken : claim_taken_) {
    if (!taken.empty()) return MakeError(ErrorCode::kInternal, "PbLru: parallel claim scratch not empty");
  }
  for (std::uint64_t word : touch_bits_) {
    if (word != 0) return MakeError(ErrorCode::kInternal, "PbLru: touch scratch bits not clear");
  }
  for (std::size_t w = 0; w < shadowed_.size(); ++w) {
    for (std::uint64_t bits = shadowed_[w]; bits != 0; bits &= bits - 1) {
      const auto s = static_cast<std::uint32_t>((w << 6) | std::countr_zero(bits));
      if (s >= capacity_ || stamp_[s] == 0) {
        return MakeError(ErrorCode::kInternal, "PbLru: untracked slot " + std::to_string(s) + " marked shadowed");
      }
    }
  }
  return Ok();
}

std::size_t PbLru::MemoryBytes() const {
  std::size_t bytes = cold_.MemoryBytes() + touch_bits_.size() * (sizeof(std::uint64_t) + sizeof(std::uint32_t)) +
                      stamp_.size() * sizeof(std::uint32_t) + stragglers_.capacity() * sizeof(std::uint64_t) +
                      shadowed_.size() * sizeof(std::uint64_t);
  for (const auto& b : ring_) bytes += b.MemoryBytes();
  return bytes;
}

std::uint64_t PbLru::DebugDigest() const {
  StateDigest d;
  d.Add(ring_.size());
  d.Add(cur_);
  for (const HierBitmap& b : ring_) d.Add(b);
  d.Add(cold_);
  d.Add(tracked_);
  d.Add(round_);
  d.AddAll(std::span<const std::uint32_t>(stamp_));
  for (std::uint64_t w : shadowed_) d.Add(w);
  return d.value();
}

}  // namespace ula::policy
