// HierBitmap: a set of positions [0, size) stored as bits, with summary levels above.
//
//   level 0: one bit per position, 64 positions per word.
//   level l+1: bit w is set  <=>  word w of level l is non-zero.
//   The top level is a single word. A bitmap of n positions has ceil(log64 n) levels (>= 1).
//
// Invariants (CheckInvariants): every summary bit equals "the word below is non-zero";
// no bit at or past `size` is set; `Count()` equals the number of set level-0 bits.
//
// Costs: Test O(1); Set/Clear O(levels) worst case, O(1) when the word's emptiness does not
// change; FindNext O(levels) — it never scans an empty stretch, it climbs to the summary
// that skips it. OrWith / AndNotWith visit only the non-zero words of the argument.
// With 2^24 positions there are 4 levels.
//
// Thread-safety: none; callers serialize. Word-level accessors let data-parallel code
// build whole words elsewhere and merge them here.
#pragma once

#include <bit>
#include <cstdint>
#include <optional>
#include <vector>

#include "ula/error.h"

namespace ula {

class HierBitmap {
 public:
  explicit HierBitmap(std::uint64_t size = 0, bool all_set = false);

  std::uint64_t size() const { return size_; }
  std::uint64_t Count() const { return count_; }
  bool Empty() const { return count_ == 0; }

  // REQUIRES: i < size().
  bool Test(std::uint64_t i) const { return (levels_[0][i >> 6] >> (i & 63)) & 1; }
  // Returns true if the bit was clear before. REQUIRES: i < size().
  bool Set(std::uint64_t i);
  // Returns true if the bit was set before. REQUIRES: i < size().
  bool Clear(std::uint64_t i);

  // The smallest set position >= from, or nullopt.
  std::optional<std::uint64_t> FindNext(std::uint64_t from) const;
  std::optional<std::uint64_t> FindFirst() const { return FindNext(0); }

  void ClearAll();
  void SetAll();
  // this |= other. REQUIRES: other.size() == size().
  void OrWith(const HierBitmap& other);
  // this &= ~other. REQUIRES: other.size() == size().
  void AndNotWith(const HierBitmap& other);

  // Level-0 words, for word-parallel code.
  std::size_t num_words() const { return levels_[0].size(); }
  std::uint64_t word(std::size_t w) const { return levels_[0][w]; }
  // [num_words()] the level-0 words, for data-parallel readers (src/kernels); valid until the
  // next non-const call.
  const std::uint64_t* words() const { return levels_[0].data(); }
  // [ceil(num_words() / 64)] the first summary level (bit w: level-0 word w is non-zero), or
  // null when the bitmap has one level only (at most 64 positions); valid as words().
  const std::uint64_t* summary_words() const { return levels_.size() > 1 ? levels_[1].data() : nullptr; }
  // word(w) |= bits / word(w) &= ~bits, keeping summaries and count exact.
  void OrWord(std::size_t w, std::uint64_t bits);
  void AndNotWord(std::size_t w, std::uint64_t bits);
  // The next non-zero level-0 word index >= from, or nullopt.
  std::optional<std::size_t> NextNonZeroWord(std::size_t from) const;

  // Calls f(position) for each set position in ascending order. f must not modify *this.
  template <class F>
  void ForEachSet(F&& f) const {
    for (auto w = NextNonZeroWord(0); w; w = NextNonZeroWord(*w + 1)) {
      for (std::uint64_t bits = levels_[0][*w]; bits != 0; bits &= bits - 1) {
        f((std::uint64_t{*w} << 6) | std::countr_zero(bits));
      }
    }
  }

  Status CheckInvariants() const;
  std::size_t MemoryBytes() const;
  int num_levels() const { return static_cast<int>(levels_.size()); }

 private:
  static constexpr std::uint64_t kNone = ~std::uint64_t{0};
  std::uint64_t FindNextAt(int level, std::uint64_t pos) const;
  // Word w of `level` changed from `before` to its current value: fix summaries above.
  void PropagateEmptiness(int level, std::size_t w, std::uint64_t before);

  std::uint64_t size_ = 0;
  std::uint64_t count_ = 0;
  std::vector<std::vector<std::uint64_t>> levels_;  // [num_levels][words at that level]
  std::vector<std::uint64_t> bits_at_level_;        // [num_levels]
};

}  // namespace ula
