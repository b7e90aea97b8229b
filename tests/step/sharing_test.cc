// Shared addresses in DP mode: reference counts, ShareInto, cache references
// (Retain/Release), the isolation check with sharing, and the planner's dedup across
// requests that share a prefix.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>
#include <set>

#include "space_fixture.h"
#include "space/address_space_state.h"
#include "space/space_access.h"
#include "test_seed.h"
#include "ula/address_space.h"
#include "ula/step_planner.h"

namespace ula {
namespace {

using testing::Pattern;
using testing::Runs;
using testing::SmallConfig;
using testing::SpaceFixture;

std::vector<std::byte> ReadEntry(const AddressSpace& space, LogicalAddr a, std::uint32_t g) {
  std::vector<std::byte> out(space.config().entry_bytes);
  EXPECT_TRUE(space.Read(a, GroupId(g), out));
  return out;
}

TEST(Sharing, AdoptedPrefixIsStoredOnceAndOutlivesItsAllocator) {
  SpaceFixture f(SmallConfig(8, 8, 1, 2));
  auto a = f.AddFilled(RequestId(1), Rank(0), 4);
  ASSERT_TRUE(f.space->AddRequest(RequestId(2), Rank(0)));
  f.requests.push_back(RequestId(2));
  const std::vector<LogicalAddr> prefix(a.begin(), a.begin() + 3);
  ASSERT_TRUE(f.space->ShareInto(RequestId(2), prefix));
  auto own = f.space->Allocate(RequestId(2), 2).value();
  EXPECT_EQ(f.space->num_live_addresses(), 6u);  // 4 + 2: the prefix is stored once
  EXPECT_EQ(f.space->NumUsed(Rank(0), GroupId(0), Tier::kDevice), 6u);
  for (LogicalAddr p : prefix) EXPECT_EQ(f.space->RefCount(p), 2u);
  EXPECT_EQ(f.space->RefCount(a[3]), 1u);
  auto list = f.space->AddressesOf(RequestId(2)).value();
  ASSERT_EQ(list.size(), 5u);
  EXPECT_TRUE(std::equal(prefix.begin(), prefix.end(), list.begin()));
  EXPECT_TRUE(f.space->Holds(RequestId(2), prefix[0]));
  EXPECT_FALSE(f.space->Holds(RequestId(2), a[3]));
  std::vector<Location> where;
  for (LogicalAddr p : prefix) where.push_back(f.space->Lookup(p, GroupId(1)).value());
  // Freeing the allocator frees only what no one else holds; the shared entries keep their
  // location and bytes.
  ASSERT_TRUE(f.space->Free(RequestId(1)));
  EXPECT_FALSE(f.space->IsLive(a[3]));
  for (std::size_t i = 0; i < prefix.size(); ++i) {
    EXPECT_TRUE(f.space->IsLive(prefix[i]));
    EXPECT_EQ(f.space->RefCount(prefix[i]), 1u);
    EXPECT_EQ(f.space->Lookup(prefix[i], GroupId(1)).value(), where[i]);
    for (std::uint32_t g = 0; g < 2; ++g) EXPECT_EQ(ReadEntry(*f.space, prefix[i], g), Pattern(prefix[i], g, 32));
  }
  EXPECT_TRUE(f.space->CheckInvariants());
  ASSERT_TRUE(f.space->Free(RequestId(2)));
  EXPECT_EQ(f.space->num_live_addresses(), 0u);
  EXPECT_EQ(f.space->NumFree(Rank(0), GroupId(0), Tier::kDevice), 8u);
  EXPECT_TRUE(f.space->CheckInvariants());
  (void)own;
}

TEST(Sharing, CacheReferencesKeepEntriesAfterEveryRequestIsFreed) {
  SpaceFixture f(SmallConfig(4, 4));
  auto a = f.AddFilled(RequestId(1), Rank(0), 3);
  ASSERT_TRUE(f.space->Retain(a));
  ASSERT_TRUE(f.space->Free(RequestId(1)));
  EXPECT_EQ(f.space->num_live_addresses(), 3u);
  for (LogicalAddr x : a) EXPECT_EQ(ReadEntry(*f.space, x, 0), Pattern(x, 0, 32));
  // A new request adopts the cached run; releasing the cache's reference keeps it alive.
  ASSERT_TRUE(f.space->AddRequest(RequestId(2), Rank(0)));
  ASSERT_TRUE(f.space->ShareInto(RequestId(2), std::span(a).first(2)));
  ASSERT_TRUE(f.space->Release(a));
  EXPECT_TRUE(f.space->IsLive(a[0]));
  EXPECT_TRUE(f.space->IsLive(a[1]));
  EXPECT_FALSE(f.space->IsLive(a[2]));  // only the cache held it
  EXPECT_TRUE(f.space->CheckInvariants());
  ASSERT_TRUE(f.space->Free(RequestId(2)));
  EXPECT_EQ(f.space->num_live_addresses(), 0u);
  EXPECT_TRUE(f.space->CheckInvariants());
}

TEST(Sharing, BadSharingCallsAreRefusedAndChangeNothing) {
  SpaceFixture f(SmallConfig(4, 4, 2));
  auto a = f.AddFilled(RequestId(1), Rank(0), 3);
  auto b = f.AddFilled(RequestId(2), Rank(1), 2);
  auto gone = f.AddFilled(RequestId(3), Rank(0), 1);
  ASSERT_TRUE(f.space->Free(RequestId(3)));
  ASSERT_TRUE(f.space->AddRequest(RequestId(4), Rank(0)));
  f.requests.push_back(RequestId(4));
  ASSERT_TRUE(f.space->ShareInto(RequestId(4), std::span(a).first(1)));
  ASSERT_TRUE(f.space->Retain(std::span(a).last(1)));
  const auto before = f.Take();
  auto expect = [&](Status s, ErrorCode code, const char* what) {
    ASSERT_FALSE(s) << what;
    EXPECT_EQ(s.error().code(), code) << what << ": " << s.error().ToString();
    EXPECT_EQ(f.Take(), before) << what;
  };
  const std::vector<LogicalAddr> freed{a[1], gone[0]};
  const std::vector<LogicalAddr> twice{a[1], a[1]};
  const std::vector<LogicalAddr> mixed_rank{a[1], b[0]};
  const std::vector<LogicalAddr> never{LogicalAddr(1000)};
  expect(f.space->ShareInto(RequestId(9), std::span(a).first(1)), ErrorCode::kNotFound, "unknown request");
  expect(f.space->ShareInto(RequestId(4), freed), ErrorCode::kNotFound, "adopting a freed address");
  expect(f.space->ShareInto(RequestId(4), never), ErrorCode::kNotFound, "adopting a never-allocated address");
  expect(f.space->ShareInto(RequestId(4), mixed_rank), ErrorCode::kInvalidArgument, "another rank's address");
  expect(f.space->ShareInto(RequestId(4), twice), ErrorCode::kInvalidArgument, "listed twice");
  expect(f.space->ShareInto(RequestId(4), std::span(a).first(2)), ErrorCode::kAlreadyExists, "already adopted");
  expect(f.space->ShareInto(RequestId(1), std::span(a).last(1)), ErrorCode::kAlreadyExists, "its own address");
  expect(f.space->Retain(freed), ErrorCode::kNotFound, "retaining a freed address");
  expect(f.space->Retain(twice), ErrorCode::kInvalidArgument, "retain listed twice");
  expect(f.space->Release(std::span(a).first(1)), ErrorCode::kFailedPrecondition, "release without a cache reference");
  expect(f.space->Release(freed), ErrorCode::kNotFound, "release of a freed address");
  ASSERT_TRUE(f.space->Release(std::span(a).last(1)));
  const auto after_release = f.Take();
  auto twice_released = f.space->Release(std::span(a).last(1));
  ASSERT_FALSE(twice_released);
  EXPECT_EQ(twice_released.error().code(), ErrorCode::kFailedPrecondition);
  EXPECT_EQ(f.Take(), after_release);
  EXPECT_TRUE(f.space->CheckInvariants());
}

TEST(Sharing, IsolationAcceptsAdoptedAddressesAndStillRefusesForeignAndReusedOnes) {
  // Addresses one by one (page_tokens 1): a freed address comes back while its page
  // neighbours are still live (with pages, a page returns only once all of it is free).
  AddressSpaceConfig config = SmallConfig(8, 8);
  config.page_tokens = 1;
  SpaceFixture f(config);
  auto a = f.AddFilled(RequestId(1), Rank(0), 4);
  ASSERT_TRUE(f.space->AddRequest(RequestId(2), Rank(0)));
  f.requests.push_back(RequestId(2));
  ASSERT_TRUE(f.space->ShareInto(RequestId(2), std::span(a).first(2)));
  f.AddFilled(RequestId(3), Rank(0), 1);
  f.space->AdvanceRound();
  std::vector<SlotId> slots(2);
  const std::vector<LogicalAddr> shared{a[1], a[0]};
  // Both sharers may select the shared entries.
  ASSERT_TRUE(f.planner.Step({Rank(0), GroupId(0), shared, Runs(RequestId(2), 2)}, slots));
  ASSERT_TRUE(f.planner.Step({Rank(0), GroupId(0), shared, Runs(RequestId(1), 2)}, slots));
  // The adopter may not select what it did not adopt; a third request none of them.
  auto before = f.Take();
  const std::vector<LogicalAddr> not_adopted{a[0], a[2]};
  auto r = f.planner.Step({Rank(0), GroupId(0), not_adopted, Runs(RequestId(2), 2)}, slots);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code(), ErrorCode::kNotFound);
  EXPECT_EQ(f.Take(), before);
  r = f.planner.Step({Rank(0), GroupId(0), shared, Runs(RequestId(3), 2)}, slots);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code(), ErrorCode::kNotFound);
  EXPECT_EQ(f.Take(), before);
  // The allocator goes: the adopter still reads its shared entries, not the freed one.
  ASSERT_TRUE(f.space->Free(RequestId(1)));
  f.requests.erase(f.requests.begin());
  ASSERT_TRUE(f.planner.Step({Rank(0), GroupId(0), shared, Runs(RequestId(2), 2)}, slots));
  for (std::size_t i = 0; i < 2; ++i) {
    const std::byte* p = f.space->DeviceSlotData(Rank(0), GroupId(0), slots[i]);
    ASSERT_NE(p, nullptr);
    const auto want = Pattern(shared[i], 0, 32);
    EXPECT_TRUE(std::equal(want.begin(), want.end(), p));
  }
  // a[2], a[3] were freed and are reused by request 5: the adopter (who never held them)
  // and the reuser's neighbour are refused; the reuser is served.
  auto reused = f.AddFilled(RequestId(5), Rank(0), 8 - 3);
  ASSERT_TRUE(std::find(reused.begin(), reused.end(), a[2]) != reused.end());
  f.space->AdvanceRound();
  before = f.Take();
  const std::vector<LogicalAddr> stale{a[0], a[2]};
  r = f.planner.Step({Rank(0), GroupId(0), stale, Runs(RequestId(2), 2)}, slots);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code(), ErrorCode::kNotFound);
  EXPECT_EQ(f.Take(), before);
  // Now request 5 adopts the shared prefix too: all three hold it.
  ASSERT_TRUE(f.space->ShareInto(RequestId(5), std::span(a).first(2)));
  std::vector<SelectionRun> runs{{RequestId(5), 1}, {RequestId(2), 1}};
  ASSERT_TRUE(f.planner.Step({Rank(0), GroupId(0), shared, runs}, slots));
  EXPECT_TRUE(f.space->CheckInvariants());
}

