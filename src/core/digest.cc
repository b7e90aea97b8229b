#include "core/digest.h"

#include "core/hier_bitmap.h"

namespace ula {

void StateDigest::Add(const HierBitmap& bitmap) {
  Add(bitmap.size());
  Add(bitmap.Count());
  for (std::size_t w = 0; w < bitmap.num_words(); ++w) Add(bitmap.word(w));
}

}  // namespace ula
