// library_dnn_attention: the cuDNN backend graphs a transformer layer needs beyond matmul, built as
// cudnn-frontend builds them, in HALF and in BFLOAT16, each executed and checked against the same
// arithmetic done here in float:
//   - layer norm, training phase: Y = (X - mean) * inv_variance * scale + bias per row, with the
//     row's mean and inverse variance written out, epsilon a by-value tensor;
//   - RMS norm, inference phase: Y = X / sqrt(mean(X^2) + epsilon) * scale;
//   - scaled dot-product attention (the graph of cudnn-frontend's `sdpa` with a causal mask and
//     the softmax statistics): S = Q x K^T, times a by-value scale; a causal mask from two
//     GEN_INDEX ops, CMP_GE and BINARY_SELECT with a by-value fill; softmax as a MAX reduction,
//     SUB, EXP, an ADD reduction and DIV; the statistics max + log(sum); O = P x V.
// Results are compared within a tolerance of the output type's rounding (the GPU's engines and
// this reference round and sum in different orders).
//
// Usage: library_dnn_attention [batch = 2] [heads = 2] [seq = 24] [head_dim = 16] [hidden = 48]
// Exits 3 on any mismatch.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <cudnn.h>

#include <cmath>
#include <cstdio>
#include <limits>
#include <vector>

#include "cudnn_conv.h"
#include "program_util.h"

