// DescriptorColumns::Rows (ula/descriptor_sink.h): the columns' common length, checked before a
// plan changes anything.
#include "ula/descriptor_sink.h"

#include <fmt/format.h>

namespace ula {

Result<std::size_t> DescriptorColumns::Rows() const {
  struct Named {
    const char* name;
    bool asked;
    std::size_t size;
  };
  const Named named[] = {
      {"src_offset", src_offset.asked(), src_offset.size()}, {"dst_offset", dst_offset.asked(), dst_offset.size()},
      {"src_slot", src_slot.asked(), src_slot.size()},       {"dst_slot", dst_slot.asked(), dst_slot.size()},
      {"bytes", bytes.asked(), bytes.size()},                {"addr", addr.asked(), addr.size()},
      {"src_rank", src_rank.asked(), src_rank.size()},       {"dst_rank", dst_rank.asked(), dst_rank.size()},
      {"group", group.asked(), group.size()},                {"src_tier", src_tier.asked(), src_tier.size()},
      {"dst_tier", dst_tier.asked(), dst_tier.size()},       {"op", op.asked(), op.size()},
      {"num_layers", num_layers.asked(), num_layers.size()}, {"evict_slot", evict_slot.asked(), evict_slot.size()}};
  for (const DescriptorColumn* c : {&src_offset, &dst_offset}) {
    if (c->asked() && !c->wide()) {
      return MakeError(ErrorCode::kInvalidArgument,
                       fmt::format("descriptor column {}: must be int64 (byte offsets pass 2^31 in large pools)",
                                   c == &src_offset ? "src_offset" : "dst_offset"));
    }
  }
  const Named* first = nullptr;
  for (const Named& c : named) {
    if (!c.asked) continue;
    if (first == nullptr) {
      first = &c;
    } else if (c.size != first->size) {
      return MakeError(ErrorCode::kInvalidArgument,
                       fmt::format("descriptor columns differ in length: {} has {} rows, {} has {}", first->name,
                                   first->size, c.name, c.size));
    }
  }
  if (first == nullptr) {
    return MakeError(ErrorCode::kInvalidArgument, "descriptor columns: none asked for (give at least one column)");
  }
  return first->size;
}

}  // namespace ula
