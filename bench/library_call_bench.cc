// Client-side cost of remoted library calls, as a program sees it: an ordinary CUDA program
// (built by nvcc as CUDA, -cudart shared -lcublasLt -lcudnn, Google Benchmark) run with the shim
// and the replacement libraries preloaded against hiberd (scripts/library-bench.sh; docs/perf.md).
//
// Each figure is measured in bursts, as bench/shim_bench.cu measures launches: kBurst calls from
// an idle device, then an untimed cudaDeviceSynchronize, so no call waits for hiberd. Per call:
// the calling thread's CPU time (thread_cpu_us) and wall time (wall_us).
//   - Launch: an empty kernel (the baseline: the launch cost the shim's target is set against).
//   - LtMatmulBatched: one strided-batched cublasLtMatmul (8 x 8 x 8, 4 batches, fp32, BIAS
//     epilogue) on descriptors made once, with the algo from a heuristic asked once.
//   - LtMatmulPyTorchStyle: what PyTorch does per matmul: create the descriptors and preference,
//     set their attributes, ask for the heuristic (answered from the client's cache after the
//     first call), run the matmul, destroy everything.
//   - DnnExecute: one cudnnBackendExecute of a small convolution (1 x 4 x 8 x 8, 4 filters 3x3,
//     padding 1, fp32) whose plan and variant pack were made once.
//   - DnnExecutePyTorchStyle: what PyTorch's cached-plan path does per convolution: create the
//     variant pack, set its ids, pointers and workspace, finalize it, execute, destroy it.
// The convolution's plan is built by tests/shim/programs/cudnn_conv.h, as the cudnn-frontend
// builds it.
#include <benchmark/benchmark.h>
#include <cublasLt.h>
#include <cuda_runtime.h>
#include <cudnn.h>
#include <time.h>

#include <cstdio>
#include <cstdlib>
#include <utility>

#include "cudnn_conv.h"

// The name of shim_bench's empty kernel, so hiberd --device=sim runs it with shim_bench's plugin
// (bench/shim_bench_kernels.cc).
__global__ void shim_bench_empty() {}

namespace {

constexpr int kBurst = 256;
constexpr int kSize = 8, kBatches = 4;  // square kSize x kSize matrices

void check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "library_call_bench: %s failed\n", what);
    std::exit(1);
  }
}

