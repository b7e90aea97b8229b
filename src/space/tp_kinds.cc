// The kinds of a TP space (include/ula/tp_address_space.h, "Kinds"; docs/ARCHITECTURE.md,
// "Kinds under TP"): where a request's window goes, every rank's page table of a kind, and
// the rules that no entry of any kind sits on two ranks (invariants 5-7). The operations that
// change the kinds (AddRequest, Allocate, Truncate, Free, AdvanceRound) are in
// tp_address_space.cc beside the directory's, each rank's share in space/kind_entries.h.
#include <fmt/format.h>

#include <algorithm>
#include <vector>

#include "core/digest.h"
#include "space/tp_state.h"
#include "ula/tp_address_space.h"

namespace ula {

namespace {
auto Fail(std::string msg) { return MakeError(ErrorCode::kInternal, "TpAddressSpace: " + std::move(msg)); }

std::unexpected<Error> NoKinds(std::string_view what) {
  return MakeError(ErrorCode::kFailedPrecondition, fmt::format("{}: the space has no kinds (TpConfig::kinds)", what));
}
}  // namespace

Rank NextWindowHome(const TpAddressSpace::State& st) {
  const auto fewest = std::min_element(st.window_homed.begin(), st.window_homed.end());
  return Rank(static_cast<std::uint16_t>(fewest - st.window_homed.begin()));
}

Result<KindPages> TpAddressSpace::KindPagesOf(RequestId request, std::uint32_t kind, Rank rank) const {
  const State& st = *state_;
  if (st.kinds.empty()) return NoKinds("KindPagesOf");
  if (rank.value() >= config_.num_ranks) {
    return MakeError(ErrorCode::kOutOfRange,
                     fmt::format("KindPagesOf: rank {} is out of range ({} ranks)", rank.value(), config_.num_ranks));
  }
  const KindEntries& share = st.kinds[rank.value()];
  if (kind >= share.num_kinds() || !share.addressed(kind)) return share.PagesOf(request, kind);
  // The sparse kind and its companions: the request's addresses homed on the rank, in the
  // directory's pages that hold one of them.
  auto tokens = share.TokensOf(request);
  if (!tokens) return std::unexpected(tokens.error());
  const std::span<const LogicalAddr> addrs = st.dir.Find(request)->addrs;
  const std::uint32_t pt = config_.page_tokens, p = config_.num_ranks;
  KindPages pages;
  pages.tokens = *tokens;
  pages.entries_per_block = pt;
  pages.filling_tokens = *tokens % config_.kinds[kind].tokens_per_entry;
  for (LogicalAddr a : addrs) {
    if (a.value() % p != rank.value()) continue;
    ++pages.entries;
    const std::uint32_t page = a.value() / pt;
    if (pages.blocks.empty() || pages.blocks.back() != page) pages.blocks.push_back(page);
  }
  return pages;
}

Result<Rank> TpAddressSpace::WindowHomeOf(RequestId request) const {
  const State& st = *state_;
  if (st.kinds.empty()) return NoKinds("WindowHomeOf");
  auto it = st.window_home.find(request);
  if (it == st.window_home.end()) {
    return MakeError(ErrorCode::kNotFound, fmt::format("WindowHomeOf: request {} is unknown", request.value()));
  }
  return it->second;
}

Status CheckTpKinds(const TpAddressSpace::State& st, const TpConfig& c) {
  if (st.kinds.empty()) return Ok();
  const std::uint32_t p = c.num_ranks;
  // 5. Each rank's share on its own (kind_entries.h), the same requests as the directory.
  for (std::uint32_t r = 0; r < p; ++r) {
    ULA_RETURN_IF_ERROR(st.kinds[r].CheckInvariants(fmt::format("TpAddressSpace rank {}", r)));
    if (st.kinds[r].num_requests() != st.dir.num_requests()) {
      return Fail(fmt::format("rank {} holds kinds of {} requests, the directory {}", r, st.kinds[r].num_requests(),
                              st.dir.num_requests()));
    }
  }
  if (st.window_home.size() != st.dir.num_requests()) {
    return Fail(fmt::format("{} window homes for {} requests", st.window_home.size(), st.dir.num_requests()));
  }
  std::vector<std::uint32_t> homed(p, 0);
  const std::uint32_t sparse = st.kinds[0].sparse_kind();
  for (const auto& [id, req] : st.dir.requests()) {
    auto home_it = st.window_home.find(id);
    if (home_it == st.window_home.end() || home_it->second.value() >= p) {
      return Fail(fmt::format("request {} has no window home", id.value()));
    }
    const std::uint32_t home = home_it->second.value();
    ++homed[home];
    auto tokens = st.kinds[0].TokensOf(id);
    if (!tokens) return Fail(fmt::format("request {} has no kind entries", id.value()));
    for (std::uint32_t r = 1; r < p; ++r) {
      auto other = st.kinds[r].TokensOf(id);
      if (!other || *other != *tokens) {
        return Fail(fmt::format("request {}: rank {} counts {} tokens, rank 0 {}", id.value(), r, other.value_or(0),
                                *tokens));
      }
    }
    const std::uint32_t t = *tokens;
    // C4 and its index keys: the request's addresses, one per complete block, homed a mod P.
    const std::uint32_t c4 = t / c.kinds[sparse].tokens_per_entry;
    if (req.addrs.size() != c4 || !req.adopted.empty()) {
      return Fail(fmt::format("request {} of {} tokens lists {} addresses ({} adopted), not its {} C4 entries",
                              id.value(), t, req.addrs.size(), req.adopted.size(), c4));
    }
    for (std::uint32_t k = 0; k < c.kinds.size(); ++k) {
      if (st.kinds[0].addressed(k)) continue;
      const KvKind& kind = c.kinds[k];
      std::uint64_t sum = 0;
      for (std::uint32_t r = 0; r < p; ++r) {
        auto pages = st.kinds[r].PagesOf(id, k);
        if (!pages) return Fail(pages.error().message());
        sum += pages->entries;
        if (kind.lifetime == KindLifetime::kAppend) {
          // 6. Rank r holds the entries j mod P == r of the request's floor(T / E).
          const std::uint32_t all = t / kind.tokens_per_entry;
          const std::uint32_t mine = all / p + (all % p > r ? 1 : 0);
          if (pages->entries != mine) {
            return Fail(fmt::format("request {} kind '{}': rank {} holds {} of its {} entries, its stripe is {}",
                                    id.value(), kind.name, r, pages->entries, all, mine));
          }
        } else if (r != home && (pages->entries != 0 || !pages->blocks.empty())) {
          // 7. The window and the compressor states are whole on the window home.
          return Fail(fmt::format("request {} kind '{}': rank {} holds {} entries in {} blocks, but its window "
                                  "home is rank {}", id.value(), kind.name, r, pages->entries, pages->blocks.size(),
                                  home));
        }
      }
      if (kind.lifetime == KindLifetime::kAppend && sum != t / kind.tokens_per_entry) {
        return Fail(fmt::format("request {} kind '{}': the ranks hold {} entries, its {} tokens make {}", id.value(),
                                kind.name, sum, t, t / kind.tokens_per_entry));
      }
      if (kind.lifetime == KindLifetime::kPerRequest && t > 0 && sum != 1) {
        return Fail(fmt::format("request {} kind '{}': {} entries over the ranks, one expected", id.value(),
                                kind.name, sum));
      }
    }
  }
  for (std::uint32_t r = 0; r < p; ++r) {
    if (homed[r] != st.window_homed[r]) {
      return Fail(fmt::format("rank {} is the window home of {} requests, counted {}", r, homed[r],
                              st.window_homed[r]));
    }
  }
  return Ok();
}

void AddTpKindsToDigest(const TpAddressSpace::State& st, StateDigest& d) {
  for (const KindEntries& share : st.kinds) share.AddToDigest(d);
  std::uint64_t homes = 0;  // order-free: the map's order is not part of the state
  for (const auto& [id, home] : st.window_home) homes += StateDigest::Mix(id.value(), home.value());
  d.Add(homes);
  d.AddAll(std::span<const std::uint32_t>(st.window_homed));
}

}  // namespace ula
