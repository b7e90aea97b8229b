// CopyPublish: the one copy -> wait -> publish step of every planner that brings entries
// from host onto device: StepPlanner::Step (the library path)
// and TpStepPlanner's home phase. It owns the copies and the waits; the caller owns the
// publish (its table), which PublishArrived drives so that the rules below hold in one place.
//
// The moves of one step are numbered i = 0 .. size()-1 and come in two batches, in order:
//   copies  i <  num_copies(): host -> device into free device slots (nothing published
//           points at the destination);
//   swaps   i >= num_copies(): host <-> device with a victim (the victim's bytes go where
//           the wanted entry was on host).
//
// Contract:
//   - Run submits the copy batch, then the swap batch (an empty batch is not submitted),
//     then waits on each submitted batch's own fence: Backend::Wait reports only that
//     batch's failure, so a wait on the other batch's fence proves nothing about it. A batch
//     that Submit refused is failed and not waited on.
//   - arrived(i) says whether move i's batch completed: every move of it landed.
//   - The caller publishes only what arrived. PublishArrived calls publish(i, swap) for each
//     move that arrived and reclaim(i) for each copy that did not (its destination is
//     undefined: the free slot goes back to its pool). Nothing of a failed batch is published.
//   - The victims of a failed swap keep their bytes (a swap batch is applied whole or not at
//     all, ula/backend.h), their device slots and their table entries: PublishArrived calls
//     nothing for them.
//   - Failure() names each failed batch, its size and the backend's message (kIo).
// Not thread-safe; one object per step (or per rank of a step).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "ula/backend.h"
#include "ula/check.h"
#include "ula/error.h"

namespace ula {

class CopyPublish {
 public:
  // The moves go between the host arena and the device arena; the step has num_copies
  // copies and num_swaps swaps of entries (reserved here), each entry rows_per_entry rows of
  // row_bytes (one per layer of a group in the per-layer pools, address_space.h "Pools").
  CopyPublish(ArenaId host, ArenaId device, std::uint32_t row_bytes, std::size_t num_copies, std::size_t num_swaps,
              std::uint32_t rows_per_entry = 1);

  // Entry i = the number added so far, one row. REQUIRES: before Run; at most size()
  // entries; rows_per_entry == 1.
  void Add(SlotMove move) {
    ULA_DCHECK(rows_per_entry_ == 1);
    AddEntry([&](std::vector<SlotMove>& rows) { rows.push_back(move); });
  }
  // Entry i = the number added so far: append_rows(moves) appends its rows_per_entry rows.
  // REQUIRES: before Run; at most size() entries.
  template <class AppendRows>
  void AddEntry(AppendRows&& append_rows) {
    ULA_DCHECK(added_ < size());
    std::vector<SlotMove>& moves = batches_[added_ < count_[0] ? 0 : 1].moves;
    [[maybe_unused]] const std::size_t before = moves.size();
    append_rows(moves);
    ULA_DCHECK(moves.size() == before + rows_per_entry_);
    ++added_;
  }

  std::size_t num_copies() const { return count_[0]; }
  std::size_t num_swaps() const { return count_[1]; }
  std::size_t size() const { return count_[0] + count_[1]; }
  bool is_swap(std::size_t i) const { return i >= count_[0]; }
  // Bytes through the copy engine: one transfer per copy, two per swap, of every row.
  std::uint64_t bytes_moved() const {
    return (count_[0] + 2 * count_[1]) * std::uint64_t{row_bytes_} * rows_per_entry_;
  }

  // Submits both batches and waits on each one's own fence (the contract above).
  // REQUIRES: every move added; called once.
  void Run(Backend& backend);

  // Whether move i's batch completed. REQUIRES: after Run; i < size().
  bool arrived(std::size_t i) const { return !failed_[is_swap(i) ? 1 : 0]; }
  bool copies_arrived() const { return !failed_[0]; }
  bool swaps_arrived() const { return !failed_[1]; }
  bool all_arrived() const { return !failed_[0] && !failed_[1]; }

  // kIo "<context>: host->device copy of N entries failed (why); host<->device swap of M
  // entries failed (why)", naming only the failed batches. REQUIRES: !all_arrived().
  Error Failure(std::string_view context) const;

 private:
  CopyBatch batches_[2];     // [copies, swaps]; moved into the backend by Run
  std::size_t count_[2];     // [copies, swaps] moves of the step
  std::size_t added_ = 0;
  std::uint32_t row_bytes_;
  std::uint32_t rows_per_entry_;
  bool failed_[2] = {false, false};
  std::string why_[2];       // the backend's message of a failed batch
};

// Publishes the moves [0, n) of a step whose per-move outcome the caller knows: for each
// i, publish(i, is_swap(i)) when arrived(i), else reclaim(i) when i is a copy, and nothing
// for a failed swap (its victim stays as it was). Returns the number published.
template <class Arrived, class IsSwap, class Publish, class Reclaim>
std::size_t PublishArrived(std::size_t n, Arrived&& arrived, IsSwap&& is_swap, Publish&& publish, Reclaim&& reclaim) {
  std::size_t published = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const bool swap = is_swap(i);
    if (!arrived(i)) {
      if (!swap) reclaim(i);
      continue;
    }
    publish(i, swap);
    ++published;
  }
  return published;
}

// The same over the outcome of cp.Run.
template <class Publish, class Reclaim>
std::size_t PublishArrived(const CopyPublish& cp, Publish&& publish, Reclaim&& reclaim) {
  return PublishArrived(
      cp.size(), [&cp](std::size_t i) { return cp.arrived(i); }, [&cp](std::size_t i) { return cp.is_swap(i); },
      publish, reclaim);
}

}  // namespace ula
