// The CUDA runtime API (libcudart.so.13), implemented on the client core. Signatures come from
// the toolkit's own headers, so the compiler checks them against the ABI.
#include <cuda.h>
#include <cuda_profiler_api.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstring>

#include "client_shim/api_support.h"
#include "client_shim/cudart_entry_decls.h"
#include "client_shim/driver_table.h"
#include "client_shim/runtime_private_abi.h"
#include "client_shim/shim_capabilities.h"
#include "client_shim/thread_context.h"

// Deprecated entry points are still part of the ABI the shim provides.
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"

using hiber::ErrorCode;
using hiber::Status;
using hiber::shim::Client;
using hiber::shim::CopyKind;
using hiber::shim::EventObj;
using hiber::shim::KernelObj;
using hiber::shim::PointerKind;
using hiber::shim::StreamObj;

// The capabilities' numbers are cuda.h's (shim_capabilities.h).
#define HIBER_CHECK_CAPABILITY_(name, number, reported, why)            \
  static_assert(static_cast<int>(CU_DEVICE_ATTRIBUTE_##name) == number, \
                #name " is not attribute " #number " of cuda.h");
HIBER_SHIM_CAPABILITIES(HIBER_CHECK_CAPABILITY_)
#undef HIBER_CHECK_CAPABILITY_

namespace {

constexpr int kRuntimeVersion = CUDART_VERSION;

constexpr auto& fail = hiber::shim::fail<cudaError_t>;
constexpr auto& done = hiber::shim::done<cudaError_t>;
constexpr auto& invalid = hiber::shim::invalid<cudaError_t>;

// The device the calling thread uses: its current context's (client_shim/thread_context.h), so
// cudaSetDevice and the driver's context calls agree.
using hiber::shim::current_device;

Status check_device(int device) {
  const int count = Client::get().device_count();
  if (count == 0)
    return Client::get().ready().ok() ? Status(ErrorCode::kNoDevice, "no device")
                                      : Client::get().ready();
  if (device < 0 || device >= count) {
    return hiber::error(ErrorCode::kInvalidDevice, "device ", device, " does not exist (", count,
                        " device(s))");
  }
  return Status();
}

CopyKind copy_kind(cudaMemcpyKind kind) {
  switch (kind) {
    case cudaMemcpyHostToHost: return CopyKind::kHostToHost;
    case cudaMemcpyHostToDevice: return CopyKind::kHostToDevice;
    case cudaMemcpyDeviceToHost: return CopyKind::kDeviceToHost;
    case cudaMemcpyDeviceToDevice: return CopyKind::kDeviceToDevice;
    default: return CopyKind::kDefault;
  }
}

cudaError_t memcpy_impl(const char* name, void* dst, const void* src, size_t bytes,
                        cudaMemcpyKind kind, cudaStream_t stream, bool async) {
  if (kind < cudaMemcpyHostToHost || kind > cudaMemcpyDefault) {
    return invalid(name, "invalid cudaMemcpyKind");
  }
  auto s = Client::get().stream(stream);
  if (!s.ok()) return fail(name, s.status());
  return done(name, Client::get().memcpy(dst, src, bytes, copy_kind(kind), *s, async));
}

cudaError_t memset_impl(const char* name, void* dst, int value, size_t bytes, cudaStream_t stream,
                        bool async) {
  auto s = Client::get().stream(stream);
  if (!s.ok()) return fail(name, s.status());
  return done(name, Client::get().memset(reinterpret_cast<uint64_t>(dst),
                                         static_cast<uint8_t>(value), 1, bytes, *s, async));
}

cudaError_t launch_impl(const char* name, const void* func, dim3 grid, dim3 block, void** args,
                        size_t shared, cudaStream_t stream, bool by_kernel_handle) {
  Client& client = Client::get();
  if (Status ready = client.ready(); !ready.ok()) return fail(name, ready);
  auto kernel = by_kernel_handle ? client.kernel(func) : client.kernel_for_host_function(func);
  if (!kernel.ok()) {
    return fail(name, Status(static_cast<ErrorCode>(cudaErrorInvalidDeviceFunction),
                             kernel.status().message()));
  }
  if (grid.x == 0 || grid.y == 0 || grid.z == 0 || block.x == 0 || block.y == 0 || block.z == 0) {
    return fail(name, Status(static_cast<ErrorCode>(cudaErrorInvalidConfiguration),
                             hiber::str_cat("launch of ", (*kernel)->name,
                                            " with a zero grid or block dimension")));
  }
  const uint64_t threads = uint64_t{block.x} * block.y * block.z;
  if (threads > static_cast<uint64_t>(Client::get().device_attribute(
                    current_device(), CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK))) {
    return fail(name, Status(static_cast<ErrorCode>(cudaErrorInvalidConfiguration),
                             hiber::str_cat("launch of ", (*kernel)->name, " with ", threads,
                                            " threads per block, above the device's limit")));
  }
  auto s = client.stream(stream);
  if (!s.ok()) return fail(name, s.status());
  return done(name, client.launch(*kernel, {grid.x, grid.y, grid.z}, {block.x, block.y, block.z},
                                  static_cast<uint32_t>(shared), *s, args));
}

// The kernel a runtime "func" argument names: a host stub (the usual form), or a cudaKernel_t /
// cudaFunction_t the shim handed out. cudaErrorInvalidDeviceFunction if neither.
hiber::Result<KernelObj*> func_kernel(const void* func) {
  auto kernel = Client::get().kernel_for_host_function(func);
  if (kernel.ok()) return kernel;
  auto by_handle = Client::get().kernel(func);
  if (by_handle.ok()) return by_handle;
  return Status(static_cast<ErrorCode>(cudaErrorInvalidDeviceFunction), kernel.status().message());
}

// A query of one property of a stream (nullptr: the default stream).
template <typename T, typename Get>
cudaError_t stream_property(const char* name, cudaStream_t stream, T* out, Get get) {
  if (out == nullptr) return invalid(name, "null pointer");
  auto s = Client::get().stream(stream);
  if (!s.ok()) return fail(name, s.status());
  *out = static_cast<T>(get(*s));
  return cudaSuccess;
}

cudaError_t event_sync_like(const char* name, cudaEvent_t event, Status (Client::*op)(EventObj*)) {
  auto e = Client::get().event(event);
  if (!e.ok()) return fail(name, e.status());
  return done(name, (Client::get().*op)(*e));
}

}  // namespace

// ---- Versions, devices ----

cudaError_t hiber_entry::cudaRuntimeGetVersion(int* version) {
  if (version == nullptr) return invalid("cudaRuntimeGetVersion", "null pointer");
  *version = kRuntimeVersion;
  return cudaSuccess;
}

cudaError_t hiber_entry::cudaDriverGetVersion(int* version) {
  if (version == nullptr) return invalid("cudaDriverGetVersion", "null pointer");
  *version = CUDA_VERSION;  // the driver API the shim implements
  return cudaSuccess;
}

cudaError_t hiber_entry::cudaGetDeviceCount(int* count) {
  if (count == nullptr) return invalid("cudaGetDeviceCount", "null pointer");
  *count = 0;
  Status ready = Client::get().ready();
  if (!ready.ok()) {
    return fail("cudaGetDeviceCount", Status(ErrorCode::kNoDevice, ready.message()));
  }
  *count = Client::get().device_count();
  return cudaSuccess;
}

cudaError_t hiber_entry::cudaGetDevice(int* device) {
  if (device == nullptr) return invalid("cudaGetDevice", "null pointer");
  *device = current_device();
  return cudaSuccess;
}

cudaError_t hiber_entry::cudaSetDevice(int device) {
  Status ok = check_device(device);
  if (!ok.ok()) return fail("cudaSetDevice", ok);
  hiber::shim::set_current_device(device);
  return cudaSuccess;
}

cudaError_t hiber_entry::cudaInitDevice(int device, unsigned int, unsigned int) {
  return done("cudaInitDevice", check_device(device));
}

cudaError_t hiber_entry::cudaGetDeviceFlags(unsigned int* flags) {
  if (flags == nullptr) return invalid("cudaGetDeviceFlags", "null pointer");
  *flags = cudaDeviceScheduleAuto | cudaDeviceMapHost;
  return cudaSuccess;
}

cudaError_t hiber_entry::cudaSetDeviceFlags(unsigned int flags) {
  // Scheduling flags choose how the host waits; the shim always spins briefly, then sleeps.
  if ((flags & ~(cudaDeviceScheduleMask | cudaDeviceMapHost | cudaDeviceLmemResizeToMax)) != 0) {
    return invalid("cudaSetDeviceFlags", "unknown flags");
  }
  return cudaSuccess;
}

cudaError_t hiber_entry::cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int device) {
  if (value == nullptr) return invalid("cudaDeviceGetAttribute", "null pointer");
  Status ok = check_device(device);
  if (!ok.ok()) return fail("cudaDeviceGetAttribute", ok);
  // cudaDeviceAttr and CUdevice_attribute share their values.
  *value = Client::get().device_attribute(device, static_cast<int>(attr));
  return cudaSuccess;
}

cudaError_t hiber_entry::cudaGetDeviceProperties(cudaDeviceProp* prop, int device) {
  if (prop == nullptr) return invalid("cudaGetDeviceProperties", "null pointer");
  Status ok = check_device(device);
  if (!ok.ok()) return fail("cudaGetDeviceProperties", ok);
  const auto& info = Client::get().session()->devices[device];
  std::memset(prop, 0, sizeof(*prop));
  std::strncpy(prop->name, info.name.c_str(), sizeof(prop->name) - 1);
  std::memcpy(prop->uuid.bytes, info.uuid.data(),
              std::min(info.uuid.size(), sizeof(prop->uuid.bytes)));
  prop->totalGlobalMem = info.total_memory_bytes;
  auto a = [&](CUdevice_attribute attr) { return Client::get().device_attribute(device, attr); };
  prop->sharedMemPerBlock = a(CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK);
  prop->regsPerBlock = a(CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_BLOCK);
  prop->warpSize = a(CU_DEVICE_ATTRIBUTE_WARP_SIZE);
  prop->memPitch = a(CU_DEVICE_ATTRIBUTE_MAX_PITCH);
  prop->maxThreadsPerBlock = a(CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK);
  prop->maxThreadsDim[0] = a(CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X);
  prop->maxThreadsDim[1] = a(CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y);
  prop->maxThreadsDim[2] = a(CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z);
  prop->maxGridSize[0] = a(CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X);
  prop->maxGridSize[1] = a(CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y);
  prop->maxGridSize[2] = a(CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z);
  prop->totalConstMem = a(CU_DEVICE_ATTRIBUTE_TOTAL_CONSTANT_MEMORY);
  prop->major = a(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR);
  prop->minor = a(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR);
  prop->textureAlignment = a(CU_DEVICE_ATTRIBUTE_TEXTURE_ALIGNMENT);
  prop->texturePitchAlignment = a(CU_DEVICE_ATTRIBUTE_TEXTURE_PITCH_ALIGNMENT);
  prop->multiProcessorCount = a(CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT);
  prop->integrated = a(CU_DEVICE_ATTRIBUTE_INTEGRATED);
  prop->canMapHostMemory = a(CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY);
  prop->concurrentKernels = a(CU_DEVICE_ATTRIBUTE_CONCURRENT_KERNELS);
  prop->ECCEnabled = a(CU_DEVICE_ATTRIBUTE_ECC_ENABLED);
  prop->pciBusID = a(CU_DEVICE_ATTRIBUTE_PCI_BUS_ID);
  prop->pciDeviceID = a(CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID);
  prop->pciDomainID = a(CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID);
  prop->asyncEngineCount = a(CU_DEVICE_ATTRIBUTE_ASYNC_ENGINE_COUNT);
  prop->unifiedAddressing = a(CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING);
  prop->memoryBusWidth = a(CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH);
  prop->l2CacheSize = a(CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE);
  prop->persistingL2CacheMaxSize = a(CU_DEVICE_ATTRIBUTE_MAX_PERSISTING_L2_CACHE_SIZE);
  prop->maxThreadsPerMultiProcessor = a(CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR);
  prop->streamPrioritiesSupported = a(CU_DEVICE_ATTRIBUTE_STREAM_PRIORITIES_SUPPORTED);
  prop->globalL1CacheSupported = a(CU_DEVICE_ATTRIBUTE_GLOBAL_L1_CACHE_SUPPORTED);
  prop->localL1CacheSupported = a(CU_DEVICE_ATTRIBUTE_LOCAL_L1_CACHE_SUPPORTED);
  prop->sharedMemPerMultiprocessor = a(CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR);
  prop->regsPerMultiprocessor = a(CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_MULTIPROCESSOR);
  prop->managedMemory = a(CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY);
  prop->hostNativeAtomicSupported = a(CU_DEVICE_ATTRIBUTE_HOST_NATIVE_ATOMIC_SUPPORTED);
  prop->pageableMemoryAccess = a(CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS);
  prop->concurrentManagedAccess = a(CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS);
  prop->canUseHostPointerForRegisteredMem =
      a(CU_DEVICE_ATTRIBUTE_CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM);
  prop->pageableMemoryAccessUsesHostPageTables =
      a(CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS_USES_HOST_PAGE_TABLES);
  prop->directManagedMemAccessFromHost = a(CU_DEVICE_ATTRIBUTE_DIRECT_MANAGED_MEM_ACCESS_FROM_HOST);
  prop->isMultiGpuBoard = a(CU_DEVICE_ATTRIBUTE_MULTI_GPU_BOARD);
  prop->computePreemptionSupported = a(CU_DEVICE_ATTRIBUTE_COMPUTE_PREEMPTION_SUPPORTED);
  prop->cooperativeLaunch = a(CU_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH);
  prop->sharedMemPerBlockOptin = a(CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN);
  prop->maxBlocksPerMultiProcessor = a(CU_DEVICE_ATTRIBUTE_MAX_BLOCKS_PER_MULTIPROCESSOR);
  prop->reservedSharedMemPerBlock = a(CU_DEVICE_ATTRIBUTE_RESERVED_SHARED_MEMORY_PER_BLOCK);
  prop->hostRegisterSupported = a(CU_DEVICE_ATTRIBUTE_HOST_REGISTER_SUPPORTED);
  prop->sparseCudaArraySupported = a(CU_DEVICE_ATTRIBUTE_SPARSE_CUDA_ARRAY_SUPPORTED);
  prop->hostRegisterReadOnlySupported = a(CU_DEVICE_ATTRIBUTE_READ_ONLY_HOST_REGISTER_SUPPORTED);
  prop->timelineSemaphoreInteropSupported =
      a(CU_DEVICE_ATTRIBUTE_TIMELINE_SEMAPHORE_INTEROP_SUPPORTED);
  prop->memoryPoolsSupported = a(CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED);
  prop->gpuDirectRDMASupported = a(CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED);
  prop->memoryPoolSupportedHandleTypes = a(CU_DEVICE_ATTRIBUTE_MEMPOOL_SUPPORTED_HANDLE_TYPES);
  prop->deferredMappingCudaArraySupported =
      a(CU_DEVICE_ATTRIBUTE_DEFERRED_MAPPING_CUDA_ARRAY_SUPPORTED);
  prop->ipcEventSupported = a(CU_DEVICE_ATTRIBUTE_IPC_EVENT_SUPPORTED);
  prop->clusterLaunch = a(CU_DEVICE_ATTRIBUTE_CLUSTER_LAUNCH);
  prop->unifiedFunctionPointers = a(CU_DEVICE_ATTRIBUTE_UNIFIED_FUNCTION_POINTERS);
  prop->mpsEnabled = a(CU_DEVICE_ATTRIBUTE_MPS_ENABLED);
  return cudaSuccess;
}

cudaError_t hiber_entry::cudaDeviceGetPCIBusId(char* bus_id, int length, int device) {
  if (bus_id == nullptr || length <= 0) return invalid("cudaDeviceGetPCIBusId", "bad buffer");
  Status ok = check_device(device);
  if (!ok.ok()) return fail("cudaDeviceGetPCIBusId", ok);
  const std::string& id = Client::get().session()->devices[device].pci_bus_id;
  std::strncpy(bus_id, id.c_str(), length - 1);
  bus_id[length - 1] = '\0';
  return cudaSuccess;
}

cudaError_t hiber_entry::cudaDeviceGetStreamPriorityRange(int* least, int* greatest) {
  const auto [l, g] = Client::get().stream_priority_range();
  if (least) *least = l;
  if (greatest) *greatest = g;
  return cudaSuccess;
}

cudaError_t hiber_entry::cudaDeviceCanAccessPeer(int* can_access, int device, int peer) {
  if (can_access == nullptr) return invalid("cudaDeviceCanAccessPeer", "null pointer");
  Status ok = check_device(device);
  if (ok.ok()) ok = check_device(peer);
  if (!ok.ok()) return fail("cudaDeviceCanAccessPeer", ok);
  *can_access = 0;  // one session: the devices it sees are not peers of each other
  return cudaSuccess;
}

cudaError_t hiber_entry::cudaDeviceSynchronize(void) {
  return done("cudaDeviceSynchronize", Client::get().synchronize_device());
}

cudaError_t hiber_entry::cudaDeviceReset(void) {
  return done("cudaDeviceReset", Client::get().reset_device());
}

cudaError_t hiber_entry::cudaMemGetInfo(size_t* free_bytes, size_t* total_bytes) {
  Status ready = Client::get().ready();
  if (!ready.ok()) return fail("cudaMemGetInfo", ready);
  const auto info = Client::get().memory_info();
  if (free_bytes) *free_bytes = info.free_bytes;
  if (total_bytes) *total_bytes = info.total_bytes;
  return cudaSuccess;
}

// ---- Errors ----

cudaError_t hiber_entry::cudaGetLastError(void) {
  int& last = hiber::shim::thread_last_error();
  if (last == cudaSuccess) {
    Status async = Client::get().take_async_error();
    if (!async.ok()) {
      last = static_cast<int>(async.code());
      hiber::shim::thread_last_error_message() = async.message();
    }
  }
  const int error = last;
  last = cudaSuccess;
  return static_cast<cudaError_t>(error);
}

cudaError_t hiber_entry::cudaPeekAtLastError(void) {
  const int last = hiber::shim::thread_last_error();
  if (last != cudaSuccess) return static_cast<cudaError_t>(last);
  const Status async = Client::get().peek_async_error();
  if (!async.ok()) hiber::shim::thread_last_error_message() = async.message();
  return static_cast<cudaError_t>(async.code());
}

// Hiber's own: the message of the calling thread's last failure (hiberd's reason, which no
// cudaError_t can carry), "" before any; valid until the thread's next failing call. Programs
// find it with dlsym(RTLD_DEFAULT, ...), so that they still run without Hiber (docs/shim.md).
extern "C" __attribute__((visibility("default"))) const char* hiber_shim_last_error_message(void) {
  return hiber::shim::thread_last_error_message().c_str();
}

const char* hiber_entry::cudaGetErrorName(cudaError_t error) {
  const char* name = hiber::shim::runtime_error_name(error);
  return name ? name : "cudaErrorUnknown";
}

const char* hiber_entry::cudaGetErrorString(cudaError_t error) {
  const char* text = hiber::shim::runtime_error_string(error);
  return text ? text : "unknown error";
}

// ---- Device memory ----

cudaError_t hiber_entry::cudaMalloc(void** pointer, size_t bytes) {
  if (pointer == nullptr) return invalid("cudaMalloc", "null pointer");
  auto address = Client::get().malloc_device(bytes);
  if (!address.ok()) {
    *pointer = nullptr;
    ErrorCode code = address.status().code();
    // An exhausted quota is cudaErrorMemoryAllocation, as a full GPU is.
    if (code == ErrorCode::kOutOfMemory) code = static_cast<ErrorCode>(cudaErrorMemoryAllocation);
    return fail("cudaMalloc", Status(code, address.status().message()));
  }
  *pointer = reinterpret_cast<void*>(*address);
  return cudaSuccess;
}

cudaError_t hiber_entry::cudaFree(void* pointer) {
  return done("cudaFree", Client::get().free_device(reinterpret_cast<uint64_t>(pointer)));
}

// ---- Host memory ----

cudaError_t hiber_entry::cudaMallocHost(void** pointer, size_t bytes) {
  if (pointer == nullptr) return invalid("cudaMallocHost", "null pointer");
  auto memory = Client::get().malloc_host(bytes);
  if (!memory.ok()) {
    *pointer = nullptr;
    return fail("cudaMallocHost", memory.status());
  }
  *pointer = *memory;
  return cudaSuccess;
}

cudaError_t hiber_entry::cudaHostAlloc(void** pointer, size_t bytes, unsigned int flags) {
  if ((flags & cudaHostAllocMapped) != 0) {
    return fail("cudaHostAlloc", hiber::shim::mapped_host_memory_unsupported());
  }
  return cudaMallocHost(pointer, bytes);
}

cudaError_t hiber_entry::cudaFreeHost(void* pointer) {
  return done("cudaFreeHost", Client::get().free_host(pointer));
}

cudaError_t hiber_entry::cudaHostRegister(void* pointer, size_t bytes, unsigned int flags) {
  if ((flags & (cudaHostRegisterMapped | cudaHostRegisterIoMemory)) != 0) {
    return fail("cudaHostRegister", hiber::shim::mapped_host_memory_unsupported());
  }
  return done("cudaHostRegister", Client::get().register_host(pointer, bytes));
}

cudaError_t hiber_entry::cudaHostUnregister(void* pointer) {
  return done("cudaHostUnregister", Client::get().unregister_host(pointer));
}

cudaError_t hiber_entry::cudaHostGetDevicePointer(void** device_pointer, void*, unsigned int) {
  if (device_pointer == nullptr) return invalid("cudaHostGetDevicePointer", "null pointer");
  return fail("cudaHostGetDevicePointer", hiber::shim::mapped_host_memory_unsupported());
}

// ---- IPC: refused (api_support.h, ipc_unsupported) ----

cudaError_t hiber_entry::cudaIpcGetMemHandle(cudaIpcMemHandle_t* handle, void* pointer) {
  if (handle == nullptr || pointer == nullptr) return invalid("cudaIpcGetMemHandle");
  return fail("cudaIpcGetMemHandle", hiber::shim::ipc_unsupported());
}

cudaError_t hiber_entry::cudaIpcOpenMemHandle(void** pointer, cudaIpcMemHandle_t, unsigned int) {
  if (pointer == nullptr) return invalid("cudaIpcOpenMemHandle");
  return fail("cudaIpcOpenMemHandle", hiber::shim::ipc_unsupported());
}

cudaError_t hiber_entry::cudaIpcCloseMemHandle(void* pointer) {
  if (pointer == nullptr) return invalid("cudaIpcCloseMemHandle");
  return fail("cudaIpcCloseMemHandle", hiber::shim::ipc_unsupported());
}

cudaError_t hiber_entry::cudaIpcGetEventHandle(cudaIpcEventHandle_t* handle, cudaEvent_t event) {
  if (handle == nullptr || event == nullptr) return invalid("cudaIpcGetEventHandle");
  return fail("cudaIpcGetEventHandle", hiber::shim::ipc_unsupported());
}

cudaError_t hiber_entry::cudaIpcOpenEventHandle(cudaEvent_t* event, cudaIpcEventHandle_t) {
  if (event == nullptr) return invalid("cudaIpcOpenEventHandle");
  return fail("cudaIpcOpenEventHandle", hiber::shim::ipc_unsupported());
}

cudaError_t hiber_entry::cudaHostGetFlags(unsigned int* flags, void* pointer) {
  if (flags == nullptr) return invalid("cudaHostGetFlags", "null pointer");
  if (!Client::get().classify(pointer).pinned) {
    return invalid("cudaHostGetFlags", "not memory from cudaHostAlloc");
  }
  *flags = cudaHostAllocDefault;
  return cudaSuccess;
}

cudaError_t hiber_entry::cudaPointerGetAttributes(cudaPointerAttributes* attributes,
                                                  const void* pointer) {
  if (attributes == nullptr) return invalid("cudaPointerGetAttributes", "null pointer");
  std::memset(attributes, 0, sizeof(*attributes));
  const auto range = Client::get().pointer_range(pointer);
  if (range && range->kind == PointerKind::kDevice) {
    attributes->type = cudaMemoryTypeDevice;
    attributes->device = 0;  // every device of the session shares one address space
    attributes->devicePointer = const_cast<void*>(pointer);
  } else if (range) {
    // Pinned host memory; kernels cannot reach client memory, so it has no device pointer.
    attributes->type = cudaMemoryTypeHost;
    attributes->device = current_device();
    attributes->hostPointer = const_cast<void*>(pointer);
  } else {
    attributes->type = cudaMemoryTypeUnregistered;
    attributes->device = -2;  // what CUDA reports for unregistered memory
  }
  return cudaSuccess;
}

// ---- Copies and memsets ----

cudaError_t hiber_entry::cudaMemcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind) {
  return memcpy_impl("cudaMemcpy", dst, src, bytes, kind, nullptr, false);
}

