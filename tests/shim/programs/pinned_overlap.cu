// pinned_overlap: asynchronous copies from and to page-locked host memory, overlapping with
// kernels on several streams.
//
// Usage: pinned_overlap [n = 1048576] [iterations = 4] [streams = 3] [chunks = 8]
//
// Three kinds of page-locked memory: cudaMallocHost (the input), cudaHostAlloc (the output) and
// a malloc'd buffer made page-locked with cudaHostRegister (a second input, transformed in
// place). The array is cut into chunks; chunk c goes to stream c % streams as
// copy in -> kernel -> copy out, so one stream's copies overlap another's kernel.
// out = in * scale + offset with multiples of 1/8 and 1/4: exact on every path.
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <vector>

#include "program_util.h"

__global__ void scale_offset(const float* in, float* out, int n, float scale, float offset) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = in[i] * scale + offset;
}

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  const int n = static_cast<int>(program::int_arg(argc, argv, 1, 1 << 20, 1, 1 << 28));
  const int iterations = static_cast<int>(program::int_arg(argc, argv, 2, 4, 1, 1000000));
  const int stream_count = static_cast<int>(program::int_arg(argc, argv, 3, 3, 2, 16));
  const int chunks = static_cast<int>(program::int_arg(argc, argv, 4, 8, 1, 1024));

  CUDA_CHECK(cudaSetDevice(0));
  std::vector<cudaStream_t> streams(stream_count);
  for (auto& s : streams) CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));

  const size_t bytes = sizeof(float) * static_cast<size_t>(n);
  float* h_in = nullptr;   // cudaMallocHost
  float* h_out = nullptr;  // cudaHostAlloc
  CUDA_CHECK(cudaMallocHost(&h_in, bytes));
  CUDA_CHECK(cudaHostAlloc(&h_out, bytes, cudaHostAllocPortable));
  auto* h_reg = static_cast<float*>(std::malloc(bytes));  // registered below
  if (h_reg == nullptr) {
    std::printf("pinned_overlap: FAILED: out of host memory\n");
    return program::kExitCudaError;
  }
  CUDA_CHECK(cudaHostRegister(h_reg, bytes, cudaHostRegisterDefault));
  float *d_in = nullptr, *d_out = nullptr;
  CUDA_CHECK(cudaMalloc(&d_in, bytes));
  CUDA_CHECK(cudaMalloc(&d_out, bytes));
  std::printf("pinned_overlap: start n=%d iterations=%d streams=%d chunks=%d\n", n, iterations,
              stream_count, chunks);

  // Runs in -> out over every chunk: H2D, kernel, D2H on the chunk's stream; then waits.
  const int threads = 256;
  auto pipeline = [&](const float* in, float* out, float scale, float offset) {
    for (int c = 0; c < chunks; ++c) {
      const size_t begin = static_cast<size_t>(n) * c / chunks;
      const size_t end = static_cast<size_t>(n) * (c + 1) / chunks;
      const int count = static_cast<int>(end - begin);
      if (count == 0) continue;
      cudaStream_t s = streams[c % stream_count];
      CUDA_CHECK(cudaMemcpyAsync(d_in + begin, in + begin, count * sizeof(float),
                                 cudaMemcpyHostToDevice, s));
      scale_offset<<<(count + threads - 1) / threads, threads, 0, s>>>(d_in + begin, d_out + begin,
                                                                       count, scale, offset);
      CUDA_CHECK_LAUNCH();
      CUDA_CHECK(cudaMemcpyAsync(out + begin, d_out + begin, count * sizeof(float),
                                 cudaMemcpyDeviceToHost, s));
    }
    for (auto s : streams) CUDA_CHECK(cudaStreamSynchronize(s));
  };

  program::Checksum checksum;
  std::vector<float> want(n);
  size_t mismatches = 0;
  for (int it = 0; it < iterations; ++it) {
    const float scale = static_cast<float>(it % 5 - 2) * 0.25f;  // -0.5 .. 0.5
    const float offset = static_cast<float>(it % 7) * 0.125f;
    for (int i = 0; i < n; ++i) {
      h_in[i] = static_cast<float>((i + it) % 97 - 48) / 8.0f;
      h_reg[i] = static_cast<float>((i * 3 + it) % 101 - 50) / 4.0f;
      h_out[i] = -1000.0f;  // must be overwritten
    }
    // cudaMallocHost in -> cudaHostAlloc out.
    pipeline(h_in, h_out, scale, offset);
    for (int i = 0; i < n; ++i) want[i] = h_in[i] * scale + offset;
    mismatches += program::count_mismatches("out", h_out, want.data(), n);
    checksum.add(h_out, bytes);
    // The registered buffer, in place.
    for (int i = 0; i < n; ++i) want[i] = h_reg[i] * offset + scale;
    pipeline(h_reg, h_reg, offset, scale);
    mismatches += program::count_mismatches("registered", h_reg, want.data(), n);
    checksum.add(h_reg, bytes);
  }

  CUDA_CHECK(cudaFree(d_in));
  CUDA_CHECK(cudaFree(d_out));
  CUDA_CHECK(cudaHostUnregister(h_reg));
  std::free(h_reg);
  CUDA_CHECK(cudaFreeHost(h_out));
  CUDA_CHECK(cudaFreeHost(h_in));
  for (auto s : streams) CUDA_CHECK(cudaStreamDestroy(s));
  if (mismatches != 0) {
    std::printf("pinned_overlap: FAILED: %zu wrong elements\n", mismatches);
    return program::kExitMismatch;
  }
  std::printf("pinned_overlap: OK n=%d iterations=%d streams=%d chunks=%d checksum=%016llx\n", n,
              iterations, stream_count, chunks, checksum.value());
  return 0;
}
