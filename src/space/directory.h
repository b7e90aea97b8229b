// Directory: the requests of a space and the logical addresses they hold. One
// implementation for the DP and the TP space, which each embed one (docs/ARCHITECTURE.md,
// "The directory"); the pools that hold the entries stay with the spaces.
//
// Data. Per request (Request): its list of addresses in token order (own allocations and
// adopted ones, distinct), its owner tag (non-zero, unique among live requests, never
// refs::kSharedTag), the sorted addresses it adopted (ShareInto), its open page, and its
// rank (DP; Rank::Invalid() in TP, where an entry's home is its address's). Per address
// a < extent(): the owner tag and the packed reference count of address_refs.h (requests
// listing it, cache references on it; 0 = free).
//
// Pages (paged directory, address_space.h "Pages"). Addresses are minted in pages of
// page_tokens P: page p is [p * P, (p + 1) * P). A page belongs to the request that opened
// it; token i of a request's list sits at offset i % P of its page; a token at offset 0, or
// the first one after a ShareInto or a Truncate to an adopted token, opens a fresh page. A
// page whose last live address is freed joins a FIFO, reused as late as possible. An open
// page always holds a live address (its opener's own), so a free page is never open. An
// unpaged directory (TP with page_tokens 1) keeps no pages: its space mints each address
// by its home rule and hands it to Append.
//
// Invariants (CheckInvariants):
//  1. refs == 0 iff owner == 0 (free); num_live() counts the addresses with refs != 0.
//  2. The request part of refs is the number of lists naming the address; a list names it
//     at most once.
//  3. For every address a request lists, exactly one of "owner == its tag" and "it is in
//     its adopted list" holds; an owner tag other than 0 and kSharedTag is the tag of
//     exactly one request that lists the address.
//  4. Paged: extent() == next_page * P; the free pages are exactly the minted pages without
//     a live address, each listed once; an open page ends its request's list with one of
//     its own addresses, at offset (list size - 1) % P.
//  5. DP: every request that lists an address has the same rank.
//
// Failure: every mutating call validates all of its input before its first change, so an
// error leaves the directory as it was.
// Thread-safety: plain data under the space's one driver thread, except the count of
// pending plans, which is atomic (TP steps of different groups run on different threads).
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <span>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "core/digest.h"
#include "core/huge_page_allocator.h"
#include "space/address_refs.h"
#include "ula/check.h"
#include "ula/error.h"
#include "ula/ids.h"

namespace ula {

class Directory {
 public:
  static constexpr std::uint32_t kNoPage = 0xffffffffu;
  struct Request {
    Rank rank;                         // DP: the rank its entries live on; TP: Rank::Invalid()
    std::vector<LogicalAddr> addrs;    // [tokens] in order: adopted and allocated, distinct
    std::uint32_t tag = 0;             // its owner tag
    std::vector<LogicalAddr> adopted;  // sorted: the addresses of `addrs` it adopted
    // The page its last own allocation went to, while the list still ends there: its next
    // token continues that page. kNoPage otherwise (always, unpaged).
    std::uint32_t open_page = kNoPage;
  };
  using RequestMap = std::unordered_map<RequestId, Request>;
  // Called for an address whose last holder let go, before the directory forgets it: the
  // space frees its entries (slots, table or home entries).
  using ReleaseFn = std::function<void(LogicalAddr)>;
  // A space's extra check of one live address that a call names (DP: on the request's rank).
  using AddrCheck = std::function<Status(LogicalAddr)>;

  // New addresses for a request, chosen but not yet taken (PlanPages), or minted by the
  // space itself (unpaged).
  struct AddressPlan {
    std::vector<LogicalAddr> addrs;  // [n_tokens]
    std::size_t pages_reused = 0;    // taken from the front of the free FIFO
    std::uint32_t next_page = 0;     // next_page once taken
    std::uint32_t open_page = kNoPage;
  };

  // REQUIRES: page_tokens in [1, 65536]. Unpaged when !paged.
  Directory(std::uint32_t page_tokens, bool paged) : page_tokens_(page_tokens), paged_(paged) {}

  // Requests. Refused (kAlreadyExists) when `request` exists; renumbers the live requests'
  // tags when the tags wrap.
  Status AddRequest(RequestId request, Rank rank);
  Request* Find(RequestId request);
  const Request* Find(RequestId request) const;
  const RequestMap& requests() const { return requests_; }
  Result<std::span<const LogicalAddr>> AddressesOf(RequestId request) const;
  std::uint32_t num_requests() const { return static_cast<std::uint32_t>(requests_.size()); }

