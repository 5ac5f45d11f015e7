// device_attributes: every device attribute, read through the runtime (cudaDeviceGetAttribute)
// and the driver (cuDeviceGetAttribute, through cudaGetDriverEntryPoint as PyTorch reaches it),
// must agree on every device, and cudaGetDeviceProperties with them; and the attributes of the
// features Hiber refuses or only stubs must say so, as frameworks read them to choose their path
// (PyTorch's and the stream-ordered allocator's cudaDevAttrMemoryPoolsSupported):
//   memory pools, virtual memory management, managed memory and concurrent managed access,
//   cooperative launches, mapped host memory, IPC events and exported memory: 0;
//   host memory registration (cudaHostRegister works) and stream priorities: 1.
// Natively the GPU's own answers stand, so the feature checks apply through Hiber only.
//
// Usage: device_attributes
#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <utility>
#include <vector>

#include "program_util.h"


int main(int argc, char**) {
  setvbuf(stdout, nullptr, _IOLBF, 0);
  if (argc != 1) {
    std::fprintf(stderr, "usage: device_attributes\n");
    return program::kExitUsage;
  }
  void* entry = nullptr;
  cudaDriverEntryPointQueryResult found{};
  CUDA_CHECK(cudaGetDriverEntryPointByVersion("cuDeviceGetAttribute", &entry, CUDA_VERSION,
                                              cudaEnableDefault, &found));
  EXPECT(entry != nullptr && found == cudaDriverEntryPointSuccess);
  const auto driver_attribute = reinterpret_cast<decltype(&cuDeviceGetAttribute)>(entry);
  CUDA_CHECK(
      cudaGetDriverEntryPointByVersion("cuInit", &entry, CUDA_VERSION, cudaEnableDefault, &found));
  EXPECT(reinterpret_cast<decltype(&cuInit)>(entry)(0) == CUDA_SUCCESS);

  // Through Hiber, whatever the GPU can do (shim_capabilities.h, written again here).
  const bool through_hiber = program::from_hiber(reinterpret_cast<const void*>(&cudaGetDeviceCount));
  const std::vector<std::pair<cudaDeviceAttr, int>> shim_answers = {
      {cudaDevAttrMemoryPoolsSupported, 1},
      {cudaDevAttrMemoryPoolSupportedHandleTypes, 0},
      {static_cast<cudaDeviceAttr>(CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED), 1},
      {cudaDevAttrManagedMemory, 0},
      {cudaDevAttrConcurrentManagedAccess, 0},
      {cudaDevAttrPageableMemoryAccess, 0},
      {cudaDevAttrDirectManagedMemAccessFromHost, 0},
      {cudaDevAttrCooperativeLaunch, 0},
      {cudaDevAttrCanMapHostMemory, 0},
      {cudaDevAttrCanUseHostPointerForRegisteredMem, 0},
      {cudaDevAttrIpcEventSupport, 0},
      {cudaDevAttrGPUDirectRDMASupported, 0},
      {cudaDevAttrHostRegisterSupported, 1},
      {cudaDevAttrStreamPrioritiesSupported, 1},
  };

  int count = 0;
  CUDA_CHECK(cudaGetDeviceCount(&count));
  EXPECT(count > 0);
  int compared = 0;
  for (int device = 0; device < count; ++device) {
    // Every attribute cuda.h names (1 .. CU_DEVICE_ATTRIBUTE_MAX - 1, with its gaps): the two
    // APIs give the same answer, or both refuse the number.
    for (int attr = 1; attr < CU_DEVICE_ATTRIBUTE_MAX; ++attr) {
      int runtime = -1, driver = -1;
      const cudaError_t r =
          cudaDeviceGetAttribute(&runtime, static_cast<cudaDeviceAttr>(attr), device);
      const CUresult d = driver_attribute(&driver, static_cast<CUdevice_attribute>(attr),
                                          static_cast<CUdevice>(device));
      cudaGetLastError();
      EXPECT((r == cudaSuccess) == (d == CUDA_SUCCESS));
      if (r == cudaSuccess) {
        if (runtime != driver) {
          std::fprintf(stderr, "device %d attribute %d: runtime %d, driver %d\n", device, attr,
                       runtime, driver);
        }
        EXPECT(runtime == driver);
        ++compared;
      }
    }
    if (through_hiber) {
      for (const auto& [attr, want] : shim_answers) {
        int value = -1;
        CUDA_CHECK(cudaDeviceGetAttribute(&value, attr, device));
        if (value != want) {
          std::fprintf(stderr, "device %d attribute %d is %d through Hiber, %d expected\n", device,
                       static_cast<int>(attr), value, want);
        }
        EXPECT(value == want);
      }
    }
    // cudaGetDeviceProperties tells the same.
    cudaDeviceProp prop{};
    CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
    const auto a = [&](cudaDeviceAttr attr) {
      int value = -1;
      CUDA_CHECK(cudaDeviceGetAttribute(&value, attr, device));
      return value;
    };
    EXPECT(prop.major == a(cudaDevAttrComputeCapabilityMajor));
    EXPECT(prop.minor == a(cudaDevAttrComputeCapabilityMinor));
    EXPECT(prop.multiProcessorCount == a(cudaDevAttrMultiProcessorCount));
    EXPECT(prop.warpSize == a(cudaDevAttrWarpSize));
    EXPECT(prop.maxThreadsPerBlock == a(cudaDevAttrMaxThreadsPerBlock));
    EXPECT(static_cast<int>(prop.sharedMemPerBlockOptin) ==
           a(cudaDevAttrMaxSharedMemoryPerBlockOptin));
    EXPECT(prop.canMapHostMemory == a(cudaDevAttrCanMapHostMemory));
    EXPECT(prop.managedMemory == a(cudaDevAttrManagedMemory));
    EXPECT(prop.concurrentManagedAccess == a(cudaDevAttrConcurrentManagedAccess));
    EXPECT(prop.pageableMemoryAccess == a(cudaDevAttrPageableMemoryAccess));
    EXPECT(prop.cooperativeLaunch == a(cudaDevAttrCooperativeLaunch));
    EXPECT(prop.memoryPoolsSupported == a(cudaDevAttrMemoryPoolsSupported));
    EXPECT(prop.hostRegisterSupported == a(cudaDevAttrHostRegisterSupported));
    EXPECT(prop.streamPrioritiesSupported == a(cudaDevAttrStreamPrioritiesSupported));
    EXPECT(prop.ipcEventSupported == a(cudaDevAttrIpcEventSupport));
    EXPECT(prop.unifiedAddressing == a(cudaDevAttrUnifiedAddressing));
  }
  std::printf("device_attributes: OK: %d attributes agree through both APIs on %d device(s)\n",
              compared, count);
  return 0;
}
