#include <cstdio>
#include <cstdlib>

#include "ula/check.h"
#include "ula/error.h"

namespace ula {

std::string_view ErrorCodeName(ErrorCode code) {
  switch (code) {
    case ErrorCode::kInvalidArgument: return "invalid argument";
    case ErrorCode::kNotFound: return "not found";
    case ErrorCode::kAlreadyExists: return "already exists";
    case ErrorCode::kOutOfRange: return "out of range";
    case ErrorCode::kResourceExhausted: return "resource exhausted";
    case ErrorCode::kFailedPrecondition: return "failed precondition";
    case ErrorCode::kUnsupported: return "unsupported";
    case ErrorCode::kInternal: return "internal";
    case ErrorCode::kIo: return "io";
  }
  return "unknown";
}

std::string Error::ToString() const {
  std::string s(ErrorCodeName(code_));
  s += ": ";
  s += message_;
  return s;
}

namespace internal {
void CheckFailed(const char* what, const char* file, int line) {
  std::fprintf(stderr, "ULA check failed at %s:%d: %s\n", file, line, what);
  std::abort();
}
}  // namespace internal

}  // namespace ula
