// The entry points of the stream-ordered allocator (runtime and driver: cudaMallocAsync,
// cuMemAllocAsync, the memory pools) and of client virtual memory management (cuMemCreate,
// cuMemMap, ...), on the client core (client_pools.cc, client_vmm.cc). Exporting memory to
// other processes is refused: a function's memory lives in hiberd.
#include <cuda.h>
#include <cuda_runtime_api.h>

#include "client_shim/api_support.h"
#include "client_shim/cuda_entry_decls.h"
#include "client_shim/cudart_entry_decls.h"

using hiber::ErrorCode;
using hiber::Status;
using hiber::shim::Client;
using hiber::shim::MemPoolObj;
using hiber::shim::PhysicalObj;
using hiber::shim::StreamObj;

namespace {

// Both APIs share the codes the core produces (api_support.h), so one integer type serves.
int fail_with(const char* name, const Status& status) { return hiber::shim::failed(name, status); }
int done_with(const char* name, const Status& status) {
  return status.ok() ? 0 : fail_with(name, status);
}
int invalid_with(const char* name, const char* why) {
  return fail_with(name, Status(ErrorCode::kInvalidValue, why));
}

Status exporting_unsupported() {
  return Status(ErrorCode::kNotSupported,
                "exporting memory to other processes is not supported: a function's device "
                "memory lives in hiberd, and no other process may open it");
}

// The one device a function sees is its primary location; anything else is invalid.
Status check_location(int type, int id, const char* what) {
  if (type != CU_MEM_LOCATION_TYPE_DEVICE || id != 0) {
    return hiber::error(ErrorCode::kInvalidValue, what, ": location type ", type, " id ", id,
                        " (a function has one device, 0)");
  }
  return Status();
}

// ---- Stream-ordered allocation ----

int malloc_async(const char* name, void** pointer, size_t bytes, void* pool_handle, void* stream) {
  if (pointer == nullptr) return invalid_with(name, "null pointer");
  *pointer = nullptr;
  auto s = Client::get().stream(stream);
  if (!s.ok()) return fail_with(name, s.status());
  MemPoolObj* pool = nullptr;
  if (pool_handle != nullptr) {
    auto found = Client::get().mem_pool(pool_handle);
    if (!found.ok()) return fail_with(name, found.status());
    pool = *found;
  }
  auto address = Client::get().malloc_async(bytes, pool, *s);
  if (!address.ok()) return fail_with(name, address.status());
  *pointer = reinterpret_cast<void*>(*address);
  return 0;
}

int free_async(const char* name, uint64_t pointer, void* stream) {
  auto s = Client::get().stream(stream);
  if (!s.ok()) return fail_with(name, s.status());
  return done_with(name, Client::get().free_async(pointer, *s));
}

int pool_out(const char* name, void** out, hiber::Result<MemPoolObj*> pool) {
  if (out == nullptr) return invalid_with(name, "null pointer");
  if (!pool.ok()) return fail_with(name, pool.status());
  *out = *pool;
  return 0;
}

int pool_create(const char* name, void** out, int alloc_type, int handle_types, int location_type,
                int location_id) {
  if (out == nullptr) return invalid_with(name, "null pointer");
  if (alloc_type != CU_MEM_ALLOCATION_TYPE_PINNED) {
    return invalid_with(name, "only pinned (device) allocation pools exist");
  }
  // Exportable pools are made (PyTorch asks for them); exporting one is what is refused.
  (void)handle_types;
  if (Status at = check_location(location_type, location_id, name); !at.ok()) {
    return fail_with(name, at);
  }
  return pool_out(name, out, Client::get().create_mem_pool());
}

template <typename Op>
int with_pool(const char* name, void* handle, Op op) {
  auto pool = Client::get().mem_pool(handle);
  if (!pool.ok()) return fail_with(name, pool.status());
  return done_with(name, op(*pool));
}

// cudaMemAccessDesc and CUmemAccessDesc share a layout: {location {type, id}, flags}.
template <typename Desc>
int check_access(const char* name, const Desc* descs, size_t count) {
  if (count != 0 && descs == nullptr) return invalid_with(name, "null access descriptors");
  for (size_t i = 0; i < count; ++i) {
    if (Status at =
            check_location(static_cast<int>(descs[i].location.type), descs[i].location.id, name);
        !at.ok()) {
      return fail_with(name, at);
    }
    if (static_cast<int>(descs[i].flags) != CU_MEM_ACCESS_FLAGS_PROT_READWRITE) {
      return fail_with(name, Status(ErrorCode::kNotSupported,
                                    "the function's device memory is read-write from its device; "
                                    "other access is not supported"));
    }
  }
  return 0;
}

}  // namespace