// Dedup across requests: selections of requests that share a prefix are
// deduplicated in the step: every shared entry is counted, and copied, once.
TEST(Sharing, PlannerDedupsSharedPrefixSelectionsAcrossRequestsExactly) {
  SpaceFixture f(SmallConfig(16, 32));
  // Fill the device with a filler request so that the prefix and own tokens go to host.
  auto filler = f.AddFilled(RequestId(9), Rank(0), 16);
  auto prefix = f.AddFilled(RequestId(1), Rank(0), 6);  // request 1: 6 prefix tokens + 2 own
  auto own1 = f.Extend(RequestId(1), 2);
  std::vector<std::vector<LogicalAddr>> own(4);
  own[0] = own1;
  for (std::uint64_t r = 2; r <= 4; ++r) {
    ASSERT_TRUE(f.space->AddRequest(RequestId(r), Rank(0)));
    f.requests.push_back(RequestId(r));
    ASSERT_TRUE(f.space->ShareInto(RequestId(r), prefix));
    own[r - 1] = f.Extend(RequestId(r), 2);
  }
  EXPECT_EQ(f.space->num_live_addresses(), 16u + 6 + 4 * 2);
  EXPECT_EQ(f.space->NumUsed(Rank(0), GroupId(0), Tier::kHost), 6u + 4 * 2);  // the prefix once, not 4 times
  f.space->AdvanceRound();
  // Each request selects 4 of the prefix (requests 1, 3 the first four; 2, 4 the last four)
  // and both its own tokens, twice each (two queries).
  std::vector<LogicalAddr> sel;
  std::vector<SelectionRun> runs;
  for (std::uint64_t r = 1; r <= 4; ++r) {
    for (int q = 0; q < 2; ++q) {
      const std::size_t first = (r % 2 == 1) ? 0 : 2;
      for (std::size_t i = first; i < first + 4; ++i) sel.push_back(prefix[i]);
      sel.insert(sel.end(), own[r - 1].begin(), own[r - 1].end());
      runs.push_back({RequestId(r), 6});
    }
  }
  std::vector<SlotId> slots(sel.size());
  auto stats = f.planner.Step({Rank(0), GroupId(0), sel, runs}, slots);
  ASSERT_TRUE(stats) << stats.error().ToString();
  EXPECT_EQ(stats->selections, 48u);         // 4 requests x 2 queries x (4 + 2)
  EXPECT_EQ(stats->distinct, 6u + 4 * 2);    // the whole prefix once + every request's own
  EXPECT_EQ(stats->misses, 14u);             // all on host: each copied once
  EXPECT_EQ(stats->hits, 0u);
  EXPECT_EQ(stats->evictions, 14u);          // the device is full of the filler
  EXPECT_EQ(stats->bytes_moved, 14u * 2 * 32);  // swaps: both directions, once per distinct entry
  for (std::size_t i = 0; i < sel.size(); ++i) {
    const std::byte* p = f.space->DeviceSlotData(Rank(0), GroupId(0), slots[i]);
    ASSERT_NE(p, nullptr);
    const auto want = Pattern(sel[i], 0, 32);
    ASSERT_TRUE(std::equal(want.begin(), want.end(), p)) << "selection " << i;
  }
  EXPECT_TRUE(f.space->CheckInvariants());
  (void)filler;
}

