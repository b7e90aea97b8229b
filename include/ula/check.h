// Checks in three tiers:
//   ULA_CHECK(cond)            always on; aborts with file:line on failure (a bug, not bad input).
//   ULA_DCHECK(cond)           debug builds only (NDEBUG off).
//   ULA_EXPENSIVE_CHECK(obj)   calls obj.CheckInvariants() when ULA_EXPENSIVE_CHECKS is defined
//                              (the sanitizer trees), aborting with its message on failure.
// Bad input from callers is never a check failure: it is an Error value.
#pragma once

namespace ula::internal {
[[noreturn]] void CheckFailed(const char* what, const char* file, int line);
}  // namespace ula::internal

#define ULA_CHECK(cond)                                               \
  do {                                                                \
    if (!(cond)) [[unlikely]] {                                       \
      ::ula::internal::CheckFailed(#cond, __FILE__, __LINE__);        \
    }                                                                 \
  } while (0)

#ifndef NDEBUG
#define ULA_DCHECK(cond) ULA_CHECK(cond)
#else
#define ULA_DCHECK(cond) \
  do {                   \
  } while (0)
#endif

#ifdef ULA_EXPENSIVE_CHECKS
#define ULA_EXPENSIVE_CHECK(obj)                                                   \
  do {                                                                             \
    if (auto ula_inv_ = (obj).CheckInvariants(); !ula_inv_) [[unlikely]] {         \
      ::ula::internal::CheckFailed(ula_inv_.error().message().c_str(), __FILE__, __LINE__); \
    }                                                                              \
  } while (0)
#else
#define ULA_EXPENSIVE_CHECK(obj) \
  do {                           \
  } while (0)
#endif
