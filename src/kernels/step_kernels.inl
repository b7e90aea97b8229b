// The step's kernels, written once against CCCL (step_kernels.h has the contract). Included
// by step_kernels_omp.cc (g++, thrust's OpenMP system) and step_kernels.cu (nvcc, CUDA), each
// of which first defines:
//   ULA_KERNELS_NS        the namespace of the form (omp, gpu)
//   ULA_KERNELS_EXEC      the type of its execution context
//   ULA_KERNELS_POLICY(e) the thrust execution policy of context e
//   ULA_KERNELS_COOPERATIVE(e, arena, width, program)  one cooperative launch of the device
//                         step: every member of one grid runs program(g) with the form's grid g:
//                         g.ForEach(n, f) (f(i) for the member's share of [0, n), no barrier),
//                         g.Sync() (a grid-wide barrier: every member's writes before it are
//                         visible to every member after it), g.Scan(in, n, out, init, op) (an
//                         exclusive scan of n values of `in` under op, init its identity,
//                         ending with a barrier); width: the largest n of its loops. The
//                         OpenMP form runs one parallel region with barriers, the CUDA form one
//                         cooperative kernel (grid.sync(); its scans' per-block partials come
//                         from the arena)
//   ULA_KERNELS_PROGRAM   what a program's operator() is (__device__ in the CUDA form)
//   ULA_KERNELS_HOST_PLANNER  (OpenMP form only) compile the host-side entry points: TakeLowest
//                         and the flat PB-LRU's (policy/kernel_pb_lru.h)
// and then wraps the device step's launches (namespace launch below, which may throw in the
// CUDA form) into the entry points of step_kernels.h, which return a KernelError.
// (ULA_HD, __host__ __device__ under nvcc, comes from ula/host_device.h).
//
// Kernels, one thread per element of the index space named first:
//
// TakeLowest — [num_sources * num_words] words; pass 1 popcounts each word, an exclusive scan
//   gives each word the rank of its first set bit, pass 2 writes the set bits of rank < need
//   to out[rank]. Each word's thread writes its own ranks only: no atomics. With summary
//   levels (BitmapSources::num_summary, and PbTakeVictims always) the index space is
//   [num_sources * num_summary] blocks of 64 words: pass 1 popcounts only the words its
//   summary word names (an empty stretch costs one summary read), the scan ranks the blocks,
//   pass 2 walks only the blocks whose first rank is below need.
// PbTouch — [n] slots; each thread exchanges its slot's stamp with the round (exactly one
//   thread per distinct slot sees the old stamp: duplicates do nothing), clears the slot from
//   the bucket its old stamp names and sets it in the current one, with fetch_and / fetch_or
//   on the words, the summary word when a word turns zero / non-zero, fetch_add / fetch_sub
//   on the counts. Why the order does not matter: a touch only clears bits of old buckets and
//   only sets bits of the current one, so each word's final value is its old value with the
//   touched bits moved, and a word turns zero (or non-zero) for exactly one thread; counts
//   are sums. PbInsert is the same with no old bucket (tracked + 1 per slot).
// PbAdvance — one thread moves the clock (round + 1, cur + 1 mod R + 1; at round 2^32 - 1 the
//   round restarts at R + 3 after PbRebase, which the host runs first, rebased the [capacity]
//   stamps keeping every age), then [num_summary] threads
//   fold the reused bucket's words into cold, each over its own 64 words and summary word
//   (disjoint writes, one atomic add to cold's count per thread).
// The device step's kernels (Dev*, launched by namespace launch at the end: check, claim,
//   complete, advance round) say at their definitions what they read and write and why the
//   order of threads does not matter; ula/device_step.h has the phases.

#include <thrust/execution_policy.h>
#include <thrust/for_each.h>
#include <thrust/iterator/counting_iterator.h>
#include <thrust/iterator/transform_iterator.h>
#include <thrust/scan.h>
#include <thrust/transform.h>

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

// Whether sorted[begin, end) holds a (a lower bound, then one comparison).
ULA_HD inline bool Contains(const std::uint32_t* sorted, std::uint32_t begin, std::uint32_t end, std::uint32_t a) {
  const std::uint32_t stop = end;
  while (begin < end) {
    const std::uint32_t mid = begin + (end - begin) / 2;
    if (sorted[mid] < a) begin = mid + 1;
    else end = mid;
  }
  return begin < stop && sorted[begin] == a;
}

// The index of address addr's record and first[] entry.
ULA_HD inline std::uint32_t EntryOf(std::uint32_t num_ranks, std::uint32_t addr) {
  return num_ranks > 1 ? addr / num_ranks : addr;
}

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

// ---- Summary-level take: sources j in [0, num_sources), each num_words words and
// num_summary summary words; block b = j * num_summary + k covers words [64 k, 64 k + 64).
struct ExplicitSources {
  BitmapSources s;
  ULA_HD const std::uint64_t* words(std::uint32_t j) const { return s.words[j]; }
  ULA_HD const std::uint64_t* summary(std::uint32_t j) const { return s.summary[j]; }
};
// PB-LRU's victim buckets in ClaimVictims' order: source 0 = cold (bucket R + 1), source j in
// [1, R] = the ring bucket of age R + 1 - j. Never the current bucket (age 0).
ULA_HD inline std::uint32_t RingOfAge(const PbLruArrays& pb, std::uint32_t cur, std::uint32_t age) {
  return cur >= age ? cur - age : cur + pb.recent + 1 - age;
}
struct PbVictimSources {
  PbLruArrays pb;
  ULA_HD std::uint32_t bucket(std::uint32_t j) const {
    return j == 0 ? pb.recent + 1 : RingOfAge(pb, pb.clock->cur, pb.recent + 1 - j);
  }
  ULA_HD const std::uint64_t* words(std::uint32_t j) const { return pb.words + std::size_t{bucket(j)} * pb.num_words; }
  ULA_HD const std::uint64_t* summary(std::uint32_t j) const {
    return pb.summary + std::size_t{bucket(j)} * pb.num_summary;
  }
};

template <class Src>
struct BlockPopcount {
  Src src;
  std::uint32_t num_words, num_summary;
  ULA_HD std::uint32_t operator()(std::uint32_t b) const {
    const std::uint32_t j = b / num_summary, k = b % num_summary;
    const std::uint64_t* w = src.words(j);
    std::uint32_t n = 0;
    for (std::uint64_t bits = src.summary(j)[k]; bits != 0; bits &= bits - 1) {
      const std::uint32_t word = (k << 6) | Ctz64(bits);
      if (word < num_words) n += Popcount64(w[word]);
    }
    return n;
  }
};

// The set bits of block k (words [64 k, 64 k + 64) of w, named by summary word `sum`), lowest
// first, from rank `rank` on while the rank is below `limit`: emit(rank, slot) for each. The
// words are read into a local before their bits are emitted, so emit may clear them.
template <class Emit>
ULA_HD inline void TakeBits(const std::uint64_t* w, std::uint64_t sum, std::uint32_t k, std::uint32_t num_words,
                            std::uint32_t rank, std::uint32_t limit, Emit emit) {
  for (; sum != 0 && rank < limit; sum &= sum - 1) {
    const std::uint32_t word = (k << 6) | Ctz64(sum);
    if (word >= num_words) break;
    for (std::uint64_t bits = w[word]; bits != 0 && rank < limit; bits &= bits - 1) {
      emit(rank++, (word << 6) | Ctz64(bits));
    }
  }
}

struct StoreAt {  // TakeBits' emit: out[rank] = slot
  std::uint32_t* out;
  ULA_HD void operator()(std::uint32_t rank, std::uint32_t slot) const { out[rank] = slot; }
};

template <class Src>
struct TakeBlock {
  Src src;
  std::uint32_t num_words, num_summary;
  const std::uint32_t* offsets;
  std::uint32_t need;
  const std::uint32_t* need_dev;  // when set, replaces need
  std::uint32_t* out;
  const std::uint32_t* out_offset_dev = nullptr;  // when set, rank k goes to out[*out_offset_dev + k]
  ULA_HD void operator()(std::uint32_t b) const {
    const std::uint32_t limit = need_dev != nullptr ? *need_dev : need;
    const std::uint32_t rank = offsets[b];
    if (rank >= limit) return;
    const std::uint32_t j = b / num_summary, k = b % num_summary;
    TakeBits(src.words(j), src.summary(j)[k], k, num_words, rank, limit,
             StoreAt{out_offset_dev != nullptr ? out + *out_offset_dev : out});
  }
};