// Randomized against a shadow model of the holders: requests allocate, adopt runs of other
// requests' addresses on their rank, a "cache" retains and releases, requests are freed;
// every live address is readable with its bytes, freed exactly when its last holder goes.
TEST(Sharing, RandomSharingMatchesAShadowOfTheHolders) {
  ULA_TEST_SEEDED(seed, 20261201);
  std::mt19937_64 rng(seed);
  SpaceFixture f(SmallConfig(24, 40, 2));
  std::map<std::uint64_t, std::pair<Rank, std::vector<LogicalAddr>>> reqs;  // shadow request lists
  std::map<std::uint32_t, std::uint32_t> cache;                               // shadow cache references
  std::uint64_t next = 1;
  auto pick = [&](auto& m) { auto it = m.begin(); std::advance(it, rng() % m.size()); return it; };
  for (int op = 0; op < 1500; ++op) {
    const int kind = static_cast<int>(rng() % 10);
    if (kind < 2 || reqs.empty()) {
      const Rank rank(static_cast<std::uint16_t>(rng() % 2));
      ASSERT_TRUE(f.space->AddRequest(RequestId(next), rank));
      reqs[next++] = {rank, {}};
    } else if (kind < 4) {
      auto it = pick(reqs);
      auto got = f.space->Allocate(RequestId(it->first), 1 + static_cast<std::uint32_t>(rng() % 4));
      if (!got) {
        ASSERT_EQ(got.error().code(), ErrorCode::kResourceExhausted);
        continue;
      }
      for (LogicalAddr a : *got) ASSERT_TRUE(f.space->Write(a, GroupId(0), Pattern(a, 0, 32, 1)));
      it->second.second.insert(it->second.second.end(), got->begin(), got->end());
    } else if (kind < 6) {  // adopt a run of another request's addresses
      auto to = pick(reqs), from = pick(reqs);
      if (to == from || to->second.first != from->second.first || from->second.second.empty()) continue;
      const auto& src = from->second.second;
      const std::size_t len = 1 + rng() % std::min<std::size_t>(src.size(), 5);
      std::vector<LogicalAddr> run(src.begin(), src.begin() + static_cast<std::ptrdiff_t>(len));
      const bool dup = std::any_of(run.begin(), run.end(), [&](LogicalAddr a) {
        return std::find(to->second.second.begin(), to->second.second.end(), a) != to->second.second.end();
      });
      const auto digest = f.space->DebugDigest();
      auto s = f.space->ShareInto(RequestId(to->first), run);
      if (dup) {
        ASSERT_FALSE(s);
        ASSERT_EQ(s.error().code(), ErrorCode::kAlreadyExists);
        ASSERT_EQ(f.space->DebugDigest(), digest);
        continue;
      }
      ASSERT_TRUE(s) << s.error().ToString();
      to->second.second.insert(to->second.second.end(), run.begin(), run.end());
    } else if (kind < 7) {  // the cache retains a request's addresses
      auto it = pick(reqs);
      if (it->second.second.empty()) continue;
      ASSERT_TRUE(f.space->Retain(it->second.second));
      for (LogicalAddr a : it->second.second) ++cache[a.value()];
    } else if (kind < 8 && !cache.empty()) {  // the cache releases one address (maybe twice)
      auto it = pick(cache);
      const LogicalAddr a(it->first);
      ASSERT_TRUE(f.space->Release(std::span(&a, 1)));
      if (--it->second == 0) cache.erase(it);
    } else {
      auto it = pick(reqs);
      ASSERT_TRUE(f.space->Free(RequestId(it->first)));
      reqs.erase(it);
    }
    // Shadow holders against the space.
    std::map<std::uint32_t, std::uint32_t> holders(cache);
    for (const auto& [id, r] : reqs) {
      for (LogicalAddr a : r.second) {
        ++holders[a.value()];
        ASSERT_TRUE(f.space->Holds(RequestId(id), a));
      }
    }
    ASSERT_EQ(f.space->num_live_addresses(), holders.size()) << "op " << op;
    for (const auto& [a, n] : holders) {
      ASSERT_EQ(f.space->RefCount(LogicalAddr(a)), n) << "address " << a;
      ASSERT_EQ(ReadEntry(*f.space, LogicalAddr(a), 0), Pattern(LogicalAddr(a), 0, 32, 1)) << "address " << a;
    }
    if (op % 50 == 0) {
      auto inv = f.space->CheckInvariants();
      ASSERT_TRUE(inv) << inv.error().ToString();
    }
  }
  ASSERT_TRUE(f.space->CheckInvariants());
}


