// The arrays of one layer group's step, as an engine hands them over and as the step's
// kernels (host or device) read and write them. This header is the contract shared by the
// engine step API (step_planner.h: numpy, torch and DLPack tensors from Python, spans from
// C++) and the device step (the planner as data-parallel kernels on the engine's stream):
// both take a StepArrays and fill the same outputs, bit for bit.
//
// Coordinates (the layout FlashMLA's sparse kernels read, and SGLang and vLLM allocate):
//   - A device pool of (rank, group) is one region per layer of the group, each
//     [num_slots][row_bytes] with num_slots a multiple of page_tokens (64): slot s of layer
//     l sits at base(l) + s * row_bytes, so each layer's region is FlashMLA's
//     k_cache[num_slots / 64][64][1][row_bytes] with stride(1) == row_bytes (656 for GLM-5's
//     FP8 entry) and a FlashMLA index is the slot itself (block * 64 + offset).
//   - Host pools have the same per-layer shape. A CopyDescriptor names slots; its offsets
//     are slot * row_bytes in every layer of the group, and the engine copies num_layers
//     rows of row_bytes per descriptor (layer l: region(l) + offset).
//
// Inputs (engine-owned, read-only during the step):
//   selections  int32 [num_rows][row_stride] logical addresses, -1 padding; the first top_k
//               of each row are read. num_rows = batch * q_len ([batch][q_len][top_k], the
//               FlashMLA shape) or the token rows of SGLang's flat page_table_1
//               ([tokens][top_k]), whose batch row is row_batch[r].
//   row_batch   int32 [num_rows] or null: the batch row of each selection row; null means
//               r / q_len.
//   requests    int64 [batch]: the request of each batch row (torch's req_pool_indices
//               dtype); a row of padding only is not looked up. Every non-padding address
//               of row r must be live for requests[row_batch(r)] (selection_run.h).
// Outputs (engine-owned, written by the step; sized once, so that shapes never change):
//   indices     int32 [num_rows][index_stride]: the device slot of each selection, -1
//               where the selection was -1. At home (TP) -1 also marks a selection homed
//               on another rank: FlashMLA then skips it, and the rank's partial covers its
//               own shard only.
//   descriptors CopyDescriptor [max_descriptors]: the copies that make this step's
//               selections device-resident, in a fixed order (below).
//   stats       StepRecord: counts of the step, written last (a device step writes it
//               asynchronously to pinned host memory; `done` turns non-zero when written).
//
// Determinism: for the same state and inputs, every implementation (the CPU reference
// planner, the device step's OpenMP and CUDA forms) writes the same indices, the same
// descriptors in the same order (first occurrence of each missed address in row-major
// selection order) and the same published tables, whatever the thread count or schedule.
#pragma once

#include <cstdint>

#include "ula/host_device.h"
#include "ula/tier.h"

