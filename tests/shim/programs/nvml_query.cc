// nvml_query: NVML and CUDA must agree, as frameworks compare them (torch.cuda.device_count(),
// torch.cuda.mem_get_info). The program finds NVML the way PyTorch does, dlopen of
// libnvidia-ml.so.1 (the shim hands out libhibernvml.so), and checks every device's count, name,
// UUID, PCI bus id, compute capability and memory against the runtime's answers, before and
// after a cudaMalloc. NVML's types are declared in client_shim/nvml_abi.h (no nvml.h here).
//
// Usage: nvml_query
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <dlfcn.h>

#include <cstdio>
#include <cstring>
#include <string>

#include "client_shim/nvml_abi.h"
#include "program_util.h"


#define NVML_CHECK(call)                                                        \
  do {                                                                          \
    const nvmlReturn_t nvml_check_err_ = (call);                                \
    if (nvml_check_err_ != NVML_SUCCESS) {                                      \
      std::fprintf(stderr, "%s:%d: %s failed: %d\n", __FILE__, __LINE__, #call, \
                   static_cast<int>(nvml_check_err_));                          \
      std::exit(program::kExitCudaError);                                       \
    }                                                                           \
  } while (0)

template <typename Fn>
Fn find(void* library, const char* name) {
  auto fn = reinterpret_cast<Fn>(dlsym(library, name));
  if (fn == nullptr) {
    std::fprintf(stderr, "nvml_query: dlsym(%s): %s\n", name, dlerror());
    std::exit(program::kExitCudaError);
  }
  return fn;
}

