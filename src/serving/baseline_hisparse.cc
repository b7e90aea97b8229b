// HiSparse device buffers (baselines.h): per request C slots, exact LRU at step granularity.
// Victim search: the slots not used in the current round, ordered by last-use round (then
// slot index, for determinism) with nth_element — O(C) per request per step.
#include <fmt/format.h>

#include <algorithm>
#include <limits>

#include "serving/baselines.h"
#include "ula/check.h"

namespace ula {
namespace {
constexpr std::uint32_t kNone = std::numeric_limits<std::uint32_t>::max();
}  // namespace

Result<HiSparseBuffers> HiSparseBuffers::Create(std::uint32_t buffer_entries) {
  if (buffer_entries == 0) {
    return MakeError(ErrorCode::kInvalidArgument, "field 'hisparse_buffer_entries': must be >= 1");
  }
  return HiSparseBuffers(buffer_entries);
}

Status HiSparseBuffers::AddRequest(std::uint64_t id, std::uint32_t history) {
  if (history == 0) return MakeError(ErrorCode::kInvalidArgument, "history must be >= 1");
  if (requests_.contains(id)) return MakeError(ErrorCode::kAlreadyExists, fmt::format("request {} exists", id));
  Request& r = requests_[id];
  r.history = history;
  r.slot_of.assign(history, kNone);
  r.pos_of.assign(capacity_, kNone);
  r.last_used.assign(capacity_, 0);
  const std::uint32_t keep = std::min(history, capacity_);
  for (std::uint32_t i = 0; i < keep; ++i) {  // the newest tokens stay in the buffer
    const std::uint32_t pos = history - keep + i;
    r.pos_of[i] = pos;
    r.slot_of[pos] = i;
    r.last_used[i] = round_ - 1;
  }
  r.used = keep;
  return Ok();
}

void HiSparseBuffers::Place(Request& r, std::span<const std::uint32_t> positions, HiSparseStepStats* stats) {
  // Free slots first.
  std::size_t next = 0;
  for (std::uint32_t s = 0; s < capacity_ && next < positions.size() && r.used < capacity_; ++s) {
    if (r.pos_of[s] != kNone) continue;
    r.pos_of[s] = positions[next];
    r.slot_of[positions[next]] = s;
    r.last_used[s] = round_;
    ++r.used;
    ++next;
  }
  if (next == positions.size()) return;
  // LRU victims among slots not used this round.
  victims_.clear();
  for (std::uint32_t s = 0; s < capacity_; ++s) {
    if (r.pos_of[s] != kNone && r.last_used[s] < round_) victims_.push_back(s);
  }
  const std::size_t need = positions.size() - next;
  ULA_CHECK(victims_.size() >= need);
  auto older = [&](std::uint32_t a, std::uint32_t b) {
    return r.last_used[a] != r.last_used[b] ? r.last_used[a] < r.last_used[b] : a < b;
  };
  if (need < victims_.size()) std::nth_element(victims_.begin(), victims_.begin() + need, victims_.end(), older);
  for (std::size_t i = 0; i < need; ++i) {
    const std::uint32_t s = victims_[i];
    r.slot_of[r.pos_of[s]] = kNone;  // a copy: the host already holds it, nothing written back
    r.pos_of[s] = positions[next + i];
    r.slot_of[positions[next + i]] = s;
    r.last_used[s] = round_;
  }
  if (stats) stats->evictions += need;
}

Status HiSparseBuffers::Append(std::uint64_t id, std::uint32_t n) {
  auto it = requests_.find(id);
  if (it == requests_.end()) return MakeError(ErrorCode::kNotFound, fmt::format("request {} unknown", id));
  Request& r = it->second;
  scratch_.clear();
  for (std::uint32_t i = 0; i < n; ++i) scratch_.push_back(r.history + i);
  r.history += n;
  r.slot_of.resize(r.history, kNone);
  // New tokens may displace entries of the current round only if nothing older is left.
  // Only slots not read in this round may take them; if fewer are left, the oldest of the
  // new tokens stay host-only until selected.
  std::uint32_t evictable = capacity_ - r.used;
  for (std::uint32_t s = 0; s < capacity_; ++s) evictable += (r.pos_of[s] != kNone && r.last_used[s] < round_);
  const std::uint32_t fit = std::min(n, evictable);
  std::vector<std::uint32_t> newest(scratch_.end() - fit, scratch_.end());
  Place(r, newest, nullptr);
  return Ok();
}

Result<HiSparseStepStats> HiSparseBuffers::Step(std::uint64_t id, std::span<const std::uint32_t> positions) {
  auto it = requests_.find(id);
  if (it == requests_.end()) return MakeError(ErrorCode::kNotFound, fmt::format("request {} unknown", id));
  Request& r = it->second;
  for (std::uint32_t p : positions) {
    if (p >= r.history) return MakeError(ErrorCode::kOutOfRange, fmt::format("position {} past history {}", p, r.history));
  }
  // Distinct misses (tagged in slot_of while collected) and distinct hit slots (marked).
  constexpr std::uint32_t kPending = kNone - 1;
  scratch_.clear();
  victims_.clear();  // hit slots
  mark_.assign(capacity_, 0);
  for (std::uint32_t p : positions) {
    const std::uint32_t s = r.slot_of[p];
    if (s == kPending) continue;
    if (s == kNone) {
      r.slot_of[p] = kPending;
      scratch_.push_back(p);
    } else if (!mark_[s]) {
      mark_[s] = 1;
      victims_.push_back(s);
    }
  }
  for (std::uint32_t q : scratch_) r.slot_of[q] = kNone;
  std::uint32_t current = 0;  // slots already used in this round by something else
  for (std::uint32_t s = 0; s < capacity_; ++s) current += (r.pos_of[s] != kNone && r.last_used[s] == round_ && !mark_[s]);
  if (current + victims_.size() + scratch_.size() > capacity_) {
    return MakeError(ErrorCode::kResourceExhausted,
                     fmt::format("request {}: {} entries needed this step exceed the {}-entry buffer", id,
                                 current + victims_.size() + scratch_.size(), capacity_));
  }
  HiSparseStepStats st;
  st.hits = victims_.size();
  st.misses = scratch_.size();
  st.distinct = st.hits + st.misses;
  for (std::uint32_t s : victims_) r.last_used[s] = round_;
  Place(r, std::vector<std::uint32_t>(scratch_), &st);
  return st;
}

Status HiSparseBuffers::Finish(std::uint64_t id) {
  if (requests_.erase(id) == 0) return MakeError(ErrorCode::kNotFound, fmt::format("request {} unknown", id));
  return Ok();
}

Result<std::uint32_t> HiSparseBuffers::NumBuffered(std::uint64_t id) const {
  auto it = requests_.find(id);
  if (it == requests_.end()) return MakeError(ErrorCode::kNotFound, fmt::format("request {} unknown", id));
  return it->second.used;
}

Status HiSparseBuffers::CheckInvariants() const {
  for (const auto& [id, r] : requests_) {
    std::uint32_t used = 0;
    for (std::uint32_t s = 0; s < capacity_; ++s) {
      if (r.pos_of[s] == kNone) continue;
      ++used;
      if (r.pos_of[s] >= r.history || r.slot_of[r.pos_of[s]] != s) {
        return MakeError(ErrorCode::kInternal, fmt::format("request {}: slot {} and its position disagree", id, s));
      }
    }
    std::uint32_t mapped = 0;
    for (std::uint32_t p = 0; p < r.history; ++p) mapped += (r.slot_of[p] != kNone);
    if (used != r.used || mapped != used) {
      return MakeError(ErrorCode::kInternal, fmt::format("request {}: {} slots used, {} mapped, count {}", id, used, mapped, r.used));
    }
  }
  return Ok();
}

}  // namespace ula
