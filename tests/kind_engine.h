// KindEngine: a test engine over a DP space with DeepSeek-V4-Flash's kinds (v4_flash.h). It
// plays the engine over a shadow of the kinds the space holds no bytes of: a token's hidden
// state is a hash of the tokens up to it; the window row of token t is that hash, written at
// the block KindPagesOf names; a compressor state's row t mod E holds it, and the entry a
// block's last token completes is a hash of the state's rows (C4 through the space's Write in
// every group, C128 into the shadow). Reads(r) is everything r's next token reads, so a request
// that resumed from a shared prefix must read what a twin that computed everything reads
// (kind_prefix_test, sparse_prefix_kinds_test).
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "v4_flash.h"
#include "ula/address_space.h"
#include "ula/backend.h"

namespace ula::test {

inline constexpr std::uint32_t kDrafts = 3;
inline constexpr std::uint32_t kUnit = 256;  // V4 at 64 addresses a page: lcm(128, 4 x 64, 64)

inline std::uint64_t KindMix(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

struct KindEngine {
  std::unique_ptr<Backend> backend;
  std::unique_ptr<AddressSpace> space;
  std::uint32_t window = 0, c4 = 0, c128 = 0, s4 = 0, s4i = 0, s128 = 0;
  std::unordered_map<std::uint64_t, std::uint64_t> shadow;  // (kind, block, row) -> the row's value
  std::unordered_map<std::uint32_t, std::vector<std::uint32_t>> seq;  // request -> its tokens

  explicit KindEngine(bool bytes, std::uint32_t device_entries, std::uint32_t host_entries)
      : backend(bytes ? MakeCpuBackend({.copy_threads = 0}) : MakeCountingBackend()) {
    const AddressSpaceConfig c = FlashSpaceConfig(device_entries, host_entries, kDrafts);
    auto s = AddressSpace::Create(c, *backend);
    EXPECT_TRUE(s) << s.error().ToString();
    space = std::move(*s);
    for (std::uint32_t k = 0; k < c.kinds.size(); ++k) {
      const std::string& n = c.kinds[k].name;
      if (n == "window") window = k;
      if (n == "c4") c4 = k;
      if (n == "c128") c128 = k;
      if (n == "c4_state") s4 = k;
      if (n == "c4_index_state") s4i = k;
      if (n == "c128_state") s128 = k;
    }
  }
  static std::uint64_t Key(std::uint32_t kind, std::uint32_t block, std::uint32_t row) {
    return (std::uint64_t{kind} << 48) | (std::uint64_t{block} << 8) | row;
  }
  std::uint64_t Shadow(std::uint32_t kind, std::uint32_t block, std::uint32_t row) const {
    auto it = shadow.find(Key(kind, block, row));
    return it == shadow.end() ? 0 : it->second;
  }
  KindPages Pages(RequestId r, std::uint32_t k) const {
    auto p = space->KindPagesOf(r, k);
    EXPECT_TRUE(p) << p.error().ToString();
    return p ? *p : KindPages{};
  }
  // The window ring's block of token t: its live tokens are [tokens - entries, tokens).
  static std::uint32_t RingBlock(const KindPages& w, std::uint32_t t) {
    const std::uint32_t first = w.tokens - w.entries;
    return w.blocks.at(t / kKindBlockEntries - first / kKindBlockEntries);
  }
  std::uint64_t Hidden(RequestId r, std::uint32_t t) const {
    std::uint64_t h = 0;
    const std::vector<std::uint32_t>& s = seq.at(r.value());
    for (std::uint32_t i = 0; i <= t; ++i) h = KindMix(h ^ s[i]);
    return h;
  }
  std::vector<std::byte> EntryBytes(std::uint64_t v, GroupId g) const {
    std::vector<std::byte> out(space->config().entry_bytes_of(g));
    for (std::size_t i = 0; i < out.size(); i += 8) {
      const std::uint64_t w = KindMix(v ^ (std::uint64_t{g.value()} << 32) ^ i);
      for (std::size_t b = 0; b < 8 && i + b < out.size(); ++b) out[i + b] = std::byte(w >> (8 * b));
    }
    return out;
  }
  // A compressor's entry of its state's rows [0, E): what completes a block.
  std::uint64_t Compress(std::uint32_t state, std::uint32_t block, std::uint32_t E) const {
    std::uint64_t v = E;
    for (std::uint32_t i = 0; i < E; ++i) v = KindMix(v ^ Shadow(state, block, i));
    return v;
  }
  // Allocates n tokens of r's sequence and computes them, as a prefill chunk or a decode.
  void Run(RequestId r, std::uint32_t n) {
    const std::uint32_t from = Pages(r, window).tokens;
    auto made = space->Allocate(r, n);
    ASSERT_TRUE(made) << made.error().ToString();
    const KindPages w = Pages(r, window), st4 = Pages(r, s4), st4i = Pages(r, s4i), st128 = Pages(r, s128);
    std::uint64_t h = from == 0 ? 0 : Hidden(r, from - 1);
    for (std::uint32_t t = from; t < from + n; ++t) {
      h = KindMix(h ^ seq.at(r.value())[t]);
      shadow[Key(window, RingBlock(w, t), t % 64)] = h;
      shadow[Key(s4, st4.blocks[0], t % 4)] = h;
      shadow[Key(s4i, st4i.blocks[0], t % 4)] = ~h;
      shadow[Key(s128, st128.blocks[0], t % 128)] = h;
      if (t % 4 == 3) {
        const std::uint64_t v = Compress(s4, st4.blocks[0], 4);
        const LogicalAddr a = (*space->AddressesOf(r))[t / 4];
        for (std::uint32_t g = 0; g < space->config().num_groups; ++g) {
          ASSERT_TRUE(space->Write(a, GroupId(g), EntryBytes(v, GroupId(g))));
        }
      }
      if (t % 128 == 127) {
        const KindPages c = Pages(r, c128);
        const std::uint32_t j = t / 128;
        shadow[Key(c128, c.blocks.at(j / 64), j % 64)] = Compress(s128, st128.blocks[0], 128);
      }
    }
  }
  // The engine runs a share's copies (the last C128 block's entries).
  void Copy(const PrefixShare& share) {
    for (const KindBlockCopy& c : share.copies) {
      for (std::uint32_t i = 0; i < c.entries; ++i) {
        shadow[Key(c.kind, c.dst_block, i)] = Shadow(c.kind, c.src_block, i);
      }
    }
  }
  // Everything r's next token reads: the window, every C4 entry (every group's bytes), every
  // C128 entry, the compressor states' filled rows.
  std::vector<std::uint64_t> Reads(RequestId r) const {
    std::vector<std::uint64_t> out;
    const KindPages w = Pages(r, window), c = Pages(r, c128);
    const std::uint32_t T = w.tokens;
    for (std::uint32_t t = T > 127 ? T - 127 : 0; t < T; ++t) out.push_back(Shadow(window, RingBlock(w, t), t % 64));
    const std::span<const LogicalAddr> addrs = *space->AddressesOf(r);
    EXPECT_EQ(addrs.size(), T / 4);
    for (const LogicalAddr a : addrs) {
      std::uint64_t v = 0;
      for (std::uint32_t g = 0; g < space->config().num_groups; ++g) {
        std::vector<std::byte> bytes(space->config().entry_bytes_of(GroupId(g)));
        EXPECT_TRUE(space->Read(a, GroupId(g), bytes));
        for (std::byte b : bytes) v = v * 131 + static_cast<std::uint8_t>(b);
      }
      out.push_back(v);
    }
    EXPECT_EQ(c.entries, T / 128);
    for (std::uint32_t j = 0; j < c.entries; ++j) out.push_back(Shadow(c128, c.blocks.at(j / 64), j % 64));
    const KindPages st4 = Pages(r, s4), st4i = Pages(r, s4i), st128 = Pages(r, s128);
    for (std::uint32_t i = 0; i < T % 4; ++i) {
      out.push_back(Shadow(s4, st4.blocks.at(0), i));
      out.push_back(Shadow(s4i, st4i.blocks.at(0), i));
    }
    for (std::uint32_t i = 0; i < T % 128; ++i) out.push_back(Shadow(s128, st128.blocks.at(0), i));
    return out;
  }
  void Check(const char* where) const {
    const Status ok = space->CheckInvariants();
    ASSERT_TRUE(ok) << where << ": " << ok.error().ToString();
  }
};

}  // namespace ula::test
