// MissFills (miss_fills.h): the plan of a step's misses, its run on the backend and its publish.
#include "step/miss_fills.h"

#include <fmt/format.h>

#include <algorithm>

#include "backend/copy_publish.h"
#include "space/tp_state.h"
#include "ula/check.h"

namespace ula {
namespace {

constexpr std::size_t Index(ShadowFill f) {
  return f == ShadowFill::kFree ? 0 : f == ShadowFill::kToShadow ? 1 : f == ShadowFill::kEvict ? 2 : 3;
}

}  // namespace

void MissFills::Reserve(std::size_t max_misses) {
  miss_fill_.resize(std::max(miss_fill_.size(), max_misses));
  fill_.resize(miss_fill_.size());
  miss_host_.resize(miss_fill_.size());
  victim_host_.resize(miss_fill_.size());
  descs_.resize(miss_fill_.size());
  move_.resize(miss_fill_.size());
}

void MissFills::Decide(GroupPools& gp, std::span<const SlotId> targets, std::size_t n_free) {
  const std::size_t n_miss = targets.size();
  Reserve(n_miss);
  num_ = n_miss;
  std::fill_n(miss_fill_.begin(), n_free, ShadowFill::kFree);
  std::fill(miss_fill_.begin() + n_free, miss_fill_.begin() + n_miss, ShadowFill::kSwap);
  if (gp.shadows.enabled()) {
    for (std::size_t i = n_free; i < n_miss; ++i) {
      const SlotId h = gp.shadows.Take(targets[i]);
      if (!h.valid()) continue;
      miss_host_[i] = h;
      miss_fill_[i] = ShadowFill::kToShadow;
    }
    for (std::size_t i = n_free; i < n_miss; ++i) {
      if (miss_fill_[i] == ShadowFill::kToShadow) continue;
      const auto h = gp.AllocateHost();  // a free host slot, else the oldest shadow
      if (!h) continue;                  // the host holds only entries: a swap
      miss_host_[i] = *h;
      miss_fill_[i] = ShadowFill::kEvict;
    }
  }
  std::fill(std::begin(counts_), std::end(counts_), 0);
  for (std::size_t i = 0; i < n_miss; ++i) ++counts_[Index(miss_fill_[i])];
}

template <class Records>
void MissFills::Describe(const Records& table, const GroupPools& gp, std::uint32_t row_bytes, Rank rank,
                         GroupId group, std::span<const LogicalAddr> missed, std::span<const SlotId> targets,
                         const DescriptorSink* out) {
  std::size_t j = 0;
  for (const bool swaps : {false, true}) {
    for (std::size_t i = 0; i < num_; ++i) {
      if ((miss_fill_[i] == ShadowFill::kSwap) != swaps) continue;
      const ShadowFill f = miss_fill_[i];
      const CopyOp op = f == ShadowFill::kSwap ? CopyOp::kSwap : f == ShadowFill::kEvict ? CopyOp::kEvict : CopyOp::kCopy;
      // One layer's row; offsets are slot * row in every layer (step_arrays.h).
      CopyDescriptor d = MakeCopyDescriptor(op, {Tier::kHost, rank.value(), table.Get(missed[i]).slot().value()},
                                            {Tier::kDevice, rank.value(), targets[i].value()}, missed[i].value(),
                                            group.value(), row_bytes, static_cast<std::uint16_t>(gp.num_layers));
      if (op == CopyOp::kEvict) d.evict_slot = miss_host_[i].value();
      fill_[j] = f;
      victim_host_[j] = miss_host_[i];
      if (out != nullptr) out->Put(j, d);
      descs_[j++] = d;
    }
  }
}

void MissFills::AddPlannedStats(std::uint64_t entry_bytes, StepStats& stats) const {
  stats.into_free += counts_[0];
  stats.evictions += num_ - counts_[0];
  stats.shadow_evictions += counts_[1];
  stats.evict_copies += counts_[2];
  stats.bytes_moved += (num_ + counts_[2] + counts_[3]) * entry_bytes;
}

Status MissFills::Run(Backend& backend, const GroupPools& gp, std::uint32_t row_bytes, Rank rank, GroupId group,
                      std::span<std::uint8_t> status) {
  ULA_CHECK(status.size() == num_);
  const auto is_evict = [&](std::size_t j) { return fill_[j] == ShadowFill::kEvict; };
  Status evicted = Ok();
  if (num_evict() > 0) {
    CopyBatch evict{gp.device.arena().id, gp.host.arena().id, row_bytes, /*swap=*/false, {}};
    for (std::size_t j = 0; j < num_; ++j) {
      if (is_evict(j)) gp.AppendMoves(Tier::kDevice, SlotId(descs_[j].dst_slot), victim_host_[j], evict.moves);
    }
    auto fence = backend.Submit(std::move(evict));
    evicted = fence ? backend.Wait(*fence) : Status(std::unexpected(fence.error()));
  }
  // A failed eviction's slot is not filled: its victim is still there.
  const std::size_t n_fill = num_ - num_swap() - (evicted ? 0 : num_evict());
  CopyPublish cp(gp.host.arena().id, gp.device.arena().id, row_bytes, n_fill, num_swap(), gp.num_layers);
  std::size_t added = 0;
  for (std::size_t j = 0; j < num_; ++j) {
    if (is_evict(j) && !evicted) {
      status[j] = kDescriptorFailed;
      continue;
    }
    move_[j] = static_cast<std::uint32_t>(added++);
    const CopyDescriptor& d = descs_[j];
    ULA_DCHECK((fill_[j] == ShadowFill::kSwap) == cp.is_swap(move_[j]));
    cp.AddEntry([&](std::vector<SlotMove>& rows) {
      gp.AppendMoves(Tier::kHost, SlotId(d.src_slot), SlotId(d.dst_slot), rows);
    });
  }
  cp.Run(backend);
  std::size_t failed = 0;
  for (std::size_t j = 0; j < num_; ++j) {
    if (!(is_evict(j) && !evicted)) {
      status[j] = cp.arrived(move_[j]) ? kDescriptorDone : is_evict(j) ? kEvictLanded : kDescriptorFailed;
    }
    failed += status[j] != kDescriptorDone;
  }
  if (cp.all_arrived() && evicted) return Ok();
  const std::string head =
      fmt::format("rank {} group {}: {} of {} copies not published", rank.value(), group.value(), failed, num_);
  const std::string evict_error =
      evicted ? std::string()
              : fmt::format("device->host copy of {} victims failed ({})", num_evict(), evicted.error().message());
  if (cp.all_arrived()) return MakeError(ErrorCode::kIo, fmt::format("{}: {}", head, evict_error));
  Error e = cp.Failure(head);
  if (evicted) return std::unexpected(std::move(e));
  return MakeError(ErrorCode::kIo, fmt::format("{}; {}", e.message(), evict_error));
}

template <class Records>
std::size_t MissFills::Publish(Records& table, GroupPools& gp, Rank rank, std::span<const std::uint8_t> status) {
  ULA_CHECK(status.size() == num_);
  const auto at = [&](Tier t, SlotId s) { return Location::Make(t, rank, s); };
  for (std::size_t j = 0; j < num_; ++j) {  // REQUIRES: no wanted entry was freed
    ULA_CHECK(table.Get(LogicalAddr(descs_[j].addr)) == at(Tier::kHost, SlotId(descs_[j].src_slot)));
  }
  // The victims first: a shadowed one goes to its shadow whatever the status; an evicted one
  // to its host slot when its row landed there, else it stays and that host slot goes back.
  const auto landed_on_host = [&](std::size_t j) { return status[j] == kDescriptorDone || status[j] == kEvictLanded; };
  for (std::size_t j = 0; j < num_; ++j) {
    const ShadowFill f = fill_[j];
    if (f != ShadowFill::kToShadow && f != ShadowFill::kEvict) continue;
    const SlotId dev_slot(descs_[j].dst_slot);
    LogicalAddr& victim = gp.device_owner[dev_slot.value()];
    ULA_CHECK(table.Get(victim) == at(Tier::kDevice, dev_slot));  // REQUIRES: not freed
    if (f == ShadowFill::kEvict && !landed_on_host(j)) {
      ULA_CHECK(gp.host.Free(victim_host_[j]).has_value());
      continue;
    }
    table.Set(victim, at(Tier::kHost, victim_host_[j]));
    victim = LogicalAddr::Invalid();
  }
  // The fills that arrived (backend/copy_publish.h).
  const std::size_t published = PublishArrived(
      num_, [&](std::size_t j) { return status[j] == kDescriptorDone; },
      [&](std::size_t j) { return fill_[j] == ShadowFill::kSwap; },
      [&](std::size_t j, bool swap) {
        const CopyDescriptor& d = descs_[j];
        const LogicalAddr wanted(d.addr);
        const SlotId host_slot(d.src_slot);
        const SlotId dev_slot(d.dst_slot);
        if (!swap) {
          if (fill_[j] == ShadowFill::kFree) gp.policy->Insert(dev_slot);  // a victim's slot stays tracked
          if (gp.shadows.enabled()) gp.shadows.Add(dev_slot, host_slot);   // the fill read it, nobody wrote it
          else ULA_CHECK(gp.host.Free(host_slot).has_value());
        } else {
          const LogicalAddr victim = gp.device_owner[dev_slot.value()];
          ULA_CHECK(table.Get(victim) == at(Tier::kDevice, dev_slot));  // REQUIRES: not freed
          table.Set(victim, at(Tier::kHost, host_slot));
        }
        table.Set(wanted, at(Tier::kDevice, dev_slot));
        gp.device_owner[dev_slot.value()] = wanted;
      },
      [&](std::size_t j) {
        const SlotId dev_slot(descs_[j].dst_slot);
        if (fill_[j] == ShadowFill::kEvict && !landed_on_host(j)) return;  // its victim stays in the slot
        if (fill_[j] != ShadowFill::kFree) gp.policy->Remove(dev_slot);
        ULA_CHECK(gp.device.Free(dev_slot).has_value());
      });
  num_ = 0;
  return published;
}

template void MissFills::Describe(const AddressRecords&, const GroupPools&, std::uint32_t, Rank, GroupId,
                                  std::span<const LogicalAddr>, std::span<const SlotId>, const DescriptorSink*);
template void MissFills::Describe(const HomeRecords&, const GroupPools&, std::uint32_t, Rank, GroupId,
                                  std::span<const LogicalAddr>, std::span<const SlotId>, const DescriptorSink*);
template std::size_t MissFills::Publish(AddressRecords&, GroupPools&, Rank, std::span<const std::uint8_t>);
template std::size_t MissFills::Publish(HomeRecords&, GroupPools&, Rank, std::span<const std::uint8_t>);

}  // namespace ula
