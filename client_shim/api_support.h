// What the runtime's and the driver's entry point bodies share: turning a Status into the API's
// error code, kept as the thread's last error, with its message logged. (Tracing is around every
// body, in the generated exported functions: entry_support.h.) Status codes are CUresult
// values, and cudaError_t shares them for every code hiberd and the core produce, so one integer
// type serves both front-ends.
#pragma once

#include <glog/logging.h>

#include "client_shim/client.h"

namespace hiber::shim {

// A failure: kept as the thread's last error (runtime API) and logged, once per distinct
// call site burst, so a program that ignores return codes still leaves a trail.
inline int failed(const char* name, const Status& status) {
  const int code = static_cast<int>(status.code());
  thread_last_error() = code;
  if (status.code() != ErrorCode::kNotReady) thread_last_error_message() = status.message();
  if (status.code() != ErrorCode::kNotReady) {
    LOG_FIRST_N(WARNING, 256) << "hibercuda: " << name << " failed (" << code
                              << "): " << status.message();
  }
  return code;
}

// An entry point's result as the API's error type, Code (cudaError_t or CUresult: 0 is success
// in both). Lambdas, so that each API's file binds them to its type once and keeps the default
// argument: `constexpr auto& fail = hiber::shim::fail<CUresult>;`.
template <typename Code>
inline constexpr auto fail =
    [](const char* name, const Status& status) { return static_cast<Code>(failed(name, status)); };

template <typename Code>
inline constexpr auto done = [](const char* name, const Status& status) {
  return status.ok() ? Code{} : fail<Code>(name, status);
};

template <typename Code>
inline constexpr auto invalid = [](const char* name, const char* why = "invalid argument") {
  return fail<Code>(name, Status(ErrorCode::kInvalidValue, why));
};

// Mapped (zero-copy) host memory: kernels run in hiberd, another process, and cannot reach the
// client's memory, so devices report canMapHostMemory = 0 and every way to map host memory
// fails with this (docs/shim.md, "Mapped host memory").
inline Status mapped_host_memory_unsupported() {
  return Status(ErrorCode::kNotSupported,
                "mapped host memory is not supported (canMapHostMemory is 0): kernels run in "
                "hiberd and cannot reach this process's memory; copy to device memory instead");
}

// IPC handles (cudaIpcGetMemHandle, cudaIpcGetEventHandle and their opening, the driver's
// cuIpc*): a function's memory and events are hiberd's, in hiberd's process, and no other
// process may open them; functions share nothing with each other (docs/shim.md).
inline Status ipc_unsupported() {
  return Status(ErrorCode::kNotSupported,
                "IPC handles are not supported: a function's device memory and events live in "
                "hiberd, and no other process may open them");
}

// An entry point hibercuda does not implement: its name is logged once, and the API's
// "not supported" error returned. Never a silent success.
extern "C" int hiber_shim_unsupported(const char* library, const char* name);

}  // namespace hiber::shim
