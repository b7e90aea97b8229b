// StepPlanner::ReserveRound over frames (docs/ARCHITECTURE.md, "The space over frames"): a
// round's demands count the free frames its Allocates' resident kinds take (the window ring
// of a prefill chunk, C128 blocks, compressor states, index keys) with its C4 entries, so no
// Allocate of a round it admits is refused for frames, in any order (one may still wait on
// the round's pinned C4 entries: docs/ARCHITECTURE.md, "Not built yet"), and it refuses a
// round exactly when its Allocates would not fit: a request's largest admitted round fits on
// device, one token more does not, and a refusal changes nothing.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <iterator>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "step/small_frames_config.h"
#include "test_seed.h"
#include "ula/address_space.h"
#include "ula/backend.h"
#include "ula/step_planner.h"

namespace ula {
namespace {

using testing::SmallFramesConfig;

TEST(ReserveFrames, EveryAllocateOfAnAdmittedRoundSucceeds) {
  ULA_TEST_SEEDED(seed, 20261206);
  std::mt19937_64 rng(seed);
#if defined(ULA_EXPENSIVE_CHECKS)
  constexpr int kRounds = 120;
#else
  constexpr int kRounds = 1500;
#endif
  auto backend = MakeCountingBackend();
  // Window blocks of half a frame and a ring of 130 tokens: the frames bind before the C4 slots.
  auto space = AddressSpace::Create(SmallFramesConfig(12, 4096, /*ring_tokens=*/130, /*window_row_bytes=*/128),
                                    *backend);
  ASSERT_TRUE(space) << space.error().ToString();
  AddressSpace& s = **space;
  auto created = StepPlanner::Create(s, {.max_batch = 8, .max_q_len = 4, .max_top_k = 64});
  ASSERT_TRUE(created) << created.error().ToString();
  StepPlanner& planner = **created;
  struct Live {
    std::uint32_t prompt_left = 0;  // tokens still to prefill
    std::uint32_t decodes_left = 0;
    std::uint32_t tokens = 0;
  };
  std::map<std::uint32_t, Live> live;
  std::uint32_t next_id = 1;
  std::uint64_t admitted = 0, deferred = 0, frame_refusals = 0, allocates = 0, pinned_refusals = 0;
  for (int round = 0; round < kRounds; ++round) {
    while (live.size() < 6 && rng() % 2 == 0) {
      ASSERT_TRUE(s.AddRequest(RequestId(next_id), Rank(0)));
      live[next_id++] = Live{static_cast<std::uint32_t>(1 + rng() % 1200), static_cast<std::uint32_t>(rng() % 40)};
    }
    std::vector<RoundDemand> demands;
    std::vector<std::uint32_t> drafts;
    for (const auto& [id, l] : live) {
      const std::uint32_t d = l.prompt_left > 0 ? 0 : static_cast<std::uint32_t>(rng() % 3);
      const std::uint32_t n =
          l.prompt_left > 0 ? std::min<std::uint32_t>(l.prompt_left, 1 + rng() % 400) : 1 + d;
      demands.push_back({RequestId(id), n, static_cast<std::uint32_t>(rng() % 64)});
      drafts.push_back(d);
    }
    std::shuffle(demands.begin(), demands.end(), rng);
    // The scheduler defers requests (the last listed) until the round fits.
    while (!demands.empty()) {
      const std::uint64_t before = s.DebugDigest();
      auto r = planner.ReserveRound(Rank(0), demands);
      if (r) break;
      ASSERT_EQ(r.error().code(), ErrorCode::kResourceExhausted) << r.error().ToString();
      ASSERT_EQ(s.DebugDigest(), before) << "a refusal changes nothing";
      if (r.error().message().find("free frames") != std::string::npos) ++frame_refusals;
      demands.pop_back();
      ++deferred;
    }
    if (demands.empty() && !live.empty()) {  // nothing fits: the engine preempts a request
      auto it = std::next(live.begin(), static_cast<std::ptrdiff_t>(rng() % live.size()));
      ASSERT_TRUE(s.Free(RequestId(it->first)));
      live.erase(it);
    }
    ++admitted;
    std::shuffle(demands.begin(), demands.end(), rng);  // Allocates in any order
    for (const RoundDemand& d : demands) {
      const std::uint64_t before = s.DebugDigest();
      auto a = s.Allocate(d.request, d.new_tokens);
      if (!a && a.error().message().find("used in this round") != std::string::npos) {
        // Not counted by ReserveRound (docs/ARCHITECTURE.md, "Not built yet"): the round's
        // pinned C4 entries hold every free frame this Allocate could take; it waits.
        ASSERT_EQ(s.DebugDigest(), before);
        ++pinned_refusals;
        continue;
      }
      ASSERT_TRUE(a) << "round " << round << ": an admitted round's Allocate was refused: " << a.error().ToString();
      ++allocates;
      Live& l = live.at(d.request.value());
      l.tokens += d.new_tokens;
      if (l.prompt_left > 0) {
        l.prompt_left -= d.new_tokens;
      } else {
        const std::uint32_t rejected = static_cast<std::uint32_t>(rng() % d.new_tokens);  // of its drafts
        if (rejected > 0) {
          l.tokens -= rejected;
          ASSERT_TRUE(s.Truncate(d.request, l.tokens));
        }
        if (l.decodes_left-- == 0) {
          ASSERT_TRUE(s.Free(d.request));
          live.erase(d.request.value());
        }
      }
    }
    s.AdvanceRound();
  }
  ASSERT_TRUE(s.CheckInvariants()) << s.CheckInvariants().error().ToString();
  std::printf("[ rounds ] %llu admitted, %llu requests deferred (%llu for frames), %llu Allocates, %llu waited "
              "on pinned C4 entries\n", static_cast<unsigned long long>(admitted),
              static_cast<unsigned long long>(deferred), static_cast<unsigned long long>(frame_refusals),
              static_cast<unsigned long long>(allocates), static_cast<unsigned long long>(pinned_refusals));
  EXPECT_GT(frame_refusals, 0u) << "the space never ran short of frames";
}

// The largest round one request may take: its frames and its new C4 entries' device slots
// fill exactly the room ReserveRound sees. On twin spaces, its Allocate places every new
// entry on device; one token more is refused, or spills a new entry to host.
TEST(ReserveFrames, ARoundThatFillsTheFreeFramesIsAdmittedOneTokenMoreIsNot) {
  auto backend = MakeCountingBackend();
  auto a_space = AddressSpace::Create(SmallFramesConfig(8, 100000), *backend);
  auto b_space = AddressSpace::Create(SmallFramesConfig(8, 100000), *backend);
  ASSERT_TRUE(a_space && b_space);
  AddressSpace& a = **a_space;
  AddressSpace& b = **b_space;
  for (AddressSpace* s : {&a, &b}) {
    ASSERT_TRUE(s->AddRequest(RequestId(1), Rank(0)));
    ASSERT_TRUE(s->Allocate(RequestId(1), 1000));  // C128 blocks, a state, index keys, a window
    s->AdvanceRound();
    ASSERT_TRUE(s->AddRequest(RequestId(2), Rank(0)));
  }
  auto created = StepPlanner::Create(a, {.max_batch = 4, .max_q_len = 1, .max_top_k = 64});
  ASSERT_TRUE(created) << created.error().ToString();
  StepPlanner& planner = **created;
  std::uint32_t n = 0;
  while (planner.ReserveRound(Rank(0), std::vector<RoundDemand>{{RequestId(2), n + 1, 0}})) ++n;
  ASSERT_GT(n, 0u);
  const std::uint32_t free_before = a.KindBudgetOf()->free_frames;
  auto admitted = a.Allocate(RequestId(2), n);
  ASSERT_TRUE(admitted) << n << " tokens: ReserveRound admitted: " << admitted.error().ToString();
  ASSERT_TRUE(a.CheckInvariants()) << a.CheckInvariants().error().ToString();
  EXPECT_LT(a.KindBudgetOf()->free_frames, free_before) << "the round takes free frames";
  for (LogicalAddr e : *admitted) EXPECT_EQ(a.Lookup(e, GroupId(0))->tier(), Tier::kDevice);
  auto over = b.Allocate(RequestId(2), n + 1);
  bool spilled = !over;
  if (over) {
    for (LogicalAddr e : *over) spilled = spilled || b.Lookup(e, GroupId(0))->tier() != Tier::kDevice;
  }
  EXPECT_TRUE(spilled) << n + 1 << " tokens: refused by ReserveRound, yet its Allocate fits on device";
}

}  // namespace
}  // namespace ula
