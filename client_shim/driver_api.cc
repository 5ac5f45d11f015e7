// The driver API functions that programs and libraries call directly (PyTorch's DriverAPI,
// NVRTC-compiled kernels, cuGetProcAddress users), on the same client core as the runtime.
// cuda.h renames most of these to their newest "_vN" symbol, so each definition below is the
// current ABI; older names fall through to the loudly failing stubs.
#include <cuda.h>
#include <dlfcn.h>

#include <cstring>
#include <string>

#include "client_shim/api_support.h"
#include "client_shim/driver_table.h"

using hiber::ErrorCode;
using hiber::Status;
using hiber::shim::Client;
using hiber::shim::CopyKind;
using hiber::shim::traced;

namespace {

constexpr auto& fail = hiber::shim::fail<CUresult>;
constexpr auto& done = hiber::shim::done<CUresult>;
constexpr auto& invalid = hiber::shim::invalid<CUresult>;

// The primary context of the session's devices: one object, handed out as CUcontext.
struct PrimaryContext {
  int device = 0;
};
PrimaryContext primary_contexts[64];

bool initialized = false;

CUresult check_device(const char* name, CUdevice device) {
  if (!initialized) return fail(name, Status(ErrorCode::kNotInitialized, "cuInit was not called"));
  const int count = Client::get().device_count();
  if (device < 0 || device >= count || device >= 64) {
    return fail(name,
                hiber::error(ErrorCode::kInvalidDevice, "device ", device, " does not exist"));
  }
  return CUDA_SUCCESS;
}

template <typename T>
CUresult resolved(const char* name, hiber::Result<T> result, T* out) {
  if (!result.ok()) return fail(name, result.status());
  *out = *result;
  return CUDA_SUCCESS;
}

CUresult copy(const char* name, void* dst, const void* src, size_t bytes, CopyKind kind,
              CUstream stream, bool async) {
  auto s = Client::get().stream(stream);
  if (!s.ok()) return fail(name, s.status());
  return done(name, Client::get().memcpy(dst, src, bytes, kind, *s, async));
}

CUresult fill(const char* name, CUdeviceptr dst, uint32_t value, int element_bytes, size_t count,
              CUstream stream, bool async) {
  auto s = Client::get().stream(stream);
  if (!s.ok()) return fail(name, s.status());
  return done(name, Client::get().memset(dst, value, element_bytes, count, *s, async));
}

void* dev_ptr(CUdeviceptr p) { return reinterpret_cast<void*>(p); }

}  // namespace