cudaError_t hiber_entry::cudaMemcpyAsync(void* dst, const void* src, size_t bytes,
                                         cudaMemcpyKind kind, cudaStream_t stream) {
  return memcpy_impl("cudaMemcpyAsync", dst, src, bytes, kind, stream, true);
}

cudaError_t hiber_entry::cudaMemset(void* dst, int value, size_t bytes) {
  return memset_impl("cudaMemset", dst, value, bytes, nullptr, false);
}

cudaError_t hiber_entry::cudaMemsetAsync(void* dst, int value, size_t bytes, cudaStream_t stream) {
  return memset_impl("cudaMemsetAsync", dst, value, bytes, stream, true);
}

// ---- Streams ----

cudaError_t hiber_entry::cudaStreamCreateWithPriority(cudaStream_t* stream, unsigned int flags,
                                                      int priority) {
  if (stream == nullptr) return invalid("cudaStreamCreate", "null pointer");
  if ((flags & ~cudaStreamNonBlocking) != 0) return invalid("cudaStreamCreate", "unknown flags");
  auto created = Client::get().create_stream(flags, priority);
  if (!created.ok()) return fail("cudaStreamCreate", created.status());
  *stream = reinterpret_cast<cudaStream_t>(*created);
  return cudaSuccess;
}

