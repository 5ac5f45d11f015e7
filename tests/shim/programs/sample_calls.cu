// sample_calls: the calls NVIDIA's cuda-samples make that the shim once refused (issue 18,
// item 13), each checked against what the CUDA documentation says.
//
//   - cudaProfilerStart/Stop and cuProfilerStart/Stop succeed (no profiler is attached);
//   - simpleCallback/asyncAPI: host functions run in stream order, after the copies before them
//     are done (each sees the bytes its copy brought back) and before the work after them;
//   - driver contexts: cuCtxCreate (_v2 for a 12.0 caller, _v4 for 13.0) hands out the device's
//     primary context, current on the thread, which cuCtxDestroy releases once per creation;
//   - mapped host memory: canMapHostMemory is 0 and every way to map host memory fails with
//     cudaErrorNotSupported.
#include <cuda.h>
#include <cudaProfiler.h>
#include <cuda_profiler_api.h>
#include <cuda_runtime.h>

#include <cstdio>
#include <cstring>
#include <vector>

#include "program_util.h"

// The driver API through cudaGetDriverEntryPointByVersion (the program links no libcuda.so.1).
template <typename F>
F driver_entry(const char* name, unsigned version) {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult found{};
  CUDA_CHECK(cudaGetDriverEntryPointByVersion(name, &fn, version, cudaEnableDefault, &found));
  if (fn == nullptr) {
    std::fprintf(stderr, "sample_calls: no driver entry point %s\n", name);
    std::exit(program::kExitCudaError);
  }
  return reinterpret_cast<F>(fn);
}
// The type is this header's ABI of `name`, so the version asked for is this header's.
#define DRV(name) (driver_entry<decltype(&name)>(#name, CUDA_VERSION))

#define CU_CHECK(call)                                                          \
  do {                                                                          \
    const CUresult cu_check_err_ = (call);                                      \
    if (cu_check_err_ != CUDA_SUCCESS) {                                        \
      std::fprintf(stderr, "%s:%d: %s failed: %d\n", __FILE__, __LINE__, #call, \
                   static_cast<int>(cu_check_err_));                            \
      std::exit(program::kExitCudaError);                                       \
    }                                                                           \
  } while (0)


namespace {

constexpr int kChunks = 8;
constexpr size_t kChunkBytes = 1 << 16;

// What each host function checks and records: the chunk its copy brought back, in order.
struct Progress {
  const unsigned char* host = nullptr;
  int next = 0;   // the chunk the next host function must see
  int wrong = 0;  // host functions that ran out of order or before their copy
};

struct Call {
  Progress* progress;
  int chunk;
};

void CUDART_CB check_chunk(void* data) {
  auto* call = static_cast<Call*>(data);
  Progress& p = *call->progress;
  const unsigned char* bytes = p.host + call->chunk * kChunkBytes;
  bool complete = true;
  for (size_t i = 0; i < kChunkBytes; ++i) complete &= bytes[i] == call->chunk + 1;
  if (call->chunk != p.next || !complete) ++p.wrong;
  ++p.next;
}

void CUDART_CB stream_callback(cudaStream_t, cudaError_t status, void* data) {
  auto* call = static_cast<Call*>(data);
  if (status != cudaSuccess) ++call->progress->wrong;
  check_chunk(call);
}

}  // namespace

