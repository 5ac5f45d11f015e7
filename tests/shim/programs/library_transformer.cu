// library_transformer: one transformer encoder block through cuBLAS and cuBLASLt (linked with
// -lcublas -lcublasLt), as PyTorch runs it: the projections by cublasLtMatmul with the BIAS and
// GELU_BIAS epilogues, attention scores and context by cublasGemmStridedBatchedEx, softmax and
// layer norm by the program's own kernels. The output is compared with a CPU reference computed
// here independently, in double.
//
// Usage: library_transformer [precision = 0] [repeats = 2]
//   precision 0: fp32 and fp16 in one run; 1: fp32 only; 2: fp16 only. Each precision runs the
//   block `repeats` times on new descriptors (as PyTorch re-creates them per call), so the later
//   runs take cuBLASLt's heuristics from the client's cache.
//
// Layout: column-major throughout, one token per column: X is hidden x tokens, and a linear layer
// is Y = W X + b with W out x in, so the bias is one per row of Y (cuBLASLt's bias epilogue).
// fp16 runs store activations in half and accumulate in fp32 (CUBLAS_COMPUTE_32F).
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <vector>

#include "program_util.h"

#define CUBLAS_CHECK(call)                                                             \
  do {                                                                                 \
    const cublasStatus_t cublas_check_status_ = (call);                                \
    if (cublas_check_status_ != CUBLAS_STATUS_SUCCESS) {                               \
      std::fprintf(stderr, "%s:%d: %s failed: status %d\n", __FILE__, __LINE__, #call, \
                   static_cast<int>(cublas_check_status_));                            \
      std::exit(program::kExitCudaError);                                              \
    }                                                                                  \
  } while (0)

// The kernels are outside the anonymous namespace: their names are what the simulated GPU's
// host implementations register (tests/shim/programs/host_kernels.cc).
__device__ float load(const void* p, int i, int is_half) {
  return is_half ? __half2float(static_cast<const __half*>(p)[i]) : static_cast<const float*>(p)[i];
}
__device__ void store(void* p, int i, float v, int is_half) {
  if (is_half) {
    static_cast<__half*>(p)[i] = __float2half_rn(v);
  } else {
    static_cast<float*>(p)[i] = v;
  }
}

// Softmax down each column of a rows x cols column-major matrix (ld = rows), in place: one thread
// per column (a query), over its rows (the keys).
__global__ void softmax_columns(void* scores, int rows, int cols, int is_half) {
  const int col = blockIdx.x * blockDim.x + threadIdx.x;
  if (col >= cols) return;
  float max = -INFINITY;
  for (int r = 0; r < rows; ++r) max = fmaxf(max, load(scores, col * rows + r, is_half));
  float sum = 0.0f;
  for (int r = 0; r < rows; ++r) sum += expf(load(scores, col * rows + r, is_half) - max);
  for (int r = 0; r < rows; ++r)
    store(scores, col * rows + r, expf(load(scores, col * rows + r, is_half) - max) / sum, is_half);
}

// out[:, c] = LayerNorm(x[:, c] + residual[:, c]) * gamma + beta, one thread per column (token),
// over rows (the hidden features); every matrix rows x cols with ld = rows.
__global__ void add_layernorm(const void* x, const void* residual, void* out, const float* gamma,
                              const float* beta, int rows, int cols, float eps, int is_half) {
  const int col = blockIdx.x * blockDim.x + threadIdx.x;
  if (col >= cols) return;
  float mean = 0.0f;
  for (int r = 0; r < rows; ++r)
    mean += load(x, col * rows + r, is_half) + load(residual, col * rows + r, is_half);
  mean /= rows;
  float var = 0.0f;
  for (int r = 0; r < rows; ++r) {
    const float d =
        load(x, col * rows + r, is_half) + load(residual, col * rows + r, is_half) - mean;
    var += d * d;
  }
  var /= rows;
  const float inv = rsqrtf(var + eps);
  for (int r = 0; r < rows; ++r) {
    const float v = load(x, col * rows + r, is_half) + load(residual, col * rows + r, is_half);
    store(out, col * rows + r, (v - mean) * inv * gamma[r] + beta[r], is_half);
  }
}