cudaError_t hiber_entry::cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned int flags) {
  return hiber_entry::cudaStreamCreateWithPriority(stream, flags, 0);
}

cudaError_t hiber_entry::cudaStreamCreate(cudaStream_t* stream) {
  return hiber_entry::cudaStreamCreateWithPriority(stream, cudaStreamDefault, 0);
}

cudaError_t hiber_entry::cudaStreamDestroy(cudaStream_t stream) {
  auto s = Client::get().stream(stream);
  if (!s.ok()) return fail("cudaStreamDestroy", s.status());
  return done("cudaStreamDestroy", Client::get().destroy_stream(*s));
}

cudaError_t hiber_entry::cudaStreamSynchronize(cudaStream_t stream) {
  auto s = Client::get().stream(stream);
  if (!s.ok()) return fail("cudaStreamSynchronize", s.status());
  return done("cudaStreamSynchronize", Client::get().synchronize_stream(*s));
}

cudaError_t hiber_entry::cudaStreamQuery(cudaStream_t stream) {
  auto s = Client::get().stream(stream);
  if (!s.ok()) return fail("cudaStreamQuery", s.status());
  return done("cudaStreamQuery", Client::get().query_stream(*s));
}

cudaError_t hiber_entry::cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event,
                                             unsigned int flags) {
  if (flags != 0 && flags != cudaEventWaitDefault)
    return invalid("cudaStreamWaitEvent", "unknown flags");
  auto s = Client::get().stream(stream);
  if (!s.ok()) return fail("cudaStreamWaitEvent", s.status());
  auto e = Client::get().event(event);
  if (!e.ok()) return fail("cudaStreamWaitEvent", e.status());
  return done("cudaStreamWaitEvent", Client::get().wait_event(*s, *e));
}

