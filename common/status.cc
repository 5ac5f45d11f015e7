#include "common/status.h"

#include <cstring>
#include <ostream>

namespace hiber {

std::string error_code_name(ErrorCode code) {
  switch (code) {
    case ErrorCode::kSuccess: return "CUDA_SUCCESS";
    case ErrorCode::kInvalidValue: return "CUDA_ERROR_INVALID_VALUE";
    case ErrorCode::kOutOfMemory: return "CUDA_ERROR_OUT_OF_MEMORY";
    case ErrorCode::kNotInitialized: return "CUDA_ERROR_NOT_INITIALIZED";
    case ErrorCode::kDeinitialized: return "CUDA_ERROR_DEINITIALIZED";
    case ErrorCode::kStubLibrary: return "CUDA_ERROR_STUB_LIBRARY";
    case ErrorCode::kDeviceUnavailable: return "CUDA_ERROR_DEVICE_UNAVAILABLE";
    case ErrorCode::kNoDevice: return "CUDA_ERROR_NO_DEVICE";
    case ErrorCode::kInvalidDevice: return "CUDA_ERROR_INVALID_DEVICE";
    case ErrorCode::kInvalidImage: return "CUDA_ERROR_INVALID_IMAGE";
    case ErrorCode::kInvalidContext: return "CUDA_ERROR_INVALID_CONTEXT";
    case ErrorCode::kMapFailed: return "CUDA_ERROR_MAP_FAILED";
    case ErrorCode::kAlreadyMapped: return "CUDA_ERROR_ALREADY_MAPPED";
    case ErrorCode::kNoBinaryForGpu: return "CUDA_ERROR_NO_BINARY_FOR_GPU";
    case ErrorCode::kNotMapped: return "CUDA_ERROR_NOT_MAPPED";
    case ErrorCode::kPeerAccessUnsupported: return "CUDA_ERROR_PEER_ACCESS_UNSUPPORTED";
    case ErrorCode::kInvalidPtx: return "CUDA_ERROR_INVALID_PTX";
    case ErrorCode::kInvalidSource: return "CUDA_ERROR_INVALID_SOURCE";
    case ErrorCode::kFileNotFound: return "CUDA_ERROR_FILE_NOT_FOUND";
    case ErrorCode::kOperatingSystem: return "CUDA_ERROR_OPERATING_SYSTEM";
    case ErrorCode::kInvalidHandle: return "CUDA_ERROR_INVALID_HANDLE";
    case ErrorCode::kIllegalState: return "CUDA_ERROR_ILLEGAL_STATE";
    case ErrorCode::kNotFound: return "CUDA_ERROR_NOT_FOUND";
    case ErrorCode::kNotReady: return "CUDA_ERROR_NOT_READY";
    case ErrorCode::kIllegalAddress: return "CUDA_ERROR_ILLEGAL_ADDRESS";
    case ErrorCode::kLaunchOutOfResources: return "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES";
    case ErrorCode::kLaunchTimeout: return "CUDA_ERROR_LAUNCH_TIMEOUT";
    case ErrorCode::kLaunchFailed: return "CUDA_ERROR_LAUNCH_FAILED";
    case ErrorCode::kNotPermitted: return "CUDA_ERROR_NOT_PERMITTED";
    case ErrorCode::kNotSupported: return "CUDA_ERROR_NOT_SUPPORTED";
    case ErrorCode::kTimeout: return "CUDA_ERROR_TIMEOUT";
    case ErrorCode::kUnknown: return "CUDA_ERROR_UNKNOWN";
  }
  return str_cat("CUDA_ERROR_", static_cast<uint32_t>(code));
}

std::string Status::to_string() const {
  if (ok()) return "OK";
  return message_.empty() ? error_code_name(code_) : error_code_name(code_) + ": " + message_;
}

Status Status::with_context(std::string_view context) const {
  if (ok()) return *this;
  return Status(code_, str_cat(context, ": ", message_));
}

std::ostream& operator<<(std::ostream& out, const Status& status) {
  return out << status.to_string();
}

Status os_error(std::string_view what, int err) {
  return error(ErrorCode::kOperatingSystem, what, ": ", std::strerror(err));
}

std::string hex(uint64_t value) { return str_cat("0x", std::hex, value); }

}  // namespace hiber