// ---- Flat PB-LRU bucket bit operations (atomic: many slots share a word).
ULA_HD inline void BucketSet(const PbLruArrays& pb, std::uint32_t b, std::uint32_t s) {
  const std::uint32_t w = s >> 6;
  const std::uint64_t bit = std::uint64_t{1} << (s & 63);
  ::cuda::atomic_ref<std::uint64_t, kScope> word(pb.words[std::size_t{b} * pb.num_words + w]);
  const std::uint64_t before = word.fetch_or(bit, kRelaxed);
  if ((before & bit) != 0) return;
  ::cuda::atomic_ref<std::uint64_t, kScope>(pb.counts[b]).fetch_add(1, kRelaxed);
  if (before == 0) {
    ::cuda::atomic_ref<std::uint64_t, kScope>(pb.summary[std::size_t{b} * pb.num_summary + (w >> 6)])
        .fetch_or(std::uint64_t{1} << (w & 63), kRelaxed);
  }
}
ULA_HD inline void BucketClear(const PbLruArrays& pb, std::uint32_t b, std::uint32_t s) {
  const std::uint32_t w = s >> 6;
  const std::uint64_t bit = std::uint64_t{1} << (s & 63);
  ::cuda::atomic_ref<std::uint64_t, kScope> word(pb.words[std::size_t{b} * pb.num_words + w]);
  const std::uint64_t before = word.fetch_and(~bit, kRelaxed);
  if ((before & bit) == 0) return;
  ::cuda::atomic_ref<std::uint64_t, kScope>(pb.counts[b]).fetch_sub(1, kRelaxed);
  if (before == bit) {
    ::cuda::atomic_ref<std::uint64_t, kScope>(pb.summary[std::size_t{b} * pb.num_summary + (w >> 6)])
        .fetch_and(~(std::uint64_t{1} << (w & 63)), kRelaxed);
  }
}
// The bucket of a slot stamped `old` in round `round`: ring bucket of its age, or cold.
ULA_HD inline std::uint32_t BucketOfStamp(const PbLruArrays& pb, std::uint32_t round, std::uint32_t cur,
                                          std::uint32_t old) {
  const std::uint32_t age = round - old;
  return age <= pb.recent ? RingOfAge(pb, cur, age) : pb.recent + 1;
}
ULA_HD inline void PbTouchOne(const PbLruArrays& pb, std::uint32_t s) {
  const std::uint32_t round = pb.clock->round, cur = pb.clock->cur;
  const std::uint32_t old = ::cuda::atomic_ref<std::uint32_t, kScope>(pb.stamps[s]).exchange(round, kRelaxed);
  if (old == round) return;  // a duplicate, or already current
  BucketClear(pb, BucketOfStamp(pb, round, cur, old), s);
  BucketSet(pb, cur, s);
}
ULA_HD inline void PbInsertOne(const PbLruArrays& pb, std::uint32_t s) {
  ::cuda::atomic_ref<std::uint32_t, kScope>(pb.stamps[s]).store(pb.clock->round, kRelaxed);
  BucketSet(pb, pb.clock->cur, s);
  ::cuda::atomic_ref<std::uint64_t, kScope>(pb.clock->tracked).fetch_add(1, kRelaxed);
}

struct PbTouchFn {
  PbLruArrays pb;
  const std::uint32_t* slots;
  const std::uint32_t* n_dev;
  const std::uint32_t* begin_dev = nullptr;  // when set: slots[*begin_dev + i], i < *n_dev
  ULA_HD void operator()(std::uint32_t i) const {
    if (n_dev != nullptr && i >= *n_dev) return;
    PbTouchOne(pb, slots[(begin_dev != nullptr ? *begin_dev : 0) + i]);
  }
};
struct PbInsertFn {
  PbLruArrays pb;
  const std::uint32_t* slots;
  const std::uint32_t* n_dev;
  ULA_HD void operator()(std::uint32_t i) const {
    if (n_dev != nullptr && i >= *n_dev) return;
    PbInsertOne(pb, slots[i]);
  }
};
struct PbRemoveFn {
  PbLruArrays pb;
  std::uint32_t slot;
  ULA_HD void operator()(std::uint32_t) const {
    const std::uint32_t old = pb.stamps[slot];
    if (old == 0) return;
    BucketClear(pb, BucketOfStamp(pb, pb.clock->round, pb.clock->cur, old), slot);
    pb.stamps[slot] = 0;
    pb.clock->tracked -= 1;
  }
};
// Before the 32-bit round counter wraps: every stamp keeps its age (cold ages clamp to R + 1,
// the same bucket) under the round R + 2. Reads the clock; PbClockFn then moves it.
struct PbRebaseFn {
  PbLruArrays pb;
  ULA_HD void operator()(std::uint32_t s) const {
    const std::uint32_t round = pb.clock->round;
    if (round != 0xffffffffu || pb.stamps[s] == 0) return;
    const std::uint32_t age = round - pb.stamps[s];
    pb.stamps[s] = pb.recent + 2 - (age < pb.recent + 1 ? age : pb.recent + 1);
  }
};
struct PbClockFn {
  PbLruArrays pb;
  ULA_HD void operator()(std::uint32_t) const {
    PbLruClock& c = *pb.clock;
    if (c.round == 0xffffffffu) c.round = pb.recent + 2;
    c.round += 1;
    c.cur = c.cur + 1 == pb.recent + 1 ? 0 : c.cur + 1;
  }
};
struct PbFoldFn {
  PbLruArrays pb;
  ULA_HD void operator()(std::uint32_t k) const {
    const std::uint32_t cold = pb.recent + 1, reused = pb.clock->cur;
    std::uint64_t* rs = pb.summary + std::size_t{reused} * pb.num_summary + k;
    if (*rs == 0) return;
    std::uint64_t* rw = pb.words + std::size_t{reused} * pb.num_words;
    std::uint64_t* cw = pb.words + std::size_t{cold} * pb.num_words;
    std::uint64_t moved = 0;
    for (std::uint64_t bits = *rs; bits != 0; bits &= bits - 1) {
      const std::uint32_t w = (k << 6) | Ctz64(bits);
      moved += Popcount64(rw[w]);
      cw[w] |= rw[w];
      rw[w] = 0;
    }
    pb.summary[std::size_t{cold} * pb.num_summary + k] |= *rs;
    *rs = 0;
    ::cuda::atomic_ref<std::uint64_t, kScope>(pb.counts[cold]).fetch_add(moved, kRelaxed);
    ::cuda::atomic_ref<std::uint64_t, kScope>(pb.counts[reused]).fetch_sub(moved, kRelaxed);
  }
};

// ---- The device step's kernels (DeviceStepArgs; ula/device_step.h has the phases).
struct FlatSource {
  FlatBitmap f;
  ULA_HD const std::uint64_t* words(std::uint32_t) const { return f.words; }
  ULA_HD const std::uint64_t* summary(std::uint32_t) const { return f.summary; }
};
ULA_HD inline void FlatSet(const FlatBitmap& f, std::uint32_t s) {
  const std::uint32_t w = s >> 6;
  const std::uint64_t bit = std::uint64_t{1} << (s & 63);
  const std::uint64_t before = ::cuda::atomic_ref<std::uint64_t, kScope>(f.words[w]).fetch_or(bit, kRelaxed);
  if ((before & bit) != 0) return;
  ::cuda::atomic_ref<std::uint64_t, kScope>(*f.count).fetch_add(1, kRelaxed);
  if (before == 0) {
    ::cuda::atomic_ref<std::uint64_t, kScope>(f.summary[w >> 6]).fetch_or(std::uint64_t{1} << (w & 63), kRelaxed);
  }
}
ULA_HD inline void FlatClear(const FlatBitmap& f, std::uint32_t s) {
  const std::uint32_t w = s >> 6;
  const std::uint64_t bit = std::uint64_t{1} << (s & 63);
  const std::uint64_t before = ::cuda::atomic_ref<std::uint64_t, kScope>(f.words[w]).fetch_and(~bit, kRelaxed);
  if ((before & bit) == 0) return;
  ::cuda::atomic_ref<std::uint64_t, kScope>(*f.count).fetch_sub(1, kRelaxed);
  if (before == bit) {
    ::cuda::atomic_ref<std::uint64_t, kScope>(f.summary[w >> 6]).fetch_and(~(std::uint64_t{1} << (w & 63)), kRelaxed);
  }
}
ULA_HD inline void AtomicMin(std::uint32_t& x, std::uint32_t v) {
  ::cuda::atomic_ref<std::uint32_t, kScope> a(x);
  std::uint32_t cur = a.load(kRelaxed);
  while (v < cur && !a.compare_exchange_weak(cur, v, kRelaxed, kRelaxed)) {
  }
}

