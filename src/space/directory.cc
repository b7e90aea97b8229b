#include "space/directory.h"

#include <fmt/format.h>

#include <algorithm>
#include <limits>

namespace ula {

Status Directory::AddRequest(RequestId request, Rank rank) {
  if (requests_.contains(request)) {
    return MakeError(ErrorCode::kAlreadyExists, fmt::format("request {} already exists", request.value()));
  }
  if (next_tag_ == 0 || next_tag_ == refs::kSharedTag) {  // 2^32 - 2 requests so far: renumber the live ones 1..n
    next_tag_ = 1;
    for (auto& [id, req] : requests_) {
      req.tag = next_tag_++;
      for (LogicalAddr a : req.addrs) {  // its own allocations: the addresses it did not adopt
        if (!std::binary_search(req.adopted.begin(), req.adopted.end(), a)) owner_[a.value()] = req.tag;
      }
    }
  }
  requests_.emplace(request, Request{rank, {}, next_tag_++, {}});
  return Ok();
}

Directory::Request* Directory::Find(RequestId request) {
  auto it = requests_.find(request);
  return it == requests_.end() ? nullptr : &it->second;
}

const Directory::Request* Directory::Find(RequestId request) const {
  auto it = requests_.find(request);
  return it == requests_.end() ? nullptr : &it->second;
}

Result<std::span<const LogicalAddr>> Directory::AddressesOf(RequestId request) const {
  const Request* req = Find(request);
  if (req == nullptr) return MakeError(ErrorCode::kNotFound, fmt::format("request {} is unknown", request.value()));
  return std::span<const LogicalAddr>(req->addrs);
}

bool Directory::Holds(RequestId request, LogicalAddr a) const {
  const Request* req = Find(request);
  return req != nullptr && a.value() < extent() && Holds(*req, a);
}

Status Directory::CheckAddressList(std::span<const LogicalAddr> addrs, const char* what, const AddrCheck& check) const {
  std::vector<LogicalAddr> sorted(addrs.begin(), addrs.end());
  std::sort(sorted.begin(), sorted.end());
  if (auto d = std::adjacent_find(sorted.begin(), sorted.end()); d != sorted.end()) {
    return MakeError(ErrorCode::kInvalidArgument, fmt::format("{}: address {} is listed twice", what, d->value()));
  }
  for (LogicalAddr a : addrs) {
    if (!IsLive(a)) {
      return MakeError(ErrorCode::kNotFound,
                       fmt::format("{}: logical address {} is not live (freed, or never allocated)", what, a.value()));
    }
    if (check) ULA_RETURN_IF_ERROR(check(a));
  }
  return Ok();
}

Result<Directory::AddressPlan> Directory::PlanPages(RequestId request, const Request& req,
                                                    std::uint32_t n_tokens) const {
  // Token i of the list sits at offset i % P; a token at offset 0, or the first one after a
  // ShareInto (the list no longer ends in the open page), opens a fresh page.
  const std::uint32_t P = page_tokens_;
  const std::uint32_t max_pages = static_cast<std::uint32_t>(std::uint64_t{LogicalAddr::kInvalidValue} / P);
  AddressPlan plan{std::vector<LogicalAddr>(n_tokens), 0, next_page_, req.open_page};
  const std::uint64_t pos0 = req.addrs.size();
  for (std::uint32_t i = 0; i < n_tokens; ++i) {
    const std::uint64_t pos = pos0 + i;
    if (pos % P == 0 || (i == 0 && plan.open_page == kNoPage)) {
      if (plan.pages_reused < free_pages_.size()) {
        plan.open_page = free_pages_[plan.pages_reused++];
      } else if (plan.next_page < max_pages) {
        plan.open_page = plan.next_page++;
      } else {
        return MakeError(ErrorCode::kResourceExhausted,
                         fmt::format("request {}: the logical address space is exhausted", request.value()));
      }
    }
    plan.addrs[i] = LogicalAddr(static_cast<std::uint32_t>(std::uint64_t{plan.open_page} * P + pos % P));
  }
  return plan;
}

void Directory::Append(Request& req, const AddressPlan& plan) {
  std::uint64_t end = std::uint64_t{next_page_} * page_tokens_;
  if (paged_) {
    free_pages_.erase(free_pages_.begin(), free_pages_.begin() + static_cast<std::ptrdiff_t>(plan.pages_reused));
    next_page_ = plan.next_page;
    if (!plan.addrs.empty()) req.open_page = plan.open_page;
    end = std::uint64_t{next_page_} * page_tokens_;
  } else {
    for (LogicalAddr a : plan.addrs) end = std::max<std::uint64_t>(end, a.value() + std::uint64_t{1});
  }
  if (end > refs_.size()) {
    owner_.resize(end, 0);
    refs_.resize(end, 0);
  }
  for (LogicalAddr a : plan.addrs) {
    owner_[a.value()] = req.tag;
    refs_[a.value()] = refs::kRequestRef;
  }
  req.addrs.insert(req.addrs.end(), plan.addrs.begin(), plan.addrs.end());
  num_live_ += plan.addrs.size();
}

void Directory::ReleaseAddress(LogicalAddr a, const ReleaseFn& release) {
  release(a);
  owner_[a.value()] = 0;
  --num_live_;
  if (!paged_) return;
  // The page joins the free FIFO once none of its addresses is live (read from the page's
  // reference counts: no per-page metadata).
  const std::uint32_t P = page_tokens_;
  const std::uint32_t page = a.value() / P;
  const auto first = refs_.begin() + std::size_t{page} * P;
  if (std::all_of(first, first + P, [](std::uint32_t r) { return r == 0; })) free_pages_.push_back(page);
}

Status Directory::Free(RequestId request, const ReleaseFn& release) {
  ULA_RETURN_IF_ERROR(RefuseWhilePlanPending("Free"));
  auto it = requests_.find(request);
  if (it == requests_.end()) {
    return MakeError(ErrorCode::kNotFound, fmt::format("request {} is unknown or already freed", request.value()));
  }
  const std::uint32_t tag = it->second.tag;
  for (LogicalAddr a : it->second.addrs) {
    if ((refs_[a.value()] -= refs::kRequestRef) == 0) {
      ReleaseAddress(a, release);
    } else if (owner_[a.value()] == tag) {
      owner_[a.value()] = refs::kSharedTag;  // its other holders keep it where it is
    }
  }
  requests_.erase(it);
  return Ok();
}

Status Directory::Truncate(RequestId request, std::uint32_t length, const ReleaseFn& release) {
  ULA_RETURN_IF_ERROR(RefuseWhilePlanPending("Truncate"));
  Request* req = Find(request);
  if (req == nullptr) return MakeError(ErrorCode::kNotFound, fmt::format("Truncate: request {} is unknown", request.value()));
  std::vector<LogicalAddr>& addrs = req->addrs;
  if (length > addrs.size()) {
    return MakeError(ErrorCode::kOutOfRange, fmt::format("Truncate: request {} holds {} tokens, cannot keep {}",
                                                         request.value(), addrs.size(), length));
  }
  for (std::size_t i = length; i < addrs.size(); ++i) {
    const LogicalAddr a = addrs[i];
    if (owner_[a.value()] != req->tag || refs_[a.value()] != refs::kRequestRef) {
      return MakeError(ErrorCode::kFailedPrecondition,
                       fmt::format("Truncate: token {} of request {} (address {}) is {}: a shared entry is "
                                   "immutable, only the request's own unshared tail can be rolled back",
                                   i, request.value(), a.value(),
                                   owner_[a.value()] != req->tag ? "adopted (ShareInto)"
                                                                 : fmt::format("held by {} holders",
                                                                               refs::Holders(refs_[a.value()]))));
    }
  }
  for (std::size_t i = length; i < addrs.size(); ++i) {
    refs_[addrs[i].value()] = 0;
    ReleaseAddress(addrs[i], release);
  }
  addrs.resize(length);
  // Own allocations sit at offset (position % P) of their page, so the next token continues
  // the last kept one's page; after an adopted one it opens a fresh page (whose owner may
  // still hold the next offsets).
  const bool own_last = length > 0 && owner_[addrs.back().value()] == req->tag;
  req->open_page = own_last && paged_ ? addrs.back().value() / page_tokens_ : kNoPage;
  return Ok();
}

Status Directory::ShareInto(RequestId request, std::span<const LogicalAddr> addrs, const AddrCheck& check) {
  ULA_RETURN_IF_ERROR(RefuseWhilePlanPending("ShareInto"));
  Request* req = Find(request);
  if (req == nullptr) return MakeError(ErrorCode::kNotFound, fmt::format("ShareInto: request {} is unknown", request.value()));
  ULA_RETURN_IF_ERROR(CheckAddressList(addrs, "ShareInto", check));
  for (LogicalAddr a : addrs) {
    if (Holds(*req, a)) {
      return MakeError(ErrorCode::kAlreadyExists,
                       fmt::format("ShareInto: request {} already holds address {}", request.value(), a.value()));
    }
    if (refs::RequestRefs(refs_[a.value()]) == refs::kMaxRequestRefs) {
      return MakeError(ErrorCode::kResourceExhausted,
                       fmt::format("ShareInto: address {} is held by {} requests, the most there can be", a.value(),
                                   refs::kMaxRequestRefs));
    }
  }
  req->addrs.insert(req->addrs.end(), addrs.begin(), addrs.end());
  if (!addrs.empty()) req->open_page = kNoPage;  // the list no longer ends in it
  refs::MergeAdopted(req->adopted, addrs);
  for (LogicalAddr a : addrs) refs_[a.value()] += refs::kRequestRef;
  return Ok();
}

Status Directory::Retain(std::span<const LogicalAddr> addrs) {
  ULA_RETURN_IF_ERROR(CheckAddressList(addrs, "Retain"));
  for (LogicalAddr a : addrs) {
    if (refs::CacheRefs(refs_[a.value()]) == refs::kMaxCacheRefs) {
      return MakeError(ErrorCode::kResourceExhausted,
                       fmt::format("Retain: address {} has {} cache references, the most there can be", a.value(),
                                   refs::kMaxCacheRefs));
    }
  }
  for (LogicalAddr a : addrs) refs_[a.value()] += refs::kCacheRef;
  return Ok();
}

Status Directory::Release(std::span<const LogicalAddr> addrs, const ReleaseFn& release) {
  ULA_RETURN_IF_ERROR(RefuseWhilePlanPending("Release"));
  ULA_RETURN_IF_ERROR(CheckAddressList(addrs, "Release"));
  for (LogicalAddr a : addrs) {
    if (refs::CacheRefs(refs_[a.value()]) == 0) {
      return MakeError(ErrorCode::kFailedPrecondition,
                       fmt::format("Release: address {} has no cache reference to release (released twice?)",
                                   a.value()));
    }
  }
  for (LogicalAddr a : addrs) {
    if ((refs_[a.value()] -= refs::kCacheRef) == 0) ReleaseAddress(a, release);
  }
  return Ok();
}

Status Directory::RefuseWhilePlanPending(const char* what) const {
  if (plans_pending_.load(std::memory_order_acquire) == 0) return Ok();
  return MakeError(ErrorCode::kFailedPrecondition,
                   fmt::format("{}: an engine step's plan is pending (between Plan and Complete); its descriptors "
                               "name entries and slots this call could change: Complete the plan first", what));
}

Status Directory::CheckInvariants(std::string_view who, std::vector<std::uint16_t>* rank_of_out) const {
  auto fail = [who](std::string msg) { return MakeError(ErrorCode::kInternal, fmt::format("{}: {}", who, msg)); };
  const std::uint32_t n = extent();
  if (owner_.size() != n) return fail(fmt::format("owner/refs sizes {}/{} differ", owner_.size(), refs_.size()));
  constexpr std::uint16_t kNoRank = std::numeric_limits<std::uint16_t>::max();
  std::vector<std::uint16_t> rank_of(n, kNoRank);
  std::vector<std::uint32_t> listed(n, 0), own(n, 0), last_list(n, 0);
  std::uint32_t list_no = 0;
  for (const auto& [id, req] : requests_) {  // invariants 2, 3 and 5, per list
    ++list_no;
    if (req.tag == 0 || req.tag == refs::kSharedTag) return fail(fmt::format("request {} has tag {}", id.value(), req.tag));
    if (!std::is_sorted(req.adopted.begin(), req.adopted.end()) ||
        std::adjacent_find(req.adopted.begin(), req.adopted.end()) != req.adopted.end()) {
      return fail(fmt::format("request {}: its adopted list is not sorted and distinct", id.value()));
    }
    std::size_t adopted = 0;
    for (LogicalAddr a : req.addrs) {
      if (!IsLive(a)) return fail(fmt::format("request {} holds address {} that is not live", id.value(), a.value()));
      if (last_list[a.value()] == list_no) return fail(fmt::format("request {} lists address {} twice", id.value(), a.value()));
      last_list[a.value()] = list_no;
      if (req.rank.valid()) {
        if (rank_of[a.value()] != kNoRank && rank_of[a.value()] != req.rank.value()) {
          return fail(fmt::format("address {} is held by requests of ranks {} and {}", a.value(), rank_of[a.value()],
                                  req.rank.value()));
        }
        rank_of[a.value()] = req.rank.value();
      }
      ++listed[a.value()];
      const bool is_own = owner_[a.value()] == req.tag;
      const bool is_adopted = std::binary_search(req.adopted.begin(), req.adopted.end(), a);
      if (is_own == is_adopted) {
        return fail(fmt::format("address {} of request {} is {} its allocation and adopted", a.value(), id.value(),
                                is_own ? "both" : "neither"));
      }
      own[a.value()] += is_own;
      adopted += is_adopted;
    }
    if (adopted != req.adopted.size()) {
      return fail(fmt::format("request {} adopted {} addresses but lists {} of them", id.value(), req.adopted.size(), adopted));
    }
  }
  std::uint64_t live = 0;
  for (std::uint32_t a = 0; a < n; ++a) {  // invariants 1 to 3, per address
    if (refs::RequestRefs(refs_[a]) != listed[a]) {
      return fail(fmt::format("address {}: {} request references but {} lists hold it", a, refs::RequestRefs(refs_[a]),
                              listed[a]));
    }
    const std::uint32_t o = owner_[a];
    if ((o == 0) != (refs_[a] == 0)) return fail(fmt::format("address {}: owner tag {} with {} references", a, o, refs_[a]));
    if (o != 0 && o != refs::kSharedTag && own[a] != 1) {
      return fail(fmt::format("address {}: owner tag {} of no request that lists it", a, o));
    }
    live += refs_[a] != 0;
  }
  if (live != num_live_) return fail(fmt::format("{} referenced addresses but live = {}", live, num_live_));
  ULA_RETURN_IF_ERROR(CheckPages(who));
  if (rank_of_out != nullptr) *rank_of_out = std::move(rank_of);
  return Ok();
}

// Invariant 4.
Status Directory::CheckPages(std::string_view who) const {
  auto fail = [who](std::string msg) { return MakeError(ErrorCode::kInternal, fmt::format("{}: {}", who, msg)); };
  const std::uint32_t P = page_tokens_;
  if (!paged_) {
    if (next_page_ != 0 || !free_pages_.empty()) return fail("an unpaged directory has pages");
    for (const auto& [id, req] : requests_) {
      if (req.open_page != kNoPage) return fail(fmt::format("request {} has an open page, unpaged", id.value()));
    }
    return Ok();
  }
  if (std::uint64_t{next_page_} * P != extent()) {
    return fail(fmt::format("{} pages of {} for {} addresses", next_page_, P, extent()));
  }
  std::vector<std::uint32_t> page_live(next_page_, 0);
  for (std::uint32_t a = 0; a < extent(); ++a) page_live[a / P] += refs_[a] != 0;
  std::vector<bool> page_free(next_page_, false);
  for (std::uint32_t p : free_pages_) {
    if (p >= next_page_ || page_free[p] || page_live[p] != 0) {
      return fail(fmt::format("free page {} is past the end, listed twice or holds a live address", p));
    }
    page_free[p] = true;
  }
  for (std::uint32_t p = 0; p < next_page_; ++p) {
    if (page_live[p] == 0 && !page_free[p]) return fail(fmt::format("page {} has no live address but is not free", p));
  }
  for (const auto& [id, req] : requests_) {
    if (req.open_page == kNoPage) continue;
    if (req.addrs.empty() || req.addrs.back().value() / P != req.open_page || owner_[req.addrs.back().value()] != req.tag ||
        req.addrs.back().value() % P != (req.addrs.size() - 1) % P) {
      return fail(fmt::format("request {}: open page {} does not end its list", id.value(), req.open_page));
    }
  }
  return Ok();
}

void Directory::AddToDigest(StateDigest& d) const {
  std::uint64_t requests = 0;  // unordered: a sum of per-request hashes
  for (const auto& [id, r] : requests_) {
    StateDigest rd;
    rd.Add(id.value());
    rd.Add(r.rank.value());
    rd.Add(r.tag);
    for (LogicalAddr a : r.addrs) rd.Add(a.value());
    for (LogicalAddr a : r.adopted) rd.Add(a.value());
    rd.Add(r.open_page);
    requests += rd.value();
  }
  d.Add(requests);
  d.AddAll(std::span<const std::uint32_t>(owner_.data(), owner_.size()));
  d.AddAll(std::span<const std::uint32_t>(refs_));
  d.Add(next_page_);
  d.Add(free_pages_.size());
  for (std::uint32_t p : free_pages_) d.Add(p);
  d.Add(num_live_);
}

}  // namespace ula