namespace {

constexpr int kSeq = 16, kBatch = 2, kTokens = kSeq * kBatch;
constexpr int kHidden = 64, kHeads = 4, kHeadDim = kHidden / kHeads, kFfn = 128;
constexpr float kEps = 1e-5f;

// Deterministic values that are exact in half: multiples of 1/64 in [-scale, scale].
std::vector<float> values(size_t n, unsigned seed, float scale) {
  std::vector<float> v(n);
  unsigned state = seed * 2654435761u + 12345u;
  for (size_t i = 0; i < n; ++i) {
    state = state * 1664525u + 1013904223u;
    const int step = static_cast<int>((state >> 9) % 129) - 64;  // -64..64
    v[i] = std::round(static_cast<float>(step) / 64.0f * scale * 64.0f) / 64.0f;
  }
  return v;
}

struct Weights {
  std::vector<float> x, w_qkv_t, b_qkv, w_o, b_o, gamma1, beta1, w_1, b_1, w_2, b_2, gamma2, beta2;
};

Weights make_weights() {
  Weights w;
  w.x = values(size_t{kHidden} * kTokens, 1, 1.0f);
  w.w_qkv_t = values(size_t{kHidden} * 3 * kHidden, 2, 0.25f);  // stored hidden x 3*hidden: W^T
  w.b_qkv = values(3 * kHidden, 3, 0.25f);
  w.w_o = values(size_t{kHidden} * kHidden, 4, 0.25f);
  w.b_o = values(kHidden, 5, 0.25f);
  w.gamma1 = values(kHidden, 6, 0.5f);
  for (float& g : w.gamma1) g += 1.0f;
  w.beta1 = values(kHidden, 7, 0.25f);
  w.w_1 = values(size_t{kFfn} * kHidden, 8, 0.25f);
  w.b_1 = values(kFfn, 9, 0.25f);
  w.w_2 = values(size_t{kHidden} * kFfn, 10, 0.125f);
  w.b_2 = values(kHidden, 11, 0.25f);
  w.gamma2 = values(kHidden, 12, 0.5f);
  for (float& g : w.gamma2) g += 1.0f;
  w.beta2 = values(kHidden, 13, 0.25f);
  return w;
}

// ---- The CPU reference: per token, in double ----

std::vector<double> ref_linear(const std::vector<float>& w, bool w_transposed, int out, int in,
                               const std::vector<float>& b, const std::vector<double>& x,
                               int tokens) {
  std::vector<double> y(size_t(out) * tokens);
  for (int t = 0; t < tokens; ++t)
    for (int o = 0; o < out; ++o) {
      double s = b[o];
      for (int i = 0; i < in; ++i)
        s += double(w_transposed ? w[i + size_t(o) * in] : w[o + size_t(i) * out]) *
             x[i + size_t(t) * in];
      y[o + size_t(t) * out] = s;
    }
  return y;
}

std::vector<double> ref_add_layernorm(const std::vector<double>& a, const std::vector<double>& b,
                                      const std::vector<float>& gamma,
                                      const std::vector<float>& beta) {
  std::vector<double> out(a.size());
  for (int t = 0; t < kTokens; ++t) {
    double mean = 0, var = 0;
    for (int r = 0; r < kHidden; ++r) mean += a[r + t * kHidden] + b[r + t * kHidden];
    mean /= kHidden;
    for (int r = 0; r < kHidden; ++r) {
      const double d = a[r + t * kHidden] + b[r + t * kHidden] - mean;
      var += d * d;
    }
    var /= kHidden;
    for (int r = 0; r < kHidden; ++r)
      out[r + t * kHidden] =
          (a[r + t * kHidden] + b[r + t * kHidden] - mean) / std::sqrt(var + kEps) * gamma[r] +
          beta[r];
  }
  return out;
}

std::vector<double> reference(const Weights& w) {
  std::vector<double> x(w.x.begin(), w.x.end());
  const std::vector<double> qkv =
      ref_linear(w.w_qkv_t, true, 3 * kHidden, kHidden, w.b_qkv, x, kTokens);
  std::vector<double> ctx(size_t(kHidden) * kTokens);
  const double scale = 1.0 / std::sqrt(double(kHeadDim));
  for (int b = 0; b < kBatch; ++b)
    for (int h = 0; h < kHeads; ++h)
      for (int q = 0; q < kSeq; ++q) {
        const int tq = b * kSeq + q;
        std::vector<double> p(kSeq);
        double max = -1e300, sum = 0;
        for (int k = 0; k < kSeq; ++k) {
          const int tk = b * kSeq + k;
          double s = 0;
          for (int d = 0; d < kHeadDim; ++d)
            s += qkv[h * kHeadDim + d + size_t(tq) * 3 * kHidden] *
                 qkv[kHidden + h * kHeadDim + d + size_t(tk) * 3 * kHidden];
          p[k] = s * scale;
          max = std::max(max, p[k]);
        }
        for (double& v : p) sum += (v = std::exp(v - max));
        for (int d = 0; d < kHeadDim; ++d) {
          double s = 0;
          for (int k = 0; k < kSeq; ++k)
            s += p[k] / sum *
                 qkv[2 * kHidden + h * kHeadDim + d + size_t(b * kSeq + k) * 3 * kHidden];
          ctx[h * kHeadDim + d + size_t(tq) * kHidden] = s;
        }
      }
  const std::vector<double> proj = ref_linear(w.w_o, false, kHidden, kHidden, w.b_o, ctx, kTokens);
  const std::vector<double> x1 = ref_add_layernorm(proj, x, w.gamma1, w.beta1);
  std::vector<double> hidden = ref_linear(w.w_1, false, kFfn, kHidden, w.b_1, x1, kTokens);
  for (double& v : hidden)  // cuBLASLt's GELU: the tanh approximation
    v = 0.5 * v * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (v + 0.044715 * v * v * v)));
  const std::vector<double> y = ref_linear(w.w_2, false, kHidden, kFfn, w.b_2, hidden, kTokens);
  return ref_add_layernorm(y, x1, w.gamma2, w.beta2);
}

