// vector_add: c = a + b on the GPU, every element checked against the CPU.
//
// Usage: vector_add [n = 1048576] [iterations = 1]
// Each iteration allocates, fills, adds, copies back and frees again, with different values.
// The values are multiples of 1/4 below 1024 in magnitude, so every sum is exact.
#include <cuda_runtime.h>

#include <cstdio>
#include <vector>

#include "program_util.h"
#include "vector_add_kernel.cuh"

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  const int n = static_cast<int>(program::int_arg(argc, argv, 1, 1 << 20, 1, 1 << 28));
  const int iterations = static_cast<int>(program::int_arg(argc, argv, 2, 1, 1, 1000000));

  int devices = 0;
  CUDA_CHECK(cudaGetDeviceCount(&devices));
  if (devices < 1) {
    std::printf("vector_add: FAILED: no CUDA device\n");
    return program::kExitCudaError;
  }
  CUDA_CHECK(cudaSetDevice(0));
  cudaDeviceProp prop;
  CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  std::printf("vector_add: device 0 of %d is %s, compute capability %d.%d\n", devices, prop.name,
              prop.major, prop.minor);

  const size_t bytes = sizeof(float) * static_cast<size_t>(n);
  std::vector<float> a(n), b(n), c(n), want(n);
  program::Checksum checksum;
  size_t mismatches = 0;
  for (int it = 0; it < iterations; ++it) {
    for (int i = 0; i < n; ++i) {
      a[i] = static_cast<float>((i + it) % 1024) * 0.25f;
      b[i] = static_cast<float>((i * 7 + it) % 512) * 0.5f - 128.0f;
      want[i] = a[i] + b[i];
    }
    float *d_a = nullptr, *d_b = nullptr, *d_c = nullptr;
    CUDA_CHECK(cudaMalloc(&d_a, bytes));
    CUDA_CHECK(cudaMalloc(&d_b, bytes));
    CUDA_CHECK(cudaMalloc(&d_c, bytes));
    if (it == 0) std::printf("vector_add: start n=%d iterations=%d\n", n, iterations);
    CUDA_CHECK(cudaMemcpy(d_a, a.data(), bytes, cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(d_b, b.data(), bytes, cudaMemcpyHostToDevice));
    const int threads = 256;
    const int blocks = (n + threads - 1) / threads;
    vector_add<<<blocks, threads>>>(d_a, d_b, d_c, n);
    CUDA_CHECK_LAUNCH();
    CUDA_CHECK(cudaMemcpy(c.data(), d_c, bytes, cudaMemcpyDeviceToHost));
    CUDA_CHECK(cudaFree(d_a));
    CUDA_CHECK(cudaFree(d_b));
    CUDA_CHECK(cudaFree(d_c));
    mismatches += program::count_mismatches("c", c.data(), want.data(), c.size());
    checksum.add(c.data(), bytes);
  }
  if (mismatches != 0) {
    std::printf("vector_add: FAILED: %zu wrong elements\n", mismatches);
    return program::kExitMismatch;
  }
  std::printf("vector_add: OK n=%d iterations=%d checksum=%016llx\n", n, iterations,
              checksum.value());
  return 0;
}