// Selection j of the step's [num_rows * top_k] index space: row j / top_k, column j % top_k.
ULA_HD inline std::int32_t SelectionAt(const StepArrays& io, std::uint32_t j) {
  return io.selections[std::size_t{j / io.top_k} * io.selection_stride + j % io.top_k];
}

// The request tag of selection j's row (0: unknown).
ULA_HD inline std::uint32_t RowTag(const DeviceStepArgs& a, std::uint32_t j, std::int64_t& req) {
  const std::uint32_t r = j / a.io.top_k;
  const std::uint32_t b = a.io.row_batch != nullptr ? static_cast<std::uint32_t>(a.io.row_batch[r]) : r / a.io.q_len;
  req = b < a.io.batch ? a.io.requests[b] : -1;
  return req >= 0 && static_cast<std::uint64_t>(req) < a.num_requests ? a.request_tags[req] : 0;
}

// Whether addr is new on host this round: device placement's bitmap, else the sorted list.
ULA_HD inline bool IsNewOnHost(const DeviceStepArgs& a, std::uint32_t pinned, std::uint32_t addr) {
  if (a.place.new_on_host_bits != nullptr) {
    return addr < a.owner_size && ((a.place.new_on_host_bits[addr >> 6] >> (addr & 63)) & 1) != 0;
  }
  return Contains(a.new_on_host, 0, pinned, addr);
}

// Validate (StepPlanner's checks, in its order) and claim first[a] = the lowest
// selection of each valid address (an atomic minimum: the order of the updates is irrelevant).
// Nothing else: the step's counts come from the tally scan after it (TallyOf), so the
// control block holds no sums that a launch before this one would have to reset.
struct DevClassify {
  DeviceStepArgs a;
  // TP (TpStepPlanner / TpStepPlanner's checks): the directory (live, the row's request
  // known, held), then home: another rank's address is kDevElsewhere, this rank's is a hit or
  // a miss by its home record.
  ULA_HD std::uint8_t CheckTp(std::uint32_t j, std::uint32_t addr) const {
    const std::uint32_t owner = addr < a.owner_size ? a.owner[addr] : 0;
    if (owner == 0) return kDevNotLive;
    std::int64_t req = -1;
    const std::uint32_t tag = RowTag(a, j, req);
    if (tag == 0) return kDevUnknownRequest;
    if (owner != tag && !Contains(a.adopted, a.adopted_starts[req], a.adopted_starts[req + 1], addr)) return kDevNotHeld;
    if (addr % a.num_ranks != a.rank) return kDevElsewhere;
    const std::uint32_t e = addr / a.num_ranks;
    const std::uint64_t loc = e < a.table_size ? a.records[e] & kLocationMask : 0;
    if (loc == 0) return kDevNotLive;
    return location_bits::OnDevice(loc) ? kDevHit : kDevMiss;
  }
  ULA_HD std::uint8_t Check(std::uint32_t j) const {
    const std::int32_t v = SelectionAt(a.io, j);
    if (v == -1) return kDevPad;
    if (v < -1) return kDevBadValue;
    const auto addr = static_cast<std::uint32_t>(v);
    if (a.num_ranks > 1) return CheckTp(j, addr);
    const std::uint64_t loc = addr < a.table_size ? a.records[addr] & kLocationMask : 0;
    if (loc == 0) return kDevNotLive;
    std::int64_t req = -1;
    const std::uint32_t tag = RowTag(a, j, req);
    if (tag == 0) return kDevUnknownRequest;
    const std::uint32_t owner = a.owner[addr];
    const bool holds = owner == tag || (owner != 0 && Contains(a.adopted, a.adopted_starts[req],
                                                               a.adopted_starts[req + 1], addr));
    if (!holds) return kDevNotHeld;
    if (location_bits::RankOf(loc) != a.rank) return kDevOtherRank;
    return location_bits::OnDevice(loc) ? kDevHit : kDevMiss;
  }
  ULA_HD void operator()(std::uint32_t j) const {
    const std::uint8_t k = Check(j);
    a.kind[j] = k;
    if (k > kDevMiss) return;
    const auto addr = static_cast<std::uint32_t>(SelectionAt(a.io, j));
    AtomicMin(a.first[EntryOf(a.num_ranks, addr)], j);
  }
};

ULA_HD inline StepTally TallyZero() { return StepTally{0, 0, 0, 0, kNoSelection, 0}; }
// The tally scan's operator: sums, the lowest bad selection, the flags' union. Associative
// with TallyZero as identity, so any grouping CCCL's scan picks gives the same prefixes.
struct TallyPlus {
  ULA_HD StepTally operator()(const StepTally& x, const StepTally& y) const {
    return StepTally{x.hits + y.hits,
                     x.misses + y.misses,
                     x.newly_used + y.newly_used,
                     x.selections + y.selections,
                     x.first_bad < y.first_bad ? x.first_bad : y.first_bad,
                     x.flags | y.flags};
  }
};
// Selection j's own tally, the scan's input (a pure function of what DevClassify finished
// writing, kind[] and first[], and of state no Check kernel writes): a first occurrence
// counts as a hit or a miss, a distinct hit not used in this round yet counts towards the
// room check (StepPlanner's newly_used), a refusal kind names its selection as the first bad.
// It replaces the flag arrays and both the sums and the atomics on the control block: one
// scan instead of two, and nothing to reset before the next step.
struct TallyOf {
  DeviceStepArgs a;
  ULA_HD StepTally operator()(std::uint32_t j) const {
    StepTally t = TallyZero();
    const std::uint8_t k = a.kind[j];
    if (k == kDevPad) return t;
    t.selections = 1;
    if (k == kDevElsewhere) return t;
    if (k > kDevElsewhere) {
      t.first_bad = j;
      if (k == kDevBadValue) t.flags = kTallyBadValue;
      return t;
    }
    const auto addr = static_cast<std::uint32_t>(SelectionAt(a.io, j));
    const std::uint32_t e = EntryOf(a.num_ranks, addr);
    if (a.first[e] == j) {
      t.hits = k == kDevHit;
      t.misses = k == kDevMiss;
      if (t.hits != 0 && a.pb.stamps[static_cast<std::uint32_t>(a.records[e])] != a.pb.clock->round) t.newly_used = 1;
    }
    const std::uint32_t pinned = a.ctl->num_new_on_host;
    if (k == kDevMiss && pinned != 0 && IsNewOnHost(a, pinned, addr)) {
      t.flags |= kTallyNewOnHostMiss;
    }
    return t;
  }
};

// One thread: the step's tally (the scan's last prefix plus the last selection's own), the
// refusal (first bad selection, too few descriptor rows, no room: StepPlanner's order), the
// split into free slots and victims. It writes every field of the control block a step
// decides, the counts 0 in a refused step.
struct DevDecide {
  DeviceStepArgs a;
  std::uint32_t n;
  ULA_HD void operator()(std::uint32_t) const {
    DeviceStepControl& c = *a.ctl;
    const StepTally t = n == 0 ? TallyZero() : TallyPlus{}(a.tally[n - 1], TallyOf{a}(n - 1));
    const std::uint32_t n_hit = t.hits, n_miss = t.misses;
    c.first_bad = t.first_bad;
    c.bad_value = (t.flags & kTallyBadValue) != 0 ? 1 : 0;
    c.selections = t.selections;
    c.newly_used = t.newly_used;
    c.new_on_host_miss = (t.flags & kTallyNewOnHostMiss) != 0 ? 1 : 0;
    std::uint32_t error = 0;
    const bool tp = a.num_ranks > 1;
    if (tp && c.bad_value != 0) {  // TpStepPlanner checks every value before any address
      error = a.codes.invalid_argument;
    } else if (c.first_bad != kNoSelection) {
      const std::uint8_t k = a.kind[c.first_bad];
      error = k == kDevBadValue || k == kDevOtherRank ? a.codes.invalid_argument : a.codes.not_found;
    } else if (c.new_on_host_miss != 0) {  // the planners' RefuseMovingNewOnHost, in their order
      error = a.codes.resource_exhausted;
    } else {
      // No room (StepPlanner's Classify; TP: TpStepPlanner::PlanHome's) or fewer descriptor
      // rows than misses: both refuse this step's state with kResourceExhausted, as the host
      // step's engine path does (whichever it checks first, the code is the same).
      const std::uint64_t free = *a.device_free.count;
      const std::uint64_t evictable = a.pb.clock->tracked - a.pb.counts[a.pb.clock->cur] - c.newly_used;
      if (n_miss > free + evictable || n_miss > a.io.max_descriptors) error = a.codes.resource_exhausted;
    }
    c.error = error;
    if (error != 0) {  // every count 0: Claim's kernels then only reset first[] and record
      c.n_hit = c.n_miss = c.n_free = c.n_victims = c.pending = 0;
      return;
    }
    const std::uint64_t free = *a.device_free.count;
    c.n_hit = n_hit;
    c.n_miss = n_miss;
    c.n_free = n_miss < free ? n_miss : static_cast<std::uint32_t>(free);
    c.n_victims = n_miss - c.n_free;
    c.pending = n_miss;
  }
};

