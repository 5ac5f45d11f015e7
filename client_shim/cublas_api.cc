// libhibercublas.so: the cuBLAS API (libcublas.so.13), remoted to hiberd.
//
// The handle's settings (stream, workspace, math, pointer and atomics modes) live in the client
// (library_client.h) and travel with each call, so setting them costs no message. Host scalars
// are copied by value, in the call's scale type; under pointer mode device they stay addresses,
// read when the call runs. Shapes are checked here as cuBLAS checks them
// (CUBLAS_STATUS_INVALID_VALUE), and again by hiberd, which also checks that every operand lies
// in the caller's memory.
#include <cublas_v2.h>

#include <climits>
#include <cstring>

#include "client_shim/cublas_entry_decls.h"
#include "client_shim/cublas_overloads.h"
#include "client_shim/cublas_status.h"
#include "client_shim/library_client.h"
#include "library_ops/dispatch.h"

namespace {

using hiber::ErrorCode;
using hiber::Status;
using hiber::library_ops::Library;
using hiber::library_ops::blas::BatchKind;
using hiber::library_ops::blas::Gemm;
using hiber::shim::LibraryHandleObj;
using hiber::shim::cublas::status_name;
using hiber::shim::cublas::status_of;
using hiber::shim::cublas::status_string;

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
  return hiber::shim::cublas::fail("cuBLAS", call, s);
}

// The scale type's size for alpha and beta.
size_t scalar_bytes(int32_t compute_type, int32_t c_type) {
  auto bytes = hiber::library_ops::blas::scale_bytes(compute_type, c_type);
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
  return fail(call, hiber::shim::library_call(h, hiber::library_ops::op_of<Gemm>,
                                              hiber::library_ops::op_bytes(g)));
}