int main() {
  setvbuf(stdout, nullptr, _IOLBF, 0);
  void* nvml = dlopen("libnvidia-ml.so.1", RTLD_NOW);
  if (nvml == nullptr) {
    std::fprintf(stderr, "nvml_query: dlopen(libnvidia-ml.so.1): %s\n", dlerror());
    return program::kExitCudaError;
  }
  auto init = find<nvmlReturn_t (*)()>(nvml, "nvmlInit_v2");
  auto shutdown = find<nvmlReturn_t (*)()>(nvml, "nvmlShutdown");
  auto get_count = find<nvmlReturn_t (*)(unsigned*)>(nvml, "nvmlDeviceGetCount_v2");
  auto by_index =
      find<nvmlReturn_t (*)(unsigned, nvmlDevice_t*)>(nvml, "nvmlDeviceGetHandleByIndex_v2");
  auto by_uuid =
      find<nvmlReturn_t (*)(const char*, nvmlDevice_t*)>(nvml, "nvmlDeviceGetHandleByUUID");
  auto by_bus =
      find<nvmlReturn_t (*)(const char*, nvmlDevice_t*)>(nvml, "nvmlDeviceGetHandleByPciBusId_v2");
  auto get_name = find<nvmlReturn_t (*)(nvmlDevice_t, char*, unsigned)>(nvml, "nvmlDeviceGetName");
  auto get_uuid = find<nvmlReturn_t (*)(nvmlDevice_t, char*, unsigned)>(nvml, "nvmlDeviceGetUUID");
  auto get_index = find<nvmlReturn_t (*)(nvmlDevice_t, unsigned*)>(nvml, "nvmlDeviceGetIndex");
  auto get_pci =
      find<nvmlReturn_t (*)(nvmlDevice_t, nvmlPciInfo_t*)>(nvml, "nvmlDeviceGetPciInfo_v3");
  auto get_cc =
      find<nvmlReturn_t (*)(nvmlDevice_t, int*, int*)>(nvml, "nvmlDeviceGetCudaComputeCapability");
  auto get_memory =
      find<nvmlReturn_t (*)(nvmlDevice_t, nvmlMemory_t*)>(nvml, "nvmlDeviceGetMemoryInfo");
  auto get_memory_v2 =
      find<nvmlReturn_t (*)(nvmlDevice_t, nvmlMemory_v2_t*)>(nvml, "nvmlDeviceGetMemoryInfo_v2");
  auto cuda_version = find<nvmlReturn_t (*)(int*)>(nvml, "nvmlSystemGetCudaDriverVersion_v2");
  auto utilization = find<nvmlReturn_t (*)(nvmlDevice_t, nvmlUtilization_t*)>(
      nvml, "nvmlDeviceGetUtilizationRates");
  auto error_string = find<const char* (*)(nvmlReturn_t)>(nvml, "nvmlErrorString");

  unsigned count = 0;
  EXPECT(get_count(&count) == NVML_ERROR_UNINITIALIZED);
  NVML_CHECK(init());
  NVML_CHECK(get_count(&count));
  int cuda_count = 0;
  CUDA_CHECK(cudaGetDeviceCount(&cuda_count));
  EXPECT(static_cast<int>(count) == cuda_count && count > 0);
  int driver = 0, nvml_driver = 0;
  CUDA_CHECK(cudaDriverGetVersion(&driver));
  NVML_CHECK(cuda_version(&nvml_driver));
  EXPECT(driver == nvml_driver);
  size_t device0_total = 0;
  for (unsigned i = 0; i < count; ++i) {
    nvmlDevice_t device = nullptr, again = nullptr;
    NVML_CHECK(by_index(i, &device));
    unsigned index = 99;
    NVML_CHECK(get_index(device, &index));
    EXPECT(index == i);
    cudaDeviceProp prop{};
    CUDA_CHECK(cudaGetDeviceProperties(&prop, static_cast<int>(i)));
    if (i == 0) device0_total = prop.totalGlobalMem;
    char name[NVML_DEVICE_NAME_V2_BUFFER_SIZE];
    NVML_CHECK(get_name(device, name, sizeof(name)));
    EXPECT(std::string(name) == prop.name);
    int major = 0, minor = 0;
    NVML_CHECK(get_cc(device, &major, &minor));
    EXPECT(major == prop.major && minor == prop.minor);
    EXPECT(major * 10 + minor >= 75);  // what CUDA 13, cuBLAS 13 and cuDNN 9 need
    char uuid[NVML_DEVICE_UUID_V2_BUFFER_SIZE];
    NVML_CHECK(get_uuid(device, uuid, sizeof(uuid)));
    char want[64];
    std::snprintf(want, sizeof(want), "GPU-");
    for (int b = 0, at = 4; b < 16; ++b) {
      if (b == 4 || b == 6 || b == 8 || b == 10) want[at++] = '-';
      at += std::snprintf(want + at, sizeof(want) - at, "%02x",
                          static_cast<unsigned char>(prop.uuid.bytes[b]));
    }
    EXPECT(std::string(uuid) == want);
    NVML_CHECK(by_uuid(uuid, &again));
    EXPECT(again == device);
    nvmlPciInfo_t pci{};
    NVML_CHECK(get_pci(device, &pci));
    EXPECT(static_cast<int>(pci.domain) == prop.pciDomainID &&
           static_cast<int>(pci.bus) == prop.pciBusID &&
           static_cast<int>(pci.device) == prop.pciDeviceID);
    char cuda_bus[32];
    CUDA_CHECK(cudaDeviceGetPCIBusId(cuda_bus, sizeof(cuda_bus), static_cast<int>(i)));
    NVML_CHECK(by_bus(cuda_bus, &again));
    EXPECT(again == device);
    NVML_CHECK(by_bus(pci.busId, &again));
    EXPECT(again == device);
  }
  nvmlDevice_t device = nullptr;
  NVML_CHECK(by_index(0, &device));
  EXPECT(by_index(count, &device) == NVML_ERROR_INVALID_ARGUMENT);
  NVML_CHECK(by_index(0, &device));
  nvmlUtilization_t busy{};
  EXPECT(utilization(device, &busy) == NVML_ERROR_NOT_SUPPORTED);
  EXPECT(std::strcmp(error_string(NVML_ERROR_NOT_SUPPORTED), "Not Supported") == 0);

  // Memory: the function's quota and what it allocated, as cudaMemGetInfo says.
  nvmlMemory_t before{}, after{};
  NVML_CHECK(get_memory(device, &before));
  size_t free_bytes = 0, total_bytes = 0;
  CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
  EXPECT(before.total == total_bytes && before.free == free_bytes &&
         before.used == total_bytes - free_bytes);
  // The device's memory is the function's grant through the properties too.
  EXPECT(device0_total == total_bytes);
  void* block = nullptr;
  const size_t bytes = size_t{64} << 20;
  CUDA_CHECK(cudaMalloc(&block, bytes));
  std::printf("nvml_query: start\n");
  NVML_CHECK(get_memory(device, &after));
  CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
  EXPECT(after.total == total_bytes && after.free == free_bytes);
  EXPECT(after.used >= before.used + bytes);
  nvmlMemory_v2_t v2{};
  v2.version = nvmlMemory_v2;
  NVML_CHECK(get_memory_v2(device, &v2));
  EXPECT(v2.total == after.total && v2.used == after.used && v2.free == after.free);
  v2.version = 1;
  EXPECT(get_memory_v2(device, &v2) == NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
  // Memory of the stream-ordered pool is used memory to NVML and the runtime alike.
  void* pooled = nullptr;
  CUDA_CHECK(cudaMallocAsync(&pooled, bytes, nullptr));
  NVML_CHECK(get_memory(device, &after));
  CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
  EXPECT(after.free == free_bytes && after.used >= before.used + 2 * bytes);
  CUDA_CHECK(cudaFreeAsync(pooled, nullptr));
  CUDA_CHECK(cudaDeviceSynchronize());  // the pool's threshold is 0: its memory goes back here
  CUDA_CHECK(cudaFree(block));
  NVML_CHECK(get_memory(device, &after));
  EXPECT(after.used == before.used && after.free == before.free);
  NVML_CHECK(shutdown());
  std::printf("nvml_query: OK %u device(s) agree with CUDA\n", count);
  return 0;
}
