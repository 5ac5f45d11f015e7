// runtime_gaps: the runtime and driver calls PyTorch makes beyond the basics, each checked
// against the CUDA documentation's semantics and a CPU reference.
//
// Usage: runtime_gaps <ptx file of ptx_affine.cu>
//
//   - dynamic shared memory above 48 KiB: refused until cudaFuncSetAttribute raises the limit,
//     then used (a block-wise reversal through shared memory), above the opt-in limit refused;
//   - cudaLaunchHostFunc / cudaStreamAddCallback / cuLaunchHostFunc: the function sees the work
//     before it, and work submitted after it (a copy from pinned memory it writes) sees its
//     writes; cudaStreamSynchronize waits for it;
//   - pointer attributes, cuMemGetAddressRange, capture status, context push/pop, one device
//     state (cudaSetDevice and the driver's current context agree, per thread), priorities,
//     occupancy, cudaGetFuncBySymbol + cuLaunchKernelEx, cuFuncGet/SetAttribute;
//   - cuLink* of one PTX image + cuModuleLoadData + launch; cuModuleGetGlobal and linking two
//     inputs fail with CUDA_ERROR_NOT_SUPPORTED.
#include <cuda.h>
#include <cuda_runtime.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "driver_entry.h"
#include "program_util.h"



// Each block reverses its `blockDim.x * per_thread` floats through dynamic shared memory.
__global__ void shared_reverse(const float* in, float* out, int per_thread) {
  extern __shared__ float tile[];
  const int span = blockDim.x * per_thread;
  const float* src = in + blockIdx.x * span;
  for (int k = threadIdx.x; k < span; k += blockDim.x) tile[k] = src[k];
  __syncthreads();
  float* dst = out + blockIdx.x * span;
  for (int k = threadIdx.x; k < span; k += blockDim.x) dst[k] = tile[span - 1 - k];
}

__global__ void add_one(float* data, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) data[i] += 1.0f;
}

