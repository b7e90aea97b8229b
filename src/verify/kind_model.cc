#include "verify/kind_model.h"

#include <fmt/format.h>

#include <algorithm>

namespace ula::verify_internal {
namespace {

constexpr std::uint32_t kB = kKindBlockEntries;

std::uint32_t CeilDiv(std::uint32_t a, std::uint32_t b) { return (a + b - 1) / b; }

std::string Describe(const KindPages& p) {
  return fmt::format("tokens {} entries {} per block {} first offset {} filling {} blocks {}", p.tokens, p.entries,
                     p.entries_per_block, p.first_offset, p.filling_tokens, p.blocks.size());
}

}  // namespace

KindModel::KindModel(std::span<const KvKind> kinds, std::uint32_t page_tokens, std::uint32_t ranks)
    : kinds_(kinds.begin(), kinds.end()), addressed_(kinds.size(), false), page_tokens_(page_tokens), ranks_(ranks) {
  const std::size_t s = SparseKindIndex(kinds);
  for (std::size_t k = 0; k < kinds.size(); ++k) addressed_[k] = k == s || kinds[k].companion_of == s;
  sparse_tokens_ = kinds[s].tokens_per_entry;
}

void KindModel::Added(RequestId request) {
  requests_[request] = Request{.last = std::vector<KindPages>(std::size_t{ranks_} * kinds_.size())};
}

std::optional<std::string> KindModel::Appended(RequestId request, std::uint32_t n_tokens, std::size_t made) {
  Request& r = requests_.at(request);
  const std::uint32_t want = AddressesAt(r.tokens + n_tokens) - AddressesAt(r.tokens);
  if (n_tokens > 0) r.reach = std::max(r.reach, r.tokens + 1);
  r.tokens += n_tokens;
  r.most = std::max(r.most, r.tokens);
  r.appended = true;
  counts_.c4_made += made;
  if (made == want) return std::nullopt;
  return fmt::format("request {}: {} tokens to {} made {} C4 entries, not {} (one per completed {}-token block)",
                     request.value(), n_tokens, r.tokens, made, want, sparse_tokens_);
}

bool KindModel::RollbackAllowed(RequestId request, std::uint32_t length) const {
  const Request& r = requests_.at(request);
  for (const KvKind& k : kinds_) {
    if (k.lifetime != KindLifetime::kRing) continue;
    const std::uint32_t first = r.most > k.ring_tokens ? r.most - k.ring_tokens : 0;
    const std::uint32_t window = k.ring_tokens - k.ring_draft_tokens;
    const std::uint32_t need = length > window ? length - window : 0;  // [need, length): the window of `length`
    if (length < r.tokens && need < first) return false;
  }
  return true;
}

void KindModel::Truncated(RequestId request, std::uint32_t length) {
  Request& r = requests_.at(request);
  counts_.c4_freed += AddressesAt(r.tokens) - AddressesAt(length);
  r.tokens = length;
}

void KindModel::RoundEnded() {
  for (auto& [id, r] : requests_) r.reach = r.most;
}

void KindModel::Freed(RequestId request) {
  counts_.c4_freed += AddressesAt(requests_.at(request).tokens);
  requests_.erase(request);
}

KindPages KindModel::Expected(std::uint32_t k, const Request& r, std::uint32_t rank, std::uint32_t home) const {
  const KvKind& kind = kinds_[k];
  // Of n entries striped j mod P, how many rank `rank` holds.
  auto stripe = [&](std::uint32_t n) { return n / ranks_ + (n % ranks_ > rank ? 1 : 0); };
  const bool whole = rank == home;  // the window and the states: on the window home alone
  KindPages p;
  p.tokens = r.tokens;
  p.filling_tokens = r.tokens % kind.tokens_per_entry;
  std::uint32_t blocks = 0;
  if (addressed_[k]) {
    const std::uint32_t n = r.tokens / kind.tokens_per_entry;
    p.entries = stripe(n);
    p.entries_per_block = page_tokens_;
    blocks = n > rank ? CeilDiv(n - rank, page_tokens_) : 0;  // the pages with an entry i = rank mod P
  } else if (kind.lifetime == KindLifetime::kAppend) {
    p.entries = stripe(r.tokens / kind.tokens_per_entry);
    p.entries_per_block = kB;
    blocks = CeilDiv(p.entries, kB);
  } else if (kind.lifetime == KindLifetime::kRing) {
    const std::uint32_t first = r.reach > kind.ring_tokens ? r.reach - kind.ring_tokens : 0;
    p.entries_per_block = kB;
    if (whole) {
      p.entries = r.tokens - first;
      p.first_offset = first % kB;
      blocks = p.entries == 0 ? 0 : CeilDiv(r.tokens, kB) - first / kB;
    }
  } else {  // per request
    p.entries = whole && r.appended ? 1 : 0;
    p.entries_per_block = 1;
    blocks = p.entries;
  }
  p.blocks.resize(blocks);
  return p;
}

std::uint32_t KindModel::BaseBlock(std::uint32_t k, const KindPages& p) const {
  if (kinds_[k].lifetime != KindLifetime::kRing || p.entries == 0) return 0;
  return (p.tokens - p.entries) / kB;  // the ring's first live token's block
}

std::optional<std::string> KindModel::CheckStable(std::uint32_t k, const KindPages& before, const KindPages& now) {
  const std::uint32_t b0 = BaseBlock(k, before), b1 = BaseBlock(k, now);
  const std::uint32_t lo = std::max(b0, b1);
  const std::uint32_t hi = std::min<std::uint32_t>(b0 + before.blocks.size(), b1 + now.blocks.size());
  for (std::uint32_t i = lo; i < hi; ++i) {
    if (before.blocks[i - b0] != now.blocks[i - b1]) {
      return fmt::format("kind '{}': block {} of the request changed id ({} -> {}) while it held live entries",
                         kinds_[k].name, i, before.blocks[i - b0], now.blocks[i - b1]);
    }
  }
  if (kinds_[k].lifetime == KindLifetime::kRing && !before.blocks.empty() && b1 > b0) {
    counts_.ring_blocks_freed += std::min<std::uint64_t>(b1 - b0, before.blocks.size());
  }
  if (!addressed_[k] && kinds_[k].lifetime == KindLifetime::kAppend && now.entries > before.entries) {
    counts_.c128_made += now.entries - before.entries;
  }
  return std::nullopt;
}

std::optional<std::string> KindModel::Check(const AddressSpace& space, RequestId request,
                                            std::span<const LogicalAddr> addrs) {
  return CheckRanks(request, addrs, space.AddressesOf(request), 0,
                    [&](std::uint32_t k, std::uint32_t) { return space.KindPagesOf(request, k); });
}

std::optional<std::string> KindModel::Check(const TpAddressSpace& space, RequestId request,
                                            std::span<const LogicalAddr> addrs) {
  auto home = space.WindowHomeOf(request);
  if (!home) return fmt::format("request {}: WindowHomeOf: {}", request.value(), home.error().ToString());
  return CheckRanks(request, addrs, space.AddressesOf(request), home->value(), [&](std::uint32_t k, std::uint32_t r) {
    return space.KindPagesOf(request, k, Rank(static_cast<std::uint16_t>(r)));
  });
}

std::optional<std::string> KindModel::CheckRanks(RequestId request, std::span<const LogicalAddr> addrs,
                                                 Result<std::span<const LogicalAddr>> listed, std::uint32_t home,
                                                 const PagesReader& read) {
  Request& r = requests_.at(request);
  auto fail = [&](std::string what) { return fmt::format("request {} at {} tokens: {}", request.value(), r.tokens, what); };
  if (!listed) return fail("AddressesOf: " + listed.error().ToString());
  if (!std::equal(listed->begin(), listed->end(), addrs.begin(), addrs.end()) || addrs.size() != AddressesAt(r.tokens)) {
    return fail(fmt::format("holds {} addresses ({} in the verifier's list), not its {} C4 entries", listed->size(),
                            addrs.size(), AddressesAt(r.tokens)));
  }
  if (home >= ranks_) return fail(fmt::format("its window home is rank {} of {}", home, ranks_));
  for (std::uint32_t rank = 0; rank < ranks_; ++rank) {
    const std::string where = ranks_ == 1 ? "" : fmt::format(" on rank {} (window home {})", rank, home);
    for (std::uint32_t k = 0; k < kinds_.size(); ++k) {
      auto got = read(k, rank);
      if (!got) return fail(fmt::format("KindPagesOf kind '{}'{}: {}", kinds_[k].name, where, got.error().ToString()));
      ++counts_.pages_checked;
      const KindPages expected = Expected(k, r, rank, home);
      KindPages want = expected;
      want.blocks = got->blocks;  // ids are the space's: their number and stability are checked
      if (*got != want || got->blocks.size() != expected.blocks.size()) {
        return fail(fmt::format("kind '{}' pages{} are ({}), the model says ({})", kinds_[k].name, where,
                                Describe(*got), Describe(expected)));
      }
      KindPages& last = r.last[std::size_t{rank} * kinds_.size() + k];
      if (auto moved = CheckStable(k, last, *got)) return fail(*moved + where);
      last = std::move(*got);
    }
  }
  return std::nullopt;
}

std::uint64_t KindModel::Digest(std::span<const RequestId> requests, std::uint32_t kinds, std::uint32_t ranks,
                                const std::function<Result<KindPages>(RequestId, std::uint32_t, std::uint32_t)>& read) {
  std::uint64_t h = 1469598103934665603ull;
  auto mix = [&](std::uint64_t v) { h = (h ^ v) * 1099511628211ull; };
  for (RequestId id : requests) {
    for (std::uint32_t rank = 0; rank < ranks; ++rank) {
      for (std::uint32_t k = 0; k < kinds; ++k) {
        auto p = read(id, k, rank);
        if (!p) {
          mix(~std::uint64_t{0});
          continue;
        }
        for (std::uint32_t v : {p->tokens, p->entries, p->entries_per_block, p->first_offset, p->filling_tokens}) {
          mix(v);
        }
        for (std::uint32_t b : p->blocks) mix(b);
      }
    }
  }
  return h;
}

std::uint64_t KindModel::PagesDigest(const AddressSpace& space, std::span<const RequestId> requests) {
  return Digest(requests, static_cast<std::uint32_t>(space.config().kinds.size()), 1,
                [&](RequestId id, std::uint32_t k, std::uint32_t) { return space.KindPagesOf(id, k); });
}

std::uint64_t KindModel::PagesDigest(const TpAddressSpace& space, std::span<const RequestId> requests) {
  return Digest(requests, static_cast<std::uint32_t>(space.config().kinds.size()), space.config().num_ranks,
                [&](RequestId id, std::uint32_t k, std::uint32_t r) {
                  return space.KindPagesOf(id, k, Rank(static_cast<std::uint16_t>(r)));
                });
}

}  // namespace ula::verify_internal
