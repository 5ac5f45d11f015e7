// Helpers for host implementations of CUDA kernels (server/device/sim_kernel_plugin.h), shared
// by the test kernel plugins.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "server/device/sim_kernel_plugin.h"

namespace hiber::sim_kernels {

constexpr int kSuccess = 0;
constexpr int kInvalidValue = 1;      // CUDA_ERROR_INVALID_VALUE
constexpr int kIllegalAddress = 700;  // CUDA_ERROR_ILLEGAL_ADDRESS

// Whether the kernel may touch `count` Ts at `p` (sim_kernel_plugin.h, "Isolation"): a range
// its arguments do not bound must be asked about before it is touched.
template <typename T>
bool may_access(const HiberSimLaunch* launch, const T* p, uint64_t count) {
  return count <= UINT64_MAX / sizeof(T) &&
         launch->check_access(launch, p, count * sizeof(T)) == kSuccess;
}

// Elements an elementwise kernel over n touches: one per thread of the grid's x extent below n
// (the `i` of for_each_index, or of a kernel indexing by x alone).
inline uint64_t touched(const HiberSimLaunch* launch, long long n) {
  const uint64_t threads = uint64_t{launch->grid.x} * launch->block.x;
  return n <= 0 ? 0 : std::min<uint64_t>(static_cast<uint64_t>(n), threads);
}

// Parameter i as a T (copied: the plugin ABI promises nothing about alignment beyond the ABI's).
template <typename T>
T arg(const HiberSimLaunch* launch, uint32_t i) {
  T value;
  std::memcpy(&value, launch->params[i], sizeof(T));
  return value;
}

struct ThreadIndex {
  HiberSimDim3 block;
  HiberSimDim3 thread;
};

// Calls f for every thread of the grid, blocks in x-fastest order and threads likewise.
template <typename F>
void for_each_thread(const HiberSimLaunch* launch, F&& f) {
  const HiberSimDim3 g = launch->grid;
  const HiberSimDim3 b = launch->block;
  for (uint32_t bz = 0; bz < g.z; ++bz)
    for (uint32_t by = 0; by < g.y; ++by)
      for (uint32_t bx = 0; bx < g.x; ++bx)
        for (uint32_t tz = 0; tz < b.z; ++tz)
          for (uint32_t ty = 0; ty < b.y; ++ty)
            for (uint32_t tx = 0; tx < b.x; ++tx) f(ThreadIndex{{bx, by, bz}, {tx, ty, tz}});
}

// int i = blockIdx.x * blockDim.x + threadIdx.x: unsigned arithmetic, then int, as in CUDA.
inline int int_x(const HiberSimLaunch* launch, const ThreadIndex& t) {
  return static_cast<int>(t.block.x * launch->block.x + t.thread.x);
}

// Calls f(i) for every thread's i = int_x(...) below n: an elementwise kernel's
// `if (i < n) ...`.
template <typename F>
void for_each_index(const HiberSimLaunch* launch, int n, F&& f) {
  for_each_thread(launch, [&](const ThreadIndex& t) {
    const int i = int_x(launch, t);
    if (i < n) f(i);
  });
}

// c[i] = a[i] + b[i] for (const float* a, const float* b, float* c, int n): a kernel both the
// test kernels (vec_add) and the shim programs (vector_add) have, under their own names.
inline int add_vectors(const HiberSimLaunch* l) {
  if (l->param_count != 4) return kInvalidValue;
  auto a = arg<const float*>(l, 0);
  auto b = arg<const float*>(l, 1);
  auto c = arg<float*>(l, 2);
  const int n = arg<int>(l, 3);
  const uint64_t used = touched(l, n);
  if (used > 0 && (!may_access(l, a, used) || !may_access(l, b, used) || !may_access(l, c, used)))
    return kIllegalAddress;
  for_each_index(l, n, [&](int i) { c[i] = a[i] + b[i]; });
  return kSuccess;
}

}  // namespace hiber::sim_kernels