cudaError_t hiber_entry::cudaStreamGetPriority(cudaStream_t stream, int* priority) {
  return stream_property("cudaStreamGetPriority", stream, priority,
                         [](StreamObj* s) { return s ? s->priority : 0; });
}

cudaError_t hiber_entry::cudaStreamGetFlags(cudaStream_t stream, unsigned int* flags) {
  return stream_property("cudaStreamGetFlags", stream, flags,
                         [](StreamObj* s) { return s ? s->flags : cudaStreamDefault; });
}

cudaError_t hiber_entry::cudaStreamGetDevice(cudaStream_t stream, int* device) {
  return stream_property("cudaStreamGetDevice", stream, device,
                         [](StreamObj*) { return current_device(); });
}

cudaError_t hiber_entry::cudaStreamGetId(cudaStream_t stream, unsigned long long* id) {
  return stream_property("cudaStreamGetId", stream, id, [](StreamObj* s) -> unsigned long long {
    return s ? s->wire.value() : 0;
  });
}

// Stream capture (CUDA graphs) is not supported: no stream is ever capturing, and beginning a
// capture fails loudly (an unsupported entry point).
// ---- Events ----

cudaError_t hiber_entry::cudaEventCreateWithFlags(cudaEvent_t* event, unsigned int flags) {
  if (event == nullptr) return invalid("cudaEventCreate", "null pointer");
  if ((flags & cudaEventInterprocess) != 0) {
    return fail("cudaEventCreate",
                Status(ErrorCode::kNotSupported, "cudaEventInterprocess events are not supported"));
  }
  if ((flags & ~(cudaEventBlockingSync | cudaEventDisableTiming)) != 0) {
    return invalid("cudaEventCreate", "unknown flags");
  }
  auto created = Client::get().create_event(flags);
  if (!created.ok()) return fail("cudaEventCreate", created.status());
  *event = reinterpret_cast<cudaEvent_t>(*created);
  return cudaSuccess;
}

