// library_gemm: cuBLAS GEMMs through the ordinary API (linked with -lcublas), every output
// checked against the CPU.
//
// Usage: library_gemm [m = 67] [n = 33] [k = 45]
// On a non-blocking stream set with cublasSetStream: cublasSgemm with A as is and transposed,
// cublasGemmEx with fp16 inputs, fp32 accumulation and an fp32 output, cublasGemmBatchedEx with
// device arrays of device pointers, cublasSgemv with strided vectors; and cublasSsyrk, which Hiber
// does not remote, must return CUBLAS_STATUS_NOT_SUPPORTED. Inputs are small
// integers, so every product and sum is exact in fp32 and the fp16 inputs are exact too: a
// correct GEMM gives exactly the CPU's result, on a GPU and on the simulated one alike.
#include <cublas_v2.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdio>
#include <vector>

#include "program_util.h"

#define CUBLAS_CHECK(call)                                                             \
  do {                                                                                 \
    const cublasStatus_t cublas_check_status_ = (call);                                \
    if (cublas_check_status_ != CUBLAS_STATUS_SUCCESS) {                               \
      std::fprintf(stderr, "%s:%d: %s failed: status %d\n", __FILE__, __LINE__, #call, \
                   static_cast<int>(cublas_check_status_));                            \
      std::exit(program::kExitCudaError);                                              \
    }                                                                                  \
  } while (0)