// ---- The runtime ----

cudaError_t hiber_entry::cudaMallocAsync(void** pointer, size_t bytes, cudaStream_t stream) {
  return static_cast<cudaError_t>(malloc_async("cudaMallocAsync", pointer, bytes, nullptr, stream));
}
cudaError_t hiber_entry::cudaMallocAsync_ptsz(void** pointer, size_t bytes, cudaStream_t stream) {
  return hiber_entry::cudaMallocAsync(pointer, bytes, stream);
}
cudaError_t hiber_entry::cudaMallocFromPoolAsync(void** pointer, size_t bytes, cudaMemPool_t pool,
                                                 cudaStream_t stream) {
  if (pool == nullptr)
    return static_cast<cudaError_t>(invalid_with("cudaMallocFromPoolAsync", "null pool"));
  return static_cast<cudaError_t>(
      malloc_async("cudaMallocFromPoolAsync", pointer, bytes, pool, stream));
}
cudaError_t hiber_entry::cudaMallocFromPoolAsync_ptsz(void** pointer, size_t bytes,
                                                      cudaMemPool_t pool, cudaStream_t stream) {
  return hiber_entry::cudaMallocFromPoolAsync(pointer, bytes, pool, stream);
}
cudaError_t hiber_entry::cudaFreeAsync(void* pointer, cudaStream_t stream) {
  return static_cast<cudaError_t>(
      free_async("cudaFreeAsync", reinterpret_cast<uint64_t>(pointer), stream));
}
cudaError_t hiber_entry::cudaFreeAsync_ptsz(void* pointer, cudaStream_t stream) {
  return hiber_entry::cudaFreeAsync(pointer, stream);
}

