#include "backend/copy_publish.h"

#include <fmt/format.h>

#include <utility>

namespace ula {

CopyPublish::CopyPublish(ArenaId host, ArenaId device, std::uint32_t row_bytes, std::size_t num_copies,
                         std::size_t num_swaps, std::uint32_t rows_per_entry)
    : batches_{{host, device, row_bytes, /*swap=*/false, {}}, {host, device, row_bytes, /*swap=*/true, {}}},
      count_{num_copies, num_swaps},
      row_bytes_(row_bytes),
      rows_per_entry_(rows_per_entry) {
  ULA_CHECK(rows_per_entry >= 1);
  batches_[0].moves.reserve(num_copies * rows_per_entry);
  batches_[1].moves.reserve(num_swaps * rows_per_entry);
}

void CopyPublish::Run(Backend& backend) {
  ULA_CHECK(added_ == size());
  Fence fences[2] = {0, 0};  // 0: not submitted
  for (int k = 0; k < 2; ++k) {
    if (batches_[k].moves.empty()) continue;
    auto fence = backend.Submit(std::move(batches_[k]));
    if (fence) {
      fences[k] = *fence;
    } else {
      failed_[k] = true;
      why_[k] = fence.error().message();
    }
  }
  for (int k = 0; k < 2; ++k) {
    if (fences[k] == 0) continue;
    if (Status w = backend.Wait(fences[k]); !w) {
      failed_[k] = true;
      why_[k] = w.error().message();
    }
  }
}

Error CopyPublish::Failure(std::string_view context) const {
  ULA_CHECK(!all_arrived());
  std::string what;
  if (failed_[0]) what = fmt::format("host->device copy of {} entries failed ({})", count_[0], why_[0]);
  if (failed_[1]) {
    what += fmt::format("{}host<->device swap of {} entries failed ({})", failed_[0] ? "; " : "", count_[1], why_[1]);
  }
  return Error(ErrorCode::kIo, fmt::format("{}: {}", context, what));
}

}  // namespace ula