namespace {

struct HostCallState {
  float* pinned = nullptr;      // written by the host function, read by the copy after it
  const float* seen = nullptr;  // the result of the work before it
  int n = 0;
  std::atomic<int> calls{0};
  bool saw_prior_work = false;
};

void host_fn(void* p) {
  auto* s = static_cast<HostCallState*>(p);
  // The copy before this function must have completed.
  bool ok = true;
  for (int i = 0; i < s->n; ++i) ok = ok && s->seen[i] == static_cast<float>(i) + 1.0f;
  s->saw_prior_work = ok;
  usleep(100 * 1000);  // later work must still wait for this
  for (int i = 0; i < s->n; ++i) s->pinned[i] = 1000.0f + i;
  s->calls.fetch_add(1);
}

void CUDART_CB stream_callback(cudaStream_t, cudaError_t status, void* p) {
  if (status == cudaSuccess) static_cast<std::atomic<int>*>(p)->fetch_add(1);
}

void CUDA_CB driver_host_fn(void* p) {
  usleep(50 * 1000);
  static_cast<std::atomic<int>*>(p)->fetch_add(10);
}

std::string read_file(const char* path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

}  // namespace

int main(int argc, char** argv) {
  setvbuf(stdout, nullptr, _IOLBF, 0);
  if (argc < 2) {
    std::fprintf(stderr, "usage: runtime_gaps <ptx file>\n");
    return program::kExitUsage;
  }
  int optin = 0;
  CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, 0));
  EXPECT(optin > 48 * 1024);

  // ---- Dynamic shared memory above 48 KiB ----
  const int threads = 128;
  const int per_thread = 128;  // 64 KiB of floats per block
  const int blocks = 3;
  const size_t shared = size_t{threads} * per_thread * sizeof(float);
  const int total = blocks * threads * per_thread;
  std::vector<float> host(total), back(total);
  for (int i = 0; i < total; ++i) host[i] = static_cast<float>(i % 977) * 0.5f;
  float *in = nullptr, *out = nullptr;
  CUDA_CHECK(cudaMalloc(&in, total * sizeof(float)));
  CUDA_CHECK(cudaMalloc(&out, total * sizeof(float)));
  std::printf("runtime_gaps: start\n");
  CUDA_CHECK(cudaMemcpy(in, host.data(), total * sizeof(float), cudaMemcpyHostToDevice));
  shared_reverse<<<blocks, threads, shared>>>(in, out, per_thread);
  const cudaError_t refused = cudaGetLastError();
  std::printf("runtime_gaps: 64 KiB without the attribute -> %s\n", cudaGetErrorName(refused));
  EXPECT(refused == cudaErrorInvalidValue);
  EXPECT(cudaFuncSetAttribute(shared_reverse, cudaFuncAttributeMaxDynamicSharedMemorySize,
                              optin + 1) == cudaErrorInvalidValue);
  cudaGetLastError();
  CUDA_CHECK(cudaFuncSetAttribute(shared_reverse, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  static_cast<int>(shared)));
  cudaFuncAttributes attributes{};
  CUDA_CHECK(cudaFuncGetAttributes(&attributes, shared_reverse));
  EXPECT(attributes.maxDynamicSharedSizeBytes == static_cast<int>(shared));
  shared_reverse<<<blocks, threads, shared>>>(in, out, per_thread);
  CUDA_CHECK_LAUNCH();
  CUDA_CHECK(cudaMemcpy(back.data(), out, total * sizeof(float), cudaMemcpyDeviceToHost));
  const int span = threads * per_thread;
  for (int b = 0; b < blocks; ++b) {
    for (int k = 0; k < span; ++k) EXPECT(back[b * span + k] == host[b * span + span - 1 - k]);
  }

  // ---- Host functions in stream order ----
  const int n = 4096;
  cudaStream_t stream;
  CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  float *data = nullptr, *pinned = nullptr, *seen = nullptr;
  CUDA_CHECK(cudaMalloc(&data, n * sizeof(float)));
  CUDA_CHECK(cudaMallocHost(&pinned, n * sizeof(float)));
  CUDA_CHECK(cudaMallocHost(&seen, n * sizeof(float)));
  std::vector<float> ramp(n);
  for (int i = 0; i < n; ++i) ramp[i] = static_cast<float>(i);
  for (int i = 0; i < n; ++i) pinned[i] = -1.0f;
  HostCallState state;
  state.pinned = pinned;
  state.seen = seen;
  state.n = n;
  std::atomic<int> callbacks{0};
  CUDA_CHECK(cudaMemcpyAsync(data, ramp.data(), n * sizeof(float), cudaMemcpyHostToDevice, stream));
  add_one<<<(n + 255) / 256, 256, 0, stream>>>(data, n);
  CUDA_CHECK_LAUNCH();
  CUDA_CHECK(cudaMemcpyAsync(seen, data, n * sizeof(float), cudaMemcpyDeviceToHost, stream));
  CUDA_CHECK(cudaLaunchHostFunc(stream, host_fn, &state));
  CUDA_CHECK(cudaStreamAddCallback(stream, stream_callback, &callbacks, 0));
  // Submitted after the host function: must read what it wrote, not the -1s.
  CUDA_CHECK(cudaMemcpyAsync(data, pinned, n * sizeof(float), cudaMemcpyHostToDevice, stream));
  CU_CHECK(DRV(cuLaunchHostFunc)(reinterpret_cast<CUstream>(stream), driver_host_fn, &callbacks));
  CUDA_CHECK(cudaStreamSynchronize(stream));
  EXPECT(state.calls.load() == 1);
  EXPECT(state.saw_prior_work);
  EXPECT(callbacks.load() == 11);  // the stream callback, then the driver's host function
  std::vector<float> after(n);
  CUDA_CHECK(cudaMemcpy(after.data(), data, n * sizeof(float), cudaMemcpyDeviceToHost));
  for (int i = 0; i < n; ++i) EXPECT(after[i] == 1000.0f + i);
  std::printf("runtime_gaps: host functions ran in stream order\n");

  // ---- Capture status, pointers ----
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusActive;
  CUDA_CHECK(cudaStreamIsCapturing(stream, &capture));
  EXPECT(capture == cudaStreamCaptureStatusNone);
  CUstreamCaptureStatus cu_capture = CU_STREAM_CAPTURE_STATUS_ACTIVE;
  CU_CHECK(DRV(cuStreamIsCapturing)(reinterpret_cast<CUstream>(stream), &cu_capture));
  EXPECT(cu_capture == CU_STREAM_CAPTURE_STATUS_NONE);

  cudaPointerAttributes pa{};
  CUDA_CHECK(cudaPointerGetAttributes(&pa, data + 5));
  EXPECT(pa.type == cudaMemoryTypeDevice && pa.device == 0 && pa.devicePointer == data + 5);
  CUDA_CHECK(cudaPointerGetAttributes(&pa, pinned + 1));
  EXPECT(pa.type == cudaMemoryTypeHost && pa.hostPointer == pinned + 1);
  std::vector<float> pageable(16);
  CUDA_CHECK(cudaPointerGetAttributes(&pa, pageable.data()));
  EXPECT(pa.type == cudaMemoryTypeUnregistered);

  const auto dptr = reinterpret_cast<CUdeviceptr>(data);
  CUdeviceptr start = 0;
  size_t bytes = 0;
  unsigned memory_type = 0;
  int ordinal = -1;
  CU_CHECK(DRV(cuPointerGetAttribute)(&start, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, dptr + 100));
  CU_CHECK(DRV(cuPointerGetAttribute)(&bytes, CU_POINTER_ATTRIBUTE_RANGE_SIZE, dptr + 100));
  CU_CHECK(DRV(cuPointerGetAttribute)(&memory_type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, dptr + 100));
  CU_CHECK(DRV(cuPointerGetAttribute)(&ordinal, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, dptr + 100));
  EXPECT(start == dptr && bytes == n * sizeof(float) && memory_type == CU_MEMORYTYPE_DEVICE &&
         ordinal == 0);
  CUdeviceptr base = 0;
  size_t range = 0;
  CU_CHECK(DRV(cuMemGetAddressRange)(&base, &range, dptr + 4000));
  EXPECT(base == dptr && range == n * sizeof(float));
  CU_CHECK(DRV(cuPointerGetAttribute)(&memory_type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
                                      reinterpret_cast<CUdeviceptr>(pinned)));
  EXPECT(memory_type == CU_MEMORYTYPE_HOST);
  EXPECT(DRV(cuPointerGetAttribute)(&memory_type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
                                    reinterpret_cast<CUdeviceptr>(pageable.data())) ==
         CUDA_ERROR_INVALID_VALUE);
  EXPECT(DRV(cuMemGetAddressRange)(&base, &range, reinterpret_cast<CUdeviceptr>(pageable.data())) ==
         CUDA_ERROR_INVALID_VALUE);
  CUpointer_attribute which[] = {CU_POINTER_ATTRIBUTE_MEMORY_TYPE, CU_POINTER_ATTRIBUTE_RANGE_SIZE};
  memory_type = 7;
  bytes = 7;
  void* values[] = {&memory_type, &bytes};
  CU_CHECK(DRV(cuPointerGetAttributes)(2, which, values,
                                       reinterpret_cast<CUdeviceptr>(pageable.data())));
  EXPECT(memory_type == 0 && bytes == 0);

  // ---- Contexts and priorities ----
  CUcontext primary = nullptr, popped = nullptr, current = nullptr;
  CU_CHECK(DRV(cuInit)(0));
  CU_CHECK(DRV(cuDevicePrimaryCtxRetain)(&primary, 0));
  CU_CHECK(DRV(cuCtxPushCurrent)(primary));
  CU_CHECK(DRV(cuCtxGetCurrent)(&current));
  EXPECT(current == primary);
  CU_CHECK(DRV(cuCtxPopCurrent)(&popped));
  EXPECT(popped == primary);
  EXPECT(DRV(cuCtxPopCurrent)(&popped) == CUDA_ERROR_INVALID_CONTEXT);
  int least = 1, greatest = 1, rt_least = 2, rt_greatest = 2;
  CU_CHECK(DRV(cuCtxGetStreamPriorityRange)(&least, &greatest));
  CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&rt_least, &rt_greatest));
  EXPECT(least == rt_least && greatest == rt_greatest && greatest <= least);

  // ---- One device state: the runtime's device and the driver's current context agree ----
  // Through hiberd a function sees one device, so `other` is device 0 there; natively on a
  // machine with several GPUs it is device 1 (tests/unit/thread_context_test.cc covers several
  // devices in the shim).
  int devices = 0;
  CUDA_CHECK(cudaGetDeviceCount(&devices));
  const int other = devices >= 2 ? 1 : 0;
  CUcontext first = nullptr, second = nullptr;
  CU_CHECK(DRV(cuDevicePrimaryCtxRetain)(&first, 0));
  CU_CHECK(DRV(cuDevicePrimaryCtxRetain)(&second, other));
  int runtime_device = -1;
  CUdevice driver_device = -1;
  CUDA_CHECK(cudaSetDevice(other));  // its primary context becomes current
  CU_CHECK(DRV(cuCtxGetCurrent)(&current));
  // cuCtxGetDevice of CUDA 13 (its _v2 ABI): a null context is the current one.
  CU_CHECK(driver_entry<decltype(&cuCtxGetDevice_v2)>("cuCtxGetDevice")(&driver_device, nullptr));
  EXPECT(current == second && driver_device == other);
  CU_CHECK(DRV(cuCtxPushCurrent)(first));  // the runtime follows the driver's stack
  CUDA_CHECK(cudaGetDevice(&runtime_device));
  EXPECT(runtime_device == 0);
  CU_CHECK(DRV(cuCtxPopCurrent)(&popped));
  CUDA_CHECK(cudaGetDevice(&runtime_device));
  EXPECT(popped == first && runtime_device == other);
  CU_CHECK(DRV(cuCtxSetCurrent)(first));
  CUDA_CHECK(cudaGetDevice(&runtime_device));
  EXPECT(runtime_device == 0);
  CU_CHECK(DRV(cuCtxSetCurrent)(second));
  CUDA_CHECK(cudaGetDevice(&runtime_device));
  EXPECT(runtime_device == other);
  // A new thread starts on device 0, whatever this one uses.
  int thread_device = -1;
  CUcontext thread_context = nullptr;
  std::thread([&] {
    if (cudaGetDevice(&thread_device) != cudaSuccess || cudaFree(nullptr) != cudaSuccess ||
        DRV(cuCtxGetCurrent)(&thread_context) != CUDA_SUCCESS) {
      thread_device = -2;
    }
  }).join();
  EXPECT(thread_device == 0 && thread_context == first);
  CUDA_CHECK(cudaSetDevice(0));
  CU_CHECK(DRV(cuCtxGetCurrent)(&current));
  EXPECT(current == first);
  std::printf("runtime_gaps: device state: runtime and driver agree (devices 0 and %d)\n", other);

  // ---- Occupancy, function handles, cuLaunchKernelEx ----
  int max_threads_sm = 0, max_blocks_sm = 0;
  CUDA_CHECK(cudaDeviceGetAttribute(&max_threads_sm, cudaDevAttrMaxThreadsPerMultiProcessor, 0));
  CUDA_CHECK(cudaDeviceGetAttribute(&max_blocks_sm, cudaDevAttrMaxBlocksPerMultiprocessor, 0));
  int active = 0;
  CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&active, add_one, 256, 0));
  EXPECT(active == std::min(max_threads_sm / 256, max_blocks_sm));
  cudaFunction_t function = nullptr;
  CUDA_CHECK(cudaGetFuncBySymbol(&function, reinterpret_cast<const void*>(add_one)));
  auto cu_function = reinterpret_cast<CUfunction>(function);
  int min_grid = 0, block = 0;
  CU_CHECK(DRV(cuOccupancyMaxPotentialBlockSize)(&min_grid, &block, cu_function, nullptr, 0, 0));
  EXPECT(block > 0 && block % 32 == 0 && min_grid > 0);
  int value = 0;
  CU_CHECK(DRV(cuFuncGetAttribute)(&value, CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK, cu_function));
  EXPECT(value >= 1024);
  EXPECT(DRV(cuFuncGetAttribute)(&value, CU_FUNC_ATTRIBUTE_NUM_REGS, cu_function) ==
         CUDA_ERROR_NOT_SUPPORTED);
  CU_CHECK(DRV(cuFuncSetCacheConfig)(cu_function, CU_FUNC_CACHE_PREFER_SHARED));
  int count = n;
  void* args[] = {&data, &count};
  CUlaunchConfig config{};
  config.gridDimX = (n + 255) / 256;
  config.gridDimY = config.gridDimZ = 1;
  config.blockDimX = 256;
  config.blockDimY = config.blockDimZ = 1;
  CU_CHECK(DRV(cuLaunchKernelEx)(&config, cu_function, args, nullptr));
  CUlaunchAttribute cooperative{};
  cooperative.id = CU_LAUNCH_ATTRIBUTE_COOPERATIVE;
  cooperative.value.cooperative = 1;
  config.attrs = &cooperative;
  config.numAttrs = 1;
  EXPECT(DRV(cuLaunchKernelEx)(&config, cu_function, args, nullptr) == CUDA_ERROR_NOT_SUPPORTED);
  CUDA_CHECK(cudaMemcpy(after.data(), data, n * sizeof(float), cudaMemcpyDeviceToHost));
  for (int i = 0; i < n; ++i) EXPECT(after[i] == 1001.0f + i);

  // ---- PTX through cuLink and cuModuleLoadData ----
  const std::string ptx = read_file(argv[1]);
  EXPECT(!ptx.empty());
  CUlinkState link = nullptr;
  CU_CHECK(DRV(cuLinkCreate)(0, nullptr, nullptr, &link));
  CU_CHECK(DRV(cuLinkAddData)(link, CU_JIT_INPUT_PTX, const_cast<char*>(ptx.c_str()),
                              ptx.size() + 1, "ptx_affine.ptx", 0, nullptr, nullptr));
  void* image = nullptr;
  size_t image_bytes = 0;
  CU_CHECK(DRV(cuLinkComplete)(link, &image, &image_bytes));
  CUmodule module = nullptr;
  CU_CHECK(DRV(cuModuleLoadData)(&module, image));
  CU_CHECK(DRV(cuLinkDestroy)(link));
  CUfunction affine = nullptr;
  CU_CHECK(DRV(cuModuleGetFunction)(&affine, module, "hiber_ptx_affine"));
  float a = 2.0f, b = -3.0f;
  CUdeviceptr y = reinterpret_cast<CUdeviceptr>(out), x = dptr;
  void* affine_args[] = {&y, &x, &a, &b, &count};
  CU_CHECK(DRV(cuLaunchKernel)(affine, (n + 127) / 128, 1, 1, 128, 1, 1, 0, nullptr, affine_args,
                               nullptr));
  CUDA_CHECK(cudaMemcpy(back.data(), out, n * sizeof(float), cudaMemcpyDeviceToHost));
  for (int i = 0; i < n; ++i) EXPECT(back[i] == a * (1001.0f + i) + b);
  CUdeviceptr global = 0;
  size_t global_bytes = 0;
  EXPECT(DRV(cuModuleGetGlobal)(&global, &global_bytes, module, "anything") ==
         CUDA_ERROR_NOT_SUPPORTED);
  CU_CHECK(DRV(cuModuleUnload)(module));
  CU_CHECK(DRV(cuLinkCreate)(0, nullptr, nullptr, &link));
  for (int i = 0; i < 2; ++i) {
    CU_CHECK(DRV(cuLinkAddData)(link, CU_JIT_INPUT_PTX, const_cast<char*>(ptx.c_str()),
                                ptx.size() + 1, "ptx_affine.ptx", 0, nullptr, nullptr));
  }
  EXPECT(DRV(cuLinkComplete)(link, &image, &image_bytes) == CUDA_ERROR_NOT_SUPPORTED);
  CU_CHECK(DRV(cuLinkDestroy)(link));
  std::printf("runtime_gaps: PTX linked, loaded and launched\n");

  CUDA_CHECK(cudaStreamDestroy(stream));
  CUDA_CHECK(cudaFreeHost(pinned));
  CUDA_CHECK(cudaFreeHost(seen));
  CUDA_CHECK(cudaFree(data));
  CUDA_CHECK(cudaFree(in));
  CUDA_CHECK(cudaFree(out));
  std::printf("runtime_gaps: OK\n");
  return 0;
}