namespace {

using cudnn_conv::make;
using Desc = cudnnBackendDescriptor_t;

// Every descriptor a graph makes, destroyed together.
struct Owned {
  std::vector<Desc> all;
  Desc keep(Desc d) {
    all.push_back(d);
    return d;
  }
  ~Owned() {
    for (auto it = all.rbegin(); it != all.rend(); ++it) CUDNN_CHECK(cudnnBackendDestroyDescriptor(*it));
  }
};

void set_desc(Desc d, cudnnBackendAttributeName_t name, Desc value) {
  CUDNN_CHECK(cudnnBackendSetAttribute(d, name, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &value));
}

// A 4-D tensor; `strides` default to packed row-major.
Desc tensor(Owned& owned, int64_t uid, cudnnDataType_t type, std::vector<int64_t> dims,
            std::vector<int64_t> strides = {}, bool is_virtual = false, bool by_value = false) {
  if (strides.empty()) {
    strides.assign(dims.size(), 1);
    for (int i = static_cast<int>(dims.size()) - 2; i >= 0; --i)
      strides[i] = strides[i + 1] * dims[i + 1];
  }
  const int64_t alignment = 16;
  Desc t = owned.keep(make(CUDNN_BACKEND_TENSOR_DESCRIPTOR));
  const auto rank = static_cast<int64_t>(dims.size());
  CUDNN_CHECK(
      cudnnBackendSetAttribute(t, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &type));
  CUDNN_CHECK(
      cudnnBackendSetAttribute(t, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, rank, dims.data()));
  CUDNN_CHECK(cudnnBackendSetAttribute(t, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, rank,
                                       strides.data()));
  CUDNN_CHECK(cudnnBackendSetAttribute(t, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid));
  CUDNN_CHECK(cudnnBackendSetAttribute(t, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1,
                                       &alignment));
  if (is_virtual) {
    CUDNN_CHECK(cudnnBackendSetAttribute(t, CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1,
                                         &is_virtual));
  }
  if (by_value) {
    CUDNN_CHECK(cudnnBackendSetAttribute(t, CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, 1,
                                         &by_value));
  }
  CUDNN_CHECK(cudnnBackendFinalize(t));
  return t;
}

// Intermediate tensors get uids from here on, as the frontend numbers them.
struct Uids {
  int64_t next = 1000;
  int64_t operator()() { return next++; }
};

Desc pointwise(Owned& owned, cudnnPointwiseMode_t mode, Desc x, Desc b, Desc y, Desc t = nullptr,
               int64_t axis = -1) {
  Desc pw = owned.keep(make(CUDNN_BACKEND_POINTWISE_DESCRIPTOR));
  const cudnnDataType_t precision = CUDNN_DATA_FLOAT;
  CUDNN_CHECK(
      cudnnBackendSetAttribute(pw, CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode));
  CUDNN_CHECK(cudnnBackendSetAttribute(pw, CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1,
                                       &precision));
  if (axis >= 0) {
    CUDNN_CHECK(
        cudnnBackendSetAttribute(pw, CUDNN_ATTR_POINTWISE_AXIS, CUDNN_TYPE_INT64, 1, &axis));
  }
  CUDNN_CHECK(cudnnBackendFinalize(pw));
  Desc op = owned.keep(make(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR));
  set_desc(op, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, pw);
  set_desc(op, CUDNN_ATTR_OPERATION_POINTWISE_XDESC, x);
  if (b != nullptr) set_desc(op, CUDNN_ATTR_OPERATION_POINTWISE_BDESC, b);
  if (t != nullptr) set_desc(op, CUDNN_ATTR_OPERATION_POINTWISE_TDESC, t);
  set_desc(op, CUDNN_ATTR_OPERATION_POINTWISE_YDESC, y);
  CUDNN_CHECK(cudnnBackendFinalize(op));
  return op;
}

Desc reduction(Owned& owned, cudnnReduceTensorOp_t which, Desc x, Desc y) {
  Desc r = owned.keep(make(CUDNN_BACKEND_REDUCTION_DESCRIPTOR));
  const cudnnDataType_t compute = CUDNN_DATA_FLOAT;
  CUDNN_CHECK(cudnnBackendSetAttribute(r, CUDNN_ATTR_REDUCTION_OPERATOR,
                                       CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, &which));
  CUDNN_CHECK(
      cudnnBackendSetAttribute(r, CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &compute));
  CUDNN_CHECK(cudnnBackendFinalize(r));
  Desc op = owned.keep(make(CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR));
  set_desc(op, CUDNN_ATTR_OPERATION_REDUCTION_XDESC, x);
  set_desc(op, CUDNN_ATTR_OPERATION_REDUCTION_YDESC, y);
  set_desc(op, CUDNN_ATTR_OPERATION_REDUCTION_DESC, r);
  CUDNN_CHECK(cudnnBackendFinalize(op));
  return op;
}

Desc matmul(Owned& owned, Desc a, Desc b, Desc c) {
  Desc mm = owned.keep(make(CUDNN_BACKEND_MATMUL_DESCRIPTOR));
  const cudnnDataType_t compute = CUDNN_DATA_FLOAT;
  CUDNN_CHECK(
      cudnnBackendSetAttribute(mm, CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &compute));
  CUDNN_CHECK(cudnnBackendFinalize(mm));
  Desc op = owned.keep(make(CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR));
  set_desc(op, CUDNN_ATTR_OPERATION_MATMUL_ADESC, a);
  set_desc(op, CUDNN_ATTR_OPERATION_MATMUL_BDESC, b);
  set_desc(op, CUDNN_ATTR_OPERATION_MATMUL_CDESC, c);
  set_desc(op, CUDNN_ATTR_OPERATION_MATMUL_DESC, mm);
  CUDNN_CHECK(cudnnBackendFinalize(op));
  return op;
}

Desc op_graph(Owned& owned, cudnnHandle_t handle, const std::vector<Desc>& ops) {
  Desc graph = owned.keep(make(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR));
  CUDNN_CHECK(cudnnBackendSetAttribute(graph, CUDNN_ATTR_OPERATIONGRAPH_OPS,
                                       CUDNN_TYPE_BACKEND_DESCRIPTOR,
                                       static_cast<int64_t>(ops.size()), ops.data()));
  CUDNN_CHECK(cudnnBackendSetAttribute(graph, CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE,
                                       1, &handle));
  CUDNN_CHECK(cudnnBackendFinalize(graph));
  return graph;
}

// Builds the plan and runs it once with `uids` bound to `pointers` (device memory, or host memory
// for by-value tensors), then waits.
void execute(Owned& owned, cudnnHandle_t handle, Desc graph, std::vector<int64_t> uids,
             std::vector<void*> pointers) {
  Desc plan = owned.keep(cudnn_conv::plan_for(handle, graph));
  const int64_t workspace_bytes = cudnn_conv::workspace_size(plan);
  void* workspace = nullptr;
  if (workspace_bytes > 0) CUDA_CHECK(cudaMalloc(&workspace, workspace_bytes));
  Desc pack = owned.keep(make(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR));
  const auto n = static_cast<int64_t>(uids.size());
  CUDNN_CHECK(cudnnBackendSetAttribute(pack, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64,
                                       n, uids.data()));
  CUDNN_CHECK(cudnnBackendSetAttribute(pack, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS,
                                       CUDNN_TYPE_VOID_PTR, n, pointers.data()));
  CUDNN_CHECK(cudnnBackendSetAttribute(pack, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR,
                                       1, &workspace));
  CUDNN_CHECK(cudnnBackendFinalize(pack));
  CUDNN_CHECK(cudnnBackendExecute(handle, plan, pack));
  CUDA_CHECK(cudaDeviceSynchronize());
  if (workspace != nullptr) CUDA_CHECK(cudaFree(workspace));
}

// ---- Data in the 16-bit type under test ----
struct Type16 {
  cudnnDataType_t type;
  const char* name;
  double tolerance;  // relative, of the output: a few of the type's rounding steps
  unsigned short bits(float v) const {
    if (type == CUDNN_DATA_HALF) return __half_as_ushort(__float2half(v));
    return __bfloat16_as_ushort(__float2bfloat16(v));
  }
  float value(unsigned short b) const {
    if (type == CUDNN_DATA_HALF) return __half2float(__ushort_as_half(b));
    return __bfloat162float(__ushort_as_bfloat16(b));
  }
  float round(float v) const { return value(bits(v)); }
};

// A device copy of host data, freed at the end of its scope.
struct Device {
  void* ptr = nullptr;
  size_t bytes = 0;
  explicit Device(size_t n) : bytes(n) {
    CUDA_CHECK(cudaMalloc(&ptr, n));
    CUDA_CHECK(cudaMemset(ptr, 0xff, n));  // garbage: every output element must be written
  }
  template <typename T>
  explicit Device(const std::vector<T>& host) : Device(host.size() * sizeof(T)) {
    CUDA_CHECK(cudaMemcpy(ptr, host.data(), bytes, cudaMemcpyHostToDevice));
  }
  template <typename T>
  std::vector<T> read() const {
    std::vector<T> out(bytes / sizeof(T));
    CUDA_CHECK(cudaMemcpy(out.data(), ptr, bytes, cudaMemcpyDeviceToHost));
    return out;
  }
  ~Device() { CUDA_CHECK(cudaFree(ptr)); }
};

// Inputs: a deterministic spread of values in [-range, range], rounded to the type.
std::vector<float> values(size_t n, int seed, float range, const Type16& t) {
  std::vector<float> v(n);
  unsigned state = 2463534242u + static_cast<unsigned>(seed) * 7919u;
  for (size_t i = 0; i < n; ++i) {
    state ^= state << 13;
    state ^= state >> 17;
    state ^= state << 5;
    v[i] = t.round(range * (static_cast<float>(state % 2001) / 1000.0f - 1.0f));
  }
  return v;
}
std::vector<unsigned short> bits(const std::vector<float>& v, const Type16& t) {
  std::vector<unsigned short> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = t.bits(v[i]);
  return out;
}

// Elements of `got` off `want` by more than tolerance * max(|want|, floor).
size_t count_off(const char* what, const std::vector<float>& got, const std::vector<float>& want,
                 double tolerance, double floor) {
  size_t bad = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    const double limit = tolerance * std::max(std::fabs(static_cast<double>(want[i])), floor);
    if (std::fabs(static_cast<double>(got[i]) - want[i]) <= limit) continue;
    if (bad < 5)
      std::printf("  mismatch in %s[%zu]: got %.7g, want %.7g\n", what, i,
                  static_cast<double>(got[i]), static_cast<double>(want[i]));
    ++bad;
  }
  if (bad > 5) std::printf("  ... %zu mismatches in %s in all\n", bad, what);
  return bad;
}

