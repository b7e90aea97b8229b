// The step's data-parallel kernels: the phases of one layer group's step as
// functors over an index space plus a CCCL primitive (thrust for_each / transform /
// exclusive_scan), over raw arrays only — no policy, pool or space class is seen here.
// One source, step_kernels.inl, compiles two ways:
//   - by g++ with thrust's OpenMP system (step_kernels_omp.cc, namespace ula::kernels::omp):
//     what `make test` runs on every machine;
//   - by nvcc for the GPU (step_kernels.cu, namespace ula::kernels::gpu, on the caller's
//     stream), where ULA_WITH_CUDA is on.
// Both namespaces export the device step's entry points (ULA_KERNELS_DECLARE below); the
// host-side kernels (TakeLowest and the flat PB-LRU's, which KernelPbLru runs) exist in the
// OpenMP form only. Every pointer is host memory for the OpenMP form and device memory for the CUDA
// form.
//
// Errors: the device step's entry points return a KernelError (0: done); nothing throws out of
// them and nothing aborts (the CUDA form catches thrust's and CCCL's exceptions at its entry
// points). This header is compiled as C++17 by nvcc and names no CUDA type.
//
// Record layout: one 8-byte record per (address, group), a location in the one layout of
// ula/location_bits.h (bits [49:0]; the kernels read and write it through those functions
// only); the bits above it are the host step's dedup stamp (src/core/address_records.h), which
// the kernels mask off (kLocationMask).
//
// Determinism: every output below is a function of the inputs only, whatever the thread
// count or schedule: the dedup's first-occurrence scratch is an atomic minimum (the lowest
// selection index of the address); compaction positions are exclusive scans in selection
// order; the victims are the ranks of set bits in a fixed word order.
#pragma once

#include <cstddef>
#include <cstdint>

#include "ula/location_bits.h"
#include "ula/step_arrays.h"

