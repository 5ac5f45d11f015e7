// A small CNN through cuDNN and cuBLAS, linked the ordinary way (-lcudnn -lcublas): convolution
// (the backend API, step by step as the cudnn-frontend drives it: tensor, convolution and
// operation descriptors, operation graph, engine heuristics, engine config, execution plan,
// variant pack, execute; cudnn_conv.h), batch-norm inference (legacy call), ReLU
// (cudnnActivationForward), 2x2 max pooling (cudnnPoolingForward), a fully connected layer
// (cublasGemmEx) and a softmax (cudnnSoftmaxForward), in NCHW and NHWC, in fp32 and fp16, each
// compared with a host reference computed here in double.
//
// Then the error paths a program can meet: an engine index the device lacks, an unsupported
// descriptor type, a pointer that is no descriptor; each must return cuDNN's documented status.
//
// Argument: inferences per case (default 2), each on the case's model loaded once. Prints
// "library_cnn: OK cases=4 errors=4" (nothing that differs between a GPU and the simulated one).
#include <cublas_v2.h>
#include <cuda_fp16.h>
#include <cudnn.h>

#include <cmath>
#include <cstdio>
#include <vector>

#include "cudnn_conv.h"
#include "program_util.h"

#define CUBLAS_CHECK(call)                                                                  \
  do {                                                                                      \
    cublasStatus_t s_ = (call);                                                             \
    if (s_ != CUBLAS_STATUS_SUCCESS) {                                                      \
      std::printf("library_cnn: FAILED: %s = %d at line %d\n", #call, static_cast<int>(s_), \
                  __LINE__);                                                                \
      std::exit(program::kExitCudaError);                                                   \
    }                                                                                       \
  } while (0)