  // Addresses.
  std::uint32_t extent() const { return static_cast<std::uint32_t>(refs_.size()); }  // addresses [0, extent) are known
  bool IsLive(LogicalAddr a) const { return a.value() < refs_.size() && refs_[a.value()] != 0; }
  std::uint64_t num_live() const { return num_live_; }
  std::uint32_t next_page() const { return next_page_; }  // pages [0, next_page) were minted
  // [extent()] owner tags (read at random by the step's planners: huge pages).
  const std::vector<std::uint32_t, HugePageAllocator<std::uint32_t>>& owner() const { return owner_; }
  std::uint32_t refs(LogicalAddr a) const { return refs_[a.value()]; }  // REQUIRES: a < extent()
  std::uint32_t RefCount(LogicalAddr a) const { return IsLive(a) ? refs::Holders(refs_[a.value()]) : 0; }
  // The isolation check (address_refs.h). REQUIRES: a < extent().
  bool Holds(const Request& req, LogicalAddr a) const { return refs::Holds(owner_[a.value()], req.tag, req.adopted, a); }
  bool Holds(RequestId request, LogicalAddr a) const;
  // Ok iff every address is live (kNotFound), listed once (kInvalidArgument) and passes
  // `check` (if set), in order; `what` names the call.
  Status CheckAddressList(std::span<const LogicalAddr> addrs, const char* what, const AddrCheck& check = {}) const;

  // Allocation, in two halves so a space can place the entries in between and fail with
  // nothing changed. PlanPages: n_tokens new addresses for `req`'s next positions (paged
  // only); kResourceExhausted when the logical address space cannot hold them.
  Result<AddressPlan> PlanPages(RequestId request, const Request& req, std::uint32_t n_tokens) const;
  // Takes the plan's pages and appends its addresses to `req`, each held by it alone.
  void Append(Request& req, const AddressPlan& plan);

  // The operations of address_space.h / tp_address_space.h, refused while a plan is
  // pending. `release` frees the entries of each address whose last holder let go.
  Status Free(RequestId request, const ReleaseFn& release);
  Status Truncate(RequestId request, std::uint32_t length, const ReleaseFn& release);
  Status ShareInto(RequestId request, std::span<const LogicalAddr> addrs, const AddrCheck& check = {});
  Status Retain(std::span<const LogicalAddr> addrs);
  Status Release(std::span<const LogicalAddr> addrs, const ReleaseFn& release);

  // Plans between an engine step's Plan and Complete over the space. While one is pending
  // its descriptors name entries, slots and victims that Free, Truncate, Allocate, Write,
  // ShareInto or Release could change: those calls are refused (kFailedPrecondition).
  Status RefuseWhilePlanPending(const char* what) const;
  void BeginPlan() { plans_pending_.fetch_add(1, std::memory_order_acq_rel); }
  void EndPlan() { plans_pending_.fetch_sub(1, std::memory_order_acq_rel); }

  // Invariants 1-5; errors name `who`. rank_of, if set, gets [extent()] the rank of each
  // address's listing requests (UINT16_MAX: none).
  Status CheckInvariants(std::string_view who, std::vector<std::uint16_t>* rank_of = nullptr) const;
  void AddToDigest(StateDigest& d) const;
  void set_next_tag_for_test(std::uint32_t tag) { next_tag_ = tag; }
  // Whether the next AddRequest renumbers the live requests' tags (the tags wrapped).
  bool TagsWrapNext() const { return next_tag_ == 0 || next_tag_ == refs::kSharedTag; }

 private:
  void ReleaseAddress(LogicalAddr a, const ReleaseFn& release);
  Status CheckPages(std::string_view who) const;

  std::uint32_t page_tokens_;
  bool paged_;
  RequestMap requests_;
  std::vector<std::uint32_t, HugePageAllocator<std::uint32_t>> owner_;  // [extent] owner tag, 0 = free
  std::vector<std::uint32_t> refs_;  // [extent] packed reference counts (address_refs.h)
  std::uint32_t next_tag_ = 1;       // the next request's tag (renumbered on wrap)
  std::deque<std::uint32_t> free_pages_;  // FIFO of minted pages without a live address
  std::uint32_t next_page_ = 0;           // pages [0, next_page) have been minted
  std::uint64_t num_live_ = 0;
  std::atomic<std::uint32_t> plans_pending_{0};
};

// The status of a directory call made by `space`, after the whole-space check
// (ULA_EXPENSIVE_CHECK, the sanitizer trees) when the call succeeded.
template <class Space>
Status Checked(const Space& space, Status status) {
  if (status) ULA_EXPENSIVE_CHECK(space);
  return status;
}

// The sanitizer trees' full check after a Write (which changes bytes, never metadata) runs
// once per this many writes: at least 64, and an eighth of the entries the check visits, so
// that the checks cost at most about eight entry visits per write.
inline std::uint64_t WriteCheckStride(std::uint64_t live_addresses, std::uint32_t groups) {
  return std::max<std::uint64_t>(64, live_addresses * groups / 8);
}

}  // namespace ula
