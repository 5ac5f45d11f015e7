// rdc_affine: a kernel built as relocatable device code (nvcc -rdc=true, two translation
// units, device-linked): y = 3x + 1 with the arithmetic in rdc_transform.cu. nvcc's device-link
// stub registers it with a version 2 fatbin wrapper, as PyTorch's -rdc objects do. Every
// element is checked against the CPU; the inputs are multiples of 1/4 below 512, so it is exact.
//
// Usage: rdc_affine [n = 100000]
#include <cuda_runtime.h>

#include <cstdio>
#include <vector>

#include "program_util.h"

extern __device__ float rdc_transform(float x);

__global__ void rdc_affine(const float* x, float* y, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = rdc_transform(x[i]);
}

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  const int n = static_cast<int>(program::int_arg(argc, argv, 1, 100000, 1, 1 << 26));
  const size_t bytes = sizeof(float) * static_cast<size_t>(n);
  std::vector<float> x(n), y(n), want(n);
  for (int i = 0; i < n; ++i) {
    x[i] = static_cast<float>(i % 2048) * 0.25f - 256.0f;
    want[i] = 3.0f * x[i] + 1.0f;
  }
  std::printf("rdc_affine: start n=%d\n", n);
  float *d_x = nullptr, *d_y = nullptr;
  CUDA_CHECK(cudaMalloc(&d_x, bytes));
  CUDA_CHECK(cudaMalloc(&d_y, bytes));
  CUDA_CHECK(cudaMemcpy(d_x, x.data(), bytes, cudaMemcpyHostToDevice));
  rdc_affine<<<(n + 255) / 256, 256>>>(d_x, d_y, n);
  CUDA_CHECK_LAUNCH();
  CUDA_CHECK(cudaMemcpy(y.data(), d_y, bytes, cudaMemcpyDeviceToHost));
  CUDA_CHECK(cudaFree(d_x));
  CUDA_CHECK(cudaFree(d_y));
  if (size_t wrong = program::count_mismatches("y", y.data(), want.data(), y.size()); wrong != 0) {
    std::printf("rdc_affine: FAILED: %zu wrong elements\n", wrong);
    return program::kExitMismatch;
  }
  program::Checksum checksum;
  checksum.add(y.data(), bytes);
  std::printf("rdc_affine: OK n=%d checksum=%016llx\n", n, checksum.value());
  return 0;
}
