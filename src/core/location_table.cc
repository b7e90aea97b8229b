#include "core/location_table.h"

#include "ula/check.h"

namespace ula {

void LocationTable::Translate(std::span<const LogicalAddr> addrs, std::span<Location> out) const {
  ULA_CHECK(out.size() == addrs.size());
  const std::size_t n = table_.size();
  const Location* table = table_.data();
  for (std::size_t i = 0; i < addrs.size(); ++i) {
    const std::uint32_t a = addrs[i].value();
    out[i] = a < n ? table[a] : Location::None();
  }
}

}  // namespace ula