namespace ula::kernels {

inline constexpr std::uint64_t kLocationMask = location_bits::kMask;
inline constexpr std::uint32_t kNoSelection = 0xffffffffu;

// The sources of TakeLowest: num_sources bitmaps of num_words level-0 words each, read in
// this order as one bit string (source 0's word 0 bit 0 first).
// With summaries (num_summary > 0), summary[j] is source j's first summary level ([num_summary]
// words, bit w: word w may be non-zero; a set bit over an empty word costs a read, never a
// wrong result), and TakeLowest scans blocks of 64 words through it instead of every word.
struct BitmapSources {
  static constexpr int kMax = 72;
  const std::uint64_t* words[kMax] = {};
  const std::uint64_t* summary[kMax] = {};
  std::uint32_t num_sources = 0;
  std::uint32_t num_words = 0;    // per source
  std::uint32_t num_summary = 0;  // per source; 0: no summaries, every word is popcounted
};

// PB-LRU as flat arrays (policy/kernel_pb_lru.h keeps them in host memory, the device step
// in device memory): R + 2 buckets of one bit per slot, ring buckets 0..R (ring[clock.cur] is
// the current one; ring[(cur - a) mod (R + 1)] holds the slots last used a rounds ago) and the
// cold bucket R + 1. Each bucket has its level-0 words and one summary level above them (bit
// w of summary word w / 64: word w is non-zero, exactly), and its count. stamps[s] is the
// round of the slot's last use (0: untracked), so a slot's bucket is known from its stamp
// alone, as in policy/pb_lru.h.
struct PbLruClock {
  std::uint32_t round = 1;   // rounds start at 1; 0 marks an untracked slot
  std::uint32_t cur = 0;     // the current ring bucket
  std::uint64_t tracked = 0; // slots with a non-zero stamp
};
struct PbLruArrays {
  std::uint64_t* words = nullptr;    // [R + 2][num_words]
  std::uint64_t* summary = nullptr;  // [R + 2][num_summary]
  std::uint64_t* counts = nullptr;   // [R + 2] set bits of each bucket
  std::uint32_t* stamps = nullptr;   // [capacity]
  PbLruClock* clock = nullptr;       // [1]
  std::uint32_t recent = 0;          // R
  std::uint32_t capacity = 0;
  std::uint32_t num_words = 0;       // ceil(capacity / 64)
  std::uint32_t num_summary = 0;     // ceil(num_words / 64)
};
// One group's engine pools as ReferenceCopy sees them: each tier [layers][slots][row_bytes]
// (slot s of layer l at base + (l * slots + s) * row_bytes), device-visible memory.
struct CopyPools {
  unsigned char* device = nullptr;
  unsigned char* host = nullptr;
  std::uint32_t device_slots = 0, host_slots = 0, row_bytes = 0;
};
// A set of slots as one flat bitmap with the same summary level (the device step's free slots).
struct FlatBitmap {
  std::uint64_t* words = nullptr;    // [num_words]
  std::uint64_t* summary = nullptr;  // [num_summary]
  std::uint64_t* count = nullptr;    // [1]
  std::uint32_t num_words = 0, num_summary = 0;
};

// ---- The device step (ula/device_step.h): one layer group's DP step as kernels over fixed
// index spaces, every count kept on the device (DeviceStepControl), no host read-back.
// Selection kinds of the device step's classify, one byte per selection.
enum DeviceKind : std::uint8_t {
  kDevHit = 0,
  kDevMiss = 1,
  kDevPad = 2,
  kDevElsewhere = 3,      // TP (num_ranks > 1): valid, homed on another rank (index -1)
  // refusals, in the order StepPlanner's engine path checks a selection (every kind above
  // kDevElsewhere is one):
  kDevBadValue = 4,       // < -1
  kDevNotLive = 5,        // not a live address
  kDevUnknownRequest = 6, // its row's request is unknown
  kDevNotHeld = 7,        // its row's request does not hold it
  kDevOtherRank = 8,      // DP: lives on another rank
};
// The values the device writes to StepRecord::error: 1 + the ErrorCode (filled by the host
// side from ula/error.h, which the CUDA form does not include).
struct DeviceErrorCodes {
  std::uint32_t invalid_argument = 0, not_found = 0, resource_exhausted = 0, failed_precondition = 0;
};
// What one selection adds to the step's counts (the device step's Check scans these, one
// exclusive scan with TallyPlus): sums, a minimum and flags, so that the scan's last element
// plus the last selection's own tally is the whole step's, and the per-selection prefixes of
// `hits` and `misses` are the compaction positions. No default member initializers: CCCL keeps
// the scan's values in shared memory, which takes trivially constructible types only.
inline constexpr std::uint32_t kTallyBadValue = 1;       // a selection < -1
inline constexpr std::uint32_t kTallyNewOnHostMiss = 2;  // a miss this round's Allocate pinned on host
struct StepTally {
  std::uint32_t hits, misses;   // first occurrences (distinct addresses) that hit, that miss
  std::uint32_t newly_used;     // distinct hits not used in this round yet
  std::uint32_t selections;     // non-padding selections
  std::uint32_t first_bad;      // lowest selection that failed a check (kNoSelection: none)
  std::uint32_t flags;          // kTallyBadValue | kTallyNewOnHostMiss
};

struct DeviceStepControl {
  // Written whole by DeviceCheck's decide from the step's tally (nothing accumulates here, so
  // no launch resets the block before a step):
  std::uint32_t first_bad = kNoSelection;  // lowest selection that failed a check
  std::uint32_t bad_value = 0;             // TP: 1 when any selection is < -1 (checked first)
  // 1 + the ErrorCode of a refused step, or 0. After DeviceCheck: this rank's verdict, which
  // a TP engine reduces with MAX over the ranks; DeviceClaim then sets the agreed refusal.
  std::uint32_t error = 0;
  std::uint32_t selections = 0;            // non-padding selections
  std::uint32_t n_hit = 0, n_miss = 0, n_free = 0, n_victims = 0;  // 0 in a refused step
  std::uint32_t newly_used = 0;            // distinct hits not yet used in this round
  // Entries this round's Allocate placed on host (DeviceStepArgs::new_on_host): their count,
  // set by the load and zeroed by the round's end (device memory, so that a captured graph
  // reads the current count), and 1 when a miss of the step is one of them (refused: its KV is
  // written at that host slot this round, so it cannot move).
  std::uint32_t num_new_on_host = 0;
  std::uint32_t new_on_host_miss = 0;
  std::uint32_t pending = 0;               // descriptors awaiting DeviceComplete (0: refused)
  // The publish counts of the pending DeviceComplete (zeroed by DeviceClaim's record, counted
  // by DeviceComplete's publish), and of the Complete before it (kept by that record: what
  // ReadState reports while a plan is pending).
  std::uint32_t published = 0, failed = 0;
  std::uint32_t last_published = 0, last_failed = 0;
  std::uint64_t steps = 0;                 // planned so far: StepRecord::done of the last one
};
// What an entry point of the device step returns: kKernelOk, a CUDA runtime error of the
// first call that failed (cudaError_t's value, > 0; the CUDA form's ErrorText names it), or one
// of the codes below (< 0).
using KernelError = int;
inline constexpr KernelError kKernelOk = 0;
// The scans of this step need more scratch than the arena holds: refused before any launch,
// nothing enqueued, nothing changed (the arena is sized at Create for the largest shape).
inline constexpr KernelError kKernelArenaOverflow = -1;
inline constexpr KernelError kKernelOutOfMemory = -2;  // an allocation failed (device or host)
inline constexpr KernelError kKernelNoDevice = -3;     // CUDA form: no device, or no driver for one
inline constexpr KernelError kKernelException = -4;    // an exception that carried no CUDA error
// CUDA form: a driver is installed but older than the CUDA runtime the build links (an update
// of the driver, not a GPU, is what is missing).
inline constexpr KernelError kKernelOldDriver = -5;
// The text of a negative code (nullptr for the others).
inline const char* KernelErrorName(KernelError e) {
  switch (e) {
    case kKernelOk: return "ok";
    case kKernelArenaOverflow: return "the scans need more scratch than the arena holds";
    case kKernelOutOfMemory: return "out of memory";
    case kKernelNoDevice: return "no CUDA device";
    case kKernelException: return "an exception without a CUDA error";
    case kKernelOldDriver: return "the CUDA driver is older than the CUDA runtime of this build";
    default: return nullptr;
  }
}

// The CUDA runtime's error codes that FromCudaError names (cudaError_t's values; step_kernels.cu
// checks them against cuda_runtime.h, so this header needs no CUDA).
inline constexpr int kCudaErrorMemoryAllocation = 2;
inline constexpr int kCudaErrorStubLibrary = 34;
inline constexpr int kCudaErrorInsufficientDriver = 35;
inline constexpr int kCudaErrorDevicesUnavailable = 46;
inline constexpr int kCudaErrorNoDevice = 100;
// The KernelError of a CUDA runtime error. driver_version is cudaDriverGetVersion's (0 when no
// driver is installed): cudaErrorInsufficientDriver with no driver at all is kKernelNoDevice,
// with one installed kKernelOldDriver (it is older than the runtime).
constexpr KernelError FromCudaError(int cuda_error, int driver_version) {
  switch (cuda_error) {
    case 0: return kKernelOk;
    case kCudaErrorMemoryAllocation: return kKernelOutOfMemory;
    case kCudaErrorInsufficientDriver: return driver_version > 0 ? kKernelOldDriver : kKernelNoDevice;
    case kCudaErrorNoDevice:
    case kCudaErrorStubLibrary:
    case kCudaErrorDevicesUnavailable: return kKernelNoDevice;
    default: return cuda_error;
  }
}

// A bump arena of device memory for the per-block partials of the cooperative launches' scans
// (CUDA form): sized once at Create for the most blocks the device holds resident, never
// grown. The CUDA form checks that bound before it launches anything and refuses the call
// (kKernelArenaOverflow) when Fits says no; Take refuses a request past the capacity (nullptr, `overflows` + 1, nothing else
// changes). Host-side bookkeeping, device-side bytes. Thread-safety: the step's driver thread.
struct ScratchArena {
  static constexpr std::size_t kAlign = 256;
  char* base = nullptr;
  std::size_t capacity = 0, used = 0, high_water = 0;
  std::uint64_t allocations = 0, overflows = 0;

