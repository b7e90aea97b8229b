// A DP space whose kinds are carved from one budget of frames (AddressSpaceConfig::
// kind_frame_bytes; src/space/frame_share.h): the C4 device slots are what the resident kinds
// leave. As the batch grows the resident frames rise and the C4 device share falls, the
// groups' pools hold exactly that share, nothing is refused while the total fits; a frame a
// kind takes sends its C4 entries to host with their bytes, never one used in this round;
// frames return when requests free; a failed move and bad configs change nothing.
#include <gtest/gtest.h>

#include <cstring>
#include <map>

#include "space/frame_share.h"
#include "space/kind_frames.h"
#include "ula/address_space.h"
#include "ula/backend.h"
#include "ula/step_planner.h"
#include "v4_flash.h"

namespace ula {
namespace {

// V4-Flash at `frames` frames of kKindFrameBytes, a host tier of host_c4 C4 entries.
AddressSpaceConfig FlashFramesConfig(std::uint32_t frames, std::uint32_t host_c4) {
  AddressSpaceConfig c = test::FlashSpaceConfig(1, host_c4, /*drafts=*/3);
  c.device_bytes_per_rank = std::uint64_t{frames} * kKindFrameBytes;
  c.kind_frame_bytes = kKindFrameBytes;
  return c;
}

std::uint32_t Resident(const KindBudget& b) { return b.frames - b.free_frames; }

// Requests of 16384 tokens arrive, one round each, until one is refused.
TEST(KindSpaceFrames, AsTheBatchGrowsTheC4DeviceShareIsWhatTheResidentKindsLeave) {
  constexpr std::uint32_t kFrames = 16, kHostC4 = 100'000, kTokens = 16384;
  auto backend = MakeCountingBackend();
  auto space = AddressSpace::Create(FlashFramesConfig(kFrames, kHostC4), *backend);
  ASSERT_TRUE(space) << space.error().ToString();
  AddressSpace& s = **space;
  const KindBudget start = *s.KindBudgetOf();
  EXPECT_EQ(start.frames, kFrames);
  EXPECT_EQ(start.c4_device_slots, s.config().device_slots_per_group());
  EXPECT_EQ(start.c4_device_slots, std::uint64_t{kFrames} * 136 * 64);  // 136 C4 blocks of 64 per frame
  KindBudget last = start;
  std::uint32_t admitted = 0;
  Status refused = Ok();
  while (refused && admitted < 1000) {
    const RequestId r(admitted + 1);
    ASSERT_TRUE(s.AddRequest(r, Rank(0)));
    const std::uint64_t before = s.DebugDigest();
    auto fresh = s.Allocate(r, kTokens);
    ASSERT_TRUE(s.CheckInvariants()) << s.CheckInvariants().error().ToString();
    if (!fresh) {
      refused = std::unexpected(fresh.error());
      EXPECT_EQ(s.DebugDigest(), before) << "a refused Allocate changed the space";
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
  const std::uint64_t request_c4 = kTokens / 4;
  const bool frames_short = refused.error().message().find("free frames") != std::string::npos;
  const bool c4_short = last.c4_entries + request_c4 > last.c4_device_slots + kHostC4;
  EXPECT_TRUE(frames_short || c4_short) << refused.error().message();
}

// Small kinds over small frames, with bytes: two C4 groups, a window ring, index keys, C128
// and a compressor state.
AddressSpaceConfig SmallFramesConfig(std::uint32_t frames, std::uint32_t host_c4) {
  AddressSpaceConfig c;
  c.num_groups = 2;
  c.entry_bytes = 64;
  c.row_bytes = 64;
  c.page_tokens = 64;
  c.stable_new_entries = true;
  c.kinds = {
      {.name = "window", .tokens_per_entry = 1, .lifetime = KindLifetime::kRing, .ring_tokens = 18,
       .ring_draft_tokens = 2, .layers = 2, .row_bytes = 64},
      {.name = "c4", .tokens_per_entry = 4, .lifetime = KindLifetime::kAppend, .layers = 2, .row_bytes = 64,
       .placement = KindPlacement::kSparse},
      {.name = "c4_index_key", .tokens_per_entry = 4, .lifetime = KindLifetime::kAppend, .layers = 2,
       .row_bytes = 16, .companion_of = 1},
      {.name = "c128", .tokens_per_entry = 128, .lifetime = KindLifetime::kAppend, .layers = 1, .row_bytes = 64},
      {.name = "c4_state", .tokens_per_entry = 4, .lifetime = KindLifetime::kPerRequest, .state_rows = 8,
       .layers = 2, .row_bytes = 64},
  };
  c.kind_frame_bytes = 32 * 1024;  // 4 C4 blocks of 64 x 2 x 64 B: 256 C4 slots per group
  c.device_bytes_per_rank = std::uint64_t{frames} * c.kind_frame_bytes;
  c.host_bytes_per_rank = std::uint64_t{host_c4} * 2 * 64;
  return c;
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

TEST(KindSpaceFrames, AFrameAKindTakesSendsItsC4EntriesToHostWithTheirBytes) {
  auto backend = MakeCpuBackend({.copy_threads = 1});
  auto space = AddressSpace::Create(SmallFramesConfig(8, 4096), *backend);
  ASSERT_TRUE(space) << space.error().ToString();
  AddressSpace& s = **space;
  Shadow shadow;
  // Fill the C4 device share: 8 frames x 256 slots, one request of 8192 tokens.
  ASSERT_TRUE(s.AddRequest(RequestId(1), Rank(0)));
  auto first = s.Allocate(RequestId(1), 8192);
  ASSERT_TRUE(first) << first.error().ToString();
  ASSERT_TRUE(shadow.WriteAll(s, *first, 1));
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
  ASSERT_TRUE(s.Free(RequestId(1)));
  const KindBudget empty = *s.KindBudgetOf();
  EXPECT_EQ(empty.free_frames, empty.frames);
  EXPECT_EQ(empty.c4_device_slots, s.config().device_slots_per_group());
  ASSERT_TRUE(s.CheckInvariants()) << s.CheckInvariants().error().ToString();
}

TEST(KindSpaceFrames, AnEntryUsedInThisRoundNeverMovesTheAllocateIsRefused) {
  auto backend = MakeCpuBackend({.copy_threads = 1});
  auto space = AddressSpace::Create(SmallFramesConfig(8, 4096), *backend);
  ASSERT_TRUE(space);
  AddressSpace& s = **space;
  ASSERT_TRUE(s.AddRequest(RequestId(1), Rank(0)));
  ASSERT_TRUE(s.Allocate(RequestId(1), 8192));  // fills the C4 share in this round
  ASSERT_TRUE(s.AddRequest(RequestId(2), Rank(0)));
  std::uint64_t before = s.DebugDigest();
  auto refused = s.Allocate(RequestId(2), 260);  // its window needs a frame full of this round's entries
  ASSERT_FALSE(refused);
  EXPECT_EQ(refused.error().code(), ErrorCode::kResourceExhausted);
  EXPECT_NE(refused.error().message().find("used in this round"), std::string::npos) << refused.error().message();
  EXPECT_EQ(s.DebugDigest(), before);
  s.AdvanceRound();
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
    if (r % 4 != 0) ASSERT_TRUE(s.Free(RequestId(r)));
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

}  // namespace
}  // namespace ula