// Owner tags are 32 bits: after 2^32 - 2 requests the next AddRequest renumbers the live
// requests 1..n and re-tags each one's own allocations. An adopted address keeps its
// allocator's tag (or the shared tag): renumbering must not hand it to its adopter, and the
// isolation check must still tell adopters, allocators and strangers apart.
TEST(Sharing, OwnerTagWrapKeepsAdoptedPrefixesAdopted) {
  SpaceFixture f(SmallConfig(16, 16));
  auto a = f.AddFilled(RequestId(1), Rank(0), 6);
  ASSERT_TRUE(f.space->AddRequest(RequestId(2), Rank(0)));
  f.requests.push_back(RequestId(2));
  ASSERT_TRUE(f.space->ShareInto(RequestId(2), std::span(a).first(3)));
  auto b = f.AddFilled(RequestId(3), Rank(0), 2);
  ASSERT_TRUE(f.space->ShareInto(RequestId(3), std::span(a).subspan(1, 1)));
  // And the other way round (the adopter registered before its allocator), so that whatever
  // order the renumbering visits the requests in, one adopter comes after its allocator.
  ASSERT_TRUE(f.space->AddRequest(RequestId(8), Rank(0)));
  auto c = f.AddFilled(RequestId(9), Rank(0), 3);
  f.requests.push_back(RequestId(8));
  ASSERT_TRUE(f.space->ShareInto(RequestId(8), std::span(c).first(2)));
  StateOf(*f.space).dir.set_next_tag_for_test(kSharedTag);  // as after 2^32 - 2 requests
  ASSERT_TRUE(f.space->AddRequest(RequestId(4), Rank(0)));  // the wrap: renumbered
  f.requests.push_back(RequestId(4));
  ASSERT_TRUE(f.space->CheckInvariants()) << f.space->CheckInvariants().error().ToString();
  f.space->AdvanceRound();
  std::vector<SlotId> slots(3);
  const std::vector<LogicalAddr> prefix(a.begin(), a.begin() + 3);
  ASSERT_TRUE(f.planner.Step({Rank(0), GroupId(0), prefix, Runs(RequestId(1), 3)}, slots)) << "the allocator";
  ASSERT_TRUE(f.planner.Step({Rank(0), GroupId(0), prefix, Runs(RequestId(2), 3)}, slots)) << "the adopter";
  const auto before = f.Take();
  const std::vector<LogicalAddr> not_adopted{a[0], a[3], b[0]};
  auto r = f.planner.Step({Rank(0), GroupId(0), not_adopted, Runs(RequestId(2), 3)}, slots);
  ASSERT_FALSE(r) << "the adopter may not read what it did not adopt";
  EXPECT_EQ(r.error().code(), ErrorCode::kNotFound);
  r = f.planner.Step({Rank(0), GroupId(0), prefix, Runs(RequestId(4), 3)}, slots);
  ASSERT_FALSE(r) << "a new request holds nothing";
  EXPECT_EQ(r.error().code(), ErrorCode::kNotFound);
  const std::vector<LogicalAddr> c_all(c.begin(), c.end());
  r = f.planner.Step({Rank(0), GroupId(0), c_all, Runs(RequestId(8), 3)}, slots);
  ASSERT_FALSE(r) << "the other adopter may not read what it did not adopt";
  EXPECT_EQ(f.Take(), before);
  ASSERT_TRUE(f.planner.Step({Rank(0), GroupId(0), c_all, Runs(RequestId(9), 3)}, slots)) << "its allocator";
  // The allocator goes: what it shared stays live for the adopters and nothing else.
  ASSERT_TRUE(f.space->Free(RequestId(1)));
  f.requests.erase(f.requests.begin());
  for (std::size_t i = 0; i < 6; ++i) EXPECT_EQ(f.space->IsLive(a[i]), i < 3) << "address " << i;
  EXPECT_EQ(f.space->RefCount(a[1]), 2u);
  ASSERT_TRUE(f.planner.Step({Rank(0), GroupId(0), prefix, Runs(RequestId(2), 3)}, slots));
  ASSERT_TRUE(f.space->CheckInvariants()) << f.space->CheckInvariants().error().ToString();
}
}  // namespace
}  // namespace ula