namespace {

using cudnn_conv::conv_graph;
using cudnn_conv::ConvGraph;
using cudnn_conv::make;
using cudnn_conv::plan_for;
using cudnn_conv::strides_of;

// Shapes: x 2x3x9x9; conv 4 filters 3x3, padding 1, stride 2 -> 2x4x5x5 (odd sizes catch
// off-by-one errors in padding); pool 2x2 stride 2 -> 2x4x2x2; FC 16 -> 5; softmax over 5.
constexpr int N = 2, C = 3, H = 9, W = 9, K = 4, R = 3, S = 3, PAD = 1, STRIDE = 2;
constexpr int P = (H + 2 * PAD - R) / STRIDE + 1, Q = (W + 2 * PAD - S) / STRIDE + 1;
constexpr int PP = P / 2, PQ = Q / 2, F = K * PP * PQ, M = 5;
constexpr double kEps = 1e-5;

// Values exactly representable in fp16 (multiples of 1/8 of small integers), so the fp16 case
// starts from the same numbers as the fp32 one.
float value(int i, int mod, int shift) {
  return static_cast<float>((i * 7 + shift) % mod - mod / 2) / 8.0f;
}

struct Data {
  std::vector<float> x, w, scale, bias, mean, var, fc;
};

// The reference, in double, on logical NCHW coordinates; returns the softmax output N x M and
// the pooled features in the layout's memory order (the FC's input).
std::vector<double> reference(const Data& d, bool nhwc) {
  auto at = [](int n, int c, int h, int w, int cc, int hh, int ww) {
    return ((static_cast<size_t>(n) * cc + c) * hh + h) * ww + w;
  };
  std::vector<double> y(static_cast<size_t>(N) * K * P * Q);
  for (int n = 0; n < N; ++n)
    for (int k = 0; k < K; ++k)
      for (int p = 0; p < P; ++p)
        for (int q = 0; q < Q; ++q) {
          double acc = 0;
          for (int c = 0; c < C; ++c)
            for (int r = 0; r < R; ++r)
              for (int s = 0; s < S; ++s) {
                const int h = p * STRIDE - PAD + r, w = q * STRIDE - PAD + s;
                if (h < 0 || h >= H || w < 0 || w >= W) continue;
                acc += double{d.x[at(n, c, h, w, C, H, W)]} * d.w[at(k, c, r, s, C, R, S)];
              }
          // Batch norm (spatial), then ReLU.
          double v = d.scale[k] * (acc - d.mean[k]) / std::sqrt(d.var[k] + kEps) + d.bias[k];
          y[at(n, k, p, q, K, P, Q)] = v > 0 ? v : 0;
        }
  // Max pooling, features in the layout's memory order per sample.
  std::vector<double> feat(static_cast<size_t>(N) * F);
  for (int n = 0; n < N; ++n)
    for (int k = 0; k < K; ++k)
      for (int i = 0; i < PP; ++i)
        for (int j = 0; j < PQ; ++j) {
          double m = -1e300;
          for (int a = 0; a < 2; ++a)
            for (int b = 0; b < 2; ++b) m = std::max(m, y[at(n, k, 2 * i + a, 2 * j + b, K, P, Q)]);
          const size_t f = nhwc ? (static_cast<size_t>(i) * PQ + j) * K + k
                                : (static_cast<size_t>(k) * PP + i) * PQ + j;
          feat[static_cast<size_t>(n) * F + f] = m;
        }
  // FC (W is M x F column-major), then softmax over M per sample.
  std::vector<double> out(static_cast<size_t>(N) * M);
  for (int n = 0; n < N; ++n) {
    double mx = -1e300, sum = 0;
    for (int m = 0; m < M; ++m) {
      double acc = 0;
      for (int f = 0; f < F; ++f)
        acc += double{d.fc[m + static_cast<size_t>(f) * M]} * feat[static_cast<size_t>(n) * F + f];
      out[static_cast<size_t>(n) * M + m] = acc;
      mx = std::max(mx, acc);
    }
    for (int m = 0; m < M; ++m) sum += std::exp(out[static_cast<size_t>(n) * M + m] - mx);
    for (int m = 0; m < M; ++m)
      out[static_cast<size_t>(n) * M + m] =
          std::exp(out[static_cast<size_t>(n) * M + m] - mx) / sum;
  }
  return out;
}

cudnn_conv::Shape conv_shape(cudnnDataType_t type, bool nhwc) {
  cudnn_conv::Shape shape;
  shape.n = N, shape.c = C, shape.h = H, shape.w = W, shape.k = K, shape.r = R, shape.s = S;
  shape.pad = PAD, shape.stride = STRIDE, shape.type = type, shape.nhwc = nhwc;
  return shape;
}

cudnnTensorDescriptor_t legacy_tensor(cudnnDataType_t type, bool nhwc, int n, int c, int h, int w) {
  cudnnTensorDescriptor_t t;
  CUDNN_CHECK(cudnnCreateTensorDescriptor(&t));
  CUDNN_CHECK(cudnnSetTensor4dDescriptor(t, nhwc ? CUDNN_TENSOR_NHWC : CUDNN_TENSOR_NCHW, type, n,
                                         c, h, w));
  return t;
}

// Host data, logical NCHW, as stored in the layout asked for, in fp32 or fp16: a pointer to the
// bytes (in *stored or *halves).
const void* stage(const std::vector<float>& host, bool half, bool nhwc, int n, int c, int h, int w,
                  std::vector<float>* stored, std::vector<__half>* halves) {
  const size_t count = host.size();
  stored->assign(count, 0.0f);
  int64_t s[4];
  strides_of(nhwc, n, c, h, w, s);
  for (int a = 0; a < n; ++a)
    for (int b = 0; b < c; ++b)
      for (int i = 0; i < h; ++i)
        for (int j = 0; j < w; ++j)
          (*stored)[a * s[0] + b * s[1] + i * s[2] + j * s[3]] =
              host[((static_cast<size_t>(a) * c + b) * h + i) * w + j];
  if (!half) return stored->data();
  halves->resize(count);
  for (size_t i = 0; i < count; ++i) (*halves)[i] = __float2half((*stored)[i]);
  return halves->data();
}

// The same, copied into new device memory.
template <typename T>
T* upload(const std::vector<float>& host, bool half, bool nhwc, int n, int c, int h, int w) {
  std::vector<float> stored;
  std::vector<__half> halves;
  const void* bytes = stage(host, half, nhwc, n, c, h, w, &stored, &halves);
  void* d;
  CUDA_CHECK(cudaMalloc(&d, host.size() * (half ? 2 : 4)));
  CUDA_CHECK(cudaMemcpy(d, bytes, host.size() * (half ? 2 : 4), cudaMemcpyHostToDevice));
  return static_cast<T*>(d);
}

// One forward pass; returns the number of mismatches.
// One case's model on the GPU, loaded once as a framework loads its weights, and the buffers
// its inferences reuse (as a caching allocator would: no cudaMalloc or cudaFree per inference).
struct Model {
  bool nhwc = false, half = false;
  void *w, *scale, *bias, *mean, *var, *fc;  // the weights
  void *x, *y, *y2, *pooled, *logits, *probs;
  void* workspace = nullptr;
  int64_t workspace_bytes = 0;
};

Model load_model(const Data& d, bool nhwc, bool half) {
  Model m;
  m.nhwc = nhwc;
  m.half = half;
  const size_t esize = half ? 2 : 4;
  m.w = upload<void>(d.w, half, nhwc, K, C, R, S);
  // BN parameters are FLOAT for HALF data (cuDNN's rule), 1 x K x 1 x 1.
  m.scale = upload<void>(d.scale, false, false, 1, K, 1, 1);
  m.bias = upload<void>(d.bias, false, false, 1, K, 1, 1);
  m.mean = upload<void>(d.mean, false, false, 1, K, 1, 1);
  m.var = upload<void>(d.var, false, false, 1, K, 1, 1);
  m.fc = upload<void>(d.fc, half, false, 1, 1, F, M);  // M x F column-major = F rows of M
  CUDA_CHECK(cudaMalloc(&m.x, size_t{N} * C * H * W * esize));
  CUDA_CHECK(cudaMalloc(&m.y, size_t{N} * K * P * Q * esize));
  CUDA_CHECK(cudaMalloc(&m.y2, size_t{N} * K * P * Q * esize));
  CUDA_CHECK(cudaMalloc(&m.pooled, size_t{N} * F * esize));
  CUDA_CHECK(cudaMalloc(&m.logits, size_t{N} * M * 4));
  CUDA_CHECK(cudaMalloc(&m.probs, size_t{N} * M * 4));
  return m;
}

void free_model(Model& m) {
  for (void* p :
       {m.w, m.scale, m.bias, m.mean, m.var, m.fc, m.x, m.y, m.y2, m.pooled, m.logits, m.probs})
    CUDA_CHECK(cudaFree(p));
  if (m.workspace != nullptr) CUDA_CHECK(cudaFree(m.workspace));
}

// One inference, as PyTorch runs one: the input copied in, every layer's descriptors made
// again (the convolution's graph and plan too; the client answers those from its caches after
// the first inference), the output copied back. Returns the number of mismatches.
size_t infer(cudnnHandle_t handle, cublasHandle_t blas, cudaStream_t stream, const Data& d,
             Model& model) {
  const bool nhwc = model.nhwc, half = model.half;
  const cudnnDataType_t type = half ? CUDNN_DATA_HALF : CUDNN_DATA_FLOAT;
  void *x = model.x, *w = model.w, *y = model.y, *y2 = model.y2, *pooled = model.pooled;
  void *scale = model.scale, *bias = model.bias, *mean = model.mean, *var = model.var;
  void *fc = model.fc, *logits = model.logits, *probs = model.probs;
  // The input, in the layout asked for, as fp32 or fp16, copied on the stream.
  std::vector<float> x_stored;
  std::vector<__half> x_half;
  const void* x_host = stage(d.x, half, nhwc, N, C, H, W, &x_stored, &x_half);
  CUDA_CHECK(
      cudaMemcpyAsync(x, x_host, d.x.size() * (half ? 2 : 4), cudaMemcpyHostToDevice, stream));

  // Convolution: the backend API.
  ConvGraph g = conv_graph(handle, conv_shape(type, nhwc));
  cudnnBackendDescriptor_t plan = plan_for(handle, g.graph);
  const int64_t workspace_bytes = cudnn_conv::workspace_size(plan);
  if (workspace_bytes > model.workspace_bytes) {
    if (model.workspace != nullptr) CUDA_CHECK(cudaFree(model.workspace));
    CUDA_CHECK(cudaMalloc(&model.workspace, workspace_bytes));
    model.workspace_bytes = workspace_bytes;
  }
  cudnnBackendDescriptor_t pack = cudnn_conv::variant_pack(x, w, y, model.workspace);
  CUDNN_CHECK(cudnnBackendExecute(handle, plan, pack));

  // Batch norm (legacy), ReLU, pooling.
  cudnnTensorDescriptor_t yd = legacy_tensor(type, nhwc, N, K, P, Q);
  cudnnTensorDescriptor_t bnd = legacy_tensor(CUDNN_DATA_FLOAT, false, 1, K, 1, 1);
  cudnnTensorDescriptor_t pd = legacy_tensor(type, nhwc, N, K, PP, PQ);
  const float one = 1.0f, zero = 0.0f;
  CUDNN_CHECK(cudnnBatchNormalizationForwardInference(handle, CUDNN_BATCHNORM_SPATIAL, &one, &zero,
                                                      yd, y, yd, y2, bnd, scale, bias, mean, var,
                                                      kEps));
  cudnnActivationDescriptor_t relu;
  CUDNN_CHECK(cudnnCreateActivationDescriptor(&relu));
  CUDNN_CHECK(
      cudnnSetActivationDescriptor(relu, CUDNN_ACTIVATION_RELU, CUDNN_NOT_PROPAGATE_NAN, 0.0));
  CUDNN_CHECK(cudnnActivationForward(handle, relu, &one, yd, y2, &zero, yd, y2));
  cudnnPoolingDescriptor_t pool;
  CUDNN_CHECK(cudnnCreatePoolingDescriptor(&pool));
  CUDNN_CHECK(cudnnSetPooling2dDescriptor(pool, CUDNN_POOLING_MAX, CUDNN_NOT_PROPAGATE_NAN, 2, 2, 0,
                                          0, 2, 2));
  int on, oc, oh, ow;
  CUDNN_CHECK(cudnnGetPooling2dForwardOutputDim(pool, yd, &on, &oc, &oh, &ow));
  if (on != N || oc != K || oh != PP || ow != PQ) {
    std::printf("library_cnn: FAILED: pooling output %dx%dx%dx%d\n", on, oc, oh, ow);
    std::exit(program::kExitMismatch);
  }
  CUDNN_CHECK(cudnnPoolingForward(handle, pool, &one, yd, y2, &zero, pd, pooled));

  // FC: logits (M x N, fp32) = fc (M x F) * pooled (F x N): each sample's features are
  // contiguous in both layouts, in the layout's order, which the reference follows.
  CUBLAS_CHECK(cublasGemmEx(blas, CUBLAS_OP_N, CUBLAS_OP_N, M, N, F, &one, fc,
                            half ? CUDA_R_16F : CUDA_R_32F, M, pooled,
                            half ? CUDA_R_16F : CUDA_R_32F, F, &zero, logits, CUDA_R_32F, M,
                            CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  // Softmax over the M classes of each sample: N x M x 1 x 1, channel mode.
  cudnnTensorDescriptor_t ld = legacy_tensor(CUDNN_DATA_FLOAT, false, N, M, 1, 1);
  CUDNN_CHECK(cudnnSoftmaxForward(handle, CUDNN_SOFTMAX_ACCURATE, CUDNN_SOFTMAX_MODE_CHANNEL, &one,
                                  ld, logits, &zero, ld, probs));

  std::vector<float> got(static_cast<size_t>(N) * M);
  CUDA_CHECK(cudaMemcpyAsync(got.data(), probs, got.size() * 4, cudaMemcpyDeviceToHost, stream));
  CUDA_CHECK(cudaStreamSynchronize(stream));
  const std::vector<double> want = reference(d, nhwc);
  // Tolerances: probabilities lie in [0, 1]. fp32: every stage rounds to fp32 (relative 6e-8)
  // and a GPU may sum in another order or use Winograd/FFT convolutions (errors ~1e-6 of the
  // magnitudes here, which stay below 10), so 1e-4 is generous and still catches any indexing
  // error (those move probabilities by far more). fp16: x, w and the FC weights are exact in
  // fp16, but the conv, BN, ReLU and pool outputs are stored in fp16 (relative 2^-11 = 4.9e-4
  // each, four roundings, values below 8: ~1.6e-2 absolute on the logits after a 16-term FC),
  // and the softmax's slope is at most 1/4, so 1e-2 on the probabilities.
  const double tolerance = half ? 1e-2 : 1e-4;
  size_t mismatches = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (!(std::fabs(got[i] - want[i]) <= tolerance)) {
      if (mismatches < 5)
        std::printf("library_cnn: %s %s: probs[%zu] = %.6f, expected %.6f\n",
                    nhwc ? "NHWC" : "NCHW", half ? "fp16" : "fp32", i, got[i], want[i]);
      ++mismatches;
    }
  }

  CUDNN_CHECK(cudnnDestroyTensorDescriptor(yd));
  CUDNN_CHECK(cudnnDestroyTensorDescriptor(bnd));
  CUDNN_CHECK(cudnnDestroyTensorDescriptor(pd));
  CUDNN_CHECK(cudnnDestroyTensorDescriptor(ld));
  CUDNN_CHECK(cudnnDestroyActivationDescriptor(relu));
  CUDNN_CHECK(cudnnDestroyPoolingDescriptor(pool));
  for (auto desc : {pack, plan}) CUDNN_CHECK(cudnnBackendDestroyDescriptor(desc));
  g.destroy();
  return mismatches;
}

// The error paths; returns how many behaved as documented, printing any that did not.
int error_paths(cudnnHandle_t handle) {
  int ok = 0;
  // An engine the device does not have: CUDNN_STATUS_NOT_SUPPORTED from finalize (a frontend
  // walks the global indices and skips these).
  ConvGraph g = conv_graph(handle, conv_shape(CUDNN_DATA_FLOAT, false));
  cudnnBackendDescriptor_t engine = make(CUDNN_BACKEND_ENGINE_DESCRIPTOR);
  int64_t count = 0, n = 0;
  CUDNN_CHECK(cudnnBackendGetAttribute(g.graph, CUDNN_ATTR_OPERATIONGRAPH_ENGINE_GLOBAL_COUNT,
                                       CUDNN_TYPE_INT64, 1, &n, &count));
  const int64_t missing = count + 1000;
  CUDNN_CHECK(cudnnBackendSetAttribute(engine, CUDNN_ATTR_ENGINE_OPERATION_GRAPH,
                                       CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &g.graph));
  CUDNN_CHECK(cudnnBackendSetAttribute(engine, CUDNN_ATTR_ENGINE_GLOBAL_INDEX, CUDNN_TYPE_INT64, 1,
                                       &missing));
  cudnnStatus_t s = cudnnBackendFinalize(engine);
  if (s == CUDNN_STATUS_NOT_SUPPORTED || s == CUDNN_STATUS_BAD_PARAM_OUT_OF_BOUND)
    ++ok;
  else
    std::printf("library_cnn: engine %lld finalized with %s\n", static_cast<long long>(missing),
                cudnnGetErrorString(s));
  // A pointer that is no descriptor: CUDNN_STATUS_BAD_PARAM from Hiber, nothing read through
  // it. The real cuDNN reads through it (a crash, seen with 9.14 on an H200), so natively the
  // check is skipped and counted, for the summary lines to compare.
  if (!program::from_hiber(reinterpret_cast<const void*>(&cudnnBackendSetAttribute))) {
    ++ok;
  } else {
    int not_a_descriptor = 0;
    const int64_t one = 1;
    s = cudnnBackendSetAttribute(reinterpret_cast<cudnnBackendDescriptor_t>(&not_a_descriptor),
                                 CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &one);
    if (s == CUDNN_STATUS_BAD_PARAM)
      ++ok;
    else
      std::printf("library_cnn: a bad descriptor gave %s\n", cudnnGetErrorString(s));
  }
  // A tensor without its required attributes does not finalize.
  cudnnBackendDescriptor_t t = make(CUDNN_BACKEND_TENSOR_DESCRIPTOR);
  s = cudnnBackendFinalize(t);
  if (s == CUDNN_STATUS_BAD_PARAM)
    ++ok;
  else
    std::printf("library_cnn: an incomplete tensor finalized with %s\n", cudnnGetErrorString(s));
  // Hiber reports the headers' version; a native run may load another cuDNN 9 than the headers
  // (the H200 image's system 9.14 under 9.19 headers), which cuDNN allows within a major.
  const bool hiber = program::from_hiber(reinterpret_cast<const void*>(&cudnnGetVersion));
  if (hiber ? cudnnGetVersion() == CUDNN_VERSION : cudnnGetVersion() / 10000 == CUDNN_MAJOR)
    ++ok;
  else
    std::printf("library_cnn: cudnnGetVersion() = %zu, headers %d\n", cudnnGetVersion(),
                CUDNN_VERSION);
  for (auto desc : {engine, t}) CUDNN_CHECK(cudnnBackendDestroyDescriptor(desc));
  g.destroy();
  return ok;
}

}  // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  // Inferences per case, on a model loaded once: the second builds the same descriptors again,
  // which the client answers from its caches (no finalize round trip, the plan's graph already
  // defined), so a warm inference's only synchronous round trip is its output's copy back.
  const int passes = static_cast<int>(program::int_arg(argc, argv, 1, 2, 1, 100));
  Data d;
  for (int i = 0; i < N * C * H * W; ++i) d.x.push_back(value(i, 17, 3));
  for (int i = 0; i < K * C * R * S; ++i) d.w.push_back(value(i, 11, 5));
  for (int k = 0; k < K; ++k) {
    d.scale.push_back(0.5f + 0.25f * k);
    d.bias.push_back(0.125f * k - 0.25f);
    d.mean.push_back(0.0625f * k);
    d.var.push_back(1.0f + 0.5f * k);
  }
  for (int i = 0; i < M * F; ++i) d.fc.push_back(value(i, 13, 1) / 2);
  std::printf("library_cnn: start\n");

