// graphs: CUDA graphs as PyTorch's CUDAGraph and vLLM's decode step use them, each result
// checked against the same arithmetic done here.
//
// Usage: graphs [n = 4099] [launches = 100]
//
//   captured   a memset, a copy in from pinned memory, two kernels and a copy out, captured
//              from a stream (with a second stream joined through an event), instantiated once
//              and launched `launches` times with new inputs each time
//   built      the same built node by node, with a host function between the kernels; then its
//              kernel's parameters changed in the executable graph, and the graph updated
//   driver     a capture, instantiation and launch through the driver API
//   refused    a synchronous copy and a cudaMalloc in a global-mode capture (the capture is
//              invalidated), the same cudaMalloc allowed in relaxed mode, a destroyed graph
//              launched; each followed by work that must still be right
// Exits 3 on any mismatch.
#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdio>
#include <cstring>
#include <vector>

#include "driver_entry.h"
#include "program_util.h"

// y = a * x + b, exactly representable for the inputs used.
__global__ void graph_affine(const float* x, float* y, int n, float a, float b) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = a * x[i] + b;
}

namespace {

int g_failures = 0;

void expect_code(const char* what, cudaError_t got, cudaError_t want) {
  if (got == want) {
    std::printf("graphs: %s -> %s, as expected\n", what, cudaGetErrorName(got));
  } else {
    std::printf("graphs: WRONG: %s -> %s, expected %s\n", what, cudaGetErrorName(got),
                cudaGetErrorName(want));
    ++g_failures;
  }
  (void)cudaGetLastError();
}

float input(int i, int launch) { return static_cast<float>((i * 7 + launch * 3) % 1024); }

size_t check(const char* what, const float* got, int n, int launch, float a1, float b1, float a2,
             float b2) {
  std::vector<float> want(n);
  for (int i = 0; i < n; ++i) want[i] = a2 * (a1 * input(i, launch) + b1) + b2;
  return program::count_mismatches(what, got, want.data(), static_cast<size_t>(n));
}

int g_host_calls = 0;
void count_host_call(void* counter) { ++*static_cast<int*>(counter); }

}  // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  const int n = static_cast<int>(program::int_arg(argc, argv, 1, 4099, 1, 1 << 24));
  const int launches = static_cast<int>(program::int_arg(argc, argv, 2, 100, 1, 100000));
  const size_t bytes = sizeof(float) * n;
  const dim3 block(256), grid((n + 255) / 256);
  CUDA_CHECK(cudaSetDevice(0));
  EXPECT(std::strcmp(cudaGetErrorName(cudaSuccess), "cudaSuccess") == 0);
  float *h_in = nullptr, *h_out = nullptr, *x = nullptr, *y = nullptr, *z = nullptr;
  CUDA_CHECK(cudaMallocHost(&h_in, bytes));
  CUDA_CHECK(cudaMallocHost(&h_out, bytes));
  CUDA_CHECK(cudaMalloc(&x, bytes));
  CUDA_CHECK(cudaMalloc(&y, bytes));
  CUDA_CHECK(cudaMalloc(&z, bytes));
  cudaStream_t s, side;
  CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  CUDA_CHECK(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking));
  size_t mismatches = 0;

  // ---- Captured ----
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  CUDA_CHECK(cudaStreamIsCapturing(s, &status));
  EXPECT(status == cudaStreamCaptureStatusNone);
  CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  CUDA_CHECK(cudaStreamIsCapturing(s, &status));
  EXPECT(status == cudaStreamCaptureStatusActive);
  unsigned long long id = 0;
  CUDA_CHECK(cudaStreamGetCaptureInfo(s, &status, &id, nullptr, nullptr, nullptr, nullptr));
  EXPECT(status == cudaStreamCaptureStatusActive && id != 0);
  CUDA_CHECK(cudaMemsetAsync(y, 0xff, bytes, s));
  CUDA_CHECK(cudaMemcpyAsync(x, h_in, bytes, cudaMemcpyHostToDevice, s));
  graph_affine<<<grid, block, 0, s>>>(x, y, n, 2.0f, 1.0f);
  // The second kernel on another stream, joined to the capture through an event.
  cudaEvent_t fork, join;
  CUDA_CHECK(cudaEventCreateWithFlags(&fork, cudaEventDisableTiming));
  CUDA_CHECK(cudaEventCreateWithFlags(&join, cudaEventDisableTiming));
  CUDA_CHECK(cudaEventRecord(fork, s));
  CUDA_CHECK(cudaStreamWaitEvent(side, fork, 0));
  CUDA_CHECK(cudaStreamIsCapturing(side, &status));
  EXPECT(status == cudaStreamCaptureStatusActive);
  graph_affine<<<grid, block, 0, side>>>(y, z, n, 3.0f, -5.0f);
  CUDA_CHECK(cudaEventRecord(join, side));
  CUDA_CHECK(cudaStreamWaitEvent(s, join, 0));
  CUDA_CHECK(cudaMemcpyAsync(h_out, z, bytes, cudaMemcpyDeviceToHost, s));
  cudaGraph_t captured = nullptr;
  CUDA_CHECK(cudaStreamEndCapture(s, &captured));
  CUDA_CHECK(cudaStreamIsCapturing(side, &status));
  EXPECT(status == cudaStreamCaptureStatusNone);
  size_t nodes = 0;
  CUDA_CHECK(cudaGraphGetNodes(captured, nullptr, &nodes));
  EXPECT(nodes == 5);
  cudaGraphExec_t exec = nullptr;
  CUDA_CHECK(cudaGraphInstantiate(&exec, captured, 0));
  for (int launch = 0; launch < launches; ++launch) {
    for (int i = 0; i < n; ++i) h_in[i] = input(i, launch);
    CUDA_CHECK(cudaGraphLaunch(exec, s));
    CUDA_CHECK(cudaStreamSynchronize(s));
    mismatches += check("captured graph", h_out, n, launch, 2.0f, 1.0f, 3.0f, -5.0f);
  }
  std::printf("graphs: captured graph launched %d times\n", launches);

  // ---- Built node by node, with a host function between the kernels ----
  cudaGraph_t built = nullptr;
  CUDA_CHECK(cudaGraphCreate(&built, 0));
  cudaGraphNode_t set, in, first, host, second, out;
  cudaMemsetParams memset_params{};
  memset_params.dst = z;
  memset_params.value = 0;
  memset_params.elementSize = 4;
  memset_params.width = n;
  memset_params.height = 1;
  CUDA_CHECK(cudaGraphAddMemsetNode(&set, built, nullptr, 0, &memset_params));
  CUDA_CHECK(cudaGraphAddMemcpyNode1D(&in, built, nullptr, 0, x, h_in, bytes,
                                      cudaMemcpyHostToDevice));
  float a1 = 4.0f, b1 = -3.0f, a2 = 0.5f, b2 = 2.0f;
  int count = n;
  void* first_args[] = {&x, &y, &count, &a1, &b1};
  cudaKernelNodeParams kernel{};
  kernel.func = reinterpret_cast<void*>(graph_affine);
  kernel.gridDim = grid;
  kernel.blockDim = block;
  kernel.kernelParams = first_args;
  const cudaGraphNode_t before_first[] = {set, in};
  CUDA_CHECK(cudaGraphAddKernelNode(&first, built, before_first, 2, &kernel));
  cudaHostNodeParams host_params{count_host_call, &g_host_calls};
  CUDA_CHECK(cudaGraphAddHostNode(&host, built, &first, 1, &host_params));
  void* second_args[] = {&y, &z, &count, &a2, &b2};
  kernel.kernelParams = second_args;
  CUDA_CHECK(cudaGraphAddKernelNode(&second, built, &host, 1, &kernel));
  CUDA_CHECK(cudaGraphAddMemcpyNode1D(&out, built, &second, 1, h_out, z, bytes,
                                      cudaMemcpyDeviceToHost));
  cudaGraphExec_t built_exec = nullptr;
  CUDA_CHECK(cudaGraphInstantiate(&built_exec, built, 0));
  for (int launch = 0; launch < 3; ++launch) {
    for (int i = 0; i < n; ++i) h_in[i] = input(i, launch);
    CUDA_CHECK(cudaGraphLaunch(built_exec, s));
    CUDA_CHECK(cudaStreamSynchronize(s));
    mismatches += check("built graph", h_out, n, launch, a1, b1, a2, b2);
  }
  EXPECT(g_host_calls == 3);
  // New parameters for the first kernel, in the executable graph only.
  float a3 = -1.0f, b3 = 7.0f;
  void* changed_args[] = {&x, &y, &count, &a3, &b3};
  kernel.kernelParams = changed_args;
  CUDA_CHECK(cudaGraphExecKernelNodeSetParams(built_exec, first, &kernel));
  CUDA_CHECK(cudaGraphLaunch(built_exec, s));
  CUDA_CHECK(cudaStreamSynchronize(s));
  mismatches += check("changed kernel parameters", h_out, n, 2, a3, b3, a2, b2);
  // The graph's own parameters changed, and the executable graph updated from it.
  kernel.kernelParams = second_args;
  b2 = 9.0f;
  CUDA_CHECK(cudaGraphKernelNodeSetParams(second, &kernel));
  kernel.kernelParams = first_args;
  CUDA_CHECK(cudaGraphKernelNodeSetParams(first, &kernel));
  cudaGraphExecUpdateResultInfo info{};
  CUDA_CHECK(cudaGraphExecUpdate(built_exec, built, &info));
  EXPECT(info.result == cudaGraphExecUpdateSuccess);
  CUDA_CHECK(cudaGraphLaunch(built_exec, s));
  CUDA_CHECK(cudaStreamSynchronize(s));
  mismatches += check("updated graph", h_out, n, 2, a1, b1, a2, b2);
  EXPECT(g_host_calls == 5);
  std::printf("graphs: built graph with a host node, parameters changed and updated\n");

  // ---- Refused ----
  CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  expect_code("cudaMemcpy during a global capture",
              cudaMemcpy(h_out, y, bytes, cudaMemcpyDeviceToHost),
              cudaErrorStreamCaptureUnsupported);
  void* scratch = nullptr;
  expect_code("cudaMalloc during a global capture", cudaMalloc(&scratch, 4096),
              cudaErrorStreamCaptureUnsupported);
  cudaGraph_t broken = nullptr;
  expect_code("cudaStreamEndCapture of the invalidated capture",
              cudaStreamEndCapture(s, &broken), cudaErrorStreamCaptureInvalidated);
  EXPECT(broken == nullptr);
  CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed));
  expect_code("cudaMalloc during a relaxed capture", cudaMalloc(&scratch, 4096), cudaSuccess);
  graph_affine<<<grid, block, 0, s>>>(x, y, n, 1.0f, 0.0f);
  cudaGraph_t relaxed = nullptr;
  CUDA_CHECK(cudaStreamEndCapture(s, &relaxed));
  CUDA_CHECK(cudaFree(scratch));
  CUDA_CHECK(cudaGraphDestroy(relaxed));
  CUDA_CHECK(cudaGraphExecDestroy(exec));
  expect_code("cudaGraphLaunch of a destroyed graph", cudaGraphLaunch(exec, s),
              cudaErrorInvalidValue);
  // Everything else still works: the built graph once more.
  for (int i = 0; i < n; ++i) h_in[i] = input(i, 7);
  CUDA_CHECK(cudaGraphLaunch(built_exec, s));
  CUDA_CHECK(cudaStreamSynchronize(s));
  mismatches += check("after the refusals", h_out, n, 7, a1, b1, a2, b2);

  // The driver's forms: captured, instantiated, launched and destroyed through the driver API.
  const auto cu_stream = reinterpret_cast<CUstream>(s);
  CU_CHECK(DRV(cuStreamBeginCapture)(cu_stream, CU_STREAM_CAPTURE_MODE_GLOBAL));
  graph_affine<<<grid, block, 0, s>>>(x, y, n, 5.0f, 2.0f);
  CUDA_CHECK(cudaMemcpyAsync(h_out, y, bytes, cudaMemcpyDeviceToHost, s));
  CUgraph driver_graph = nullptr;
  CU_CHECK(DRV(cuStreamEndCapture)(cu_stream, &driver_graph));
  CUgraphExec driver_exec = nullptr;
  CU_CHECK(DRV(cuGraphInstantiateWithFlags)(&driver_exec, driver_graph, 0));
  CU_CHECK(DRV(cuGraphLaunch)(driver_exec, cu_stream));
  CUDA_CHECK(cudaStreamSynchronize(s));
  mismatches += check("driver graph", h_out, n, 7, 5.0f, 2.0f, 1.0f, 0.0f);
  CU_CHECK(DRV(cuGraphExecDestroy)(driver_exec));
  CU_CHECK(DRV(cuGraphDestroy)(driver_graph));
  std::printf("graphs: driver API graph launched\n");

  CUDA_CHECK(cudaGraphExecDestroy(built_exec));
  CUDA_CHECK(cudaGraphDestroy(built));
  CUDA_CHECK(cudaGraphDestroy(captured));
  CUDA_CHECK(cudaEventDestroy(fork));
  CUDA_CHECK(cudaEventDestroy(join));
  CUDA_CHECK(cudaStreamDestroy(s));
  CUDA_CHECK(cudaStreamDestroy(side));
  CUDA_CHECK(cudaFree(x));
  CUDA_CHECK(cudaFree(y));
  CUDA_CHECK(cudaFree(z));
  CUDA_CHECK(cudaFreeHost(h_in));
  CUDA_CHECK(cudaFreeHost(h_out));
  if (mismatches != 0 || g_failures != 0) {
    std::printf("graphs: FAILED: %zu mismatches, %d calls differ from CUDA\n", mismatches,
                g_failures);
    return program::kExitMismatch;
  }
  std::printf("graphs: OK n=%d launches=%d\n", n, launches);
  return 0;
}