// ---- The block on the GPU ----

struct Buffer {
  void* p = nullptr;
  Buffer(const std::vector<float>& v, bool half) {
    const size_t bytes = v.size() * (half ? sizeof(__half) : sizeof(float));
    CUDA_CHECK(cudaMalloc(&p, bytes));
    if (half) {
      std::vector<__half> h(v.size());
      for (size_t i = 0; i < v.size(); ++i) h[i] = __float2half(v[i]);
      CUDA_CHECK(cudaMemcpy(p, h.data(), bytes, cudaMemcpyHostToDevice));
    } else {
      CUDA_CHECK(cudaMemcpy(p, v.data(), bytes, cudaMemcpyHostToDevice));
    }
  }
  Buffer(size_t n, bool half) {
    CUDA_CHECK(cudaMalloc(&p, n * (half ? sizeof(__half) : sizeof(float))));
  }
  ~Buffer() { cudaFree(p); }
  template <typename T = void>
  T* at(size_t elements, bool half) const {
    return reinterpret_cast<T*>(static_cast<char*>(p) + elements * (half ? 2 : 4));
  }
};

// D = epilogue(W X + bias) by cublasLtMatmul on fresh descriptors, as PyTorch makes them per call:
// W is out x in (or, transposed, stored in x out), X in x tokens, D out x tokens.
void lt_linear(cublasLtHandle_t lt, cudaStream_t stream, bool half, const void* w,
               bool w_transposed, int out, int in, const void* bias, const void* x, void* d,
               cublasLtEpilogue_t epilogue, void* workspace, size_t workspace_bytes) {
  const cudaDataType type = half ? CUDA_R_16F : CUDA_R_32F;
  cublasLtMatmulDesc_t desc;
  CUBLAS_CHECK(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t transa = w_transposed ? CUBLAS_OP_T : CUBLAS_OP_N;
  CUBLAS_CHECK(
      cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &transa, sizeof(transa)));
  CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue,
                                              sizeof(epilogue)));
  CUBLAS_CHECK(
      cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)));
  cublasLtMatrixLayout_t a_desc, x_desc, d_desc;
  CUBLAS_CHECK(w_transposed ? cublasLtMatrixLayoutCreate(&a_desc, type, in, out, in)
                            : cublasLtMatrixLayoutCreate(&a_desc, type, out, in, out));
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&x_desc, type, in, kTokens, in));
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&d_desc, type, out, kTokens, out));
  cublasLtMatmulPreference_t preference;
  CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&preference));
  CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(preference,
                                                    CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                    &workspace_bytes, sizeof(workspace_bytes)));
  if (half) {
    // PyTorch's preference for fp16 when reduced-precision reductions are disallowed: it must
    // reach the heuristic (the host's one-pass fp32 reduction satisfies it).
    const uint32_t mask = CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE | CUBLASLT_REDUCTION_SCHEME_NONE;
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
        preference, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &mask, sizeof(mask)));
  }
  cublasLtMatmulHeuristicResult_t result;
  int found = 0;
  static bool refusal_checked = false;
  if (!refusal_checked) {
    // A preference the query does not carry is refused, never answered as if it were unset.
    refusal_checked = true;
    cublasLtMatmulPreference_t waves;
    CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&waves));
    const int32_t max_waves = 1;
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(waves, CUBLASLT_MATMUL_PREF_MAX_WAVES_COUNT,
                                                      &max_waves, sizeof(max_waves)));
    const cublasStatus_t refused = cublasLtMatmulAlgoGetHeuristic(
        lt, desc, a_desc, x_desc, d_desc, d_desc, waves, 1, &result, &found);
    if (refused != CUBLAS_STATUS_NOT_SUPPORTED) {
      std::printf(
          "library_transformer: WRONG: a MAX_WAVES_COUNT preference got status %d, not "
          "CUBLAS_STATUS_NOT_SUPPORTED\n",
          static_cast<int>(refused));
      std::exit(program::kExitMismatch);
    }
    CUBLAS_CHECK(cublasLtMatmulPreferenceDestroy(waves));
    found = 0;
  }
  CUBLAS_CHECK(cublasLtMatmulAlgoGetHeuristic(lt, desc, a_desc, x_desc, d_desc, d_desc, preference,
                                              1, &result, &found));
  if (found != 1) {
    std::printf("library_transformer: FAILED: no cuBLASLt algorithm\n");
    std::exit(program::kExitMismatch);
  }
  const float alpha = 1.0f, beta = 0.0f;
  CUBLAS_CHECK(cublasLtMatmul(lt, desc, &alpha, w, a_desc, x, x_desc, &beta, d, d_desc, d, d_desc,
                              &result.algo, workspace, workspace_bytes, stream));
  CUBLAS_CHECK(cublasLtMatmulPreferenceDestroy(preference));
  CUBLAS_CHECK(cublasLtMatrixLayoutDestroy(d_desc));
  CUBLAS_CHECK(cublasLtMatrixLayoutDestroy(x_desc));
  CUBLAS_CHECK(cublasLtMatrixLayoutDestroy(a_desc));
  CUBLAS_CHECK(cublasLtMatmulDescDestroy(desc));
}