  static std::size_t AlignUp(std::size_t n) { return (n + kAlign - 1) & ~(kAlign - 1); }
  // Whether a request of `bytes` would be served now.
  bool Fits(std::size_t bytes) const { return AlignUp(used) + bytes <= capacity; }
  // `bytes` at the next aligned offset, or nullptr (refused: only `overflows` changes).
  char* Take(std::size_t bytes) {
    const std::size_t at = AlignUp(used);
    if (at + bytes > capacity || at + bytes < at) {
      ++overflows;
      return nullptr;
    }
    ++allocations;
    used = at + bytes;
    if (used > high_water) high_water = used;
    return base + at;
  }
  // Returns the last Take still held (a stack: anything else is kept until the arena is reset).
  void Give(char* p, std::size_t bytes) {
    if (p != nullptr && AlignUp(static_cast<std::size_t>(p - base) + bytes) == AlignUp(used)) {
      used = static_cast<std::size_t>(p - base);
    }
  }
};
// The phases of a (rank, group) step whose launches and host synchronisations are counted
// (ula/device_step.h, DeviceStepCounters): the entry points' phases, and the state's copies
// outside a step (Create, Reload, StoreInto, ReadState).
enum LaunchPhase : std::uint32_t {
  kPhaseCheck = 0,
  kPhaseClaim = 1,
  kPhaseComplete = 2,
  kPhaseAdvanceRound = 3,
  kPhaseState = 4,
  kPhasePlace = 5,   // device placement: Place and its CompletePlace
  kNumPhases = 6,
};
// Kernel launches and host synchronisations of one phase, cumulative (host object). Every
// launch of the step's kernels goes through the .inl's Launch helpers, which add here: a
// thrust for_each or transform over a non-empty range is one kernel, a CCCL exclusive scan
// of n > 0 items two (cub's init and scan kernels); both forms count the CUDA form's kernels.
struct LaunchCounts {
  std::uint64_t launches = 0;
  std::uint64_t syncs = 0;   // stream synchronisations and blocking (pageable) copies
};
// Device placement (DeviceStep::Place): the split of one Place's seats and its evictions'
// publish, device memory.
struct PlaceControl {
  std::uint32_t n_free = 0;     // seats [0, n_free) take the lowest free device slots
  std::uint32_t n_victims = 0;  // seats [n_free, n_free + n_victims) take PB-LRU victims' slots
  std::uint32_t n_host = 0;     // the rest take the lowest free host slots (new on host)
  std::uint32_t n_hosts = 0;    // n_victims + n_host: the host slots taken
  std::uint32_t pending = 0;    // evictions awaiting DevicePlaceComplete
  std::uint32_t published = 0, failed = 0;  // of the last DevicePlaceComplete
  std::uint32_t short_host = 0;  // 1: fewer free host slots than seats past the device (clamped)
  // This place's counts (PlacementArrays' num_* fields, or what its `counts` held when it
  // ran; all 0 in a refused place), what every kernel after the first bounds its loop by.
  std::uint32_t num_retired = 0, num_new_requests = 0, num_released = 0, num_seated = 0;
  std::uint32_t refused = 0;     // 1: a count from PlacementArrays::counts past its capacity
};

// The counts a Place applies, into n[4] (retired, new requests, released, seated): the
// arrays' num_* fields, or with PlacementArrays::counts the counts in memory, each at most
// its capacity (the num_* field). Returns false, with every count 0, when one is past it: the
// whole place is refused. Place's first kernel and the OpenMP form's host check share it.
ULA_HD inline bool PlaceCounts(const PlacementArrays& io, std::uint32_t n[4]) {
  const std::uint32_t caps[4] = {io.num_retired, io.num_new_requests, io.num_released, io.num_seated};
  bool within = true;
  for (std::uint32_t k = 0; k < 4; ++k) {
    n[k] = io.counts != nullptr ? io.counts[k] : caps[k];
    if (n[k] > caps[k]) within = false;
  }
  if (!within) {
    for (std::uint32_t k = 0; k < 4; ++k) n[k] = 0;
  }
  return within;
}
// Device placement's arrays (all null in a step without it).
struct PlaceArgs {
  PlacementArrays io;                        // the engine's, for one Place and its CompletePlace
  std::uint32_t* slots = nullptr;            // [max seats] device slot of seat i < n_free + n_victims
  std::uint32_t* hosts = nullptr;            // [max seats] host slots: victims' first, then new on host
  std::uint32_t* addrs = nullptr;            // [max seats] eviction k's new address
  std::uint32_t* take_counts = nullptr;      // [largest bitmap's summary words] scratch
  std::uint32_t* take_offsets = nullptr;
  // [new_on_host_words] bit a: address a is new on host this round (no step of the round
  // moves it); replaces DeviceStepArgs::new_on_host's sorted list in this mode.
  std::uint64_t* new_on_host_bits = nullptr;
  std::uint32_t new_on_host_words = 0;
  std::uint32_t max_seats = 0;
  PlaceControl* ctl = nullptr;               // [1]
};
struct DeviceStepArgs {
  StepArrays io;                               // the engine's arrays (device pointers; stats pinned host)
  // The state of one (rank, group), device memory.
  // DP: the group's location table, by address. TP (num_ranks = P > 1): the rank's home
  // table, address a (homed on rank a mod P) at records[a / P]; first[] indexed alike.
  std::uint64_t* records = nullptr;            // [table_size] locations (the stamp bits unused)
  const std::uint32_t* owner = nullptr;        // [owner_size] owner tags, by address (0: not live)
  std::uint32_t table_size = 0;
  std::uint32_t owner_size = 0;                // DP: table_size
  std::uint32_t num_ranks = 1;                 // 1: DP; P: TP attention at home
  const std::uint32_t* request_tags = nullptr; // [num_requests] tag of request id r, 0 = none
  const std::uint32_t* adopted_starts = nullptr;  // [num_requests + 1] into adopted
  const std::uint32_t* adopted = nullptr;      // [..] each request's adopted addresses, sorted
  std::uint32_t num_requests = 0;
  FlatBitmap device_free;                      // the device pool's free slots
  FlatBitmap host_free;                        // the host pool's free slots
  PbLruArrays pb;                              // the device pool's PB-LRU
  std::uint32_t* device_owner = nullptr;       // [device capacity] address held by each slot
  // [host capacity] sorted: the addresses this round's Allocate placed on host (the device held
  // only this round's entries), ctl->num_new_on_host of them; no step of the round moves them.
  const std::uint32_t* new_on_host = nullptr;
  std::uint32_t rank = 0, group = 0, row_bytes = 0, num_layers = 1;
  std::uint64_t entry_bytes = 0;               // row_bytes * num_layers
  DeviceErrorCodes codes;
  // Scratch, device memory, sized for the largest shape.
  std::uint32_t* first = nullptr;              // [table_size] kNoSelection between steps
  std::uint8_t* kind = nullptr;                // [max selections]
  StepTally* tally = nullptr;                  // [max selections] the exclusive scan of the tallies
  // [max selections] per selection, from Check's scatter: a hit's slot, a miss's rank among the
  // distinct misses (its descriptor); what Claim's indices need without reading first[].
  std::uint32_t* pick = nullptr;
  // [ceil(device capacity / 64)] this step's hits' slots, marked by Check's scatter, cleared
  // by Claim's last pass (0 between steps).
  std::uint64_t* hit_mark = nullptr;
  std::uint32_t* missed = nullptr;             // [max selections] distinct misses' addresses
  std::uint32_t* targets = nullptr;            // [max descriptors] device slot of each miss
  // [device_free.num_summary + (R + 1) * pb.num_summary] Claim's take: the exclusive scan of
  // the free bitmap's blocks' popcounts, then the victim buckets' (ClaimVictims' order).
  std::uint32_t* take_offsets = nullptr;
  DeviceStepControl* ctl = nullptr;            // [1]
  ScratchArena* arena = nullptr;               // host object
  LaunchCounts* counts = nullptr;              // [kNumPhases] host objects; nullptr: not counted
  PlaceArgs place;                             // device placement (ula/device_step.h, Place)
};

}  // namespace ula::kernels