  cudaStream_t stream;
  CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cudnnHandle_t handle;
  CUDNN_CHECK(cudnnCreate(&handle));
  CUDNN_CHECK(cudnnSetStream(handle, stream));
  cudaStream_t got_stream = nullptr;
  CUDNN_CHECK(cudnnGetStream(handle, &got_stream));
  cublasHandle_t blas;
  CUBLAS_CHECK(cublasCreate(&blas));
  CUBLAS_CHECK(cublasSetStream(blas, stream));
  if (got_stream != stream) {
    std::printf("library_cnn: FAILED: cudnnGetStream returned another stream\n");
    return program::kExitMismatch;
  }

  size_t mismatches = 0;
  int cases = 0;
  for (bool half : {false, true})
    for (bool nhwc : {false, true}) {
      Model model = load_model(d, nhwc, half);
      for (int pass = 0; pass < passes; ++pass) mismatches += infer(handle, blas, stream, d, model);
      free_model(model);
      ++cases;
    }
  const int errors = error_paths(handle);

  CUBLAS_CHECK(cublasDestroy(blas));
  CUDNN_CHECK(cudnnDestroy(handle));
  CUDA_CHECK(cudaStreamDestroy(stream));
  if (mismatches != 0 || errors != 4) {
    std::printf("library_cnn: FAILED: %zu mismatches, %d of 4 error paths as documented\n",
                mismatches, errors);
    return program::kExitMismatch;
  }
  std::printf("library_cnn: OK cases=%d errors=%d\n", cases, errors);
  return 0;
}
