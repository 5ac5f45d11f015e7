// The fake libcublas.so.13: see fake_cublas.h.
#include <cublas_api.h>
#include <dlfcn.h>

#include <cstring>

#include "tests/gpu/fake_cublas.h"

namespace {

FakeCublas& state() {
  static FakeCublas* s = new FakeCublas;  // never destroyed: tests read it until exit
  return *s;
}

// The GPU of the context current on this thread, from the fake libcuda.so.1 the test loaded; -1
// if none is current (or no fake driver is loaded).
int current_gpu() {
  static auto get = [] {
    void* libcuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    return libcuda != nullptr ? reinterpret_cast<int (*)()>(dlsym(libcuda, "fake_cuda_current_gpu"))
                              : nullptr;
  }();
  return get != nullptr ? get() : -1;
}

struct FakeHandle {
  int gpu = -1;
  CUstream stream = nullptr;
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
  int math_mode = CUBLAS_DEFAULT_MATH;
  int atomics_mode = CUBLAS_ATOMICS_NOT_ALLOWED;
  int pointer_mode = CUBLAS_POINTER_MODE_HOST;
};

FakeHandle* handle_of(cublasHandle_t h) { return reinterpret_cast<FakeHandle*>(h); }

// Every call on a handle must come with the handle's GPU's context current.
void expect_current(const FakeHandle* h, const char* call) {
  if (current_gpu() != h->gpu) {
    state().wrong_context_calls.push_back(std::string(call) + " on a handle of GPU " +
                                          std::to_string(h->gpu) + " with GPU " +
                                          std::to_string(current_gpu()) + "'s context current");
  }
}

FakeCublasGemm record(const char* call, cublasHandle_t handle, cublasOperation_t transa,
                      cublasOperation_t transb, int m, int n, int k, const void* alpha,
                      const void* beta, int a_type, int b_type, int c_type, int lda, int ldb,
                      int ldc, cublasComputeType_t compute, cublasGemmAlgo_t algo) {
  FakeHandle* h = handle_of(handle);
  FakeCublasGemm g;
  g.call = call;
  g.handle = reinterpret_cast<uintptr_t>(handle);
  g.gpu = current_gpu();
  g.stream = h->stream;
  g.workspace = reinterpret_cast<uintptr_t>(h->workspace);
  g.workspace_bytes = h->workspace_bytes;
  g.math_mode = h->math_mode;
  g.atomics_mode = h->atomics_mode;
  g.pointer_mode = h->pointer_mode;
  if (h->pointer_mode == CUBLAS_POINTER_MODE_HOST) {
    std::memcpy(g.alpha, alpha, sizeof g.alpha);
    std::memcpy(g.beta, beta, sizeof g.beta);
  } else {
    g.alpha_ptr = reinterpret_cast<uintptr_t>(alpha);
    g.beta_ptr = reinterpret_cast<uintptr_t>(beta);
  }
  g.transa = transa;
  g.transb = transb;
  g.m = m;
  g.n = n;
  g.k = k;
  g.a_type = a_type;
  g.b_type = b_type;
  g.c_type = c_type;
  g.lda = lda;
  g.ldb = ldb;
  g.ldc = ldc;
  g.compute_type = compute;
  g.algo = algo;
  return g;
}

}  // namespace

