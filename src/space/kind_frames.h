// KindFrames: one rank's device bytes for every kind of a space with kinds (ula/kv_kinds.h;
// docs/ARCHITECTURE.md, "Kinds"), carved from one budget in frames of one kind. No kind has
// a pool of its own: a kind takes a free frame when its frames are full, and a frame whose
// last block is given back returns to the budget, where any kind may take it next.
//
// Envelopes. A block of kind k holds rows(k) rows of every layer of the kind, page-major
// (as the unified buffer's page envelopes, unified/page_envelope.h): layer l's rows sit
// together at l * rows(k) * row_bytes. rows(k) is kKindBlockEntries (64 entries: SGLang's
// 256-token page of C4 entries, a 64-token block of the window, 64 C128 entries), or a
// per-request kind's state_rows (one block per request). The envelope, rows x layers x
// row_bytes, is padded up to the smallest multiple of kEnvelopeAlign that divides the frame
// size, and frames are aligned to the frame size. So
//   block index of kind k = byte offset / padded(k),
// the blocks of a frame f are [f * per_frame(k), (f + 1) * per_frame(k)), and layer l of
// kind k is one strided view of the budget's bytes (Layer): a [blocks][rows][row_bytes]
// tensor at base + l * rows * row_bytes with padded(k) as the block stride, which is what
// FlashMLA and the engines' kernels take. The exact common multiple of V4-Flash's envelopes
// is far larger than a useful frame, so the envelopes are padded instead: kKindFrameBytes
// keeps every V4-Flash kind's padding under 2.5 % (kind_frames_test prints the table).
//
// Compaction (Compact): frames of one kind that hold few live blocks are emptied into the
// room of the kind's other frames and return to the budget, as the unified buffer compacts
// its ends around pins (unified/end_layout.h): a pinned block never moves; each move copies
// the block's bytes into its new place first and only then publishes it (the caller's
// `moved` renames the block in its page table), so a reader sees the old block or the new.
//
// Invariants (CheckInvariants):
//   1. Every frame is free (no kind, no live block) or of one kind with 1..per_frame live
//      blocks, its live count equal to its used bits.
//   2. A kind's frames with room are exactly its frames with fewer live blocks than
//      per_frame; the free frames are exactly the frames of no kind.
//   3. The budget is the frames: num_frames = free frames + the frames of every kind.
//   4. The free withheld frames are exactly the free frames marked withheld.
// Which request owns each block is its caller's (KindEntries checks each block is owned once).
//
// Thread-safety: none; plain data under the space's driver thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <set>
#include <span>
#include <string_view>
#include <vector>

#include "core/digest.h"
#include "ula/error.h"
#include "ula/kv_kinds.h"

namespace ula {

// The frame size, chosen for V4-Flash: every kind's padded envelope divides it, none padded
// by more than 2.41 % (the smallest frame keeping them all under 3 % is 101.5 MiB, at 2.67 %).
inline constexpr std::uint64_t kKindFrameBytes = 107'233'280;  // 102.27 MiB
// Every padded envelope is a multiple of it (a block starts on a 256-byte boundary).
inline constexpr std::uint64_t kEnvelopeAlign = 256;

// One kind's block in the frames.
struct KindEnvelope {
  std::uint32_t rows = 0;       // rows per layer: kKindBlockEntries, or a per-request kind's state_rows
  std::uint64_t bytes = 0;      // rows x layers x row_bytes
  std::uint64_t padded = 0;     // bytes rounded up to divide the frame size (the block stride)
  std::uint32_t per_frame = 0;  // blocks per frame: frame size / padded
  double padding() const { return bytes == 0 ? 0.0 : 1.0 - static_cast<double>(bytes) / static_cast<double>(padded); }
};

// The envelopes of `kinds` in frames of frame_bytes. kInvalidArgument naming the field:
// "frame_bytes" (not a multiple of kEnvelopeAlign), "kinds[i]" (an envelope larger than a
// frame).
Result<std::vector<KindEnvelope>> KindEnvelopes(std::span<const KvKind> kinds, std::uint64_t frame_bytes);

struct KindFramesConfig {
  std::vector<KvKind> kinds;
  std::uint64_t budget_bytes = 0;  // the rank's device bytes for every kind; whole frames are used
  std::uint64_t frame_bytes = kKindFrameBytes;
  // Take gives a kind with no room the highest free frame, not the lowest: a space's C4 slots
  // fill its budget from the bottom (src/space/frame_share.h), the kinds from the top.
  bool take_from_top = false;
  // Names the first bad field ("KindFramesConfig.budget_bytes", "kinds[6]").
  Status Validate() const;
};

// Layer l of one kind over the budget's bytes: row r of block b at Row(b, r).
struct StridedLayer {
  std::byte* base = nullptr;      // block 0's rows of this layer; nullptr without bytes
  std::uint64_t block_stride = 0; // the kind's padded envelope
  std::uint32_t blocks = 0;       // blocks of the kind the budget could hold
  std::uint32_t rows = 0;
  std::uint32_t row_bytes = 0;
  std::byte* Row(std::uint32_t block, std::uint32_t row) const {
    return base + std::uint64_t{block} * block_stride + std::uint64_t{row} * row_bytes;
  }
};

class KindFrames {
 public:
  static constexpr std::uint32_t kFree = 0xffffffffu;  // a frame of no kind

