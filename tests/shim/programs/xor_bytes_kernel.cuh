// out = a ^ b, byte by byte: the kernel of d2d_memset.cu and large_allocations.cu (its host
// implementation is xor_bytes in host_kernels.cc).
#pragma once

__global__ void xor_bytes(const unsigned char* a, const unsigned char* b, unsigned char* out,
                          unsigned long long n) {
  unsigned long long i = static_cast<unsigned long long>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) out[i] = a[i] ^ b[i];
}