// The compaction, with DevDecide in thread 0. Thread j, its address's first occurrence,
// writes its miss's address at its rank (the tally scan's prefix) or marks its hit's slot in
// hit_mark (Claim's take touches the marked hits and takes no marked slot as a victim); every
// thread writes pick[j] (a hit's slot, a miss's rank among the distinct misses: what Claim's
// indices need, so that they do not read first[], which Claim resets). Why Decide may run in
// the same launch: everything it reads was final before this launch started: the scan's last
// prefix and the last selection's tally (TallyOf reads kind[], first[], records, stamps, the
// clock, the pinned list), kind[first_bad], the free count and PB-LRU's counts; the other
// threads write only missed[], pick[] and hit_mark, which Decide does not read, and read no
// field of the control block, which Decide writes.
struct DevScatter {
  DeviceStepArgs a;
  std::uint32_t n;
  ULA_HD void operator()(std::uint32_t j) const {
    if (j == 0) DevDecide{a, n}(0);
    const std::uint8_t k = a.kind[j];
    if (k > kDevMiss) return;
    const auto addr = static_cast<std::uint32_t>(SelectionAt(a.io, j));
    const std::uint32_t e = EntryOf(a.num_ranks, addr);
    const std::uint32_t first = a.first[e];
    if (k == kDevHit) {
      const auto slot = static_cast<std::uint32_t>(a.records[e]);
      a.pick[j] = slot;
      if (first == j) {
        ::cuda::atomic_ref<std::uint64_t, kScope>(a.hit_mark[slot >> 6])
            .fetch_or(std::uint64_t{1} << (slot & 63), kRelaxed);
      }
    } else {
      a.pick[j] = a.tally[first].misses;
      if (first == j) a.missed[a.tally[j].misses] = addr;
    }
  }
};

// Whether Claim goes ahead: this rank's verdict and (TP) the agreed one, the MAX over the
// ranks, are both 0; a step another rank refused is refused here too. Every Claim kernel
// asks it, and only DevRecord, the last, writes the agreed refusal into the control block, so
// no kernel reads a field that another thread of its own launch writes.
ULA_HD inline bool Go(const DeviceStepControl& c, const std::uint32_t* agreed) {
  return c.error == 0 && (agreed == nullptr || *agreed == 0);
}

// The take's sources as one string of blocks: the free bitmap's [device_free.num_summary]
// blocks first, then PB-LRU's victim buckets' [(R + 1) * pb.num_summary] in ClaimVictims'
// order. Block b's popcount is the input of Claim's one scan, a pure function of the bitmaps
// and the step's hit marks: a victim block counts its slots less this step's hits, which the
// take moves to the current bucket before it takes (StepPlanner touches the hits before it
// claims victims), so the scan needs no launch of its own for the hits' touch before it.
struct ClaimPopcount {
  DeviceStepArgs a;
  ULA_HD std::uint32_t operator()(std::uint32_t b) const {
    const std::uint32_t free_blocks = a.device_free.num_summary;
    if (b < free_blocks) {
      return BlockPopcount<FlatSource>{FlatSource{a.device_free}, a.device_free.num_words, free_blocks}(b);
    }
    const PbVictimSources src{a.pb};
    const std::uint32_t v = b - free_blocks, j = v / a.pb.num_summary, k = v % a.pb.num_summary;
    const std::uint64_t* w = src.words(j);
    std::uint32_t n = 0;
    for (std::uint64_t sum = src.summary(j)[k]; sum != 0; sum &= sum - 1) {
      const std::uint32_t word = (k << 6) | Ctz64(sum);
      if (word < a.pb.num_words) n += Popcount64(w[word] & ~a.hit_mark[word]);
    }
    return n;
  }
};
struct TakeFree {  // a free slot for descriptor `rank`, out of the free bitmap
  FlatBitmap free;
  std::uint32_t* targets;
  ULA_HD void operator()(std::uint32_t rank, std::uint32_t slot) const {
    targets[rank] = slot;
    FlatClear(free, slot);
  }
};
struct TakeVictim {  // victim `rank`, for descriptor n_free + rank, into the current bucket
  PbLruArrays pb;
  std::uint32_t* targets;  // targets + n_free
  ULA_HD void operator()(std::uint32_t rank, std::uint32_t slot) const {
    targets[rank] = slot;
    PbTouchOne(pb, slot);
  }
};
// The take over the scan's ranks, one thread per block: a free block's ranks below n_free go
// to targets[rank]; a victim block first touches this step's marked hits in it (into the
// current bucket), then its ranks, counted from the first victim block's prefix (the free
// bitmap's total), those below n_victims, go to targets[n_free + rank]. Each taken slot is
// emitted by exactly one thread, the one of its block, which also claims it: clears its free
// bit, or touches the victim. A touch clears the slot's bit in the bucket its stamp names, the
// one the block belongs to, whose words in this block only this thread reads; the current
// bucket it moves to is no source. Free bitmap and PB-LRU are disjoint, and no thread reads
// the counts the claims change. A hit already in the current bucket is in no block: its
// touch would change nothing.
struct DevTake {
  DeviceStepArgs a;
  const std::uint32_t* agreed;
  ULA_HD void operator()(std::uint32_t b) const {
    const DeviceStepControl& c = *a.ctl;
    if (!Go(c, agreed)) return;
    const std::uint32_t free_blocks = a.device_free.num_summary;
    if (b < free_blocks) {
      const std::uint32_t rank = a.take_offsets[b];
      if (rank >= c.n_free) return;
      TakeBits(a.device_free.words, a.device_free.summary[b], b, a.device_free.num_words, rank, c.n_free,
               TakeFree{a.device_free, a.targets});
      return;
    }
    const PbVictimSources src{a.pb};
    const std::uint32_t v = b - free_blocks, j = v / a.pb.num_summary, k = v % a.pb.num_summary;
    const std::uint64_t* w = src.words(j);
    for (std::uint64_t sum = src.summary(j)[k]; sum != 0; sum &= sum - 1) {
      const std::uint32_t word = (k << 6) | Ctz64(sum);
      if (word >= a.pb.num_words) break;
      for (std::uint64_t hit = w[word] & a.hit_mark[word]; hit != 0; hit &= hit - 1) {
        PbTouchOne(a.pb, (word << 6) | Ctz64(hit));
      }
    }
    const std::uint32_t rank = a.take_offsets[b] - a.take_offsets[free_blocks];
    if (rank >= c.n_victims) return;
    TakeBits(src.words(j), src.summary(j)[k], k, a.pb.num_words, rank, c.n_victims,
             TakeVictim{a.pb, a.targets + c.n_free});
  }
};

struct DevDescribe {
  DeviceStepArgs a;
  ULA_HD void operator()(std::uint32_t i) const {
    const DeviceStepControl& c = *a.ctl;
    if (i >= c.n_miss) return;
    const std::uint32_t addr = a.missed[i];
    const std::uint32_t host_slot = location_bits::SlotOf(a.records[EntryOf(a.num_ranks, addr)]);
    const auto rank = static_cast<std::uint16_t>(a.rank);
    a.io.descriptors[i] = MakeCopyDescriptor(i < c.n_free ? CopyOp::kCopy : CopyOp::kSwap, {Tier::kHost, rank, host_slot},
                                             {Tier::kDevice, rank, a.targets[i]}, addr, static_cast<std::uint16_t>(a.group),
                                             a.row_bytes, static_cast<std::uint16_t>(a.num_layers));
  }
};

