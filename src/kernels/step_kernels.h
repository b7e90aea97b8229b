// The step's data-parallel kernels (issue 26): the phases of one layer group's step as
// functors over an index space plus a CCCL primitive (thrust for_each / transform /
// exclusive_scan), over raw arrays only — no policy, pool or space class is seen here.
// One source, step_kernels.inl, compiles two ways:
//   - by g++ with thrust's OpenMP system (step_kernels_omp.cc, namespace ula::kernels::omp):
//     what `make test` runs on every machine;
//   - by nvcc for the GPU (step_kernels.cu, namespace ula::kernels::cuda, on the caller's
//     stream), where ULA_WITH_CUDA is on.
// Both namespaces export the same entry points (below); every pointer is host memory for
// the OpenMP form and device memory for the CUDA form.
//
// Record layout (src/core/address_records.h, ula/location.h): one 8-byte record per
// (address, group): bits [31:0] slot, [47:32] rank, [49:48] tier code (0 none, 1 device,
// 2 host), [63:50] the step's dedup stamp.
//
// Determinism: every output below is a function of the inputs only, whatever the thread
// count or schedule: the dedup's winner of the stamp CAS only initialises the address's
// first-occurrence scratch, which an atomic minimum then makes the lowest selection index;
// compaction positions are exclusive scans in selection order; the victims are the ranks of
// set bits in a fixed word order.
#pragma once

#include <cstdint>

#include "ula/step_arrays.h"

namespace ula::kernels {

inline constexpr unsigned kStampShift = 50;
inline constexpr std::uint64_t kLocationMask = (std::uint64_t{1} << kStampShift) - 1;
inline constexpr std::uint32_t kTierDeviceCode = 1, kTierHostCode = 2;
inline constexpr std::uint32_t kNoSelection = 0xffffffffu;

// Selection kinds written by Classify, one byte per selection.
enum SelectionKind : std::uint8_t {
  kKindHit = 0,      // on device: its index is written by Classify
  kKindMiss = 1,     // on host: its index is written by WriteIndices after the publish
  kKindInvalid = 2,  // fails the checks (not live, not its run's request's, another rank's)
};

// Inputs and outputs of Classify over selections [0, n).
struct ClassifyArgs {
  const std::uint32_t* selections = nullptr;   // [n] logical addresses
  std::uint32_t n = 0;
  const std::uint32_t* run_starts = nullptr;   // [num_runs + 1] first selection of each run; last = total
  std::uint32_t num_runs = 0;
  const std::uint32_t* run_tags = nullptr;     // [num_runs] the holder's owner tag
  const std::uint32_t* adopted_starts = nullptr;  // [num_runs + 1] into adopted
  const std::uint32_t* adopted = nullptr;      // [..] each run's holder's adopted addresses, sorted
  std::uint64_t* records = nullptr;            // [table_size] read; stamp bits written
  std::uint32_t table_size = 0;
  const std::uint32_t* owner = nullptr;        // [table_size] owner tags
  std::uint32_t* first = nullptr;              // [table_size] scratch: lowest selection of the address
  std::uint32_t epoch = 0;                     // fresh: no record carries it
  std::uint32_t rank = 0;
  // outputs, [n] each
  std::uint8_t* kind = nullptr;
  std::int32_t* slots = nullptr;               // device slot of hits (others untouched)
  std::uint32_t* hit_first = nullptr;          // 1 at the first selection of a distinct hit
  std::uint32_t* miss_first = nullptr;         // 1 at the first selection of a distinct miss
};

// The sources of TakeLowest: num_sources bitmaps of num_words level-0 words each, read in
// this order as one bit string (source 0's word 0 bit 0 first).
struct BitmapSources {
  static constexpr int kMax = 72;
  const std::uint64_t* words[kMax] = {};
  std::uint32_t num_sources = 0;
  std::uint32_t num_words = 0;  // per source
};

struct DescriptorArgs {
  const std::uint32_t* missed = nullptr;   // [n_miss] addresses, first-occurrence order
  const std::uint32_t* targets = nullptr;  // [n_miss] device slots (free ones first)
  const std::uint64_t* records = nullptr;  // [table] their host locations
  std::uint32_t n_miss = 0, n_free = 0;
  std::uint32_t row_bytes = 0;             // one layer's row (step_arrays.h coordinates)
  std::uint16_t num_layers = 1;            // rows per entry: the group's layers
  std::uint16_t rank = 0, group = 0;
  CopyDescriptor* out = nullptr;           // [n_miss]
};

struct PublishArgs {
  const CopyDescriptor* descriptors = nullptr;  // [n] as written by MakeDescriptors
  std::uint32_t n = 0, n_free = 0;
  bool copies_ok = true;   // the kCopy batch (descriptors [0, n_free)) completed
  bool swaps_ok = true;    // the kSwap batch (descriptors [n_free, n)) completed
  std::uint64_t* records = nullptr;        // [table]
  std::uint32_t* device_owner = nullptr;   // [device capacity] address held by each slot
};

struct IndexArgs {
  const std::uint32_t* selections = nullptr;  // [n]
  const std::uint8_t* kind = nullptr;         // [n]
  const std::uint64_t* records = nullptr;     // [table], published
  std::uint32_t n = 0;
  std::int32_t* slots = nullptr;              // [n] misses' entries written
};

}  // namespace ula::kernels

// The entry points, declared once per form (the same signatures; `Exec` is the form's
// execution context: the OpenMP form takes a thread count, the CUDA form an opaque stream).
#define ULA_KERNELS_DECLARE(NS, EXEC)                                                                     \
  namespace ula::kernels::NS {                                                                            \
  /* Dedup + classify [0, n): one thread per selection. Returns the first invalid selection, or */       \
  /* kNoSelection. */                                                                                     \
  std::uint32_t Classify(EXEC exec, const ClassifyArgs& args);                                            \
  /* flags[0, n) -> positions (exclusive scan); returns the total. values[i] goes to */                  \
  /* out[pos[i]] where flags[i] != 0. */                                                                  \
  std::uint32_t Compact(EXEC exec, const std::uint32_t* flags, std::uint32_t* pos, std::uint32_t n,       \
                        const std::uint32_t* values, std::uint32_t* out);                                 \
  /* out[k] = the k-th set bit (k < need) of the sources in order, as a slot of its bitmap. */           \
  /* counts/offsets: [num_sources * num_words] scratch. Returns the number taken (<= need). */           \
  std::uint32_t TakeLowest(EXEC exec, const BitmapSources& sources, std::uint32_t need,                   \
                           std::uint32_t* counts, std::uint32_t* offsets, std::uint32_t* out);            \
  void MakeDescriptors(EXEC exec, const DescriptorArgs& args);                                            \
  void Publish(EXEC exec, const PublishArgs& args);                                                       \
  void WriteIndices(EXEC exec, const IndexArgs& args);                                                    \
  /* The run of selection i (the kernels' search), for the host's error path. */                        \
  std::uint32_t RunOfForHost(const std::uint32_t* run_starts, std::uint32_t num_runs, std::uint32_t i);   \
  }

ULA_KERNELS_DECLARE(omp, int)