// The block once; returns the output as floats.
std::vector<float> run_block(const Weights& w, bool half, cublasHandle_t blas, cudaStream_t stream,
                             int repeats) {
  const cudaDataType type = half ? CUDA_R_16F : CUDA_R_32F;
  // PyTorch passes its cuBLAS handle as the cuBLASLt handle.
  auto lt = reinterpret_cast<cublasLtHandle_t>(blas);
  Buffer x(w.x, half), w_qkv_t(w.w_qkv_t, half), b_qkv(w.b_qkv, half), w_o(w.w_o, half),
      b_o(w.b_o, half), w_1(w.w_1, half), b_1(w.b_1, half), w_2(w.w_2, half), b_2(w.b_2, half);
  Buffer gamma1(w.gamma1, false), beta1(w.beta1, false), gamma2(w.gamma2, false),
      beta2(w.beta2, false);
  Buffer qkv(size_t(3) * kHidden * kTokens, half), scores(size_t(kSeq) * kSeq * kHeads, half),
      ctx(size_t(kHidden) * kTokens, half), proj(size_t(kHidden) * kTokens, half),
      x1(size_t(kHidden) * kTokens, half), hidden(size_t(kFfn) * kTokens, half),
      y(size_t(kHidden) * kTokens, half), out(size_t(kHidden) * kTokens, half);
  const size_t workspace_bytes = 1 << 20;
  void* workspace;
  CUDA_CHECK(cudaMalloc(&workspace, workspace_bytes));
  const int threads = 32;
  const int ln_blocks = (kTokens + threads - 1) / threads;
  for (int repeat = 0; repeat < repeats; ++repeat) {
    lt_linear(lt, stream, half, w_qkv_t.p, true, 3 * kHidden, kHidden, b_qkv.p, x.p, qkv.p,
              CUBLASLT_EPILOGUE_BIAS, workspace, workspace_bytes);
    const float scale = 1.0f / std::sqrt(float(kHeadDim)), zero = 0.0f, one = 1.0f;
    for (int b = 0; b < kBatch; ++b) {
      // scores[k, q] of head h = K_h^T Q_h: heads kHeadDim rows apart in qkv (ld 3*hidden).
      const size_t token0 = size_t(b) * kSeq * 3 * kHidden;
      CUBLAS_CHECK(cublasGemmStridedBatchedEx(
          blas, CUBLAS_OP_T, CUBLAS_OP_N, kSeq, kSeq, kHeadDim, &scale,
          qkv.at(token0 + kHidden, half), type, 3 * kHidden, kHeadDim, qkv.at(token0, half), type,
          3 * kHidden, kHeadDim, &zero, scores.p, type, kSeq, kSeq * kSeq, kHeads,
          CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
      softmax_columns<<<(kSeq * kHeads + threads - 1) / threads, threads, 0, stream>>>(
          scores.p, kSeq, kSeq * kHeads, half);
      CUDA_CHECK_LAUNCH();
      // ctx_h = V_h P_h, written at rows h*kHeadDim of ctx's token columns.
      CUBLAS_CHECK(cublasGemmStridedBatchedEx(
          blas, CUBLAS_OP_N, CUBLAS_OP_N, kHeadDim, kSeq, kSeq, &one,
          qkv.at(token0 + 2 * kHidden, half), type, 3 * kHidden, kHeadDim, scores.p, type, kSeq,
          kSeq * kSeq, &zero, ctx.at(size_t(b) * kSeq * kHidden, half), type, kHidden, kHeadDim,
          kHeads, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    }
    lt_linear(lt, stream, half, w_o.p, false, kHidden, kHidden, b_o.p, ctx.p, proj.p,
              CUBLASLT_EPILOGUE_BIAS, workspace, workspace_bytes);
    add_layernorm<<<ln_blocks, threads, 0, stream>>>(
        proj.p, x.p, x1.p, static_cast<float*>(gamma1.p), static_cast<float*>(beta1.p), kHidden,
        kTokens, kEps, half);
    CUDA_CHECK_LAUNCH();
    lt_linear(lt, stream, half, w_1.p, false, kFfn, kHidden, b_1.p, x1.p, hidden.p,
              CUBLASLT_EPILOGUE_GELU_BIAS, workspace, workspace_bytes);
    lt_linear(lt, stream, half, w_2.p, false, kHidden, kFfn, b_2.p, hidden.p, y.p,
              CUBLASLT_EPILOGUE_BIAS, workspace, workspace_bytes);
    add_layernorm<<<ln_blocks, threads, 0, stream>>>(
        y.p, x1.p, out.p, static_cast<float*>(gamma2.p), static_cast<float*>(beta2.p), kHidden,
        kTokens, kEps, half);
    CUDA_CHECK_LAUNCH();
  }
  std::vector<float> result(size_t(kHidden) * kTokens);
  if (half) {
    std::vector<__half> h(result.size());
    CUDA_CHECK(cudaMemcpyAsync(h.data(), out.p, h.size() * sizeof(__half), cudaMemcpyDeviceToHost,
                               stream));
    CUDA_CHECK(cudaStreamSynchronize(stream));
    for (size_t i = 0; i < h.size(); ++i) result[i] = __half2float(h[i]);
  } else {
    CUDA_CHECK(cudaMemcpyAsync(result.data(), out.p, result.size() * sizeof(float),
                               cudaMemcpyDeviceToHost, stream));
    CUDA_CHECK(cudaStreamSynchronize(stream));
  }
  CUDA_CHECK(cudaFree(workspace));
  return result;
}

}  // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  const int precision = static_cast<int>(program::int_arg(argc, argv, 1, 0, 0, 2));
  const int repeats = static_cast<int>(program::int_arg(argc, argv, 2, 2, 1, 100));
  std::printf("library_transformer: start tokens=%d hidden=%d heads=%d ffn=%d\n", kTokens, kHidden,
              kHeads, kFfn);
  const Weights weights = make_weights();
  const std::vector<double> want = reference(weights);

  cudaStream_t stream;
  CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cublasHandle_t blas;
  CUBLAS_CHECK(cublasCreate(&blas));
  CUBLAS_CHECK(cublasSetStream(blas, stream));

  // Tolerances, absolute, on outputs of a layer norm (magnitudes up to about 6 here):
  //  - fp32: every GEMM sums at most 128 products in fp32 (relative error below 128 * 2^-24 ~ 8e-6
  //    of the sums' magnitudes), expf/tanhf/rsqrtf are within a few ulp on the GPU and the host
  //    alike, and the layer norms amplify absolute errors by 1/sigma. The simulated GPU is 1e-6
  //    off the double reference; 1e-4 leaves a factor 100 for other summation orders (split-K,
  //    tensor cores), while any wrong index, transpose, bias or epilogue moves outputs by 0.1 or
  //    more.
  //  - fp16: each of the eight stored activations is rounded to half (relative 2^-11 ~ 5e-4),
  //    propagated through the next layer and amplified by the layer norms: the simulated GPU is
  //    2e-3 off; 2e-2 leaves a factor 10 (and a wrong result is still off by 0.1 or more).
  struct Case {
    bool half;
    const char* name;
    double tolerance;
    const char* tolerance_text;
  };
  const Case cases[] = {{false, "fp32", 1e-4, "1e-4"}, {true, "fp16", 2e-2, "2e-2"}};
  int failures = 0, ran = 0;
  for (const Case& c : cases) {
    if ((precision == 1 && c.half) || (precision == 2 && !c.half)) continue;
    ++ran;
    const std::vector<float> got = run_block(weights, c.half, blas, stream, repeats);
    double max_err = 0;
    size_t worst = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      const double err = std::fabs(double(got[i]) - want[i]);
      if (!(err <= max_err)) {  // NaN counts as the worst
        max_err = std::isnan(err) ? INFINITY : err;
        worst = i;
      }
    }
    if (!(max_err <= c.tolerance)) {
      std::printf("library_transformer: %s: error %.6g at %zu (got %.6g, want %.6g) exceeds %s\n",
                  c.name, max_err, worst, double(got[worst]), want[worst], c.tolerance_text);
      ++failures;
    } else {
      std::printf("library_transformer: %s: max_abs_err<%s\n", c.name, c.tolerance_text);
    }
  }

  // Attribute rules of cuBLASLt that real clients rely on: a wrong size is refused, and a get
  // with size 0 reports the size needed.
  cublasLtMatmulDesc_t desc;
  CUBLAS_CHECK(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const int64_t wrong = 0;
  size_t needed = 0;
  if (cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &wrong, sizeof(wrong)) !=
          CUBLAS_STATUS_INVALID_VALUE ||
      cublasLtMatmulDescGetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, nullptr, 0,
                                     &needed) != CUBLAS_STATUS_SUCCESS ||
      needed != sizeof(void*)) {
    std::printf("library_transformer: FAILED: cuBLASLt attribute sizes are not checked\n");
    ++failures;
  }
  CUBLAS_CHECK(cublasLtMatmulDescDestroy(desc));

  CUBLAS_CHECK(cublasDestroy(blas));
  CUDA_CHECK(cudaStreamDestroy(stream));
  if (failures != 0) {
    std::printf("library_transformer: FAILED: %d of %d precisions\n", failures, ran);
    return program::kExitMismatch;
  }
  std::printf("library_transformer: OK precisions=%d repeats=%d\n", ran, repeats);
  return 0;
}
