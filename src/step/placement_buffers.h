// PlacementBuffers: one rank's PlacementJournal (AddressSpace::TakePlacement) as the
// PlacementArrays that DeviceStep::Place takes, over buffers of its own, with Place's and
// CompletePlace's outputs sized once for max_place_seats. Host memory: what the OpenMP form
// reads, and what an engine driving the CUDA form copies to the device before Place.
// Used by the tests and the benchmark that drive device placement (one conversion, not one per
// caller). Thread-safety: one thread per object.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "ula/address_space.h"
#include "ula/ids.h"
#include "ula/step_arrays.h"

namespace ula {

struct PlacementBuffers {
  std::vector<std::uint32_t> retired, new_requests, new_tags, released, seated, seated_tags;
  std::vector<std::uint64_t> locations;  // [max_seats] Place's output: each seat's Location bits
  std::vector<CopyDescriptor> evictions; // [max_seats] Place's output
  std::vector<std::uint8_t> status;      // [max_seats] CompletePlace's input: 0, every copy landed
  std::uint32_t num_evictions = 0;
  // The counts in memory (arrays_with_counts): retired, new requests, released, seated, as
  // the last Fill wrote them; the error Place's kernel writes.
  std::uint32_t counts[4] = {0, 0, 0, 0};
  std::uint32_t error = 0;

  // max_releases / max_requests: the lists' capacities for arrays_with_counts (reserved
  // here, so their buffers never move while a Fill stays within them).
  explicit PlacementBuffers(std::uint32_t max_seats, std::uint32_t max_releases = 0, std::uint32_t max_requests = 0)
      : locations(max_seats), evictions(max_seats), status(max_seats, 0) {
    retired.reserve(max_requests), new_requests.reserve(max_requests), new_tags.reserve(max_requests);
    released.reserve(max_releases), seated.reserve(max_seats), seated_tags.reserve(max_seats);
  }

  // Replaces the lists with `journal`'s for `rank` (the requests' changes are every rank's)
  // and sets every status back to 0.
  void Fill(const PlacementJournal& journal, Rank rank = Rank(0)) {
    retired.clear(), new_requests.clear(), new_tags.clear(), released.clear(), seated.clear(), seated_tags.clear();
    for (RequestId r : journal.retired) retired.push_back(static_cast<std::uint32_t>(r.value()));
    for (const auto& r : journal.new_requests) {
      new_requests.push_back(static_cast<std::uint32_t>(r.id.value()));
      new_tags.push_back(r.tag);
    }
    for (LogicalAddr a : journal.released[rank.value()]) released.push_back(a.value());
    for (const auto& s : journal.seated[rank.value()]) {
      seated.push_back(s.addr.value());
      seated_tags.push_back(s.tag);
    }
    std::fill(status.begin(), status.end(), std::uint8_t{0});
    counts[0] = static_cast<std::uint32_t>(retired.size());
    counts[1] = static_cast<std::uint32_t>(new_requests.size());
    counts[2] = static_cast<std::uint32_t>(released.size());
    counts[3] = static_cast<std::uint32_t>(seated.size());
  }

  // The arrays over these buffers (valid until the next Fill).
  PlacementArrays arrays() {
    return PlacementArrays{.retired = retired.data(), .new_requests = new_requests.data(), .new_tags = new_tags.data(),
                           .released = released.data(), .seated = seated.data(), .seated_tags = seated_tags.data(),
                           .num_retired = static_cast<std::uint32_t>(retired.size()),
                           .num_new_requests = static_cast<std::uint32_t>(new_requests.size()),
                           .num_released = static_cast<std::uint32_t>(released.size()),
                           .num_seated = static_cast<std::uint32_t>(seated.size()), .locations = locations.data(),
                           .evictions = evictions.data(), .num_evictions = &num_evictions};
  }
  // The arrays with the counts in memory (PlacementArrays::counts): the num_* fields are the
  // lists' reserved capacities, so the value is the same after every Fill that stays within
  // them (what one captured Place replays); a list past its capacity moves its buffer, and
  // the caller sees a different value.
  PlacementArrays arrays_with_counts() {
    PlacementArrays a = arrays();
    a.num_retired = static_cast<std::uint32_t>(retired.capacity());
    a.num_new_requests = static_cast<std::uint32_t>(new_requests.capacity());
    a.num_released = static_cast<std::uint32_t>(released.capacity());
    a.num_seated = static_cast<std::uint32_t>(seated.capacity());
    a.counts = counts;
    a.error = &error;
    return a;
  }
};

}  // namespace ula
