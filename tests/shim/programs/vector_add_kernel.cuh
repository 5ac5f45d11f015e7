// c = a + b, elementwise: the kernel of vector_add.cu and error_cases.cu. host_kernels.cc has
// its host implementation for the simulated device, under the same name.
#pragma once

__global__ void vector_add(const float* a, const float* b, float* c, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) c[i] = a[i] + b[i];
}
