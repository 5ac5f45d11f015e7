// d2d_memset: device-to-device copies (cudaMemcpy, cudaMemcpyAsync, cudaMemcpyDefault) and
// cudaMemset / cudaMemsetAsync, every byte checked.
//
// Usage: d2d_memset [bytes = 1048579] [iterations = 2]
//
// Offsets and lengths are odd on purpose, so nothing is word aligned. A kernel (out = a ^ b)
// reads what the copies and memsets wrote, so device code sees the same bytes as the copies.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <vector>

#include "program_util.h"
#include "xor_bytes_kernel.cuh"

using Bytes = std::vector<unsigned char>;

namespace {

size_t g_mismatches = 0;

void expect_bytes(const char* what, unsigned char* device, const Bytes& want) {
  Bytes got(want.size());
  CUDA_CHECK(cudaMemcpy(got.data(), device, want.size(), cudaMemcpyDeviceToHost));
  g_mismatches += program::count_mismatches(what, got.data(), want.data(), want.size());
}

}  // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  const size_t n = static_cast<size_t>(program::int_arg(argc, argv, 1, (1 << 20) + 3, 64, 1 << 30));
  const int iterations = static_cast<int>(program::int_arg(argc, argv, 2, 2, 1, 1000000));

  CUDA_CHECK(cudaSetDevice(0));
  cudaStream_t stream;
  CUDA_CHECK(cudaStreamCreate(&stream));
  unsigned char *d_a = nullptr, *d_b = nullptr, *d_c = nullptr, *d_d = nullptr, *d_x = nullptr;
  CUDA_CHECK(cudaMalloc(&d_a, n));
  CUDA_CHECK(cudaMalloc(&d_b, n));
  CUDA_CHECK(cudaMalloc(&d_c, n));
  CUDA_CHECK(cudaMalloc(&d_d, n));
  CUDA_CHECK(cudaMalloc(&d_x, n));
  std::printf("d2d_memset: start bytes=%zu iterations=%d\n", n, iterations);

  program::Checksum checksum;
  Bytes src(n), want(n), got(n);
  for (int it = 0; it < iterations; ++it) {
    for (size_t i = 0; i < n; ++i) src[i] = static_cast<unsigned char>(i * 131 + 7 + it * 29);

    // Host -> a; a -> b with cudaMemcpy DtoD.
    CUDA_CHECK(cudaMemcpy(d_a, src.data(), n, cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(d_b, d_a, n, cudaMemcpyDeviceToDevice));
    expect_bytes("b = a", d_b, src);

    // c = 0x11 everywhere, then b[3, n - 5) -> c[5, n - 3) with cudaMemcpyAsync DtoD.
    CUDA_CHECK(cudaMemset(d_c, 0x11, n));
    CUDA_CHECK(cudaMemcpyAsync(d_c + 5, d_b + 3, n - 8, cudaMemcpyDeviceToDevice, stream));
    CUDA_CHECK(cudaStreamSynchronize(stream));
    for (size_t i = 0; i < n; ++i) want[i] = i >= 5 && i < n - 3 ? src[i - 2] : 0x11;
    expect_bytes("c", d_c, want);

    // cudaMemcpyDefault: the direction comes from the pointers (device -> device, then
    // device -> host, then host -> device).
    CUDA_CHECK(cudaMemcpy(d_d, d_c, n, cudaMemcpyDefault));
    CUDA_CHECK(cudaMemcpy(got.data(), d_d, n, cudaMemcpyDefault));
    g_mismatches += program::count_mismatches("d (default kind)", got.data(), want.data(), n);
    Bytes reversed(src.rbegin(), src.rend());
    CUDA_CHECK(cudaMemcpy(d_d, reversed.data(), n, cudaMemcpyDefault));
    expect_bytes("d = reversed (default kind)", d_d, reversed);

    // Zero-length copies and memsets succeed and change nothing.
    CUDA_CHECK(cudaMemcpy(d_d, d_a, 0, cudaMemcpyDeviceToDevice));
    CUDA_CHECK(cudaMemset(d_d, 0, 0));

    // Memsets of a: whole, then odd ranges on the stream; the value's low byte is what counts.
    CUDA_CHECK(cudaMemset(d_a, 0xAB, n));
    CUDA_CHECK(cudaMemsetAsync(d_a + 1001 % n, 0x5C, std::min<size_t>(4097, n - 1001 % n), stream));
    CUDA_CHECK(cudaMemsetAsync(d_a + n - 1, 0, 1, stream));
    CUDA_CHECK(cudaMemsetAsync(d_a + 1, 0x1FF, 3, stream));  // 0xFF
    CUDA_CHECK(cudaStreamSynchronize(stream));
    Bytes want_a(n, 0xAB);
    for (size_t i = 1001 % n; i < 1001 % n + std::min<size_t>(4097, n - 1001 % n); ++i)
      want_a[i] = 0x5C;
    want_a[n - 1] = 0;
    want_a[1] = want_a[2] = want_a[3] = 0xFF;
    expect_bytes("a (memsets)", d_a, want_a);

    // x = a ^ c, by a kernel on the stream after an async memset of x.
    CUDA_CHECK(cudaMemsetAsync(d_x, 0x77, n, stream));
    const unsigned threads = 256;
    const unsigned blocks = static_cast<unsigned>((n + threads - 1) / threads);
    xor_bytes<<<blocks, threads, 0, stream>>>(d_a, d_c, d_x, n);
    CUDA_CHECK_LAUNCH();
    CUDA_CHECK(cudaMemcpyAsync(got.data(), d_x, n, cudaMemcpyDeviceToHost, stream));
    CUDA_CHECK(cudaStreamSynchronize(stream));
    Bytes want_x(n);
    for (size_t i = 0; i < n; ++i) want_x[i] = want_a[i] ^ want[i];
    g_mismatches += program::count_mismatches("x = a ^ c", got.data(), want_x.data(), n);
    checksum.add(got.data(), n);
  }

  for (auto p : {d_a, d_b, d_c, d_d, d_x}) CUDA_CHECK(cudaFree(p));
  CUDA_CHECK(cudaStreamDestroy(stream));
  if (g_mismatches != 0) {
    std::printf("d2d_memset: FAILED: %zu wrong bytes\n", g_mismatches);
    return program::kExitMismatch;
  }
  std::printf("d2d_memset: OK bytes=%zu iterations=%d checksum=%016llx\n", n, iterations,
              checksum.value());
  return 0;
}
