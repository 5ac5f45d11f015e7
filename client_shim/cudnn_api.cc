// libhibercudnn.so: the cuDNN 9 API (libcudnn.so.9), remoted to hiberd. This file: handles,
// streams, versions and error strings. The legacy tensor calls are in cudnn_legacy.cc, the
// backend (graph) API in cudnn_backend.cc.
#include <cuda_runtime_api.h>

#include <cstring>

#include "client_shim/cudnn_common.h"

namespace hiber::shim::dnn {
namespace {

thread_local std::string last_error;

}  // namespace

void set_last_error(const std::string& message) {
  last_error = message;
  library_log_once("cuDNN", message);
}

std::string take_last_error() { return std::exchange(last_error, std::string()); }

cudnnStatus_t fail(const char* call, const Status& s) {
  if (s.ok()) return CUDNN_STATUS_SUCCESS;
  set_last_error(std::string(call) + ": " + s.message());
  switch (s.code()) {
    case ErrorCode::kInvalidValue:
    case ErrorCode::kInvalidHandle: return CUDNN_STATUS_BAD_PARAM;
    case ErrorCode::kNotSupported: return CUDNN_STATUS_NOT_SUPPORTED;
    case ErrorCode::kOutOfMemory: return CUDNN_STATUS_ALLOC_FAILED;
    case ErrorCode::kNoDevice:
    case ErrorCode::kNotInitialized:
    case ErrorCode::kDeinitialized: return CUDNN_STATUS_NOT_INITIALIZED;
    default: return CUDNN_STATUS_EXECUTION_FAILED;
  }
}

LibraryHandleObj* handle_of(cudnnHandle_t handle, const char* call) {
  auto h = library_handle(handle, library_ops::Library::kDnn);
  if (!h.ok()) {
    set_last_error(std::string(call) + ": " + h.status().message());
    return nullptr;
  }
  return *h;
}

}  // namespace hiber::shim::dnn

using namespace hiber::shim::dnn;  // NOLINT: the C API's definitions below