cudaError_t hiber_entry::cudaDeviceGetDefaultMemPool(cudaMemPool_t* pool, int device) {
  return static_cast<cudaError_t>(pool_out("cudaDeviceGetDefaultMemPool",
                                           reinterpret_cast<void**>(pool),
                                           Client::get().default_mem_pool(device)));
}
cudaError_t hiber_entry::cudaDeviceGetMemPool(cudaMemPool_t* pool, int device) {
  return static_cast<cudaError_t>(pool_out("cudaDeviceGetMemPool", reinterpret_cast<void**>(pool),
                                           Client::get().current_mem_pool(device)));
}
cudaError_t hiber_entry::cudaDeviceSetMemPool(int device, cudaMemPool_t pool) {
  return static_cast<cudaError_t>(with_pool("cudaDeviceSetMemPool", pool, [&](MemPoolObj* p) {
    return Client::get().set_current_mem_pool(device, p);
  }));
}
cudaError_t hiber_entry::cudaMemPoolCreate(cudaMemPool_t* pool, const cudaMemPoolProps* props) {
  if (props == nullptr)
    return static_cast<cudaError_t>(invalid_with("cudaMemPoolCreate", "null properties"));
  return static_cast<cudaError_t>(pool_create("cudaMemPoolCreate", reinterpret_cast<void**>(pool),
                                              props->allocType, props->handleTypes,
                                              props->location.type, props->location.id));
}
cudaError_t hiber_entry::cudaMemPoolDestroy(cudaMemPool_t pool) {
  return static_cast<cudaError_t>(with_pool(
      "cudaMemPoolDestroy", pool, [](MemPoolObj* p) { return Client::get().destroy_mem_pool(p); }));
}
cudaError_t hiber_entry::cudaMemPoolSetAttribute(cudaMemPool_t pool, cudaMemPoolAttr attr,
                                                 void* value) {
  return static_cast<cudaError_t>(with_pool("cudaMemPoolSetAttribute", pool, [&](MemPoolObj* p) {
    return Client::get().mem_pool_attribute(p, attr, value, /*set=*/true);
  }));
}
cudaError_t hiber_entry::cudaMemPoolGetAttribute(cudaMemPool_t pool, cudaMemPoolAttr attr,
                                                 void* value) {
  return static_cast<cudaError_t>(with_pool("cudaMemPoolGetAttribute", pool, [&](MemPoolObj* p) {
    return Client::get().mem_pool_attribute(p, attr, value, /*set=*/false);
  }));
}
cudaError_t hiber_entry::cudaMemPoolTrimTo(cudaMemPool_t pool, size_t keep_bytes) {
  return static_cast<cudaError_t>(with_pool("cudaMemPoolTrimTo", pool, [&](MemPoolObj* p) {
    return Client::get().trim_mem_pool(p, keep_bytes);
  }));
}
cudaError_t hiber_entry::cudaMemPoolSetAccess(cudaMemPool_t pool, const cudaMemAccessDesc* descs,
                                              size_t count) {
  if (!Client::get().mem_pool(pool).ok()) {
    return static_cast<cudaError_t>(invalid_with("cudaMemPoolSetAccess", "unknown pool"));
  }
  return static_cast<cudaError_t>(check_access("cudaMemPoolSetAccess", descs, count));
}
cudaError_t hiber_entry::cudaMemPoolGetAccess(cudaMemAccessFlags* flags, cudaMemPool_t pool,
                                              cudaMemLocation* location) {
  if (flags == nullptr || location == nullptr || !Client::get().mem_pool(pool).ok()) {
    return static_cast<cudaError_t>(invalid_with("cudaMemPoolGetAccess", "invalid argument"));
  }
  *flags = location->type == cudaMemLocationTypeDevice && location->id == 0
               ? cudaMemAccessFlagsProtReadWrite
               : cudaMemAccessFlagsProtNone;
  return cudaSuccess;
}
cudaError_t hiber_entry::cudaMemPoolExportToShareableHandle(void*, cudaMemPool_t,
                                                            cudaMemAllocationHandleType,
                                                            unsigned int) {
  return static_cast<cudaError_t>(
      fail_with("cudaMemPoolExportToShareableHandle", exporting_unsupported()));
}
cudaError_t hiber_entry::cudaMemPoolImportFromShareableHandle(cudaMemPool_t*, void*,
                                                              cudaMemAllocationHandleType,
                                                              unsigned int) {
  return static_cast<cudaError_t>(
      fail_with("cudaMemPoolImportFromShareableHandle", exporting_unsupported()));
}
cudaError_t hiber_entry::cudaMemPoolExportPointer(cudaMemPoolPtrExportData*, void*) {
  return static_cast<cudaError_t>(fail_with("cudaMemPoolExportPointer", exporting_unsupported()));
}
cudaError_t hiber_entry::cudaMemPoolImportPointer(void**, cudaMemPool_t,
                                                  cudaMemPoolPtrExportData*) {
  return static_cast<cudaError_t>(fail_with("cudaMemPoolImportPointer", exporting_unsupported()));
}

// ---- The driver: stream-ordered allocation ----

