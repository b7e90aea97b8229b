#include "space/kind_entries.h"

#include <fmt/format.h>

#include <algorithm>
#include <limits>
#include <numeric>

#include "ula/check.h"

namespace ula {

namespace {
constexpr std::uint32_t kB = KindEntries::kBlockEntries;

// Blocks of the entries [first, end): [first / B, ceil(end / B)), none when first == end.
std::uint32_t FirstBlock(std::uint32_t first) { return first / kB; }
std::uint32_t EndBlock(std::uint32_t first, std::uint32_t end) {
  return end == first ? FirstBlock(first) : static_cast<std::uint32_t>((std::uint64_t{end} + kB - 1) / kB);
}

std::unexpected<Error> Unknown(std::string_view what, RequestId request) {
  return MakeError(ErrorCode::kNotFound, fmt::format("{}: request {} is unknown", what, request.value()));
}
}  // namespace

KindEntries::KindEntries(std::span<const KvKind> kinds, KindFrames* frames, std::uint64_t sparse_host_entries,
                         Share share)
    : kinds_(kinds.begin(), kinds.end()), addressed_(kinds.size(), false), pools_(kinds.size()), frames_(frames),
      sparse_host_entries_(sparse_host_entries), share_(share) {
  ULA_CHECK(frames == nullptr || frames->num_kinds() == kinds.size());
  ULA_CHECK(share.rank < share.ranks && (frames == nullptr || share.ranks == 1));
  sparse_ = static_cast<std::uint32_t>(SparseKindIndex(kinds));
  for (std::size_t k = 0; k < kinds.size(); ++k) {
    // Over frames the companion holds blocks of its own (its bytes are resident).
    const bool companion = kinds[k].companion_of != kNoCompanion && kinds[k].companion_of == sparse_;
    addressed_[k] = k == sparse_ || (companion && frames == nullptr);
  }
}

std::uint32_t KindEntries::TakeBlock(std::uint32_t k) {
  if (frames_ == nullptr) return pools_[k].Take();
  const std::optional<std::uint32_t> block = frames_->Take(k);
  ULA_CHECK(block.has_value());  // CheckAppend counted the frames
  return *block;
}

void KindEntries::GiveBlock(std::uint32_t k, std::uint32_t id) {
  if (frames_ == nullptr) return pools_[k].Give(id);
  frames_->Give(k, id);
}

std::uint64_t KindEntries::SparseDeviceShare() const {
  if (frames_ == nullptr || sparse_ >= kinds_.size()) return 0;
  return std::uint64_t{frames_->free_frames()} * frames_->envelope(sparse_).per_frame * kB;
}

std::uint32_t KindEntries::Pool::Take() {
  if (!free.empty()) {
    const std::uint32_t id = *free.begin();
    free.erase(free.begin());
    holders[id] = 1;
    return id;
  }
  ULA_CHECK(extent < std::numeric_limits<std::uint32_t>::max());
  holders.push_back(1);
  return extent++;
}

std::size_t KindEntries::DropFront(const KindState& s, std::uint32_t first, std::uint32_t end) {
  if (end == first) return s.blocks.size();
  return std::min<std::size_t>(s.blocks.size(), FirstBlock(first) - FirstBlock(s.first));
}

Status KindEntries::AddRequest(RequestId request, bool whole) {
  if (requests_.contains(request)) {
    return MakeError(ErrorCode::kAlreadyExists, fmt::format("request {} already exists", request.value()));
  }
  requests_.emplace(request, Request{.whole = whole, .kinds = std::vector<KindState>(kinds_.size())});
  return Ok();
}

Result<std::uint32_t> KindEntries::TokensOf(RequestId request) const {
  auto it = requests_.find(request);
  if (it == requests_.end()) return Unknown("KindEntries", request);
  return it->second.tokens;
}

Result<std::uint32_t> KindEntries::AddressedEntries(RequestId request) const {
  auto t = TokensOf(request);
  if (!t) return std::unexpected(t.error());
  return EntriesAt(sparse_, *t);
}

Result<KindEntries::AppendCheck> KindEntries::CheckAppend(RequestId request, std::uint32_t n_tokens) const {
  const RoundAppend one{request, n_tokens};
  auto round = CheckRound("Allocate", std::span(&one, 1));
  if (!round) return std::unexpected(round.error());
  return AppendCheck{round->entries[0], round->frames};
}

Result<KindEntries::RoundCheck> KindEntries::CheckRound(std::string_view who,
                                                        std::span<const RoundAppend> appends) const {
  if (kinds_.empty()) return MakeError(ErrorCode::kFailedPrecondition, fmt::format("{}: the space has no kinds", who));
  RoundCheck out;
  out.entries.reserve(appends.size());
  // Per kind, the blocks the round's Appends take beyond what each gives back itself: a
  // request's own gives come before its takes, another's may come after (any order).
  std::vector<std::uint32_t> takes(kinds_.size(), 0);
  const std::vector<std::uint32_t> none(kinds_.size(), 0);
  std::uint64_t made = 0;
  for (const RoundAppend& a : appends) {
    auto it = requests_.find(a.request);
    if (it == requests_.end()) return Unknown(who, a.request);
    const Request& req = it->second;
    const std::uint32_t t = req.tokens;
    if (a.n_tokens > std::numeric_limits<std::uint32_t>::max() - t) {
      return MakeError(ErrorCode::kOutOfRange,
                       fmt::format("{}: request {} holds {} tokens, {} more pass 2^32 - 1", who, a.request.value(), t,
                                   a.n_tokens));
    }
    out.entries.push_back(EntriesAt(sparse_, t + a.n_tokens) - EntriesAt(sparse_, t));
    made += out.entries.back();
    if (frames_ == nullptr) continue;
    for (std::uint32_t k = 0; k < kinds_.size(); ++k) {
      if (addressed_[k]) continue;
      if (kinds_[k].lifetime == KindLifetime::kPerRequest) {
        takes[k] += req.appended || !req.whole ? 0 : 1;
        continue;
      }
      const auto [first, end] = RangeAt(k, req, req.kinds[k], ReachAfter(req, a.n_tokens), t + a.n_tokens);
      const BlockDelta d = ResizeDelta(req.kinds[k], first, end);
      if (d.takes > d.gives) takes[k] += d.takes - d.gives;
    }
  }
  if (frames_ == nullptr) return out;
  // Over frames: the resident kinds' new blocks first, then the sparse entries in what is left.
  // Named in a refusal only (every Allocate runs this check).
  const auto what = [&] {
    return appends.size() == 1 ? fmt::format("request {} ({} tokens, {} more)", appends[0].request.value(),
                                             requests_.at(appends[0].request).tokens, appends[0].n_tokens)
                               : fmt::format("a round of {} requests", appends.size());
  };
  out.frames = frames_->FramesNeeded(takes, none);
  if (out.frames > frames_->free_frames()) {
    return MakeError(ErrorCode::kResourceExhausted,
                     fmt::format("{}: {}: its resident kinds' new blocks need {} free frames of {} B and the budget "
                                 "has {} free of {}", who, what(), out.frames, frames_->frame_bytes(),
                                 frames_->free_frames(), frames_->num_frames()));
  }
  const std::uint64_t share =
      std::uint64_t{frames_->free_frames() - out.frames} * frames_->envelope(sparse_).per_frame * kB;
  if (sparse_entries_ + made > share + sparse_host_entries_) {
    return MakeError(ErrorCode::kResourceExhausted,
                     fmt::format("{}: {}: {} '{}' entries in all would not fit the device share the resident kinds "
                                 "leave ({} entries in {} free frames) plus the host tier ({} entries)", who, what(),
                                 sparse_entries_ + made, kinds_[sparse_].name, share,
                                 frames_->free_frames() - out.frames, sparse_host_entries_));
  }
  return out;
}

KindEntries::BlockDelta KindEntries::ResizeDelta(const KindState& s, std::uint32_t first, std::uint32_t end) {
  const std::size_t drop_front = DropFront(s, first, end);
  const std::size_t kept = s.blocks.size() - drop_front;
  const std::size_t want = EndBlock(first, end) - FirstBlock(first);
  return {static_cast<std::uint32_t>(want > kept ? want - kept : 0),
          static_cast<std::uint32_t>(drop_front + (kept > want ? kept - want : 0))};
}

std::pair<std::uint32_t, std::uint32_t> KindEntries::RangeAt(std::uint32_t k, const Request& req,
                                                             const KindState& s, std::uint32_t reach,
                                                             std::uint32_t tokens) const {
  const KvKind& kind = kinds_[k];
  if (kind.lifetime != KindLifetime::kRing) return {0, HeldAt(k, tokens)};
  if (!req.whole) return {0, 0};  // the window is held whole by its home rank
  return {std::max(s.first, RingFirst(kind, reach)), tokens};
}

std::uint32_t KindEntries::RingFirst(const KvKind& kind, std::uint32_t reach) {
  // Token reach - 1 reads [reach - window, reach - 1]; a rollback of ring_draft_tokens from
  // it reads ring_draft_tokens tokens further back: ring_tokens in all.
  return reach > kind.ring_tokens ? reach - kind.ring_tokens : 0;
}

std::uint32_t KindEntries::ReachAfter(const Request& req, std::uint32_t n_tokens) {
  // An Allocate of n tokens at T: its first token T reads back from T (nothing when n is 0).
  return std::max(req.reach, req.tokens + std::min<std::uint32_t>(n_tokens, 1));
}

void KindEntries::Resize(std::uint32_t k, KindState& s, std::uint32_t first, std::uint32_t end) {
  // Blocks whose entries are all older than `first` go from the front, those past `end`
  // from the back; the kept ones keep their ids, new ones come at the back.
  const std::size_t drop_front = DropFront(s, first, end);
  for (std::size_t i = 0; i < drop_front; ++i) GiveBlock(k, s.blocks[i]);
  s.blocks.erase(s.blocks.begin(), s.blocks.begin() + static_cast<std::ptrdiff_t>(drop_front));
  const std::size_t want = EndBlock(first, end) - FirstBlock(first);
  while (s.blocks.size() > want) GiveBlock(k, s.blocks.back()), s.blocks.pop_back();
  while (s.blocks.size() < want) s.blocks.push_back(TakeBlock(k));
  s.first = first;
  s.end = end;
}

void KindEntries::Append(RequestId request, std::uint32_t n_tokens) {
  Request& req = requests_.at(request);
  sparse_entries_ -= EntriesAt(sparse_, req.tokens);
  req.reach = ReachAfter(req, n_tokens);
  req.tokens += n_tokens;
  req.most = std::max(req.most, req.tokens);
  if (req.reach != req.most && !req.round_pending) {
    req.round_pending = true;
    round_pending_.push_back(request);
  }
  sparse_entries_ += EntriesAt(sparse_, req.tokens);
  for (std::uint32_t k = 0; k < kinds_.size(); ++k) {
    if (addressed_[k]) continue;
    KindState& s = req.kinds[k];
    if (kinds_[k].lifetime == KindLifetime::kPerRequest) {
      if (!req.appended && req.whole) s.blocks.push_back(TakeBlock(k)), s.end = 1;
      continue;
    }
    const auto [first, end] = RangeAt(k, req, s, req.reach, req.tokens);
    Resize(k, s, first, end);
  }
  req.appended = true;
}

bool KindEntries::EndRound() {
  bool gave = false;
  for (RequestId id : round_pending_) {
    auto it = requests_.find(id);
    if (it == requests_.end()) continue;  // freed since
    Request& req = it->second;
    req.round_pending = false;
    if (req.reach == req.most) continue;  // its rings hold nothing a later round cannot read
    req.reach = req.most;
    for (std::uint32_t k = 0; k < kinds_.size(); ++k) {
      if (addressed_[k] || kinds_[k].lifetime != KindLifetime::kRing) continue;
      KindState& s = req.kinds[k];
      const auto [first, end] = RangeAt(k, req, s, req.reach, req.tokens);
      gave = gave || ResizeDelta(s, first, end).gives > 0;
      Resize(k, s, first, end);
    }
  }
  round_pending_.clear();
  return gave;
}

Result<std::uint32_t> KindEntries::CheckTruncate(RequestId request, std::uint32_t length) const {
  if (kinds_.empty()) return MakeError(ErrorCode::kFailedPrecondition, "Truncate: the space has no kinds");
  auto it = requests_.find(request);
  if (it == requests_.end()) return Unknown("Truncate", request);
  const Request& req = it->second;
  if (length > req.tokens) {
    return MakeError(ErrorCode::kOutOfRange, fmt::format("Truncate: request {} holds {} tokens, cannot keep {}",
                                                         request.value(), req.tokens, length));
  }
  if (length < req.shared) {
    return MakeError(ErrorCode::kFailedPrecondition,
                     fmt::format("Truncate: request {} to {} tokens would drop part of its shared prefix of {} tokens "
                                 "(a shared prefix is immutable)", request.value(), length, req.shared));
  }
  for (std::uint32_t k = 0; k < kinds_.size(); ++k) {
    const KvKind& kind = kinds_[k];
    if (kind.lifetime != KindLifetime::kRing || length == req.tokens) continue;
    const std::uint32_t window = kind.ring_tokens - kind.ring_draft_tokens;
    const std::uint32_t need = length > window ? length - window : 0;  // the window of the new length
    // What a rollback may restore is fixed by the most tokens held, not by how the rounds
    // were cut (the ring may still hold more: a round's tokens until the next Allocate).
    const std::uint32_t restorable = RingFirst(kind, req.most);
    if (need < restorable) {
      return MakeError(ErrorCode::kFailedPrecondition,
                       fmt::format("Truncate: request {} to {} tokens (from {}, {} at most) reaches past the ring of "
                                   "'{}': its window needs token {}, and a ring of {} tokens ({} of them drafts) "
                                   "restores tokens from {} on; a rollback may drop at most {} tokens since the ring "
                                   "was full", request.value(), length, req.tokens, req.most, kind.name, need,
                                   kind.ring_tokens, kind.ring_draft_tokens, restorable, kind.ring_draft_tokens));
    }
  }
  return EntriesAt(sparse_, length);
}

void KindEntries::Truncate(RequestId request, std::uint32_t length) {
  Request& req = requests_.at(request);
  sparse_entries_ -= EntriesAt(sparse_, req.tokens) - EntriesAt(sparse_, length);
  req.tokens = length;
  for (std::uint32_t k = 0; k < kinds_.size(); ++k) {
    if (addressed_[k]) continue;
    KindState& s = req.kinds[k];
    switch (kinds_[k].lifetime) {
      case KindLifetime::kRing:
        if (req.whole) Resize(k, s, s.first, length);
        break;
      case KindLifetime::kAppend: Resize(k, s, 0, HeldAt(k, length)); break;
      case KindLifetime::kPerRequest: break;  // its position is tokens % E
    }
  }
}

std::uint32_t KindEntries::ShareUnit(std::span<const KvKind> kinds, std::uint32_t page_tokens) {
  std::uint64_t unit = kB;  // the ring's blocks
  const std::size_t sparse = SparseKindIndex(kinds);
  for (std::size_t k = 0; k < kinds.size(); ++k) {
    std::uint64_t tokens = kinds[k].tokens_per_entry;
    if (k == sparse) tokens *= page_tokens;  // whole pages of addresses
    unit = std::lcm(unit, tokens);
  }
  return static_cast<std::uint32_t>(std::min<std::uint64_t>(unit, std::numeric_limits<std::uint32_t>::max()));
}

Status KindEntries::CheckShare(RequestId request, RequestId source, std::uint32_t resume, std::uint32_t unit) const {
  if (kinds_.empty()) return MakeError(ErrorCode::kFailedPrecondition, "SharePrefix: the space has no kinds");
  if (frames_ != nullptr) {
    return MakeError(ErrorCode::kUnsupported,
                     "SharePrefix: a space over kind frames shares no prefix (its frames count a block once per "
                     "owner; docs/ARCHITECTURE.md, \"Kinds\")");
  }
  auto it = requests_.find(request);
  if (it == requests_.end()) return Unknown("SharePrefix", request);
  auto src = requests_.find(source);
  if (src == requests_.end()) return Unknown("SharePrefix (source)", source);
  if (request == source) {
    return MakeError(ErrorCode::kInvalidArgument,
                     fmt::format("SharePrefix: request {} cannot adopt its own prefix", request.value()));
  }
  if (unit == 0 || resume % unit != 0) {
    return MakeError(ErrorCode::kInvalidArgument,
                     fmt::format("SharePrefix: {} tokens are not a multiple of the share unit {}", resume, unit));
  }
  const Request& req = it->second;
  if (req.tokens != 0 || req.appended) {
    return MakeError(ErrorCode::kFailedPrecondition,
                     fmt::format("SharePrefix: request {} already holds {} tokens: a prefix is adopted before the "
                                 "first Allocate", request.value(), req.tokens));
  }
  const Request& from = src->second;
  if (resume > from.tokens) {
    return MakeError(ErrorCode::kOutOfRange, fmt::format("SharePrefix: source {} holds {} tokens, not {}",
                                                         source.value(), from.tokens, resume));
  }
  for (std::uint32_t k = 0; k < kinds_.size(); ++k) {
    if (kinds_[k].lifetime != KindLifetime::kRing) continue;
    const std::uint32_t need = RingFirst(kinds_[k], resume);
    const KindState& s = from.kinds[k];
    if (resume > 0 && (!from.whole || s.first > need)) {
      return MakeError(ErrorCode::kFailedPrecondition,
                       fmt::format("SharePrefix: source {}'s ring of '{}' holds tokens [{}, {}): a resume at token {} "
                                   "needs [{}, {}) (hold a prefix by sharing it into a request while its source's "
                                   "ring holds it)", source.value(), kinds_[k].name, s.first, from.tokens, resume,
                                   need, resume));
    }
  }
  return Ok();
}

std::vector<KindBlockCopy> KindEntries::SharePrefix(RequestId request, RequestId source, std::uint32_t resume) {
  const Request& from = requests_.at(source);
  Request& req = requests_.at(request);
  std::vector<KindBlockCopy> copies;
  req.tokens = req.most = req.reach = req.shared = resume;
  sparse_entries_ += EntriesAt(sparse_, resume);
  for (std::uint32_t k = 0; k < kinds_.size(); ++k) {
    if (addressed_[k] || kinds_[k].lifetime == KindLifetime::kPerRequest) continue;
    const KindState& src = from.kinds[k];
    KindState& s = req.kinds[k];
    const auto [first, end] = RangeAt(k, req, s, resume, resume);
    s.first = first;
    s.end = end;
    if (first == end) continue;
    // The source's block of absolute block position b is src.blocks[b - src.first / 64].
    for (std::uint32_t b = FirstBlock(first); b < EndBlock(first, end); ++b) {
      const std::uint32_t id = src.blocks[b - FirstBlock(src.first)];
      if ((b + 1) * kB <= end) {  // full: shared
        pools_[k].Hold(id);
        s.blocks.push_back(id);
        continue;
      }
      s.blocks.push_back(TakeBlock(k));  // partly filled (an append kind's last): its own, copied
      copies.push_back({k, id, s.blocks.back(), end - b * kB});
    }
  }
  return copies;
}

Result<std::uint32_t> KindEntries::SharedTokensOf(RequestId request) const {
  auto it = requests_.find(request);
  if (it == requests_.end()) return Unknown("KindEntries", request);
  return it->second.shared;
}

Status KindEntries::Free(RequestId request) {
  auto it = requests_.find(request);
  if (it == requests_.end()) return Unknown("Free", request);
  for (std::uint32_t k = 0; k < kinds_.size(); ++k) {
    for (std::uint32_t id : it->second.kinds[k].blocks) GiveBlock(k, id);
  }
  sparse_entries_ -= EntriesAt(sparse_, it->second.tokens);
  requests_.erase(it);
  return Ok();
}

Result<std::uint32_t> KindEntries::Compact(std::uint32_t k, std::span<const RequestId> pinned) {
  if (frames_ == nullptr) return MakeError(ErrorCode::kFailedPrecondition, "Compact: the kinds hold no frames");
  if (k >= kinds_.size() || addressed_[k]) {
    return MakeError(k >= kinds_.size() ? ErrorCode::kOutOfRange : ErrorCode::kInvalidArgument,
                     fmt::format("Compact: kind {} is out of range or the space's addresses", k));
  }
  // Each live block's place in its request's page table, and whether it may move.
  struct Owner {
    std::vector<std::uint32_t>* blocks;
    std::size_t index;
    bool pinned;
  };
  std::unordered_map<std::uint32_t, Owner> owner;
  const std::set<RequestId> stay(pinned.begin(), pinned.end());
  for (auto& [id, req] : requests_) {
    std::vector<std::uint32_t>& blocks = req.kinds[k].blocks;
    for (std::size_t i = 0; i < blocks.size(); ++i) owner[blocks[i]] = Owner{&blocks, i, stay.contains(id)};
  }
  return frames_->Compact(
      k, [&owner](std::uint32_t block) { return owner.at(block).pinned; },
      [&owner](std::uint32_t from, std::uint32_t to) {
        const Owner o = owner.at(from);
        (*o.blocks)[o.index] = to;
        owner.erase(from);
        owner.emplace(to, o);
      });
}

Result<KindPages> KindEntries::PagesOf(RequestId request, std::uint32_t k) const {
  auto it = requests_.find(request);
  if (it == requests_.end()) return Unknown("KindPagesOf", request);
  if (k >= kinds_.size()) {
    return MakeError(ErrorCode::kOutOfRange, fmt::format("KindPagesOf: kind {} is out of range ({} kinds)", k,
                                                         kinds_.size()));
  }
  if (addressed_[k]) {
    return MakeError(ErrorCode::kInvalidArgument,
                     fmt::format("KindPagesOf: kind '{}' is the space's logical addresses", kinds_[k].name));
  }
  const Request& req = it->second;
  const KindState& s = req.kinds[k];
  const bool state = kinds_[k].lifetime == KindLifetime::kPerRequest;
  KindPages p;
  p.tokens = req.tokens;
  p.entries = s.end - s.first;
  p.entries_per_block = state ? 1 : kB;
  p.first_offset = state ? 0 : s.first % kB;
  p.filling_tokens = req.tokens % kinds_[k].tokens_per_entry;
  p.blocks = s.blocks;
  return p;
}

std::uint32_t KindEntries::BlocksInUse(std::uint32_t k) const {
  if (frames_ != nullptr) return frames_->blocks_in_use(k);
  return pools_[k].extent - static_cast<std::uint32_t>(pools_[k].free.size());
}

Status KindEntries::CheckInvariants(std::string_view who) const {
  auto fail = [who](std::string msg) { return MakeError(ErrorCode::kInternal, fmt::format("{}: {}", who, msg)); };
  for (std::uint32_t k = 0; k < kinds_.size(); ++k) {
    if (addressed_[k]) continue;
    const KvKind& kind = kinds_[k];
    const Pool& pool = pools_[k];
    if (frames_ == nullptr && pool.holders.size() != pool.extent) {
      return fail(fmt::format("kind '{}': {} hold counts for {} ids", kind.name, pool.holders.size(), pool.extent));
    }
    // Per id: the requests listing it, its block position, the least end (tokens or entries)
    // of its holders (a shared block is sealed below every holder's end).
    std::vector<std::uint32_t> listed(pool.extent, 0), position(pool.extent, 0), least_end(pool.extent, 0);
    std::set<std::uint32_t> owned;  // over frames
    for (std::uint32_t id : pool.free) {
      if (id >= pool.extent || pool.holders[id] != 0) {
        return fail(fmt::format("kind '{}': free block {} is past the extent or held", kind.name, id));
      }
    }
    for (const auto& [request, req] : requests_) {
      const KindState& s = req.kinds[k];
      std::uint32_t first = 0, end = 0;
      std::size_t blocks = 0;
      switch (kind.lifetime) {
        case KindLifetime::kRing:
          // The ring frees by the first token of the request's last round (reach - 1), and
          // holds the round's other tokens beside it: at most ring_tokens + (n - 1) tokens.
          first = req.whole ? RingFirst(kind, req.reach) : 0, end = req.whole ? req.tokens : 0;
          if (req.reach > req.most || req.tokens > req.most || first > end ||
              (req.reach != req.most && !req.round_pending)) {
            return fail(fmt::format("request {} kind '{}': {} tokens, {} at most, its rounds from token {} at most, "
                                    "the ring from {}{}", request.value(), kind.name, req.tokens, req.most,
                                    req.reach == 0 ? 0 : req.reach - 1, first,
                                    req.round_pending ? "" : ", not listed for the round's end"));
          }
          blocks = EndBlock(first, end) - FirstBlock(first);
          break;
        case KindLifetime::kAppend:
          end = HeldAt(k, req.tokens);
          blocks = EndBlock(0, end);
          break;
        case KindLifetime::kPerRequest:
          end = req.appended && req.whole ? 1 : 0;
          blocks = end;
          break;
      }
      if (s.first != first || s.end != end || s.blocks.size() != blocks) {
        return fail(fmt::format("request {} of {} tokens, kind '{}': entries [{}, {}) in {} blocks, expected [{}, "
                                "{}) in {}", request.value(), req.tokens, kind.name, s.first, s.end, s.blocks.size(),
                                first, end, blocks));
      }
      for (std::size_t i = 0; i < s.blocks.size(); ++i) {
        const std::uint32_t id = s.blocks[i];
        if (frames_ != nullptr) {
          if (!frames_->IsLive(k, id) || !owned.insert(id).second) {
            return fail(fmt::format("kind '{}': block {} of request {} is {}", kind.name, id, request.value(),
                                    frames_->IsLive(k, id) ? "owned twice" : "not live in the frames"));
          }
          continue;
        }
        const std::uint32_t at = FirstBlock(s.first) + static_cast<std::uint32_t>(i);
        if (id >= pool.extent || pool.free.contains(id) || (listed[id] != 0 && position[id] != at)) {
          return fail(fmt::format("kind '{}': block {} of request {} is {}", kind.name, id, request.value(),
                                  id >= pool.extent      ? "past the extent"
                                  : pool.free.contains(id) ? "free"
                                                           : "at another position in another request"));
        }
        least_end[id] = listed[id] == 0 ? s.end : std::min(least_end[id], s.end);
        position[id] = at;
        ++listed[id];
      }
    }
    for (std::uint32_t id = 0; id < pool.extent; ++id) {
      if (listed[id] != pool.holders[id] || (listed[id] == 0 && !pool.free.contains(id))) {
        return fail(fmt::format("kind '{}': block {} is listed by {} requests and counts {} holders{}", kind.name, id,
                                listed[id], pool.holders[id], pool.free.contains(id) ? " (free)" : ""));
      }
      if (listed[id] > 1 && (position[id] + 1) * kB > least_end[id]) {
        return fail(fmt::format("kind '{}': block {} is shared by {} requests but not sealed: its entries reach {}, "
                                "a holder's end is {}", kind.name, id, listed[id], (position[id] + 1) * kB,
                                least_end[id]));
      }
    }
    if (frames_ != nullptr && owned.size() != frames_->blocks_in_use(k)) {
      return fail(fmt::format("kind '{}': the frames hold {} live blocks, the requests own {}", kind.name,
                              frames_->blocks_in_use(k), owned.size()));
    }
  }
  return CheckFrames(who);
}

Status KindEntries::CheckFrames(std::string_view who) const {
  auto fail = [who](std::string msg) { return MakeError(ErrorCode::kInternal, fmt::format("{}: {}", who, msg)); };
  if (kinds_.empty()) return Ok();
  std::uint64_t sparse = 0;
  for (const auto& [id, req] : requests_) sparse += EntriesAt(sparse_, req.tokens);
  if (sparse != sparse_entries_) {
    return fail(fmt::format("{} sparse entries counted, the requests' tokens make {}", sparse_entries_, sparse));
  }
  if (frames_ == nullptr) return Ok();
  ULA_RETURN_IF_ERROR(frames_->CheckInvariants(who));
  if (sparse_entries_ > SparseDeviceShare() + sparse_host_entries_) {
    return fail(fmt::format("{} '{}' entries exceed the free frames' share ({}) plus the host tier ({})",
                            sparse_entries_, kinds_[sparse_].name, SparseDeviceShare(), sparse_host_entries_));
  }
  return Ok();
}

void KindEntries::AddToDigest(StateDigest& d) const {
  d.Add(sparse_entries_);
  if (frames_ != nullptr) frames_->AddToDigest(d);
  for (const Pool& p : pools_) {
    d.Add(p.extent);
    d.Add(p.free.size());
    for (std::uint32_t id : p.free) d.Add(id);
    for (std::uint32_t h : p.holders) d.Add(h);
  }
  // The requests in id order (the map's order is not part of the state).
  std::vector<RequestId> ids;
  for (const auto& [id, req] : requests_) ids.push_back(id);
  std::sort(ids.begin(), ids.end(), [](RequestId a, RequestId b) { return a.value() < b.value(); });
  for (RequestId id : ids) {
    const Request& req = requests_.at(id);
    d.Add(id.value());
    d.Add(req.tokens);
    d.Add(req.appended ? 1 : 0);
    d.Add(req.whole ? 1 : 0);
    d.Add(req.shared);
    for (const KindState& s : req.kinds) {
      d.Add(s.first);
      d.Add(s.end);
      for (std::uint32_t b : s.blocks) d.Add(b);
    }
  }
}

}  // namespace ula