namespace {

// C = alpha * op(A) * B + beta * C, column-major, as the reference.
void reference_gemm(bool transpose_a, int m, int n, int k, float alpha, const float* a, int lda,
                    const float* b, int ldb, float beta, float* c, int ldc) {
  for (int j = 0; j < n; ++j) {
    for (int i = 0; i < m; ++i) {
      float sum = 0;
      for (int l = 0; l < k; ++l) {
        const float av = transpose_a ? a[l + i * lda] : a[i + l * lda];
        sum += av * b[l + j * ldb];
      }
      c[i + j * ldc] = alpha * sum + beta * c[i + j * ldc];
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  const int m = static_cast<int>(program::int_arg(argc, argv, 1, 67, 1, 4096));
  const int n = static_cast<int>(program::int_arg(argc, argv, 2, 33, 1, 4096));
  const int k = static_cast<int>(program::int_arg(argc, argv, 3, 45, 1, 4096));

  std::vector<float> a(static_cast<size_t>(m) * k), b(static_cast<size_t>(k) * n),
      c0(static_cast<size_t>(m) * n);
  for (size_t i = 0; i < a.size(); ++i) a[i] = static_cast<float>(static_cast<int>(i % 7) - 3);
  for (size_t i = 0; i < b.size(); ++i) b[i] = static_cast<float>(static_cast<int>(i % 5) - 2);
  for (size_t i = 0; i < c0.size(); ++i) c0[i] = static_cast<float>(static_cast<int>(i % 11) - 5);
  // A transposed: stored k x m.
  std::vector<float> at(a.size());
  for (int i = 0; i < m; ++i)
    for (int l = 0; l < k; ++l)
      at[l + static_cast<size_t>(i) * k] = a[i + static_cast<size_t>(l) * m];
  std::vector<__half> a16(a.size()), b16(b.size());
  for (size_t i = 0; i < a.size(); ++i) a16[i] = __float2half(a[i]);
  for (size_t i = 0; i < b.size(); ++i) b16[i] = __float2half(b[i]);

  float *d_a, *d_at, *d_b, *d_c;
  __half *d_a16, *d_b16;
  CUDA_CHECK(cudaMalloc(&d_a, a.size() * sizeof(float)));
  CUDA_CHECK(cudaMalloc(&d_at, at.size() * sizeof(float)));
  CUDA_CHECK(cudaMalloc(&d_b, b.size() * sizeof(float)));
  CUDA_CHECK(cudaMalloc(&d_c, c0.size() * sizeof(float)));
  CUDA_CHECK(cudaMalloc(&d_a16, a16.size() * sizeof(__half)));
  CUDA_CHECK(cudaMalloc(&d_b16, b16.size() * sizeof(__half)));
  std::printf("library_gemm: start m=%d n=%d k=%d\n", m, n, k);
  CUDA_CHECK(cudaMemcpy(d_a, a.data(), a.size() * sizeof(float), cudaMemcpyHostToDevice));
  CUDA_CHECK(cudaMemcpy(d_at, at.data(), at.size() * sizeof(float), cudaMemcpyHostToDevice));
  CUDA_CHECK(cudaMemcpy(d_b, b.data(), b.size() * sizeof(float), cudaMemcpyHostToDevice));
  CUDA_CHECK(cudaMemcpy(d_a16, a16.data(), a16.size() * sizeof(__half), cudaMemcpyHostToDevice));
  CUDA_CHECK(cudaMemcpy(d_b16, b16.data(), b16.size() * sizeof(__half), cudaMemcpyHostToDevice));

  cudaStream_t stream;
  CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cublasHandle_t handle;
  CUBLAS_CHECK(cublasCreate(&handle));
  CUBLAS_CHECK(cublasSetStream(handle, stream));
  cudaStream_t got_stream = nullptr;
  CUBLAS_CHECK(cublasGetStream(handle, &got_stream));
  if (got_stream != stream) {
    std::printf("library_gemm: FAILED: cublasGetStream returned another stream\n");
    return program::kExitMismatch;
  }

  const float alpha = 2.0f, beta = -1.0f;
  std::vector<float> got(c0.size()), want(c0.size());
  program::Checksum checksum;
  size_t mismatches = 0;
  auto run_case = [&](const char* what, bool transpose_a, auto&& gemm) {
    CUDA_CHECK(
        cudaMemcpyAsync(d_c, c0.data(), c0.size() * sizeof(float), cudaMemcpyHostToDevice, stream));
    gemm();
    CUDA_CHECK(cudaMemcpyAsync(got.data(), d_c, got.size() * sizeof(float), cudaMemcpyDeviceToHost,
                               stream));
    CUDA_CHECK(cudaStreamSynchronize(stream));
    want = c0;
    reference_gemm(transpose_a, m, n, k, alpha, transpose_a ? at.data() : a.data(),
                   transpose_a ? k : m, b.data(), k, beta, want.data(), m);
    mismatches += program::count_mismatches(what, got.data(), want.data(), got.size());
    checksum.add(got.data(), got.size() * sizeof(float));
  };
  run_case("sgemm_nn", false, [&] {
    CUBLAS_CHECK(cublasSgemm(handle, CUBLAS_OP_N, CUBLAS_OP_N, m, n, k, &alpha, d_a, m, d_b, k,
                             &beta, d_c, m));
  });
  run_case("sgemm_tn", true, [&] {
    CUBLAS_CHECK(cublasSgemm(handle, CUBLAS_OP_T, CUBLAS_OP_N, m, n, k, &alpha, d_at, k, d_b, k,
                             &beta, d_c, m));
  });
  run_case("gemm_ex_f16", false, [&] {
    CUBLAS_CHECK(cublasGemmEx(handle, CUBLAS_OP_N, CUBLAS_OP_N, m, n, k, &alpha, d_a16, CUDA_R_16F,
                              m, d_b16, CUDA_R_16F, k, &beta, d_c, CUDA_R_32F, m,
                              CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  });

  // cublasGemmBatchedEx: device arrays of device pointers, three GEMMs over the same A and B
  // with C at three places, hiberd reading the arrays when the call runs.
  {
    constexpr int kBatches = 3;
    float* d_cs;
    CUDA_CHECK(cudaMalloc(&d_cs, kBatches * c0.size() * sizeof(float)));
    const void* h_a[kBatches] = {d_a, d_a, d_a};
    const void* h_b[kBatches] = {d_b, d_b, d_b};
    void* h_c[kBatches];
    for (int i = 0; i < kBatches; ++i) h_c[i] = d_cs + (kBatches - 1 - i) * c0.size();
    void** d_ptrs;
    CUDA_CHECK(cudaMalloc(&d_ptrs, 3 * kBatches * sizeof(void*)));
    CUDA_CHECK(cudaMemcpy(d_ptrs, h_a, sizeof(h_a), cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(d_ptrs + kBatches, h_b, sizeof(h_b), cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(d_ptrs + 2 * kBatches, h_c, sizeof(h_c), cudaMemcpyHostToDevice));
    for (int i = 0; i < kBatches; ++i)
      CUDA_CHECK(cudaMemcpyAsync(d_cs + i * c0.size(), c0.data(), c0.size() * sizeof(float),
                                 cudaMemcpyHostToDevice, stream));
    CUBLAS_CHECK(cublasGemmBatchedEx(handle, CUBLAS_OP_N, CUBLAS_OP_N, m, n, k, &alpha, d_ptrs,
                                     CUDA_R_32F, m, d_ptrs + kBatches, CUDA_R_32F, k, &beta,
                                     d_ptrs + 2 * kBatches, CUDA_R_32F, m, kBatches,
                                     CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    std::vector<float> all(kBatches * c0.size());
    CUDA_CHECK(cudaMemcpyAsync(all.data(), d_cs, all.size() * sizeof(float), cudaMemcpyDeviceToHost,
                               stream));
    CUDA_CHECK(cudaStreamSynchronize(stream));
    want = c0;
    reference_gemm(false, m, n, k, alpha, a.data(), m, b.data(), k, beta, want.data(), m);
    for (int i = 0; i < kBatches; ++i)
      mismatches += program::count_mismatches("gemm_batched_ex", all.data() + i * c0.size(),
                                              want.data(), c0.size());
    checksum.add(all.data(), all.size() * sizeof(float));
    CUDA_CHECK(cudaFree(d_ptrs));
    CUDA_CHECK(cudaFree(d_cs));
  }

  // cublasSgemv, transposed, with strided x and y: y = alpha A^T x + beta y, A m x k.
  {
    const int incx = 2, incy = 3;
    std::vector<float> x(static_cast<size_t>(m) * incx), y0(static_cast<size_t>(k) * incy);
    for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(static_cast<int>(i % 5) - 2);
    for (size_t i = 0; i < y0.size(); ++i) y0[i] = static_cast<float>(static_cast<int>(i % 3) - 1);
    float *d_x, *d_y;
    CUDA_CHECK(cudaMalloc(&d_x, x.size() * sizeof(float)));
    CUDA_CHECK(cudaMalloc(&d_y, y0.size() * sizeof(float)));
    CUDA_CHECK(cudaMemcpy(d_x, x.data(), x.size() * sizeof(float), cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(d_y, y0.data(), y0.size() * sizeof(float), cudaMemcpyHostToDevice));
    CUBLAS_CHECK(
        cublasSgemv(handle, CUBLAS_OP_T, m, k, &alpha, d_a, m, d_x, incx, &beta, d_y, incy));
    std::vector<float> y(y0.size());
    CUDA_CHECK(
        cudaMemcpyAsync(y.data(), d_y, y.size() * sizeof(float), cudaMemcpyDeviceToHost, stream));
    CUDA_CHECK(cudaStreamSynchronize(stream));
    std::vector<float> y_want = y0;  // elements between the strided ones stay as they were
    for (int j = 0; j < k; ++j) {
      float sum = 0;
      for (int i = 0; i < m; ++i) sum += a[i + static_cast<size_t>(j) * m] * x[i * incx];
      y_want[j * incy] = alpha * sum + beta * y0[j * incy];
    }
    mismatches += program::count_mismatches("sgemv_t", y.data(), y_want.data(), y.size());
    checksum.add(y.data(), y.size() * sizeof(float));
    CUDA_CHECK(cudaFree(d_x));
    CUDA_CHECK(cudaFree(d_y));
  }

  // A cuBLAS call Hiber does not remote fails loudly: CUBLAS_STATUS_NOT_SUPPORTED, and its name
  // in the log (checked by shim_programs_test). The real cuBLAS (a native run) runs it. Its
  // output is not part of the checksum.
  const bool hiber = program::from_hiber(reinterpret_cast<const void*>(&cublasSsyrk_v2));
  const cublasStatus_t syrk =
      cublasSsyrk(handle, CUBLAS_FILL_MODE_UPPER, CUBLAS_OP_N, m, k, &alpha, d_a, m, &beta, d_c, m);
  if (syrk != (hiber ? CUBLAS_STATUS_NOT_SUPPORTED : CUBLAS_STATUS_SUCCESS)) {
    std::printf("library_gemm: FAILED: cublasSsyrk returned %d (%s)\n", static_cast<int>(syrk),
                hiber ? "Hiber" : "the real cuBLAS");
    return program::kExitMismatch;
  }

  CUBLAS_CHECK(cublasDestroy(handle));
  CUDA_CHECK(cudaStreamDestroy(stream));
  for (void* p : {static_cast<void*>(d_a), static_cast<void*>(d_at), static_cast<void*>(d_b),
                  static_cast<void*>(d_c), static_cast<void*>(d_a16), static_cast<void*>(d_b16)})
    CUDA_CHECK(cudaFree(p));
  if (mismatches != 0) {
    std::printf("library_gemm: FAILED: %zu mismatches\n", mismatches);
    return program::kExitMismatch;
  }
  std::printf("library_gemm: OK m=%d n=%d k=%d cases=5 checksum=%016llx\n", m, n, k,
              checksum.value());
  return 0;
}
