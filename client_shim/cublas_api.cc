// libhibercublas.so: the cuBLAS API (libcublas.so.13), remoted to hiberd.
//
// The handle's settings (stream, workspace, math, pointer and atomics modes) live in the client
// (library_client.h) and travel with each call, so setting them costs no message. Host scalars
// are copied by value, in the call's scale type; under pointer mode device they stay addresses,
// read when the call runs. Shapes are checked here as cuBLAS checks them
// (CUBLAS_STATUS_INVALID_VALUE), and again by hiberd, which also checks that every operand lies
// in the caller's memory.
#include <cublas_v2.h>

#include <cstring>

#include "client_shim/library_client.h"
#include "wire/blas_ops.h"

namespace {

using hiber::ErrorCode;
using hiber::Status;
using hiber::shim::LibraryHandleObj;
using hiber::wire::Library;
using hiber::wire::blas::BatchKind;
using hiber::wire::blas::Gemm;

cublasStatus_t status_of(const Status& s) {
  switch (s.code()) {
    case ErrorCode::kSuccess: return CUBLAS_STATUS_SUCCESS;
    case ErrorCode::kInvalidValue: return CUBLAS_STATUS_INVALID_VALUE;
    case ErrorCode::kInvalidHandle: return CUBLAS_STATUS_NOT_INITIALIZED;
    case ErrorCode::kNotSupported: return CUBLAS_STATUS_NOT_SUPPORTED;
    case ErrorCode::kOutOfMemory: return CUBLAS_STATUS_ALLOC_FAILED;
    default: return CUBLAS_STATUS_EXECUTION_FAILED;
  }
}

// The handle the program passed, or nullptr (the error is logged once per message).
LibraryHandleObj* handle_of(cublasHandle_t handle, const char* call) {
  auto h = hiber::shim::library_handle(handle, Library::kBlas);
  if (!h.ok()) {
    hiber::shim::library_log_once("cuBLAS", std::string(call) + ": " + h.status().message());
    return nullptr;
  }
  return *h;
}

cublasStatus_t fail(const char* call, const Status& s) {
  if (!s.ok()) hiber::shim::library_log_once("cuBLAS", std::string(call) + ": " + s.message());
  return status_of(s);
}

// The scale type's size for alpha and beta.
size_t scalar_bytes(int32_t compute_type, int32_t c_type) {
  auto bytes = hiber::wire::blas::scale_bytes(compute_type, c_type);
  return bytes.ok() ? *bytes : 0;
}

cublasStatus_t submit_gemm(const char* call, LibraryHandleObj* h, Gemm g, const void* alpha,
                           const void* beta) {
  g.math_mode = h->math_mode;
  g.atomics_mode = h->atomics_mode;
  g.pointer_mode = static_cast<uint8_t>(h->pointer_mode);
  g.workspace = h->workspace;
  g.workspace_bytes = h->workspace_bytes;
  if (g.m < 0 || g.n < 0 || g.k < 0 || g.batch_count < 0 || g.transa > 2 || g.transb > 2)
    return CUBLAS_STATUS_INVALID_VALUE;
  const size_t scale = scalar_bytes(g.compute_type, g.c_type);
  if (scale == 0)
    return fail(call, hiber::error(ErrorCode::kNotSupported, "compute type ", g.compute_type,
                                   " with C type ", g.c_type));
  if (alpha == nullptr || beta == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  if (g.pointer_mode == CUBLAS_POINTER_MODE_DEVICE) {
    g.alpha_ptr = reinterpret_cast<uint64_t>(alpha);
    g.beta_ptr = reinterpret_cast<uint64_t>(beta);
  } else {
    std::memcpy(g.alpha.bytes, alpha, scale);
    std::memcpy(g.beta.bytes, beta, scale);
  }
  const bool ta = g.transa != CUBLAS_OP_N;
  const bool tb = g.transb != CUBLAS_OP_N;
  if (g.lda < std::max<int64_t>(1, ta ? g.k : g.m) ||
      g.ldb < std::max<int64_t>(1, tb ? g.n : g.k) || g.ldc < std::max<int64_t>(1, g.m))
    return CUBLAS_STATUS_INVALID_VALUE;
  return fail(call, hiber::shim::library_call(h, Gemm::kOp, hiber::wire::op_bytes(g)));
}

Gemm make_gemm(cublasOperation_t transa, cublasOperation_t transb, int m, int n, int k,
               const void* a, int32_t a_type, int64_t lda, const void* b, int32_t b_type,
               int64_t ldb, void* c, int32_t c_type, int64_t ldc, int32_t compute_type) {
  Gemm g;
  g.transa = static_cast<uint8_t>(transa);
  g.transb = static_cast<uint8_t>(transb);
  g.m = m;
  g.n = n;
  g.k = k;
  g.a = reinterpret_cast<uint64_t>(a);
  g.b = reinterpret_cast<uint64_t>(b);
  g.c = reinterpret_cast<uint64_t>(c);
  g.a_type = a_type;
  g.b_type = b_type;
  g.c_type = c_type;
  g.lda = lda;
  g.ldb = ldb;
  g.ldc = ldc;
  g.compute_type = compute_type;
  return g;
}

}  // namespace

#define HIBER_API extern "C" __attribute__((visibility("default")))

HIBER_API cublasStatus_t cublasCreate_v2(cublasHandle_t* handle) {
  if (handle == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  auto made = hiber::shim::library_handle_create(Library::kBlas);
  if (!made.ok()) return fail("cublasCreate", made.status());
  *handle = reinterpret_cast<cublasHandle_t>(*made);
  return CUBLAS_STATUS_SUCCESS;
}

HIBER_API cublasStatus_t cublasDestroy_v2(cublasHandle_t handle) {
  LibraryHandleObj* h = handle_of(handle, "cublasDestroy");
  if (h == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  return fail("cublasDestroy", hiber::shim::library_handle_destroy(h));
}

HIBER_API cublasStatus_t cublasSetStream_v2(cublasHandle_t handle, cudaStream_t stream) {
  LibraryHandleObj* h = handle_of(handle, "cublasSetStream");
  if (h == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  return fail("cublasSetStream", hiber::shim::library_set_stream(h, stream));
}

HIBER_API cublasStatus_t cublasGetStream_v2(cublasHandle_t handle, cudaStream_t* stream) {
  LibraryHandleObj* h = handle_of(handle, "cublasGetStream");
  if (h == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (stream == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  *stream = static_cast<cudaStream_t>(h->stream);
  return CUBLAS_STATUS_SUCCESS;
}

HIBER_API cublasStatus_t cublasSgemm_v2(cublasHandle_t handle, cublasOperation_t transa,
                                        cublasOperation_t transb, int m, int n, int k,
                                        const float* alpha, const float* a, int lda, const float* b,
                                        int ldb, const float* beta, float* c, int ldc) {
  LibraryHandleObj* h = handle_of(handle, "cublasSgemm");
  if (h == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  return submit_gemm("cublasSgemm", h,
                     make_gemm(transa, transb, m, n, k, a, CUDA_R_32F, lda, b, CUDA_R_32F, ldb, c,
                               CUDA_R_32F, ldc, CUBLAS_COMPUTE_32F),
                     alpha, beta);
}

HIBER_API cublasStatus_t cublasGemmEx(cublasHandle_t handle, cublasOperation_t transa,
                                      cublasOperation_t transb, int m, int n, int k,
                                      const void* alpha, const void* a, cudaDataType a_type,
                                      int lda, const void* b, cudaDataType b_type, int ldb,
                                      const void* beta, void* c, cudaDataType c_type, int ldc,
                                      cublasComputeType_t compute_type, cublasGemmAlgo_t algo) {
  LibraryHandleObj* h = handle_of(handle, "cublasGemmEx");
  if (h == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  Gemm g = make_gemm(transa, transb, m, n, k, a, a_type, lda, b, b_type, ldb, c, c_type, ldc,
                     compute_type);
  g.algo = algo;
  return submit_gemm("cublasGemmEx", h, g, alpha, beta);
}
