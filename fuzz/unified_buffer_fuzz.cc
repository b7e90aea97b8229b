// Op sequences against the unified buffer (three kinds at both ends, lazy or eager
// compaction): demands of every size (also too large ones), frees and pins and unpins of
// live, freed and made-up ids, compaction, overwrites. Properties after every op:
// CheckInvariants; CanAllocate agrees with AllocateDemand; every live block holds the bytes
// last written; a pinned block never moves; a refused call changes nothing (live blocks).
#include <cstring>
#include <map>
#include <memory>
#include <vector>

#include "fuzz_input.h"
#include "ula/unified_buffer.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace ula;
  fuzz::FuzzInput in(data, size);
  constexpr std::uint64_t kUnit = 64;
  UnifiedBufferConfig c;
  c.alignment = kUnit;
  c.capacity_bytes = in.In(16, 200) * kUnit;
  c.kinds = {{"state", in.In(1, 4) * kUnit, BufferEnd::kLow},
             {"kv", in.In(1, 2) * kUnit, BufferEnd::kHigh},
             {"swa", in.In(1, 6) * kUnit, in.Bool() ? BufferEnd::kLow : BufferEnd::kHigh}};
  c.padding_kind = BlockKind(1);
  c.padding_blocks = in.In(0, 2);
  c.compaction = in.Bool() ? CompactionMode::kEager : CompactionMode::kLazy;
  auto created = UnifiedBuffer::Create(c);
  if (!created) return 0;
  UnifiedBuffer& buffer = **created;

  struct Shadow {
    std::vector<std::byte> bytes;
    std::uint32_t pins = 0;
    std::uint64_t pinned_offset = 0;
  };
  std::map<std::uint32_t, Shadow> live;
  std::vector<std::uint32_t> freed;
  std::uint8_t fill = 1;
  auto write = [&](std::uint32_t id) {
    auto bytes = buffer.Bytes(BlockId(id));
    FUZZ_OK(bytes);
    Shadow& s = live[id];
    s.bytes.resize(bytes->size());
    for (auto& b : s.bytes) b = std::byte(fill++);
    std::memcpy(bytes->data(), s.bytes.data(), s.bytes.size());
  };
  auto pick = [&]() -> std::uint32_t {
    const std::uint32_t how = in.Byte() % 8;
    if (how == 0 || (live.empty() && freed.empty())) return in.U16() | (in.U16() << 16);  // made up
    if (how == 1 && !freed.empty()) return freed[in.In(0, static_cast<std::uint32_t>(freed.size() - 1))];
    if (live.empty()) return freed.back();
    auto it = live.begin();
    std::advance(it, in.In(0, static_cast<std::uint32_t>(live.size() - 1)));
    return it->first;
  };

  for (int op = 0; op < 300 && !in.empty(); ++op) {
    const auto before = buffer.LiveBlocks();
    bool refused = false;
    switch (in.Byte() % 6) {
      case 0: {
        Demand d = Demand::Of(in.In(0, 9) == 0 ? 2 : 3);  // now and then a demand of the wrong shape
        for (auto& n : d.blocks) n = in.Byte() < 240 ? in.In(0, 6) : in.In(0, 1000);
        const bool can = buffer.CanAllocate(d);
        auto ids = buffer.AllocateDemand(d);
        FUZZ_CHECK(can == ids.has_value(), "CanAllocate disagrees with AllocateDemand");
        refused = !ids;
        if (ids) {
          for (BlockId id : *ids) {
            FUZZ_CHECK(!live.contains(id.value()), "a live id handed out twice");
            write(id.value());
          }
        }
        break;
      }
      case 1: {
        const std::uint32_t id = pick();
        const bool ok = buffer.Free(BlockId(id)).has_value();
        FUZZ_CHECK(ok == (live.contains(id) && live[id].pins == 0), "Free of a pinned, freed or unknown id");
        refused = !ok;
        if (ok) {
          live.erase(id);
          freed.push_back(id);
        }
        break;
      }
      case 2: {
        const std::uint32_t id = pick();
        const bool known = live.contains(id);
        if (known && live[id].pins == 0) live[id].pinned_offset = buffer.Offset(BlockId(id)).value();
        const bool ok = buffer.Pin(BlockId(id)).has_value();
        FUZZ_CHECK(ok == known, "Pin of a live id succeeds, of any other fails");
        refused = !ok;
        if (ok) ++live[id].pins;
        break;
      }
      case 3: {
        const std::uint32_t id = pick();
        const bool pinned = live.contains(id) && live[id].pins > 0;
        const bool ok = buffer.Unpin(BlockId(id)).has_value();
        FUZZ_CHECK(ok == pinned, "Unpin of a pinned id succeeds, of any other fails");
        refused = !ok;
        if (ok) --live[id].pins;
        break;
      }
      case 4:
        buffer.Compact();
        break;
      default:
        if (!live.empty()) {
          auto it = live.begin();
          std::advance(it, in.In(0, static_cast<std::uint32_t>(live.size() - 1)));
          write(it->first);
        }
        break;
    }
    if (refused) FUZZ_CHECK(buffer.LiveBlocks() == before, "a refused call changed the live blocks");
    FUZZ_OK(buffer.CheckInvariants());
    for (auto& [id, s] : live) {
      auto bytes = buffer.Bytes(BlockId(id));
      FUZZ_OK(bytes);
      FUZZ_CHECK(bytes->size() == s.bytes.size() && std::memcmp(bytes->data(), s.bytes.data(), s.bytes.size()) == 0,
                 "block " + std::to_string(id) + " lost its bytes");
      if (s.pins > 0) FUZZ_CHECK(buffer.Offset(BlockId(id)).value() == s.pinned_offset, "a pinned block moved");
    }
  }
  return 0;
}
