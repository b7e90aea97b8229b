// Errors as values. Every recoverable failure of the public API is a `ula::Error`
// inside a `Result<T>` (std::expected, [[nodiscard]]); a normal miss is std::optional. No exception
// crosses the public API. A function that returns an error has changed nothing.
#pragma once

#include <cstdint>
#include <expected>
#include <string>
#include <string_view>
#include <utility>

namespace ula {

enum class ErrorCode : std::uint8_t {
  kInvalidArgument,     // a malformed argument or config field
  kNotFound,            // unknown or freed address, block, request
  kAlreadyExists,       // double registration
  kOutOfRange,          // index past the end of a structure
  kResourceExhausted,   // the request does not fit in the memory that is left
  kFailedPrecondition,  // the structure is not in a state that allows the call (double free, unpin without pin)
  kUnsupported,         // the backend or mode cannot do this (e.g. reading bytes in counting mode)
  kInternal,            // a broken invariant
  kIo,                  // file or process failure
};

std::string_view ErrorCodeName(ErrorCode code);

class Error {
 public:
  Error(ErrorCode code, std::string message) : code_(code), message_(std::move(message)) {}

  ErrorCode code() const { return code_; }
  const std::string& message() const { return message_; }
  // "<code name>: <message>"
  std::string ToString() const;

 private:
  ErrorCode code_;
  std::string message_;
};

// Result and Status are std::expected in every respect but one: they are [[nodiscard]],
// so every call that returns one warns when its result is dropped (cast to void to drop
// one on purpose).
template <class T>
class [[nodiscard]] Result : public std::expected<T, Error> {
 public:
  using std::expected<T, Error>::expected;
  Result() = default;
  Result(const std::expected<T, Error>& e) : std::expected<T, Error>(e) {}
  Result(std::expected<T, Error>&& e) : std::expected<T, Error>(std::move(e)) {}
};
using Status = Result<void>;

inline std::unexpected<Error> MakeError(ErrorCode code, std::string message) {
  return std::unexpected<Error>(Error(code, std::move(message)));
}
inline Status Ok() { return {}; }

}  // namespace ula

// Returns the error of a Status/Result expression from the enclosing function.
#define ULA_RETURN_IF_ERROR(expr)                                      \
  do {                                                                 \
    if (auto ula_status_ = (expr); !ula_status_) {                     \
      return std::unexpected<::ula::Error>(std::move(ula_status_).error()); \
    }                                                                  \
  } while (0)