int main() {
  // Profiler calls succeed with no profiler attached.
  CUDA_CHECK(cudaProfilerStart());
  EXPECT(DRV(cuProfilerStart)() == CUDA_SUCCESS);

  // Host functions in stream order: memset chunk c to c+1, copy it back, check it on the host.
  unsigned char* device = nullptr;
  unsigned char* host = nullptr;
  CUDA_CHECK(cudaMalloc(&device, kChunks * kChunkBytes));
  CUDA_CHECK(cudaMallocHost(&host, kChunks * kChunkBytes));
  std::memset(host, 0, kChunks * kChunkBytes);
  cudaStream_t stream;
  CUDA_CHECK(cudaStreamCreate(&stream));
  Progress progress{host, 0, 0};
  std::vector<Call> calls(kChunks);
  for (int c = 0; c < kChunks; ++c) {
    unsigned char* d = device + c * kChunkBytes;
    CUDA_CHECK(cudaMemsetAsync(d, c + 1, kChunkBytes, stream));
    CUDA_CHECK(
        cudaMemcpyAsync(host + c * kChunkBytes, d, kChunkBytes, cudaMemcpyDeviceToHost, stream));
    calls[c] = {&progress, c};
    if (c == kChunks - 1) {
      // The last through cudaStreamAddCallback, as simpleCallback does.
      CUDA_CHECK(cudaStreamAddCallback(stream, stream_callback, &calls[c], 0));
    } else {
      CUDA_CHECK(cudaLaunchHostFunc(stream, check_chunk, &calls[c]));
    }
  }
  CUDA_CHECK(cudaStreamSynchronize(stream));
  EXPECT(progress.next == kChunks);
  EXPECT(progress.wrong == 0);
  std::printf("sample_calls: %d host functions ran in stream order after their copies\n", kChunks);

  // Driver contexts: a created context is the device's primary context, current on the thread.
  CUcontext primary = nullptr, created = nullptr, again = nullptr, current = nullptr;
  CU_CHECK(DRV(cuInit)(0));
  CU_CHECK(DRV(cuDevicePrimaryCtxRetain)(&primary, 0));
  // The cuCtxCreate a CUDA 11.0 program gets (_v2; 11.4 brought _v3, 12.5 _v4).
  using CreateV2 = CUresult (*)(CUcontext*, unsigned int, CUdevice);
  CU_CHECK(driver_entry<CreateV2>("cuCtxCreate", 11000)(&created, CU_CTX_SCHED_BLOCKING_SYNC, 0));
  EXPECT(created == primary);
  CU_CHECK(DRV(cuCtxGetCurrent)(&current));
  EXPECT(current == created);
  unsigned int flags = 0, version = 0;
  CU_CHECK(DRV(cuCtxGetFlags)(&flags));
  EXPECT((flags & CU_CTX_SCHED_MASK) == CU_CTX_SCHED_BLOCKING_SYNC);
  CU_CHECK(DRV(cuCtxGetApiVersion)(created, &version));
  EXPECT(version >= 3020);
  CUdevice ctx_device = -1;
  CU_CHECK(
      driver_entry<decltype(&cuCtxGetDevice_v2)>("cuCtxGetDevice", 13000)(&ctx_device, created));
  EXPECT(ctx_device == 0);
  CU_CHECK(driver_entry<decltype(&cuCtxSynchronize_v2)>("cuCtxSynchronize", 13000)(nullptr));
  // cuCtxCreate_v4 for a CUDA 13 caller; two creations, two destructions, no third.
  CU_CHECK(driver_entry<decltype(&cuCtxCreate)>("cuCtxCreate", 13000)(&again, nullptr, 0, 0));
  EXPECT(again == primary);
  auto destroy = driver_entry<decltype(&cuCtxDestroy)>("cuCtxDestroy", 12000);
  CU_CHECK(destroy(again));
  CU_CHECK(destroy(created));
  EXPECT(destroy(created) == CUDA_ERROR_INVALID_CONTEXT);
  // The primary context outlives its creations: memory made under it still works.
  CU_CHECK(DRV(cuCtxSetCurrent)(primary));
  CUDA_CHECK(cudaMemset(device, 0x5a, 16));
  unsigned char back[16];
  CUDA_CHECK(cudaMemcpy(back, device, 16, cudaMemcpyDeviceToHost));
  for (unsigned char b : back) EXPECT(b == 0x5a);
  CU_CHECK(DRV(cuDevicePrimaryCtxRelease)(0));
  std::printf("sample_calls: cuCtxCreate/cuCtxDestroy shared the primary context\n");

  // Mapped host memory is refused, clearly, and reported as absent.
  cudaDeviceProp prop{};
  CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  EXPECT(prop.canMapHostMemory == 0);
  int can_map = -1;
  CUDA_CHECK(cudaDeviceGetAttribute(&can_map, cudaDevAttrCanMapHostMemory, 0));
  EXPECT(can_map == 0);
  void* mapped = nullptr;
  EXPECT(cudaHostAlloc(&mapped, 4096, cudaHostAllocMapped) == cudaErrorNotSupported);
  std::vector<char> user(4096);
  EXPECT(cudaHostRegister(user.data(), user.size(), cudaHostRegisterMapped) ==
         cudaErrorNotSupported);
  void* device_view = nullptr;
  EXPECT(cudaHostGetDevicePointer(&device_view, host, 0) == cudaErrorNotSupported);
  (void)cudaGetLastError();
  std::printf("sample_calls: mapped host memory refused (canMapHostMemory 0)\n");

  // IPC handles are refused, clearly: memory and events live in hiberd (simpleIPC's calls).
  cudaIpcMemHandle_t memory_handle{};
  EXPECT(cudaIpcGetMemHandle(&memory_handle, device) == cudaErrorNotSupported);
  EXPECT(program::hiber_error_message().find("IPC handles are not supported") != std::string::npos);
  EXPECT(cudaIpcGetMemHandle(nullptr, device) == cudaErrorInvalidValue);
  void* opened = nullptr;
  EXPECT(cudaIpcOpenMemHandle(&opened, memory_handle, cudaIpcMemLazyEnablePeerAccess) ==
         cudaErrorNotSupported);
  cudaEvent_t shared_event = nullptr;
  EXPECT(cudaEventCreateWithFlags(&shared_event, cudaEventInterprocess | cudaEventDisableTiming) ==
         cudaErrorNotSupported);
  CUDA_CHECK(cudaEventCreateWithFlags(&shared_event, cudaEventDisableTiming));
  cudaIpcEventHandle_t event_handle{};
  EXPECT(cudaIpcGetEventHandle(&event_handle, shared_event) == cudaErrorNotSupported);
  CUipcMemHandle driver_handle{};
  EXPECT(DRV(cuIpcGetMemHandle)(&driver_handle, reinterpret_cast<CUdeviceptr>(device)) ==
         CUDA_ERROR_NOT_SUPPORTED);
  CUDA_CHECK(cudaEventDestroy(shared_event));
  (void)cudaGetLastError();
  // The session goes on: the allocation is still the program's.
  CUDA_CHECK(cudaMemset(device, 0x11, 16));
  CUDA_CHECK(cudaMemcpy(back, device, 16, cudaMemcpyDeviceToHost));
  for (unsigned char b : back) EXPECT(b == 0x11);
  std::printf("sample_calls: IPC handles refused\n");

  EXPECT(DRV(cuProfilerStop)() == CUDA_SUCCESS);
  CUDA_CHECK(cudaProfilerStop());
  CUDA_CHECK(cudaStreamDestroy(stream));
  CUDA_CHECK(cudaFreeHost(host));
  CUDA_CHECK(cudaFree(device));
  std::printf("sample_calls: OK\n");
  return 0;
}
