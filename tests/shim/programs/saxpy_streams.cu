// saxpy_streams: saxpy over chunks of an array, one chunk per stream, with events ordering the
// streams against each other.
//
// Usage: saxpy_streams [n = 1048576] [iterations = 20] [streams = 4]
//
// Each iteration is two dependent passes:
//   1. on every stream k (after waiting for the event `ready`): y = a_k * x + y on chunk k;
//   2. on stream 0 (after waiting for every chunk's `done` event): x = -1 * y + x on all of it,
//      then `ready` is recorded again for the next iteration.
// Reordering either pass against the other changes the result, so missing cross-stream waits
// show up as wrong elements. With a_k in {1, 2, 3} the pair of updates is an integer matrix of
// determinant 1 and trace 2 - a_k in (-2, 2): the values cycle with period 6, 4 or 3 and stay
// small multiples of 1/8, so every result is exact however the GPU fuses the multiply-add.
// Timing events around the whole run check cudaEventElapsedTime (printed, not compared).
#include <cuda_runtime.h>

#include <cstdio>
#include <vector>

#include "program_util.h"

__global__ void saxpy_kernel(int n, float a, const float* x, float* y) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = a * x[i] + y[i];
}

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  const int n = static_cast<int>(program::int_arg(argc, argv, 1, 1 << 20, 1, 1 << 28));
  const int iterations = static_cast<int>(program::int_arg(argc, argv, 2, 20, 1, 10000000));
  const int stream_count = static_cast<int>(program::int_arg(argc, argv, 3, 4, 2, 16));

  CUDA_CHECK(cudaSetDevice(0));
  int least_priority = 0, greatest_priority = 0;
  CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least_priority, &greatest_priority));

  // Stream 0 is a plain stream; the others alternate between non-blocking streams and streams
  // of the highest and lowest priority.
  std::vector<cudaStream_t> streams(stream_count);
  CUDA_CHECK(cudaStreamCreate(&streams[0]));
  for (int k = 1; k < stream_count; ++k) {
    if (k % 3 == 1) {
      CUDA_CHECK(cudaStreamCreateWithFlags(&streams[k], cudaStreamNonBlocking));
    } else {
      const int priority = k % 3 == 2 ? greatest_priority : least_priority;
      CUDA_CHECK(cudaStreamCreateWithPriority(&streams[k], cudaStreamNonBlocking, priority));
    }
  }
  cudaEvent_t start, stop, ready;
  CUDA_CHECK(cudaEventCreate(&start));
  CUDA_CHECK(cudaEventCreate(&stop));
  CUDA_CHECK(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming));
  std::vector<cudaEvent_t> done(stream_count);
  for (auto& e : done) CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));

  std::vector<float> x(n), y(n), want_x(n), want_y(n);
  for (int i = 0; i < n; ++i) {
    x[i] = static_cast<float>(i % 61 - 30) / 8.0f;
    y[i] = static_cast<float>(i % 37 - 18) / 4.0f;
  }
  const size_t bytes = sizeof(float) * static_cast<size_t>(n);
  float *d_x = nullptr, *d_y = nullptr;
  CUDA_CHECK(cudaMalloc(&d_x, bytes));
  CUDA_CHECK(cudaMalloc(&d_y, bytes));
  std::printf("saxpy_streams: start n=%d iterations=%d streams=%d\n", n, iterations, stream_count);

  // Chunk k is [first[k], first[k + 1]); a_k cycles through 1, 2, 3.
  std::vector<int> first(stream_count + 1);
  for (int k = 0; k <= stream_count; ++k)
    first[k] = static_cast<int>(static_cast<long long>(n) * k / stream_count);
  auto a_of = [](int k) { return static_cast<float>(k % 3 + 1); };
  const int threads = 256;
  auto blocks_for = [&](int count) { return (count + threads - 1) / threads; };

  CUDA_CHECK(cudaEventRecord(start, streams[0]));
  CUDA_CHECK(cudaMemcpyAsync(d_x, x.data(), bytes, cudaMemcpyHostToDevice, streams[0]));
  CUDA_CHECK(cudaMemcpyAsync(d_y, y.data(), bytes, cudaMemcpyHostToDevice, streams[0]));
  CUDA_CHECK(cudaEventRecord(ready, streams[0]));
  for (int it = 0; it < iterations; ++it) {
    for (int k = 0; k < stream_count; ++k) {
      const int count = first[k + 1] - first[k];
      CUDA_CHECK(cudaStreamWaitEvent(streams[k], ready, 0));
      if (count > 0) {
        saxpy_kernel<<<blocks_for(count), threads, 0, streams[k]>>>(count, a_of(k), d_x + first[k],
                                                                    d_y + first[k]);
        CUDA_CHECK_LAUNCH();
      }
      CUDA_CHECK(cudaEventRecord(done[k], streams[k]));
    }
    for (int k = 0; k < stream_count; ++k) CUDA_CHECK(cudaStreamWaitEvent(streams[0], done[k], 0));
    saxpy_kernel<<<blocks_for(n), threads, 0, streams[0]>>>(n, -1.0f, d_y, d_x);
    CUDA_CHECK_LAUNCH();
    CUDA_CHECK(cudaEventRecord(ready, streams[0]));
  }
  std::vector<float> got_x(n), got_y(n);
  CUDA_CHECK(cudaMemcpyAsync(got_x.data(), d_x, bytes, cudaMemcpyDeviceToHost, streams[0]));
  CUDA_CHECK(cudaMemcpyAsync(got_y.data(), d_y, bytes, cudaMemcpyDeviceToHost, streams[0]));
  CUDA_CHECK(cudaEventRecord(stop, streams[0]));
  CUDA_CHECK(cudaEventSynchronize(stop));
  float elapsed_ms = -1.0f;
  CUDA_CHECK(cudaEventElapsedTime(&elapsed_ms, start, stop));
  for (auto s : streams) CUDA_CHECK(cudaStreamSynchronize(s));
  for (auto s : streams) CUDA_CHECK(cudaStreamQuery(s));  // idle now: cudaSuccess
  CUDA_CHECK(cudaEventQuery(stop));

  // The CPU reference, element by element: the same two updates per iteration.
  for (int k = 0; k < stream_count; ++k) {
    const float a = a_of(k);
    for (int i = first[k]; i < first[k + 1]; ++i) {
      float xi = x[i], yi = y[i];
      for (int it = 0; it < iterations; ++it) {
        yi = a * xi + yi;
        xi = -1.0f * yi + xi;
      }
      want_x[i] = xi;
      want_y[i] = yi;
    }
  }
  size_t mismatches = program::count_mismatches("x", got_x.data(), want_x.data(), n) +
                      program::count_mismatches("y", got_y.data(), want_y.data(), n);
  bool ok = mismatches == 0;
  if (!(elapsed_ms >= 0.0f)) {
    std::printf("  cudaEventElapsedTime gave %g ms\n", elapsed_ms);
    ok = false;
  }
  std::printf("saxpy_streams: %d iterations took %.3f ms by events\n", iterations, elapsed_ms);

  CUDA_CHECK(cudaFree(d_x));
  CUDA_CHECK(cudaFree(d_y));
  for (auto e : done) CUDA_CHECK(cudaEventDestroy(e));
  CUDA_CHECK(cudaEventDestroy(ready));
  CUDA_CHECK(cudaEventDestroy(stop));
  CUDA_CHECK(cudaEventDestroy(start));
  for (auto s : streams) CUDA_CHECK(cudaStreamDestroy(s));
  if (!ok) {
    std::printf("saxpy_streams: FAILED: %zu wrong elements\n", mismatches);
    return program::kExitMismatch;
  }
  program::Checksum checksum;
  checksum.add(got_x.data(), bytes);
  checksum.add(got_y.data(), bytes);
  std::printf("saxpy_streams: OK n=%d iterations=%d streams=%d checksum=%016llx\n", n, iterations,
              stream_count, checksum.value());
  return 0;
}