  // `bytes`: the budget's memory, num_frames * frame_bytes bytes (nullptr: accounting only).
  static Result<KindFrames> Create(const KindFramesConfig& config, std::byte* bytes = nullptr);

  std::size_t num_kinds() const { return envelopes_.size(); }
  const KindEnvelope& envelope(std::uint32_t k) const { return envelopes_[k]; }
  std::uint64_t frame_bytes() const { return frame_bytes_; }
  std::uint32_t num_frames() const { return static_cast<std::uint32_t>(frames_.size()); }
  std::uint32_t free_frames() const { return static_cast<std::uint32_t>(free_.size()); }
  std::uint32_t frames_of(std::uint32_t k) const { return frames_of_[k]; }
  std::uint32_t blocks_in_use(std::uint32_t k) const { return in_use_[k]; }
  // Bytes the live blocks of every kind hold beyond their envelopes (the padding in use).
  std::uint64_t PaddingInUse() const;

  // A block of kind k: the lowest free block of its lowest frame with room, else the first
  // block of the lowest free frame (the highest with take_from_top); nullopt when neither
  // exists (nothing changes).
  std::optional<std::uint32_t> Take(std::uint32_t k);
  // REQUIRES: block is a live block of kind k. Its frame returns to the budget when it was
  // the frame's last.
  void Give(std::uint32_t k, std::uint32_t block);
  // Free frames that `takes[k]` more blocks of each kind need beyond the room of its frames,
  // after `gives[k]` blocks of the same kind were given back (spans of num_kinds()). A bound:
  // frames the gives would empty are not counted free.
  std::uint32_t FramesNeeded(std::span<const std::uint32_t> takes, std::span<const std::uint32_t> gives) const;
  bool IsLive(std::uint32_t k, std::uint32_t block) const;
  // Frame f holds no kind's block (REQUIRES: f < num_frames()).
  bool IsFree(std::uint32_t f) const { return frames_[f].kind == kFree; }

  // Withheld frames (a space's C4 share, src/space/frame_share.h): a frame whose bytes the
  // sparse kind does not use. The space withholds a free frame (Withhold) before a kind may
  // take it, and releases it (Release) once it is free again. Take gives a kind that has no
  // room a free withheld frame first, then a free frame (each the lowest, or the highest with
  // take_from_top); a frame keeps its
  // mark while a kind holds it and after it returns to the budget.
  bool IsWithheld(std::uint32_t f) const { return withheld_[f] != 0; }
  // REQUIRES: f is free and not withheld.
  void Withhold(std::uint32_t f);
  // REQUIRES: f is free and withheld.
  void Release(std::uint32_t f);
  // The free frames that are withheld, lowest first.
  const std::set<std::uint32_t>& FreeWithheld() const { return ready_; }
  std::uint32_t withheld_frames() const { return withheld_count_; }
  // The free frames in the order Take gives them to a kind that has no room (the withheld
  // ones aside): lowest first, or highest first with take_from_top.
  std::vector<std::uint32_t> FreeInTakeOrder() const;

  // Empties kind k's frames with the fewest live blocks into the room of its other frames,
  // sparsest first, while one with no pinned block fits in that room: each live block is
  // copied (the bytes, when held) to the lowest free block of the lowest other frame with
  // room, then moved(from, to) publishes it. Returns the frames returned to the budget.
  using PinnedFn = std::function<bool(std::uint32_t block)>;
  using MovedFn = std::function<void(std::uint32_t from, std::uint32_t to)>;
  std::uint32_t Compact(std::uint32_t k, const PinnedFn& pinned, const MovedFn& moved);

  std::uint64_t Offset(std::uint32_t k, std::uint32_t block) const { return std::uint64_t{block} * envelopes_[k].padded; }
  // REQUIRES: layer < kinds[k].layers.
  StridedLayer Layer(std::uint32_t k, std::uint32_t layer) const;

  Status CheckInvariants(std::string_view who) const;
  void AddToDigest(StateDigest& d) const;

 private:
  struct Frame {
    std::uint32_t kind = kFree;
    std::uint32_t live = 0;
    std::vector<std::uint8_t> used;  // [per_frame(kind)] 1 = live block; empty when free
    std::uint32_t below_all_used = 0;  // every block below it is live: where TakeIn's search starts
  };
  KindFrames() = default;
  // Takes the lowest free block of frame f (REQUIRES: of kind k, with room).
  std::uint32_t TakeIn(std::uint32_t k, std::uint32_t f);

  std::vector<KvKind> kinds_;
  std::vector<KindEnvelope> envelopes_;      // [num_kinds]
  std::uint64_t frame_bytes_ = 0;
  bool from_top_ = false;
  std::byte* bytes_ = nullptr;
  std::vector<Frame> frames_;                // [num_frames]
  std::set<std::uint32_t> free_;             // frames of no kind, lowest first
  std::set<std::uint32_t> ready_;            // the free frames that are withheld, lowest first
  std::vector<std::uint8_t> withheld_;       // [num_frames] 1 = withheld
  std::uint32_t withheld_count_ = 0;
  std::vector<std::set<std::uint32_t>> room_;  // [num_kinds] frames of the kind with a free block
  std::vector<std::uint32_t> frames_of_;     // [num_kinds]
  std::vector<std::uint32_t> in_use_;        // [num_kinds] live blocks
};

}  // namespace ula