// The device step's entry points, declared once per form (the same signatures; `Exec` is the
// form's execution context: the OpenMP form takes a thread count, the CUDA form an opaque
// stream). Each returns kKernelOk or the error of the first call that failed; an error other
// than kKernelArenaOverflow may come after some launches were enqueued, so the step's device
// state is then unknown (DeviceStep refuses every later call).
#define ULA_KERNELS_DECLARE(NS, EXEC)                                                                     \
  namespace ula::kernels::NS {                                                                            \
  /* DevicePlan classifies, claims, writes descriptors, indices and the StepRecord; */                  \
  /* DeviceComplete publishes descriptor i where status[i] == 0 ([io.max_descriptors] device */         \
  /* bytes, written by the engine's copies earlier on the stream). */                                    \
  [[nodiscard]] KernelError DevicePlan(EXEC exec, const DeviceStepArgs& args);                           \
  /* DevicePlan in two halves (TP): DeviceCheck classifies and decides (ctl->error: the */              \
  /* verdict), changing no state; DeviceClaim, after the engine agreed the verdicts */                  \
  /* (agreed: device memory, MAX over the ranks; nullptr: this rank's own), claims and writes. */       \
  [[nodiscard]] KernelError DeviceCheck(EXEC exec, const DeviceStepArgs& args);                          \
  [[nodiscard]] KernelError DeviceClaim(EXEC exec, const DeviceStepArgs& args, const std::uint32_t* agreed); \
  [[nodiscard]] KernelError DeviceComplete(EXEC exec, const DeviceStepArgs& args, const std::uint8_t* status); \
  /* The end of a scheduler iteration: the round's new entries on host may move again */                 \
  /* (ctl->num_new_on_host = 0), PB-LRU's next round (rebase: REQUIRES the round is 2^32 - 1, */          \
  /* PbRebase first). */                                                                                 \
  [[nodiscard]] KernelError DeviceAdvanceRound(EXEC exec, const DeviceStepArgs& args, bool rebase);      \
  /* Device placement: DevicePlace applies args.place.io (tags, releases, seats; the */                  \
  /* evictions' descriptors); DevicePlaceComplete publishes eviction k where status[k] == 0. */          \
  [[nodiscard]] KernelError DevicePlace(EXEC exec, const DeviceStepArgs& args);                          \
  [[nodiscard]] KernelError DevicePlaceComplete(EXEC exec, const DeviceStepArgs& args, const std::uint8_t* status); \
  /* The form's memory (device memory for CUDA, host memory for OpenMP) and copies. MemAlloc */          \
  /* writes *out (zeroed memory for OpenMP only) or nullptr with kKernelOutOfMemory. */                  \
  [[nodiscard]] KernelError MemAlloc(std::size_t bytes, void** out);                                     \
  [[nodiscard]] KernelError MemFree(void* p);                                                            \
  [[nodiscard]] KernelError MemCopy(EXEC exec, void* dst, const void* src, std::size_t bytes); /* async */ \
  [[nodiscard]] KernelError Sync(EXEC exec);                                                             \
  }

