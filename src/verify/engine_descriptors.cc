// The verifier's engine (verify/engine_descriptors.h): the one check of a step's descriptors
// and their run on the space's pools.
#include "verify/engine_descriptors.h"

#include <fmt/format.h>

#include <vector>

#include "backend/copy_publish.h"
#include "space/address_space_state.h"
#include "space/space_access.h"
#include "ula/backend.h"
#include "ula/check.h"

namespace ula::verify_internal {

std::optional<std::string> MisdescribedRows(AddressSpace& space, Rank rank, GroupId group,
                                            std::span<const CopyDescriptor> descriptors, std::string_view form) {
  const GroupPools& gp = StateOf(space).at(rank, group);
  const std::uint64_t row = space.config().row();
  for (std::size_t i = 0; i < descriptors.size(); ++i) {
    const CopyDescriptor& d = descriptors[i];
    if (d.num_layers == gp.num_layers && d.bytes == row && d.src_offset == d.src_slot * row &&
        d.dst_offset == d.dst_slot * row) {
      continue;
    }
    return fmt::format("{} step of rank {} group {}: descriptor {} moves {} rows of {} bytes at offsets {} and {} "
                       "(slots {} and {}), the entry is {} rows of {} at slot x {}",
                       form, rank.value(), group.value(), i, d.num_layers, d.bytes, d.src_offset, d.dst_offset,
                       d.src_slot, d.dst_slot, gp.num_layers, row, row);
  }
  return std::nullopt;
}

Status RunDescriptors(AddressSpace& space, Rank rank, GroupId group, std::span<const CopyDescriptor> descriptors,
                      std::span<std::uint8_t> status) {
  ULA_CHECK(status.size() == descriptors.size());
  const GroupPools& gp = StateOf(space).at(rank, group);
  const std::uint32_t row = space.config().row();
  Backend& backend = space.backend();
  const std::size_t n = descriptors.size();
  auto is = [&](std::size_t i, CopyOp op) { return descriptors[i].op == static_cast<std::uint8_t>(op); };
  std::size_t n_evict = 0, n_swap = 0;
  for (std::size_t i = 0; i < n; ++i) {
    n_evict += is(i, CopyOp::kEvict);
    n_swap += is(i, CopyOp::kSwap);
  }
  Status evicted = Ok();
  if (n_evict > 0) {
    CopyBatch evict{gp.device.arena().id, gp.host.arena().id, row, /*swap=*/false, {}};
    for (std::size_t i = 0; i < n; ++i) {
      if (is(i, CopyOp::kEvict)) {
        gp.AppendMoves(Tier::kDevice, SlotId(descriptors[i].dst_slot), SlotId(descriptors[i].evict_slot), evict.moves);
      }
    }
    auto fence = backend.Submit(std::move(evict));
    evicted = fence ? backend.Wait(*fence) : Status(std::unexpected(fence.error()));
  }
  auto skipped = [&](std::size_t i) { return !evicted && is(i, CopyOp::kEvict); };
  CopyPublish cp(gp.host.arena().id, gp.device.arena().id, row, n - n_swap - (evicted ? 0 : n_evict), n_swap,
                 gp.num_layers);
  std::vector<std::size_t> entry(n, 0);  // [n] descriptor i's entry in cp
  std::size_t added = 0;
  for (std::size_t i = 0; i < n; ++i) {
    if (skipped(i)) continue;
    entry[i] = added++;
    cp.AddEntry([&](std::vector<SlotMove>& rows) {
      gp.AppendMoves(Tier::kHost, SlotId(descriptors[i].src_slot), SlotId(descriptors[i].dst_slot), rows);
    });
  }
  cp.Run(backend);
  std::size_t failed = 0;
  for (std::size_t i = 0; i < n; ++i) {
    status[i] = skipped(i) ? kDescriptorFailed
                : cp.arrived(entry[i]) ? kDescriptorDone
                : is(i, CopyOp::kEvict) ? kEvictLanded
                                         : kDescriptorFailed;
    failed += status[i] != kDescriptorDone;
  }
  if (cp.all_arrived() && evicted) return Ok();
  const std::string head = fmt::format("rank {} group {}: {} of {} copies not published", rank.value(), group.value(),
                                       failed, n);
  const std::string evict_error =
      evicted ? std::string()
              : fmt::format("device->host copy of {} victims failed ({})", n_evict, evicted.error().message());
  if (cp.all_arrived()) return MakeError(ErrorCode::kIo, fmt::format("{}: {}", head, evict_error));
  Error e = cp.Failure(head);
  if (evicted) return std::unexpected(std::move(e));
  return MakeError(ErrorCode::kIo, fmt::format("{}; {}", e.message(), evict_error));
}

}  // namespace ula::verify_internal