// Claim's last [n] pass: first[] back to kNoSelection and the hit marks to 0 for the next
// step (every step, refused or not; every hit of the word stores the same 0, and the marks
// of a word are all this step's), then, in a step that goes ahead, descriptor j (j < n_miss: its target is final,
// the take finished) and selection j's index in the attention kernel's layout: pads -1,
// hits their slot, misses their target (valid once DeviceComplete published them). Every
// selection of an address stores the same value into first[], so the stores are atomic
// (relaxed): plain ones would be a data race (TSan found it once libgomp's fork and join were
// annotated, tests/tsan_gomp_annotations.cc). Nothing in this launch reads first[] or the
// marks: the indices read pick[] (DevScatter).
struct DevDescribeIndices {
  DeviceStepArgs a;
  const std::uint32_t* agreed;
  ULA_HD void operator()(std::uint32_t j) const {
    const std::uint8_t k = a.kind[j];
    if (k <= kDevMiss) {
      ::cuda::atomic_ref<std::uint32_t, kScope>(a.first[EntryOf(a.num_ranks, static_cast<std::uint32_t>(SelectionAt(a.io, j)))])
          .store(kNoSelection, kRelaxed);
    }
    if (k == kDevHit) ::cuda::atomic_ref<std::uint64_t, kScope>(a.hit_mark[a.pick[j] >> 6]).store(0, kRelaxed);
    if (!Go(*a.ctl, agreed)) return;  // a refused step writes no index and no descriptor
    if (j < a.ctl->n_miss) DevDescribe{a}(j);
    std::int32_t& out = a.io.indices[std::size_t{j / a.io.top_k} * a.io.index_stride + j % a.io.top_k];
    if (k == kDevPad || k == kDevElsewhere) {  // TP: another rank's partial covers it
      out = -1;
      return;
    }
    out = static_cast<std::int32_t>(k == kDevHit ? a.pick[j] : a.targets[a.pick[j]]);
  }
};

// One thread, last of Claim: the agreed refusal (TP: another rank refused, kFailedPrecondition,
// every count back to 0), the publish counts of the Complete to come zeroed (the last ones
// kept for ReadState), the StepRecord, then `done` after a system-scope fence (pinned
// memory): its own launch, so that the fence follows every other kernel's writes.
struct DevRecord {
  DeviceStepArgs a;
  const std::uint32_t* agreed;
  ULA_HD void operator()(std::uint32_t) const {
    DeviceStepControl& c = *a.ctl;
    if (c.error == 0 && !Go(c, agreed)) {
      c.error = a.codes.failed_precondition;
      c.n_hit = c.n_miss = c.n_free = c.n_victims = c.pending = 0;
    }
    c.last_published = c.published;
    c.last_failed = c.failed;
    c.published = c.failed = 0;
    StepRecord& r = *a.io.stats;
    r.selections = c.selections;
    r.distinct = std::uint64_t{c.n_hit} + c.n_miss;
    r.hits = c.n_hit;
    r.misses = c.n_miss;
    r.evictions = c.n_victims;
    r.bytes_moved = (std::uint64_t{c.n_miss} + c.n_victims) * a.entry_bytes;
    r.num_descriptors = c.n_miss;
    r.error = c.error;
    c.steps += 1;
    ::cuda::atomic_thread_fence(::cuda::std::memory_order_release, ::cuda::thread_scope_system);
    ::cuda::atomic_ref<std::uint64_t, ::cuda::thread_scope_system>(r.done).store(c.steps, ::cuda::std::memory_order_relaxed);
  }
};

// Publish descriptor i where status[i] == 0 (StepPlanner::Complete): a copy frees its
// host slot and enters the policy; a failed copy's slot goes back to the free bitmap; a swap
// moves its victim to the wanted entry's host slot; a failed swap changes nothing. Distinct
// descriptors touch distinct addresses and slots: disjoint record stores; bitmaps atomic.
struct DevPublish {
  DeviceStepArgs a;
  const std::uint8_t* status;
  ULA_HD void operator()(std::uint32_t i) const {
    DeviceStepControl& c = *a.ctl;
    if (i >= c.pending) return;
    const bool ok = status[i] == 0;
    ::cuda::atomic_ref<std::uint32_t, kScope>(ok ? c.published : c.failed).fetch_add(1, kRelaxed);
    const std::uint32_t addr = a.missed[i], dst = a.targets[i];
    const auto host_slot = static_cast<std::uint32_t>(a.records[EntryOf(a.num_ranks, addr)]);
    if (i < c.n_free) {
      if (!ok) {
        FlatSet(a.device_free, dst);
        return;
      }
      FlatSet(a.host_free, host_slot);
      PbInsertOne(a.pb, dst);
    } else {
      if (!ok) return;
      const std::uint32_t victim = a.device_owner[dst];
      a.records[EntryOf(a.num_ranks, victim)] = location_bits::Pack(Tier::kHost, a.rank, host_slot);
    }
    a.records[EntryOf(a.num_ranks, addr)] = location_bits::Pack(Tier::kDevice, a.rank, dst);
    a.device_owner[dst] = addr;
  }
};
// The round's end, one thread: this round's new entries on host may move from the next round
// on, and PB-LRU's clock moves (PbClockFn; the fold after it reads the new clock).
struct DevRoundClock {
  DeviceStepArgs a;
  ULA_HD void operator()(std::uint32_t) const {
    a.ctl->num_new_on_host = 0;
    PbClockFn{a.pb}(0);
  }
};

// ---- Device placement (DeviceStep::Place; docs/ARCHITECTURE.md, "The device step"): the
// host's journal applied as kernels over the journal's index spaces. Each list names
// distinct request ids or addresses (the journal's), so per-element stores go to distinct
// records, owners, slots and request tags; the bitmaps, PB-LRU and counts shared between
// elements are changed by atomics whose results do not depend on the order (a set bit is
// set, a cleared one cleared, counts are sums). Every choice of a slot is a rank in a scan
// of a bitmap in word order, as the step's claim takes them: the result is the host rule's
// whatever the schedule.
ULA_HD inline void NewOnHostMark(const DeviceStepArgs& a, std::uint32_t addr) {
  ::cuda::atomic_ref<std::uint64_t, kScope>(a.place.new_on_host_bits[addr >> 6])
      .fetch_or(std::uint64_t{1} << (addr & 63), kRelaxed);
  // The step's gate (DevClassify reads the bitmap only when it is non-zero).
  ::cuda::atomic_ref<std::uint32_t, kScope>(a.ctl->num_new_on_host).fetch_add(1, kRelaxed);
}
// PbRemove for one of many threads: the stamp's exchange makes one thread the remover.
ULA_HD inline void PbRemoveOne(const PbLruArrays& pb, std::uint32_t s) {
  const std::uint32_t old = ::cuda::atomic_ref<std::uint32_t, kScope>(pb.stamps[s]).exchange(0, kRelaxed);
  if (old == 0) return;
  BucketClear(pb, BucketOfStamp(pb, pb.clock->round, pb.clock->cur, old), s);
  ::cuda::atomic_ref<std::uint64_t, kScope>(pb.clock->tracked).fetch_sub(1, kRelaxed);
}

