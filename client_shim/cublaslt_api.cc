// libhibercublasLt.so: the cuBLASLt API (libcublasLt.so.13), remoted to hiberd. Its handles are
// cuBLAS's (library_client.h): PyTorch passes a cublasHandle_t as a cublasLtHandle_t.
#include <cublasLt.h>

#include "client_shim/library_client.h"

#define HIBER_API extern "C" __attribute__((visibility("default")))

HIBER_API cublasStatus_t cublasLtCreate(cublasLtHandle_t* handle) {
  if (handle == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  auto made = hiber::shim::library_handle_create(hiber::wire::Library::kBlas);
  if (!made.ok()) return CUBLAS_STATUS_NOT_INITIALIZED;
  *handle = reinterpret_cast<cublasLtHandle_t>(*made);
  return CUBLAS_STATUS_SUCCESS;
}

HIBER_API cublasStatus_t cublasLtDestroy(cublasLtHandle_t handle) {
  auto h = hiber::shim::library_handle(handle, hiber::wire::Library::kBlas);
  if (!h.ok()) return CUBLAS_STATUS_NOT_INITIALIZED;
  return hiber::shim::library_handle_destroy(*h).ok() ? CUBLAS_STATUS_SUCCESS
                                                      : CUBLAS_STATUS_INTERNAL_ERROR;
}
