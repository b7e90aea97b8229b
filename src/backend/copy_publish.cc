#include "backend/copy_publish.h"

#include <fmt/format.h>

#include <utility>

namespace ula {

CopyPublish::CopyPublish(ArenaId host, ArenaId device, std::uint32_t entry_bytes, std::size_t num_copies,
                         std::size_t num_swaps)
    : batches_{{host, device, entry_bytes, /*swap=*/false, {}}, {host, device, entry_bytes, /*swap=*/true, {}}},
      count_{num_copies, num_swaps},
      entry_bytes_(entry_bytes) {
  batches_[0].moves.reserve(num_copies);
  batches_[1].moves.reserve(num_swaps);
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
