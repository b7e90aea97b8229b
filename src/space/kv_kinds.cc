#include "ula/kv_kinds.h"

#include <fmt/format.h>

#include <bit>

namespace ula {

std::string_view ToString(KindLifetime lifetime) {
  switch (lifetime) {
    case KindLifetime::kRing: return "ring";
    case KindLifetime::kAppend: return "append";
    case KindLifetime::kPerRequest: return "per_request";
  }
  return "?";
}

std::string_view ToString(KindPlacement placement) {
  return placement == KindPlacement::kSparse ? "sparse" : "resident";
}

namespace {

std::unexpected<Error> KindError(std::size_t i, std::string_view field, std::string_view rule) {
  return MakeError(ErrorCode::kInvalidArgument, fmt::format("kinds[{}].{}: {}", i, field, rule));
}

// The rules of one kind on its own (kv_kinds.h).
Status ValidateOne(std::size_t i, const KvKind& k) {
  if (k.name.empty()) return KindError(i, "name", "must not be empty");
  if (!std::has_single_bit(k.tokens_per_entry) || k.tokens_per_entry > kMaxTokensPerEntry) {
    return KindError(i, "tokens_per_entry",
                     fmt::format("is {}: must be a power of two in [1, {}]", k.tokens_per_entry, kMaxTokensPerEntry));
  }
  if (k.layers < 1) return KindError(i, "layers", "must be >= 1");
  if (k.row_bytes < 1) return KindError(i, "row_bytes", "must be >= 1");
  const bool ring = k.lifetime == KindLifetime::kRing;
  if (ring && k.tokens_per_entry != 1) {
    return KindError(i, "tokens_per_entry",
                     fmt::format("is {}: a ring keeps one entry per token, so it must be 1", k.tokens_per_entry));
  }
  if (ring && k.ring_tokens < 1) return KindError(i, "ring_tokens", "must be >= 1 for a ring");
  if (ring && k.ring_draft_tokens >= k.ring_tokens) {
    return KindError(i, "ring_draft_tokens",
                     fmt::format("is {}: must be less than ring_tokens = {} (the window keeps at least one token)",
                                 k.ring_draft_tokens, k.ring_tokens));
  }
  if (!ring && k.ring_draft_tokens != 0) {
    return KindError(i, "ring_draft_tokens", fmt::format("is {}: only a ring keeps draft tokens ({} lifetime)",
                                                         k.ring_draft_tokens, ToString(k.lifetime)));
  }
  if (!ring && k.ring_tokens != 0) {
    return KindError(i, "ring_tokens", fmt::format("is {}: only a ring has a length ({} lifetime)", k.ring_tokens,
                                                   ToString(k.lifetime)));
  }
  const bool state = k.lifetime == KindLifetime::kPerRequest;
  if (state && k.state_rows < 1) return KindError(i, "state_rows", "must be >= 1 for per_request state");
  if (!state && k.state_rows != 0) {
    return KindError(i, "state_rows", fmt::format("is {}: only per_request state has rows ({} lifetime)", k.state_rows,
                                                  ToString(k.lifetime)));
  }
  if (k.placement == KindPlacement::kSparse && k.lifetime != KindLifetime::kAppend) {
    return KindError(i, "placement",
                     fmt::format("sparse needs the append lifetime, not {}: a {} is read whole every step",
                                 ToString(k.lifetime), ring ? "window ring" : "compressor state"));
  }
  return Ok();
}

// The companion rule: an earlier kind, no companion itself, same granularity and lifetime;
// the companion is resident.
Status ValidateCompanion(std::span<const KvKind> kinds, std::size_t i) {
  const KvKind& k = kinds[i];
  if (k.companion_of == kNoCompanion) return Ok();
  if (k.companion_of >= i) {
    return KindError(i, "companion_of", fmt::format("is {}: must name an earlier kind (< {})", k.companion_of, i));
  }
  const KvKind& of = kinds[k.companion_of];
  if (of.companion_of != kNoCompanion) {
    return KindError(i, "companion_of",
                     fmt::format("names '{}', itself a companion of kinds[{}]", of.name, of.companion_of));
  }
  if (of.tokens_per_entry != k.tokens_per_entry || of.lifetime != k.lifetime) {
    return KindError(i, "companion_of",
                     fmt::format("'{}' ({} tokens per entry, {}) and its companion '{}' ({}, {}) must share the "
                                 "entry's granularity and lifetime: they share its logical address",
                                 of.name, of.tokens_per_entry, ToString(of.lifetime), k.name, k.tokens_per_entry,
                                 ToString(k.lifetime)));
  }
  if (k.placement != KindPlacement::kResident) {
    return KindError(i, "placement", fmt::format("a companion ('{}' of '{}') must be resident: it is read for every "
                                                 "entry every step, whichever entries are selected",
                                                 k.name, of.name));
  }
  return Ok();
}

}  // namespace

Status ValidateKinds(std::span<const KvKind> kinds) {
  std::size_t sparse = kinds.size();
  for (std::size_t i = 0; i < kinds.size(); ++i) {
    ULA_RETURN_IF_ERROR(ValidateOne(i, kinds[i]));
    for (std::size_t j = 0; j < i; ++j) {
      if (kinds[j].name == kinds[i].name) {
        return KindError(i, "name", fmt::format("'{}' is also kinds[{}]'s name", kinds[i].name, j));
      }
    }
    ULA_RETURN_IF_ERROR(ValidateCompanion(kinds, i));
    if (kinds[i].placement != KindPlacement::kSparse) continue;
    if (sparse != kinds.size()) {
      return KindError(i, "placement",
                       fmt::format("a second sparse kind (kinds[{}] is sparse): the step takes one selection per "
                                   "request and group",
                                   sparse));
    }
    sparse = i;
  }
  return Ok();
}

std::size_t SparseKindIndex(std::span<const KvKind> kinds) {
  for (std::size_t i = 0; i < kinds.size(); ++i) {
    if (kinds[i].placement == KindPlacement::kSparse) return i;
  }
  return kinds.size();
}

}  // namespace ula
