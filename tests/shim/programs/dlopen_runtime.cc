// dlopen_runtime: a program that links no CUDA library and finds the runtime and the driver at
// run time, as Python frameworks and plugin loaders do.
//
// Usage: dlopen_runtime [bytes = 1048576] [iterations = 1]
//
// The runtime: dlopen("libcudart.so.13") (else "libcudart.so"), then dlsym of
// cudaGetDeviceCount, cudaMalloc, cudaMemset, cudaMemcpy, cudaFree, cudaGetErrorName and
// cudaGetErrorString; a device buffer is memset to a different byte per iteration and copied
// back. The driver: dlopen("libcuda.so.1"), dlsym of cuInit, cuDriverGetVersion,
// cuDeviceGetCount and cuGetProcAddress_v2 (else cuGetProcAddress), which must hand out a
// working cuDeviceGetCount too. The header is included for its types only.
#include <cuda_runtime_api.h>
#include <dlfcn.h>

#include <cstdio>
#include <vector>

#include "program_util.h"

namespace {

// The runtime's entry points, found with dlsym.
struct Runtime {
  cudaError_t (*GetDeviceCount)(int*) = nullptr;
  cudaError_t (*Malloc)(void**, size_t) = nullptr;
  cudaError_t (*Memset)(void*, int, size_t) = nullptr;
  cudaError_t (*Memcpy)(void*, const void*, size_t, cudaMemcpyKind) = nullptr;
  cudaError_t (*Free)(void*) = nullptr;
  const char* (*GetErrorName)(cudaError_t) = nullptr;
  const char* (*GetErrorString)(cudaError_t) = nullptr;
};

// The driver's, likewise (CUresult is an int-sized enum; CUdevice an int).
using CUresultInt = int;
struct Driver {
  CUresultInt (*Init)(unsigned) = nullptr;
  CUresultInt (*DriverGetVersion)(int*) = nullptr;
  CUresultInt (*DeviceGetCount)(int*) = nullptr;
  // cuGetProcAddress_v2(symbol, pfn, cudaVersion, flags, symbolStatus).
  CUresultInt (*GetProcAddressV2)(const char*, void**, int, unsigned long long, int*) = nullptr;
  // cuGetProcAddress (the first version): (symbol, pfn, cudaVersion, flags).
  CUresultInt (*GetProcAddressV1)(const char*, void**, int, unsigned long long) = nullptr;
};

template <typename Fn>
bool find(void* library, const char* library_name, const char* symbol, Fn& out) {
  dlerror();
  out = reinterpret_cast<Fn>(dlsym(library, symbol));
  if (out == nullptr) {
    const char* why = dlerror();
    std::printf("dlopen_runtime: FAILED: dlsym(%s, %s): %s\n", library_name, symbol,
                why != nullptr ? why : "null");
    return false;
  }
  return true;
}

const Runtime* g_runtime = nullptr;

void check(cudaError_t err, const char* what) {
  if (err == cudaSuccess) return;
  std::fprintf(stderr, "dlopen_runtime: %s failed: %s: %s\n", what, g_runtime->GetErrorName(err),
               g_runtime->GetErrorString(err));
  std::exit(program::kExitCudaError);
}

void check_driver(CUresultInt result, const char* what) {
  if (result == 0) return;
  std::fprintf(stderr, "dlopen_runtime: %s failed: CUresult %d\n", what, result);
  std::exit(program::kExitCudaError);
}

}  // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  const size_t bytes = static_cast<size_t>(program::int_arg(argc, argv, 1, 1 << 20, 1, 1 << 30));
  const int iterations = static_cast<int>(program::int_arg(argc, argv, 2, 1, 1, 1000000));

  // ---- The runtime ----
  const char* runtime_name = "libcudart.so.13";
  void* cudart = dlopen(runtime_name, RTLD_NOW | RTLD_LOCAL);
  if (cudart == nullptr) {
    std::printf("dlopen_runtime: dlopen(libcudart.so.13): %s; trying libcudart.so\n", dlerror());
    runtime_name = "libcudart.so";
    cudart = dlopen(runtime_name, RTLD_NOW | RTLD_LOCAL);
  }
  if (cudart == nullptr) {
    std::printf("dlopen_runtime: FAILED: dlopen(libcudart.so): %s\n", dlerror());
    return program::kExitCudaError;
  }
  Runtime rt;
  if (!find(cudart, runtime_name, "cudaGetErrorName", rt.GetErrorName) ||
      !find(cudart, runtime_name, "cudaGetErrorString", rt.GetErrorString) ||
      !find(cudart, runtime_name, "cudaGetDeviceCount", rt.GetDeviceCount) ||
      !find(cudart, runtime_name, "cudaMalloc", rt.Malloc) ||
      !find(cudart, runtime_name, "cudaMemset", rt.Memset) ||
      !find(cudart, runtime_name, "cudaMemcpy", rt.Memcpy) ||
      !find(cudart, runtime_name, "cudaFree", rt.Free)) {
    return program::kExitCudaError;
  }
  g_runtime = &rt;
  std::printf("dlopen_runtime: opened %s\n", runtime_name);

  int runtime_devices = 0;
  check(rt.GetDeviceCount(&runtime_devices), "cudaGetDeviceCount");
  if (runtime_devices < 1) {
    std::printf("dlopen_runtime: FAILED: cudaGetDeviceCount found no device\n");
    return program::kExitCudaError;
  }
  void* buffer = nullptr;
  check(rt.Malloc(&buffer, bytes), "cudaMalloc");
  std::printf("dlopen_runtime: start bytes=%zu iterations=%d\n", bytes, iterations);
  program::Checksum checksum;
  size_t mismatches = 0;
  std::vector<unsigned char> got(bytes), want(bytes);
  for (int it = 0; it < iterations; ++it) {
    const unsigned char value = static_cast<unsigned char>(0xA5 + it * 17);
    check(rt.Memset(buffer, value, bytes), "cudaMemset");
    // Half of the buffer again, so the copy shows two values.
    check(rt.Memset(static_cast<char*>(buffer) + bytes / 2, value ^ 0xFF, bytes - bytes / 2),
          "cudaMemset");
    for (size_t i = 0; i < bytes; ++i) want[i] = i < bytes / 2 ? value : value ^ 0xFF;
    check(rt.Memcpy(got.data(), buffer, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy");
    mismatches += program::count_mismatches("buffer", got.data(), want.data(), bytes);
    checksum.add(got.data(), bytes);
  }
  check(rt.Free(buffer), "cudaFree");

  // ---- The driver ----
  void* libcuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (libcuda == nullptr) {
    std::printf("dlopen_runtime: FAILED: dlopen(libcuda.so.1): %s\n", dlerror());
    return program::kExitCudaError;
  }
  Driver drv;
  if (!find(libcuda, "libcuda.so.1", "cuInit", drv.Init) ||
      !find(libcuda, "libcuda.so.1", "cuDriverGetVersion", drv.DriverGetVersion) ||
      !find(libcuda, "libcuda.so.1", "cuDeviceGetCount", drv.DeviceGetCount)) {
    return program::kExitCudaError;
  }
  dlerror();
  drv.GetProcAddressV2 =
      reinterpret_cast<decltype(drv.GetProcAddressV2)>(dlsym(libcuda, "cuGetProcAddress_v2"));
  if (drv.GetProcAddressV2 == nullptr &&
      !find(libcuda, "libcuda.so.1", "cuGetProcAddress", drv.GetProcAddressV1)) {
    return program::kExitCudaError;
  }
  check_driver(drv.Init(0), "cuInit");
  int driver_version = 0;
  check_driver(drv.DriverGetVersion(&driver_version), "cuDriverGetVersion");
  int driver_devices = 0;
  check_driver(drv.DeviceGetCount(&driver_devices), "cuDeviceGetCount");
  void* proc = nullptr;
  if (drv.GetProcAddressV2 != nullptr) {
    int symbol_status = -1;
    check_driver(drv.GetProcAddressV2("cuDeviceGetCount", &proc, 12000, 0, &symbol_status),
                 "cuGetProcAddress_v2(cuDeviceGetCount)");
  } else {
    check_driver(drv.GetProcAddressV1("cuDeviceGetCount", &proc, 12000, 0),
                 "cuGetProcAddress(cuDeviceGetCount)");
  }
  int proc_devices = 0;
  if (proc != nullptr) {
    check_driver(reinterpret_cast<CUresultInt (*)(int*)>(proc)(&proc_devices),
                 "cuDeviceGetCount from cuGetProcAddress");
  }
  std::printf(
      "dlopen_runtime: driver version %d, %d devices (runtime %d, by cuGetProcAddress %d)\n",
      driver_version, driver_devices, runtime_devices, proc_devices);
  bool ok = mismatches == 0;
  if (driver_version <= 0 || driver_devices != runtime_devices || proc == nullptr ||
      proc_devices != driver_devices) {
    std::printf("dlopen_runtime: the driver's answers do not agree with the runtime's\n");
    ok = false;
  }
  if (!ok) {
    std::printf("dlopen_runtime: FAILED: %zu wrong bytes\n", mismatches);
    return program::kExitMismatch;
  }
  std::printf("dlopen_runtime: OK bytes=%zu iterations=%d checksum=%016llx\n", bytes, iterations,
              checksum.value());
  return 0;
}