extern "C" {

FakeCublas* fake_cublas() { return &state(); }

const char* cublasGetStatusName(cublasStatus_t status) {
  return status == CUBLAS_STATUS_NOT_INITIALIZED ? "CUBLAS_STATUS_NOT_INITIALIZED"
                                                 : "CUBLAS_STATUS_FAKE";
}
const char* cublasGetStatusString(cublasStatus_t) { return "fake cuBLAS"; }

cublasStatus_t cublasCreate_v2(cublasHandle_t* handle) {
  // The real cuBLAS works in the context current on the thread; with none it would make device
  // 0's primary context current behind hiberd's back.
  const int gpu = current_gpu();
  if (gpu < 0) return CUBLAS_STATUS_NOT_INITIALIZED;
  auto* h = new FakeHandle;
  h->gpu = gpu;
  *handle = reinterpret_cast<cublasHandle_t>(h);
  std::lock_guard lock(state().mutex);
  state().created.push_back({reinterpret_cast<uintptr_t>(h), gpu});
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasDestroy_v2(cublasHandle_t handle) {
  FakeHandle* h = handle_of(handle);
  std::lock_guard lock(state().mutex);
  expect_current(h, "cublasDestroy");
  state().destroyed.push_back({reinterpret_cast<uintptr_t>(h), current_gpu()});
  delete h;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetStream_v2(cublasHandle_t handle, cudaStream_t stream) {
  FakeHandle* h = handle_of(handle);
  std::lock_guard lock(state().mutex);
  expect_current(h, "cublasSetStream");
  ++state().set_stream_calls;
  h->stream = reinterpret_cast<CUstream>(stream);
  // As the real one: back on cuBLAS's own workspace pool.
  h->workspace = nullptr;
  h->workspace_bytes = 0;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetWorkspace_v2(cublasHandle_t handle, void* workspace, size_t bytes) {
  FakeHandle* h = handle_of(handle);
  std::lock_guard lock(state().mutex);
  expect_current(h, "cublasSetWorkspace");
  h->workspace = workspace;
  h->workspace_bytes = bytes;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetPointerMode_v2(cublasHandle_t handle, cublasPointerMode_t mode) {
  handle_of(handle)->pointer_mode = mode;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasSetMathMode(cublasHandle_t handle, cublasMath_t mode) {
  handle_of(handle)->math_mode = mode;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasSetAtomicsMode(cublasHandle_t handle, cublasAtomicsMode_t mode) {
  handle_of(handle)->atomics_mode = mode;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasGemmEx(cublasHandle_t handle, cublasOperation_t transa,
                            cublasOperation_t transb, int m, int n, int k, const void* alpha,
                            const void* A, cudaDataType Atype, int lda, const void* B,
                            cudaDataType Btype, int ldb, const void* beta, void* C,
                            cudaDataType Ctype, int ldc, cublasComputeType_t computeType,
                            cublasGemmAlgo_t algo) {
  std::lock_guard lock(state().mutex);
  expect_current(handle_of(handle), "cublasGemmEx");
  FakeCublasGemm g = record("cublasGemmEx", handle, transa, transb, m, n, k, alpha, beta, Atype,
                            Btype, Ctype, lda, ldb, ldc, computeType, algo);
  g.a = reinterpret_cast<uintptr_t>(A);
  g.b = reinterpret_cast<uintptr_t>(B);
  g.c = reinterpret_cast<uintptr_t>(C);
  state().gemms.push_back(g);
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasGemmStridedBatchedEx(cublasHandle_t handle, cublasOperation_t transa,
                                          cublasOperation_t transb, int m, int n, int k,
                                          const void* alpha, const void* A, cudaDataType Atype,
                                          int lda, long long int strideA, const void* B,
                                          cudaDataType Btype, int ldb, long long int strideB,
                                          const void* beta, void* C, cudaDataType Ctype, int ldc,
                                          long long int strideC, int batchCount,
                                          cublasComputeType_t computeType, cublasGemmAlgo_t algo) {
  std::lock_guard lock(state().mutex);
  expect_current(handle_of(handle), "cublasGemmStridedBatchedEx");
  FakeCublasGemm g = record("cublasGemmStridedBatchedEx", handle, transa, transb, m, n, k, alpha,
                            beta, Atype, Btype, Ctype, lda, ldb, ldc, computeType, algo);
  g.a = reinterpret_cast<uintptr_t>(A);
  g.b = reinterpret_cast<uintptr_t>(B);
  g.c = reinterpret_cast<uintptr_t>(C);
  g.stride_a = strideA;
  g.stride_b = strideB;
  g.stride_c = strideC;
  g.batch_count = batchCount;
  state().gemms.push_back(g);
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasGemmBatchedEx(cublasHandle_t handle, cublasOperation_t transa,
                                   cublasOperation_t transb, int m, int n, int k, const void* alpha,
                                   const void* const Aarray[], cudaDataType Atype, int lda,
                                   const void* const Barray[], cudaDataType Btype, int ldb,
                                   const void* beta, void* const Carray[], cudaDataType Ctype,
                                   int ldc, int batchCount, cublasComputeType_t computeType,
                                   cublasGemmAlgo_t algo) {
  std::lock_guard lock(state().mutex);
  expect_current(handle_of(handle), "cublasGemmBatchedEx");
  FakeCublasGemm g = record("cublasGemmBatchedEx", handle, transa, transb, m, n, k, alpha, beta,
                            Atype, Btype, Ctype, lda, ldb, ldc, computeType, algo);
  // The arrays' own addresses (device memory): never dereferenced here.
  g.a = reinterpret_cast<uintptr_t>(Aarray);
  g.b = reinterpret_cast<uintptr_t>(Barray);
  g.c = reinterpret_cast<uintptr_t>(Carray);
  g.batch_count = batchCount;
  state().gemms.push_back(g);
  return CUBLAS_STATUS_SUCCESS;
}

}  // extern "C"
