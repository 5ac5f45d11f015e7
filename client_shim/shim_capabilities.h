// The device attributes that describe what the shim does rather than what the GPU can do: a
// feature the shim refuses or only stubs reads as absent, through cudaDeviceGetAttribute,
// cuDeviceGetAttribute and cudaGetDeviceProperties alike, so that a framework that checks
// before it uses a feature (PyTorch and the stream-ordered allocator read
// cudaDevAttrMemoryPoolsSupported) takes its fallback instead of walking into a stub.
// X(CUdevice_attribute name without CU_DEVICE_ATTRIBUTE_, its value, what the shim reports, why);
// the names are checked against cuda.h where it is included (runtime_api.cc).
#pragma once

// clang-format off
#define HIBER_SHIM_CAPABILITIES(X)                                                                 \
  X(CAN_MAP_HOST_MEMORY, 19, 0, "mapped host memory is refused")                                   \
  X(STREAM_PRIORITIES_SUPPORTED, 78, 1, "cudaStreamCreateWithPriority keeps and reports priorities") \
  X(MANAGED_MEMORY, 83, 0, "managed memory (cudaMallocManaged) is a stub")                         \
  X(HOST_NATIVE_ATOMIC_SUPPORTED, 86, 0, "kernels run in hiberd and cannot reach host memory")     \
  X(PAGEABLE_MEMORY_ACCESS, 88, 0, "kernels cannot reach the function's host memory")              \
  X(CONCURRENT_MANAGED_ACCESS, 89, 0, "there is no managed memory")                                \
  X(CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM, 91, 0, "registered host memory is not mapped")        \
  X(COOPERATIVE_LAUNCH, 95, 0, "cooperative launches are stubs")                                   \
  X(COOPERATIVE_MULTI_DEVICE_LAUNCH, 96, 0, "cooperative launches are stubs")                      \
  X(CAN_FLUSH_REMOTE_WRITES, 98, 0, "stream memory operations are stubs")                          \
  X(HOST_REGISTER_SUPPORTED, 99, 1, "cudaHostRegister pins the memory the copies stage from")      \
  X(PAGEABLE_MEMORY_ACCESS_USES_HOST_PAGE_TABLES, 100, 0, "kernels cannot reach host memory")      \
  X(DIRECT_MANAGED_MEM_ACCESS_FROM_HOST, 101, 0, "there is no managed memory")                     \
  X(VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, 102, 1, "cuMemCreate and cuMemMap carve the function's memory") \
  X(HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED, 103, 0, "memory is not exported to processes")    \
  X(HANDLE_TYPE_WIN32_HANDLE_SUPPORTED, 104, 0, "memory is not exported to processes")             \
  X(HANDLE_TYPE_WIN32_KMT_HANDLE_SUPPORTED, 105, 0, "memory is not exported to processes")         \
  X(GENERIC_COMPRESSION_SUPPORTED, 107, 0, "cuMemCreate makes no compressible memory")             \
  X(GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED, 110, 0, "memory is not exported to other devices")    \
  X(SPARSE_CUDA_ARRAY_SUPPORTED, 112, 0, "CUDA arrays are stubs")                                  \
  X(READ_ONLY_HOST_REGISTER_SUPPORTED, 113, 0, "registered host memory is not mapped")             \
  X(TIMELINE_SEMAPHORE_INTEROP_SUPPORTED, 114, 0, "external semaphores are stubs")                 \
  X(MEMORY_POOLS_SUPPORTED, 115, 1, "cudaMallocAsync's pools carve the function's memory")         \
  X(GPU_DIRECT_RDMA_SUPPORTED, 116, 0, "memory is not exported to other devices or processes")     \
  X(MEMPOOL_SUPPORTED_HANDLE_TYPES, 119, 0, "there are no memory pools to share")                  \
  X(DEFERRED_MAPPING_CUDA_ARRAY_SUPPORTED, 121, 0, "CUDA arrays are stubs")                        \
  X(IPC_EVENT_SUPPORTED, 125, 0, "IPC handles are stubs")                                          \
  X(HANDLE_TYPE_FABRIC_SUPPORTED, 128, 0, "memory is not exported to processes")                   \
  X(MULTICAST_SUPPORTED, 132, 0, "multicast objects are stubs")                                    \
  X(HOST_NUMA_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, 141, 0, "cuMemCreate makes device memory only") \
  X(HOST_NUMA_MEMORY_POOLS_SUPPORTED, 142, 0, "the memory pools hold device memory only")          \
  X(HOST_NUMA_MULTINODE_IPC_SUPPORTED, 143, 0, "IPC handles are stubs")                            \
  X(HOST_MEMORY_POOLS_SUPPORTED, 144, 0, "the memory pools hold device memory only")               \
  X(HOST_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, 145, 0, "cuMemCreate makes device memory only")
// clang-format on

namespace hiber::shim {

// What the shim reports for attribute `attr` whatever the GPU's value; false if the GPU's stands.
constexpr bool shim_capability(int attr, int* value) {
  switch (attr) {
#define HIBER_SHIM_CAPABILITY_(name, number, reported, why) \
  case number: *value = reported; return true;
    HIBER_SHIM_CAPABILITIES(HIBER_SHIM_CAPABILITY_)
#undef HIBER_SHIM_CAPABILITY_
  }
  return false;
}

}  // namespace hiber::shim
