// The policy conformance of the kernels' PB-LRU victims: the victims the step's
// TakeLowest kernel (OpenMP form) finds in PbLru::VictimBuckets, claimed with Touch, must be
// ClaimVictims' victims in ClaimVictims' order, leaving the same state (DebugDigest), for any
// R, demand and thread count; never a slot of the current round.
#include <gtest/gtest.h>
#include <omp.h>

#include <random>
#include <vector>

#include "kernels/step_kernels.h"
#include "policy/kernel_pb_lru.h"
#include "policy/pb_lru.h"
#include "test_seed.h"

namespace ula {
namespace {

// With summaries: TakeLowest scans the buckets' first summary level (HierBitmap::summary_words).
std::vector<std::uint32_t> KernelVictims(const policy::PbLru& p, std::uint32_t capacity, std::uint32_t need,
                                         bool summaries = false) {
  std::vector<const std::uint64_t*> words;
  std::vector<std::uint64_t> counts;
  p.VictimBuckets(words, counts);
  kernels::BitmapSources sources;
  sources.num_words = (capacity + 63) / 64;
  std::uint64_t have = 0;
  for (std::size_t b = 0; b < words.size() && have < need; ++b) {
    if (counts[b] == 0) continue;
    sources.words[sources.num_sources++] = words[b];
    have += counts[b];
  }
  // A bitmap of one level (<= 64 slots) has no summary: an all-ones word stands in for it
  // (a set bit over an empty word is allowed; bits past the last word are ignored).
  static const std::uint64_t kAllWords = ~std::uint64_t{0};
  if (summaries) {
    sources.num_summary = (sources.num_words + 63) / 64;
    std::vector<const std::uint64_t*> sums;
    p.VictimBucketSummaries(sums);
    std::uint32_t j = 0;
    have = 0;
    for (std::size_t b = 0; b < words.size() && have < need; ++b) {
      if (counts[b] == 0) continue;
      sources.summary[j++] = sums[b] != nullptr ? sums[b] : &kAllWords;
      have += counts[b];
    }
  }
  const std::size_t n = std::size_t{sources.num_sources} * (summaries ? sources.num_summary : sources.num_words);
  std::vector<std::uint32_t> c(n), off(n), out(need);
  out.resize(kernels::omp::TakeLowest(0, sources, need, c.data(), off.data(), out.data()));
  return out;
}

TEST(KernelPbLruVictims, MatchClaimVictimsOnRandomStates) {
  ULA_TEST_SEEDED(seed, 20261205);
  std::mt19937_64 rng(seed);
  const int saved = omp_get_max_threads();
  int claims = 0;
  for (std::uint32_t recent : {0u, 1u, 3u, 64u}) {
    for (int threads : {1, 2}) {
      omp_set_num_threads(threads);
      const std::uint32_t capacity = 200 + static_cast<std::uint32_t>(rng() % 700);
      PolicyOptions options;
      options.recent_buckets = recent;
      policy::PbLru kernel(capacity, options), reference(capacity, options);
      std::vector<bool> tracked(capacity, false);
      for (int op = 0; op < 400; ++op) {
        const std::uint64_t r = rng() % 10;
        if (r < 3) {  // insert a few untracked slots
          for (int i = 0; i < 8; ++i) {
            const auto s = static_cast<std::uint32_t>(rng() % capacity);
            if (tracked[s]) continue;
            tracked[s] = true;
            kernel.Insert(SlotId(s));
            reference.Insert(SlotId(s));
          }
        } else if (r < 6) {  // touch tracked slots
          std::vector<SlotId> t;
          for (int i = 0; i < 20; ++i) {
            const auto s = static_cast<std::uint32_t>(rng() % capacity);
            if (tracked[s]) t.push_back(SlotId(s));
          }
          kernel.Touch(t);
          reference.Touch(t);
        } else if (r < 8) {
          kernel.AdvanceRound();
          reference.AdvanceRound();
        } else if (reference.NumEvictable() > 0) {  // claim
          const auto need = static_cast<std::uint32_t>(1 + rng() % reference.NumEvictable());
          const auto got = KernelVictims(kernel, capacity, need, /*summaries=*/(op & 1) != 0);
          ASSERT_EQ(got.size(), need);
          for (std::uint32_t s : got) ASSERT_FALSE(kernel.UsedInCurrentRound(SlotId(s))) << "slot " << s;
          std::vector<SlotId> as_ids(got.begin(), got.end());
          for (std::size_t i = 0; i < got.size(); ++i) as_ids[i] = SlotId(got[i]);
          kernel.Touch(as_ids);
          std::vector<SlotId> want(need);
          ASSERT_EQ(reference.ClaimVictims(want), need);
          ASSERT_EQ(as_ids, want) << "R " << recent << " threads " << threads << " op " << op;
          ++claims;
        }
        ASSERT_EQ(kernel.DebugDigest(), reference.DebugDigest()) << "op " << op;
        ASSERT_TRUE(kernel.CheckInvariants());
      }
    }
  }
  omp_set_num_threads(saved);
  EXPECT_GT(claims, 100);
}

// The kernel PB-LRU (policy/kernel_pb_lru.h: flat arrays, touch / fold / summary-level victim
// scan as kernels) against the CPU PB-LRU on random operations: the same victims in the same
// order and the same state (DebugDigest: every bucket word, stamp, count and the clock) after
// every operation, for R in {0, 1, 3, 64}, 1 and 2 threads, across the 2^32-round wrap.
TEST(KernelPbLru, MatchesPbLruOnRandomOperations) {
  ULA_TEST_SEEDED(seed, 20261201);
  std::mt19937_64 rng(seed);
  const int saved = omp_get_max_threads();
  int claims = 0;
  for (std::uint32_t recent : {0u, 1u, 3u, 64u}) {
    for (int threads : {1, 2}) {
      omp_set_num_threads(threads);
      const std::uint32_t capacity = 1 + static_cast<std::uint32_t>(rng() % 9000);
      PolicyOptions options;
      options.recent_buckets = recent;
      // Two threads: every call of more than one slot runs on the team (below
      // parallel_min_slots a call runs on one thread).
      if (threads == 2) options.parallel_min_slots = 1;
      policy::KernelPbLru kernel(capacity, options);
      policy::PbLru reference(capacity, options);
      std::vector<bool> tracked(capacity, false);
      if (threads == 2) {  // start near the wrap of the round counter: the rebase keeps every age
        kernel.SetRoundForTesting(0xffffffffu - 6);
        reference.RebaseRoundsForTesting(0xffffffffu - 6);
      }
      for (int op = 0; op < 300; ++op) {
        const std::uint64_t r = rng() % 12;
        if (r < 3) {
          for (int i = 0; i < 40; ++i) {
            const auto s = static_cast<std::uint32_t>(rng() % capacity);
            if (tracked[s]) continue;
            tracked[s] = true;
            kernel.Insert(SlotId(s));
            reference.Insert(SlotId(s));
          }
        } else if (r < 4) {
          const auto s = static_cast<std::uint32_t>(rng() % capacity);
          if (tracked[s]) {
            tracked[s] = false;
            kernel.Remove(SlotId(s));
            reference.Remove(SlotId(s));
          }
        } else if (r < 7) {  // touch tracked slots, with duplicates
          std::vector<SlotId> t;
          for (int i = 0; i < 200; ++i) {
            const auto s = static_cast<std::uint32_t>(rng() % capacity);
            if (tracked[s]) t.push_back(SlotId(s));
            if (tracked[s] && rng() % 4 == 0) t.push_back(SlotId(s));
          }
          kernel.Touch(t);
          reference.Touch(t);
        } else if (r < 9) {
          kernel.AdvanceRound();
          reference.AdvanceRound();
        } else {
          ASSERT_EQ(kernel.NumEvictable(), reference.NumEvictable());
          const std::size_t need = 1 + rng() % (reference.NumEvictable() + 2);
          std::vector<SlotId> got(need), want(need);
          got.resize(kernel.ClaimVictims(got));
          want.resize(reference.ClaimVictims(want));
          ASSERT_EQ(got, want) << "R " << recent << " threads " << threads << " op " << op << " seed " << seed;
          claims += !want.empty();
        }
        ASSERT_EQ(kernel.DebugDigest(), reference.DebugDigest()) << "R " << recent << " op " << op << " seed " << seed;
        auto st = kernel.CheckInvariants();
        ASSERT_TRUE(st) << st.error().ToString();
      }
      for (std::uint32_t s = 0; s < capacity; ++s) ASSERT_EQ(kernel.AgeOf(SlotId(s)), reference.AgeOf(SlotId(s)));
    }
  }
  omp_set_num_threads(saved);
  EXPECT_GT(claims, 100);
}

}  // namespace
}  // namespace ula
