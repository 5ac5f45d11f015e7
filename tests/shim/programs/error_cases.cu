// error_cases: errors a CUDA program can provoke, each answered with the error CUDA gives,
// after which the program keeps using the GPU normally.
//
// Usage: error_cases [n = 65536] [iterations = 1]
//
// Cases:
//   out_of_bounds_copy  cudaMemcpy to and from a device address 1 TiB past an allocation
//                       -> cudaErrorInvalidValue
//   destroyed_stream    cudaStreamSynchronize and cudaMemsetAsync on a destroyed stream
//                       -> cudaErrorInvalidResourceHandle
//   unknown_kernel      cudaLaunchKernel of a host function -> cudaErrorInvalidDeviceFunction
//   over_quota_malloc   cudaMalloc of twice the total from cudaMemGetInfo
//                       -> cudaErrorMemoryAllocation
//   large_allocation    cudaMalloc of 3000 MiB (within the quota, above a 2 GiB pool block):
//                       served and usable (memsets across the seam and of the end, and a
//                       synchronisation succeed), or
//                       cudaErrorMemoryAllocation at cudaMalloc itself; never a later failure
//                       (large_allocations.cu checks the contents across the pool's seams)
// None of these errors is sticky: after each, cudaPeekAtLastError and cudaGetLastError report it
// once and then cudaSuccess, cudaDeviceSynchronize succeeds, and a vector add gives exact results.
// Prints one line per case; exits 3 if any case differs from what CUDA does.
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <vector>

#include "program_util.h"
#include "vector_add_kernel.cuh"

// An ordinary host function: not a kernel, so launching it must fail.
void plain_host_function(float* data) {
  if (data != nullptr) data[0] = 1.0f;
}