// ---- Layer norm (training: statistics written) and RMS norm (inference) ----
size_t run_norm(cudnnHandle_t handle, const Type16& t, cudnnBackendNormMode_t mode, int64_t rows,
                int64_t hidden) {
  const bool layer = mode == CUDNN_LAYER_NORM;
  const cudnnBackendNormFwdPhase_t phase = layer ? CUDNN_NORM_FWD_TRAINING : CUDNN_NORM_FWD_INFERENCE;
  constexpr int64_t kX = 'x', kScale = 's', kBias = 'b', kEps = 'e', kY = 'y', kMean = 'm',
                    kInvVar = 'v';
  Owned owned;
  Desc x = tensor(owned, kX, t.type, {rows, hidden, 1, 1});
  Desc y = tensor(owned, kY, t.type, {rows, hidden, 1, 1});
  Desc scale = tensor(owned, kScale, CUDNN_DATA_FLOAT, {1, hidden, 1, 1});
  Desc bias = tensor(owned, kBias, CUDNN_DATA_FLOAT, {1, hidden, 1, 1});
  Desc eps = tensor(owned, kEps, CUDNN_DATA_FLOAT, {1, 1, 1, 1}, {}, false, true);
  Desc mean = tensor(owned, kMean, CUDNN_DATA_FLOAT, {rows, 1, 1, 1});
  Desc inv_var = tensor(owned, kInvVar, CUDNN_DATA_FLOAT, {rows, 1, 1, 1});
  Desc norm = owned.keep(make(CUDNN_BACKEND_OPERATION_NORM_FORWARD_DESCRIPTOR));
  CUDNN_CHECK(
      cudnnBackendSetAttribute(norm, CUDNN_ATTR_OPERATION_NORM_FWD_MODE, CUDNN_TYPE_NORM_MODE, 1, &mode));
  CUDNN_CHECK(cudnnBackendSetAttribute(norm, CUDNN_ATTR_OPERATION_NORM_FWD_PHASE,
                                       CUDNN_TYPE_NORM_FWD_PHASE, 1, &phase));
  set_desc(norm, CUDNN_ATTR_OPERATION_NORM_FWD_XDESC, x);
  set_desc(norm, CUDNN_ATTR_OPERATION_NORM_FWD_SCALE_DESC, scale);
  if (layer) set_desc(norm, CUDNN_ATTR_OPERATION_NORM_FWD_BIAS_DESC, bias);
  set_desc(norm, CUDNN_ATTR_OPERATION_NORM_FWD_EPSILON_DESC, eps);
  set_desc(norm, CUDNN_ATTR_OPERATION_NORM_FWD_YDESC, y);
  if (layer) {
    set_desc(norm, CUDNN_ATTR_OPERATION_NORM_FWD_MEAN_DESC, mean);
    set_desc(norm, CUDNN_ATTR_OPERATION_NORM_FWD_INV_VARIANCE_DESC, inv_var);
  }
  CUDNN_CHECK(cudnnBackendFinalize(norm));
  Desc graph = op_graph(owned, handle, {norm});

  const std::vector<float> hx = values(rows * hidden, 1, 3.0f, t);
  std::vector<float> hscale(hidden), hbias(hidden);
  for (int64_t i = 0; i < hidden; ++i) {
    hscale[i] = 0.5f + static_cast<float>(i % 5) / 4;
    hbias[i] = static_cast<float>(i % 7) / 2 - 1.5f;
  }
  float epsilon = 1e-5f;
  Device dx(bits(hx, t)), dscale(hscale), dbias(hbias), dy(rows * hidden * 2), dmean(rows * 4),
      dinv(rows * 4);
  std::vector<int64_t> uids = {kX, kScale, kEps, kY};
  std::vector<void*> ptrs = {dx.ptr, dscale.ptr, &epsilon, dy.ptr};
  if (layer) {
    uids.insert(uids.end(), {kBias, kMean, kInvVar});
    ptrs.insert(ptrs.end(), {dbias.ptr, dmean.ptr, dinv.ptr});
  }
  execute(owned, handle, graph, uids, ptrs);

  std::vector<float> want(rows * hidden), got(rows * hidden), want_mean(rows), want_inv(rows);
  const std::vector<unsigned short> y16 = dy.read<unsigned short>();
  for (int64_t r = 0; r < rows; ++r) {
    double sum = 0, squares = 0;
    for (int64_t i = 0; i < hidden; ++i) sum += hx[r * hidden + i];
    const double mu = layer ? sum / hidden : 0.0;
    for (int64_t i = 0; i < hidden; ++i) squares += (hx[r * hidden + i] - mu) * (hx[r * hidden + i] - mu);
    const double inv = 1.0 / std::sqrt(squares / hidden + epsilon);
    want_mean[r] = static_cast<float>(mu);
    want_inv[r] = static_cast<float>(inv);
    for (int64_t i = 0; i < hidden; ++i) {
      const size_t at = static_cast<size_t>(r * hidden + i);
      double v = (hx[at] - mu) * inv * hscale[i] + (layer ? hbias[i] : 0.0);
      want[at] = t.round(static_cast<float>(v));
      got[at] = t.value(y16[at]);
    }
  }
  const char* what = layer ? "layer norm" : "RMS norm";
  size_t bad = count_off(what, got, want, t.tolerance, 1.0);
  if (layer) {
    bad += count_off("layer norm mean", dmean.read<float>(), want_mean, 1e-4, 1.0);
    bad += count_off("layer norm inverse variance", dinv.read<float>(), want_inv, 1e-4, 1.0);
  }
  std::printf("library_dnn_attention: %s %s [%lld x %lld]%s: %s\n", t.name, what,
              static_cast<long long>(rows), static_cast<long long>(hidden),
              layer ? " with mean and inverse variance" : "", bad == 0 ? "ok" : "WRONG");
  return bad;
}