CUresult hiber_entry::cuMemAllocAsync(CUdeviceptr* pointer, size_t bytes, CUstream stream) {
  void* address = nullptr;
  const int r =
      malloc_async("cuMemAllocAsync", pointer ? &address : nullptr, bytes, nullptr, stream);
  if (pointer) *pointer = reinterpret_cast<CUdeviceptr>(address);
  return static_cast<CUresult>(r);
}
CUresult hiber_entry::cuMemAllocAsync_ptsz(CUdeviceptr* pointer, size_t bytes, CUstream stream) {
  return hiber_entry::cuMemAllocAsync(pointer, bytes, stream);
}
CUresult hiber_entry::cuMemAllocFromPoolAsync(CUdeviceptr* pointer, size_t bytes, CUmemoryPool pool,
                                              CUstream stream) {
  if (pool == nullptr)
    return static_cast<CUresult>(invalid_with("cuMemAllocFromPoolAsync", "null pool"));
  void* address = nullptr;
  const int r =
      malloc_async("cuMemAllocFromPoolAsync", pointer ? &address : nullptr, bytes, pool, stream);
  if (pointer) *pointer = reinterpret_cast<CUdeviceptr>(address);
  return static_cast<CUresult>(r);
}
CUresult hiber_entry::cuMemAllocFromPoolAsync_ptsz(CUdeviceptr* pointer, size_t bytes,
                                                   CUmemoryPool pool, CUstream stream) {
  return hiber_entry::cuMemAllocFromPoolAsync(pointer, bytes, pool, stream);
}
CUresult hiber_entry::cuMemFreeAsync(CUdeviceptr pointer, CUstream stream) {
  return static_cast<CUresult>(free_async("cuMemFreeAsync", pointer, stream));
}
CUresult hiber_entry::cuMemFreeAsync_ptsz(CUdeviceptr pointer, CUstream stream) {
  return hiber_entry::cuMemFreeAsync(pointer, stream);
}
// The driver's pools are the runtime's (a CUmemoryPool is a cudaMemPool_t; the attribute,
// access and location enumerations and structs share their values and layouts).
CUresult hiber_entry::cuDeviceGetDefaultMemPool(CUmemoryPool* pool, CUdevice device) {
  return static_cast<CUresult>(
      hiber_entry::cudaDeviceGetDefaultMemPool(reinterpret_cast<cudaMemPool_t*>(pool), device));
}
CUresult hiber_entry::cuDeviceGetMemPool(CUmemoryPool* pool, CUdevice device) {
  return static_cast<CUresult>(
      hiber_entry::cudaDeviceGetMemPool(reinterpret_cast<cudaMemPool_t*>(pool), device));
}
CUresult hiber_entry::cuDeviceSetMemPool(CUdevice device, CUmemoryPool pool) {
  return static_cast<CUresult>(
      hiber_entry::cudaDeviceSetMemPool(device, reinterpret_cast<cudaMemPool_t>(pool)));
}
CUresult hiber_entry::cuMemPoolCreate(CUmemoryPool* pool, const CUmemPoolProps* props) {
  if (props == nullptr) {
    return static_cast<CUresult>(invalid_with("cuMemPoolCreate", "null properties"));
  }
  return static_cast<CUresult>(pool_create("cuMemPoolCreate", reinterpret_cast<void**>(pool),
                                           props->allocType, props->handleTypes,
                                           props->location.type, props->location.id));
}
CUresult hiber_entry::cuMemPoolDestroy(CUmemoryPool pool) {
  return static_cast<CUresult>(
      hiber_entry::cudaMemPoolDestroy(reinterpret_cast<cudaMemPool_t>(pool)));
}
CUresult hiber_entry::cuMemPoolSetAttribute(CUmemoryPool pool, CUmemPool_attribute attr,
                                            void* value) {
  return static_cast<CUresult>(hiber_entry::cudaMemPoolSetAttribute(
      reinterpret_cast<cudaMemPool_t>(pool), static_cast<cudaMemPoolAttr>(attr), value));
}
CUresult hiber_entry::cuMemPoolGetAttribute(CUmemoryPool pool, CUmemPool_attribute attr,
                                            void* value) {
  return static_cast<CUresult>(hiber_entry::cudaMemPoolGetAttribute(
      reinterpret_cast<cudaMemPool_t>(pool), static_cast<cudaMemPoolAttr>(attr), value));
}
CUresult hiber_entry::cuMemPoolTrimTo(CUmemoryPool pool, size_t keep_bytes) {
  return static_cast<CUresult>(
      hiber_entry::cudaMemPoolTrimTo(reinterpret_cast<cudaMemPool_t>(pool), keep_bytes));
}
CUresult hiber_entry::cuMemPoolSetAccess(CUmemoryPool pool, const CUmemAccessDesc* descs,
                                         size_t count) {
  if (!Client::get().mem_pool(pool).ok()) {
    return static_cast<CUresult>(invalid_with("cuMemPoolSetAccess", "unknown pool"));
  }
  return static_cast<CUresult>(check_access("cuMemPoolSetAccess", descs, count));
}
CUresult hiber_entry::cuMemPoolGetAccess(CUmemAccess_flags* flags, CUmemoryPool pool,
                                         CUmemLocation* location) {
  return static_cast<CUresult>(hiber_entry::cudaMemPoolGetAccess(
      reinterpret_cast<cudaMemAccessFlags*>(flags), reinterpret_cast<cudaMemPool_t>(pool),
      reinterpret_cast<cudaMemLocation*>(location)));
}
CUresult hiber_entry::cuMemPoolExportToShareableHandle(void*, CUmemoryPool,
                                                       CUmemAllocationHandleType,
                                                       unsigned long long) {
  return static_cast<CUresult>(
      fail_with("cuMemPoolExportToShareableHandle", exporting_unsupported()));
}
CUresult hiber_entry::cuMemPoolImportFromShareableHandle(CUmemoryPool*, void*,
                                                         CUmemAllocationHandleType,
                                                         unsigned long long) {
  return static_cast<CUresult>(
      fail_with("cuMemPoolImportFromShareableHandle", exporting_unsupported()));
}
CUresult hiber_entry::cuMemPoolExportPointer(CUmemPoolPtrExportData*, CUdeviceptr) {
  return static_cast<CUresult>(fail_with("cuMemPoolExportPointer", exporting_unsupported()));
}
CUresult hiber_entry::cuMemPoolImportPointer(CUdeviceptr*, CUmemoryPool, CUmemPoolPtrExportData*) {
  return static_cast<CUresult>(fail_with("cuMemPoolImportPointer", exporting_unsupported()));
}

