// What libhibercublas.so and libhibercublasLt.so share: cublasStatus_t from a Status, its name
// and description (cublasGetStatusName/String, cublasLtGetStatusName/String), and the loud
// failure of a call. Both libraries include it; each keeps its own copy (hidden visibility).
#pragma once

#include <cublas_api.h>

#include <string>

#include "client_shim/library_client.h"

namespace hiber::shim::cublas {

inline cublasStatus_t status_of(const Status& s) {
  switch (s.code()) {
    case ErrorCode::kSuccess: return CUBLAS_STATUS_SUCCESS;
    case ErrorCode::kInvalidValue: return CUBLAS_STATUS_INVALID_VALUE;
    case ErrorCode::kInvalidHandle: return CUBLAS_STATUS_NOT_INITIALIZED;
    case ErrorCode::kNotSupported: return CUBLAS_STATUS_NOT_SUPPORTED;
    case ErrorCode::kOutOfMemory: return CUBLAS_STATUS_ALLOC_FAILED;
    default: return CUBLAS_STATUS_EXECUTION_FAILED;
  }
}

// The status of `s`; a failure is logged once per message, naming `library` and `call`.
inline cublasStatus_t fail(const char* library, const char* call, const Status& s) {
  if (!s.ok()) library_log_once(library, std::string(call) + ": " + s.message());
  return status_of(s);
}

inline const char* status_name(cublasStatus_t status) {
  switch (status) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_MAPPING_ERROR: return "CUBLAS_STATUS_MAPPING_ERROR";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
    case CUBLAS_STATUS_LICENSE_ERROR: return "CUBLAS_STATUS_LICENSE_ERROR";
  }
  return "CUBLAS_STATUS_UNKNOWN";
}

inline const char* status_string(cublasStatus_t status) {
  switch (status) {
    case CUBLAS_STATUS_SUCCESS: return "the operation completed successfully";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "the library was not initialized";
    case CUBLAS_STATUS_ALLOC_FAILED: return "the resource allocation failed";
    case CUBLAS_STATUS_INVALID_VALUE: return "an invalid numeric value was used as an argument";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "an absent device architectural feature is required";
    case CUBLAS_STATUS_MAPPING_ERROR: return "an access to GPU memory space failed";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "the GPU program failed to execute";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "an internal operation failed";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "the functionality requested is not supported";
    case CUBLAS_STATUS_LICENSE_ERROR: return "there is an error with the license";
  }
  return "unknown error";
}

}  // namespace hiber::shim::cublas