// One thread: a fresh split and this place's counts: the arrays' num_* fields, or (with
// PlacementArrays::counts) the counts in memory, each at most its capacity (the num_*
// field): a count past it refuses the place (every count 0, so no kernel after this one
// does anything, no eviction, error = 1 + kInvalidArgument).
struct DevPlaceBegin {
  DeviceStepArgs a;
  ULA_HD void operator()(std::uint32_t) const {
    const PlacementArrays& io = a.place.io;
    PlaceControl c{};
    std::uint32_t n[4];
    c.refused = PlaceCounts(io, n) ? 0 : 1;
    c.num_retired = n[0];
    c.num_new_requests = n[1];
    c.num_released = n[2];
    c.num_seated = n[3];
    if (c.refused != 0) *io.num_evictions = 0;
    if (io.error != nullptr) *io.error = c.refused != 0 ? a.codes.invalid_argument : 0;
    *a.place.ctl = c;
  }
};
// [num_retired]: a freed request's tag is cleared (ids past the table are skipped: the host
// checks them in the OpenMP form).
struct DevRetire {
  DeviceStepArgs a;
  ULA_HD void operator()(std::uint32_t i) const {
    const std::uint32_t r = a.place.io.retired[i];
    if (r < a.num_requests) const_cast<std::uint32_t*>(a.request_tags)[r] = 0;
  }
};
// [num_new_requests]: a new request's tag (after the retirements: an id freed and added
// again ends with the new tag).
struct DevAdmit {
  DeviceStepArgs a;
  ULA_HD void operator()(std::uint32_t i) const {
    const std::uint32_t r = a.place.io.new_requests[i];
    if (r < a.num_requests) const_cast<std::uint32_t*>(a.request_tags)[r] = a.place.io.new_tags[i];
  }
};
// [num_released]: a released address's entry: its device slot back to the free bitmap and out
// of PB-LRU (its owner cleared), or its host slot back to the host's; its record, owner tag
// and new-on-host mark cleared. An address no Place seated (record 0) only loses its tag.
struct DevRelease {
  DeviceStepArgs a;
  ULA_HD void operator()(std::uint32_t i) const {
    const std::uint32_t addr = a.place.io.released[i];
    if (addr >= a.owner_size) return;
    const std::uint64_t loc = a.records[addr] & kLocationMask;
    if (loc != 0) {
      const std::uint32_t slot = location_bits::SlotOf(loc);
      if (location_bits::OnDevice(loc)) {
        PbRemoveOne(a.pb, slot);
        a.device_owner[slot] = 0xffffffffu;  // LogicalAddr::Invalid(), as the host pools keep it
        FlatSet(a.device_free, slot);
      } else {
        FlatSet(a.host_free, slot);
      }
    }
    a.records[addr] = 0;
    const_cast<std::uint32_t*>(a.owner)[addr] = 0;
    ::cuda::atomic_ref<std::uint64_t, kScope>(a.place.new_on_host_bits[addr >> 6])
        .fetch_and(~(std::uint64_t{1} << (addr & 63)), kRelaxed);
  }
};
// [num_seated]: each new address's owner tag.
struct DevSeatOwner {
  DeviceStepArgs a;
  ULA_HD void operator()(std::uint32_t i) const {
    const std::uint32_t addr = a.place.io.seated[i];
    if (addr < a.owner_size) const_cast<std::uint32_t*>(a.owner)[addr] = a.place.io.seated_tags[i];
  }
};
// One thread: Allocate's split for stable new entries (ShardPools::PlanVictims): the lowest
// free device slots, then victims that this round has not used (every tracked slot outside
// the current bucket), then host; the host slots the victims and the rest need.
struct DevPlaceSplit {
  DeviceStepArgs a;
  std::uint32_t n;
  ULA_HD void operator()(std::uint32_t) const {
    PlaceControl& c = *a.place.ctl;
    const std::uint64_t free = *a.device_free.count;
    c.n_free = n < free ? n : static_cast<std::uint32_t>(free);
    const std::uint64_t evictable = a.pb.clock->tracked - a.pb.counts[a.pb.clock->cur];
    const std::uint32_t rest = n - c.n_free;
    c.n_victims = rest < evictable ? rest : static_cast<std::uint32_t>(evictable);
    c.n_host = rest - c.n_victims;
    const std::uint64_t host_free = *a.host_free.count;
    if (std::uint64_t{c.n_victims} + c.n_host > host_free) {  // the host's room check makes this unreachable
      c.short_host = 1;
      c.n_victims = c.n_victims < host_free ? c.n_victims : static_cast<std::uint32_t>(host_free);
      c.n_host = static_cast<std::uint32_t>(host_free) - c.n_victims < c.n_host
                     ? static_cast<std::uint32_t>(host_free) - c.n_victims : c.n_host;
    }
    c.n_hosts = c.n_victims + c.n_host;
    c.pending = c.n_victims;
    *a.place.io.num_evictions = c.n_victims;
  }
};
// [num_seated]: seats [0, n_free) take their free slots (out of the free bitmap, into PB-LRU's
// current bucket: used this round), owners and records.
struct DevSeatFree {
  DeviceStepArgs a;
  ULA_HD void operator()(std::uint32_t i) const {
    if (i >= a.place.ctl->n_free) return;
    const std::uint32_t addr = a.place.io.seated[i], s = a.place.slots[i];
    FlatClear(a.device_free, s);
    PbInsertOne(a.pb, s);
    a.device_owner[s] = addr;
    const std::uint64_t loc = location_bits::Pack(Tier::kDevice, a.rank, s);
    a.records[addr] = loc;
    a.place.io.locations[i] = loc;
  }
};
// [num_seated]: seats past the free slots. A victim's seat k: its host slot taken, the
// descriptor that copies the victim there (the new address is published by
// DevicePlaceComplete); a host seat: its host slot, its record, new on host this round.
struct DevSeatRest {
  DeviceStepArgs a;
  ULA_HD void operator()(std::uint32_t i) const {
    const PlaceControl& c = *a.place.ctl;
    if (i < c.n_free || i >= c.n_free + c.n_hosts) return;
    const std::uint32_t addr = a.place.io.seated[i], k = i - c.n_free, h = a.place.hosts[k];
    FlatClear(a.host_free, h);
    if (k < c.n_victims) {
      const std::uint32_t v = a.place.slots[i];
      a.place.addrs[k] = addr;
      const auto rank = static_cast<std::uint16_t>(a.rank);
      a.place.io.evictions[k] = MakeCopyDescriptor(CopyOp::kCopy, {Tier::kDevice, rank, v}, {Tier::kHost, rank, h},
                                                   a.device_owner[v], static_cast<std::uint16_t>(a.group),
                                                   a.row_bytes, static_cast<std::uint16_t>(a.num_layers));
      a.place.io.locations[i] = 0;  // published by DevicePlaceComplete
      return;
    }
    const std::uint64_t loc = location_bits::Pack(Tier::kHost, a.rank, h);
    a.records[addr] = loc;
    a.place.io.locations[i] = loc;
    NewOnHostMark(a, addr);
  }
};
// [max seats]: eviction k's publish after the engine's copy. Copied: the victim's record
// names its host slot, the new address takes the victim's device slot (tracked, used this
// round: the claim touched it). Failed: the victim stays (used this round, as a failed move
// of Allocate leaves it) and the new address takes the reserved host slot, new on host.
// Distinct evictions name distinct victims, slots and addresses: disjoint stores.
struct DevEvictPublish {
  DeviceStepArgs a;
  const std::uint8_t* status;
  ULA_HD void operator()(std::uint32_t k) const {
    const PlaceControl& c = *a.place.ctl;
    if (k >= c.pending) return;
    const bool ok = status[k] == 0;
    ::cuda::atomic_ref<std::uint32_t, kScope>(ok ? a.place.ctl->published : a.place.ctl->failed).fetch_add(1, kRelaxed);
    const std::uint32_t i = c.n_free + k, addr = a.place.addrs[k], v = a.place.slots[i], h = a.place.hosts[k];
    if (!ok) {
      const std::uint64_t loc = location_bits::Pack(Tier::kHost, a.rank, h);
      a.records[addr] = loc;
      a.place.io.locations[i] = loc;
      NewOnHostMark(a, addr);
      return;
    }
    a.records[a.device_owner[v]] = location_bits::Pack(Tier::kHost, a.rank, h);
    const std::uint64_t loc = location_bits::Pack(Tier::kDevice, a.rank, v);
    a.records[addr] = loc;
    a.place.io.locations[i] = loc;
    a.device_owner[v] = addr;
  }
};
struct DevPlaceCompleteBegin {
  DeviceStepArgs a;
  ULA_HD void operator()(std::uint32_t) const { a.place.ctl->published = a.place.ctl->failed = 0; }
};
struct DevPlaceCompleteEnd {
  DeviceStepArgs a;
  ULA_HD void operator()(std::uint32_t) const { a.place.ctl->pending = 0; }
};
// [new_on_host_words], at the round's end: no entry is new on host in the next round.
struct DevClearNewOnHost {
  DeviceStepArgs a;
  ULA_HD void operator()(std::uint32_t w) const { a.place.new_on_host_bits[w] = 0; }
};

}  // namespace

#if defined(ULA_KERNELS_HOST_PLANNER)
std::uint32_t TakeLowest(ULA_KERNELS_EXEC exec, const BitmapSources& sources, std::uint32_t need,
                         std::uint32_t* counts, std::uint32_t* offsets, std::uint32_t* out) {
  const std::uint32_t words = sources.num_sources * sources.num_words;
  if (need == 0 || words == 0) return 0;
  auto policy = ULA_KERNELS_POLICY(exec);
  if (sources.num_summary > 0) {
    const std::uint32_t blocks = sources.num_sources * sources.num_summary;
    const ExplicitSources src{sources};
    thrust::transform(policy, Index(0), Index(blocks), counts,
                      BlockPopcount<ExplicitSources>{src, sources.num_words, sources.num_summary});
    thrust::exclusive_scan(policy, counts, counts + blocks, offsets, std::uint32_t{0});
    thrust::for_each(policy, Index(0), Index(blocks),
                     TakeBlock<ExplicitSources>{src, sources.num_words, sources.num_summary, offsets, need, nullptr, out});
    std::uint32_t last_offset = 0, last_count = 0;
    ULA_KERNELS_READ(exec, &last_offset, offsets + blocks - 1);
    ULA_KERNELS_READ(exec, &last_count, counts + blocks - 1);
    return last_offset + last_count < need ? last_offset + last_count : need;
  }
  thrust::transform(policy, Index(0), Index(words), counts, WordPopcount{sources});
  thrust::exclusive_scan(policy, counts, counts + words, offsets, std::uint32_t{0});
  thrust::for_each(policy, Index(0), Index(words), TakeWord{sources, offsets, need, out});
  std::uint32_t last_offset = 0, last_count = 0;
  ULA_KERNELS_READ(exec, &last_offset, offsets + words - 1);
  ULA_KERNELS_READ(exec, &last_count, counts + words - 1);
  return last_offset + last_count < need ? last_offset + last_count : need;
}

