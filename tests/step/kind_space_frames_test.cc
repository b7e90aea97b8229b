// A DP space whose kinds are carved from one budget of frames (AddressSpaceConfig::
// kind_frame_bytes; src/space/frame_share.h): the C4 device slots are what the resident kinds
// leave. As the batch grows the resident frames rise and the C4 device share falls, the
// groups' pools hold exactly that share, nothing is refused while the total fits; a frame a
// kind takes sends its C4 entries to host with their bytes, never one used in this round;
// frames return when requests free; a failed move and bad configs change nothing. The
// engine path and the device step's OpenMP form, on twin spaces over frames, make the same
// decisions while frames are taken from under C4 entries and given back between rounds.
#include <gtest/gtest.h>

#include <tuple>

#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <string>

#include "space/frame_share.h"
#include "step/device_step_fixture.h"
#include "step/small_frames_config.h"
#include "step/engine_pools.h"
#include "space/kind_frames.h"
#include "ula/address_space.h"
#include "ula/backend.h"
#include "ula/device_step.h"
#include "ula/step_planner.h"
#include "test_seed.h"
#include "v4_flash.h"

namespace ula {
namespace {

using testing::SmallFramesConfig;

// V4-Flash at `frames` frames of kKindFrameBytes, a host tier of host_c4 C4 entries.
AddressSpaceConfig FlashFramesConfig(std::uint32_t frames, std::uint32_t host_c4) {
  AddressSpaceConfig c = test::FlashSpaceConfig(1, host_c4, /*drafts=*/3);
  c.device_bytes_per_rank = std::uint64_t{frames} * kKindFrameBytes;
  c.kind_frame_bytes = kKindFrameBytes;
  return c;
}

std::uint32_t Resident(const KindBudget& b) { return b.frames - b.free_frames; }

// Prefills `tokens` tokens of request r in chunks, as an engine does: a window ring holds a
// round's tokens until the round ends or the next Allocate (ARCHITECTURE "Kinds"), so one
// Allocate of the whole prompt would need its whole window at once. The chunks before token
// `rounds_until` are a round each (AdvanceRound after each), the rest share the current
// round. A refused chunk changes nothing (its digest is checked); the chunks before it stay.
// (digest: false compares KindBudgetOf and the request's addresses instead, much cheaper.)
Result<std::vector<LogicalAddr>> Prefill(AddressSpace& s, RequestId r, std::uint32_t tokens, std::uint32_t chunk,
                                         std::uint32_t rounds_until = 0, bool digest = true) {
  std::vector<LogicalAddr> all;
  auto state = [&]() {
    const KindBudget b = *s.KindBudgetOf();
    return std::tuple{digest ? s.DebugDigest() : 0, b.free_frames, b.frames_of_kind, b.c4_entries, b.c4_on_device,
                      s.AddressesOf(r)->size()};
  };
  for (std::uint32_t done = 0; done < tokens;) {
    const std::uint32_t n = std::min(chunk, tokens - done);
    const auto before = state();
    auto a = s.Allocate(r, n);
    if (!a) {
      EXPECT_EQ(state(), before) << "a refused Allocate changed the space";
      return std::unexpected(a.error());
    }
    all.insert(all.end(), a->begin(), a->end());
    done += n;
    if (done < rounds_until) s.AdvanceRound();
  }
  return all;
}

// Requests of 16384 tokens arrive, one round each (prefilled in chunks of 2048), until one
// is refused.
TEST(KindSpaceFrames, AsTheBatchGrowsTheC4DeviceShareIsWhatTheResidentKindsLeave) {
  // The sanitizer trees check every invariant inside each Allocate: a smaller budget there.
#if defined(ULA_EXPENSIVE_CHECKS)
  constexpr std::uint32_t kFrames = 8, kHostC4 = 20'000, kTokens = 16384;
#else
  constexpr std::uint32_t kFrames = 16, kHostC4 = 100'000, kTokens = 16384;
#endif
  constexpr std::uint32_t kChunk = 2048;
  auto backend = MakeCountingBackend();
  auto space = AddressSpace::Create(FlashFramesConfig(kFrames, kHostC4), *backend);
  ASSERT_TRUE(space) << space.error().ToString();
  AddressSpace& s = **space;
  const KindBudget start = *s.KindBudgetOf();
  EXPECT_EQ(start.frames, kFrames);
  EXPECT_EQ(start.c4_device_slots, s.config().device_slots_per_group());
  EXPECT_EQ(start.c4_device_slots, std::uint64_t{kFrames} * 136 * 64);  // 136 C4 blocks of 64 per frame
  KindBudget last = start, at_refusal;
  std::uint32_t admitted = 0;
  Status refused = Ok();
  while (refused && admitted < 1000) {
    const RequestId r(admitted + 1);
    ASSERT_TRUE(s.AddRequest(r, Rank(0)));
    auto fresh = Prefill(s, r, kTokens, kChunk, /*rounds_until=*/0, /*digest=*/false);
    ASSERT_TRUE(s.CheckInvariants()) << s.CheckInvariants().error().ToString();
    if (!fresh) {
      refused = std::unexpected(fresh.error());
      at_refusal = *s.KindBudgetOf();
      ASSERT_TRUE(s.Free(r));  // the engine aborts it
      break;
    }
    EXPECT_EQ(fresh->size(), kTokens / 4);
    ++admitted;
    const KindBudget b = *s.KindBudgetOf();
    EXPECT_GE(Resident(b), Resident(last));
    EXPECT_LE(b.c4_device_slots, last.c4_device_slots);
    EXPECT_EQ(b.c4_device_slots, std::uint64_t{b.free_frames} * 136 * 64);
    // The groups' pools hold the share, no more and no less: every C4 entry the share can
    // take is on device (new entries go to device, evicting the last round's).
    EXPECT_EQ(b.c4_entries, std::uint64_t{admitted} * kTokens / 4);
    EXPECT_EQ(b.c4_on_device, std::min(b.c4_entries, b.c4_device_slots));
    for (std::uint32_t g = 0; g < s.config().num_groups; ++g) {
      EXPECT_EQ(s.NumUsed(Rank(0), GroupId(g), Tier::kDevice) + s.NumFree(Rank(0), GroupId(g), Tier::kDevice),
                b.c4_device_slots);
    }
    last = b;
    s.AdvanceRound();
  }
  ASSERT_FALSE(refused) << "the budget never filled";
  EXPECT_EQ(refused.error().code(), ErrorCode::kResourceExhausted);
  std::printf("%u requests of %u tokens: resident frames %u of %u, C4 device share %llu -> %llu slots, C4 %llu on "
              "device of %llu\nrefused: %s\n", admitted, kTokens, Resident(last), kFrames,
              static_cast<unsigned long long>(start.c4_device_slots),
              static_cast<unsigned long long>(last.c4_device_slots), static_cast<unsigned long long>(last.c4_on_device),
              static_cast<unsigned long long>(last.c4_entries), refused.error().message().c_str());
  EXPECT_GT(Resident(last), kFrames / 3);
  EXPECT_LT(last.c4_device_slots, start.c4_device_slots * 2 / 3);
  EXPECT_GT(last.c4_entries, last.c4_on_device);  // the C4 history spilled to host
  // Nothing refused while the total fitted: the next request's resident blocks need frames
  // the budget no longer has, or its C4 entries pass the share plus the host.
  const bool frames_short = refused.error().message().find("free frames") != std::string::npos;
  const bool c4_short = at_refusal.c4_entries + kChunk / 4 > at_refusal.c4_device_slots + kHostC4;
  EXPECT_TRUE(frames_short || c4_short) << refused.error().message();
}

std::vector<std::byte> Bytes(LogicalAddr a, GroupId g, std::uint32_t version) {
  std::vector<std::byte> out(64);
  for (std::size_t i = 0; i < out.size(); ++i) out[i] = std::byte((a.value() * 31 + g.value() * 7 + version + i) & 0xff);
  return out;
}

struct Shadow {
  std::map<std::uint32_t, std::uint32_t> version;  // live C4 address -> version written
  Status WriteAll(AddressSpace& s, std::span<const LogicalAddr> fresh, std::uint32_t v) {
    for (LogicalAddr a : fresh) {
      for (std::uint32_t g = 0; g < s.config().num_groups; ++g) ULA_RETURN_IF_ERROR(s.Write(a, GroupId(g), Bytes(a, GroupId(g), v)));
      version[a.value()] = v;
    }
    return Ok();
  }
  void Check(const AddressSpace& s) const {
    std::vector<std::byte> got(64);
    for (const auto& [a, v] : version) {
      for (std::uint32_t g = 0; g < s.config().num_groups; ++g) {
        ASSERT_TRUE(s.Read(LogicalAddr(a), GroupId(g), got));
        ASSERT_EQ(got, Bytes(LogicalAddr(a), GroupId(g), v)) << "address " << a << " group " << g;
      }
    }
  }
};

// The engine's rows of every resident kind, written through KindLayerView into the blocks
// KindPagesOf gives each request: a block's pattern names its request, kind, block and row,
// so a C4 write or move into a kind's frame, or a block id that is not where the view says,
// shows as a changed row.
struct ResidentRows {
  std::map<std::pair<std::uint32_t, std::uint32_t>, std::uint32_t> owner;  // (kind, block) -> request written
  static std::byte Pattern(std::uint32_t r, std::uint32_t k, std::uint32_t block, std::uint32_t l, std::uint32_t row,
                           std::uint32_t i) {
    return std::byte((r * 13 + k * 29 + block * 7 + l * 3 + row * 5 + i) & 0xff);
  }
  template <class F>
  static void ForEachRow(const AddressSpace& s, std::uint32_t k, std::uint32_t block, F&& f) {
    for (std::uint32_t l = 0; l < s.config().kinds[k].layers; ++l) {
      auto vv = s.KindLayerView(k, l);
      if (!vv) { ADD_FAILURE() << vv.error().ToString(); return; }
      const LayerView v = *vv;
      if (block >= v.blocks) { ADD_FAILURE() << "kind " << k << " block " << block << " of " << v.blocks; return; }
      for (std::uint32_t row = 0; row < v.rows; ++row) f(l, row, const_cast<std::byte*>(v.Row(block, row)), v.row_bytes);
    }
  }
  // Writes the blocks that changed hands, then checks every live block's rows.
  void Update(const AddressSpace& s, std::span<const RequestId> live) {
    for (RequestId r : live) {
      for (std::uint32_t k = 0; k < s.config().kinds.size(); ++k) {
        if (k == 1 || k == 2) continue;  // C4 and its keys: the directory's pages (the keys are the engine's)
        const KindPages pages = *s.KindPagesOf(r, k);
        for (std::uint32_t block : pages.blocks) {
          auto& who = owner[{k, block}];
          if (who == r.value()) continue;
          who = r.value();
          ForEachRow(s, k, block, [&](std::uint32_t l, std::uint32_t row, std::byte* p, std::uint32_t n) {
            for (std::uint32_t i = 0; i < n; ++i) p[i] = Pattern(r.value(), k, block, l, row, i);
          });
        }
      }
    }
    for (RequestId r : live) {
      for (std::uint32_t k = 0; k < s.config().kinds.size(); ++k) {
        if (k == 1 || k == 2) continue;
        const KindPages pages = *s.KindPagesOf(r, k);
        for (std::uint32_t block : pages.blocks) {
          ForEachRow(s, k, block, [&](std::uint32_t l, std::uint32_t row, std::byte* p, std::uint32_t n) {
            for (std::uint32_t i = 0; i < n; ++i) {
              ASSERT_EQ(p[i], Pattern(r.value(), k, block, l, row, i))
                  << "request " << r.value() << " kind " << k << " block " << block << " layer " << l << " row " << row;
            }
          });
        }
      }
    }
  }
};

// Every C4 entry on device is at its slot's row of DeviceLayerView, in the budget's buffer.
void CheckC4Views(const AddressSpace& s, const std::map<std::uint32_t, std::uint32_t>& version) {
  for (const auto& [a, v] : version) {
    for (std::uint32_t g = 0; g < s.config().num_groups; ++g) {
      const Location loc = *s.Lookup(LogicalAddr(a), GroupId(g));
      if (loc.tier() != Tier::kDevice) continue;
      const LayerView view = *s.DeviceLayerView(Rank(0), GroupId(g), 0);
      const std::uint32_t slot = loc.slot().value();
      ASSERT_EQ(std::memcmp(view.Row(slot / 64, slot % 64), Bytes(LogicalAddr(a), GroupId(g), v).data(), 64), 0)
          << "address " << a << " group " << g << " slot " << slot;
    }
  }
}

TEST(KindSpaceFrames, AFrameAKindTakesSendsItsC4EntriesToHostWithTheirBytes) {
  auto backend = MakeCpuBackend({.copy_threads = 1});
  auto space = AddressSpace::Create(SmallFramesConfig(8, 4096), *backend);
  ASSERT_TRUE(space) << space.error().ToString();
  AddressSpace& s = **space;
  Shadow shadow;
  // Fill the C4 device share: 8 frames x 256 slots, one request of 8192 tokens.
  ASSERT_TRUE(s.AddRequest(RequestId(1), Rank(0)));
  auto first = Prefill(s, RequestId(1), 8192, 64, /*rounds_until=*/8192);
  ASSERT_TRUE(first) << first.error().ToString();
  ASSERT_TRUE(shadow.WriteAll(s, *first, 1));
  // One buffer: the C4 layers and every kind's layers are views of the budget's bytes.
  const LayerView c4 = *s.DeviceLayerView(Rank(0), GroupId(0), 0), window = *s.KindLayerView(0, 0);
  EXPECT_EQ(c4.block_stride, 32u * 1024 / 4);  // the padded C4 envelope: 4 blocks per frame
  EXPECT_EQ(window.base, c4.base);             // block 0 of every kind's view starts at the buffer
  EXPECT_EQ(c4.blocks * c4.block_stride, s.config().device_bytes_per_rank);
  EXPECT_TRUE(s.DeviceLayerBytes(Rank(0), GroupId(0), 0).empty());  // strided: no flat region
  EXPECT_EQ(s.KindLayerView(1, 0).error().code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(s.KindLayerView(0, 9).error().code(), ErrorCode::kOutOfRange);
  ResidentRows resident;
  std::vector<RequestId> live = {RequestId(1)};
  resident.Update(s, live);
  CheckC4Views(s, shadow.version);
  KindBudget b = *s.KindBudgetOf();
  const std::uint32_t taken_before = Resident(b);
  EXPECT_GT(taken_before, 0u);  // its window, keys, C128 and state took the lowest frames
  EXPECT_EQ(b.c4_on_device, b.c4_device_slots);  // the rest of the device is C4's, full
  s.AdvanceRound();
  // New requests need frames for their resident kinds while the C4 share is full: the C4
  // entries of each frame a kind takes leave it (CheckInvariants: no C4 slot of a kind's
  // frame holds an entry) with their bytes.
  std::uint32_t admitted = 0;
  for (std::uint32_t r = 2; r <= 40; ++r) {
    ASSERT_TRUE(s.AddRequest(RequestId(r), Rank(0)));
    auto fresh = s.Allocate(RequestId(r), 260);
    if (!fresh) {
      EXPECT_EQ(fresh.error().code(), ErrorCode::kResourceExhausted) << fresh.error().ToString();
      break;
    }
    ++admitted;
    ASSERT_TRUE(s.CheckInvariants()) << s.CheckInvariants().error().ToString();
    ASSERT_TRUE(shadow.WriteAll(s, *fresh, r));
    shadow.Check(s);
    live.push_back(RequestId(r));
    resident.Update(s, live);
    CheckC4Views(s, shadow.version);
    const KindBudget now = *s.KindBudgetOf();
    EXPECT_EQ(now.c4_on_device, now.c4_device_slots);  // still full: the share shrank under it
    s.AdvanceRound();
  }
  b = *s.KindBudgetOf();
  std::printf("%u more requests: frames of the kinds %u -> %u of %u, C4 device share %llu slots, %llu C4 entries\n",
              admitted, taken_before, Resident(b), b.frames, static_cast<unsigned long long>(b.c4_device_slots),
              static_cast<unsigned long long>(b.c4_entries));
  EXPECT_GT(Resident(b), taken_before + 1);
  // Requests free: their frames come back to C4.
  for (std::uint32_t r = 2; r <= 40; ++r) (void)s.Free(RequestId(r));
  for (auto it = shadow.version.begin(); it != shadow.version.end();) {
    it = s.IsLive(LogicalAddr(it->first)) ? std::next(it) : shadow.version.erase(it);
  }
  ASSERT_TRUE(s.CheckInvariants()) << s.CheckInvariants().error().ToString();
  EXPECT_EQ(Resident(*s.KindBudgetOf()), taken_before);
  shadow.Check(s);
  resident.Update(s, std::vector<RequestId>{RequestId(1)});
  CheckC4Views(s, shadow.version);
  ASSERT_TRUE(s.Free(RequestId(1)));
  const KindBudget empty = *s.KindBudgetOf();
  EXPECT_EQ(empty.free_frames, empty.frames);
  EXPECT_EQ(empty.c4_device_slots, s.config().device_slots_per_group());
  ASSERT_TRUE(s.CheckInvariants()) << s.CheckInvariants().error().ToString();
}

// A frame full of this round's entries refuses the Allocate; a frame holding one is passed
// over for a lower one.
TEST(KindSpaceFrames, AnEntryUsedInThisRoundNeverMovesTheAllocateIsRefused) {
  auto backend = MakeCpuBackend({.copy_threads = 1});
  auto space = AddressSpace::Create(SmallFramesConfig(8, 4096), *backend);
  ASSERT_TRUE(space);
  AddressSpace& s = **space;
  ASSERT_TRUE(s.AddRequest(RequestId(1), Rank(0)));
  // The last 3,072 tokens' 768 C4 entries fill the C4 share (frames 0..2) in this round.
  ASSERT_TRUE(Prefill(s, RequestId(1), 8192, 64, /*rounds_until=*/8192 - 3072));
  ASSERT_TRUE(s.AddRequest(RequestId(2), Rank(0)));
  std::uint64_t before = s.DebugDigest();
  auto refused = s.Allocate(RequestId(2), 260);  // its window needs a frame full of this round's entries
  ASSERT_FALSE(refused);
  EXPECT_EQ(refused.error().code(), ErrorCode::kResourceExhausted);
  EXPECT_NE(refused.error().message().find("used in this round"), std::string::npos) << refused.error().message();
  EXPECT_EQ(s.DebugDigest(), before);
  s.AdvanceRound();
  // In the next round a step selects one C4 entry of the highest free frame (2; the kinds
  // hold 3..7): that frame is passed over, and frame 1, below it, is the one emptied.
  const FrameShare share = *FrameShareOf(s.config());
  LogicalAddr selected, in_frame_1;
  const std::span<const LogicalAddr> held = s.AddressesOf(RequestId(1)).value();
  for (LogicalAddr a : held) {
    const Location loc = *s.Lookup(a, GroupId(0));
    if (loc.tier() != Tier::kDevice) continue;
    if (share.FrameOfSlot(loc.slot().value()) == 2 && !selected.valid()) selected = a;
    if (share.FrameOfSlot(loc.slot().value()) == 1 && !in_frame_1.valid()) in_frame_1 = a;
  }
  ASSERT_TRUE(selected.valid() && in_frame_1.valid());
  const Location selected_at = *s.Lookup(selected, GroupId(0));
  {
    StepPlanner planner(s);
    const std::vector<LogicalAddr> sel = {selected};
    const std::vector<SelectionRun> runs = {{RequestId(1), 1}};
    std::vector<SlotId> slots(1);
    ASSERT_TRUE(planner.Step({Rank(0), GroupId(0), sel, runs}, slots));
  }
  // A failed move changes nothing either.
  s.SetMoveExecutor([](std::span<const CopyDescriptor>) -> Status { return MakeError(ErrorCode::kIo, "copy engine"); });
  before = s.DebugDigest();
  auto failed = s.Allocate(RequestId(2), 260);
  ASSERT_FALSE(failed);
  EXPECT_EQ(failed.error().code(), ErrorCode::kIo) << failed.error().ToString();
  EXPECT_EQ(s.DebugDigest(), before);
  ASSERT_TRUE(s.CheckInvariants()) << s.CheckInvariants().error().ToString();
  s.SetMoveExecutor(nullptr);
  ASSERT_TRUE(s.Allocate(RequestId(2), 260));  // after AdvanceRound they may leave
  ASSERT_TRUE(s.CheckInvariants()) << s.CheckInvariants().error().ToString();
  EXPECT_EQ(*s.Lookup(selected, GroupId(0)), selected_at);              // used in this round: stayed
  EXPECT_EQ(s.Lookup(in_frame_1, GroupId(0))->tier(), Tier::kHost);    // frame 1 was emptied
}

TEST(KindSpaceFrames, CompactionReturnsFramesToTheC4Share) {
  auto backend = MakeCpuBackend({.copy_threads = 1});
  auto space = AddressSpace::Create(SmallFramesConfig(8, 4096), *backend);
  ASSERT_TRUE(space);
  AddressSpace& s = **space;
  // 16 requests of 4 tokens: a window block each, 4 to a frame; freeing three in four leaves
  // four window frames of one live block, which compaction empties into one.
  for (std::uint32_t r = 1; r <= 16; ++r) {
    ASSERT_TRUE(s.AddRequest(RequestId(r), Rank(0)));
    ASSERT_TRUE(s.Allocate(RequestId(r), 4)) << r;
    s.AdvanceRound();
  }
  for (std::uint32_t r = 1; r <= 16; ++r) {
    if (r % 4 != 0) {
      ASSERT_TRUE(s.Free(RequestId(r)));
    }
  }
  const KindBudget before = *s.KindBudgetOf();
  std::uint32_t returned = 0;
  for (std::uint32_t k = 0; k < s.config().kinds.size(); ++k) {
    if (k == 1) {
      EXPECT_EQ(s.CompactKind(k).error().code(), ErrorCode::kInvalidArgument);  // the addresses
      continue;
    }
    auto n = s.CompactKind(k);
    ASSERT_TRUE(n) << n.error().ToString();
    returned += *n;
    ASSERT_TRUE(s.CheckInvariants()) << s.CheckInvariants().error().ToString();
  }
  const KindBudget after = *s.KindBudgetOf();
  EXPECT_GT(returned, 0u);
  EXPECT_EQ(after.free_frames, before.free_frames + returned);
  EXPECT_EQ(after.c4_device_slots, before.c4_device_slots + std::uint64_t{returned} * 256);
  EXPECT_EQ(s.CompactKind(99).error().code(), ErrorCode::kOutOfRange);
}

TEST(KindSpaceFrames, BadConfigsAreRefusedNamingTheField) {
  auto backend = MakeCountingBackend();
  struct Case {
    const char* field;
    std::function<void(AddressSpaceConfig&)> edit;
  };
  const Case cases[] = {
      {"AddressSpaceConfig.kind_frame_bytes", [](AddressSpaceConfig& c) { c.kinds.clear(); c.num_groups = 1; c.entry_bytes = 64; }},
      {"AddressSpaceConfig.num_ranks", [](AddressSpaceConfig& c) { c.num_ranks = 2; }},
      {"AddressSpaceConfig.host_shadows", [](AddressSpaceConfig& c) { c.host_shadows = true; }},
      {"AddressSpaceConfig.kind_frame_bytes", [](AddressSpaceConfig& c) { c.kind_frame_bytes = 4096; }},  // an envelope does not fit
      {"AddressSpaceConfig.kind_frame_bytes", [](AddressSpaceConfig& c) { c.kind_frame_bytes = 32 * 1024 + 1; }},
      {"AddressSpaceConfig.kind_frame_bytes", [](AddressSpaceConfig& c) { c.device_bytes_per_rank = 1024 * 1024 - 1; c.kind_frame_bytes = 1024 * 1024; }},
  };
  for (const Case& c : cases) {
    AddressSpaceConfig cfg = SmallFramesConfig(8, 16);
    c.edit(cfg);
    auto s = AddressSpace::Create(cfg, *backend);
    ASSERT_FALSE(s) << c.field;
    EXPECT_EQ(s.error().code(), ErrorCode::kInvalidArgument);
    EXPECT_EQ(s.error().message().rfind(c.field, 0), 0u) << s.error().message();
  }
  // A space without frames has no budget to report or compact.
  AddressSpaceConfig plain = SmallFramesConfig(8, 16);
  plain.kind_frame_bytes = 0;
  auto s = AddressSpace::Create(plain, *backend);
  ASSERT_TRUE(s) << s.error().ToString();
  EXPECT_EQ((*s)->KindBudgetOf().error().code(), ErrorCode::kFailedPrecondition);
  EXPECT_EQ((*s)->CompactKind(0).error().code(), ErrorCode::kFailedPrecondition);
}



// A decode loop with drafts over the small kinds at 16 frames: requests of 4096 tokens arrive
// and finish, so their resident blocks take frames from under C4 entries (Allocate moves
// them) and give them back, between the rounds. The engine path plans each group on one
// space; the device step (OpenMP) plans it on a twin: the same descriptors, indices and
// counts, each selection's bytes at its index, no selection ever in a withheld frame, the
// twins' digests equal after every round.
TEST(KindSpaceFrames, EnginePathAndDeviceStepAgreeWhileFramesMove) {
  ULA_TEST_SEEDED(seed, 20261206);
  constexpr std::uint32_t kBatch = 4, kTopK = 24, kDrafts = 2, kPrompt = 4096, kPrefillChunk = 512;
#if defined(ULA_EXPENSIVE_CHECKS)
  constexpr int kRounds = 60;
#else
  constexpr int kRounds = 150;
#endif
  auto backend = MakeCountingBackend();  // the engine owns the bytes
  AddressSpaceConfig config = SmallFramesConfig(16, 4096);
  config.policy = PolicyKind::kKernelPbLru;  // the device step holds PB-LRU as flat bitmaps
  auto ref_space = AddressSpace::Create(config, *backend);
  auto twin_space = AddressSpace::Create(config, *backend);
  ASSERT_TRUE(ref_space && twin_space);
  AddressSpace& ref = **ref_space;
  AddressSpace& twin = **twin_space;
  auto created = StepPlanner::Create(ref, {.max_batch = kBatch, .max_q_len = 1, .max_top_k = kTopK});
  ASSERT_TRUE(created) << created.error().ToString();
  StepPlanner& planner = **created;
  testing::EngineMemory mem_ref, mem_twin;
  for (std::uint32_t g = 0; g < config.num_groups; ++g) {
    const std::uint32_t slots[kNumTiers] = {config.device_slots_per_group(), config.host_slots_per_group()};
    for (int t = 0; t < kNumTiers; ++t) {
      mem_ref[t].emplace_back(slots[t], 64);
      mem_twin[t].emplace_back(slots[t], 64);
      ASSERT_TRUE(planner.RegisterEngineMemory(static_cast<Tier>(t), Rank(0), GroupId(g), mem_ref[t][g].Region()));
    }
  }
  twin.SetMoveExecutor(testing::MovesOnEngineMemory(mem_twin));
  std::vector<std::unique_ptr<DeviceStep>> steps;
  for (std::uint32_t g = 0; g < config.num_groups; ++g) {
    auto step = DeviceStep::Create(twin, Rank(0), GroupId(g),
                                   {.max_rows = kBatch, .max_batch = kBatch, .max_top_k = kTopK,
                                    .max_addresses = 1u << 14, .max_requests = 256, .max_adopted = 16});
    ASSERT_TRUE(step) << step.error().ToString();
    steps.push_back(std::move(*step));
  }
  std::mt19937_64 rng(seed);
  std::vector<RequestId> requests;
  std::vector<std::uint32_t> tokens;
  std::map<std::uint32_t, std::uint32_t> version;
  std::uint32_t next_id = 1, next_version = 1;
  std::uint64_t frames_taken = 0, frames_returned = 0;
  std::uint32_t last_free = ref.KindBudgetOf()->free_frames;
  auto track = [&]() {  // the frames the last change took or gave back
    const std::uint32_t now = ref.KindBudgetOf()->free_frames;
    EXPECT_EQ(twin.KindBudgetOf()->free_frames, now);
    frames_taken += now < last_free ? last_free - now : 0;
    frames_returned += now > last_free ? now - last_free : 0;
    last_free = now;
  };
  auto write_kv = [&](std::span<const LogicalAddr> fresh) {
    for (LogicalAddr a : fresh) {
      version[a.value()] = next_version++;
      for (std::uint32_t g = 0; g < config.num_groups; ++g) {
        const Location r = ref.Lookup(a, GroupId(g)).value();
        const Location t = twin.Lookup(a, GroupId(g)).value();
        std::vector<std::byte> row = Bytes(a, GroupId(g), version[a.value()]);
        std::memcpy(mem_ref[static_cast<int>(r.tier())][g].Row(r.slot().value()), row.data(), 64);
        std::memcpy(mem_twin[static_cast<int>(t.tier())][g].Row(t.slot().value()), row.data(), 64);
      }
    }
  };
  // Both spaces do the same; the twin's answer must be the reference's.
  auto allocate = [&](std::size_t b, std::uint32_t n) -> bool {
    auto a = ref.Allocate(requests[b], n);
    auto t = twin.Allocate(requests[b], n);
    EXPECT_EQ(a.has_value(), t.has_value());
    if (!a || !t) {
      if (!a) std::printf("refused: %s\n", a.error().ToString().c_str());
      return false;
    }
    EXPECT_EQ(*a, *t);
    tokens[b] += n;
    write_kv(*a);
    track();
    return true;
  };
  auto add = [&]() {
    const RequestId r(next_id++);
    EXPECT_TRUE(ref.AddRequest(r, Rank(0)) && twin.AddRequest(r, Rank(0)));
    requests.push_back(r);
    tokens.push_back(0);
    bool fits = true;
    for (std::uint32_t done = 0; fits && done < kPrompt; done += kPrefillChunk) {  // a round each
      fits = allocate(requests.size() - 1, kPrefillChunk);
      ref.AdvanceRound();
      twin.AdvanceRound();
    }
    if (!fits) {  // the budget is full: it waits
      EXPECT_TRUE(ref.Free(r) && twin.Free(r));
      requests.pop_back();
      tokens.pop_back();
    }
  };
  for (std::uint32_t b = 0; b < kBatch; ++b) add();
  ASSERT_EQ(requests.size(), kBatch);
  testing::Shape shape{.batch = kBatch, .q_len = 1, .top_k = kTopK, .sel_stride = kTopK, .idx_stride = kTopK};
  std::vector<std::int32_t> sel(std::size_t{kBatch} * kTopK), idx(sel.size());
  std::vector<CopyDescriptor> desc(planner.max_descriptors());
  std::vector<std::uint8_t> status(std::max(desc.size(), std::size_t{steps[0]->max_descriptors()}), 0);
  std::uint64_t hits = 0, misses = 0;
  for (int round = 0; round < kRounds; ++round) {
    if (round % 10 == 9) {  // one request finishes, another arrives
      const std::size_t b = rng() % requests.size();
      ASSERT_TRUE(ref.Free(requests[b]) && twin.Free(requests[b]));
      track();
      requests.erase(requests.begin() + static_cast<std::ptrdiff_t>(b));
      tokens.erase(tokens.begin() + static_cast<std::ptrdiff_t>(b));
      add();
      while (requests.size() < kBatch) add();
    }
    for (std::size_t b = 0; b < requests.size(); ++b) ASSERT_TRUE(allocate(b, 1 + kDrafts)) << "round " << round;
    for (std::uint32_t g = 0; g < config.num_groups; ++g) {
      const std::string where = "round " + std::to_string(round) + " group " + std::to_string(g);
      DeviceStep& step = *steps[g];
      ASSERT_TRUE(step.Reload(twin, nullptr)) << where;
      std::fill(sel.begin(), sel.end(), -1);
      for (std::size_t b = 0; b < requests.size(); ++b) {
        auto list = ref.AddressesOf(requests[b]).value();
        std::vector<LogicalAddr> pool(list.begin(), list.end());
        const std::size_t k = std::min<std::size_t>(kTopK, pool.size());
        for (std::size_t i = 0; i < k; ++i) std::swap(pool[i], pool[i + rng() % (pool.size() - i)]);
        for (std::size_t i = 0; i < k; ++i) sel[b * kTopK + i] = static_cast<std::int32_t>(pool[i].value());
      }
      auto plan = planner.Plan(Rank(0), GroupId(g), {kBatch, 1, kTopK}, requests, sel, idx, desc);
      ASSERT_TRUE(plan) << where << ": " << plan.error().ToString();
      const auto ref_desc = std::span(desc).first(plan->num_descriptors);
      auto st = std::span(status).first(plan->num_descriptors);
      planner.ExecuteOnEngineMemory(ref_desc, st);
      ASSERT_TRUE(planner.Complete(plan->fence, st)) << where;
      testing::DeviceIo io;
      io.Fill(shape, sel, requests, step.max_descriptors());
      ASSERT_TRUE(step.Plan(io.arrays, nullptr)) << where;
      ASSERT_EQ(io.record.error, 0u) << where;
      ASSERT_EQ(io.record.num_descriptors, plan->num_descriptors) << where;
      EXPECT_EQ(io.record.hits, plan->stats.hits) << where;
      EXPECT_EQ(io.record.misses, plan->stats.misses) << where;
      for (std::uint32_t i = 0; i < plan->num_descriptors; ++i) {
        ASSERT_EQ(std::memcmp(&io.descriptors[i], &ref_desc[i], sizeof(CopyDescriptor)), 0) << where << " descriptor " << i;
      }
      testing::RunOnEngineMemory(std::span(io.descriptors).first(io.record.num_descriptors), mem_twin);
      std::fill(status.begin(), status.end(), 0);
      ASSERT_TRUE(step.Complete(status.data(), nullptr)) << where;
      ASSERT_TRUE(step.StoreInto(twin, nullptr)) << where;
      hits += io.record.hits;
      misses += io.record.misses;
      for (std::size_t i = 0; i < sel.size(); ++i) {
        if (sel[i] == -1) continue;
        const LogicalAddr a(static_cast<std::uint32_t>(sel[i]));
        ASSERT_EQ(io.indices[i], idx[i]) << where << " selection " << i;
        ASSERT_GE(idx[i], 0) << where;
        const std::uint32_t slot = static_cast<std::uint32_t>(idx[i]);
        ASSERT_LT(slot, config.device_slots_per_group());
        ASSERT_EQ(twin.Lookup(a, GroupId(g))->slot().value(), slot) << where;  // never a withheld slot: CheckInvariants
        const std::vector<std::byte> want = Bytes(a, GroupId(g), version.at(a.value()));
        ASSERT_EQ(std::memcmp(mem_twin[0][g].Row(slot), want.data(), 64), 0) << where << " address " << a.value();
        ASSERT_EQ(std::memcmp(mem_ref[0][g].Row(slot), want.data(), 64), 0) << where << " address " << a.value();
      }
      const Status inv = twin.CheckInvariants();  // no C4 entry in a withheld frame, among the rest
      ASSERT_TRUE(inv) << where << ": " << inv.error().ToString();
    }
    ASSERT_EQ(twin.DebugDigest(), ref.DebugDigest()) << "round " << round;
    for (std::size_t b = 0; b < requests.size(); ++b) {  // verification: rejected drafts roll back
      const std::uint32_t rejected = static_cast<std::uint32_t>(rng() % (kDrafts + 1));
      if (rejected == 0) continue;
      tokens[b] -= rejected;
      ASSERT_TRUE(ref.Truncate(requests[b], tokens[b]) && twin.Truncate(requests[b], tokens[b]));
      track();
    }
    ref.AdvanceRound();
    twin.AdvanceRound();
    ASSERT_TRUE(ref.CheckInvariants()) << ref.CheckInvariants().error().ToString();
  }
  std::printf("device step over frames: %llu hits, %llu misses, frames taken %llu and returned %llu between rounds\n",
              static_cast<unsigned long long>(hits), static_cast<unsigned long long>(misses),
              static_cast<unsigned long long>(frames_taken), static_cast<unsigned long long>(frames_returned));
  EXPECT_GT(misses, 500u);
  EXPECT_GT(frames_taken, 3u);
  EXPECT_GE(frames_returned, 3u);
}

}  // namespace
}  // namespace ula