ULA_KERNELS_DECLARE(omp, int)
// The CUDA form (step_kernels.cu, target ula_kernels_cuda; linked where ULA_WITH_CUDA is on):
// the context is a cudaStream_t passed as void*.
ULA_KERNELS_DECLARE(gpu, void*)

namespace ula::kernels::gpu {
// kKernelOk when a CUDA device can run the kernels; kKernelNoDevice when there is none (or
// no driver); kKernelOldDriver when the driver is older than the runtime; another CUDA error
// otherwise.
[[nodiscard]] KernelError CheckDevice();
// Bytes of arena the CUDA form's cooperative scans need at most (their per-block partials
// for the most blocks the current device holds resident, whatever the step's shape: what
// every launch checks before it is enqueued; Create sizes the arena with it); 0 with *error
// set when CUDA cannot say.
std::size_t ScanScratchBytes(const DeviceStepArgs& args, std::uint32_t n, KernelError* error);
// CUDA's name and message for a positive code, KernelErrorName for the others.
const char* ErrorText(KernelError e);

// What a program that drives and times the step needs besides it (step/device_io.h): a
// stream and events, as opaque handles (cudaStream_t, cudaEvent_t). Create writes the handle
// (nullptr on an error); Destroy is teardown (its error has no caller to go to but is
// returned).
[[nodiscard]] KernelError StreamCreate(void** stream);
[[nodiscard]] KernelError StreamDestroy(void* stream);
[[nodiscard]] KernelError EventCreate(void** event);
[[nodiscard]] KernelError EventDestroy(void* event);
[[nodiscard]] KernelError EventRecord(void* event, void* stream);
// Waits for `end` (a host synchronisation) and writes the milliseconds from `start` to it.
[[nodiscard]] KernelError EventElapsedMs(void* start, void* end, float* ms);

// Graphs (graph_replay.cu): what an engine adds around the step inside one CUDA graph, and
// the capture and replay of it. ReferenceCopy enqueues the engine's copies of one step or one
// Place: descriptor i in [0, *count) — the count the step's Claim wrote to the StepRecord
// (num_descriptors) or Place to *num_evictions earlier on the stream, read by the kernel, so
// the launch is the same for every step and a captured graph copies what each replay's plan
// wrote — moves num_layers rows between `pools` (CopyOp's semantics, as an engine's copy
// kernel) and sets status[i] = 0. One launch of max_descriptors blocks (none for 0). The
// pointers are device-visible memory.
[[nodiscard]] KernelError ReferenceCopy(void* stream, const CopyDescriptor* descriptors, const std::uint32_t* count,
                                        std::uint32_t max_descriptors, const CopyPools& pools, std::uint8_t* status);
// Stream capture (thread-local mode) into one instantiated graph; GraphCaptureEnd ends the
// capture whatever happened inside it (a capture left open would refuse the stream's next
// work) and writes the executable graph (nullptr on an error). GraphLaunch enqueues one replay.
[[nodiscard]] KernelError GraphCaptureBegin(void* stream);
[[nodiscard]] KernelError GraphCaptureEnd(void* stream, void** graph_exec);
[[nodiscard]] KernelError GraphLaunch(void* graph_exec, void* stream);
[[nodiscard]] KernelError GraphDestroy(void* graph_exec);

// The memory-bound reference the device step is compared with (random_read.cu): `reads`
// independent 8-byte reads at pseudo-random indices of table[num_entries] (a splitmix64 of
// (seed, i), computed in the kernel: no index array is read), enqueued on `stream` as one
// launch of a grid-stride loop. Each thread folds what it read into one word and stores it to
// sink[thread] only when it equals a value no table entry sums to in practice, so the reads
// cannot be dropped and the stores are nearly none. sink: [threads()] device words.
// REQUIRES: num_entries > 0.
[[nodiscard]] KernelError RandomRead(void* stream, const std::uint64_t* table, std::uint64_t num_entries,
                                     std::uint64_t reads, std::uint64_t seed, std::uint64_t* sink);
// The threads of RandomRead's grid: the size of its sink.
std::uint32_t RandomReadThreads();
}  // namespace ula::kernels::gpu