// ---- The driver: virtual memory management ----

CUresult hiber_entry::cuMemGetAllocationGranularity(size_t* granularity,
                                                    const CUmemAllocationProp* prop,
                                                    CUmemAllocationGranularity_flags) {
  if (granularity == nullptr || prop == nullptr) {
    return static_cast<CUresult>(invalid_with("cuMemGetAllocationGranularity", "null pointer"));
  }
  if (Status at =
          check_location(prop->location.type, prop->location.id, "cuMemGetAllocationGranularity");
      !at.ok()) {
    return static_cast<CUresult>(fail_with("cuMemGetAllocationGranularity", at));
  }
  // The pool's granularity, minimum and recommended alike: hiberd maps the function's memory
  // in whole granules.
  *granularity = Client::get().allocation_granularity();
  return *granularity == 0 ? static_cast<CUresult>(
                                 fail_with("cuMemGetAllocationGranularity", Client::get().ready()))
                           : CUDA_SUCCESS;
}
CUresult hiber_entry::cuMemAddressReserve(CUdeviceptr* pointer, size_t bytes, size_t alignment,
                                          CUdeviceptr, unsigned long long) {
  if (pointer == nullptr)
    return static_cast<CUresult>(invalid_with("cuMemAddressReserve", "null pointer"));
  auto address = Client::get().reserve_address(bytes, alignment);
  if (!address.ok())
    return static_cast<CUresult>(fail_with("cuMemAddressReserve", address.status()));
  *pointer = *address;
  return CUDA_SUCCESS;
}
CUresult hiber_entry::cuMemAddressFree(CUdeviceptr pointer, size_t bytes) {
  return static_cast<CUresult>(
      done_with("cuMemAddressFree", Client::get().free_address(pointer, bytes)));
}
CUresult hiber_entry::cuMemCreate(CUmemGenericAllocationHandle* handle, size_t bytes,
                                  const CUmemAllocationProp* prop, unsigned long long) {
  constexpr const char* kName = "cuMemCreate";
  if (handle == nullptr || prop == nullptr)
    return static_cast<CUresult>(invalid_with(kName, "null pointer"));
  if (prop->type != CU_MEM_ALLOCATION_TYPE_PINNED) {
    return static_cast<CUresult>(invalid_with(kName, "only pinned (device) allocations exist"));
  }
  // An exportable allocation is made (PyTorch's expandable segments ask for POSIX descriptors);
  // exporting it is what is refused (cuMemExportToShareableHandle).
  if (Status at = check_location(prop->location.type, prop->location.id, kName); !at.ok()) {
    return static_cast<CUresult>(fail_with(kName, at));
  }
  auto physical = Client::get().create_physical(bytes);
  if (!physical.ok()) return static_cast<CUresult>(fail_with(kName, physical.status()));
  *handle = reinterpret_cast<CUmemGenericAllocationHandle>(*physical);
  return CUDA_SUCCESS;
}
CUresult hiber_entry::cuMemRelease(CUmemGenericAllocationHandle handle) {
  auto physical = Client::get().physical(handle);
  if (!physical.ok()) return static_cast<CUresult>(fail_with("cuMemRelease", physical.status()));
  return static_cast<CUresult>(
      done_with("cuMemRelease", Client::get().release_physical(*physical)));
}
CUresult hiber_entry::cuMemMap(CUdeviceptr pointer, size_t bytes, size_t offset,
                               CUmemGenericAllocationHandle handle, unsigned long long flags) {
  if (flags != 0) return static_cast<CUresult>(invalid_with("cuMemMap", "flags must be 0"));
  auto physical = Client::get().physical(handle);
  if (!physical.ok()) return static_cast<CUresult>(fail_with("cuMemMap", physical.status()));
  return static_cast<CUresult>(
      done_with("cuMemMap", Client::get().map_physical(pointer, bytes, offset, *physical)));
}
CUresult hiber_entry::cuMemUnmap(CUdeviceptr pointer, size_t bytes) {
  return static_cast<CUresult>(done_with("cuMemUnmap", Client::get().unmap_range(pointer, bytes)));
}
CUresult hiber_entry::cuMemSetAccess(CUdeviceptr pointer, size_t bytes,
                                     const CUmemAccessDesc* descs, size_t count) {
  if (int r = check_access("cuMemSetAccess", descs, count); r != 0) return static_cast<CUresult>(r);
  return static_cast<CUresult>(
      done_with("cuMemSetAccess", Client::get().check_mapped(pointer, bytes, "cuMemSetAccess")));
}
CUresult hiber_entry::cuMemGetAccess(unsigned long long* flags, const CUmemLocation* location,
                                     CUdeviceptr pointer) {
  if (flags == nullptr || location == nullptr) {
    return static_cast<CUresult>(invalid_with("cuMemGetAccess", "null pointer"));
  }
  if (Status mapped = Client::get().check_mapped(pointer, 1, "cuMemGetAccess"); !mapped.ok()) {
    return static_cast<CUresult>(fail_with("cuMemGetAccess", mapped));
  }
  *flags = location->type == CU_MEM_LOCATION_TYPE_DEVICE && location->id == 0
               ? CU_MEM_ACCESS_FLAGS_PROT_READWRITE
               : CU_MEM_ACCESS_FLAGS_PROT_NONE;
  return CUDA_SUCCESS;
}
CUresult hiber_entry::cuMemGetAllocationPropertiesFromHandle(CUmemAllocationProp* prop,
                                                             CUmemGenericAllocationHandle handle) {
  if (prop == nullptr) {
    return static_cast<CUresult>(
        invalid_with("cuMemGetAllocationPropertiesFromHandle", "null pointer"));
  }
  auto physical = Client::get().physical(handle);
  if (!physical.ok()) {
    return static_cast<CUresult>(
        fail_with("cuMemGetAllocationPropertiesFromHandle", physical.status()));
  }
  *prop = CUmemAllocationProp{};
  prop->type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop->requestedHandleTypes = CU_MEM_HANDLE_TYPE_NONE;
  prop->location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop->location.id = 0;
  return CUDA_SUCCESS;
}
CUresult hiber_entry::cuMemRetainAllocationHandle(CUmemGenericAllocationHandle* handle,
                                                  void* address) {
  if (handle == nullptr) {
    return static_cast<CUresult>(invalid_with("cuMemRetainAllocationHandle", "null pointer"));
  }
  auto physical = Client::get().physical_at(reinterpret_cast<uint64_t>(address));
  if (!physical.ok()) {
    return static_cast<CUresult>(fail_with("cuMemRetainAllocationHandle", physical.status()));
  }
  *handle = reinterpret_cast<CUmemGenericAllocationHandle>(*physical);
  return CUDA_SUCCESS;
}
CUresult hiber_entry::cuMemExportToShareableHandle(void*, CUmemGenericAllocationHandle,
                                                   CUmemAllocationHandleType, unsigned long long) {
  return static_cast<CUresult>(fail_with("cuMemExportToShareableHandle", exporting_unsupported()));
}
CUresult hiber_entry::cuMemImportFromShareableHandle(CUmemGenericAllocationHandle*, void*,
                                                     CUmemAllocationHandleType) {
  return static_cast<CUresult>(
      fail_with("cuMemImportFromShareableHandle", exporting_unsupported()));
}