cudaError_t hiber_entry::cudaEventCreate(cudaEvent_t* event) {
  return hiber_entry::cudaEventCreateWithFlags(event, 0);
}

cudaError_t hiber_entry::cudaEventDestroy(cudaEvent_t event) {
  auto e = Client::get().event(event);
  if (!e.ok()) return fail("cudaEventDestroy", e.status());
  return done("cudaEventDestroy", Client::get().destroy_event(*e));
}

cudaError_t hiber_entry::cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
  auto e = Client::get().event(event);
  if (!e.ok()) return fail("cudaEventRecord", e.status());
  auto s = Client::get().stream(stream);
  if (!s.ok()) return fail("cudaEventRecord", s.status());
  return done("cudaEventRecord", Client::get().record_event(*e, *s));
}

cudaError_t hiber_entry::cudaEventRecordWithFlags(cudaEvent_t event, cudaStream_t stream,
                                                  unsigned int flags) {
  if (flags != cudaEventRecordDefault) {
    return fail("cudaEventRecordWithFlags",
                Status(ErrorCode::kNotSupported, "event record flags other than the default"));
  }
  return hiber_entry::cudaEventRecord(event, stream);
}

cudaError_t hiber_entry::cudaEventSynchronize(cudaEvent_t event) {
  return event_sync_like("cudaEventSynchronize", event, &Client::synchronize_event);
}