cudnnStatus_t hiber_entry::cudnnCreate(cudnnHandle_t* handle) {
  if (handle == nullptr) return bad_param("cudnnCreate", "handle is NULL");
  auto made = hiber::shim::library_handle_create(hiber::library_ops::Library::kDnn);
  if (!made.ok()) {
    fail("cudnnCreate", made.status());
    return CUDNN_STATUS_NOT_INITIALIZED;
  }
  *handle = reinterpret_cast<cudnnHandle_t>(*made);
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t hiber_entry::cudnnDestroy(cudnnHandle_t handle) {
  auto* h = handle_of(handle, "cudnnDestroy");
  if (h == nullptr) return CUDNN_STATUS_BAD_PARAM;
  return fail("cudnnDestroy", hiber::shim::library_handle_destroy(h));
}

cudnnStatus_t hiber_entry::cudnnSetStream(cudnnHandle_t handle, cudaStream_t stream) {
  auto* h = handle_of(handle, "cudnnSetStream");
  if (h == nullptr) return CUDNN_STATUS_BAD_PARAM;
  return fail("cudnnSetStream", hiber::shim::library_set_stream(h, stream));
}

cudnnStatus_t hiber_entry::cudnnGetStream(cudnnHandle_t handle, cudaStream_t* stream) {
  auto* h = handle_of(handle, "cudnnGetStream");
  if (h == nullptr) return CUDNN_STATUS_BAD_PARAM;
  if (stream == nullptr) return bad_param("cudnnGetStream", "stream is NULL");
  *stream = static_cast<cudaStream_t>(h->stream);
  return CUDNN_STATUS_SUCCESS;
}

// The versions of the headers Hiber was built with: the cudnn-frontend enables features by them.
size_t hiber_entry::cudnnGetVersion(void) { return CUDNN_VERSION; }
size_t hiber_entry::cudnnGetMaxDeviceVersion(void) { return 1200; }
size_t hiber_entry::cudnnGetCudartVersion(void) { return CUDART_VERSION; }

cudnnStatus_t hiber_entry::cudnnGetProperty(libraryPropertyType type, int* value) {
  if (value == nullptr) return bad_param("cudnnGetProperty", "value is NULL");
  switch (type) {
    case MAJOR_VERSION: *value = CUDNN_MAJOR; return CUDNN_STATUS_SUCCESS;
    case MINOR_VERSION: *value = CUDNN_MINOR; return CUDNN_STATUS_SUCCESS;
    case PATCH_LEVEL: *value = CUDNN_PATCHLEVEL; return CUDNN_STATUS_SUCCESS;
  }
  return bad_param("cudnnGetProperty", "unknown libraryPropertyType " + std::to_string(type));
}

const char* hiber_entry::cudnnGetErrorString(cudnnStatus_t status) {
  switch (status) {
#define HIBER_STATUS(s) \
  case s: return #s;
    HIBER_STATUS(CUDNN_STATUS_SUCCESS)
    HIBER_STATUS(CUDNN_STATUS_NOT_INITIALIZED)
    HIBER_STATUS(CUDNN_STATUS_SUBLIBRARY_VERSION_MISMATCH)
    HIBER_STATUS(CUDNN_STATUS_SERIALIZATION_VERSION_MISMATCH)
    HIBER_STATUS(CUDNN_STATUS_DEPRECATED)
    HIBER_STATUS(CUDNN_STATUS_LICENSE_ERROR)
    HIBER_STATUS(CUDNN_STATUS_RUNTIME_IN_PROGRESS)
    HIBER_STATUS(CUDNN_STATUS_RUNTIME_FP_OVERFLOW)
    HIBER_STATUS(CUDNN_STATUS_SUBLIBRARY_LOADING_FAILED)
    HIBER_STATUS(CUDNN_STATUS_BAD_PARAM)
    HIBER_STATUS(CUDNN_STATUS_BAD_PARAM_NULL_POINTER)
    HIBER_STATUS(CUDNN_STATUS_BAD_PARAM_MISALIGNED_POINTER)
    HIBER_STATUS(CUDNN_STATUS_BAD_PARAM_NOT_FINALIZED)
    HIBER_STATUS(CUDNN_STATUS_BAD_PARAM_OUT_OF_BOUND)
    HIBER_STATUS(CUDNN_STATUS_BAD_PARAM_SIZE_INSUFFICIENT)
    HIBER_STATUS(CUDNN_STATUS_BAD_PARAM_STREAM_MISMATCH)
    HIBER_STATUS(CUDNN_STATUS_BAD_PARAM_SHAPE_MISMATCH)
    HIBER_STATUS(CUDNN_STATUS_BAD_PARAM_DUPLICATED_ENTRIES)
    HIBER_STATUS(CUDNN_STATUS_BAD_PARAM_ATTRIBUTE_TYPE)
    HIBER_STATUS(CUDNN_STATUS_BAD_PARAM_CUDA_GRAPH_MISMATCH)
    HIBER_STATUS(CUDNN_STATUS_BAD_PARAM_DESCRIPTOR_TYPE)
    HIBER_STATUS(CUDNN_STATUS_NOT_SUPPORTED)
    HIBER_STATUS(CUDNN_STATUS_NOT_SUPPORTED_GRAPH_PATTERN)
    HIBER_STATUS(CUDNN_STATUS_NOT_SUPPORTED_SHAPE)
    HIBER_STATUS(CUDNN_STATUS_NOT_SUPPORTED_DATA_TYPE)
    HIBER_STATUS(CUDNN_STATUS_NOT_SUPPORTED_LAYOUT)
    HIBER_STATUS(CUDNN_STATUS_NOT_SUPPORTED_INCOMPATIBLE_CUDA_DRIVER)
    HIBER_STATUS(CUDNN_STATUS_NOT_SUPPORTED_INCOMPATIBLE_CUDART)
    HIBER_STATUS(CUDNN_STATUS_NOT_SUPPORTED_ARCH_MISMATCH)
    HIBER_STATUS(CUDNN_STATUS_NOT_SUPPORTED_RUNTIME_PREREQUISITE_MISSING)
    HIBER_STATUS(CUDNN_STATUS_NOT_SUPPORTED_SUBLIBRARY_UNAVAILABLE)
    HIBER_STATUS(CUDNN_STATUS_NOT_SUPPORTED_SHARED_MEMORY_INSUFFICIENT)
    HIBER_STATUS(CUDNN_STATUS_NOT_SUPPORTED_PADDING)
    HIBER_STATUS(CUDNN_STATUS_NOT_SUPPORTED_BAD_LAUNCH_PARAM)
    HIBER_STATUS(CUDNN_STATUS_NOT_SUPPORTED_CUDA_GRAPH_NATIVE_API)
    HIBER_STATUS(CUDNN_STATUS_NOT_SUPPORTED_INVALID_DYNAMIC_SHAPE)
    HIBER_STATUS(CUDNN_STATUS_INTERNAL_ERROR)
    HIBER_STATUS(CUDNN_STATUS_INTERNAL_ERROR_COMPILATION_FAILED)
    HIBER_STATUS(CUDNN_STATUS_INTERNAL_ERROR_UNEXPECTED_VALUE)
    HIBER_STATUS(CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED)
    HIBER_STATUS(CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED)
    HIBER_STATUS(CUDNN_STATUS_INTERNAL_ERROR_BAD_LAUNCH_PARAM)
    HIBER_STATUS(CUDNN_STATUS_INTERNAL_ERROR_TEXTURE_CREATION_FAILED)
    HIBER_STATUS(CUDNN_STATUS_EXECUTION_FAILED)
    HIBER_STATUS(CUDNN_STATUS_EXECUTION_FAILED_CUDA_DRIVER)
    HIBER_STATUS(CUDNN_STATUS_EXECUTION_FAILED_CUBLAS)
    HIBER_STATUS(CUDNN_STATUS_EXECUTION_FAILED_CUDART)
    HIBER_STATUS(CUDNN_STATUS_EXECUTION_FAILED_CURAND)
#undef HIBER_STATUS
    default: break;
  }
  return "CUDNN_STATUS_UNKNOWN";
}

void hiber_entry::cudnnGetLastErrorString(char* message, size_t max_size) {
  if (message == nullptr || max_size == 0) return;
  const std::string last = take_last_error();
  const size_t n = std::min(last.size(), max_size - 1);
  std::memcpy(message, last.data(), n);
  message[n] = '\0';
}
