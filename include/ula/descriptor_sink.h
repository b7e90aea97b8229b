// DescriptorSink: where a plan writes its copy descriptors (ula/step_arrays.h's CopyDescriptor)
// as it emits each one: the engine's array of 48-byte records, or its columns, one array per
// field (a structure of arrays: what a torch or CUDA copy kernel indexes, e.g. vLLM's loop in
// docs/INTEGRATION.md). The planners write through it (StepPlanner::Plan, TpStepPlanner::Plan:
// docs/ARCHITECTURE.md, "One decode step of one layer group", step 4), so both forms are the
// same descriptors, written once, with no copy of the records afterwards (docs/ARCHITECTURE.md,
// "Invariants", 6: one meaning per name).
//
// Columns: each field is a column, or none (not asked for: never written). The byte offsets
// are int64 (a pool's offset passes 2^31 at 3.3 M rows of 656 bytes); every other field int32
// or int64. Descriptor j is row j of every column asked for.
#pragma once

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <span>

#include "ula/error.h"
#include "ula/step_arrays.h"

namespace ula {

// One output column of one field: int32 or int64 elements, or none.
class DescriptorColumn {
 public:
  DescriptorColumn() = default;
  DescriptorColumn(std::span<std::int32_t> rows) : i32_(rows.data()), size_(rows.size()), asked_(true) {}
  DescriptorColumn(std::span<std::int64_t> rows) : i64_(rows.data()), size_(rows.size()), asked_(true) {}
  bool asked() const { return asked_; }
  bool wide() const { return i64_ != nullptr; }
  std::size_t size() const { return size_; }
  // REQUIRES: j < size() when asked(); a column not asked for ignores it.
  void Put(std::size_t j, std::int64_t v) const {
    if (i64_ != nullptr) {
      i64_[j] = v;
    } else if (i32_ != nullptr) {
      i32_[j] = static_cast<std::int32_t>(v);
    }
  }

 private:
  std::int32_t* i32_ = nullptr;  // [size_] when asked for as int32
  std::int64_t* i64_ = nullptr;  // [size_] when asked for as int64
  std::size_t size_ = 0;
  bool asked_ = false;
};

// The descriptors as columns, one per CopyDescriptor field (reserved0 aside).
struct DescriptorColumns {
  DescriptorColumn src_offset, dst_offset,  // int64 only
      src_slot, dst_slot, bytes, addr, src_rank, dst_rank, group, src_tier, dst_tier, op, num_layers,
      evict_slot;
  // Row j of every column asked for gets d's field. REQUIRES: j < Rows().
  void Write(std::size_t j, const CopyDescriptor& d) const {
    src_offset.Put(j, static_cast<std::int64_t>(d.src_offset));
    dst_offset.Put(j, static_cast<std::int64_t>(d.dst_offset));
    src_slot.Put(j, d.src_slot);
    dst_slot.Put(j, d.dst_slot);
    bytes.Put(j, d.bytes);
    addr.Put(j, d.addr);
    src_rank.Put(j, d.src_rank);
    dst_rank.Put(j, d.dst_rank);
    group.Put(j, d.group);
    src_tier.Put(j, d.src_tier);
    dst_tier.Put(j, d.dst_tier);
    op.Put(j, d.op);
    num_layers.Put(j, d.num_layers);
    evict_slot.Put(j, d.evict_slot);
  }
  // The rows every column asked for has. kInvalidArgument when none is asked for, an offset
  // column is int32, or two differ in length (naming both).
  Result<std::size_t> Rows() const;
};

// Records or columns. Converts implicitly from anything that is a span of CopyDescriptor (a
// std::vector, an array) and from DescriptorColumns (held by reference: it must outlive the
// sink), so a plan's callers hand either.
class DescriptorSink {
 public:
  template <class R>
    requires std::convertible_to<R&&, std::span<CopyDescriptor>>
  DescriptorSink(R&& records) : records_(std::span<CopyDescriptor>(records)) {}  // NOLINT: implicit
  DescriptorSink(const DescriptorColumns& columns) : columns_(&columns) {}      // NOLINT: implicit

  // How many descriptors it takes: the records' length, or the columns' common length.
  // kInvalidArgument for columns as DescriptorColumns::Rows refuses them.
  Result<std::size_t> Rows() const {
    if (columns_ == nullptr) return records_.size();
    return columns_->Rows();
  }
  // Descriptor j. REQUIRES: j < *Rows().
  void Put(std::size_t j, const CopyDescriptor& d) const {
    if (columns_ != nullptr) {
      columns_->Write(j, d);
    } else {
      records_[j] = d;
    }
  }

 private:
  std::span<CopyDescriptor> records_;
  const DescriptorColumns* columns_ = nullptr;
};

}  // namespace ula