cudaError_t hiber_entry::cudaEventQuery(cudaEvent_t event) {
  return event_sync_like("cudaEventQuery", event, &Client::query_event);
}

cudaError_t hiber_entry::cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end) {
  if (ms == nullptr) return invalid("cudaEventElapsedTime", "null pointer");
  auto a = Client::get().event(start);
  if (!a.ok()) return fail("cudaEventElapsedTime", a.status());
  auto b = Client::get().event(end);
  if (!b.ok()) return fail("cudaEventElapsedTime", b.status());
  auto elapsed = Client::get().elapsed_ms(*a, *b);
  if (!elapsed.ok()) return fail("cudaEventElapsedTime", elapsed.status());
  *ms = *elapsed;
  return cudaSuccess;
}

// ---- Kernels ----

cudaError_t hiber_entry::cudaLaunchKernel(const void* func, dim3 grid, dim3 block, void** args,
                                          size_t shared, cudaStream_t stream) {
  return launch_impl("cudaLaunchKernel", func, grid, block, args, shared, stream, false);
}

cudaError_t hiber_entry::cudaLaunchKernelExC(const cudaLaunchConfig_t* config, const void* func,
                                             void** args) {
  if (config == nullptr) return invalid("cudaLaunchKernelExC", "null config");
  for (unsigned i = 0; i < config->numAttrs; ++i) {
    if (config->attrs[i].id != cudaLaunchAttributeIgnore) {
      return fail("cudaLaunchKernelExC",
                  hiber::error(ErrorCode::kNotSupported, "launch attribute ",
                               static_cast<int>(config->attrs[i].id), " is not supported"));
    }
  }
  return launch_impl("cudaLaunchKernelExC", func, config->gridDim, config->blockDim, args,
                     config->dynamicSmemBytes, config->stream, false);
}

cudaError_t hiber_entry::cudaFuncGetAttributes(cudaFuncAttributes* attributes, const void* func) {
  if (attributes == nullptr) return invalid("cudaFuncGetAttributes", "null pointer");
  auto kernel = func_kernel(func);
  if (!kernel.ok()) return fail("cudaFuncGetAttributes", kernel.status());
  // Registers, static shared, constant and local memory are known only to the driver in
  // hiberd and read 0 here; the limits are the device's, which is what a launch is checked
  // against, and the dynamic shared memory limit is the kernel's as the program set it.
  std::memset(attributes, 0, sizeof(*attributes));
  const int device = current_device();
  Client& client = Client::get();
  attributes->maxThreadsPerBlock =
      client.device_attribute(device, CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK);
  attributes->maxDynamicSharedSizeBytes = (*kernel)->max_dynamic_shared.value_or(
      client.device_attribute(device, CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK));
  const int arch =
      client.device_attribute(device, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR) * 10 +
      client.device_attribute(device, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR);
  attributes->ptxVersion = arch;
  attributes->binaryVersion = arch;
  attributes->preferredShmemCarveout = (*kernel)->preferred_carveout;
  return cudaSuccess;
}

cudaError_t hiber_entry::cudaFuncGetName(const char** name, const void* func) {
  if (name == nullptr) return invalid("cudaFuncGetName", "null pointer");
  auto kernel = func_kernel(func);
  if (!kernel.ok()) return fail("cudaFuncGetName", kernel.status());
  *name = (*kernel)->name.c_str();
  return cudaSuccess;
}

