// Kernels the device and fatbin tests run. Each one has a host implementation with the same
// mangled name in sim_test_kernels.cc, so the simulated GPU runs them too.
//
// The parameter lists are chosen to exercise the parameter-layout rules of the CUDA ABI: 1-, 2-,
// 4- and 8-byte scalars, pointers, an aggregate with inner padding, a large aggregate, templates,
// an extern "C" name and a kernel without parameters. test_kernels.h states each layout.
#include "test_kernels.h"

// c[i] = a[i] + b[i] for i < n.
__global__ void vec_add(const float* a, const float* b, float* c, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) c[i] = a[i] + b[i];
}

// A device function that is not a kernel: it must not be listed as one.
__device__ __noinline__ float axpy_one(float a, float x, float y) { return a * x + y; }

// y[i] = a * x[i] + y[i] for i < n.
__global__ void saxpy(float a, const float* x, float* y, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = axpy_one(a, x[i], y[i]);
}

// out[i] = start + i for i < n, over a 2D grid of 2D blocks (x fastest).
__global__ void iota_u64(unsigned long long* out, unsigned long long start, unsigned long long n) {
  unsigned long long threads_x = static_cast<unsigned long long>(gridDim.x) * blockDim.x;
  unsigned long long x = static_cast<unsigned long long>(blockIdx.x) * blockDim.x + threadIdx.x;
  unsigned long long y = static_cast<unsigned long long>(blockIdx.y) * blockDim.y + threadIdx.y;
  unsigned long long i = y * threads_x + x;
  if (i < n) out[i] = start + i;
}

// Copies every parameter into out[0..5] so the host can check that each arrived intact.
__global__ void odd_params(char c, OddStruct s, short h, int* out) {
  if (blockIdx.x != 0 || threadIdx.x != 0) return;
  out[0] = c;
  out[1] = static_cast<int>(s.d);
  out[2] = s.c;
  out[3] = s.a[0] + s.a[1] + s.a[2];
  out[4] = h;
}

// out[i] = b.v[i] for the 32 values of a 128-byte parameter.
__global__ void big_param(BigStruct b, float* out) {
  unsigned i = threadIdx.x;
  if (blockIdx.x == 0 && i < 32) out[i] = b.v[i];
}

// *total += sum of in[0..n), with one atomic per element.
__global__ void sum_i32(const int* in, unsigned long long n, unsigned long long* total) {
  unsigned long long i = static_cast<unsigned long long>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) atomicAdd(total, static_cast<unsigned long long>(static_cast<long long>(in[i])));
}

// out[i] = *ptrs[i]: follows pointers stored in device memory.
__global__ void gather_ptrs(int* const* ptrs, int n, int* out) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = *ptrs[i];
}

// *ptrs[i] = value: writes through pointers stored in device memory.
__global__ void scatter_value(int* const* ptrs, int n, int value) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) *ptrs[i] = value;
}

// *p = value, from one thread: the smallest kernel that touches memory (faults, ordering).
__global__ void write_value(int* p, int value) {
  if (blockIdx.x == 0 && threadIdx.x == 0) *p = value;
}

// data[i] *= factor for i < n.
template <typename T>
__global__ void scale(T* data, T factor, unsigned n) {
  unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) data[i] *= factor;
}
template __global__ void scale<float>(float*, float, unsigned);
template __global__ void scale<double>(double*, double, unsigned);

// out[i] = value for i < n; an unmangled name.
extern "C" __global__ void fill_bytes_c(unsigned char* out, unsigned char value,
                                        unsigned long long n) {
  unsigned long long i = static_cast<unsigned long long>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) out[i] = value;
}

// Does nothing.
__global__ void noop() {}

// Never ends while *stop is 0: the runaway kernel of the kernel-deadline tests (hiberd's
// --kernel_deadline_ms). Launch it on a real GPU only with a way to set *stop.
__global__ void spin_until(const volatile unsigned* stop) {
  while (*stop == 0) {
  }
}
