// libhibercudnn.so: the cuDNN 9 API (libcudnn.so.9), remoted to hiberd.
#include <cudnn.h>

#include "client_shim/library_client.h"

#define HIBER_API extern "C" __attribute__((visibility("default")))

HIBER_API cudnnStatus_t cudnnCreate(cudnnHandle_t* handle) {
  if (handle == nullptr) return CUDNN_STATUS_BAD_PARAM;
  auto made = hiber::shim::library_handle_create(hiber::wire::Library::kDnn);
  if (!made.ok()) return CUDNN_STATUS_NOT_INITIALIZED;
  *handle = reinterpret_cast<cudnnHandle_t>(*made);
  return CUDNN_STATUS_SUCCESS;
}

HIBER_API cudnnStatus_t cudnnDestroy(cudnnHandle_t handle) {
  auto h = hiber::shim::library_handle(handle, hiber::wire::Library::kDnn);
  if (!h.ok()) return CUDNN_STATUS_BAD_PARAM;
  return hiber::shim::library_handle_destroy(*h).ok() ? CUDNN_STATUS_SUCCESS
                                                      : CUDNN_STATUS_INTERNAL_ERROR;
}
