// Host implementations of the kernels in test_kernels.cu, for the simulated GPU
// (server/device/sim_kernel_plugin.h). Each runs every thread of the grid in turn and computes
// exactly what the CUDA kernel computes, so a test can compare the two backends byte for byte.
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>

#include "server/device/sim_kernel_plugin.h"
#include "tests/kernels/host_kernel_util.h"
#include "tests/kernels/test_kernels.h"

namespace {

using namespace hiber::sim_kernels;

// blockIdx.x * blockDim.x + threadIdx.x, in the width the CUDA source computes it.
uint64_t global_x(const HiberSimLaunch* launch, const ThreadIndex& t) {
  return uint64_t{t.block.x} * launch->block.x + t.thread.x;
}

int saxpy(const HiberSimLaunch* l) {
  if (l->param_count != 4) return kInvalidValue;
  auto a = arg<float>(l, 0);
  auto x = arg<const float*>(l, 1);
  auto y = arg<float*>(l, 2);
  const int n = arg<int>(l, 3);
  const uint64_t used = touched(l, n);
  if (used > 0 && (!may_access(l, x, used) || !may_access(l, y, used))) return kIllegalAddress;
  for_each_index(l, n, [&](int i) { y[i] = a * x[i] + y[i]; });
  return kSuccess;
}

int iota_u64(const HiberSimLaunch* l) {
  if (l->param_count != 3) return kInvalidValue;
  auto out = arg<unsigned long long*>(l, 0);
  auto start = arg<unsigned long long>(l, 1);
  auto n = arg<unsigned long long>(l, 2);
  const uint64_t threads_x = uint64_t{l->grid.x} * l->block.x;
  const uint64_t threads = threads_x * l->grid.y * l->block.y;
  if (n > 0 && !may_access(l, out, std::min<uint64_t>(n, threads))) return kIllegalAddress;
  for_each_thread(l, [&](const ThreadIndex& t) {
    uint64_t x = global_x(l, t);
    uint64_t y = uint64_t{t.block.y} * l->block.y + t.thread.y;
    uint64_t i = y * threads_x + x;
    if (i < n) out[i] = start + i;
  });
  return kSuccess;
}

int odd_params(const HiberSimLaunch* l) {
  if (l->param_count != 4) return kInvalidValue;
  auto c = arg<char>(l, 0);
  auto s = arg<OddStruct>(l, 1);
  auto h = arg<short>(l, 2);
  auto out = arg<int*>(l, 3);
  out[0] = c;
  out[1] = static_cast<int>(s.d);
  out[2] = s.c;
  out[3] = s.a[0] + s.a[1] + s.a[2];
  out[4] = h;
  return kSuccess;
}

int big_param(const HiberSimLaunch* l) {
  if (l->param_count != 2) return kInvalidValue;
  auto b = arg<BigStruct>(l, 0);
  auto out = arg<float*>(l, 1);
  for_each_thread(l, [&](const ThreadIndex& t) {
    if (t.block.x == 0 && t.thread.x < 32) out[t.thread.x] = b.v[t.thread.x];
  });
  return kSuccess;
}

int sum_i32(const HiberSimLaunch* l) {
  if (l->param_count != 3) return kInvalidValue;
  auto in = arg<const int*>(l, 0);
  auto n = arg<unsigned long long>(l, 1);
  auto total = arg<unsigned long long*>(l, 2);
  const uint64_t used = std::min<uint64_t>(n, uint64_t{l->grid.x} * l->block.x);
  if (!may_access(l, total, 1) || (used > 0 && !may_access(l, in, used))) return kIllegalAddress;
  std::atomic_ref<unsigned long long> sum(*total);  // other launches may add concurrently
  for_each_thread(l, [&](const ThreadIndex& t) {
    uint64_t i = global_x(l, t);
    if (i < n) sum.fetch_add(static_cast<unsigned long long>(static_cast<long long>(in[i])));
  });
  return kSuccess;
}

int gather_ptrs(const HiberSimLaunch* l) {
  if (l->param_count != 3) return kInvalidValue;
  auto ptrs = arg<int* const*>(l, 0);
  auto n = arg<int>(l, 1);
  auto out = arg<int*>(l, 2);
  const uint64_t used = touched(l, n);
  if (used == 0) return kSuccess;
  if (!may_access(l, ptrs, used) || !may_access(l, out, used)) return kIllegalAddress;
  // The pointers come from device memory: each is checked before any is read through.
  for (uint64_t i = 0; i < used; ++i)
    if (!may_access(l, ptrs[i], 1)) return kIllegalAddress;
  for_each_index(l, n, [&](int i) { out[i] = *ptrs[i]; });
  return kSuccess;
}

int scatter_value(const HiberSimLaunch* l) {
  if (l->param_count != 3) return kInvalidValue;
  auto ptrs = arg<int* const*>(l, 0);
  auto n = arg<int>(l, 1);
  auto value = arg<int>(l, 2);
  const uint64_t used = touched(l, n);
  if (used == 0) return kSuccess;
  if (!may_access(l, ptrs, used)) return kIllegalAddress;
  // The pointers come from device memory: each is checked before any is written through.
  for (uint64_t i = 0; i < used; ++i)
    if (!may_access(l, ptrs[i], 1)) return kIllegalAddress;
  for_each_index(l, n, [&](int i) { *ptrs[i] = value; });
  return kSuccess;
}

int write_value(const HiberSimLaunch* l) {
  if (l->param_count != 2) return kInvalidValue;
  auto p = arg<int*>(l, 0);
  auto value = arg<int>(l, 1);
  *p = value;
  return kSuccess;
}

template <typename T>
int scale(const HiberSimLaunch* l) {
  if (l->param_count != 3) return kInvalidValue;
  auto data = arg<T*>(l, 0);
  auto factor = arg<T>(l, 1);
  auto n = arg<unsigned>(l, 2);
  const uint64_t used = touched(l, n);
  if (used > 0 && !may_access(l, data, used)) return kIllegalAddress;
  for_each_thread(l, [&](const ThreadIndex& t) {
    unsigned i = t.block.x * l->block.x + t.thread.x;
    if (i < n) data[i] *= factor;
  });
  return kSuccess;
}

int fill_bytes_c(const HiberSimLaunch* l) {
  if (l->param_count != 3) return kInvalidValue;
  auto out = arg<unsigned char*>(l, 0);
  auto value = arg<unsigned char>(l, 1);
  auto n = arg<unsigned long long>(l, 2);
  const uint64_t used = std::min<uint64_t>(n, uint64_t{l->grid.x} * l->block.x);
  if (used > 0 && !may_access(l, out, used)) return kIllegalAddress;
  for_each_thread(l, [&](const ThreadIndex& t) {
    uint64_t i = global_x(l, t);
    if (i < n) out[i] = value;
  });
  return kSuccess;
}

int noop(const HiberSimLaunch* l) { return l->param_count == 0 ? kSuccess : kInvalidValue; }

// The device's memory may only be read, as in CUDA; a test that means it to end sets *stop.
// Under TSan the loop also sleeps: TSan holds an asynchronous signal (the kernel deadline's
// interruption) back until the thread enters one of its interceptors.
int spin_until(const HiberSimLaunch* l) {
  if (l->param_count != 1) return kInvalidValue;
  auto stop = arg<const volatile unsigned*>(l, 0);
  while (*stop == 0) {
#if defined(__SANITIZE_THREAD__)
    usleep(1000);
#endif
  }
  return kSuccess;
}

namespace names = hiber::test_kernels;
const HiberSimKernel kKernels[] = {
    {names::kVecAdd, add_vectors},
    {names::kSaxpy, saxpy},
    {names::kIotaU64, iota_u64},
    {names::kOddParams, odd_params},
    {names::kBigParam, big_param},
    {names::kSumI32, sum_i32},
    {names::kGatherPtrs, gather_ptrs},
    {names::kScatterValue, scatter_value},
    {names::kWriteValue, write_value},
    {names::kScaleFloat, scale<float>},
    {names::kScaleDouble, scale<double>},
    {names::kFillBytesC, fill_bytes_c},
    {names::kNoop, noop},
    {names::kSpinUntil, spin_until},
};

}  // namespace

HIBER_SIM_KERNELS_V1(kKernels)