Gemm make_gemm(cublasOperation_t transa, cublasOperation_t transb, int m, int n, int k,
               const void* a, int32_t a_type, int64_t lda, const void* b, int32_t b_type,
               int64_t ldb, const void* c, int32_t c_type, int64_t ldc, int32_t compute_type) {
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

cublasStatus_t hiber_entry::cublasCreate_v2(cublasHandle_t* handle) {
  if (handle == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  auto made = hiber::shim::library_handle_create(Library::kBlas);
  if (!made.ok()) return fail("cublasCreate", made.status());
  *handle = reinterpret_cast<cublasHandle_t>(*made);
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t hiber_entry::cublasDestroy_v2(cublasHandle_t handle) {
  LibraryHandleObj* h = handle_of(handle, "cublasDestroy");
  if (h == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  return fail("cublasDestroy", hiber::shim::library_handle_destroy(h));
}

cublasStatus_t hiber_entry::cublasSetStream_v2(cublasHandle_t handle, cudaStream_t stream) {
  LibraryHandleObj* h = handle_of(handle, "cublasSetStream");
  if (h == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  return fail("cublasSetStream", hiber::shim::library_set_stream(h, stream));
}

cublasStatus_t hiber_entry::cublasGetStream_v2(cublasHandle_t handle, cudaStream_t* stream) {
  LibraryHandleObj* h = handle_of(handle, "cublasGetStream");
  if (h == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (stream == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  *stream = static_cast<cudaStream_t>(h->stream);
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t hiber_entry::cublasSgemm_v2(cublasHandle_t handle, cublasOperation_t transa,
                                           cublasOperation_t transb, int m, int n, int k,
                                           const float* alpha, const float* a, int lda,
                                           const float* b, int ldb, const float* beta, float* c,
                                           int ldc) {
  LibraryHandleObj* h = handle_of(handle, "cublasSgemm");
  if (h == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  return submit_gemm("cublasSgemm", h,
                     make_gemm(transa, transb, m, n, k, a, CUDA_R_32F, lda, b, CUDA_R_32F, ldb, c,
                               CUDA_R_32F, ldc, CUBLAS_COMPUTE_32F),
                     alpha, beta);
}

cublasStatus_t hiber_entry::cublasGemmEx(cublasHandle_t handle, cublasOperation_t transa,
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

namespace {

// The `_64` entry points take 64-bit sizes; the wire's GEMM has 32-bit m, n, k and batch counts
// (leading dimensions and strides are 64-bit), as cuBLAS itself runs GEMMs of up to 2^31 - 1 per
// dimension. Larger ones are refused loudly, never truncated.
bool fits32(const char* call, std::initializer_list<int64_t> sizes) {
  for (int64_t size : sizes) {
    if (size > INT32_MAX) {
      hiber::shim::library_log_once("cuBLAS", std::string(call) +
                                                  ": a size beyond 2^31 - 1 is not supported by "
                                                  "Hiber; it returns CUBLAS_STATUS_NOT_SUPPORTED");
      return false;
    }
  }
  return true;
}

Gemm strided(Gemm g, int64_t stride_a, int64_t stride_b, int64_t stride_c, int64_t batch_count) {
  g.batch = BatchKind::kStrided;
  g.stride_a = stride_a;
  g.stride_b = stride_b;
  g.stride_c = stride_c;
  g.batch_count = static_cast<int32_t>(batch_count);
  return g;
}

Gemm pointer_array(Gemm g, int64_t batch_count) {
  g.batch = BatchKind::kPointerArray;
  g.batch_count = static_cast<int32_t>(batch_count);
  return g;
}

// gemv as the GEMM it is, exactly: y^T = x^T op(A)^T, a 1 x rows(op(A)) product whose "matrices"
// x and y are rows with leading dimensions incx and incy, so every stride is what cuBLAS reads and
// writes, and each output element is the same sum over the same products in the same order.
cublasStatus_t submit_gemv(const char* call, cublasHandle_t handle, cublasOperation_t trans,
                           int64_t m, int64_t n, const void* alpha, const void* a, int64_t lda,
                           const void* x, int64_t incx, const void* beta, void* y, int64_t incy,
                           int32_t type, int32_t compute_type) {
  LibraryHandleObj* h = handle_of(handle, call);
  if (h == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (m < 0 || n < 0 || lda < std::max<int64_t>(1, m) || incx == 0 || incy == 0 ||
      trans > CUBLAS_OP_C)
    return CUBLAS_STATUS_INVALID_VALUE;
  if (incx < 0 || incy < 0)
    return fail(call, hiber::error(ErrorCode::kNotSupported,
                                   "negative increments are not supported by Hiber"));
  if (!fits32(call, {m, n})) return CUBLAS_STATUS_NOT_SUPPORTED;
  const bool t = trans != CUBLAS_OP_N;
  const int64_t rows = t ? n : m;  // of op(A): the length of y
  const int64_t cols = t ? m : n;  // the length of x
  Gemm g =
      make_gemm(CUBLAS_OP_N, t ? CUBLAS_OP_N : CUBLAS_OP_T, 1, static_cast<int>(rows),
                static_cast<int>(cols), x, type, incx, a, type, lda, y, type, incy, compute_type);
  return submit_gemm(call, h, g, alpha, beta);
}

}  // namespace

// ---- Handle settings: kept in the client, sent with each call ----

cublasStatus_t hiber_entry::cublasSetWorkspace_v2(cublasHandle_t handle, void* workspace,
                                                  size_t bytes) {
  LibraryHandleObj* h = handle_of(handle, "cublasSetWorkspace");
  if (h == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (workspace == nullptr && bytes != 0) return CUBLAS_STATUS_INVALID_VALUE;
  h->workspace = reinterpret_cast<uint64_t>(workspace);
  h->workspace_bytes = workspace == nullptr ? 0 : bytes;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t hiber_entry::cublasSetMathMode(cublasHandle_t handle, cublasMath_t mode) {
  LibraryHandleObj* h = handle_of(handle, "cublasSetMathMode");
  if (h == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  const int base = static_cast<int>(mode) & ~CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION;
  if (base < CUBLAS_DEFAULT_MATH || base > CUBLAS_TF32_TENSOR_OP_MATH)
    return CUBLAS_STATUS_INVALID_VALUE;
  h->math_mode = static_cast<int32_t>(mode);
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t hiber_entry::cublasGetMathMode(cublasHandle_t handle, cublasMath_t* mode) {
  LibraryHandleObj* h = handle_of(handle, "cublasGetMathMode");
  if (h == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (mode == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  *mode = static_cast<cublasMath_t>(h->math_mode);
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t hiber_entry::cublasSetPointerMode_v2(cublasHandle_t handle,
                                                    cublasPointerMode_t mode) {
  LibraryHandleObj* h = handle_of(handle, "cublasSetPointerMode");
  if (h == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (mode != CUBLAS_POINTER_MODE_HOST && mode != CUBLAS_POINTER_MODE_DEVICE)
    return CUBLAS_STATUS_INVALID_VALUE;
  h->pointer_mode = static_cast<int32_t>(mode);
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t hiber_entry::cublasGetPointerMode_v2(cublasHandle_t handle,
                                                    cublasPointerMode_t* mode) {
  LibraryHandleObj* h = handle_of(handle, "cublasGetPointerMode");
  if (h == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (mode == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  *mode = static_cast<cublasPointerMode_t>(h->pointer_mode);
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t hiber_entry::cublasSetAtomicsMode(cublasHandle_t handle, cublasAtomicsMode_t mode) {
  LibraryHandleObj* h = handle_of(handle, "cublasSetAtomicsMode");
  if (h == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (mode != CUBLAS_ATOMICS_NOT_ALLOWED && mode != CUBLAS_ATOMICS_ALLOWED)
    return CUBLAS_STATUS_INVALID_VALUE;
  h->atomics_mode = static_cast<int32_t>(mode);
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t hiber_entry::cublasGetAtomicsMode(cublasHandle_t handle, cublasAtomicsMode_t* mode) {
  LibraryHandleObj* h = handle_of(handle, "cublasGetAtomicsMode");
  if (h == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (mode == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  *mode = static_cast<cublasAtomicsMode_t>(h->atomics_mode);
  return CUBLAS_STATUS_SUCCESS;
}

// ---- Versions and status strings: those of the headers Hiber was built with ----

cublasStatus_t hiber_entry::cublasGetVersion_v2(cublasHandle_t handle, int* version) {
  if (handle_of(handle, "cublasGetVersion") == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (version == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  *version = CUBLAS_VERSION;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t hiber_entry::cublasGetProperty(libraryPropertyType type, int* value) {
  if (value == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  switch (type) {
    case MAJOR_VERSION: *value = CUBLAS_VER_MAJOR; return CUBLAS_STATUS_SUCCESS;
    case MINOR_VERSION: *value = CUBLAS_VER_MINOR; return CUBLAS_STATUS_SUCCESS;
    case PATCH_LEVEL: *value = CUBLAS_VER_PATCH; return CUBLAS_STATUS_SUCCESS;
  }
  return CUBLAS_STATUS_INVALID_VALUE;
}

size_t hiber_entry::cublasGetCudartVersion(void) { return CUDART_VERSION; }

const char* hiber_entry::cublasGetStatusName(cublasStatus_t status) { return status_name(status); }

const char* hiber_entry::cublasGetStatusString(cublasStatus_t status) {
  return status_string(status);
}

// ---- GEMMs ----

cublasStatus_t hiber_entry::cublasDgemm_v2(cublasHandle_t handle, cublasOperation_t transa,
                                           cublasOperation_t transb, int m, int n, int k,
                                           const double* alpha, const double* a, int lda,
                                           const double* b, int ldb, const double* beta, double* c,
                                           int ldc) {
  LibraryHandleObj* h = handle_of(handle, "cublasDgemm");
  if (h == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  return submit_gemm("cublasDgemm", h,
                     make_gemm(transa, transb, m, n, k, a, CUDA_R_64F, lda, b, CUDA_R_64F, ldb, c,
                               CUDA_R_64F, ldc, CUBLAS_COMPUTE_64F),
                     alpha, beta);
}

// Hgemm computes in half, with half alpha and beta (CUBLAS_COMPUTE_16F).
cublasStatus_t hiber_entry::cublasHgemm(cublasHandle_t handle, cublasOperation_t transa,
                                        cublasOperation_t transb, int m, int n, int k,
                                        const __half* alpha, const __half* a, int lda,
                                        const __half* b, int ldb, const __half* beta, __half* c,
                                        int ldc) {
  LibraryHandleObj* h = handle_of(handle, "cublasHgemm");
  if (h == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  return submit_gemm("cublasHgemm", h,
                     make_gemm(transa, transb, m, n, k, a, CUDA_R_16F, lda, b, CUDA_R_16F, ldb, c,
                               CUDA_R_16F, ldc, CUBLAS_COMPUTE_16F),
                     alpha, beta);
}

cublasStatus_t hiber_entry::cublasSgemmStridedBatched(
    cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m, int n, int k,
    const float* alpha, const float* a, int lda, long long stride_a, const float* b, int ldb,
    long long stride_b, const float* beta, float* c, int ldc, long long stride_c, int batch_count) {
  LibraryHandleObj* h = handle_of(handle, "cublasSgemmStridedBatched");
  if (h == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  return submit_gemm("cublasSgemmStridedBatched", h,
                     strided(make_gemm(transa, transb, m, n, k, a, CUDA_R_32F, lda, b, CUDA_R_32F,
                                       ldb, c, CUDA_R_32F, ldc, CUBLAS_COMPUTE_32F),
                             stride_a, stride_b, stride_c, batch_count),
                     alpha, beta);
}

cublasStatus_t hiber_entry::cublasDgemmStridedBatched(
    cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m, int n, int k,
    const double* alpha, const double* a, int lda, long long stride_a, const double* b, int ldb,
    long long stride_b, const double* beta, double* c, int ldc, long long stride_c,
    int batch_count) {
  LibraryHandleObj* h = handle_of(handle, "cublasDgemmStridedBatched");
  if (h == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  return submit_gemm("cublasDgemmStridedBatched", h,
                     strided(make_gemm(transa, transb, m, n, k, a, CUDA_R_64F, lda, b, CUDA_R_64F,
                                       ldb, c, CUDA_R_64F, ldc, CUBLAS_COMPUTE_64F),
                             stride_a, stride_b, stride_c, batch_count),
                     alpha, beta);
}

cublasStatus_t hiber_entry::cublasHgemmStridedBatched(
    cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m, int n, int k,
    const __half* alpha, const __half* a, int lda, long long stride_a, const __half* b, int ldb,
    long long stride_b, const __half* beta, __half* c, int ldc, long long stride_c,
    int batch_count) {
  LibraryHandleObj* h = handle_of(handle, "cublasHgemmStridedBatched");
  if (h == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  return submit_gemm("cublasHgemmStridedBatched", h,
                     strided(make_gemm(transa, transb, m, n, k, a, CUDA_R_16F, lda, b, CUDA_R_16F,
                                       ldb, c, CUDA_R_16F, ldc, CUBLAS_COMPUTE_16F),
                             stride_a, stride_b, stride_c, batch_count),
                     alpha, beta);
}

cublasStatus_t hiber_entry::cublasGemmStridedBatchedEx(
    cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m, int n, int k,
    const void* alpha, const void* a, cudaDataType a_type, int lda, long long stride_a,
    const void* b, cudaDataType b_type, int ldb, long long stride_b, const void* beta, void* c,
    cudaDataType c_type, int ldc, long long stride_c, int batch_count,
    cublasComputeType_t compute_type, cublasGemmAlgo_t algo) {
  LibraryHandleObj* h = handle_of(handle, "cublasGemmStridedBatchedEx");
  if (h == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  Gemm g = strided(make_gemm(transa, transb, m, n, k, a, a_type, lda, b, b_type, ldb, c, c_type,
                             ldc, compute_type),
                   stride_a, stride_b, stride_c, batch_count);
  g.algo = algo;
  return submit_gemm("cublasGemmStridedBatchedEx", h, g, alpha, beta);
}

// Batched with device arrays of device pointers: hiberd reads the arrays when the call runs.
cublasStatus_t hiber_entry::cublasGemmBatchedEx(
    cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m, int n, int k,
    const void* alpha, const void* const a[], cudaDataType a_type, int lda, const void* const b[],
    cudaDataType b_type, int ldb, const void* beta, void* const c[], cudaDataType c_type, int ldc,
    int batch_count, cublasComputeType_t compute_type, cublasGemmAlgo_t algo) {
  LibraryHandleObj* h = handle_of(handle, "cublasGemmBatchedEx");
  if (h == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  Gemm g = pointer_array(make_gemm(transa, transb, m, n, k, a, a_type, lda, b, b_type, ldb, c,
                                   c_type, ldc, compute_type),
                         batch_count);
  g.algo = algo;
  return submit_gemm("cublasGemmBatchedEx", h, g, alpha, beta);
}

cublasStatus_t hiber_entry::cublasSgemmBatched(cublasHandle_t handle, cublasOperation_t transa,
                                               cublasOperation_t transb, int m, int n, int k,
                                               const float* alpha, const float* const a[], int lda,
                                               const float* const b[], int ldb, const float* beta,
                                               float* const c[], int ldc, int batch_count) {
  LibraryHandleObj* h = handle_of(handle, "cublasSgemmBatched");
  if (h == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  return submit_gemm(
      "cublasSgemmBatched", h,
      pointer_array(make_gemm(transa, transb, m, n, k, a, CUDA_R_32F, lda, b, CUDA_R_32F, ldb, c,
                              CUDA_R_32F, ldc, CUBLAS_COMPUTE_32F),
                    batch_count),
      alpha, beta);
}

cublasStatus_t hiber_entry::cublasDgemmBatched(cublasHandle_t handle, cublasOperation_t transa,
                                               cublasOperation_t transb, int m, int n, int k,
                                               const double* alpha, const double* const a[],
                                               int lda, const double* const b[], int ldb,
                                               const double* beta, double* const c[], int ldc,
                                               int batch_count) {
  LibraryHandleObj* h = handle_of(handle, "cublasDgemmBatched");
  if (h == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  return submit_gemm(
      "cublasDgemmBatched", h,
      pointer_array(make_gemm(transa, transb, m, n, k, a, CUDA_R_64F, lda, b, CUDA_R_64F, ldb, c,
                              CUDA_R_64F, ldc, CUBLAS_COMPUTE_64F),
                    batch_count),
      alpha, beta);
}

// ---- gemv (as GEMMs, above) ----

cublasStatus_t hiber_entry::cublasSgemv_v2(cublasHandle_t handle, cublasOperation_t trans, int m,
                                           int n, const float* alpha, const float* a, int lda,
                                           const float* x, int incx, const float* beta, float* y,
                                           int incy) {
  return submit_gemv("cublasSgemv", handle, trans, m, n, alpha, a, lda, x, incx, beta, y, incy,
                     CUDA_R_32F, CUBLAS_COMPUTE_32F);
}

cublasStatus_t hiber_entry::cublasDgemv_v2(cublasHandle_t handle, cublasOperation_t trans, int m,
                                           int n, const double* alpha, const double* a, int lda,
                                           const double* x, int incx, const double* beta, double* y,
                                           int incy) {
  return submit_gemv("cublasDgemv", handle, trans, m, n, alpha, a, lda, x, incx, beta, y, incy,
                     CUDA_R_64F, CUBLAS_COMPUTE_64F);
}

// ---- The 64-bit forms ----

cublasStatus_t hiber_entry::cublasSgemm_v2_64(cublasHandle_t handle, cublasOperation_t transa,
                                              cublasOperation_t transb, int64_t m, int64_t n,
                                              int64_t k, const float* alpha, const float* a,
                                              int64_t lda, const float* b, int64_t ldb,
                                              const float* beta, float* c, int64_t ldc) {
  LibraryHandleObj* h = handle_of(handle, "cublasSgemm_64");
  if (h == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (!fits32("cublasSgemm_64", {m, n, k})) return CUBLAS_STATUS_NOT_SUPPORTED;
  return submit_gemm(
      "cublasSgemm_64", h,
      make_gemm(transa, transb, static_cast<int>(m), static_cast<int>(n), static_cast<int>(k), a,
                CUDA_R_32F, lda, b, CUDA_R_32F, ldb, c, CUDA_R_32F, ldc, CUBLAS_COMPUTE_32F),
      alpha, beta);
}

cublasStatus_t hiber_entry::cublasDgemm_v2_64(cublasHandle_t handle, cublasOperation_t transa,
                                              cublasOperation_t transb, int64_t m, int64_t n,
                                              int64_t k, const double* alpha, const double* a,
                                              int64_t lda, const double* b, int64_t ldb,
                                              const double* beta, double* c, int64_t ldc) {
  LibraryHandleObj* h = handle_of(handle, "cublasDgemm_64");
  if (h == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (!fits32("cublasDgemm_64", {m, n, k})) return CUBLAS_STATUS_NOT_SUPPORTED;
  return submit_gemm(
      "cublasDgemm_64", h,
      make_gemm(transa, transb, static_cast<int>(m), static_cast<int>(n), static_cast<int>(k), a,
                CUDA_R_64F, lda, b, CUDA_R_64F, ldb, c, CUDA_R_64F, ldc, CUBLAS_COMPUTE_64F),
      alpha, beta);
}

cublasStatus_t hiber_entry::cublasGemmEx_64(
    cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int64_t m, int64_t n,
    int64_t k, const void* alpha, const void* a, cudaDataType a_type, int64_t lda, const void* b,
    cudaDataType b_type, int64_t ldb, const void* beta, void* c, cudaDataType c_type, int64_t ldc,
    cublasComputeType_t compute_type, cublasGemmAlgo_t algo) {
  LibraryHandleObj* h = handle_of(handle, "cublasGemmEx_64");
  if (h == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (!fits32("cublasGemmEx_64", {m, n, k})) return CUBLAS_STATUS_NOT_SUPPORTED;
  Gemm g = make_gemm(transa, transb, static_cast<int>(m), static_cast<int>(n), static_cast<int>(k),
                     a, a_type, lda, b, b_type, ldb, c, c_type, ldc, compute_type);
  g.algo = algo;
  return submit_gemm("cublasGemmEx_64", h, g, alpha, beta);
}

cublasStatus_t hiber_entry::cublasGemmStridedBatchedEx_64(
    cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int64_t m, int64_t n,
    int64_t k, const void* alpha, const void* a, cudaDataType a_type, int64_t lda,
    long long stride_a, const void* b, cudaDataType b_type, int64_t ldb, long long stride_b,
    const void* beta, void* c, cudaDataType c_type, int64_t ldc, long long stride_c,
    int64_t batch_count, cublasComputeType_t compute_type, cublasGemmAlgo_t algo) {
  LibraryHandleObj* h = handle_of(handle, "cublasGemmStridedBatchedEx_64");
  if (h == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (!fits32("cublasGemmStridedBatchedEx_64", {m, n, k, batch_count}))
    return CUBLAS_STATUS_NOT_SUPPORTED;
  Gemm g = strided(
      make_gemm(transa, transb, static_cast<int>(m), static_cast<int>(n), static_cast<int>(k), a,
                a_type, lda, b, b_type, ldb, c, c_type, ldc, compute_type),
      stride_a, stride_b, stride_c, batch_count);
  g.algo = algo;
  return submit_gemm("cublasGemmStridedBatchedEx_64", h, g, alpha, beta);
}

cublasStatus_t hiber_entry::cublasSgemv_v2_64(cublasHandle_t handle, cublasOperation_t trans,
                                              int64_t m, int64_t n, const float* alpha,
                                              const float* a, int64_t lda, const float* x,
                                              int64_t incx, const float* beta, float* y,
                                              int64_t incy) {
  return submit_gemv("cublasSgemv_64", handle, trans, m, n, alpha, a, lda, x, incx, beta, y, incy,
                     CUDA_R_32F, CUBLAS_COMPUTE_32F);
}

cublasStatus_t hiber_entry::cublasDgemv_v2_64(cublasHandle_t handle, cublasOperation_t trans,
                                              int64_t m, int64_t n, const double* alpha,
                                              const double* a, int64_t lda, const double* x,
                                              int64_t incx, const double* beta, double* y,
                                              int64_t incy) {
  return submit_gemv("cublasDgemv_64", handle, trans, m, n, alpha, a, lda, x, incx, beta, y, incy,
                     CUDA_R_64F, CUBLAS_COMPUTE_64F);
}