#pragma GCC visibility push(default)
extern "C" {

CUresult cuInit(unsigned int flags) {
  return traced("cuInit", [&] {
    if (flags != 0) return invalid("cuInit");
    Status ready = Client::get().ready();
    if (!ready.ok()) return fail("cuInit", Status(ErrorCode::kNoDevice, ready.message()));
    initialized = true;
    return CUDA_SUCCESS;
  });
}

CUresult cuDriverGetVersion(int* version) {
  if (version == nullptr) return invalid("cuDriverGetVersion");
  *version = CUDA_VERSION;
  return CUDA_SUCCESS;
}

CUresult cuDeviceGetCount(int* count) {
  if (count == nullptr) return invalid("cuDeviceGetCount");
  if (!initialized)
    return fail("cuDeviceGetCount", Status(ErrorCode::kNotInitialized, "cuInit was not called"));
  *count = Client::get().device_count();
  return CUDA_SUCCESS;
}

CUresult cuDeviceGet(CUdevice* device, int ordinal) {
  if (device == nullptr) return invalid("cuDeviceGet");
  if (CUresult r = check_device("cuDeviceGet", ordinal); r != CUDA_SUCCESS) return r;
  *device = ordinal;
  return CUDA_SUCCESS;
}

CUresult cuDeviceGetName(char* name, int length, CUdevice device) {
  if (name == nullptr || length <= 0) return invalid("cuDeviceGetName");
  if (CUresult r = check_device("cuDeviceGetName", device); r != CUDA_SUCCESS) return r;
  std::strncpy(name, Client::get().session()->devices[device].name.c_str(), length - 1);
  name[length - 1] = '\0';
  return CUDA_SUCCESS;
}

CUresult cuDeviceGetUuid(CUuuid* uuid, CUdevice device) {
  if (uuid == nullptr) return invalid("cuDeviceGetUuid");
  if (CUresult r = check_device("cuDeviceGetUuid", device); r != CUDA_SUCCESS) return r;
  const auto& bytes = Client::get().session()->devices[device].uuid;
  std::memset(uuid->bytes, 0, sizeof(uuid->bytes));
  std::memcpy(uuid->bytes, bytes.data(), std::min(bytes.size(), sizeof(uuid->bytes)));
  return CUDA_SUCCESS;
}

CUresult cuDeviceTotalMem(size_t* bytes, CUdevice device) {
  if (bytes == nullptr) return invalid("cuDeviceTotalMem");
  if (CUresult r = check_device("cuDeviceTotalMem", device); r != CUDA_SUCCESS) return r;
  *bytes = Client::get().session()->devices[device].total_memory_bytes;
  return CUDA_SUCCESS;
}

CUresult cuDeviceGetAttribute(int* value, CUdevice_attribute attr, CUdevice device) {
  if (value == nullptr) return invalid("cuDeviceGetAttribute");
  if (CUresult r = check_device("cuDeviceGetAttribute", device); r != CUDA_SUCCESS) return r;
  *value = Client::get().device_attribute(device, attr);
  return CUDA_SUCCESS;
}

CUresult cuDeviceGetPCIBusId(char* bus_id, int length, CUdevice device) {
  if (bus_id == nullptr || length <= 0) return invalid("cuDeviceGetPCIBusId");
  if (CUresult r = check_device("cuDeviceGetPCIBusId", device); r != CUDA_SUCCESS) return r;
  std::strncpy(bus_id, Client::get().session()->devices[device].pci_bus_id.c_str(), length - 1);
  bus_id[length - 1] = '\0';
  return CUDA_SUCCESS;
}

// ---- Contexts: each device has its primary context, always active once cuInit succeeded ----

CUresult cuDevicePrimaryCtxRetain(CUcontext* context, CUdevice device) {
  if (context == nullptr) return invalid("cuDevicePrimaryCtxRetain");
  if (CUresult r = check_device("cuDevicePrimaryCtxRetain", device); r != CUDA_SUCCESS) return r;
  primary_contexts[device].device = device;
  *context = reinterpret_cast<CUcontext>(&primary_contexts[device]);
  return CUDA_SUCCESS;
}

CUresult cuDevicePrimaryCtxRelease(CUdevice device) {
  return check_device("cuDevicePrimaryCtxRelease", device);
}

CUresult cuDevicePrimaryCtxGetState(CUdevice device, unsigned int* flags, int* active) {
  if (flags == nullptr || active == nullptr) return invalid("cuDevicePrimaryCtxGetState");
  if (CUresult r = check_device("cuDevicePrimaryCtxGetState", device); r != CUDA_SUCCESS) return r;
  *flags = 0;
  *active = 1;
  return CUDA_SUCCESS;
}

CUresult cuDevicePrimaryCtxSetFlags(CUdevice device, unsigned int) {
  return check_device("cuDevicePrimaryCtxSetFlags", device);
}

CUresult cuCtxGetCurrent(CUcontext* context) {
  if (context == nullptr) return invalid("cuCtxGetCurrent");
  *context = initialized || Client::get().ready().ok()
                 ? reinterpret_cast<CUcontext>(&primary_contexts[0])
                 : nullptr;
  return CUDA_SUCCESS;
}

CUresult cuCtxSetCurrent(CUcontext context) {
  if (context == nullptr) return CUDA_SUCCESS;
  auto* primary = reinterpret_cast<PrimaryContext*>(context);
  if (primary < primary_contexts || primary >= primary_contexts + 64) {
    return fail("cuCtxSetCurrent", Status(ErrorCode::kInvalidContext, "not a primary context"));
  }
  return CUDA_SUCCESS;
}

CUresult cuCtxGetDevice(CUdevice* device) {
  if (device == nullptr) return invalid("cuCtxGetDevice");
  *device = 0;
  return CUDA_SUCCESS;
}

CUresult cuCtxSynchronize(void) {
  return traced("cuCtxSynchronize",
                [] { return done("cuCtxSynchronize", Client::get().synchronize_device()); });
}

// ---- Errors ----

CUresult cuGetErrorName(CUresult error, const char** name) {
  if (name == nullptr) return invalid("cuGetErrorName");
  *name = hiber::shim::driver_error_name(error);
  return *name ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

CUresult cuGetErrorString(CUresult error, const char** text) {
  if (text == nullptr) return invalid("cuGetErrorString");
  if (hiber::shim::driver_error_name(error) == nullptr) {
    *text = nullptr;
    return CUDA_ERROR_INVALID_VALUE;
  }
  // Driver and runtime codes share values and meanings.
  *text = hiber::shim::runtime_error_string(error);
  return CUDA_SUCCESS;
}

CUresult cuGetProcAddress(const char* symbol, void** function, int version, cuuint64_t flags,
                          CUdriverProcAddressQueryResult* status) {
  return traced("cuGetProcAddress", [&] {
    if (symbol == nullptr || function == nullptr) return invalid("cuGetProcAddress");
    (void)flags;  // per-thread default stream variants map to the same functions
    *function = hiber::shim::driver_entry_point(symbol, version);
    if (status) {
      *status = *function ? CU_GET_PROC_ADDRESS_SUCCESS : CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    }
    return *function ? CUDA_SUCCESS : CUDA_ERROR_NOT_FOUND;
  });
}

// ---- Memory ----

CUresult cuMemGetInfo(size_t* free_bytes, size_t* total_bytes) {
  Status ready = Client::get().ready();
  if (!ready.ok()) return fail("cuMemGetInfo", ready);
  const auto info = Client::get().memory_info();
  if (free_bytes) *free_bytes = info.free_bytes;
  if (total_bytes) *total_bytes = info.total_bytes;
  return CUDA_SUCCESS;
}

CUresult cuMemAlloc(CUdeviceptr* pointer, size_t bytes) {
  return traced("cuMemAlloc", [&] {
    if (pointer == nullptr || bytes == 0) return invalid("cuMemAlloc");
    uint64_t address = 0;
    CUresult r = resolved("cuMemAlloc", Client::get().malloc_device(bytes), &address);
    *pointer = address;
    return r;
  });
}

CUresult cuMemFree(CUdeviceptr pointer) {
  return traced("cuMemFree", [&] { return done("cuMemFree", Client::get().free_device(pointer)); });
}

CUresult cuMemAllocHost(void** pointer, size_t bytes) {
  if (pointer == nullptr) return invalid("cuMemAllocHost");
  return resolved("cuMemAllocHost", Client::get().malloc_host(bytes), pointer);
}

CUresult cuMemHostAlloc(void** pointer, size_t bytes, unsigned int flags) {
  if (flags & CU_MEMHOSTALLOC_DEVICEMAP) {
    return fail("cuMemHostAlloc",
                Status(ErrorCode::kNotSupported,
                       "CU_MEMHOSTALLOC_DEVICEMAP: kernels cannot map client memory"));
  }
  return cuMemAllocHost(pointer, bytes);
}

CUresult cuMemFreeHost(void* pointer) {
  return done("cuMemFreeHost", Client::get().free_host(pointer));
}

CUresult cuMemHostRegister(void* pointer, size_t bytes, unsigned int flags) {
  if (flags & (CU_MEMHOSTREGISTER_DEVICEMAP | CU_MEMHOSTREGISTER_IOMEMORY)) {
    return fail("cuMemHostRegister",
                Status(ErrorCode::kNotSupported, "device-mapped host memory is not supported"));
  }
  return done("cuMemHostRegister", Client::get().register_host(pointer, bytes));
}

CUresult cuMemHostUnregister(void* pointer) {
  return done("cuMemHostUnregister", Client::get().unregister_host(pointer));
}

CUresult cuMemcpyHtoD(CUdeviceptr dst, const void* src, size_t bytes) {
  return copy("cuMemcpyHtoD", dev_ptr(dst), src, bytes, CopyKind::kHostToDevice, nullptr, false);
}
CUresult cuMemcpyDtoH(void* dst, CUdeviceptr src, size_t bytes) {
  return copy("cuMemcpyDtoH", dst, dev_ptr(src), bytes, CopyKind::kDeviceToHost, nullptr, false);
}
CUresult cuMemcpyDtoD(CUdeviceptr dst, CUdeviceptr src, size_t bytes) {
  return copy("cuMemcpyDtoD", dev_ptr(dst), dev_ptr(src), bytes, CopyKind::kDeviceToDevice, nullptr,
              false);
}
CUresult cuMemcpy(CUdeviceptr dst, CUdeviceptr src, size_t bytes) {
  return copy("cuMemcpy", dev_ptr(dst), dev_ptr(src), bytes, CopyKind::kDefault, nullptr, false);
}
CUresult cuMemcpyHtoDAsync(CUdeviceptr dst, const void* src, size_t bytes, CUstream stream) {
  return copy("cuMemcpyHtoDAsync", dev_ptr(dst), src, bytes, CopyKind::kHostToDevice, stream, true);
}
CUresult cuMemcpyDtoHAsync(void* dst, CUdeviceptr src, size_t bytes, CUstream stream) {
  return copy("cuMemcpyDtoHAsync", dst, dev_ptr(src), bytes, CopyKind::kDeviceToHost, stream, true);
}
CUresult cuMemcpyDtoDAsync(CUdeviceptr dst, CUdeviceptr src, size_t bytes, CUstream stream) {
  return copy("cuMemcpyDtoDAsync", dev_ptr(dst), dev_ptr(src), bytes, CopyKind::kDeviceToDevice,
              stream, true);
}
CUresult cuMemcpyAsync(CUdeviceptr dst, CUdeviceptr src, size_t bytes, CUstream stream) {
  return copy("cuMemcpyAsync", dev_ptr(dst), dev_ptr(src), bytes, CopyKind::kDefault, stream, true);
}

CUresult cuMemsetD8(CUdeviceptr dst, unsigned char value, size_t count) {
  return fill("cuMemsetD8", dst, value, 1, count, nullptr, false);
}
CUresult cuMemsetD16(CUdeviceptr dst, unsigned short value, size_t count) {
  return fill("cuMemsetD16", dst, value, 2, count, nullptr, false);
}
CUresult cuMemsetD32(CUdeviceptr dst, unsigned int value, size_t count) {
  return fill("cuMemsetD32", dst, value, 4, count, nullptr, false);
}
CUresult cuMemsetD8Async(CUdeviceptr dst, unsigned char value, size_t count, CUstream stream) {
  return fill("cuMemsetD8Async", dst, value, 1, count, stream, true);
}
CUresult cuMemsetD16Async(CUdeviceptr dst, unsigned short value, size_t count, CUstream stream) {
  return fill("cuMemsetD16Async", dst, value, 2, count, stream, true);
}
CUresult cuMemsetD32Async(CUdeviceptr dst, unsigned int value, size_t count, CUstream stream) {
  return fill("cuMemsetD32Async", dst, value, 4, count, stream, true);
}

// ---- Streams and events ----

CUresult cuStreamCreateWithPriority(CUstream* stream, unsigned int flags, int priority) {
  if (stream == nullptr || (flags & ~CU_STREAM_NON_BLOCKING) != 0) return invalid("cuStreamCreate");
  hiber::shim::StreamObj* created = nullptr;
  CUresult r = resolved("cuStreamCreate", Client::get().create_stream(flags, priority), &created);
  *stream = reinterpret_cast<CUstream>(created);
  return r;
}

CUresult cuStreamCreate(CUstream* stream, unsigned int flags) {
  return cuStreamCreateWithPriority(stream, flags, 0);
}

CUresult cuStreamDestroy(CUstream stream) {
  auto s = Client::get().stream(stream);
  if (!s.ok()) return fail("cuStreamDestroy", s.status());
  return done("cuStreamDestroy", Client::get().destroy_stream(*s));
}

CUresult cuStreamSynchronize(CUstream stream) {
  auto s = Client::get().stream(stream);
  if (!s.ok()) return fail("cuStreamSynchronize", s.status());
  return done("cuStreamSynchronize", Client::get().synchronize_stream(*s));
}

CUresult cuStreamQuery(CUstream stream) {
  auto s = Client::get().stream(stream);
  if (!s.ok()) return fail("cuStreamQuery", s.status());
  return done("cuStreamQuery", Client::get().query_stream(*s));
}

CUresult cuStreamWaitEvent(CUstream stream, CUevent event, unsigned int flags) {
  if (flags != 0) return invalid("cuStreamWaitEvent");
  auto s = Client::get().stream(stream);
  if (!s.ok()) return fail("cuStreamWaitEvent", s.status());
  auto e = Client::get().event(event);
  if (!e.ok()) return fail("cuStreamWaitEvent", e.status());
  return done("cuStreamWaitEvent", Client::get().wait_event(*s, *e));
}

CUresult cuEventCreate(CUevent* event, unsigned int flags) {
  if (event == nullptr || (flags & ~(CU_EVENT_BLOCKING_SYNC | CU_EVENT_DISABLE_TIMING)) != 0) {
    return invalid("cuEventCreate");
  }
  hiber::shim::EventObj* created = nullptr;
  CUresult r = resolved("cuEventCreate", Client::get().create_event(flags), &created);
  *event = reinterpret_cast<CUevent>(created);
  return r;
}

CUresult cuEventDestroy(CUevent event) {
  auto e = Client::get().event(event);
  if (!e.ok()) return fail("cuEventDestroy", e.status());
  return done("cuEventDestroy", Client::get().destroy_event(*e));
}

CUresult cuEventRecord(CUevent event, CUstream stream) {
  auto e = Client::get().event(event);
  if (!e.ok()) return fail("cuEventRecord", e.status());
  auto s = Client::get().stream(stream);
  if (!s.ok()) return fail("cuEventRecord", s.status());
  return done("cuEventRecord", Client::get().record_event(*e, *s));
}

CUresult cuEventSynchronize(CUevent event) {
  auto e = Client::get().event(event);
  if (!e.ok()) return fail("cuEventSynchronize", e.status());
  return done("cuEventSynchronize", Client::get().synchronize_event(*e));
}

CUresult cuEventQuery(CUevent event) {
  auto e = Client::get().event(event);
  if (!e.ok()) return fail("cuEventQuery", e.status());
  return done("cuEventQuery", Client::get().query_event(*e));
}

CUresult cuEventElapsedTime(float* ms, CUevent start, CUevent end) {
  if (ms == nullptr) return invalid("cuEventElapsedTime");
  auto a = Client::get().event(start);
  if (!a.ok()) return fail("cuEventElapsedTime", a.status());
  auto b = Client::get().event(end);
  if (!b.ok()) return fail("cuEventElapsedTime", b.status());
  return resolved("cuEventElapsedTime", Client::get().elapsed_ms(*a, *b), ms);
}

// ---- Modules and launches ----

CUresult cuModuleLoadData(CUmodule* module, const void* image) {
  return traced("cuModuleLoadData", [&] {
    if (module == nullptr || image == nullptr) return invalid("cuModuleLoadData");
    const auto* bytes = static_cast<const std::byte*>(image);
    hiber::shim::ModuleObj* loaded = nullptr;
    CUresult r =
        resolved("cuModuleLoadData",
                 Client::get().load_module({bytes, hiber::shim::code_image_size(image)}), &loaded);
    *module = reinterpret_cast<CUmodule>(loaded);
    return r;
  });
}

CUresult cuModuleLoadDataEx(CUmodule* module, const void* image, unsigned int, CUjit_option*,
                            void**) {
  // JIT options tune PTX compilation in hiberd's driver; they do not change results.
  return cuModuleLoadData(module, image);
}

CUresult cuModuleUnload(CUmodule module) {
  auto m = Client::get().module(module);
  if (!m.ok()) return fail("cuModuleUnload", m.status());
  return done("cuModuleUnload", Client::get().unload_module(*m));
}

CUresult cuModuleGetFunction(CUfunction* function, CUmodule module, const char* name) {
  return traced("cuModuleGetFunction", [&] {
    if (function == nullptr || name == nullptr) return invalid("cuModuleGetFunction");
    auto m = Client::get().module(module);
    if (!m.ok()) return fail("cuModuleGetFunction", m.status());
    hiber::shim::KernelObj* kernel = nullptr;
    CUresult r = resolved("cuModuleGetFunction", Client::get().module_function(*m, name), &kernel);
    *function = reinterpret_cast<CUfunction>(kernel);
    return r;
  });
}

CUresult cuFuncGetParamInfo(CUfunction function, size_t index, size_t* offset, size_t* bytes) {
  if (offset == nullptr || bytes == nullptr) return invalid("cuFuncGetParamInfo");
  auto kernel = Client::get().kernel(function);
  if (!kernel.ok()) return fail("cuFuncGetParamInfo", kernel.status());
  auto info = Client::get().kernel_info(*kernel);
  if (!info.ok()) return fail("cuFuncGetParamInfo", info.status());
  if (index >= (*info)->params.size()) return invalid("cuFuncGetParamInfo");
  *offset = (*info)->params[index].offset;
  *bytes = (*info)->params[index].bytes;
  return CUDA_SUCCESS;
}

CUresult cuLaunchKernel(CUfunction function, unsigned int grid_x, unsigned int grid_y,
                        unsigned int grid_z, unsigned int block_x, unsigned int block_y,
                        unsigned int block_z, unsigned int shared_bytes, CUstream stream,
                        void** params, void** extra) {
  return traced("cuLaunchKernel", [&] {
    if (extra != nullptr) {
      return fail("cuLaunchKernel", Status(ErrorCode::kNotSupported,
                                           "the `extra` parameter buffer form is not supported"));
    }
    if (grid_x == 0 || grid_y == 0 || grid_z == 0 || block_x == 0 || block_y == 0 || block_z == 0) {
      return invalid("cuLaunchKernel");
    }
    auto kernel = Client::get().kernel(function);
    if (!kernel.ok()) return fail("cuLaunchKernel", kernel.status());
    auto s = Client::get().stream(stream);
    if (!s.ok()) return fail("cuLaunchKernel", s.status());
    return done("cuLaunchKernel",
                Client::get().launch(*kernel, {grid_x, grid_y, grid_z}, {block_x, block_y, block_z},
                                     shared_bytes, *s, params));
  });
}

}  // extern "C"
#pragma GCC visibility pop

namespace hiber::shim {

void* driver_entry_point(const char* symbol, int cuda_version) {
  // The shim's own object: every driver function it exports, implemented or stubbed.
  struct Self {
    void* handle = nullptr;
    void* base = nullptr;
  };
  static const Self self = [] {
    Dl_info info{};
    dladdr(reinterpret_cast<void*>(&driver_entry_point), &info);
    return Self{dlopen(info.dli_fname, RTLD_NOW | RTLD_NOLOAD), info.dli_fbase};
  }();
  if (self.handle == nullptr || std::strncmp(symbol, "cu", 2) != 0) return nullptr;
  // cuGetProcAddress changed its signature in 12.0; older callers get the old one.
  if (std::strcmp(symbol, "cuGetProcAddress") == 0 && cuda_version < 12000) {
    return dlsym(self.handle, "cuGetProcAddress");
  }
  for (const char* suffix : {"_v4", "_v3", "_v2", ""}) {
    const std::string name = std::string(symbol) + suffix;
    void* found = dlsym(self.handle, name.c_str());
    // Only the shim's own definitions, never one of a library it depends on.
    Dl_info where{};
    if (found != nullptr && dladdr(found, &where) != 0 && where.dli_fbase == self.base) {
      return found;
    }
  }
  return nullptr;
}

}  // namespace hiber::shim