// ---- Scaled dot-product attention, causal, with statistics ----
size_t run_sdpa(cudnnHandle_t handle, const Type16& t, int64_t b, int64_t h, int64_t s, int64_t d) {
  constexpr int64_t kQ = 'q', kK = 'k', kV = 'v', kO = 'o', kScale = 'a', kFill = 'f', kStats = 't';
  const cudnnDataType_t f32 = CUDNN_DATA_FLOAT;
  Owned owned;
  Uids uid;
  const std::vector<int64_t> qkv = {b, h, s, d}, scores = {b, h, s, s}, row = {b, h, s, 1};
  Desc q = tensor(owned, kQ, t.type, qkv);
  // K is [b, h, s, d] in memory; the first matmul reads it transposed, [b, h, d, s].
  Desc kt = tensor(owned, kK, t.type, {b, h, d, s}, {h * s * d, s * d, 1, d});
  Desc v = tensor(owned, kV, t.type, qkv);
  Desc o = tensor(owned, kO, t.type, qkv);
  Desc stats = tensor(owned, kStats, f32, row);
  Desc scale = tensor(owned, kScale, f32, {1, 1, 1, 1}, {}, false, true);
  Desc fill = tensor(owned, kFill, f32, {1, 1, 1, 1}, {}, false, true);
  auto virt = [&](cudnnDataType_t type, const std::vector<int64_t>& dims) {
    return tensor(owned, uid(), type, dims, {}, true);
  };
  std::vector<Desc> ops;
  Desc s_raw = virt(f32, scores);
  ops.push_back(matmul(owned, q, kt, s_raw));
  Desc s_scaled = virt(f32, scores);
  ops.push_back(pointwise(owned, CUDNN_POINTWISE_MUL, s_raw, scale, s_scaled));
  Desc row_index = virt(CUDNN_DATA_INT32, scores);
  ops.push_back(pointwise(owned, CUDNN_POINTWISE_GEN_INDEX, s_scaled, nullptr, row_index, nullptr, 2));
  Desc col_index = virt(CUDNN_DATA_INT32, scores);
  ops.push_back(pointwise(owned, CUDNN_POINTWISE_GEN_INDEX, s_scaled, nullptr, col_index, nullptr, 3));
  Desc keep = virt(CUDNN_DATA_BOOLEAN, scores);
  ops.push_back(pointwise(owned, CUDNN_POINTWISE_CMP_GE, row_index, col_index, keep));
  Desc masked = virt(f32, scores);
  ops.push_back(pointwise(owned, CUDNN_POINTWISE_BINARY_SELECT, s_scaled, fill, masked, keep));
  Desc max = virt(f32, row);
  ops.push_back(reduction(owned, CUDNN_REDUCE_TENSOR_MAX, masked, max));
  Desc shifted = virt(f32, scores);
  ops.push_back(pointwise(owned, CUDNN_POINTWISE_SUB, masked, max, shifted));
  Desc exps = virt(f32, scores);
  ops.push_back(pointwise(owned, CUDNN_POINTWISE_EXP, shifted, nullptr, exps));
  Desc sum = virt(f32, row);
  ops.push_back(reduction(owned, CUDNN_REDUCE_TENSOR_ADD, exps, sum));
  Desc log_sum = virt(f32, row);
  ops.push_back(pointwise(owned, CUDNN_POINTWISE_LOG, sum, nullptr, log_sum));
  ops.push_back(pointwise(owned, CUDNN_POINTWISE_ADD, max, log_sum, stats));
  // P in the input type, as the second matmul multiplies it with V.
  Desc p = virt(t.type, scores);
  ops.push_back(pointwise(owned, CUDNN_POINTWISE_DIV, exps, sum, p));
  ops.push_back(matmul(owned, p, v, o));
  Desc graph = op_graph(owned, handle, ops);

  const size_t n = static_cast<size_t>(b * h * s * d);
  const std::vector<float> hq = values(n, 2, 1.0f, t), hk = values(n, 3, 1.0f, t),
                           hv = values(n, 4, 2.0f, t);
  float attn_scale = 1.0f / std::sqrt(static_cast<float>(d));
  float fill_value = -std::numeric_limits<float>::infinity();
  Device dq(bits(hq, t)), dk(bits(hk, t)), dv(bits(hv, t)), dout(n * 2),
      dstats(static_cast<size_t>(b * h * s) * 4);
  execute(owned, handle, graph, {kQ, kK, kV, kO, kStats, kScale, kFill},
          {dq.ptr, dk.ptr, dv.ptr, dout.ptr, dstats.ptr, &attn_scale, &fill_value});

  std::vector<float> want(n), got(n), want_stats(static_cast<size_t>(b * h * s));
  const std::vector<unsigned short> o16 = dout.read<unsigned short>();
  std::vector<double> logits(s);
  for (int64_t bh = 0; bh < b * h; ++bh) {
    const float* qb = &hq[bh * s * d];
    const float* kb = &hk[bh * s * d];
    const float* vb = &hv[bh * s * d];
    for (int64_t i = 0; i < s; ++i) {
      double best = -INFINITY;
      for (int64_t j = 0; j <= i; ++j) {  // causal: row i sees columns 0..i
        double dot = 0;
        for (int64_t c = 0; c < d; ++c) dot += double{qb[i * d + c]} * kb[j * d + c];
        logits[j] = dot * attn_scale;
        best = std::max(best, logits[j]);
      }
      double total = 0;
      for (int64_t j = 0; j <= i; ++j) total += std::exp(logits[j] - best);
      want_stats[bh * s + i] = static_cast<float>(best + std::log(total));
      for (int64_t c = 0; c < d; ++c) {
        double acc = 0;
        for (int64_t j = 0; j <= i; ++j)
          acc += double{t.round(static_cast<float>(std::exp(logits[j] - best) / total))} *
                 vb[j * d + c];
        const size_t at = static_cast<size_t>((bh * s + i) * d + c);
        want[at] = t.round(static_cast<float>(acc));
        got[at] = t.value(o16[at]);
      }
    }
  }
  // O is a weighted mean of V's values (|V| <= 2): its error is absolute, relative to that scale.
  size_t bad = count_off("attention output", got, want, t.tolerance, 2.0);
  bad += count_off("attention statistics", dstats.read<float>(), want_stats, 1e-3, 1.0);
  std::printf("library_dnn_attention: %s causal attention [%lld x %lld x %lld x %lld] with "
              "statistics: %s\n",
              t.name, static_cast<long long>(b), static_cast<long long>(h),
              static_cast<long long>(s), static_cast<long long>(d), bad == 0 ? "ok" : "WRONG");
  return bad;
}

}  // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  const int64_t batch = program::int_arg(argc, argv, 1, 2, 1, 16);
  const int64_t heads = program::int_arg(argc, argv, 2, 2, 1, 32);
  const int64_t seq = program::int_arg(argc, argv, 3, 24, 1, 1024);
  const int64_t head_dim = program::int_arg(argc, argv, 4, 16, 8, 256);
  const int64_t hidden = program::int_arg(argc, argv, 5, 48, 1, 8192);
  CUDA_CHECK(cudaSetDevice(0));
  cudnnHandle_t handle;
  CUDNN_CHECK(cudnnCreate(&handle));
  size_t bad = 0;
  // Tolerances: a few rounding steps of the type (2^-11 for half, 2^-8 for bfloat16).
  for (const Type16& t : {Type16{CUDNN_DATA_HALF, "half", 4.0 / 2048},
                          Type16{CUDNN_DATA_BFLOAT16, "bfloat16", 4.0 / 256}}) {
    bad += run_norm(handle, t, CUDNN_LAYER_NORM, batch * seq, hidden);
    bad += run_norm(handle, t, CUDNN_RMS_NORM, batch * seq, hidden);
    bad += run_sdpa(handle, t, batch, heads, seq, head_dim);
  }
  CUDNN_CHECK(cudnnDestroy(handle));
  if (bad != 0) {
    std::printf("library_dnn_attention: FAILED: %zu mismatches\n", bad);
    return program::kExitMismatch;
  }
  std::printf("library_dnn_attention: OK\n");
  return 0;
}