void PbTouch(ULA_KERNELS_EXEC exec, const PbLruArrays& pb, const std::uint32_t* slots, std::uint32_t n,
             const std::uint32_t* n_dev) {
  if (n == 0) return;
  thrust::for_each(ULA_KERNELS_POLICY(exec), Index(0), Index(n), PbTouchFn{pb, slots, n_dev});
}

void PbInsert(ULA_KERNELS_EXEC exec, const PbLruArrays& pb, const std::uint32_t* slots, std::uint32_t n,
              const std::uint32_t* n_dev) {
  if (n == 0) return;
  thrust::for_each(ULA_KERNELS_POLICY(exec), Index(0), Index(n), PbInsertFn{pb, slots, n_dev});
}

void PbRemove(ULA_KERNELS_EXEC exec, const PbLruArrays& pb, std::uint32_t slot) {
  thrust::for_each(ULA_KERNELS_POLICY(exec), Index(0), Index(1), PbRemoveFn{pb, slot});
}

void PbAdvance(ULA_KERNELS_EXEC exec, const PbLruArrays& pb) {
  auto policy = ULA_KERNELS_POLICY(exec);
  thrust::for_each(policy, Index(0), Index(1), PbClockFn{pb});
  thrust::for_each(policy, Index(0), Index(pb.num_summary), PbFoldFn{pb});
}

void PbRebase(ULA_KERNELS_EXEC exec, const PbLruArrays& pb) {
  thrust::for_each(ULA_KERNELS_POLICY(exec), Index(0), Index(pb.capacity), PbRebaseFn{pb});
}

void PbTakeVictims(ULA_KERNELS_EXEC exec, const PbLruArrays& pb, std::uint32_t need, const std::uint32_t* need_dev,
                   std::uint32_t* counts, std::uint32_t* offsets, std::uint32_t* out) {
  const std::uint32_t blocks = (pb.recent + 1) * pb.num_summary;
  if (blocks == 0 || (need_dev == nullptr && need == 0)) return;
  auto policy = ULA_KERNELS_POLICY(exec);
  const PbVictimSources src{pb};
  thrust::transform(policy, Index(0), Index(blocks), counts,
                    BlockPopcount<PbVictimSources>{src, pb.num_words, pb.num_summary});
  thrust::exclusive_scan(policy, counts, counts + blocks, offsets, std::uint32_t{0});
  thrust::for_each(policy, Index(0), Index(blocks),
                   TakeBlock<PbVictimSources>{src, pb.num_words, pb.num_summary, offsets, need, need_dev, out});
}

#endif  // ULA_KERNELS_HOST_PLANNER

