// Op sequences against the prefix cache on a unified buffer (three kinds, lazy or eager
// compaction): finished sequences inserted (sharing the tree's pages through a locked
// match, checkpoints at page boundaries and off them), matches, locks and unlocks,
// evictions for demands of every size by both rules, compaction. Properties after every
// op: both structures' CheckInvariants; a match is no longer than asked and its pages and
// checkpoint are live; every block the cache was given holds its bytes while it is live;
// a locked match's pages stay live and unmoved; after a successful MakeRoom the demand fits.
#include <algorithm>
#include <cstring>
#include <map>
#include <memory>
#include <vector>

#include "fuzz_input.h"
#include "ula/prefix_cache.h"
#include "ula/unified_buffer.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace ula;
  fuzz::FuzzInput in(data, size);
  constexpr std::uint32_t kPage = 4;
  const BlockKind kState(0), kKv(1), kSwa(2);
  UnifiedBufferConfig c;
  c.alignment = 64;
  c.capacity_bytes = in.In(40, 240) * 64;
  c.kinds = {{"state", 192, BufferEnd::kLow}, {"kv", 64, BufferEnd::kHigh}, {"swa", 64, BufferEnd::kLow}};
  c.padding_kind = kKv;
  c.padding_blocks = 1;
  c.compaction = in.Bool() ? CompactionMode::kEager : CompactionMode::kLazy;
  auto buffer = UnifiedBuffer::Create(c);
  if (!buffer) return 0;
  auto cache = PrefixCache::Create(PrefixCacheConfig{.page_tokens = kPage}, buffer->get());
  FUZZ_OK(cache);
  UnifiedBuffer& buf = **buffer;
  PrefixCache& pc = **cache;

  std::map<std::uint32_t, std::vector<std::byte>> given;  // block id -> bytes, every block handed to the cache
  std::vector<PrefixMatch> locked;
  std::uint8_t fill = 1;
  auto write = [&](BlockId id) {
    auto bytes = buf.Bytes(id);
    FUZZ_OK(bytes);
    std::vector<std::byte> b(bytes->size());
    for (auto& x : b) x = std::byte(fill++);
    std::memcpy(bytes->data(), b.data(), b.size());
    given[id.value()] = std::move(b);
  };
  auto tokens = [&](std::uint32_t max_len) {
    std::vector<std::uint32_t> t(in.In(1, max_len));
    const std::uint32_t alphabet = in.In(1, 3);  // few symbols: shared prefixes
    for (auto& x : t) x = in.In(0, alphabet);
    return t;
  };
  auto check_match = [&](const PrefixMatch& m, std::size_t n, std::uint32_t max_length) {
    FUZZ_CHECK(m.length <= max_length && m.length <= n, "a match longer than asked");
    FUZZ_CHECK(m.pages.size() == (m.length + kPage - 1) / kPage, "a match's pages do not cover it");
    FUZZ_CHECK(m.checkpoint.valid() == (m.length > 0), "a match without its checkpoint");
    for (BlockId p : m.pages) FUZZ_CHECK(buf.KindOf(p).has_value(), "a match names a dead page");
    if (m.length > 0) {
      FUZZ_CHECK(buf.KindOf(m.checkpoint.state).has_value() && buf.KindOf(m.checkpoint.window).has_value(),
                 "a match names a dead checkpoint");
    }
  };

  for (int op = 0; op < 200 && !in.empty(); ++op) {
    switch (in.Byte() % 6) {
      case 0: {  // insert a finished sequence
        const auto t = tokens(24);
        const std::uint32_t num_pages = (static_cast<std::uint32_t>(t.size()) + kPage - 1) / kPage;
        PrefixMatch m;
        if (in.Bool()) {
          m = pc.Match(t, static_cast<std::uint32_t>(t.size()));
          check_match(m, t.size(), static_cast<std::uint32_t>(t.size()));
          FUZZ_OK(pc.Lock(m));
        }
        const std::uint32_t shared = m.length / kPage;
        std::vector<std::uint32_t> positions = {static_cast<std::uint32_t>(t.size())};
        for (std::uint32_t p = kPage; p < t.size(); p += kPage) {
          if (in.Byte() % 3 == 0) positions.push_back(p);
        }
        if (in.Byte() % 5 == 0) positions.push_back(in.In(1, static_cast<std::uint32_t>(t.size())));
        std::sort(positions.begin(), positions.end());  // one checkpoint per position (prefix_cache.h)
        positions.erase(std::unique(positions.begin(), positions.end()), positions.end());
        Demand d = Demand::Of(3);
        d.blocks[kKv.value()] = num_pages - shared;
        d.blocks[kState.value()] = static_cast<std::uint32_t>(positions.size());
        d.blocks[kSwa.value()] = static_cast<std::uint32_t>(positions.size());
        const bool fits = buf.CanAllocate(d) || pc.MakeRoom(d, in.Bool() ? EvictionRule::kNaive
                                                                         : EvictionRule::kAllocationAware).has_value();
        if (m.length > 0) FUZZ_OK(pc.Unlock(m));
        if (!fits) break;
        auto ids = buf.AllocateDemand(d);
        FUZZ_OK(ids);
        const std::size_t cps = positions.size();
        std::vector<BlockId> pages(m.pages.begin(), m.pages.begin() + shared);
        for (std::uint32_t i = 0; i < num_pages - shared; ++i) {
          pages.push_back((*ids)[cps + i]);
          write(pages.back());
        }
        std::vector<PositionedCheckpoint> checkpoints;
        for (std::size_t i = 0; i < cps; ++i) {
          const Checkpoint cp{(*ids)[i], (*ids)[cps + num_pages - shared + i]};
          write(cp.state);
          write(cp.window);
          checkpoints.push_back({positions[i], cp});
        }
        FUZZ_OK(pc.Insert(t, pages, checkpoints));
        break;
      }
      case 1: {
        const auto t = tokens(28);
        const std::uint32_t max_length = in.In(0, static_cast<std::uint32_t>(t.size()));
        check_match(pc.Match(t, max_length), t.size(), max_length);
        break;
      }
      case 2: {
        const auto t = tokens(28);
        PrefixMatch m = pc.Match(t, static_cast<std::uint32_t>(t.size()));
        check_match(m, t.size(), static_cast<std::uint32_t>(t.size()));
        if (m.length > 0) {
          FUZZ_OK(pc.Lock(m));
          locked.push_back(std::move(m));
        }
        break;
      }
      case 3:
        if (!locked.empty()) {
          const std::uint32_t i = in.In(0, static_cast<std::uint32_t>(locked.size() - 1));
          FUZZ_OK(pc.Unlock(locked[i]));
          locked.erase(locked.begin() + i);
        }
        break;
      case 4: {
        Demand d = Demand::Of(3);
        for (auto& n : d.blocks) n = in.Byte() < 230 ? in.In(0, 8) : in.In(0, 500);
        auto stats = pc.MakeRoom(d, in.Bool() ? EvictionRule::kNaive : EvictionRule::kAllocationAware);
        if (stats) FUZZ_CHECK(buf.CanAllocate(d), "MakeRoom succeeded but the demand does not fit");
        break;
      }
      default:
        buf.Compact();
        break;
    }
    FUZZ_OK(pc.CheckInvariants());
    FUZZ_OK(buf.CheckInvariants());
    for (auto it = given.begin(); it != given.end();) {
      auto bytes = buf.Bytes(BlockId(it->first));
      if (!bytes) {  // evicted (or freed as a duplicate): ids carry generations, never reused
        it = given.erase(it);
        continue;
      }
      FUZZ_CHECK(bytes->size() == it->second.size() && std::memcmp(bytes->data(), it->second.data(), it->second.size()) == 0,
                 "block " + std::to_string(it->first) + " lost its bytes");
      ++it;
    }
    for (const PrefixMatch& m : locked) {
      for (BlockId p : m.pages) FUZZ_CHECK(buf.KindOf(p).has_value(), "a locked page was evicted");
    }
  }
  for (const PrefixMatch& m : locked) FUZZ_OK(pc.Unlock(m));
  FUZZ_OK(pc.CheckInvariants());
  return 0;
}
