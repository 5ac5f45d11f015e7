// large_allocations: single allocations larger than a block of hiberd's memory pools (2 GiB of
// the default 4 GiB chunks), as a language model's KV cache is, served whole and usable across
// the seams where the pool's blocks meet.
//
// Usage: large_allocations [MiB ...] (default: 3072 12288 40960)
//
// For each size: cudaMalloc succeeds, cudaMemGetInfo's free bytes drop by at least the size,
// and at every 2 GiB seam (and at the allocation's end) two windows copied in from the host are
// combined by a kernel (out = a ^ b) into a third window, which a device-to-device copy moves to
// the last bytes of the allocation; both are read back and checked against the same xor
// computed here. Then cudaFree gives the bytes back. Exits 3 on any mismatch.
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <vector>

#include "program_util.h"
#include "xor_bytes_kernel.cuh"

using Bytes = std::vector<unsigned char>;

namespace {

constexpr size_t kMiB = size_t{1} << 20;
constexpr size_t kSeam = size_t{2048} * kMiB;  // the pools' largest block by default
constexpr size_t kWindow = 65536 + 13;         // odd: nothing is word aligned

Bytes pattern(size_t n, unsigned seed) {
  Bytes bytes(n);
  for (size_t i = 0; i < n; ++i) bytes[i] = static_cast<unsigned char>(i * 31 + seed + i / 257);
  return bytes;
}

// One seam: a and b straddle it, out follows them; the result is also copied to the end.
size_t check_at(unsigned char* base, size_t bytes, size_t at, unsigned seed) {
  unsigned char* a = base + at;
  unsigned char* b = a + kWindow;
  unsigned char* out = b + kWindow;
  const Bytes wa = pattern(kWindow, seed);
  const Bytes wb = pattern(kWindow, seed * 7 + 1);
  Bytes want(kWindow);
  for (size_t i = 0; i < kWindow; ++i) want[i] = wa[i] ^ wb[i];
  CUDA_CHECK(cudaMemcpy(a, wa.data(), kWindow, cudaMemcpyHostToDevice));
  CUDA_CHECK(cudaMemcpy(b, wb.data(), kWindow, cudaMemcpyHostToDevice));
  xor_bytes<<<(kWindow + 255) / 256, 256>>>(a, b, out, kWindow);
  CUDA_CHECK(cudaGetLastError());
  unsigned char* last = base + bytes - kWindow;
  CUDA_CHECK(cudaMemcpy(last, out, kWindow, cudaMemcpyDeviceToDevice));
  Bytes got(kWindow);
  CUDA_CHECK(cudaMemcpy(got.data(), out, kWindow, cudaMemcpyDeviceToHost));
  size_t mismatches = program::count_mismatches("xor across a seam", got.data(), want.data(),
                                                kWindow);
  CUDA_CHECK(cudaMemcpy(got.data(), last, kWindow, cudaMemcpyDeviceToHost));
  mismatches += program::count_mismatches("copied to the end", got.data(), want.data(), kWindow);
  return mismatches;
}

}  // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  std::vector<size_t> sizes_mib;
  for (int i = 1; i < argc; ++i) {
    sizes_mib.push_back(static_cast<size_t>(program::int_arg(argc, argv, i, 0, 1, 1 << 20)));
  }
  if (sizes_mib.empty()) sizes_mib = {3072, 12288, 40960};
  CUDA_CHECK(cudaSetDevice(0));
  size_t mismatches = 0;
  for (size_t mib : sizes_mib) {
    const size_t bytes = mib * kMiB;
    size_t free_before = 0, total = 0;
    CUDA_CHECK(cudaMemGetInfo(&free_before, &total));
    void* memory = nullptr;
    CUDA_CHECK(cudaMalloc(&memory, bytes));
    size_t free_during = 0;
    CUDA_CHECK(cudaMemGetInfo(&free_during, &total));
    if (free_before - free_during < bytes) {
      std::printf("large_allocations: WRONG: %zu MiB allocated, free fell by %zu bytes only\n", mib,
                  free_before - free_during);
      ++mismatches;
    }
    auto* base = static_cast<unsigned char*>(memory);
    int seams = 0;
    for (size_t seam = kSeam; seam + 2 * kWindow < bytes - kWindow; seam += kSeam, ++seams) {
      mismatches += check_at(base, bytes, seam - kWindow / 2, static_cast<unsigned>(seam >> 20));
    }
    mismatches += check_at(base, bytes, bytes - 4 * kWindow, 5);
    CUDA_CHECK(cudaDeviceSynchronize());
    CUDA_CHECK(cudaFree(memory));
    size_t free_after = 0;
    CUDA_CHECK(cudaMemGetInfo(&free_after, &total));
    if (free_after != free_before) {
      std::printf("large_allocations: WRONG: free is %zu bytes after cudaFree, %zu before\n",
                  free_after, free_before);
      ++mismatches;
    }
    std::printf("large_allocations: %zu MiB served, %d seams checked\n", mib, seams);
  }
  if (mismatches != 0) {
    std::printf("large_allocations: FAILED: %zu mismatches\n", mismatches);
    return program::kExitMismatch;
  }
  std::printf("large_allocations: OK sizes=%zu\n", sizes_mib.size());
  return 0;
}