// The host-side kernels (KernelPbLru, policy/kernel_pb_lru.h, and TakeLowest): the OpenMP
// form only; they read counts back on the host, which a step on the GPU must not.
namespace ula::kernels::omp {
// out[k] = the k-th set bit (k < need) of the sources in order, as a slot of its bitmap.
// counts/offsets: [num_sources * num_words] scratch ([num_sources * num_summary] with
// summaries). Returns the number taken (<= need).
std::uint32_t TakeLowest(int exec, const BitmapSources& sources, std::uint32_t need, std::uint32_t* counts,
                         std::uint32_t* offsets, std::uint32_t* out);
// Flat PB-LRU (PbLruArrays above). Slots: slots[i] for i < (n_dev ? *n_dev : n).
// PbTouch: tracked slots into the current bucket, stamped with the round (duplicates fine).
void PbTouch(int exec, const PbLruArrays& pb, const std::uint32_t* slots, std::uint32_t n, const std::uint32_t* n_dev);
// PbInsert: untracked, distinct slots into the current bucket. PbRemove: one tracked slot out.
void PbInsert(int exec, const PbLruArrays& pb, const std::uint32_t* slots, std::uint32_t n, const std::uint32_t* n_dev);
void PbRemove(int exec, const PbLruArrays& pb, std::uint32_t slot);
// PbRebase: REQUIRES the round is 2^32 - 1 (the host counts rounds); run right before PbAdvance.
void PbRebase(int exec, const PbLruArrays& pb);
// PbAdvance: the next round; the bucket about to be reused is folded into cold.
void PbAdvance(int exec, const PbLruArrays& pb);
// PbTakeVictims: out[k] for k < need (need_dev ? *need_dev : need) = the k-th victim in
// ClaimVictims' order (cold, then ages R..1, lowest slot first; never the current bucket),
// by a scan over the buckets' summary levels. Claims nothing (PbTouch them to claim).
// counts/offsets: [(R + 1) * num_summary] scratch.
void PbTakeVictims(int exec, const PbLruArrays& pb, std::uint32_t need, const std::uint32_t* need_dev,
                   std::uint32_t* counts, std::uint32_t* offsets, std::uint32_t* out);
}  // namespace ula::kernels::omp
