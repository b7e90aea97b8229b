// The step's kernels, written once against CCCL (step_kernels.h has the contract). Included
// by step_kernels_omp.cc (g++, thrust's OpenMP system) and step_kernels.cu (nvcc, CUDA), each
// of which first defines:
//   ULA_KERNELS_NS        the namespace of the form (omp, cuda)
//   ULA_KERNELS_EXEC      the type of its execution context
//   ULA_KERNELS_POLICY(e) the thrust execution policy of context e
//   ULA_HD                __host__ __device__ or nothing
//
// Kernels, one thread per element of the index space named first:
//
// Classify — [n] selections; reads selections, run_starts/run_tags/adopted, owner, records;
//   writes records' stamp bits, first[a], kind[i], slots[i] (hits), hit_first/miss_first[i].
//   Pass 1: validate; a valid selection claims its address's stamp with a compare-and-swap
//   on the 8-byte record (the 14 stamp bits become the step's epoch; the location bits are
//   kept). Exactly one thread per distinct address sees the CAS succeed from an older stamp:
//   it owns the address for this step and initialises first[a] = its index. Pass 2: every
//   other valid selection lowers first[a] with an atomic minimum (a CAS loop: libcu++ 1.8.1
//   has no fetch_min). Pass 3: the selection with i == first[a] is the address's first
//   occurrence; it flags hit_first or miss_first. Why the order does not matter: the CAS
//   winner only writes a value the minimum then replaces by the lowest index, whichever
//   thread won; the minimum of a set does not depend on the order of its updates; pass 3
//   reads values no thread writes any more. The first invalid selection is a min-reduction.
// Compact — [n] flags; an exclusive scan gives each flagged element its position, a scatter
//   writes values[i] to out[pos[i]]: the positions are the flags' ranks in index order.
// TakeLowest — [num_sources * num_words] words; pass 1 popcounts each word, an exclusive scan
//   gives each word the rank of its first set bit, pass 2 writes the set bits of rank < need
//   to out[rank]. Each word's thread writes its own ranks only: no atomics.
// MakeDescriptors — [n_miss]; descriptor i from missed[i], targets[i] and the record's host
//   slot; disjoint outputs.
// Publish — [n] descriptors, run after the copies completed (the caller waits on the fences;
//   the CUDA form is ordered after the copy kernel on the same stream): each descriptor's
//   address gets its device location, a swap's victim gets the host slot, device_owner the
//   new holder. The addresses and slots of distinct descriptors are distinct (each address is
//   missed once, each target slot claimed once): disjoint 8-byte stores, atomic_ref only so
//   that concurrent readers never see a torn record.
// WriteIndices — [n] selections; each miss's selection reads its published slot.

#include <thrust/execution_policy.h>
#include <thrust/for_each.h>
#include <thrust/functional.h>
#include <thrust/iterator/counting_iterator.h>
#include <thrust/scan.h>
#include <thrust/transform.h>
#include <thrust/transform_reduce.h>

#include <cuda/atomic>