namespace {

int g_failures = 0;
int g_round = 0;

const char* name_of(cudaError_t err) { return cudaGetErrorName(err); }

// Checks that `got` is `want`; prints the outcome.
bool expect_error(const char* which, const char* call, cudaError_t got, cudaError_t want) {
  const bool ok = got == want;
  std::printf("error_cases: %s: %s -> %s (%s)%s\n", which, call, name_of(got),
              cudaGetErrorString(got), ok ? "" : " UNEXPECTED");
  if (!ok) {
    std::printf("error_cases: %s: expected %s\n", which, name_of(want));
    ++g_failures;
  }
  return ok;
}

// After a failed call: the error is the last error exactly once, and it is not sticky.
void expect_last_error(const char* which, cudaError_t want) {
  const cudaError_t peek = cudaPeekAtLastError();
  const cudaError_t first = cudaGetLastError();
  const cudaError_t second = cudaGetLastError();
  const cudaError_t sync = cudaDeviceSynchronize();
  if (peek != want || first != want || second != cudaSuccess || sync != cudaSuccess) {
    std::printf(
        "error_cases: %s: cudaPeekAtLastError %s, cudaGetLastError %s then %s, "
        "cudaDeviceSynchronize %s; expected %s, %s, cudaSuccess, cudaSuccess\n",
        which, name_of(peek), name_of(first), name_of(second), name_of(sync), name_of(want),
        name_of(want));
    ++g_failures;
  }
}

// c = a + b for n elements, checked; proves the session still works.
void vector_add_works(const char* which, int n) {
  std::vector<float> a(n), b(n), c(n), want(n);
  for (int i = 0; i < n; ++i) {
    a[i] = static_cast<float>((i + g_round) % 1000) * 0.5f;
    b[i] = static_cast<float>(i % 333) * -0.25f;
    want[i] = a[i] + b[i];
  }
  const size_t bytes = sizeof(float) * static_cast<size_t>(n);
  float *d_a = nullptr, *d_b = nullptr, *d_c = nullptr;
  CUDA_CHECK(cudaMalloc(&d_a, bytes));
  CUDA_CHECK(cudaMalloc(&d_b, bytes));
  CUDA_CHECK(cudaMalloc(&d_c, bytes));
  CUDA_CHECK(cudaMemcpy(d_a, a.data(), bytes, cudaMemcpyHostToDevice));
  CUDA_CHECK(cudaMemcpy(d_b, b.data(), bytes, cudaMemcpyHostToDevice));
  vector_add<<<(n + 255) / 256, 256>>>(d_a, d_b, d_c, n);
  CUDA_CHECK_LAUNCH();
  CUDA_CHECK(cudaMemcpy(c.data(), d_c, bytes, cudaMemcpyDeviceToHost));
  CUDA_CHECK(cudaFree(d_a));
  CUDA_CHECK(cudaFree(d_b));
  CUDA_CHECK(cudaFree(d_c));
  const size_t bad = program::count_mismatches("c", c.data(), want.data(), c.size());
  std::printf("error_cases: %s: then a vector add of %d elements: %s\n", which, n,
              bad == 0 ? "correct" : "WRONG");
  if (bad != 0) ++g_failures;
}

void out_of_bounds_copy(int n) {
  const char* which = "out_of_bounds_copy";
  const size_t bytes = 4096;
  char* d = nullptr;
  CUDA_CHECK(cudaMalloc(&d, bytes));
  std::vector<char> host(bytes, 1);
  char* far = d + (uint64_t{1} << 40);  // 1 TiB past the allocation: no memory there
  expect_error(which, "cudaMemcpy(HostToDevice)",
               cudaMemcpy(far, host.data(), bytes, cudaMemcpyHostToDevice), cudaErrorInvalidValue);
  expect_last_error(which, cudaErrorInvalidValue);
  expect_error(which, "cudaMemcpy(DeviceToHost)",
               cudaMemcpy(host.data(), far, bytes, cudaMemcpyDeviceToHost), cudaErrorInvalidValue);
  expect_last_error(which, cudaErrorInvalidValue);
  CUDA_CHECK(cudaFree(d));
  vector_add_works(which, n);
}

void destroyed_stream(int n) {
  const char* which = "destroyed_stream";
  cudaStream_t stream;
  CUDA_CHECK(cudaStreamCreate(&stream));
  void* d = nullptr;
  CUDA_CHECK(cudaMalloc(&d, 4096));
  CUDA_CHECK(cudaMemsetAsync(d, 0, 4096, stream));  // the stream worked while it lived
  CUDA_CHECK(cudaStreamDestroy(stream));
  expect_error(which, "cudaStreamSynchronize", cudaStreamSynchronize(stream),
               cudaErrorInvalidResourceHandle);
  expect_last_error(which, cudaErrorInvalidResourceHandle);
  expect_error(which, "cudaMemsetAsync", cudaMemsetAsync(d, 0, 4096, stream),
               cudaErrorInvalidResourceHandle);
  expect_last_error(which, cudaErrorInvalidResourceHandle);
  CUDA_CHECK(cudaFree(d));
  vector_add_works(which, n);
}

void unknown_kernel(int n) {
  const char* which = "unknown_kernel";
  float* arg = nullptr;
  void* args[] = {&arg};
  expect_error(which, "cudaLaunchKernel(host function)",
               cudaLaunchKernel(reinterpret_cast<const void*>(&plain_host_function), dim3(1),
                                dim3(1), args, 0, nullptr),
               cudaErrorInvalidDeviceFunction);
  expect_last_error(which, cudaErrorInvalidDeviceFunction);
  vector_add_works(which, n);
}

void over_quota_malloc(int n) {
  const char* which = "over_quota_malloc";
  size_t free_bytes = 0, total_bytes = 0;
  CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
  void* d = nullptr;
  expect_error(which, "cudaMalloc(2 x total)", cudaMalloc(&d, 2 * total_bytes),
               cudaErrorMemoryAllocation);
  expect_last_error(which, cudaErrorMemoryAllocation);
  vector_add_works(which, n);
}

void large_allocation(int n) {
  const char* which = "large_allocation";
  constexpr size_t kBytes = size_t{3000} << 20;
  void* d = nullptr;
  const cudaError_t made = cudaMalloc(&d, kBytes);
  if (made == cudaSuccess) {
    std::printf("error_cases: %s: cudaMalloc(3000 MiB) served\n", which);
    // 8 MiB across the pools' 2 GiB seam and the last 8 MiB, not all of it: the simulated GPU
    // commits host memory (and a sanitizer's shadow) for what is written.
    constexpr size_t kSeam = size_t{2048} << 20, kWindow = size_t{8} << 20;
    auto* bytes = static_cast<unsigned char*>(d);
    expect_error(which, "cudaMemset(across the 2 GiB seam)",
                 cudaMemset(bytes + kSeam - kWindow / 2, 0, kWindow), cudaSuccess);
    expect_error(which, "cudaMemset(the last 8 MiB)",
                 cudaMemset(bytes + kBytes - kWindow, 0, kWindow), cudaSuccess);
    expect_error(which, "cudaDeviceSynchronize", cudaDeviceSynchronize(), cudaSuccess);
    expect_error(which, "cudaFree", cudaFree(d), cudaSuccess);
  } else {
    expect_error(which, "cudaMalloc(3000 MiB)", made, cudaErrorMemoryAllocation);
    std::printf("error_cases: %s: why: %s\n", which, program::hiber_error_message().c_str());
    expect_last_error(which, cudaErrorMemoryAllocation);
  }
  vector_add_works(which, n);
}

}  // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  const int n = static_cast<int>(program::int_arg(argc, argv, 1, 65536, 1, 1 << 26));
  const int iterations = static_cast<int>(program::int_arg(argc, argv, 2, 1, 1, 100000));
  CUDA_CHECK(cudaSetDevice(0));
  CUDA_CHECK(cudaFree(nullptr));  // creates the context, the usual way
  std::printf("error_cases: start n=%d iterations=%d\n", n, iterations);
  for (g_round = 0; g_round < iterations; ++g_round) {
    out_of_bounds_copy(n);
    destroyed_stream(n);
    unknown_kernel(n);
    over_quota_malloc(n);
    large_allocation(n);
  }
  if (g_failures != 0) {
    std::printf("error_cases: FAILED: %d checks differ from CUDA\n", g_failures);
    return program::kExitMismatch;
  }
  std::printf("error_cases: OK cases=5 iterations=%d n=%d\n", iterations, n);
  return 0;
}
