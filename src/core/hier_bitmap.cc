#include "core/hier_bitmap.h"

#include <string>

#include "ula/check.h"

namespace ula {
namespace {
std::size_t WordsFor(std::uint64_t bits) { return static_cast<std::size_t>((bits + 63) / 64); }
}  // namespace

HierBitmap::HierBitmap(std::uint64_t size, bool all_set) : size_(size) {
  std::uint64_t bits = size;
  while (true) {
    bits_at_level_.push_back(bits);
    levels_.emplace_back(std::max<std::size_t>(1, WordsFor(bits)), 0);
    if (levels_.back().size() == 1) break;
    bits = levels_.back().size();
  }
  if (all_set) SetAll();
}

bool HierBitmap::Set(std::uint64_t i) {
  ULA_DCHECK(i < size_);
  std::uint64_t& word = levels_[0][i >> 6];
  const std::uint64_t mask = std::uint64_t{1} << (i & 63);
  if (word & mask) return false;
  const std::uint64_t before = word;
  word |= mask;
  ++count_;
  if (before == 0) PropagateEmptiness(0, i >> 6, before);
  return true;
}

bool HierBitmap::Clear(std::uint64_t i) {
  ULA_DCHECK(i < size_);
  std::uint64_t& word = levels_[0][i >> 6];
  const std::uint64_t mask = std::uint64_t{1} << (i & 63);
  if (!(word & mask)) return false;
  const std::uint64_t before = word;
  word &= ~mask;
  --count_;
  if (word == 0) PropagateEmptiness(0, i >> 6, before);
  return true;
}

void HierBitmap::PropagateEmptiness(int level, std::size_t w, std::uint64_t before) {
  // Walk up while a word flips between zero and non-zero.
  while (level + 1 < num_levels()) {
    const bool now_nonzero = levels_[level][w] != 0;
    if ((before != 0) == now_nonzero) return;
    std::uint64_t& parent = levels_[level + 1][w >> 6];
    before = parent;
    const std::uint64_t mask = std::uint64_t{1} << (w & 63);
    parent = now_nonzero ? (parent | mask) : (parent & ~mask);
    ++level;
    w >>= 6;
  }
}

std::uint64_t HierBitmap::FindNextAt(int level, std::uint64_t pos) const {
  if (pos >= bits_at_level_[level]) return kNone;
  const auto& words = levels_[level];
  std::size_t w = pos >> 6;
  const std::uint64_t masked = words[w] & (~std::uint64_t{0} << (pos & 63));
  if (masked != 0) return (std::uint64_t{w} << 6) | std::countr_zero(masked);
  if (level + 1 == num_levels()) return kNone;  // the top level is one word
  const std::uint64_t next_word = FindNextAt(level + 1, w + 1);
  if (next_word == kNone) return kNone;
  return (next_word << 6) | std::countr_zero(words[next_word]);
}

std::optional<std::uint64_t> HierBitmap::FindNext(std::uint64_t from) const {
  const std::uint64_t r = FindNextAt(0, from);
  if (r == kNone) return std::nullopt;
  return r;
}

std::optional<std::size_t> HierBitmap::NextNonZeroWord(std::size_t from) const {
  if (num_levels() == 1) {
    if (from == 0 && levels_[0][0] != 0) return 0;
    return std::nullopt;
  }
  const std::uint64_t r = FindNextAt(1, from);
  if (r == kNone) return std::nullopt;
  return static_cast<std::size_t>(r);
}

void HierBitmap::ClearAll() {
  for (auto& level : levels_) std::fill(level.begin(), level.end(), 0);
  count_ = 0;
}

void HierBitmap::SetAll() {
  for (int l = 0; l < num_levels(); ++l) {
    auto& words = levels_[l];
    const std::uint64_t bits = bits_at_level_[l];
    std::fill(words.begin(), words.end(), ~std::uint64_t{0});
    if (bits % 64 != 0) words[bits / 64] = (std::uint64_t{1} << (bits % 64)) - 1;
    if (bits == 0) words[0] = 0;
  }
  count_ = size_;
}

void HierBitmap::OrWord(std::size_t w, std::uint64_t bits) {
  std::uint64_t& word = levels_[0][w];
  const std::uint64_t before = word;
  word |= bits;
  count_ += std::popcount(word) - std::popcount(before);
  if (before == 0 && word != 0) PropagateEmptiness(0, w, before);
}

void HierBitmap::AndNotWord(std::size_t w, std::uint64_t bits) {
  std::uint64_t& word = levels_[0][w];
  const std::uint64_t before = word;
  word &= ~bits;
  count_ -= std::popcount(before) - std::popcount(word);
  if (before != 0 && word == 0) PropagateEmptiness(0, w, before);
}

void HierBitmap::OrWith(const HierBitmap& other) {
  ULA_CHECK(other.size_ == size_);
  for (auto w = other.NextNonZeroWord(0); w; w = other.NextNonZeroWord(*w + 1)) {
    OrWord(*w, other.levels_[0][*w]);
  }
}

void HierBitmap::AndNotWith(const HierBitmap& other) {
  ULA_CHECK(other.size_ == size_);
  for (auto w = other.NextNonZeroWord(0); w; w = other.NextNonZeroWord(*w + 1)) {
    AndNotWord(*w, other.levels_[0][*w]);
  }
}

Status HierBitmap::CheckInvariants() const {
  std::uint64_t count = 0;
  for (std::uint64_t word : levels_[0]) count += std::popcount(word);
  if (count != count_) {
    return MakeError(ErrorCode::kInternal, "HierBitmap: count " + std::to_string(count_) +
                                               " but " + std::to_string(count) + " bits set");
  }
  for (int l = 0; l < num_levels(); ++l) {
    const std::uint64_t bits = bits_at_level_[l];
    const auto& words = levels_[l];
    if (bits % 64 != 0 && (words[bits / 64] >> (bits % 64)) != 0) {
      return MakeError(ErrorCode::kInternal, "HierBitmap: bit set past the end at level " + std::to_string(l));
    }
    if (l + 1 < num_levels()) {
      for (std::size_t w = 0; w < words.size(); ++w) {
        const bool summary = (levels_[l + 1][w >> 6] >> (w & 63)) & 1;
        if (summary != (words[w] != 0)) {
          return MakeError(ErrorCode::kInternal, "HierBitmap: summary bit of word " + std::to_string(w) +
                                                     " at level " + std::to_string(l) + " is stale");
        }
      }
    }
  }
  return Ok();
}

std::size_t HierBitmap::MemoryBytes() const {
  std::size_t bytes = 0;
  for (const auto& level : levels_) bytes += level.size() * sizeof(std::uint64_t);
  return bytes;
}

}  // namespace ula
