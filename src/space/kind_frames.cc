#include "space/kind_frames.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>

#include "ula/check.h"

namespace ula {

namespace {
std::uint32_t RowsOf(const KvKind& kind) {
  return kind.lifetime == KindLifetime::kPerRequest ? kind.state_rows : kKindBlockEntries;
}

std::unexpected<Error> Bad(std::string msg) { return MakeError(ErrorCode::kInvalidArgument, std::move(msg)); }
}  // namespace

Result<std::vector<KindEnvelope>> KindEnvelopes(std::span<const KvKind> kinds, std::uint64_t frame_bytes) {
  if (frame_bytes == 0 || frame_bytes % kEnvelopeAlign != 0) {
    return Bad(fmt::format("frame_bytes = {}: must be a positive multiple of {}", frame_bytes, kEnvelopeAlign));
  }
  std::vector<KindEnvelope> out;
  for (std::size_t k = 0; k < kinds.size(); ++k) {
    KindEnvelope e;
    e.rows = RowsOf(kinds[k]);
    e.bytes = std::uint64_t{e.rows} * kinds[k].layers * kinds[k].row_bytes;
    if (e.bytes == 0 || e.bytes > frame_bytes) {
      return Bad(fmt::format("kinds[{}]: the envelope of '{}' ({} rows x {} layers x {} B = {} B) does not fit "
                             "one frame of {} B", k, kinds[k].name, e.rows, kinds[k].layers, kinds[k].row_bytes,
                             e.bytes, frame_bytes));
    }
    // The most blocks a frame holds whose stride divides it and is aligned (n = 1 always is).
    std::uint64_t n = frame_bytes / e.bytes;
    while (frame_bytes % n != 0 || (frame_bytes / n) % kEnvelopeAlign != 0) --n;
    e.per_frame = static_cast<std::uint32_t>(n);
    e.padded = frame_bytes / n;
    out.push_back(e);
  }
  return out;
}

Status KindFramesConfig::Validate() const {
  if (Status s = ValidateKinds(kinds); !s) return s;
  auto env = KindEnvelopes(kinds, frame_bytes);
  if (!env) return Bad("KindFramesConfig." + env.error().message());
  if (budget_bytes < frame_bytes) {
    return Bad(fmt::format("KindFramesConfig.budget_bytes = {}: holds no frame of {} B (frame_bytes)", budget_bytes,
                           frame_bytes));
  }
  if (budget_bytes / frame_bytes > 0xffffffffull / 4096) {
    return Bad(fmt::format("KindFramesConfig.budget_bytes = {}: more than 2^20 frames", budget_bytes));
  }
  return Ok();
}

Result<KindFrames> KindFrames::Create(const KindFramesConfig& config, std::byte* bytes) {
  ULA_RETURN_IF_ERROR(config.Validate());
  KindFrames f;
  f.kinds_ = config.kinds;
  f.envelopes_ = *KindEnvelopes(config.kinds, config.frame_bytes);
  f.frame_bytes_ = config.frame_bytes;
  f.from_top_ = config.take_from_top;
  f.bytes_ = bytes;
  f.frames_.resize(config.budget_bytes / config.frame_bytes);
  f.withheld_.assign(f.frames_.size(), 0);
  for (std::uint32_t i = 0; i < f.frames_.size(); ++i) f.free_.insert(f.free_.end(), i);
  f.room_.resize(config.kinds.size());
  f.frames_of_.assign(config.kinds.size(), 0);
  f.in_use_.assign(config.kinds.size(), 0);
  return f;
}

std::uint64_t KindFrames::PaddingInUse() const {
  std::uint64_t pad = 0;
  for (std::size_t k = 0; k < envelopes_.size(); ++k) pad += in_use_[k] * (envelopes_[k].padded - envelopes_[k].bytes);
  return pad;
}

std::optional<std::uint32_t> KindFrames::Take(std::uint32_t k) {
  const std::uint32_t per = envelopes_[k].per_frame;
  std::uint32_t f;
  if (!room_[k].empty()) {
    f = *room_[k].begin();
  } else if (!free_.empty()) {
    const std::set<std::uint32_t>& from = ready_.empty() ? free_ : ready_;
    f = from_top_ ? *from.rbegin() : *from.begin();
    free_.erase(f);
    ready_.erase(f);
    Frame& frame = frames_[f];
    frame.kind = k;
    frame.used.assign(per, 0);  // the buffer a free frame kept: no allocation when it fits
    ++frames_of_[k];
    room_[k].insert(f);
  } else {
    return std::nullopt;
  }
  return TakeIn(k, f);
}

std::uint32_t KindFrames::TakeIn(std::uint32_t k, std::uint32_t f) {
  const std::uint32_t per = envelopes_[k].per_frame;
  Frame& frame = frames_[f];
  // From the first block that may be free: filling a frame of C4 slots (8,704 for V4-Flash)
  // one block at a time scanned it from 0 each time, quadratic in the frame.
  std::uint32_t i = frame.below_all_used;
  while (frame.used[i] != 0) ++i;  // the frame has room
  frame.used[i] = 1;
  frame.below_all_used = i + 1;
  if (++frame.live == per) room_[k].erase(f);
  ++in_use_[k];
  return f * per + i;
}

std::uint32_t KindFrames::Compact(std::uint32_t k, const PinnedFn& pinned, const MovedFn& moved) {
  const std::uint32_t per = envelopes_[k].per_frame;
  const std::uint64_t bytes = envelopes_[k].bytes;
  std::uint32_t returned = 0;
  std::set<std::uint32_t> tried;  // frames with a pinned block: they stay
  for (;;) {
    // The sparsest frame of the kind that may move, and the room of the others.
    std::uint32_t source = kFree;
    std::uint64_t room = 0;
    for (std::uint32_t f : room_[k]) room += per - frames_[f].live;
    for (std::uint32_t f : room_[k]) {
      if (!tried.contains(f) && (source == kFree || frames_[f].live < frames_[source].live)) source = f;
    }
    if (source == kFree || frames_[source].live > room - (per - frames_[source].live)) return returned;
    bool movable = true;
    for (std::uint32_t i = 0; i < per && movable; ++i) movable = frames_[source].used[i] == 0 || !pinned(source * per + i);
    if (!movable) {
      tried.insert(source);
      continue;
    }
    for (std::uint32_t i = 0; i < per && frames_[source].kind == k; ++i) {  // until the frame returns
      if (frames_[source].used[i] == 0) continue;
      auto dest = room_[k].begin();
      if (*dest == source) ++dest;  // room elsewhere was counted above
      const std::uint32_t from = source * per + i;
      const std::uint32_t to = TakeIn(k, *dest);
      if (bytes_ != nullptr) std::memcpy(bytes_ + Offset(k, to), bytes_ + Offset(k, from), bytes);
      moved(from, to);
      Give(k, from);  // the last one returns the frame
    }
    if (frames_[source].kind == k) return returned;  // not returned (an invariant broke): stop
    ++returned;
  }
}

void KindFrames::Give(std::uint32_t k, std::uint32_t block) {
  const std::uint32_t per = envelopes_[k].per_frame;
  const std::uint32_t f = block / per;
  ULA_CHECK(f < frames_.size() && frames_[f].kind == k && frames_[f].used[block % per] != 0);
  Frame& frame = frames_[f];
  const bool was_full = frame.live == per;
  frame.used[block % per] = 0;
  frame.below_all_used = std::min(frame.below_all_used, block % per);
  --in_use_[k];
  if (--frame.live == 0) {  // the frame returns to the budget
    room_[k].erase(f);
    --frames_of_[k];
    frame.kind = kFree;
    frame.below_all_used = 0;
    frame.used.clear();  // keeps its buffer for the frame's next kind
    free_.insert(f);
    if (withheld_[f] != 0) ready_.insert(f);
  } else if (was_full) {  // listed with room from now on (a frame with room already is)
    room_[k].insert(f);
  }
}

std::uint32_t KindFrames::FramesNeeded(std::span<const std::uint32_t> takes, std::span<const std::uint32_t> gives) const {
  std::uint64_t frames = 0;
  for (std::size_t k = 0; k < envelopes_.size(); ++k) {
    const std::uint64_t per = envelopes_[k].per_frame;
    const std::uint64_t room = std::uint64_t{frames_of_[k]} * per - in_use_[k] + gives[k];
    if (takes[k] > room) frames += (takes[k] - room + per - 1) / per;
  }
  return static_cast<std::uint32_t>(std::min<std::uint64_t>(frames, 0xffffffffu));
}

bool KindFrames::IsLive(std::uint32_t k, std::uint32_t block) const {
  const std::uint32_t per = envelopes_[k].per_frame;
  const std::uint32_t f = block / per;
  return f < frames_.size() && frames_[f].kind == k && frames_[f].used[block % per] != 0;
}

void KindFrames::Withhold(std::uint32_t f) {
  ULA_CHECK(f < frames_.size() && frames_[f].kind == kFree && withheld_[f] == 0);
  withheld_[f] = 1;
  ++withheld_count_;
  ready_.insert(f);
}

void KindFrames::Release(std::uint32_t f) {
  ULA_CHECK(f < frames_.size() && frames_[f].kind == kFree && withheld_[f] != 0);
  withheld_[f] = 0;
  --withheld_count_;
  ready_.erase(f);
}

std::vector<std::uint32_t> KindFrames::FreeInTakeOrder() const {
  std::vector<std::uint32_t> out(free_.begin(), free_.end());
  if (from_top_) std::reverse(out.begin(), out.end());
  return out;
}

StridedLayer KindFrames::Layer(std::uint32_t k, std::uint32_t layer) const {
  const KindEnvelope& e = envelopes_[k];
  const std::uint64_t layer_bytes = std::uint64_t{e.rows} * kinds_[k].row_bytes;
  return StridedLayer{bytes_ == nullptr ? nullptr : bytes_ + layer * layer_bytes, e.padded,
                      static_cast<std::uint32_t>(frames_.size() * e.per_frame), e.rows, kinds_[k].row_bytes};
}

Status KindFrames::CheckInvariants(std::string_view who) const {
  auto fail = [who](std::string msg) {
    return MakeError(ErrorCode::kInternal, fmt::format("{}: frames: {}", who, msg));
  };
  std::vector<std::uint32_t> frames_of(envelopes_.size(), 0), live(envelopes_.size(), 0);
  std::uint32_t free = 0;
  for (std::uint32_t f = 0; f < frames_.size(); ++f) {
    const Frame& frame = frames_[f];
    if (frame.kind == kFree) {
      if (frame.live != 0 || !frame.used.empty() || !free_.contains(f)) {
        return fail(fmt::format("frame {} of no kind holds {} blocks or is not listed free", f, frame.live));
      }
      ++free;
      if (ready_.contains(f) != (withheld_[f] != 0)) {
        return fail(fmt::format("free frame {} is {}withheld but {}listed as free and withheld", f,
                                withheld_[f] != 0 ? "" : "not ", ready_.contains(f) ? "" : "not "));
      }
      continue;
    }
    if (frame.kind >= envelopes_.size() || free_.contains(f) || ready_.contains(f)) {
      return fail(fmt::format("frame {} of kind {} is listed free or of no known kind", f, frame.kind));
    }
    const std::uint32_t per = envelopes_[frame.kind].per_frame;
    std::uint32_t used = 0;
    for (std::uint8_t u : frame.used) used += u;
    if (frame.used.size() != per || used != frame.live || frame.live == 0) {
      return fail(fmt::format("frame {} of '{}': {} live, {} used bits of {} (a frame with no live block returns to "
                              "the budget)", f, kinds_[frame.kind].name, frame.live, used, frame.used.size()));
    }
    if (frame.below_all_used > per ||
        std::find(frame.used.begin(), frame.used.begin() + frame.below_all_used, 0) !=
            frame.used.begin() + frame.below_all_used) {
      return fail(fmt::format("frame {} of '{}': a free block below {}, where the search for a free block starts", f,
                              kinds_[frame.kind].name, frame.below_all_used));
    }
    if (room_[frame.kind].contains(f) != (frame.live < per)) {
      return fail(fmt::format("frame {} of '{}' with {} of {} live is {}listed with room", f, kinds_[frame.kind].name,
                              frame.live, per, frame.live < per ? "not " : ""));
    }
    ++frames_of[frame.kind];
    live[frame.kind] += frame.live;
  }
  std::uint64_t kinds_frames = 0;
  for (std::size_t k = 0; k < envelopes_.size(); ++k) {
    if (frames_of[k] != frames_of_[k] || live[k] != in_use_[k]) {
      return fail(fmt::format("kind '{}': {} frames and {} live blocks, counted {} and {}", kinds_[k].name,
                              frames_of[k], live[k], frames_of_[k], in_use_[k]));
    }
    for (std::uint32_t f : room_[k]) {
      if (f >= frames_.size() || frames_[f].kind != k) return fail(fmt::format("frame {} with room is not '{}'s", f, kinds_[k].name));
    }
    kinds_frames += frames_of[k];
  }
  if (free != free_.size() || free + kinds_frames != frames_.size() || ready_.size() > free) {
    return fail(fmt::format("{} free frames ({} listed) and {} of kinds, not the budget's {}", free, free_.size(),
                            kinds_frames, frames_.size()));
  }
  return Ok();
}

void KindFrames::AddToDigest(StateDigest& d) const {
  d.Add(frames_.size());
  for (std::uint8_t w : withheld_) d.Add(w);
  for (const Frame& f : frames_) {
    d.Add(f.kind);
    d.Add(f.live);
    for (std::uint8_t u : f.used) d.Add(u);
  }
}

}  // namespace ula
