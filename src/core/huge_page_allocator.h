// HugePageAllocator: a std::allocator replacement for large, randomly indexed arrays (the
// location table, arenas). Allocations of 2 MiB or more are 2 MiB aligned and advised to use
// transparent huge pages, so that a random lookup costs a cache miss but not also a TLB
// miss. Smaller ones use std::malloc. Stateless; thread-safe as malloc is.
#pragma once

#include <sys/mman.h>

#include <cstddef>
#include <cstdlib>
#include <new>

namespace ula {

inline constexpr std::size_t kHugePageBytes = std::size_t{2} << 20;

// Raw memory: nullptr on failure. Release with FreeHugePageMemory.
inline void* AllocateHugePageMemory(std::size_t bytes) noexcept {
  if (bytes < kHugePageBytes) return std::malloc(bytes == 0 ? 1 : bytes);
  const std::size_t rounded = (bytes + kHugePageBytes - 1) / kHugePageBytes * kHugePageBytes;
  void* p = std::aligned_alloc(kHugePageBytes, rounded);
  if (p != nullptr) (void)madvise(p, rounded, MADV_HUGEPAGE);
  return p;
}
inline void FreeHugePageMemory(void* p) noexcept { std::free(p); }

template <class T>
struct HugePageAllocator {
  using value_type = T;
  HugePageAllocator() = default;
  template <class U>
  constexpr HugePageAllocator(const HugePageAllocator<U>&) noexcept {}
  T* allocate(std::size_t n) {
    void* p = AllocateHugePageMemory(n * sizeof(T));
    if (p == nullptr) throw std::bad_alloc();  // as std::allocator; callers size their arrays up front
    return static_cast<T*>(p);
  }
  void deallocate(T* p, std::size_t) noexcept { FreeHugePageMemory(p); }
  template <class U>
  bool operator==(const HugePageAllocator<U>&) const noexcept {
    return true;
  }
};

}  // namespace ula