double now_us(clockid_t clock) {
  timespec ts;
  clock_gettime(clock, &ts);
  return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

// Runs `call` in bursts; reports per-call thread CPU and wall time.
template <typename F>
void bursts(benchmark::State& state, F&& call) {
  double cpu = 0, wall = 0;
  int64_t calls = 0;
  for (auto _ : state) {
    const double c0 = now_us(CLOCK_THREAD_CPUTIME_ID), w0 = now_us(CLOCK_MONOTONIC);
    for (int i = 0; i < kBurst; ++i) call();
    const double c1 = now_us(CLOCK_THREAD_CPUTIME_ID), w1 = now_us(CLOCK_MONOTONIC);
    state.SetIterationTime((w1 - w0) / 1e6);
    cpu += c1 - c0;
    wall += w1 - w0;
    calls += kBurst;
    check(cudaDeviceSynchronize() == cudaSuccess, "cudaDeviceSynchronize");
  }
  state.counters["thread_cpu_us"] = cpu / static_cast<double>(calls);
  state.counters["wall_us"] = wall / static_cast<double>(calls);
}

struct Problem {
  float *a = nullptr, *b = nullptr, *d = nullptr, *bias = nullptr;
  cublasLtHandle_t lt = nullptr;
  Problem() {
    check(cublasLtCreate(&lt) == CUBLAS_STATUS_SUCCESS, "cublasLtCreate");
    const size_t elements = size_t{kSize} * kSize * kBatches;
    for (float** p : {&a, &b, &d})
      check(cudaMalloc(p, elements * sizeof(float)) == cudaSuccess, "cudaMalloc");
    check(cudaMalloc(&bias, kSize * sizeof(float)) == cudaSuccess, "cudaMalloc");
    check(cudaMemset(a, 0, elements * sizeof(float)) == cudaSuccess, "cudaMemset");
    check(cudaMemset(b, 0, elements * sizeof(float)) == cudaSuccess, "cudaMemset");
    check(cudaMemset(bias, 0, kSize * sizeof(float)) == cudaSuccess, "cudaMemset");
  }
  ~Problem() {
    for (float* p : {a, b, d, bias}) cudaFree(p);
    cublasLtDestroy(lt);
  }
};

struct Descriptors {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  cublasLtMatmulPreference_t preference = nullptr;
  explicit Descriptors(const Problem& p) {
    check(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F) == CUBLAS_STATUS_SUCCESS,
          "cublasLtMatmulDescCreate");
    const cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_BIAS;
    check(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue,
                                         sizeof(epilogue)) == CUBLAS_STATUS_SUCCESS,
          "epilogue");
    check(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &p.bias,
                                         sizeof(p.bias)) == CUBLAS_STATUS_SUCCESS,
          "bias");
    const int32_t batches = kBatches;
    for (cublasLtMatrixLayout_t* l : {&a, &b, &d}) {
      check(cublasLtMatrixLayoutCreate(l, CUDA_R_32F, kSize, kSize, kSize) == CUBLAS_STATUS_SUCCESS,
            "cublasLtMatrixLayoutCreate");
      const int64_t stride = int64_t{kSize} * kSize;
      check(cublasLtMatrixLayoutSetAttribute(*l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &batches,
                                             sizeof(batches)) == CUBLAS_STATUS_SUCCESS &&
                cublasLtMatrixLayoutSetAttribute(*l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                                                 &stride, sizeof(stride)) == CUBLAS_STATUS_SUCCESS,
            "batch attributes");
    }
    check(cublasLtMatmulPreferenceCreate(&preference) == CUBLAS_STATUS_SUCCESS, "preference");
    const size_t workspace = 0;
    check(cublasLtMatmulPreferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                               &workspace,
                                               sizeof(workspace)) == CUBLAS_STATUS_SUCCESS,
          "workspace preference");
  }
  cublasLtMatmulAlgo_t heuristic(const Problem& p) const {
    cublasLtMatmulHeuristicResult_t result;
    int found = 0;
    check(cublasLtMatmulAlgoGetHeuristic(p.lt, desc, a, b, d, d, preference, 1, &result, &found) ==
                  CUBLAS_STATUS_SUCCESS &&
              found == 1,
          "cublasLtMatmulAlgoGetHeuristic");
    return result.algo;
  }
  void matmul(const Problem& p, const cublasLtMatmulAlgo_t& algo) const {
    static const float alpha = 1.0f, beta = 0.0f;
    check(cublasLtMatmul(p.lt, desc, &alpha, p.a, a, p.b, b, &beta, p.d, d, p.d, d, &algo, nullptr,
                         0, nullptr) == CUBLAS_STATUS_SUCCESS,
          "cublasLtMatmul");
  }
  ~Descriptors() {
    cublasLtMatmulPreferenceDestroy(preference);
    for (cublasLtMatrixLayout_t l : {a, b, d}) cublasLtMatrixLayoutDestroy(l);
    cublasLtMatmulDescDestroy(desc);
  }
};

void Launch(benchmark::State& state) {
  shim_bench_empty<<<1, 1>>>();  // the first launch registers the module
  check(cudaDeviceSynchronize() == cudaSuccess, "warm-up launch");
  bursts(state, [] { shim_bench_empty<<<1, 1>>>(); });
}

void LtMatmulBatched(benchmark::State& state) {
  Problem p;
  Descriptors descriptors(p);
  const cublasLtMatmulAlgo_t algo = descriptors.heuristic(p);
  descriptors.matmul(p, algo);
  check(cudaDeviceSynchronize() == cudaSuccess, "warm-up matmul");
  bursts(state, [&] { descriptors.matmul(p, algo); });
}

