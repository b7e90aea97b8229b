#include "space/frame_share.h"

#include <fmt/format.h>

#include <vector>

#include "space/address_space_state.h"
#include "ula/check.h"

namespace ula {

std::optional<FrameShare> FrameShareOf(const AddressSpaceConfig& config) {
  const std::size_t sparse = SparseKindIndex(config.kinds);
  auto envelopes = KindEnvelopes(config.kinds, config.kind_frame_bytes);
  if (sparse == config.kinds.size() || !envelopes) return std::nullopt;
  const KindEnvelope& c4 = (*envelopes)[sparse];
  return FrameShare{static_cast<std::uint32_t>(config.device_bytes_per_rank / config.kind_frame_bytes),
                    c4.per_frame * kKindBlockEntries, c4.padded};
}

KindBudget BudgetOf(const KindFrames& frames, const KindEntries& entries) {
  KindBudget b;
  b.frames = frames.num_frames();
  b.free_frames = frames.free_frames();
  for (std::uint32_t k = 0; k < frames.num_kinds(); ++k) b.frames_of_kind.push_back(frames.frames_of(k));
  b.c4_device_slots = entries.SparseDeviceShare();
  b.c4_entries = entries.SparseEntries();
  b.c4_on_device = entries.SparseDeviceEntries();
  return b;
}

namespace {
// One C4 entry leaving a withheld frame: its group, old device slot, new place.
struct Leaving {
  std::uint32_t group = 0;
  SlotId from;
  Location to;
};

// Whether a C4 slot of frame f holds an entry used in this round, in any group.
bool HoldsRoundUsed(const AddressSpaceConfig& config, const AddressSpace::State& st, Rank rank, std::uint32_t f) {
  for (std::uint32_t g = 0; g < config.num_groups; ++g) {
    const GroupPools& gp = st.at(rank, GroupId(g));
    for (std::uint32_t s = st.share.FirstSlot(f); s < st.share.FirstSlot(f) + st.share.slots_per_frame; ++s) {
      if (gp.device.IsAllocated(SlotId(s)) && gp.policy->UsedInCurrentRound(SlotId(s))) return true;
    }
  }
  return false;
}
}  // namespace

Status WithholdFrames(const AddressSpaceConfig& config, AddressSpace::State& st, Rank rank, std::uint32_t need,
                      const RunMovesFn& run_moves) {
  if (need == 0) return Ok();
  const FrameShare& share = st.share;
  const std::uint32_t spf = share.slots_per_frame;
  // 1. The free frames Take gives first whose C4 entries may move: none used in this round. Refused
  // before anything changes when fewer than `need` are.
  std::vector<std::uint32_t> frames;
  const std::vector<std::uint32_t> free = st.frames->FreeInTakeOrder();
  for (std::size_t i = 0; i < free.size() && frames.size() < need; ++i) {
    if (!HoldsRoundUsed(config, st, rank, free[i])) frames.push_back(free[i]);
  }
  if (frames.size() < need) {
    return MakeError(ErrorCode::kResourceExhausted,
                     fmt::format("Allocate: the resident kinds need {} free frames and {} of the {} free hold no C4 "
                                 "entry used in this round (allocated or selected since the last AdvanceRound()): "
                                 "such an entry cannot move before AdvanceRound()",
                                 need, frames.size(), free.size()));
  }
  std::vector<Leaving> leaving;
  for (std::uint32_t g = 0; g < config.num_groups; ++g) {
    const GroupPools& gp = st.at(rank, GroupId(g));
    for (std::uint32_t f : frames) {
      for (std::uint32_t s = share.FirstSlot(f); s < share.FirstSlot(f) + spf; ++s) {
        if (gp.device.IsAllocated(SlotId(s))) leaving.push_back({g, SlotId(s), Location::None()});
      }
    }
  }
  // 2. Claim the frames' free slots, then the places the leaving entries go: a free device
  // slot outside the frames first (the C4 share keeps every entry it has room for), else
  // host. Undone on any failure below.
  std::vector<std::vector<SlotId>> claimed(config.num_groups);
  auto undo = [&]() {
    for (const Leaving& l : leaving) {
      if (l.to.is_none()) continue;
      GroupPools& gp = st.at(rank, GroupId(l.group));
      ULA_CHECK((l.to.tier() == Tier::kDevice ? gp.device : gp.host).Free(l.to.slot()).has_value());
    }
    for (std::uint32_t g = 0; g < config.num_groups; ++g) {
      for (SlotId s : claimed[g]) ULA_CHECK(st.at(rank, GroupId(g)).device.Free(s).has_value());
    }
  };
  for (std::uint32_t g = 0; g < config.num_groups; ++g) {
    GroupPools& gp = st.at(rank, GroupId(g));
    for (std::uint32_t f : frames) {
      for (std::uint32_t s = share.FirstSlot(f); s < share.FirstSlot(f) + spf; ++s) {
        if (gp.device.IsAllocated(SlotId(s))) continue;
        ULA_CHECK(gp.device.Claim(SlotId(s)).has_value());
        claimed[g].push_back(SlotId(s));
      }
    }
  }
  for (Leaving& l : leaving) {
    GroupPools& gp = st.at(rank, GroupId(l.group));
    if (auto d = gp.device.Allocate()) {
      l.to = Location::Make(Tier::kDevice, rank, *d);
    } else if (auto h = gp.host.Allocate()) {
      l.to = Location::Make(Tier::kHost, rank, *h);
    } else {
      undo();
      return MakeError(ErrorCode::kResourceExhausted,
                       fmt::format("Allocate: the resident kinds need {} frames, and the C4 entries in them find no "
                                   "free slot on host or on device (group {})", need, l.group));
    }
  }
  // 3. Copy first.
  std::vector<CopyDescriptor> moves;
  moves.reserve(leaving.size());
  for (const Leaving& l : leaving) {
    const GroupPools& gp = st.at(rank, GroupId(l.group));
    moves.push_back(MakeCopyDescriptor(CopyOp::kCopy, {Tier::kDevice, rank.value(), l.from.value()},
                                       {l.to.tier(), rank.value(), l.to.slot().value()},
                                       gp.device_owner[l.from.value()].value(), static_cast<std::uint16_t>(l.group),
                                       config.row(), static_cast<std::uint16_t>(gp.num_layers)));
  }
  if (!moves.empty()) {
    if (Status copied = run_moves(moves); !copied) {
      undo();
      return MakeError(ErrorCode::kIo, fmt::format("Allocate: moving {} C4 entries out of the frames the resident "
                                                   "kinds need failed ({}); nothing allocated, the entries stay",
                                                   moves.size(), copied.error().message()));
    }
  }
  // 4. Publish: each entry at its new place; its old slot stays allocated, withheld.
  for (const Leaving& l : leaving) {
    GroupPools& gp = st.at(rank, GroupId(l.group));
    const LogicalAddr a = gp.device_owner[l.from.value()];
    gp.policy->Remove(l.from);
    gp.device_owner[l.from.value()] = LogicalAddr::Invalid();
    if (l.to.tier() == Tier::kDevice) {
      gp.device_owner[l.to.slot().value()] = a;
      gp.policy->Insert(l.to.slot());
    }
    st.tables[l.group].Set(a, l.to);
  }
  for (std::uint32_t g = 0; g < config.num_groups; ++g) st.at(rank, GroupId(g)).withheld += frames.size() * spf;
  for (std::uint32_t f : frames) st.frames->Withhold(f);
  return Ok();
}

void ReleaseFreeFrames(const AddressSpaceConfig& config, AddressSpace::State& st, Rank rank) {
  if (!st.frames) return;
  const std::vector<std::uint32_t> ready(st.frames->FreeWithheld().begin(), st.frames->FreeWithheld().end());
  const std::uint32_t spf = st.share.slots_per_frame;
  for (std::uint32_t f : ready) {
    for (std::uint32_t g = 0; g < config.num_groups; ++g) {
      GroupPools& gp = st.at(rank, GroupId(g));
      for (std::uint32_t s = st.share.FirstSlot(f); s < st.share.FirstSlot(f) + spf; ++s) {
        ULA_CHECK(gp.device.Free(SlotId(s)).has_value());
      }
      gp.withheld -= spf;
    }
    st.frames->Release(f);
  }
}

Status CheckFrameShare(const AddressSpaceConfig& config, const AddressSpace::State& st) {
  if (!st.frames) return Ok();
  auto fail = [](std::string msg) { return MakeError(ErrorCode::kInternal, "AddressSpace: frames: " + msg); };
  const KindFrames& frames = *st.frames;
  const std::uint32_t spf = st.share.slots_per_frame;
  std::uint32_t withheld = 0;
  for (std::uint32_t f = 0; f < frames.num_frames(); ++f) {
    if (frames.IsWithheld(f) != !frames.IsFree(f)) {
      return fail(fmt::format("frame {} is {} and {}withheld from C4", f, frames.IsFree(f) ? "free" : "a kind's",
                              frames.IsWithheld(f) ? "" : "not "));
    }
    if (!frames.IsWithheld(f)) continue;
    ++withheld;
    for (std::uint32_t g = 0; g < config.num_groups; ++g) {
      const GroupPools& gp = st.at(Rank(0), GroupId(g));
      for (std::uint32_t s = st.share.FirstSlot(f); s < st.share.FirstSlot(f) + spf; ++s) {
        if (!gp.device.IsAllocated(SlotId(s)) || gp.device_owner[s].valid()) {
          return fail(fmt::format("C4 device slot {} of group {} in frame {} (a kind's) is {}", s, g, f,
                                  gp.device_owner[s].valid() ? "an entry's" : "free"));
        }
      }
    }
  }
  for (std::uint32_t g = 0; g < config.num_groups; ++g) {
    const GroupPools& gp = st.at(Rank(0), GroupId(g));
    if (gp.withheld != withheld * spf) {
      return fail(fmt::format("group {} counts {} withheld C4 slots, the {} withheld frames hold {}", g, gp.withheld,
                              withheld, withheld * spf));
    }
  }
  return Ok();
}

}  // namespace ula
