// Host implementations of the kernels of the programs in this folder, for the simulated GPU
// (server/device/sim_kernel_plugin.h): built as the kernel plugin hiber_shim_programs_plugin,
// which hiberd --device=sim loads with --sim_kernel_plugins.
//
// Each function runs every thread of the grid in turn and computes exactly what the CUDA kernel
// computes, with the same expressions and the same integer widths. The mangled names must not
// collide with tests/kernels' (hiberd refuses a kernel registered twice).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "server/device/sim/numeric.h"
#include "server/device/sim_kernel_plugin.h"
#include "tests/kernels/host_kernel_util.h"

namespace {

using namespace hiber::sim_kernels;

// saxpy_streams.cu: saxpy_kernel(int n, float a, const float* x, float* y)
int saxpy_kernel(const HiberSimLaunch* l) {
  if (l->param_count != 4) return kInvalidValue;
  auto n = arg<int>(l, 0);
  auto a = arg<float>(l, 1);
  auto x = arg<const float*>(l, 2);
  auto y = arg<float*>(l, 3);
  const uint64_t used = touched(l, n);
  if (used > 0 && (!may_access(l, x, used) || !may_access(l, y, used))) return kIllegalAddress;
  for_each_index(l, n, [&](int i) { y[i] = a * x[i] + y[i]; });
  return kSuccess;
}

// pinned_overlap.cu: scale_offset(const float* in, float* out, int n, float scale, float offset)
int scale_offset(const HiberSimLaunch* l) {
  if (l->param_count != 5) return kInvalidValue;
  auto in = arg<const float*>(l, 0);
  auto out = arg<float*>(l, 1);
  auto n = arg<int>(l, 2);
  auto scale = arg<float>(l, 3);
  auto offset = arg<float>(l, 4);
  const uint64_t used = touched(l, n);
  if (used > 0 && (!may_access(l, in, used) || !may_access(l, out, used))) return kIllegalAddress;
  for_each_index(l, n, [&](int i) { out[i] = in[i] * scale + offset; });
  return kSuccess;
}

// d2d_memset.cu, large_allocations.cu:
//   xor_bytes(const unsigned char* a, const unsigned char* b, unsigned char* out,
//             unsigned long long n)
int xor_bytes(const HiberSimLaunch* l) {
  if (l->param_count != 4) return kInvalidValue;
  auto a = arg<const unsigned char*>(l, 0);
  auto b = arg<const unsigned char*>(l, 1);
  auto out = arg<unsigned char*>(l, 2);
  auto n = arg<unsigned long long>(l, 3);
  const uint64_t used = std::min<uint64_t>(n, uint64_t{l->grid.x} * l->block.x);
  if (used > 0 && (!may_access(l, a, used) || !may_access(l, b, used) || !may_access(l, out, used)))
    return kIllegalAddress;
  for_each_thread(l, [&](const ThreadIndex& t) {
    unsigned long long i = static_cast<unsigned long long>(t.block.x) * l->block.x + t.thread.x;
    if (i < n) out[i] = a[i] ^ b[i];
  });
  return kSuccess;
}

// tiny_mlp.cu: matvec(const float* w, const float* x, float* y, int rows, int cols)
int matvec(const HiberSimLaunch* l) {
  if (l->param_count != 5) return kInvalidValue;
  auto w = arg<const float*>(l, 0);
  auto x = arg<const float*>(l, 1);
  auto y = arg<float*>(l, 2);
  auto rows = arg<int>(l, 3);
  auto cols = arg<int>(l, 4);
  for_each_index(l, rows, [&](int r) {
    float sum = 0.0f;
    for (int c = 0; c < cols; ++c) sum += w[r * cols + c] * x[c];
    y[r] = sum;
  });
  return kSuccess;
}

// tiny_mlp.cu: bias_relu(float* y, const float* bias, int n, int relu)
int bias_relu(const HiberSimLaunch* l) {
  if (l->param_count != 4) return kInvalidValue;
  auto y = arg<float*>(l, 0);
  auto bias = arg<const float*>(l, 1);
  auto n = arg<int>(l, 2);
  auto relu = arg<int>(l, 3);
  for_each_index(l, n, [&](int i) {
    float v = y[i] + bias[i];
    y[i] = relu && !(v > 0.0f) ? 0.0f : v;
  });
  return kSuccess;
}

// mlp_server.cu: count_up(unsigned int* counter)
int count_up(const HiberSimLaunch* l) {
  if (l->param_count != 1) return kInvalidValue;
  auto counter = arg<unsigned int*>(l, 0);
  for_each_thread(l, [&](const ThreadIndex& t) {
    if (t.block.x == 0 && t.thread.x == 0) ++*counter;
  });
  return kSuccess;
}

// mlp_server.cu: gather_through(const float* const* tables, long long entry, float* out)
int gather_through(const HiberSimLaunch* l) {
  if (l->param_count != 3) return kInvalidValue;
  auto tables = arg<const float* const*>(l, 0);
  auto entry = arg<long long>(l, 1);
  auto out = arg<float*>(l, 2);
  for_each_thread(l, [&](const ThreadIndex& t) {
    if (t.block.x == 0 && t.thread.x == 0) *out = tables[0][entry];
  });
  return kSuccess;
}

// runtime_gaps.cu: shared_reverse(const float* in, float* out, int per_thread), dynamic shared
// memory of blockDim.x * per_thread floats: each block's span reversed.
int shared_reverse(const HiberSimLaunch* l) {
  if (l->param_count != 3) return kInvalidValue;
  auto in = arg<const float*>(l, 0);
  auto out = arg<float*>(l, 1);
  auto per_thread = arg<int>(l, 2);
  const uint64_t span = uint64_t{l->block.x} * static_cast<uint64_t>(per_thread);
  if (l->shared_memory_bytes < span * sizeof(float)) return kInvalidValue;  // as tile[] overflow
  for (uint32_t b = 0; b < l->grid.x; ++b) {
    for (uint64_t k = 0; k < span; ++k) out[b * span + k] = in[b * span + span - 1 - k];
  }
  return kSuccess;
}

// runtime_gaps.cu: add_one(float* data, int n)
int add_one(const HiberSimLaunch* l) {
  if (l->param_count != 2) return kInvalidValue;
  auto data = arg<float*>(l, 0);
  for_each_index(l, arg<int>(l, 1), [&](int i) { data[i] += 1.0f; });
  return kSuccess;
}

// ptx_affine.cu (loaded as PTX): hiber_ptx_affine(float* y, const float* x, float a, float b,
// int n)
int ptx_affine(const HiberSimLaunch* l) {
  if (l->param_count != 5) return kInvalidValue;
  auto y = arg<float*>(l, 0);
  auto x = arg<const float*>(l, 1);
  auto a = arg<float>(l, 2);
  auto b = arg<float>(l, 3);
  for_each_index(l, arg<int>(l, 4), [&](int i) { y[i] = a * x[i] + b; });
  return kSuccess;
}

// library_transformer.cu: element i of a float or half array (is_half), as its load()/store()
// do (__half2float, __float2half_rn: round to nearest even).
float load_fh(const void* p, int i, int is_half) {
  return is_half ? hiber::device::sim::half_to_float(static_cast<const uint16_t*>(p)[i])
                 : static_cast<const float*>(p)[i];
}
void store_fh(void* p, int i, float v, int is_half) {
  if (is_half) {
    static_cast<uint16_t*>(p)[i] = hiber::device::sim::float_to_half(v);
  } else {
    static_cast<float*>(p)[i] = v;
  }
}

// library_transformer.cu: softmax_columns(void* scores, int rows, int cols, int is_half)
int softmax_columns(const HiberSimLaunch* l) {
  if (l->param_count != 4) return kInvalidValue;
  auto scores = arg<void*>(l, 0);
  auto rows = arg<int>(l, 1);
  auto cols = arg<int>(l, 2);
  auto is_half = arg<int>(l, 3);
  for_each_index(l, cols, [&](int col) {
    float max = -INFINITY;
    for (int r = 0; r < rows; ++r) max = std::fmax(max, load_fh(scores, col * rows + r, is_half));
    float sum = 0.0f;
    for (int r = 0; r < rows; ++r) sum += std::exp(load_fh(scores, col * rows + r, is_half) - max);
    for (int r = 0; r < rows; ++r)
      store_fh(scores, col * rows + r,
               std::exp(load_fh(scores, col * rows + r, is_half) - max) / sum, is_half);
  });
  return kSuccess;
}

// library_transformer.cu: add_layernorm(const void* x, const void* residual, void* out,
//   const float* gamma, const float* beta, int rows, int cols, float eps, int is_half)
int add_layernorm(const HiberSimLaunch* l) {
  if (l->param_count != 9) return kInvalidValue;
  auto x = arg<const void*>(l, 0);
  auto residual = arg<const void*>(l, 1);
  auto out = arg<void*>(l, 2);
  auto gamma = arg<const float*>(l, 3);
  auto beta = arg<const float*>(l, 4);
  auto rows = arg<int>(l, 5);
  auto cols = arg<int>(l, 6);
  auto eps = arg<float>(l, 7);
  auto is_half = arg<int>(l, 8);
  for_each_index(l, cols, [&](int col) {
    const auto v = [&](int r) {
      return load_fh(x, col * rows + r, is_half) + load_fh(residual, col * rows + r, is_half);
    };
    float mean = 0.0f;
    for (int r = 0; r < rows; ++r) mean += v(r);
    mean /= rows;
    float var = 0.0f;
    for (int r = 0; r < rows; ++r) {
      const float d = v(r) - mean;
      var += d * d;
    }
    var /= rows;
    const float inv = 1.0f / std::sqrt(var + eps);  // rsqrtf
    for (int r = 0; r < rows; ++r)
      store_fh(out, col * rows + r, (v(r) - mean) * inv * gamma[r] + beta[r], is_half);
  });
  return kSuccess;
}

// rdc_affine.cu: rdc_affine(const float* x, float* y, int n), y = rdc_transform(x) = 3x + 1
int rdc_affine(const HiberSimLaunch* l) {
  if (l->param_count != 3) return kInvalidValue;
  auto x = arg<const float*>(l, 0);
  auto y = arg<float*>(l, 1);
  auto n = arg<int>(l, 2);
  for_each_index(l, n, [&](int i) { y[i] = 3.0f * x[i] + 1.0f; });
  return kSuccess;
}

// memory_apis.cu: fill_words(unsigned* words, unsigned long long n, unsigned seed)
int fill_words(const HiberSimLaunch* l) {
  if (l->param_count != 3) return kInvalidValue;
  auto words = arg<unsigned*>(l, 0);
  auto n = arg<unsigned long long>(l, 1);
  auto seed = arg<unsigned>(l, 2);
  const uint64_t used = std::min<uint64_t>(n, uint64_t{l->grid.x} * l->block.x);
  if (used > 0 && !may_access(l, words, used)) return kIllegalAddress;
  for_each_thread(l, [&](const ThreadIndex& t) {
    const uint64_t i = uint64_t{t.block.x} * l->block.x + t.thread.x;
    if (i < n) words[i] = static_cast<unsigned>(i) * 2654435761u + seed;
  });
  return kSuccess;
}

// graphs.cu: graph_affine(const float* x, float* y, int n, float a, float b)
int graph_affine(const HiberSimLaunch* l) {
  if (l->param_count != 5) return kInvalidValue;
  auto x = arg<const float*>(l, 0);
  auto y = arg<float*>(l, 1);
  auto n = arg<int>(l, 2);
  auto a = arg<float>(l, 3);
  auto b = arg<float>(l, 4);
  const uint64_t used = touched(l, n);
  if (used > 0 && (!may_access(l, x, used) || !may_access(l, y, used))) return kIllegalAddress;
  for_each_index(l, n, [&](int i) { y[i] = a * x[i] + b; });
  return kSuccess;
}

const HiberSimKernel kKernels[] = {
    {"_Z14shared_reversePKfPfi", shared_reverse},
    {"_Z7add_onePfi", add_one},
    {"hiber_ptx_affine", ptx_affine},
    {"_Z10vector_addPKfS0_Pfi", add_vectors},  // vector_add.cu, error_cases.cu
    {"_Z12saxpy_kernelifPKfPf", saxpy_kernel},
    {"_Z12scale_offsetPKfPfiff", scale_offset},
    {"_Z9xor_bytesPKhS0_Phy", xor_bytes},  // d2d_memset.cu, large_allocations.cu
    {"_Z6matvecPKfS0_Pfii", matvec},
    {"_Z9bias_reluPfPKfii", bias_relu},
    {"_Z8count_upPj", count_up},
    {"_Z14gather_throughPKPKfxPf", gather_through},
    {"_Z15softmax_columnsPviii", softmax_columns},
    {"_Z13add_layernormPKvS0_PvPKfS3_iifi", add_layernorm},
    {"_Z10rdc_affinePKfPfi", rdc_affine},
    {"_Z10fill_wordsPjyj", fill_words},
    {"_Z12graph_affinePKfPfiff", graph_affine},
};

}  // namespace

HIBER_SIM_KERNELS_V1(kKernels)
