// The driver API functions that programs and libraries call directly (PyTorch's DriverAPI,
// NVRTC-compiled kernels, cuGetProcAddress users), on the same client core as the runtime.
// cuda.h renames most of these to their newest "_vN" symbol, so each definition below is the
// current ABI; older names fall through to the loudly failing stubs.
#include <cuda.h>
#include <cudaProfiler.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "client_shim/api_support.h"
#include "client_shim/cuda_entry_decls.h"
#include "client_shim/driver_table.h"
#include "client_shim/thread_context.h"

using hiber::ErrorCode;
using hiber::Status;
using hiber::shim::as_primary;
using hiber::shim::Client;
using hiber::shim::context_stack;
using hiber::shim::CopyKind;
using hiber::shim::current_context;
using hiber::shim::device_of;
using hiber::shim::primary_context;
using hiber::shim::PrimaryContext;

namespace {

constexpr auto& fail = hiber::shim::fail<CUresult>;
constexpr auto& done = hiber::shim::done<CUresult>;
constexpr auto& invalid = hiber::shim::invalid<CUresult>;

bool initialized = false;

// `context`, or the current one when it is null (as cuCtxGetDevice_v2 and its siblings take it).
PrimaryContext* context_or_current(CUcontext context) {
  return as_primary(context != nullptr ? context : current_context());
}

CUresult not_a_context(const char* name) {
  return hiber::shim::fail<CUresult>(name, Status(ErrorCode::kInvalidContext,
                                                  "not a context of this process (the shim has one "
                                                  "primary context per device)"));
}

// The kernel a CUfunction names, or CUDA_ERROR_INVALID_HANDLE.
hiber::Result<hiber::shim::KernelObj*> function_kernel(CUfunction function) {
  auto kernel = Client::get().kernel(function);
  if (!kernel.ok()) return Status(ErrorCode::kInvalidHandle, kernel.status().message());
  return kernel;
}

// cuLink state: the inputs, collected in the client (linking happens on Complete).
struct LinkState {
  std::vector<std::vector<std::byte>> inputs;
  std::vector<CUjitInputType> types;
  std::vector<std::byte> output;
};

CUresult check_device(const char* name, CUdevice device) {
  if (!initialized) return fail(name, Status(ErrorCode::kNotInitialized, "cuInit was not called"));
  const int count = Client::get().device_count();
  if (device < 0 || device >= count || device >= hiber::shim::kMaxDevices) {
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

CUresult hiber_entry::cuInit(unsigned int flags) {
  if (flags != 0) return invalid("cuInit");
  Status ready = Client::get().ready();
  if (!ready.ok()) return fail("cuInit", Status(ErrorCode::kNoDevice, ready.message()));
  initialized = true;
  return CUDA_SUCCESS;
}

CUresult hiber_entry::cuDriverGetVersion(int* version) {
  if (version == nullptr) return invalid("cuDriverGetVersion");
  *version = CUDA_VERSION;
  return CUDA_SUCCESS;
}

CUresult hiber_entry::cuDeviceGetCount(int* count) {
  if (count == nullptr) return invalid("cuDeviceGetCount");
  if (!initialized)
    return fail("cuDeviceGetCount", Status(ErrorCode::kNotInitialized, "cuInit was not called"));
  *count = Client::get().device_count();
  return CUDA_SUCCESS;
}

CUresult hiber_entry::cuDeviceGet(CUdevice* device, int ordinal) {
  if (device == nullptr) return invalid("cuDeviceGet");
  if (CUresult r = check_device("cuDeviceGet", ordinal); r != CUDA_SUCCESS) return r;
  *device = ordinal;
  return CUDA_SUCCESS;
}

CUresult hiber_entry::cuDeviceGetName(char* name, int length, CUdevice device) {
  if (name == nullptr || length <= 0) return invalid("cuDeviceGetName");
  if (CUresult r = check_device("cuDeviceGetName", device); r != CUDA_SUCCESS) return r;
  std::strncpy(name, Client::get().session()->devices[device].name.c_str(), length - 1);
  name[length - 1] = '\0';
  return CUDA_SUCCESS;
}

CUresult hiber_entry::cuDeviceGetUuid(CUuuid* uuid, CUdevice device) {
  if (uuid == nullptr) return invalid("cuDeviceGetUuid");
  if (CUresult r = check_device("cuDeviceGetUuid", device); r != CUDA_SUCCESS) return r;
  const auto& bytes = Client::get().session()->devices[device].uuid;
  std::memset(uuid->bytes, 0, sizeof(uuid->bytes));
  std::memcpy(uuid->bytes, bytes.data(), std::min(bytes.size(), sizeof(uuid->bytes)));
  return CUDA_SUCCESS;
}

CUresult hiber_entry::cuDeviceTotalMem(size_t* bytes, CUdevice device) {
  if (bytes == nullptr) return invalid("cuDeviceTotalMem");
  if (CUresult r = check_device("cuDeviceTotalMem", device); r != CUDA_SUCCESS) return r;
  *bytes = Client::get().session()->devices[device].total_memory_bytes;
  return CUDA_SUCCESS;
}

CUresult hiber_entry::cuDeviceGetAttribute(int* value, CUdevice_attribute attr, CUdevice device) {
  if (value == nullptr) return invalid("cuDeviceGetAttribute");
  if (CUresult r = check_device("cuDeviceGetAttribute", device); r != CUDA_SUCCESS) return r;
  *value = Client::get().device_attribute(device, attr);
  return CUDA_SUCCESS;
}

CUresult hiber_entry::cuDeviceGetPCIBusId(char* bus_id, int length, CUdevice device) {
  if (bus_id == nullptr || length <= 0) return invalid("cuDeviceGetPCIBusId");
  if (CUresult r = check_device("cuDeviceGetPCIBusId", device); r != CUDA_SUCCESS) return r;
  std::strncpy(bus_id, Client::get().session()->devices[device].pci_bus_id.c_str(), length - 1);
  bus_id[length - 1] = '\0';
  return CUDA_SUCCESS;
}

// ---- Contexts: each device has its primary context, always active once cuInit succeeded ----

CUresult hiber_entry::cuDevicePrimaryCtxRetain(CUcontext* context, CUdevice device) {
  if (context == nullptr) return invalid("cuDevicePrimaryCtxRetain");
  if (CUresult r = check_device("cuDevicePrimaryCtxRetain", device); r != CUDA_SUCCESS) return r;
  *context = primary_context(device);
  return CUDA_SUCCESS;
}

CUresult hiber_entry::cuDevicePrimaryCtxRelease(CUdevice device) {
  return check_device("cuDevicePrimaryCtxRelease", device);
}

CUresult hiber_entry::cuDevicePrimaryCtxGetState(CUdevice device, unsigned int* flags,
                                                 int* active) {
  if (flags == nullptr || active == nullptr) return invalid("cuDevicePrimaryCtxGetState");
  if (CUresult r = check_device("cuDevicePrimaryCtxGetState", device); r != CUDA_SUCCESS) return r;
  *flags = as_primary(primary_context(device))->flags;
  *active = 1;
  return CUDA_SUCCESS;
}

CUresult hiber_entry::cuDevicePrimaryCtxSetFlags(CUdevice device, unsigned int flags) {
  if (CUresult r = check_device("cuDevicePrimaryCtxSetFlags", device); r != CUDA_SUCCESS) return r;
  // Scheduling flags choose how the host waits; the shim always spins briefly, then sleeps.
  as_primary(primary_context(device))->flags = flags;
  return CUDA_SUCCESS;
}

CUresult hiber_entry::cuDevicePrimaryCtxReset(CUdevice device) {
  if (CUresult r = check_device("cuDevicePrimaryCtxReset", device); r != CUDA_SUCCESS) return r;
  // Every device of the session shares one context in hiberd: resetting one resets the session,
  // as cudaDeviceReset does.
  return done("cuDevicePrimaryCtxReset", Client::get().reset_device());
}

// cuCtxCreate: the device's primary context, made current on the calling thread, with one more
// creation to destroy. Execution affinity and CIG contexts are not supported.
CUresult create_context(const char* name, CUcontext* context, unsigned int flags, CUdevice device) {
  if (context == nullptr) return invalid(name);
  if (CUresult r = check_device(name, device); r != CUDA_SUCCESS) return r;
  PrimaryContext& primary = *as_primary(primary_context(device));
  primary.flags = flags;
  ++primary.created;
  *context = primary_context(device);
  hiber::shim::push_context(*context);
  return CUDA_SUCCESS;
}

CUresult hiber_entry::cuCtxCreate_v2(CUcontext* context, unsigned int flags, CUdevice device) {
  return create_context("cuCtxCreate_v2", context, flags, device);
}

CUresult hiber_entry::cuCtxCreate_v3(CUcontext* context, CUexecAffinityParam* params, int count,
                                     unsigned int flags, CUdevice device) {
  if (count != 0 || params != nullptr) {
    return fail("cuCtxCreate_v3",
                Status(ErrorCode::kNotSupported, "execution affinity contexts are not supported"));
  }
  return create_context("cuCtxCreate_v3", context, flags, device);
}

CUresult hiber_entry::cuCtxCreate(CUcontext* context, CUctxCreateParams* params, unsigned int flags,
                                  CUdevice device) {
  if (params != nullptr && (params->numExecAffinityParams != 0 || params->cigParams != nullptr)) {
    return fail("cuCtxCreate_v4", Status(ErrorCode::kNotSupported,
                                         "execution affinity and CIG contexts are not supported"));
  }
  return create_context("cuCtxCreate_v4", context, flags, device);
}

CUresult hiber_entry::cuCtxDestroy(CUcontext context) {
  PrimaryContext* primary = as_primary(context);
  if (primary == nullptr) return not_a_context("cuCtxDestroy_v2");
  int created = primary->created.load();
  do {
    if (created == 0) {
      return fail("cuCtxDestroy_v2",
                  Status(ErrorCode::kInvalidContext,
                         "the context was not made by cuCtxCreate, or was destroyed already "
                         "(a primary context is released with cuDevicePrimaryCtxRelease)"));
    }
  } while (!primary->created.compare_exchange_weak(created, created - 1));
  // The creation leaves the thread's stack (its latest push). Memory and modules stay: they
  // belong to the device's primary context, which every creation shares.
  auto& stack = context_stack();
  if (auto it = std::find(stack.rbegin(), stack.rend(), context); it != stack.rend())
    stack.erase(std::next(it).base());
  return CUDA_SUCCESS;
}

CUresult hiber_entry::cuCtxGetCurrent(CUcontext* context) {
  if (context == nullptr) return invalid("cuCtxGetCurrent");
  *context = initialized || Client::get().ready().ok() ? current_context() : nullptr;
  return CUDA_SUCCESS;
}

CUresult hiber_entry::cuCtxSetCurrent(CUcontext context) {
  if (context != nullptr && as_primary(context) == nullptr) {
    return fail("cuCtxSetCurrent", Status(ErrorCode::kInvalidContext, "not a primary context"));
  }
  hiber::shim::set_current_context(context);
  return CUDA_SUCCESS;
}

CUresult hiber_entry::cuCtxPushCurrent(CUcontext context) {
  if (as_primary(context) == nullptr) {
    return fail("cuCtxPushCurrent", Status(ErrorCode::kInvalidContext,
                                           "not a primary context (the shim has no other)"));
  }
  hiber::shim::push_context(context);
  return CUDA_SUCCESS;
}

CUresult hiber_entry::cuCtxPopCurrent(CUcontext* context) {
  const CUcontext top = hiber::shim::pop_context();
  if (top == nullptr) {
    return fail("cuCtxPopCurrent",
                Status(ErrorCode::kInvalidContext, "no context was pushed on this thread"));
  }
  if (context != nullptr) *context = top;
  return CUDA_SUCCESS;
}

CUresult hiber_entry::cuCtxGetDevice(CUdevice* device) {
  if (device == nullptr) return invalid("cuCtxGetDevice");
  *device = device_of(current_context());
  return CUDA_SUCCESS;
}

CUresult hiber_entry::cuCtxGetDevice_v2(CUdevice* device, CUcontext context) {
  if (device == nullptr) return invalid("cuCtxGetDevice_v2");
  PrimaryContext* primary = context_or_current(context);
  if (primary == nullptr) return not_a_context("cuCtxGetDevice_v2");
  *device = device_of(context != nullptr ? context : current_context());
  return CUDA_SUCCESS;
}

CUresult hiber_entry::cuCtxGetApiVersion(CUcontext context, unsigned int* version) {
  if (version == nullptr) return invalid("cuCtxGetApiVersion");
  if (context_or_current(context) == nullptr) return not_a_context("cuCtxGetApiVersion");
  *version = 3020;  // what the driver reports for every context of the current (3.2+) ABI
  return CUDA_SUCCESS;
}

CUresult hiber_entry::cuCtxGetFlags(unsigned int* flags) {
  if (flags == nullptr) return invalid("cuCtxGetFlags");
  *flags = as_primary(current_context())->flags;
  return CUDA_SUCCESS;
}

CUresult hiber_entry::cuCtxSetFlags(unsigned int flags) {
  as_primary(current_context())->flags = flags;
  return CUDA_SUCCESS;
}

CUresult hiber_entry::cuCtxGetId(CUcontext context, unsigned long long* id) {
  if (id == nullptr) return invalid("cuCtxGetId");
  PrimaryContext* primary = context_or_current(context);
  if (primary == nullptr) return not_a_context("cuCtxGetId");
  // Unique per context, never 0.
  *id =
      static_cast<unsigned long long>(device_of(context != nullptr ? context : current_context())) +
      1;
  return CUDA_SUCCESS;
}

CUresult hiber_entry::cuCtxGetStreamPriorityRange(int* least, int* greatest) {
  const auto [l, g] = Client::get().stream_priority_range();
  if (least) *least = l;
  if (greatest) *greatest = g;
  return CUDA_SUCCESS;
}

CUresult hiber_entry::cuCtxSynchronize(void) {
  return done("cuCtxSynchronize", Client::get().synchronize_device());
}

CUresult hiber_entry::cuCtxSynchronize_v2(CUcontext context) {
  if (context_or_current(context) == nullptr) return not_a_context("cuCtxSynchronize_v2");
  // The session's devices share one context in hiberd: its work is all of theirs.
  return done("cuCtxSynchronize_v2", Client::get().synchronize_device());
}

// ---- Profiler: no profiler is ever attached, so these succeed and do nothing, as the real
// driver's do without one ----

CUresult hiber_entry::cuProfilerInitialize(const char*, const char*, CUoutput_mode) {
  return CUDA_SUCCESS;
}
CUresult hiber_entry::cuProfilerStart(void) { return CUDA_SUCCESS; }
CUresult hiber_entry::cuProfilerStop(void) { return CUDA_SUCCESS; }

// ---- Errors ----

CUresult hiber_entry::cuGetErrorName(CUresult error, const char** name) {
  if (name == nullptr) return invalid("cuGetErrorName");
  *name = hiber::shim::driver_error_name(error);
  return *name ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

CUresult hiber_entry::cuGetErrorString(CUresult error, const char** text) {
  if (text == nullptr) return invalid("cuGetErrorString");
  if (hiber::shim::driver_error_name(error) == nullptr) {
    *text = nullptr;
    return CUDA_ERROR_INVALID_VALUE;
  }
  // Driver and runtime codes share values and meanings.
  *text = hiber::shim::runtime_error_string(error);
  return CUDA_SUCCESS;
}

CUresult hiber_entry::cuGetProcAddress(const char* symbol, void** function, int version,
                                       cuuint64_t flags, CUdriverProcAddressQueryResult* status) {
  if (symbol == nullptr || function == nullptr) return invalid("cuGetProcAddress");
  (void)flags;  // per-thread default stream variants map to the same functions
  *function = hiber::shim::driver_entry_point(symbol, version);
  if (status) {
    *status = *function ? CU_GET_PROC_ADDRESS_SUCCESS : CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
  }
  return *function ? CUDA_SUCCESS : CUDA_ERROR_NOT_FOUND;
}

// ---- Memory ----

CUresult hiber_entry::cuMemGetInfo(size_t* free_bytes, size_t* total_bytes) {
  Status ready = Client::get().ready();
  if (!ready.ok()) return fail("cuMemGetInfo", ready);
  const auto info = Client::get().memory_info();
  if (free_bytes) *free_bytes = info.free_bytes;
  if (total_bytes) *total_bytes = info.total_bytes;
  return CUDA_SUCCESS;
}

CUresult hiber_entry::cuMemAlloc(CUdeviceptr* pointer, size_t bytes) {
  if (pointer == nullptr || bytes == 0) return invalid("cuMemAlloc");
  uint64_t address = 0;
  CUresult r = resolved("cuMemAlloc", Client::get().malloc_device(bytes), &address);
  *pointer = address;
  return r;
}

CUresult hiber_entry::cuMemFree(CUdeviceptr pointer) {
  return done("cuMemFree", Client::get().free_device(pointer));
}

// ---- IPC: refused (api_support.h, ipc_unsupported) ----

CUresult hiber_entry::cuIpcGetMemHandle(CUipcMemHandle* handle, CUdeviceptr pointer) {
  if (handle == nullptr || pointer == 0) return invalid("cuIpcGetMemHandle");
  return fail("cuIpcGetMemHandle", hiber::shim::ipc_unsupported());
}

CUresult hiber_entry::cuIpcOpenMemHandle(CUdeviceptr* pointer, CUipcMemHandle, unsigned int) {
  if (pointer == nullptr) return invalid("cuIpcOpenMemHandle");
  return fail("cuIpcOpenMemHandle", hiber::shim::ipc_unsupported());
}

CUresult hiber_entry::cuIpcCloseMemHandle(CUdeviceptr pointer) {
  if (pointer == 0) return invalid("cuIpcCloseMemHandle");
  return fail("cuIpcCloseMemHandle", hiber::shim::ipc_unsupported());
}

CUresult hiber_entry::cuIpcGetEventHandle(CUipcEventHandle* handle, CUevent event) {
  if (handle == nullptr || event == nullptr) return invalid("cuIpcGetEventHandle");
  return fail("cuIpcGetEventHandle", hiber::shim::ipc_unsupported());
}

CUresult hiber_entry::cuIpcOpenEventHandle(CUevent* event, CUipcEventHandle) {
  if (event == nullptr) return invalid("cuIpcOpenEventHandle");
  return fail("cuIpcOpenEventHandle", hiber::shim::ipc_unsupported());
}

CUresult hiber_entry::cuMemAllocHost(void** pointer, size_t bytes) {
  if (pointer == nullptr) return invalid("cuMemAllocHost");
  return resolved("cuMemAllocHost", Client::get().malloc_host(bytes), pointer);
}

CUresult hiber_entry::cuMemHostAlloc(void** pointer, size_t bytes, unsigned int flags) {
  if (flags & CU_MEMHOSTALLOC_DEVICEMAP) {
    return fail("cuMemHostAlloc", hiber::shim::mapped_host_memory_unsupported());
  }
  return cuMemAllocHost(pointer, bytes);
}

CUresult hiber_entry::cuMemHostGetDevicePointer(CUdeviceptr* device_pointer, void*, unsigned int) {
  if (device_pointer == nullptr) return invalid("cuMemHostGetDevicePointer_v2");
  return fail("cuMemHostGetDevicePointer_v2", hiber::shim::mapped_host_memory_unsupported());
}

CUresult hiber_entry::cuMemFreeHost(void* pointer) {
  return done("cuMemFreeHost", Client::get().free_host(pointer));
}

CUresult hiber_entry::cuMemHostRegister(void* pointer, size_t bytes, unsigned int flags) {
  if (flags & (CU_MEMHOSTREGISTER_DEVICEMAP | CU_MEMHOSTREGISTER_IOMEMORY)) {
    return fail("cuMemHostRegister", hiber::shim::mapped_host_memory_unsupported());
  }
  return done("cuMemHostRegister", Client::get().register_host(pointer, bytes));
}

CUresult hiber_entry::cuMemHostUnregister(void* pointer) {
  return done("cuMemHostUnregister", Client::get().unregister_host(pointer));
}

CUresult hiber_entry::cuMemcpyHtoD(CUdeviceptr dst, const void* src, size_t bytes) {
  return copy("cuMemcpyHtoD", dev_ptr(dst), src, bytes, CopyKind::kHostToDevice, nullptr, false);
}
CUresult hiber_entry::cuMemcpyDtoH(void* dst, CUdeviceptr src, size_t bytes) {
  return copy("cuMemcpyDtoH", dst, dev_ptr(src), bytes, CopyKind::kDeviceToHost, nullptr, false);
}
CUresult hiber_entry::cuMemcpyDtoD(CUdeviceptr dst, CUdeviceptr src, size_t bytes) {
  return copy("cuMemcpyDtoD", dev_ptr(dst), dev_ptr(src), bytes, CopyKind::kDeviceToDevice, nullptr,
              false);
}
CUresult hiber_entry::cuMemcpy(CUdeviceptr dst, CUdeviceptr src, size_t bytes) {
  return copy("cuMemcpy", dev_ptr(dst), dev_ptr(src), bytes, CopyKind::kDefault, nullptr, false);
}
CUresult hiber_entry::cuMemcpyHtoDAsync(CUdeviceptr dst, const void* src, size_t bytes,
                                        CUstream stream) {
  return copy("cuMemcpyHtoDAsync", dev_ptr(dst), src, bytes, CopyKind::kHostToDevice, stream, true);
}
CUresult hiber_entry::cuMemcpyDtoHAsync(void* dst, CUdeviceptr src, size_t bytes, CUstream stream) {
  return copy("cuMemcpyDtoHAsync", dst, dev_ptr(src), bytes, CopyKind::kDeviceToHost, stream, true);
}
CUresult hiber_entry::cuMemcpyDtoDAsync(CUdeviceptr dst, CUdeviceptr src, size_t bytes,
                                        CUstream stream) {
  return copy("cuMemcpyDtoDAsync", dev_ptr(dst), dev_ptr(src), bytes, CopyKind::kDeviceToDevice,
              stream, true);
}
CUresult hiber_entry::cuMemcpyAsync(CUdeviceptr dst, CUdeviceptr src, size_t bytes,
                                    CUstream stream) {
  return copy("cuMemcpyAsync", dev_ptr(dst), dev_ptr(src), bytes, CopyKind::kDefault, stream, true);
}

CUresult hiber_entry::cuMemsetD8(CUdeviceptr dst, unsigned char value, size_t count) {
  return fill("cuMemsetD8", dst, value, 1, count, nullptr, false);
}
CUresult hiber_entry::cuMemsetD16(CUdeviceptr dst, unsigned short value, size_t count) {
  return fill("cuMemsetD16", dst, value, 2, count, nullptr, false);
}
CUresult hiber_entry::cuMemsetD32(CUdeviceptr dst, unsigned int value, size_t count) {
  return fill("cuMemsetD32", dst, value, 4, count, nullptr, false);
}
CUresult hiber_entry::cuMemsetD8Async(CUdeviceptr dst, unsigned char value, size_t count,
                                      CUstream stream) {
  return fill("cuMemsetD8Async", dst, value, 1, count, stream, true);
}
CUresult hiber_entry::cuMemsetD16Async(CUdeviceptr dst, unsigned short value, size_t count,
                                       CUstream stream) {
  return fill("cuMemsetD16Async", dst, value, 2, count, stream, true);
}
CUresult hiber_entry::cuMemsetD32Async(CUdeviceptr dst, unsigned int value, size_t count,
                                       CUstream stream) {
  return fill("cuMemsetD32Async", dst, value, 4, count, stream, true);
}

// ---- Streams and events ----

CUresult hiber_entry::cuStreamCreateWithPriority(CUstream* stream, unsigned int flags,
                                                 int priority) {
  if (stream == nullptr || (flags & ~CU_STREAM_NON_BLOCKING) != 0) return invalid("cuStreamCreate");
  hiber::shim::StreamObj* created = nullptr;
  CUresult r = resolved("cuStreamCreate", Client::get().create_stream(flags, priority), &created);
  *stream = reinterpret_cast<CUstream>(created);
  return r;
}

CUresult hiber_entry::cuStreamCreate(CUstream* stream, unsigned int flags) {
  return hiber_entry::cuStreamCreateWithPriority(stream, flags, 0);
}

CUresult hiber_entry::cuStreamDestroy(CUstream stream) {
  auto s = Client::get().stream(stream);
  if (!s.ok()) return fail("cuStreamDestroy", s.status());
  return done("cuStreamDestroy", Client::get().destroy_stream(*s));
}

CUresult hiber_entry::cuStreamSynchronize(CUstream stream) {
  auto s = Client::get().stream(stream);
  if (!s.ok()) return fail("cuStreamSynchronize", s.status());
  return done("cuStreamSynchronize", Client::get().synchronize_stream(*s));
}

CUresult hiber_entry::cuStreamQuery(CUstream stream) {
  auto s = Client::get().stream(stream);
  if (!s.ok()) return fail("cuStreamQuery", s.status());
  return done("cuStreamQuery", Client::get().query_stream(*s));
}

CUresult hiber_entry::cuStreamWaitEvent(CUstream stream, CUevent event, unsigned int flags) {
  if (flags != 0) return invalid("cuStreamWaitEvent");
  auto s = Client::get().stream(stream);
  if (!s.ok()) return fail("cuStreamWaitEvent", s.status());
  auto e = Client::get().event(event);
  if (!e.ok()) return fail("cuStreamWaitEvent", e.status());
  return done("cuStreamWaitEvent", Client::get().wait_event(*s, *e));
}

CUresult hiber_entry::cuEventCreate(CUevent* event, unsigned int flags) {
  if (event == nullptr || (flags & ~(CU_EVENT_BLOCKING_SYNC | CU_EVENT_DISABLE_TIMING)) != 0) {
    return invalid("cuEventCreate");
  }
  hiber::shim::EventObj* created = nullptr;
  CUresult r = resolved("cuEventCreate", Client::get().create_event(flags), &created);
  *event = reinterpret_cast<CUevent>(created);
  return r;
}

CUresult hiber_entry::cuEventDestroy(CUevent event) {
  auto e = Client::get().event(event);
  if (!e.ok()) return fail("cuEventDestroy", e.status());
  return done("cuEventDestroy", Client::get().destroy_event(*e));
}

CUresult hiber_entry::cuEventRecord(CUevent event, CUstream stream) {
  auto e = Client::get().event(event);
  if (!e.ok()) return fail("cuEventRecord", e.status());
  auto s = Client::get().stream(stream);
  if (!s.ok()) return fail("cuEventRecord", s.status());
  return done("cuEventRecord", Client::get().record_event(*e, *s));
}

CUresult hiber_entry::cuEventSynchronize(CUevent event) {
  auto e = Client::get().event(event);
  if (!e.ok()) return fail("cuEventSynchronize", e.status());
  return done("cuEventSynchronize", Client::get().synchronize_event(*e));
}

CUresult hiber_entry::cuEventQuery(CUevent event) {
  auto e = Client::get().event(event);
  if (!e.ok()) return fail("cuEventQuery", e.status());
  return done("cuEventQuery", Client::get().query_event(*e));
}

CUresult hiber_entry::cuEventElapsedTime(float* ms, CUevent start, CUevent end) {
  if (ms == nullptr) return invalid("cuEventElapsedTime");
  auto a = Client::get().event(start);
  if (!a.ok()) return fail("cuEventElapsedTime", a.status());
  auto b = Client::get().event(end);
  if (!b.ok()) return fail("cuEventElapsedTime", b.status());
  return resolved("cuEventElapsedTime", Client::get().elapsed_ms(*a, *b), ms);
}

// ---- Modules and launches ----

CUresult hiber_entry::cuModuleLoadData(CUmodule* module, const void* image) {
  if (module == nullptr || image == nullptr) return invalid("cuModuleLoadData");
  const auto* bytes = static_cast<const std::byte*>(image);
  hiber::shim::ModuleObj* loaded = nullptr;
  CUresult r =
      resolved("cuModuleLoadData",
               Client::get().load_module({bytes, hiber::shim::code_image_size(image)}), &loaded);
  *module = reinterpret_cast<CUmodule>(loaded);
  return r;
}

CUresult hiber_entry::cuModuleLoadDataEx(CUmodule* module, const void* image, unsigned int,
                                         CUjit_option*, void**) {
  // JIT options tune PTX compilation in hiberd's driver; they do not change results.
  return hiber_entry::cuModuleLoadData(module, image);
}

CUresult hiber_entry::cuModuleUnload(CUmodule module) {
  auto m = Client::get().module(module);
  if (!m.ok()) return fail("cuModuleUnload", m.status());
  return done("cuModuleUnload", Client::get().unload_module(*m));
}

CUresult hiber_entry::cuModuleGetFunction(CUfunction* function, CUmodule module, const char* name) {
  if (function == nullptr || name == nullptr) return invalid("cuModuleGetFunction");
  auto m = Client::get().module(module);
  if (!m.ok()) return fail("cuModuleGetFunction", m.status());
  hiber::shim::KernelObj* kernel = nullptr;
  CUresult r = resolved("cuModuleGetFunction", Client::get().module_function(*m, name), &kernel);
  *function = reinterpret_cast<CUfunction>(kernel);
  return r;
}

CUresult hiber_entry::cuFuncGetParamInfo(CUfunction function, size_t index, size_t* offset,
                                         size_t* bytes) {
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

CUresult hiber_entry::cuLaunchKernel(CUfunction function, unsigned int grid_x, unsigned int grid_y,
                                     unsigned int grid_z, unsigned int block_x,
                                     unsigned int block_y, unsigned int block_z,
                                     unsigned int shared_bytes, CUstream stream, void** params,
                                     void** extra) {
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
}

CUresult hiber_entry::cuLaunchKernelEx(const CUlaunchConfig* config, CUfunction function,
                                       void** params, void** extra) {
  if (config == nullptr) return invalid("cuLaunchKernelEx", "null config");
  for (unsigned i = 0; i < config->numAttrs; ++i) {
    if (config->attrs[i].id != CU_LAUNCH_ATTRIBUTE_IGNORE) {
      return fail("cuLaunchKernelEx",
                  hiber::error(ErrorCode::kNotSupported, "launch attribute ",
                               static_cast<int>(config->attrs[i].id),
                               " is not supported (only CU_LAUNCH_ATTRIBUTE_IGNORE)"));
    }
  }
  return hiber_entry::cuLaunchKernel(function, config->gridDimX, config->gridDimY, config->gridDimZ,
                                     config->blockDimX, config->blockDimY, config->blockDimZ,
                                     config->sharedMemBytes, config->hStream, params, extra);
}

// ---- Function attributes and occupancy ----

CUresult hiber_entry::cuFuncGetAttribute(int* value, CUfunction_attribute attr,
                                         CUfunction function) {
  if (value == nullptr) return invalid("cuFuncGetAttribute");
  auto kernel = function_kernel(function);
  if (!kernel.ok()) return fail("cuFuncGetAttribute", kernel.status());
  Client& client = Client::get();
  const int arch = client.device_attribute(0, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR) * 10 +
                   client.device_attribute(0, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR);
  switch (attr) {
    case CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK:
      *value = client.device_attribute(0, CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK);
      return CUDA_SUCCESS;
    case CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES:
      *value = (*kernel)->max_dynamic_shared.value_or(
          client.device_attribute(0, CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK));
      return CUDA_SUCCESS;
    case CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT:
      *value = (*kernel)->preferred_carveout;
      return CUDA_SUCCESS;
    case CU_FUNC_ATTRIBUTE_PTX_VERSION:
    case CU_FUNC_ATTRIBUTE_BINARY_VERSION: *value = arch; return CUDA_SUCCESS;
    case CU_FUNC_ATTRIBUTE_CACHE_MODE_CA: *value = 0; return CUDA_SUCCESS;
    default:
      // Registers, static shared / constant / local memory and cluster attributes are known
      // only to the driver in hiberd; a made-up 0 would mislead tuning code.
      return fail(
          "cuFuncGetAttribute",
          hiber::error(ErrorCode::kNotSupported, "cuFuncGetAttribute(", static_cast<int>(attr),
                       ") of ", (*kernel)->name, ": the client does not know this attribute"));
  }
}

CUresult hiber_entry::cuFuncSetAttribute(CUfunction function, CUfunction_attribute attr,
                                         int value) {
  auto kernel = function_kernel(function);
  if (!kernel.ok()) return fail("cuFuncSetAttribute", kernel.status());
  switch (attr) {
    case CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES: {
      const int optin =
          Client::get().device_attribute(0, CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN);
      if (value < 0 || value > optin) {
        return invalid("cuFuncSetAttribute",
                       "CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES outside [0, the device's "
                       "opt-in limit]");
      }
      (*kernel)->max_dynamic_shared = value;
      return CUDA_SUCCESS;
    }
    case CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT:
      if (value < -1 || value > 100)
        return invalid("cuFuncSetAttribute", "carveout not in -1..100");
      (*kernel)->preferred_carveout = value;  // a hint
      return CUDA_SUCCESS;
    default:
      return fail(
          "cuFuncSetAttribute",
          hiber::error(ErrorCode::kNotSupported, "cuFuncSetAttribute(", static_cast<int>(attr),
                       ", ", value, ") on ", (*kernel)->name, " is not supported"));
  }
}

CUresult hiber_entry::cuFuncSetCacheConfig(CUfunction function, CUfunc_cache config) {
  auto kernel = function_kernel(function);
  if (!kernel.ok()) return fail("cuFuncSetCacheConfig", kernel.status());
  if (config < CU_FUNC_CACHE_PREFER_NONE || config > CU_FUNC_CACHE_PREFER_EQUAL) {
    return invalid("cuFuncSetCacheConfig");
  }
  (*kernel)->cache_config = config;  // a preference the driver may ignore, as CUDA says
  return CUDA_SUCCESS;
}

CUresult hiber_entry::cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(
    int* blocks, CUfunction function, int block_size, size_t shared_bytes, unsigned int) {
  if (blocks == nullptr || block_size <= 0) {
    return invalid("cuOccupancyMaxActiveBlocksPerMultiprocessor");
  }
  auto kernel = function_kernel(function);
  if (!kernel.ok()) return fail("cuOccupancyMaxActiveBlocksPerMultiprocessor", kernel.status());
  *blocks = Client::get().max_active_blocks(0, block_size, shared_bytes);
  return CUDA_SUCCESS;
}

CUresult hiber_entry::cuOccupancyMaxActiveBlocksPerMultiprocessor(int* blocks, CUfunction function,
                                                                  int block_size,
                                                                  size_t shared_bytes) {
  return hiber_entry::cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(
      blocks, function, block_size, shared_bytes, 0);
}

// The block size with the most resident threads per multiprocessor (ties: the larger block),
// by the same device-limits model as cuOccupancyMaxActiveBlocksPerMultiprocessor.
CUresult hiber_entry::cuOccupancyMaxPotentialBlockSizeWithFlags(int* min_grid, int* block,
                                                                CUfunction function,
                                                                CUoccupancyB2DSize shared_of_block,
                                                                size_t shared_bytes,
                                                                int block_limit, unsigned int) {
  if (min_grid == nullptr || block == nullptr) return invalid("cuOccupancyMaxPotentialBlockSize");
  auto kernel = function_kernel(function);
  if (!kernel.ok()) return fail("cuOccupancyMaxPotentialBlockSize", kernel.status());
  Client& client = Client::get();
  const int warp = std::max(1, client.device_attribute(0, CU_DEVICE_ATTRIBUTE_WARP_SIZE));
  int max_block = client.device_attribute(0, CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK);
  if (block_limit > 0) max_block = std::min(max_block, block_limit);
  const int shared_limit = (*kernel)->max_dynamic_shared.value_or(
      client.device_attribute(0, CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK));
  int best_block = 0, best_blocks = 0, best_threads = 0;
  for (int size = max_block / warp * warp; size > 0; size -= warp) {
    const size_t shared = shared_of_block ? shared_of_block(size) : shared_bytes;
    if (shared > static_cast<size_t>(std::max(shared_limit, 0))) continue;
    const int blocks = client.max_active_blocks(0, size, shared);
    if (blocks * size > best_threads) {
      best_threads = blocks * size;
      best_blocks = blocks;
      best_block = size;
    }
  }
  *block = best_block;
  *min_grid = best_blocks * client.device_attribute(0, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT);
  return CUDA_SUCCESS;
}

CUresult hiber_entry::cuOccupancyMaxPotentialBlockSize(int* min_grid, int* block,
                                                       CUfunction function,
                                                       CUoccupancyB2DSize shared_of_block,
                                                       size_t shared_bytes, int block_limit) {
  return hiber_entry::cuOccupancyMaxPotentialBlockSizeWithFlags(
      min_grid, block, function, shared_of_block, shared_bytes, block_limit, 0);
}

// ---- Module globals ----

CUresult hiber_entry::cuModuleGetGlobal(CUdeviceptr* address, size_t* bytes, CUmodule module,
                                        const char* name) {
  if (name == nullptr) return invalid("cuModuleGetGlobal");
  auto m = Client::get().module(module);
  if (!m.ok()) return fail("cuModuleGetGlobal", m.status());
  (void)address;
  (void)bytes;
  // hiberd loads one module for every session and GPU (module_cache.h), so a __device__
  // variable's storage is shared by every function using the image: handing its address to one
  // function would let it write another's state. Not supported until per-session globals exist.
  return fail("cuModuleGetGlobal",
              hiber::error(ErrorCode::kNotSupported, "cuModuleGetGlobal(", name,
                           "): __device__ variables of loaded modules are not supported"));
}

// ---- Pointers ----

CUresult hiber_entry::cuPointerGetAttribute(void* data, CUpointer_attribute attr,
                                            CUdeviceptr pointer) {
  if (data == nullptr) return invalid("cuPointerGetAttribute");
  const auto range = Client::get().pointer_range(dev_ptr(pointer));
  if (!range) {
    return fail(
        "cuPointerGetAttribute",
        hiber::error(ErrorCode::kInvalidValue, "cuPointerGetAttribute: ", hiber::hex(pointer),
                     " is not memory the shim allocated or registered"));
  }
  const bool device = range->kind == hiber::shim::PointerKind::kDevice;
  switch (attr) {
    case CU_POINTER_ATTRIBUTE_CONTEXT:
      *static_cast<CUcontext*>(data) = current_context();
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_MEMORY_TYPE:
      *static_cast<unsigned*>(data) = device ? CU_MEMORYTYPE_DEVICE : CU_MEMORYTYPE_HOST;
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_DEVICE_POINTER:
      // Kernels cannot reach client host memory: pinned memory has no device pointer.
      if (!device) return invalid("cuPointerGetAttribute", "host memory has no device pointer");
      *static_cast<CUdeviceptr*>(data) = pointer;
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_HOST_POINTER:
      if (device) return invalid("cuPointerGetAttribute", "device memory has no host pointer");
      *static_cast<void**>(data) = dev_ptr(pointer);
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_IS_MANAGED:
    case CU_POINTER_ATTRIBUTE_MAPPED:
      *static_cast<bool*>(data) = attr == CU_POINTER_ATTRIBUTE_MAPPED;
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL:
      *static_cast<int*>(data) = device ? 0 : device_of(current_context());
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR:
      *static_cast<CUdeviceptr*>(data) = range->start;
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_RANGE_SIZE:
      *static_cast<size_t*>(data) = range->bytes;
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_BUFFER_ID:
      *static_cast<unsigned long long*>(data) = range->start;  // unique while allocated
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_SYNC_MEMOPS:
      *static_cast<bool*>(data) = true;  // hiberd's copies are ordered with kernels already
      return CUDA_SUCCESS;
    default:
      return fail("cuPointerGetAttribute",
                  hiber::error(ErrorCode::kNotSupported, "cuPointerGetAttribute(",
                               static_cast<int>(attr), ") is not supported"));
  }
}

CUresult hiber_entry::cuPointerGetAttributes(unsigned int count, CUpointer_attribute* attributes,
                                             void** data, CUdeviceptr pointer) {
  if (attributes == nullptr || data == nullptr) return invalid("cuPointerGetAttributes");
  // Unlike cuPointerGetAttribute, memory the shim does not know is no error: its attributes
  // read as 0 (memory type 0, context NULL), as CUDA documents.
  const bool known = Client::get().pointer_range(dev_ptr(pointer)).has_value();
  for (unsigned i = 0; i < count; ++i) {
    if (data[i] == nullptr) continue;
    CUresult r =
        known ? hiber_entry::cuPointerGetAttribute(data[i], attributes[i], pointer) : CUDA_SUCCESS;
    if (!known || r == CUDA_ERROR_INVALID_VALUE) {
      switch (attributes[i]) {
        case CU_POINTER_ATTRIBUTE_CONTEXT: *static_cast<CUcontext*>(data[i]) = nullptr; break;
        case CU_POINTER_ATTRIBUTE_MEMORY_TYPE: *static_cast<unsigned*>(data[i]) = 0; break;
        case CU_POINTER_ATTRIBUTE_DEVICE_POINTER:
        case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR: *static_cast<CUdeviceptr*>(data[i]) = 0; break;
        case CU_POINTER_ATTRIBUTE_HOST_POINTER: *static_cast<void**>(data[i]) = nullptr; break;
        case CU_POINTER_ATTRIBUTE_IS_MANAGED:
        case CU_POINTER_ATTRIBUTE_MAPPED:
        case CU_POINTER_ATTRIBUTE_SYNC_MEMOPS: *static_cast<bool*>(data[i]) = false; break;
        case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL: *static_cast<int*>(data[i]) = -2; break;
        case CU_POINTER_ATTRIBUTE_RANGE_SIZE: *static_cast<size_t*>(data[i]) = 0; break;
        case CU_POINTER_ATTRIBUTE_BUFFER_ID: *static_cast<unsigned long long*>(data[i]) = 0; break;
        default:
          return fail("cuPointerGetAttributes",
                      hiber::error(ErrorCode::kNotSupported, "pointer attribute ",
                                   static_cast<int>(attributes[i]), " is not supported"));
      }
    } else if (r != CUDA_SUCCESS) {
      return r;
    }
  }
  return CUDA_SUCCESS;
}

CUresult hiber_entry::cuMemGetAddressRange(CUdeviceptr* base, size_t* bytes, CUdeviceptr pointer) {
  const auto range = Client::get().pointer_range(dev_ptr(pointer));
  if (!range || range->kind != hiber::shim::PointerKind::kDevice) {
    return fail("cuMemGetAddressRange", hiber::error(ErrorCode::kInvalidValue,
                                                     "cuMemGetAddressRange: ", hiber::hex(pointer),
                                                     " is not in a device allocation"));
  }
  if (base) *base = range->start;
  if (bytes) *bytes = range->bytes;
  return CUDA_SUCCESS;
}

// ---- Streams: capture and host functions ----

// Stream capture (CUDA graphs) is not supported: no stream is ever capturing, and beginning a
// capture fails loudly (an unsupported entry point).
CUresult hiber_entry::cuLaunchHostFunc(CUstream stream, CUhostFn fn, void* data) {
  if (fn == nullptr) return invalid("cuLaunchHostFunc");
  auto s = Client::get().stream(stream);
  if (!s.ok()) return fail("cuLaunchHostFunc", s.status());
  return done("cuLaunchHostFunc",
              Client::get().launch_host_function(*s, [fn, data](const Status& status) {
                if (status.ok()) fn(data);  // never after an error, as CUDA documents
              }));
}

CUresult hiber_entry::cuStreamAddCallback(CUstream stream, CUstreamCallback callback, void* data,
                                          unsigned int flags) {
  if (callback == nullptr || flags != 0) return invalid("cuStreamAddCallback");
  auto s = Client::get().stream(stream);
  if (!s.ok()) return fail("cuStreamAddCallback", s.status());
  return done(
      "cuStreamAddCallback",
      Client::get().launch_host_function(*s, [stream, callback, data](const Status& status) {
        callback(stream, static_cast<CUresult>(status.code()), data);
      }));
}

// ---- Linking (cuLink*) ----
// The inputs stay in the client until cuLinkComplete. One input that is already a loadable
// image (a cubin, a fatbin or PTX: what NVRTC produces) is the result as it is, and
// cuModuleLoadData then ships it to hiberd like any image. Linking several inputs (relocatable
// device code, libraries) would need the driver's linker in hiberd: not supported yet.

CUresult hiber_entry::cuLinkCreate(unsigned int, CUjit_option*, void**, CUlinkState* state) {
  if (state == nullptr) return invalid("cuLinkCreate");
  // JIT options tune compilation and logging in the driver; they do not change results.
  *state = reinterpret_cast<CUlinkState>(new LinkState());
  return CUDA_SUCCESS;
}

CUresult hiber_entry::cuLinkAddData(CUlinkState state, CUjitInputType type, void* data,
                                    size_t bytes, const char*, unsigned int, CUjit_option*,
                                    void**) {
  if (state == nullptr || data == nullptr || bytes == 0) return invalid("cuLinkAddData");
  auto* link = reinterpret_cast<LinkState*>(state);
  const auto* begin = static_cast<const std::byte*>(data);
  link->inputs.emplace_back(begin, begin + bytes);
  link->types.push_back(type);
  return CUDA_SUCCESS;
}

CUresult hiber_entry::cuLinkAddFile(CUlinkState state, CUjitInputType type, const char* path,
                                    unsigned int, CUjit_option*, void**) {
  if (state == nullptr || path == nullptr) return invalid("cuLinkAddFile");
  std::ifstream file(path, std::ios::binary);
  if (!file) {
    return fail("cuLinkAddFile",
                hiber::error(ErrorCode::kFileNotFound, "cuLinkAddFile: cannot open ", path));
  }
  std::vector<char> text((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
  if (type == CU_JIT_INPUT_PTX) text.push_back('\0');  // PTX images end at their NUL
  return hiber_entry::cuLinkAddData(state, type, text.data(), text.size(), path, 0, nullptr,
                                    nullptr);
}

CUresult hiber_entry::cuLinkComplete(CUlinkState state, void** image, size_t* bytes) {
  if (state == nullptr || image == nullptr) return invalid("cuLinkComplete");
  auto* link = reinterpret_cast<LinkState*>(state);
  if (link->inputs.size() != 1 ||
      (link->types[0] != CU_JIT_INPUT_CUBIN && link->types[0] != CU_JIT_INPUT_PTX &&
       link->types[0] != CU_JIT_INPUT_FATBINARY)) {
    return fail(
        "cuLinkComplete",
        hiber::error(ErrorCode::kNotSupported, "cuLinkComplete: linking ", link->inputs.size(),
                     " input(s) is not supported; only one cubin, PTX or fatbin image"));
  }
  link->output = link->inputs[0];
  if (link->types[0] == CU_JIT_INPUT_PTX && link->output.back() != std::byte{0}) {
    link->output.push_back(std::byte{0});
  }
  *image = link->output.data();
  if (bytes) *bytes = link->output.size();
  return CUDA_SUCCESS;
}

CUresult hiber_entry::cuLinkDestroy(CUlinkState state) {
  if (state == nullptr) return invalid("cuLinkDestroy");
  delete reinterpret_cast<LinkState*>(state);
  return CUDA_SUCCESS;
}

namespace hiber::shim {

void* driver_entry_point(const char* symbol, int cuda_version) {
  struct ByBase {
    bool operator()(const HiberDriverProc& proc, const char* name) const {
      return std::strcmp(proc.base, name) < 0;
    }
    bool operator()(const char* name, const HiberDriverProc& proc) const {
      return std::strcmp(name, proc.base) < 0;
    }
  };
  const HiberDriverProc* begin = hiber_driver_procs;
  const auto [first, last] =
      std::equal_range(begin, begin + hiber_driver_proc_count, symbol, ByBase{});
  void* newest = nullptr;  // versions ascend within a base name
  for (const HiberDriverProc* proc = first; proc != last; ++proc) {
    if (proc->version <= cuda_version) newest = proc->address;
  }
  return newest;
}

}  // namespace hiber::shim
