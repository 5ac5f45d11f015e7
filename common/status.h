// Status and Result: how Hiber reports expected failures.
//
// Bugs are exceptions or CHECK failures; expected outcomes (bad input from a client, a GPU out
// of memory, a session that went away) are a Status. Error codes are the CUDA driver API's
// CUresult values, so an error raised anywhere in Hiber reaches the client shim unchanged and
// becomes exactly the CUDA error a native program would have seen. The CUDA backend
// static_asserts every value below against cuda.h.
#pragma once

#include <cerrno>
#include <cstdint>
#include <sstream>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

namespace hiber {

enum class ErrorCode : uint32_t {
  kSuccess = 0,
  kInvalidValue = 1,             // CUDA_ERROR_INVALID_VALUE: malformed input, bad argument
  kOutOfMemory = 2,              // CUDA_ERROR_OUT_OF_MEMORY
  kNotInitialized = 3,           // CUDA_ERROR_NOT_INITIALIZED
  kDeinitialized = 4,            // CUDA_ERROR_DEINITIALIZED: the session or server is gone
  kStubLibrary = 34,             // CUDA_ERROR_STUB_LIBRARY: libcuda is the toolkit stub
  kDeviceUnavailable = 46,       // CUDA_ERROR_DEVICE_UNAVAILABLE: hiberd is full or draining
  kNoDevice = 100,               // CUDA_ERROR_NO_DEVICE
  kInvalidDevice = 101,          // CUDA_ERROR_INVALID_DEVICE
  kInvalidImage = 200,           // CUDA_ERROR_INVALID_IMAGE: a fatbin or cubin we cannot read
  kInvalidContext = 201,         // CUDA_ERROR_INVALID_CONTEXT
  kMapFailed = 205,              // CUDA_ERROR_MAP_FAILED
  kAlreadyMapped = 208,          // CUDA_ERROR_ALREADY_MAPPED
  kNoBinaryForGpu = 209,         // CUDA_ERROR_NO_BINARY_FOR_GPU
  kNotMapped = 211,              // CUDA_ERROR_NOT_MAPPED
  kPeerAccessUnsupported = 217,  // CUDA_ERROR_PEER_ACCESS_UNSUPPORTED
  kInvalidPtx = 218,             // CUDA_ERROR_INVALID_PTX
  kInvalidSource = 300,          // CUDA_ERROR_INVALID_SOURCE
  kFileNotFound = 301,           // CUDA_ERROR_FILE_NOT_FOUND
  kOperatingSystem = 304,        // CUDA_ERROR_OPERATING_SYSTEM: a system call failed
  kInvalidHandle = 400,          // CUDA_ERROR_INVALID_HANDLE
  kIllegalState = 401,           // CUDA_ERROR_ILLEGAL_STATE
  kNotFound = 500,               // CUDA_ERROR_NOT_FOUND: unknown kernel or symbol
  kNotReady = 600,               // CUDA_ERROR_NOT_READY
  kIllegalAddress = 700,         // CUDA_ERROR_ILLEGAL_ADDRESS
  kLaunchOutOfResources = 701,   // CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES
  kLaunchTimeout = 702,          // CUDA_ERROR_LAUNCH_TIMEOUT: a kernel ran past its deadline
  kLaunchFailed = 719,           // CUDA_ERROR_LAUNCH_FAILED
  kNotPermitted = 800,           // CUDA_ERROR_NOT_PERMITTED: authentication or credentials
  kNotSupported = 801,           // CUDA_ERROR_NOT_SUPPORTED: unknown call, unimplemented API
  kTimeout = 909,                // CUDA_ERROR_TIMEOUT
  kUnknown = 999,                // CUDA_ERROR_UNKNOWN
};

// "CUDA_ERROR_INVALID_VALUE"; "CUDA_ERROR_<n>" for a code outside the list above.
std::string error_code_name(ErrorCode code);

// Concatenates anything streamable; used to build error messages without a format library.
template <typename... Args>
std::string str_cat(const Args&... args) {
  std::ostringstream out;
  (out << ... << args);
  return std::move(out).str();
}

class [[nodiscard]] Status {
 public:
  Status() = default;  // success
  Status(ErrorCode code, std::string message) : code_(code), message_(std::move(message)) {}

  bool ok() const { return code_ == ErrorCode::kSuccess; }
  ErrorCode code() const { return code_; }
  const std::string& message() const { return message_; }

  // "CUDA_ERROR_INVALID_VALUE: <message>", or "OK".
  std::string to_string() const;

  // The same error with "<context>: " in front of the message; success stays success.
  Status with_context(std::string_view context) const;

  friend bool operator==(const Status& a, const Status& b) {
    return a.code_ == b.code_ && a.message_ == b.message_;
  }

 private:
  ErrorCode code_ = ErrorCode::kSuccess;
  std::string message_;
};

std::ostream& operator<<(std::ostream& out, const Status& status);

// An error built from streamable parts: error(ErrorCode::kInvalidValue, "size ", n, " too big").
template <typename... Args>
Status error(ErrorCode code, const Args&... args) {
  return Status(code, str_cat(args...));
}

// A failed system call: kOperatingSystem, "<what>: <strerror(err)>". `err` defaults to errno, read
// at the call, so call it before anything else can change errno.
Status os_error(std::string_view what, int err = errno);

// "0x1f": an address, handle or size as error messages show it.
std::string hex(uint64_t value);

// Either a value or an error Status.
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : state_(std::move(value)) {}  // NOLINT(google-explicit-constructor)
  // REQUIRES: !status.ok(). A success Status carries no value, so it is turned into kUnknown.
  Result(Status status)  // NOLINT(google-explicit-constructor)
      : state_(status.ok() ? Status(ErrorCode::kUnknown, "Result built from a success Status")
                           : std::move(status)) {}

  bool ok() const { return std::holds_alternative<T>(state_); }
  Status status() const { return ok() ? Status() : std::get<Status>(state_); }

  // REQUIRES: ok().
  T& value() & { return std::get<T>(state_); }
  const T& value() const& { return std::get<T>(state_); }
  T&& value() && { return std::get<T>(std::move(state_)); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }

 private:
  std::variant<Status, T> state_;
};

}  // namespace hiber

#define HIBER_CONCAT_INNER_(a, b) a##b
#define HIBER_CONCAT_(a, b) HIBER_CONCAT_INNER_(a, b)

// Returns the Status of `expr` from the enclosing function if it is an error.
#define HIBER_RETURN_IF_ERROR(expr)                \
  do {                                             \
    ::hiber::Status hiber_status_ = (expr);        \
    if (!hiber_status_.ok()) return hiber_status_; \
  } while (0)

// `lhs = value of expr`, or returns its error from the enclosing function.
#define HIBER_ASSIGN_OR_RETURN(lhs, expr)                   \
  auto HIBER_CONCAT_(hiber_result_, __LINE__) = (expr);     \
  if (!HIBER_CONCAT_(hiber_result_, __LINE__).ok())         \
    return HIBER_CONCAT_(hiber_result_, __LINE__).status(); \
  lhs = std::move(HIBER_CONCAT_(hiber_result_, __LINE__)).value()