cudaError_t hiber_entry::cudaGetFuncBySymbol(cudaFunction_t* function, const void* symbol) {
  if (function == nullptr) return invalid("cudaGetFuncBySymbol", "null pointer");
  auto kernel = func_kernel(symbol);
  if (!kernel.ok()) return fail("cudaGetFuncBySymbol", kernel.status());
  // The shim's kernel object is also the driver's CUfunction (cuLaunchKernel takes it).
  *function = reinterpret_cast<cudaFunction_t>(*kernel);
  return cudaSuccess;
}

cudaError_t hiber_entry::cudaFuncSetAttribute(const void* func, cudaFuncAttribute attr, int value) {
  auto kernel = func_kernel(func);
  if (!kernel.ok()) return fail("cudaFuncSetAttribute", kernel.status());
  switch (attr) {
    case cudaFuncAttributeMaxDynamicSharedMemorySize: {
      // Up to the device's opt-in limit, as CUDA allows; the launch then may use that much, and
      // hiberd sets the real function's attribute before launching it (cuda_device.cc).
      const int optin = Client::get().device_attribute(
          current_device(), CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN);
      if (value < 0 || value > optin) {
        return invalid("cudaFuncSetAttribute",
                       "cudaFuncAttributeMaxDynamicSharedMemorySize outside [0, the device's "
                       "opt-in limit]");
      }
      (*kernel)->max_dynamic_shared = value;
      return cudaSuccess;
    }
    case cudaFuncAttributePreferredSharedMemoryCarveout:
      // A hint the driver may ignore; kept for cudaFuncGetAttributes.
      if (value < -1 || value > 100)
        return invalid("cudaFuncSetAttribute", "carveout not in -1..100");
      (*kernel)->preferred_carveout = value;
      return cudaSuccess;
    default:
      return fail("cudaFuncSetAttribute",
                  hiber::error(ErrorCode::kNotSupported, "cudaFuncSetAttribute(",
                               static_cast<int>(attr), ", ", value, ") on ", (*kernel)->name,
                               " is not supported (cluster attributes cannot be forwarded)"));
  }
}

cudaError_t hiber_entry::cudaFuncSetCacheConfig(const void* func, cudaFuncCache config) {
  auto kernel = func_kernel(func);
  if (!kernel.ok()) return fail("cudaFuncSetCacheConfig", kernel.status());
  if (config < cudaFuncCachePreferNone || config > cudaFuncCachePreferEqual) {
    return invalid("cudaFuncSetCacheConfig");
  }
  (*kernel)->cache_config = config;  // a preference the driver may ignore, as CUDA says
  return cudaSuccess;
}

cudaError_t hiber_entry::cudaOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(
    int* blocks, const void* func, int block_size, size_t shared_bytes, unsigned int) {
  if (blocks == nullptr || block_size <= 0) {
    return invalid("cudaOccupancyMaxActiveBlocksPerMultiprocessor", "bad arguments");
  }
  auto kernel = func_kernel(func);
  if (!kernel.ok()) return fail("cudaOccupancyMaxActiveBlocksPerMultiprocessor", kernel.status());
  *blocks = Client::get().max_active_blocks(current_device(), block_size, shared_bytes);
  return cudaSuccess;
}

cudaError_t hiber_entry::cudaOccupancyMaxActiveBlocksPerMultiprocessor(int* blocks,
                                                                       const void* func,
                                                                       int block_size,
                                                                       size_t shared_bytes) {
  return cudaOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(blocks, func, block_size,
                                                                shared_bytes, 0);
}

cudaError_t hiber_entry::cudaOccupancyAvailableDynamicSMemPerBlock(size_t* bytes, const void* func,
                                                                   int blocks_per_sm,
                                                                   int block_size) {
  if (bytes == nullptr || blocks_per_sm <= 0 || block_size <= 0) {
    return invalid("cudaOccupancyAvailableDynamicSMemPerBlock", "bad arguments");
  }
  auto kernel = func_kernel(func);
  if (!kernel.ok()) return fail("cudaOccupancyAvailableDynamicSMemPerBlock", kernel.status());
  if (Client::get().max_active_blocks(current_device(), block_size, 0) < blocks_per_sm) {
    *bytes = 0;
    return cudaSuccess;
  }
  const auto per_sm = static_cast<size_t>(Client::get().device_attribute(
      current_device(), CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR));
  const auto per_block = static_cast<size_t>(Client::get().device_attribute(
      current_device(), CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN));
  *bytes = std::min(per_sm / blocks_per_sm, per_block);
  return cudaSuccess;
}

// ---- Host functions (run by the shim's host-call thread, in stream order; client.h) ----

cudaError_t hiber_entry::cudaLaunchHostFunc(cudaStream_t stream, cudaHostFn_t fn, void* data) {
  if (fn == nullptr) return invalid("cudaLaunchHostFunc", "null function");
  auto s = Client::get().stream(stream);
  if (!s.ok()) return fail("cudaLaunchHostFunc", s.status());
  // As CUDA documents, not called at all once the stream's work has failed.
  return done("cudaLaunchHostFunc",
              Client::get().launch_host_function(*s, [fn, data](const Status& status) {
                if (status.ok()) fn(data);
              }));
}

cudaError_t hiber_entry::cudaStreamAddCallback(cudaStream_t stream, cudaStreamCallback_t callback,
                                               void* data, unsigned int flags) {
  if (callback == nullptr || flags != 0) return invalid("cudaStreamAddCallback");
  auto s = Client::get().stream(stream);
  if (!s.ok()) return fail("cudaStreamAddCallback", s.status());
  // Called with the stream's status, success or the error of its work, as CUDA does.
  return done(
      "cudaStreamAddCallback",
      Client::get().launch_host_function(*s, [stream, callback, data](const Status& status) {
        callback(stream, static_cast<cudaError_t>(status.code()), data);
      }));
}