// The device step's launches, in stream order. The OpenMP form runs them to completion; the
// CUDA form enqueues them and throws (thrust::system_error, std::bad_alloc, or its own
// LaunchFailed for a cooperative launch) where a launch fails: its entry points
// (step_kernels.cu) catch that.
namespace launch {

// The one place every launch of the device step goes through: it counts the kernels it
// enqueues into the phase's LaunchCounts (step_kernels.h), then launches.
struct Launcher {
  ULA_KERNELS_EXEC exec;
  const DeviceStepArgs& args;
  LaunchPhase phase;
  void Count(std::uint64_t kernels) const {
    if (args.counts != nullptr) args.counts[phase].launches += kernels;
  }
  // One kernel over [0, n) (none for an empty range: thrust launches nothing).
  template <class F>
  void ForEach(std::uint32_t n, F f) const {
    if (n == 0) return;
    Count(1);
    thrust::for_each(ULA_KERNELS_POLICY(exec), Index(0), Index(n), f);
  }
  // One cooperative launch (ULA_KERNELS_COOPERATIVE): every member of one grid runs
  // program(g), whose g.Sync() is a grid-wide barrier; `width` is the largest index space of
  // its loops (the CUDA form sizes the grid by it, never past what is co-resident).
  template <class P>
  void Cooperative(std::uint32_t width, const P& program) const {
    Count(1);
    ULA_KERNELS_COOPERATIVE(exec, args.arena, width < 1 ? 1 : width, program);
  }
};

struct SumU32 {
  ULA_HD std::uint32_t operator()(std::uint32_t x, std::uint32_t y) const { return x + y; }
};
// The step's two scans, their inputs in one place.
ULA_HD inline auto CheckScanInput(const DeviceStepArgs& a) {
  return thrust::make_transform_iterator(Index(0), TallyOf{a});
}
ULA_HD inline auto ClaimScanInput(const DeviceStepArgs& a) {
  return thrust::make_transform_iterator(Index(0), ClaimPopcount{a});
}
ULA_HD inline std::uint32_t ClaimBlocks(const DeviceStepArgs& a) {
  return a.device_free.num_summary + (a.pb.recent + 1) * a.pb.num_summary;
}
ULA_HD inline std::uint32_t Max(std::uint32_t x, std::uint32_t y) { return x < y ? y : x; }

// out[i] = f(i) over [0, n): a Transform inside a cooperative program.
template <class F>
struct WriteEach {
  std::uint32_t* out;
  F f;
  ULA_HD void operator()(std::uint32_t i) const { out[i] = f(i); }
};

// The programs below are the device step's phases, each one cooperative launch. Every
// g.Sync() stands where a kernel boundary stood: each is a grid-wide dependence (a value some
// thread needs that any other thread may have written before the barrier), so the kernels
// between two barriers keep the reasons their definitions give for why the order of their
// threads does not matter. g.Scan(in, n, out, init, op) is an exclusive scan over the grid
// (init is op's identity) that ends with every out[i] written and visible to every member.

// Check: classify | tally scan | scatter with decide (decide alone for no selections). The
// barriers: the scan's input reads first[a], final only once every classify thread's atomic
// minimum is in; the scatter reads the scan's prefixes.
template <class G>
ULA_KERNELS_PROGRAM void CheckBody(const G& g, const DeviceStepArgs& a, std::uint32_t n) {
  if (n == 0) {
    g.ForEach(1, DevDecide{a, 0});
    return;
  }
  g.ForEach(n, DevClassify{a});
  g.Sync();
  g.Scan(CheckScanInput(a), n, a.tally, TallyZero(), TallyPlus{});
  g.ForEach(n, DevScatter{a, n});
}
struct CheckProgram {
  DeviceStepArgs a;
  std::uint32_t n;
  template <class G>
  ULA_KERNELS_PROGRAM void operator()(const G& g) const {
    CheckBody(g, a, n);
  }
};

// Claim: one scan over the free blocks' and victim blocks' popcounts | take and claim (the
// hits touched, free bits cleared, victims touched) | descriptors, indices, first[] and mark
// reset | record (the record alone for no selections). The barriers: the take reads the
// scan's prefixes; a descriptor or index reads targets[] another block's thread took; the
// record's system-scope fence follows every other write of the step.
template <class G>
ULA_KERNELS_PROGRAM void ClaimBody(const G& g, const DeviceStepArgs& a, const std::uint32_t* agreed, std::uint32_t n) {
  if (n > 0) {
    const std::uint32_t blocks = ClaimBlocks(a);
    g.Scan(ClaimScanInput(a), blocks, a.take_offsets, std::uint32_t{0}, SumU32{});
    g.ForEach(blocks, DevTake{a, agreed});
    g.Sync();
    g.ForEach(n, DevDescribeIndices{a, agreed});
    g.Sync();
  }
  g.ForEach(1, DevRecord{a, agreed});
}
struct ClaimProgram {
  DeviceStepArgs a;
  const std::uint32_t* agreed;
  std::uint32_t n;
  template <class G>
  ULA_KERNELS_PROGRAM void operator()(const G& g) const {
    ClaimBody(g, a, agreed, n);
  }
};

// Plan (DP): Check | Claim in one launch, this rank's own verdict. The barrier: the take's
// scan reads the hits every scatter thread marked, the claim's kernels the verdict decide
// wrote.
struct PlanProgram {
  DeviceStepArgs a;
  std::uint32_t n;
  template <class G>
  ULA_KERNELS_PROGRAM void operator()(const G& g) const {
    CheckBody(g, a, n);
    g.Sync();
    ClaimBody(g, a, nullptr, n);
  }
};

// AdvanceRound: [the new-on-host bits cleared, rebase] | round end and clock | fold. The
// barriers: the clock moves the round the rebase read; the fold reads the bucket the clock
// names. The bits' clear touches nothing else.
struct AdvanceProgram {
  DeviceStepArgs a;
  bool rebase;
  template <class G>
  ULA_KERNELS_PROGRAM void operator()(const G& g) const {
    if (a.place.new_on_host_bits != nullptr) g.ForEach(a.place.new_on_host_words, DevClearNewOnHost{a});
    if (rebase) g.ForEach(a.pb.capacity, PbRebaseFn{a.pb});
    g.Sync();
    g.ForEach(1, DevRoundClock{a});
    g.Sync();
    g.ForEach(a.pb.num_summary, PbFoldFn{a.pb});
  }
};

// Place: its counts (DevPlaceBegin: the arrays' or, with PlacementArrays::counts, what the
// device holds when it runs), the journal's tags, releases and seats, then the takes of the split (free device
// slots, victims, host slots: each a popcount, a scan and a take over the bitmap's summary
// words, as Claim's), the claims and the seats. A barrier stands between any two kernels
// (each reads what the one before wrote: the split reads the releases' frees, a take the
// split's counts and its scan, the touch and the seats the takes' slots).
struct PlaceProgram {
  DeviceStepArgs a;
  template <class G>
  ULA_KERNELS_PROGRAM void operator()(const G& g) const {
    PlaceControl* c = a.place.ctl;
    g.ForEach(1, DevPlaceBegin{a});
    g.Sync();
    // The counts as DevPlaceBegin wrote them (every member reads the same values after the
    // barrier, so every branch below is taken by the whole grid).
    const std::uint32_t n = c->num_seated;
    g.ForEach(c->num_retired, DevRetire{a});
    g.Sync();
    g.ForEach(c->num_new_requests, DevAdmit{a});
    g.Sync();
    g.ForEach(c->num_released, DevRelease{a});
    g.Sync();
    g.ForEach(n, DevSeatOwner{a});
    g.Sync();
    g.ForEach(1, DevPlaceSplit{a, n});
    g.Sync();
    if (n == 0) return;
    const FlatSource free_src{a.device_free};
    const std::uint32_t free_blocks = a.device_free.num_summary;
    g.ForEach(free_blocks, WriteEach<BlockPopcount<FlatSource>>{
                               a.place.take_counts,
                               BlockPopcount<FlatSource>{free_src, a.device_free.num_words, free_blocks}});
    g.Sync();
    g.Scan(a.place.take_counts, free_blocks, a.place.take_offsets, std::uint32_t{0}, SumU32{});
    g.ForEach(free_blocks, TakeBlock<FlatSource>{free_src, a.device_free.num_words, free_blocks,
                                                 a.place.take_offsets, 0, &c->n_free, a.place.slots});
    g.Sync();
    const PbVictimSources vsrc{a.pb};
    const std::uint32_t blocks = (a.pb.recent + 1) * a.pb.num_summary;
    g.ForEach(blocks, WriteEach<BlockPopcount<PbVictimSources>>{
                          a.place.take_counts,
                          BlockPopcount<PbVictimSources>{vsrc, a.pb.num_words, a.pb.num_summary}});
    g.Sync();
    g.Scan(a.place.take_counts, blocks, a.place.take_offsets, std::uint32_t{0}, SumU32{});
    g.ForEach(blocks, TakeBlock<PbVictimSources>{vsrc, a.pb.num_words, a.pb.num_summary, a.place.take_offsets, 0,
                                                 &c->n_victims, a.place.slots, &c->n_free});
    g.Sync();
    // The victims are claimed (used this round) before the free seats enter the current
    // bucket; neither changes the other's slots.
    g.ForEach(n, PbTouchFn{a.pb, a.place.slots, &c->n_victims, &c->n_free});
    g.Sync();
    g.ForEach(n, DevSeatFree{a});
    g.Sync();
    const FlatSource host_src{a.host_free};
    const std::uint32_t host_blocks = a.host_free.num_summary;
    g.ForEach(host_blocks, WriteEach<BlockPopcount<FlatSource>>{
                               a.place.take_counts,
                               BlockPopcount<FlatSource>{host_src, a.host_free.num_words, host_blocks}});
    g.Sync();
    g.Scan(a.place.take_counts, host_blocks, a.place.take_offsets, std::uint32_t{0}, SumU32{});
    g.ForEach(host_blocks, TakeBlock<FlatSource>{host_src, a.host_free.num_words, host_blocks,
                                                 a.place.take_offsets, 0, &c->n_hosts, a.place.hosts});
    g.Sync();
    g.ForEach(n, DevSeatRest{a});
  }
  ULA_HD std::uint32_t Width() const {
    const PlacementArrays& io = a.place.io;
    std::uint32_t w = Max(Max(io.num_retired, io.num_new_requests), Max(io.num_released, io.num_seated));
    w = Max(w, Max(a.device_free.num_summary, a.host_free.num_summary));
    return Max(w, (a.pb.recent + 1) * a.pb.num_summary);
  }
};

// CompletePlace: reset the publish counts | publish the evictions | the seats' end.
struct PlaceCompleteProgram {
  DeviceStepArgs a;
  const std::uint8_t* status;
  template <class G>
  ULA_KERNELS_PROGRAM void operator()(const G& g) const {
    g.ForEach(1, DevPlaceCompleteBegin{a});
    g.Sync();
    g.ForEach(a.place.max_seats, DevEvictPublish{a, status});
    g.Sync();
    g.ForEach(1, DevPlaceCompleteEnd{a});
  }
};

// Check: one launch. Claim: one launch. Plan (DP, no agreement between them): one launch,
// counted under check.
inline std::uint32_t ClaimWidth(const DeviceStepArgs& args, std::uint32_t n) {
  return Max(n, n > 0 ? ClaimBlocks(args) : 1);
}
inline void DeviceCheck(ULA_KERNELS_EXEC exec, const DeviceStepArgs& args) {
  const std::uint32_t n = args.io.num_rows * args.io.top_k;
  Launcher{exec, args, kPhaseCheck}.Cooperative(n, CheckProgram{args, n});
}

inline void DeviceClaim(ULA_KERNELS_EXEC exec, const DeviceStepArgs& args, const std::uint32_t* agreed) {
  const std::uint32_t n = args.io.num_rows * args.io.top_k;
  Launcher{exec, args, kPhaseClaim}.Cooperative(ClaimWidth(args, n), ClaimProgram{args, agreed, n});
}

inline void DevicePlan(ULA_KERNELS_EXEC exec, const DeviceStepArgs& args) {
  const std::uint32_t n = args.io.num_rows * args.io.top_k;
  Launcher{exec, args, kPhaseCheck}.Cooperative(ClaimWidth(args, n), PlanProgram{args, n});
}

// Complete: one launch. Its counts were zeroed by the plan's record, and `pending` is
// written by every Check's decide, so nothing runs before or after the publish.
inline void DeviceComplete(ULA_KERNELS_EXEC exec, const DeviceStepArgs& args, const std::uint8_t* status) {
  const Launcher l{exec, args, kPhaseComplete};
  l.ForEach(args.io.max_descriptors, DevPublish{args, status});
}

// AdvanceRound: one launch (a rebase round's too).
inline void DeviceAdvanceRound(ULA_KERNELS_EXEC exec, const DeviceStepArgs& args, bool rebase) {
  const std::uint32_t width =
      Max(Max(args.place.new_on_host_bits != nullptr ? args.place.new_on_host_words : 0u, rebase ? args.pb.capacity : 0u),
          args.pb.num_summary);
  Launcher{exec, args, kPhaseAdvanceRound}.Cooperative(width, AdvanceProgram{args, rebase});
}

// Device placement (DeviceStep::Place): one launch; its CompletePlace: one launch.
inline void DevicePlace(ULA_KERNELS_EXEC exec, const DeviceStepArgs& args) {
  const PlaceProgram p{args};
  Launcher{exec, args, kPhasePlace}.Cooperative(p.Width(), p);
}

inline void DevicePlaceComplete(ULA_KERNELS_EXEC exec, const DeviceStepArgs& args, const std::uint8_t* status) {
  Launcher{exec, args, kPhasePlace}.Cooperative(args.place.max_seats, PlaceCompleteProgram{args, status});
}

}  // namespace launch

}  // namespace ula::kernels::ULA_KERNELS_NS
