// ReplayBelady (belady.h): next uses from one backward pass, then a forward pass with a
// max-heap of (next use, address) whose stale entries are skipped lazily and swept when
// the heap grows past twice the pool.
#include "policy/belady.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

namespace ula::policy {
namespace {

constexpr std::uint32_t kNever = ~std::uint32_t{0};

struct HeapEntry {
  std::uint32_t next_use;
  std::uint32_t addr;
  bool operator<(const HeapEntry& o) const { return next_use < o.next_use; }  // max-heap by next use
};

}  // namespace

Result<BeladyResult> ReplayBelady(const SelectionTrace& trace, double pool_fraction, std::uint32_t warmup_steps) {
  ULA_RETURN_IF_ERROR(trace.Validate());
  if (!(pool_fraction > 0 && pool_fraction <= 1)) {
    return MakeError(ErrorCode::kInvalidArgument, "belady: pool_fraction must be in (0, 1]");
  }
  if (warmup_steps >= trace.steps) return MakeError(ErrorCode::kInvalidArgument, "belady: warmup_steps must be < steps");
  BeladyResult result;
  result.pool_slots = static_cast<std::uint32_t>(
      std::min<double>(kNever - 1, std::floor(pool_fraction * trace.batch * trace.context_tokens)));
  const std::size_t n_addr = trace.num_addresses;

  // Distinct addresses of each step, in first-appearance order.
  std::vector<std::uint32_t> stamp(n_addr, 0);  // t + 1 of the step that last listed the address
  std::vector<std::uint64_t> begin{0};
  std::vector<std::uint32_t> distinct;
  for (std::uint32_t t = 0; t < trace.steps; ++t) {
    for (LogicalAddr a : trace.Step(t)) {
      if (stamp[a.value()] != t + 1) {
        stamp[a.value()] = t + 1;
        distinct.push_back(a.value());
      }
    }
    begin.push_back(distinct.size());
  }
  // next_use[i]: the next step after this one that selects distinct[i] (kNever: none).
  std::vector<std::uint32_t> next_use(distinct.size());
  {
    std::vector<std::uint32_t> upcoming(n_addr, kNever);
    for (std::uint32_t t = trace.steps; t-- > 0;) {
      for (std::uint64_t i = begin[t]; i < begin[t + 1]; ++i) {
        next_use[i] = upcoming[distinct[i]];
        upcoming[distinct[i]] = t;
      }
    }
  }

  std::vector<std::uint32_t> key(n_addr, kNever);  // resident entries' current next use
  std::vector<bool> resident(n_addr, false);
  std::vector<HeapEntry> heap;
  std::fill(stamp.begin(), stamp.end(), 0);  // now: t + 1 of the step that selects the address
  std::uint64_t resident_count = 0;
  for (std::uint32_t t = 0; t < trace.steps; ++t) {
    const std::uint64_t d0 = begin[t], d1 = begin[t + 1];
    if (d1 - d0 > result.pool_slots) {
      return MakeError(ErrorCode::kResourceExhausted, "belady: step " + std::to_string(t) + " selects " +
                                                          std::to_string(d1 - d0) + " distinct entries, pool has " +
                                                          std::to_string(result.pool_slots));
    }
    std::uint64_t misses = 0;
    for (std::uint64_t i = d0; i < d1; ++i) {
      stamp[distinct[i]] = t + 1;
      misses += !resident[distinct[i]];
    }
    if (t >= warmup_steps) {
      for (LogicalAddr a : trace.Step(t)) result.hits += resident[a.value()];
      result.selections += trace.Step(t).size();
      result.distinct += d1 - d0;
      result.distinct_hits += (d1 - d0) - misses;
    }
    // Victims: farthest next use first, never an entry of this step.
    const std::uint64_t free_slots = result.pool_slots - resident_count;
    std::uint64_t to_evict = misses > free_slots ? misses - free_slots : 0;
    if (t >= warmup_steps) result.evictions += to_evict;
    while (to_evict > 0) {
      std::pop_heap(heap.begin(), heap.end());
      const HeapEntry e = heap.back();
      heap.pop_back();
      if (!resident[e.addr] || key[e.addr] != e.next_use || stamp[e.addr] == t + 1) continue;  // stale or in use
      resident[e.addr] = false;
      --resident_count;
      --to_evict;
    }
    for (std::uint64_t i = d0; i < d1; ++i) {
      const std::uint32_t a = distinct[i];
      if (!resident[a]) {
        resident[a] = true;
        ++resident_count;
      }
      key[a] = next_use[i];
      heap.push_back({next_use[i], a});
      std::push_heap(heap.begin(), heap.end());
    }
    if (heap.size() > 2 * std::size_t{result.pool_slots} + 1024) {  // sweep stale entries
      std::erase_if(heap, [&](const HeapEntry& e) { return !resident[e.addr] || key[e.addr] != e.next_use; });
      std::make_heap(heap.begin(), heap.end());
    }
  }
  return result;
}

}  // namespace ula::policy