namespace ula {

inline constexpr std::int32_t kPadIndex = -1;

// kEvict (DP engine step with host shadows, ula/step_planner.h): first copy the destination
// (device) row to the victim's host slot evict_slot, then the source (host) row to the
// destination, in that order.
enum class CopyOp : std::uint8_t { kCopy = 0, kSwap = 1, kEvict = 2 };

// An engine's status per descriptor, for Complete: 0 done; any other value failed, nothing
// of it published. kEvictLanded (kEvict only): the victim's row reached its host slot but
// the fill of the device row did not (the victim is published on host, its device slot freed).
inline constexpr std::uint8_t kDescriptorDone = 0;
inline constexpr std::uint8_t kDescriptorFailed = 1;
inline constexpr std::uint8_t kEvictLanded = 2;

// One entry move, a plain 48-byte record (mirrored by the Python package's numpy dtype).
// Offsets are per layer: slot * row_bytes in each of the group's num_layers regions.
struct CopyDescriptor {
  std::uint64_t src_offset = 0;  // src_slot * row_bytes, in every layer's region
  std::uint64_t dst_offset = 0;  // dst_slot * row_bytes
  std::uint32_t src_slot = 0;
  std::uint32_t dst_slot = 0;
  std::uint32_t bytes = 0;       // row_bytes: one layer's row
  std::uint32_t addr = 0;        // the logical address brought to device
  std::uint16_t src_rank = 0;
  std::uint16_t dst_rank = 0;
  std::uint16_t group = 0;
  std::uint8_t src_tier = 0;     // Tier's value (ula/tier.h): 0 device, 1 host
  std::uint8_t dst_tier = 0;
  std::uint8_t op = 0;           // CopyOp
  std::uint8_t reserved0 = 0;
  std::uint16_t num_layers = 1;  // rows to move: one per layer of the group
  std::uint32_t evict_slot = 0;  // kEvict: the victim's new host slot (offset evict_slot * row_bytes)
};
static_assert(sizeof(CopyDescriptor) == 48);

// One end of a move: a slot of the pool of (tier, rank) of the descriptor's group.
struct CopyEnd {
  Tier tier = Tier::kHost;
  std::uint16_t rank = 0;
  std::uint32_t slot = 0;
};

// The one way a descriptor is made (every planner, the kernels, the space's own moves): the
// offsets follow from the slots, slot * row_bytes in each of the num_layers regions, so no
// descriptor can name a slot and an offset that disagree. row_bytes is one layer's row (DP:
// AddressSpaceConfig::row(); TP: the whole entry, num_layers 1).
ULA_HD constexpr CopyDescriptor MakeCopyDescriptor(CopyOp op, CopyEnd src, CopyEnd dst, std::uint32_t addr,
                                                   std::uint16_t group, std::uint32_t row_bytes,
                                                   std::uint16_t num_layers) {
  CopyDescriptor d{};
  d.src_offset = std::uint64_t{src.slot} * row_bytes;
  d.dst_offset = std::uint64_t{dst.slot} * row_bytes;
  d.src_slot = src.slot;
  d.dst_slot = dst.slot;
  d.bytes = row_bytes;
  d.addr = addr;
  d.src_rank = src.rank;
  d.dst_rank = dst.rank;
  d.group = group;
  d.src_tier = static_cast<std::uint8_t>(src.tier);
  d.dst_tier = static_cast<std::uint8_t>(dst.tier);
  d.op = static_cast<std::uint8_t>(op);
  d.num_layers = num_layers;
  return d;
}

// What a step did, written once at its end (8-byte fields: a device writes it with plain
// stores to pinned memory and sets `done` last).
struct StepRecord {
  std::uint64_t selections = 0;   // non-padding selections read
  std::uint64_t distinct = 0;     // distinct addresses among them
  std::uint64_t hits = 0;         // distinct addresses already on device
  std::uint64_t misses = 0;       // distinct addresses brought in (= descriptors)
  std::uint64_t evictions = 0;    // victims moved to host (swaps)
  std::uint64_t bytes_moved = 0;  // over the host link, both directions
  std::uint32_t num_descriptors = 0;
  std::uint32_t error = 0;        // 0, or 1 + the ula::ErrorCode that refused the step (kInvalidArgument is 0)
  std::uint64_t done = 0;         // non-zero once every field above is written
};

// The step's arrays; every pointer is host memory for the CPU forms and device memory
// (stats: pinned host) for the CUDA form. Shapes in the comments, strides in elements.
struct StepArrays {
  const std::int32_t* selections = nullptr;  // [num_rows][selection_stride]
  const std::int32_t* row_batch = nullptr;   // [num_rows] or null (r / q_len)
  const std::int64_t* requests = nullptr;    // [batch]
  std::int32_t* indices = nullptr;           // [num_rows][index_stride]
  CopyDescriptor* descriptors = nullptr;     // [max_descriptors]
  StepRecord* stats = nullptr;               // [1]
  std::uint32_t num_rows = 0;
  std::uint32_t batch = 0;
  std::uint32_t q_len = 1;
  std::uint32_t top_k = 0;
  std::uint32_t selection_stride = 0;  // >= top_k
  std::uint32_t index_stride = 0;      // >= top_k
  std::uint32_t max_descriptors = 0;
};

// One DeviceStep::Place's arrays (device placement, AddressSpaceConfig::device_placement):
// one (rank, group)'s share of a PlacementJournal (ula/address_space.h) as flat arrays, and
// the outputs. Pointers are device memory for the CUDA form and host memory for the OpenMP
// form; the counts are host values, each at most its DeviceStepConfig maximum, or (with
// `counts`) read on the device when Place runs. The arrays stay as they are until
// DeviceStep::CompletePlace.
struct PlacementArrays {
  const std::uint32_t* retired = nullptr;       // [num_retired] request ids whose tags clear
  const std::uint32_t* new_requests = nullptr;  // [num_new_requests] request ids
  const std::uint32_t* new_tags = nullptr;      // [num_new_requests] their owner tags (non-zero)
  const std::uint32_t* released = nullptr;      // [num_released] distinct addresses freed
  const std::uint32_t* seated = nullptr;        // [num_seated] distinct new addresses, in Allocate order
  const std::uint32_t* seated_tags = nullptr;   // [num_seated] their requests' owner tags
  std::uint32_t num_retired = 0;
  std::uint32_t num_new_requests = 0;
  std::uint32_t num_released = 0;
  std::uint32_t num_seated = 0;
  // Out, [max_place_seats]: seat i's Location bits (ula/location_bits.h), where the engine
  // writes its KV; final after CompletePlace (an eviction's seat is on device, or on host
  // when its copy failed).
  std::uint64_t* locations = nullptr;
  // Out, [max_place_seats]: the evictions' device -> host kCopy descriptors (one entry of
  // num_layers rows each), *num_evictions of them, for the engine to run between Place and
  // CompletePlace (status[k] == 0: copy k's bytes arrived).
  CopyDescriptor* evictions = nullptr;
  std::uint32_t* num_evictions = nullptr;  // [1]
  // Optional, [4] in the step's memory: num_retired, num_new_requests, num_released and
  // num_seated, read by Place's kernel when it runs, so that the same PlacementArrays (and so
  // the same launch) serves every iteration and a captured graph replays Place with the
  // counts an engine wrote before the replay. With it the num_* fields above are the arrays'
  // capacities (each at most its DeviceStepConfig maximum) and each count must be at most
  // its capacity: a count past it refuses that place on the device (nothing changes,
  // *num_evictions = 0, *error = 1 + ErrorCode::kInvalidArgument). nullptr: the num_* fields
  // are the counts.
  const std::uint32_t* counts = nullptr;
  // Out, [1], required with `counts` (optional without): 0 when the place was applied, else
  // 1 + the ErrorCode of the device's refusal.
  std::uint32_t* error = nullptr;
};

}  // namespace ula