namespace ula::kernels::ULA_KERNELS_NS {
namespace {

using Index = thrust::counting_iterator<std::uint32_t>;
constexpr auto kScope = ::cuda::thread_scope_device;
constexpr auto kRelaxed = ::cuda::std::memory_order_relaxed;

ULA_HD inline std::uint32_t Popcount64(std::uint64_t x) {
#if defined(__CUDA_ARCH__)
  return static_cast<std::uint32_t>(__popcll(x));
#else
  return static_cast<std::uint32_t>(__builtin_popcountll(x));
#endif
}
ULA_HD inline std::uint32_t Ctz64(std::uint64_t x) {
#if defined(__CUDA_ARCH__)
  return static_cast<std::uint32_t>(__ffsll(static_cast<long long>(x)) - 1);
#else
  return static_cast<std::uint32_t>(__builtin_ctzll(x));
#endif
}

// The run holding selection i: the last r with run_starts[r] <= i (runs of count 0 share a
// start with the next one; the last of them holds i).
ULA_HD inline std::uint32_t RunOf(const std::uint32_t* starts, std::uint32_t num_runs, std::uint32_t i) {
  std::uint32_t lo = 0, hi = num_runs;  // answer in [lo, hi)
  while (hi - lo > 1) {
    const std::uint32_t mid = lo + (hi - lo) / 2;
    if (starts[mid] <= i) lo = mid;
    else hi = mid;
  }
  return lo;
}

ULA_HD inline bool Contains(const std::uint32_t* sorted, std::uint32_t begin, std::uint32_t end, std::uint32_t a) {
  while (begin < end) {
    const std::uint32_t mid = begin + (end - begin) / 2;
    if (sorted[mid] < a) begin = mid + 1;
    else end = mid;
  }
  return begin < end ? sorted[begin] == a : false;
}

struct ClassifyPass1 {
  ClassifyArgs a;
  ULA_HD void operator()(std::uint32_t i) const {
    const std::uint32_t addr = a.selections[i];
    a.kind[i] = kKindInvalid;
    a.hit_first[i] = 0;
    a.miss_first[i] = 0;
    if (addr >= a.table_size) return;
    ::cuda::atomic_ref<std::uint64_t, kScope> rec(a.records[addr]);
    std::uint64_t old = rec.load(kRelaxed);
    const std::uint64_t loc = old & kLocationMask;
    if (loc == 0) return;
    const std::uint32_t run = RunOf(a.run_starts, a.num_runs, i);
    const std::uint32_t owner = a.owner[addr];
    const bool holds = owner == a.run_tags[run] ||
                       (owner != 0 && Contains(a.adopted, a.adopted_starts[run], a.adopted_starts[run + 1], addr));
    if (!holds || static_cast<std::uint32_t>((loc >> 32) & 0xffffu) != a.rank) return;
    const bool on_device = static_cast<std::uint32_t>(loc >> 48) == kTierDeviceCode;
    if (on_device) a.slots[i] = static_cast<std::int32_t>(static_cast<std::uint32_t>(loc));
    a.kind[i] = on_device ? kKindHit : kKindMiss;
    // Claim the stamp: one CAS per attempt; a failure reloads (another thread stamped it).
    const std::uint64_t stamp = std::uint64_t{a.epoch} << kStampShift;
    while ((old >> kStampShift) != a.epoch) {
      if (rec.compare_exchange_weak(old, (old & kLocationMask) | stamp, kRelaxed, kRelaxed)) {
        ::cuda::atomic_ref<std::uint32_t, kScope>(a.first[addr]).store(i, kRelaxed);  // the owner
        return;
      }
    }
  }
};

struct ClassifyPass2 {
  ClassifyArgs a;
  ULA_HD void operator()(std::uint32_t i) const {
    if (a.kind[i] == kKindInvalid) return;
    ::cuda::atomic_ref<std::uint32_t, kScope> first(a.first[a.selections[i]]);
    std::uint32_t cur = first.load(kRelaxed);
    while (i < cur && !first.compare_exchange_weak(cur, i, kRelaxed, kRelaxed)) {
    }
  }
};

struct ClassifyPass3 {
  ClassifyArgs a;
  ULA_HD void operator()(std::uint32_t i) const {
    const std::uint8_t k = a.kind[i];
    if (k == kKindInvalid || a.first[a.selections[i]] != i) return;
    (k == kKindHit ? a.hit_first : a.miss_first)[i] = 1;
  }
};

struct InvalidIndex {
  const std::uint8_t* kind;
  ULA_HD std::uint32_t operator()(std::uint32_t i) const { return kind[i] == kKindInvalid ? i : kNoSelection; }
};

struct Scatter {
  const std::uint32_t* flags;
  const std::uint32_t* pos;
  const std::uint32_t* values;
  std::uint32_t* out;
  ULA_HD void operator()(std::uint32_t i) const {
    if (flags[i] != 0) out[pos[i]] = values[i];
  }
};

struct WordPopcount {
  BitmapSources s;
  ULA_HD std::uint32_t operator()(std::uint32_t w) const {
    return Popcount64(s.words[w / s.num_words][w % s.num_words]);
  }
};

struct TakeWord {
  BitmapSources s;
  const std::uint32_t* offsets;
  std::uint32_t need;
  std::uint32_t* out;
  ULA_HD void operator()(std::uint32_t w) const {
    std::uint32_t rank = offsets[w];
    if (rank >= need) return;
    const std::uint32_t word = w % s.num_words;
    for (std::uint64_t bits = s.words[w / s.num_words][word]; bits != 0 && rank < need; bits &= bits - 1) {
      out[rank++] = (word << 6) | Ctz64(bits);
    }
  }
};

struct Describe {
  DescriptorArgs a;
  ULA_HD void operator()(std::uint32_t i) const {
    const std::uint32_t addr = a.missed[i];
    const std::uint32_t host_slot = static_cast<std::uint32_t>(a.records[addr]);
    CopyDescriptor d;
    d.src_slot = host_slot;
    d.dst_slot = a.targets[i];
    d.src_offset = std::uint64_t{host_slot} * a.row_bytes;  // in every layer's region
    d.dst_offset = std::uint64_t{d.dst_slot} * a.row_bytes;
    d.bytes = a.row_bytes;
    d.addr = addr;
    d.src_rank = a.rank;
    d.dst_rank = a.rank;
    d.group = a.group;
    d.src_tier = 1;  // Tier::kHost
    d.dst_tier = 0;  // Tier::kDevice
    d.op = static_cast<std::uint8_t>(i < a.n_free ? CopyOp::kCopy : CopyOp::kSwap);
    d.num_layers = a.num_layers;
    a.out[i] = d;
  }
};

ULA_HD inline std::uint64_t MakeLocation(std::uint32_t tier_code, std::uint32_t rank, std::uint32_t slot) {
  return std::uint64_t{tier_code} << 48 | std::uint64_t{rank} << 32 | slot;
}

struct PublishOne {
  PublishArgs a;
  ULA_HD void operator()(std::uint32_t i) const {
    const bool copy = i < a.n_free;
    if (copy ? !a.copies_ok : !a.swaps_ok) return;  // not copied: nothing published
    const CopyDescriptor& d = a.descriptors[i];
    if (!copy) {
      const std::uint32_t victim = a.device_owner[d.dst_slot];
      ::cuda::atomic_ref<std::uint64_t, kScope> v(a.records[victim]);
      const std::uint64_t old = v.load(kRelaxed);
      v.store((old & ~kLocationMask) | MakeLocation(kTierHostCode, d.src_rank, d.src_slot), kRelaxed);
    }
    ::cuda::atomic_ref<std::uint64_t, kScope> r(a.records[d.addr]);
    const std::uint64_t old = r.load(kRelaxed);
    r.store((old & ~kLocationMask) | MakeLocation(kTierDeviceCode, d.dst_rank, d.dst_slot), kRelaxed);
    a.device_owner[d.dst_slot] = d.addr;
  }
};

struct IndexOne {
  IndexArgs a;
  ULA_HD void operator()(std::uint32_t i) const {
    if (a.kind[i] == kKindMiss) a.slots[i] = static_cast<std::int32_t>(static_cast<std::uint32_t>(a.records[a.selections[i]]));
  }
};

}  // namespace

std::uint32_t Classify(ULA_KERNELS_EXEC exec, const ClassifyArgs& args) {
  if (args.n == 0) return kNoSelection;
  auto policy = ULA_KERNELS_POLICY(exec);
  thrust::for_each(policy, Index(0), Index(args.n), ClassifyPass1{args});
  thrust::for_each(policy, Index(0), Index(args.n), ClassifyPass2{args});
  thrust::for_each(policy, Index(0), Index(args.n), ClassifyPass3{args});
  return thrust::transform_reduce(policy, Index(0), Index(args.n), InvalidIndex{args.kind}, kNoSelection,
                                  thrust::minimum<std::uint32_t>());
}

std::uint32_t Compact(ULA_KERNELS_EXEC exec, const std::uint32_t* flags, std::uint32_t* pos, std::uint32_t n,
                      const std::uint32_t* values, std::uint32_t* out) {
  if (n == 0) return 0;
  auto policy = ULA_KERNELS_POLICY(exec);
  thrust::exclusive_scan(policy, flags, flags + n, pos, std::uint32_t{0});
  thrust::for_each(policy, Index(0), Index(n), Scatter{flags, pos, values, out});
  std::uint32_t last_pos = 0, last_flag = 0;
  ULA_KERNELS_READ(exec, &last_pos, pos + n - 1);
  ULA_KERNELS_READ(exec, &last_flag, flags + n - 1);
  return last_pos + last_flag;
}

std::uint32_t TakeLowest(ULA_KERNELS_EXEC exec, const BitmapSources& sources, std::uint32_t need,
                         std::uint32_t* counts, std::uint32_t* offsets, std::uint32_t* out) {
  const std::uint32_t words = sources.num_sources * sources.num_words;
  if (need == 0 || words == 0) return 0;
  auto policy = ULA_KERNELS_POLICY(exec);
  thrust::transform(policy, Index(0), Index(words), counts, WordPopcount{sources});
  thrust::exclusive_scan(policy, counts, counts + words, offsets, std::uint32_t{0});
  thrust::for_each(policy, Index(0), Index(words), TakeWord{sources, offsets, need, out});
  std::uint32_t last_offset = 0, last_count = 0;
  ULA_KERNELS_READ(exec, &last_offset, offsets + words - 1);
  ULA_KERNELS_READ(exec, &last_count, counts + words - 1);
  return last_offset + last_count < need ? last_offset + last_count : need;
}

void MakeDescriptors(ULA_KERNELS_EXEC exec, const DescriptorArgs& args) {
  if (args.n_miss == 0) return;
  thrust::for_each(ULA_KERNELS_POLICY(exec), Index(0), Index(args.n_miss), Describe{args});
}

void Publish(ULA_KERNELS_EXEC exec, const PublishArgs& args) {
  if (args.n == 0) return;
  thrust::for_each(ULA_KERNELS_POLICY(exec), Index(0), Index(args.n), PublishOne{args});
}

void WriteIndices(ULA_KERNELS_EXEC exec, const IndexArgs& args) {
  if (args.n == 0) return;
  thrust::for_each(ULA_KERNELS_POLICY(exec), Index(0), Index(args.n), IndexOne{args});
}

std::uint32_t RunOfForHost(const std::uint32_t* run_starts, std::uint32_t num_runs, std::uint32_t i) {
  return RunOf(run_starts, num_runs, i);
}

}  // namespace ula::kernels::ULA_KERNELS_NS