void LtMatmulPyTorchStyle(benchmark::State& state) {
  Problem p;
  {
    Descriptors warm(p);  // the heuristic's one round trip
    warm.matmul(p, warm.heuristic(p));
  }
  check(cudaDeviceSynchronize() == cudaSuccess, "warm-up matmul");
  bursts(state, [&] {
    Descriptors descriptors(p);
    descriptors.matmul(p, descriptors.heuristic(p));
  });
}

// A convolution's handle, plan and operands, made once.
struct ConvProblem {
  cudnnHandle_t handle = nullptr;
  cudnn_conv::ConvGraph graph{};
  cudnnBackendDescriptor_t plan = nullptr;
  float *x = nullptr, *w = nullptr, *y = nullptr;
  void* workspace = nullptr;
  ConvProblem() {
    cudnn_conv::Shape shape;
    shape.c = 4, shape.h = 8, shape.w = 8, shape.k = 4, shape.r = 3, shape.s = 3, shape.pad = 1;
    CUDNN_CHECK(cudnnCreate(&handle));
    graph = cudnn_conv::conv_graph(handle, shape);
    plan = cudnn_conv::plan_for(handle, graph.graph);
    const size_t xs = shape.n * shape.c * shape.h * shape.w,
                 ws = shape.k * shape.c * shape.r * shape.s,
                 ys = shape.n * shape.k * shape.p() * shape.q();
    for (auto [p, n] : {std::pair{&x, xs}, std::pair{&w, ws}, std::pair{&y, ys}}) {
      check(cudaMalloc(p, n * sizeof(float)) == cudaSuccess, "cudaMalloc");
      check(cudaMemset(*p, 0, n * sizeof(float)) == cudaSuccess, "cudaMemset");
    }
    const int64_t workspace_bytes = cudnn_conv::workspace_size(plan);
    if (workspace_bytes > 0)
      check(cudaMalloc(&workspace, workspace_bytes) == cudaSuccess, "cudaMalloc");
  }
  cudnnBackendDescriptor_t pack() const { return cudnn_conv::variant_pack(x, w, y, workspace); }
  ~ConvProblem() {
    for (void* p : {static_cast<void*>(x), static_cast<void*>(w), static_cast<void*>(y), workspace})
      cudaFree(p);
    cudnnBackendDestroyDescriptor(plan);
    graph.destroy();
    cudnnDestroy(handle);
  }
};

void DnnExecute(benchmark::State& state) {
  ConvProblem p;
  cudnnBackendDescriptor_t pack = p.pack();
  // The first execution sends the plan's graph to hiberd; the timed ones carry only its id.
  CUDNN_CHECK(cudnnBackendExecute(p.handle, p.plan, pack));
  check(cudaDeviceSynchronize() == cudaSuccess, "warm-up execute");
  bursts(state, [&] { CUDNN_CHECK(cudnnBackendExecute(p.handle, p.plan, pack)); });
  CUDNN_CHECK(cudnnBackendDestroyDescriptor(pack));
}

void DnnExecutePyTorchStyle(benchmark::State& state) {
  ConvProblem p;
  auto call = [&] {
    cudnnBackendDescriptor_t pack = p.pack();
    CUDNN_CHECK(cudnnBackendExecute(p.handle, p.plan, pack));
    CUDNN_CHECK(cudnnBackendDestroyDescriptor(pack));
  };
  call();
  check(cudaDeviceSynchronize() == cudaSuccess, "warm-up execute");
  bursts(state, call);
}

}  // namespace

BENCHMARK(Launch)->UseManualTime()->Iterations(400);
BENCHMARK(LtMatmulBatched)->UseManualTime()->Iterations(400);
BENCHMARK(LtMatmulPyTorchStyle)->UseManualTime()->Iterations(200);
BENCHMARK(DnnExecute)->UseManualTime()->Iterations(400);
BENCHMARK(DnnExecutePyTorchStyle)->UseManualTime()->Iterations(200);
BENCHMARK_MAIN();
