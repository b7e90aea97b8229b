#include "step/kernel_targets.h"

#include <algorithm>
#include <span>

#include "kernels/step_kernels.h"
#include "policy/pb_lru.h"
#include "ula/check.h"

namespace ula {

std::uint32_t TakeTargets(SlotPool& device, ResidencyPolicy& policy, std::uint32_t n_miss, KernelTargetScratch& s,
                          std::vector<std::uint32_t>& targets) {
  const auto n_free = std::min<std::uint32_t>(n_miss, device.num_free());
  targets.resize(n_miss);
  if (n_miss == 0) return 0;
  auto* pb = dynamic_cast<policy::PbLru*>(&policy);
  // The scan goes through each bitmap's first summary level (a bitmap of <= 64 slots has
  // none: one all-ones word stands in, bits past the last word are never read).
  static const std::uint64_t kAllWords = ~std::uint64_t{0};
  auto summary_of = [](const std::uint64_t* w) { return w != nullptr ? w : &kAllWords; };
  kernels::BitmapSources sources;
  sources.num_words = static_cast<std::uint32_t>(device.free_bitmap().num_words());
  sources.num_summary = (sources.num_words + 63) / 64;
  sources.summary[sources.num_sources] = summary_of(device.free_bitmap().summary_words());
  sources.words[sources.num_sources++] = device.free_bitmap().words();
  std::uint64_t have = device.num_free();
  if (pb != nullptr && n_miss > n_free) {
    pb->VictimBuckets(s.bucket_words, s.bucket_counts);
    pb->VictimBucketSummaries(s.bucket_summaries);
    ULA_CHECK(s.bucket_words.size() < kernels::BitmapSources::kMax);
    for (std::size_t b = 0; b < s.bucket_words.size() && have < n_miss; ++b) {
      if (s.bucket_counts[b] == 0) continue;
      sources.summary[sources.num_sources] = summary_of(s.bucket_summaries[b]);
      sources.words[sources.num_sources++] = s.bucket_words[b];
      have += s.bucket_counts[b];
    }
  }
  const std::uint32_t need = pb != nullptr ? n_miss : n_free;
  const std::size_t words = std::size_t{sources.num_sources} * sources.num_summary;
  if (s.word_counts.size() < words) {
    s.word_counts.resize(words);
    s.word_offsets.resize(words);
  }
  ULA_CHECK(kernels::omp::TakeLowest(0, sources, need, s.word_counts.data(), s.word_offsets.data(), targets.data()) ==
            need);  // the room check passed
  for (std::uint32_t i = 0; i < n_free; ++i) ULA_CHECK(device.Allocate().value().value() == targets[i]);
  const auto victims = std::span(reinterpret_cast<SlotId*>(targets.data()) + n_free, n_miss - n_free);
  if (pb != nullptr) {
    policy.Touch(victims);  // what ClaimVictims does to the slots it returns
  } else if (!victims.empty()) {
    ULA_CHECK(policy.ClaimVictims(victims) == victims.size());
  }
  return n_free;
}

}  // namespace ula