// ---- Profiler: no profiler is ever attached, so these succeed and do nothing, as the real
// runtime's do without one ----

cudaError_t hiber_entry::cudaProfilerStart(void) { return cudaSuccess; }
cudaError_t hiber_entry::cudaProfilerStop(void) { return cudaSuccess; }

// ---- Driver entry points ----

cudaError_t hiber_entry::cudaGetDriverEntryPointByVersion(const char* symbol, void** function,
                                                          unsigned int version,
                                                          unsigned long long flags,
                                                          cudaDriverEntryPointQueryResult* status) {
  if (symbol == nullptr || function == nullptr) {
    return invalid("cudaGetDriverEntryPoint", "null pointer");
  }
  (void)flags;
  *function = hiber::shim::driver_entry_point(symbol, static_cast<int>(version));
  if (status) {
    *status = *function ? cudaDriverEntryPointSuccess : cudaDriverEntryPointSymbolNotFound;
  }
  return cudaSuccess;
}

cudaError_t hiber_entry::cudaGetDriverEntryPoint(const char* symbol, void** function,
                                                 unsigned long long flags,
                                                 cudaDriverEntryPointQueryResult* status) {
  return hiber_entry::cudaGetDriverEntryPointByVersion(symbol, function, CUDA_VERSION, flags,
                                                       status);
}

// ---- Per-thread default stream variants (--default-stream per-thread) ----
// The session has one default stream; per-thread default streams map onto it, which orders
// more than CUDA does, never less.

cudaError_t hiber_entry::cudaMemcpyAsync_ptsz(void* d, const void* s, size_t n, cudaMemcpyKind k,
                                              cudaStream_t st) {
  return hiber_entry::cudaMemcpyAsync(d, s, n, k, st);
}
cudaError_t hiber_entry::cudaMemsetAsync_ptsz(void* d, int v, size_t n, cudaStream_t st) {
  return hiber_entry::cudaMemsetAsync(d, v, n, st);
}
cudaError_t hiber_entry::cudaMemcpy_ptds(void* d, const void* s, size_t n, cudaMemcpyKind k) {
  return hiber_entry::cudaMemcpy(d, s, n, k);
}
cudaError_t hiber_entry::cudaMemset_ptds(void* d, int v, size_t n) { return cudaMemset(d, v, n); }
cudaError_t hiber_entry::cudaLaunchKernel_ptsz(const void* f, dim3 g, dim3 b, void** a, size_t sh,
                                               cudaStream_t st) {
  return hiber_entry::cudaLaunchKernel(f, g, b, a, sh, st);
}
cudaError_t hiber_entry::cudaLaunchKernelExC_ptsz(const cudaLaunchConfig_t* c, const void* f,
                                                  void** a) {
  return hiber_entry::cudaLaunchKernelExC(c, f, a);
}
cudaError_t hiber_entry::cudaStreamSynchronize_ptsz(cudaStream_t s) {
  return hiber_entry::cudaStreamSynchronize(s);
}
cudaError_t hiber_entry::cudaLaunchHostFunc_ptsz(cudaStream_t s, cudaHostFn_t fn, void* data) {
  return hiber_entry::cudaLaunchHostFunc(s, fn, data);
}
cudaError_t hiber_entry::cudaStreamAddCallback_ptsz(cudaStream_t s, cudaStreamCallback_t cb,
                                                    void* data, unsigned int flags) {
  return hiber_entry::cudaStreamAddCallback(s, cb, data, flags);
}
cudaError_t hiber_entry::cudaStreamQuery_ptsz(cudaStream_t s) {
  return hiber_entry::cudaStreamQuery(s);
}
cudaError_t hiber_entry::cudaStreamWaitEvent_ptsz(cudaStream_t s, cudaEvent_t e, unsigned int f) {
  return hiber_entry::cudaStreamWaitEvent(s, e, f);
}
cudaError_t hiber_entry::cudaStreamGetPriority_ptsz(cudaStream_t s, int* p) {
  return hiber_entry::cudaStreamGetPriority(s, p);
}
cudaError_t hiber_entry::cudaStreamGetFlags_ptsz(cudaStream_t s, unsigned int* f) {
  return hiber_entry::cudaStreamGetFlags(s, f);
}
cudaError_t hiber_entry::cudaStreamIsCapturing_ptsz(cudaStream_t s, cudaStreamCaptureStatus* c) {
  return hiber_entry::cudaStreamIsCapturing(s, c);
}
cudaError_t hiber_entry::cudaEventRecord_ptsz(cudaEvent_t e, cudaStream_t s) {
  return hiber_entry::cudaEventRecord(e, s);
}
cudaError_t hiber_entry::cudaEventRecordWithFlags_ptsz(cudaEvent_t e, cudaStream_t s,
                                                       unsigned int f) {
  return hiber_entry::cudaEventRecordWithFlags(e, s, f);
}
cudaError_t hiber_entry::cudaGetDriverEntryPoint_ptsz(const char* s, void** f,
                                                      unsigned long long fl,
                                                      cudaDriverEntryPointQueryResult* st) {
  return hiber_entry::cudaGetDriverEntryPoint(s, f, fl, st);
}
cudaError_t hiber_entry::cudaGetDriverEntryPointByVersion_ptsz(
    const char* s, void** f, unsigned int v, unsigned long long fl,
    cudaDriverEntryPointQueryResult* st) {
  return hiber_entry::cudaGetDriverEntryPointByVersion(s, f, v, fl, st);
}

namespace hiber::shim {
cudaError_t launch_registered(const void* kernel, dim3 grid, dim3 block, void** args, size_t shared,
                              cudaStream_t stream) {
  return launch_impl("__cudaLaunchKernel", kernel, grid, block, args, shared, stream, true);
}
}  // namespace hiber::shim
