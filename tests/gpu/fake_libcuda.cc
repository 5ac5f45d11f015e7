// The fake libcuda.so.1 described in fake_cuda.h. Only cuGetProcAddress_v2 and fake_cuda are
// exported by name: the backend must find everything else through cuGetProcAddress.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "server/device/cuda_driver.h"
#include "tests/gpu/fake_cuda.h"

namespace {

constexpr size_t kGranularity = 2 << 20;
constexpr size_t kGpuMemory = 16ull << 30;

FakeCuda& state() {
  static FakeCuda* s = [] {
    auto* f = new FakeCuda();
    if (const char* v = std::getenv("FAKE_CUDA_GPUS")) f->gpu_count = std::atoi(v);
    if (const char* v = std::getenv("FAKE_CUDA_DRIVER_VERSION")) f->driver_version = std::atoi(v);
    if (const char* v = std::getenv("FAKE_CUDA_INIT_RESULT")) f->init_result = std::atoi(v);
    return f;
  }();
  return *s;
}

// Objects behind the opaque handles. Each starts with a tag so a handle of the wrong kind is
// caught instead of misread.
enum Tag : unsigned {
  kContextTag = 0xC0C0,
  kStreamTag = 0x5757,
  kEventTag = 0xE7E7,
  kLibraryTag = 0x1B1B,
  kKernelTag = 0x4E4E
};

struct FakeContext {
  unsigned tag = kContextTag;
  int gpu = 0;
  bool primary = true;
  // A fault's error (FakeCuda::faulting_kernel): every later call in the context answers it,
  // as a real driver answers a sticky error. Guarded by the state's mutex.
  CUresult sticky = CUDA_SUCCESS;
  // cuDevicePrimaryCtxReset calls so far: a stream or event made before the latest one is
  // gone with the context's old self. Guarded by the state's mutex.
  int resets = 0;
};
struct FakeStream {
  unsigned tag = kStreamTag;
  int gpu = 0;
  FakeContext* context = nullptr;
  int resets = 0;  // the context's when the stream was made
};
struct FakeEvent {
  unsigned tag = kEventTag;
  int gpu = 0;
  bool timing = true;
  bool recorded = false;
  FakeContext* context = nullptr;
  int resets = 0;  // the context's when the event was made
};
struct FakeKernel {
  unsigned tag = kKernelTag;
  std::string name;
  std::vector<std::pair<size_t, size_t>> params;  // (offset, size)
  // GPU -> CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES; guarded by the state's mutex.
  std::map<int, int> max_dynamic_shared = {};
};
struct FakeLibrary {
  unsigned tag = kLibraryTag;
  std::vector<FakeKernel*> kernels;
};

FakeContext* contexts() {
  static FakeContext all[8] = {{kContextTag, 0}, {kContextTag, 1}, {kContextTag, 2},
                               {kContextTag, 3}, {kContextTag, 4}, {kContextTag, 5},
                               {kContextTag, 6}, {kContextTag, 7}};
  return all;
}

// Contexts cuCtxCreate made. Destroyed ones stay (with their tag cleared), so a stream or event
// left in one finds it destroyed instead of reading freed memory.
std::vector<FakeContext*>& created_contexts() {
  static auto* all = new std::vector<FakeContext*>();
  return *all;
}

// Streams and events made and not destroyed. A reset context's stay here (the backend forgets
// them, as it must), so they are still reachable, as a driver keeps what a reset freed.
std::set<void*>& made_objects() {
  static auto* all = new std::set<void*>();
  return *all;
}

// Initial-exec, so reading it needs no __tls_get_addr: LeakSanitizer's bookkeeping of dynamic
// TLS blocks (GCC 12) misreads some of them and crashes at exit, depending on where the block
// happens to land.
__attribute__((tls_model("initial-exec"))) thread_local FakeContext* current = nullptr;
// The thread's context stack below `current`: cuCtxCreate pushes, cuCtxPopCurrent pops.
constexpr int kMaxStack = 8;
__attribute__((tls_model("initial-exec"))) thread_local FakeContext* below[kMaxStack] = {};
__attribute__((tls_model("initial-exec"))) thread_local int below_depth = 0;

int gpu_of(CUcontext c) { return reinterpret_cast<FakeContext*>(c)->gpu; }
// A stream or event whose context was reset after it was made is gone: a call naming it is
// counted (FakeCuda::stale_handle_calls) and refused as an invalid handle.
template <typename Object>
Object* live(Object* f) {
  std::lock_guard lock(state().mutex);
  if (f->resets == f->context->resets) return f;
  ++state().stale_handle_calls;
  return nullptr;
}
FakeStream* stream_of(CUstream s) {
  auto* f = reinterpret_cast<FakeStream*>(s);
  return f != nullptr && f->tag == kStreamTag ? live(f) : nullptr;
}
FakeEvent* event_of(CUevent e) {
  auto* f = reinterpret_cast<FakeEvent*>(e);
  return f != nullptr && f->tag == kEventTag ? live(f) : nullptr;
}

bool valid_device(CUdevice d) { return d >= 0 && d < state().gpu_count; }

// Records a call made while the current context is not `context` (the backend promises to make
// the context of the stream or event it uses current first), and answers the context's state:
// destroyed, a fault's sticky error, or success.
CUresult expect_current(const FakeContext* context, const char* call) {
  std::lock_guard lock(state().mutex);
  if (current != context) {
    state().wrong_context_calls.push_back(std::string(call) + " on GPU " +
                                          std::to_string(context->gpu) +
                                          (current != nullptr && current->gpu == context->gpu
                                               ? " (another context of that GPU is current)"
                                               : ""));
  }
  if (context->tag != kContextTag) return CUDA_ERROR_CONTEXT_IS_DESTROYED;
  return context->sticky;
}

// How often the current context was reset, for the streams and events made in it.
int current_resets() {
  std::lock_guard lock(state().mutex);
  return current->resets;
}

// The current context's sticky error (success when it has none), for calls that act on it.
CUresult current_sticky() {
  std::lock_guard lock(state().mutex);
  return current->sticky;
}

// ---- Errors, initialisation, devices ----

CUresult fake_cuGetErrorName(CUresult error, const char** str) {
  switch (error) {
    case CUDA_SUCCESS: *str = "CUDA_SUCCESS"; return CUDA_SUCCESS;
    case CUDA_ERROR_INVALID_VALUE: *str = "CUDA_ERROR_INVALID_VALUE"; return CUDA_SUCCESS;
    case CUDA_ERROR_INVALID_HANDLE: *str = "CUDA_ERROR_INVALID_HANDLE"; return CUDA_SUCCESS;
    case CUDA_ERROR_NO_DEVICE: *str = "CUDA_ERROR_NO_DEVICE"; return CUDA_SUCCESS;
    case CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED:
      *str = "CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED";
      return CUDA_SUCCESS;
    case CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED:
      *str = "CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED";
      return CUDA_SUCCESS;
    default: *str = nullptr; return CUDA_ERROR_INVALID_VALUE;
  }
}

CUresult fake_cuGetErrorString(CUresult error, const char** str) {
  const char* name = nullptr;
  if (fake_cuGetErrorName(error, &name) != CUDA_SUCCESS) return CUDA_ERROR_INVALID_VALUE;
  *str = "a fake driver error";
  return CUDA_SUCCESS;
}

CUresult fake_cuInit(unsigned int flags) {
  return flags != 0 ? CUDA_ERROR_INVALID_VALUE : static_cast<CUresult>(state().init_result);
}

CUresult fake_cuDriverGetVersion(int* version) {
  *version = state().driver_version;
  return CUDA_SUCCESS;
}

CUresult fake_cuDeviceGetCount(int* count) {
  *count = state().gpu_count;
  return CUDA_SUCCESS;
}

CUresult fake_cuDeviceGet(CUdevice* device, int ordinal) {
  if (!valid_device(ordinal)) return CUDA_ERROR_INVALID_DEVICE;
  *device = ordinal;
  return CUDA_SUCCESS;
}

CUresult fake_cuDeviceGetName(char* name, int len, CUdevice dev) {
  if (!valid_device(dev)) return CUDA_ERROR_INVALID_DEVICE;
  std::snprintf(name, static_cast<size_t>(len), "Fake GPU");
  return CUDA_SUCCESS;
}

CUresult fake_cuDeviceGetUuid(CUuuid* uuid, CUdevice dev) {
  if (!valid_device(dev)) return CUDA_ERROR_INVALID_DEVICE;
  for (int i = 0; i < 16; ++i) uuid->bytes[i] = static_cast<char>(dev * 16 + i + 1);
  return CUDA_SUCCESS;
}

CUresult fake_cuDeviceGetPCIBusId(char* bus_id, int len, CUdevice dev) {
  if (!valid_device(dev)) return CUDA_ERROR_INVALID_DEVICE;
  std::snprintf(bus_id, static_cast<size_t>(len), "0000:%02X:00.0", 0x1A + dev);
  return CUDA_SUCCESS;
}

CUresult fake_cuDeviceTotalMem(size_t* bytes, CUdevice dev) {
  if (!valid_device(dev)) return CUDA_ERROR_INVALID_DEVICE;
  *bytes = kGpuMemory;
  return CUDA_SUCCESS;
}

CUresult fake_cuDeviceGetAttribute(int* value, CUdevice_attribute attribute, CUdevice dev) {
  if (!valid_device(dev)) return CUDA_ERROR_INVALID_DEVICE;
  int a = static_cast<int>(attribute);
  if (a <= 0 || a >= CU_DEVICE_ATTRIBUTE_MAX) return CUDA_ERROR_INVALID_VALUE;
  if (a == 92) return CUDA_ERROR_NOT_SUPPORTED;  // some attribute this GPU does not report
  switch (a) {
    case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK: *value = 1024; break;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X: *value = 1024; break;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y: *value = 1024; break;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z: *value = 64; break;
    case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X: *value = 2147483647; break;
    case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y: *value = 65535; break;
    case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z: *value = 65535; break;
    case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK: *value = 48 << 10; break;
    case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN: *value = 227 << 10; break;
    case CU_DEVICE_ATTRIBUTE_WARP_SIZE: *value = 32; break;
    case CU_DEVICE_ATTRIBUTE_CLOCK_RATE: *value = 1980000; break;
    case CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT: *value = 132; break;
    case CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE: *value = 2619000; break;
    case CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH: *value = 5120; break;
    case CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE: *value = 52428800; break;
    case CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING: *value = 1; break;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: *value = 9; break;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR: *value = 0; break;
    case CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED: *value = 1; break;
    default: *value = 1000 + a; break;  // recognisable, to check the table is filled by index
  }
  return CUDA_SUCCESS;
}

CUresult fake_cuDeviceCanAccessPeer(int* can, CUdevice dev, CUdevice peer) {
  if (!valid_device(dev) || !valid_device(peer)) return CUDA_ERROR_INVALID_DEVICE;
  std::lock_guard lock(state().mutex);
  *can = dev != peer && state().p2p ? 1 : 0;
  return CUDA_SUCCESS;
}

CUresult fake_cuDeviceGetP2PAttribute(int* value, CUdevice_P2PAttribute attribute, CUdevice src,
                                      CUdevice dst) {
  if (!valid_device(src) || !valid_device(dst) || src == dst) return CUDA_ERROR_INVALID_DEVICE;
  std::lock_guard lock(state().mutex);
  switch (attribute) {
    case CU_DEVICE_P2P_ATTRIBUTE_ACCESS_SUPPORTED: *value = state().p2p ? 1 : 0; break;
    case CU_DEVICE_P2P_ATTRIBUTE_PERFORMANCE_RANK: *value = 0; break;
    case CU_DEVICE_P2P_ATTRIBUTE_NATIVE_ATOMIC_SUPPORTED:
      *value = state().p2p && state().p2p_atomics ? 1 : 0;
      break;
    default: return CUDA_ERROR_INVALID_VALUE;
  }
  return CUDA_SUCCESS;
}

// ---- Contexts ----

CUresult fake_cuDevicePrimaryCtxRetain(CUcontext* context, CUdevice dev) {
  if (!valid_device(dev)) return CUDA_ERROR_INVALID_DEVICE;
  std::lock_guard lock(state().mutex);
  ++state().primary_context_refs[dev];
  *context = reinterpret_cast<CUcontext>(&contexts()[dev]);
  return CUDA_SUCCESS;
}

CUresult fake_cuDevicePrimaryCtxRelease(CUdevice dev) {
  if (!valid_device(dev)) return CUDA_ERROR_INVALID_DEVICE;
  std::lock_guard lock(state().mutex);
  if (state().primary_context_refs[dev] <= 0) return CUDA_ERROR_INVALID_CONTEXT;
  --state().primary_context_refs[dev];
  return CUDA_SUCCESS;
}

// Ends everything of the primary context (its streams and events, its sticky error); the
// context itself stays retained.
CUresult fake_cuDevicePrimaryCtxReset(CUdevice dev) {
  if (!valid_device(dev)) return CUDA_ERROR_INVALID_DEVICE;
  std::lock_guard lock(state().mutex);
  FakeContext& c = contexts()[dev];
  c.sticky = CUDA_SUCCESS;
  ++c.resets;
  state().primary_context_resets.push_back(dev);
  state().peer_access.clear();  // peer access goes with it (both ways, simply: all of it)
  return CUDA_SUCCESS;
}

CUresult fake_cuCtxSetCurrent(CUcontext context) {
  auto* c = reinterpret_cast<FakeContext*>(context);
  if (c != nullptr && c->tag != kContextTag) return CUDA_ERROR_INVALID_CONTEXT;
  current = c;
  return CUDA_SUCCESS;
}

CUresult fake_cuCtxCreate(CUcontext* context, CUctxCreateParams* params, unsigned int flags,
                          CUdevice dev) {
  if (!valid_device(dev)) return CUDA_ERROR_INVALID_DEVICE;
  if (context == nullptr || params != nullptr || flags != CU_CTX_SCHED_AUTO) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  if (below_depth == kMaxStack) return CUDA_ERROR_INVALID_VALUE;  // the backend leaks pushes
  auto* made = new FakeContext{kContextTag, dev, false, CUDA_SUCCESS};
  {
    std::lock_guard lock(state().mutex);
    created_contexts().push_back(made);
    ++state().contexts_created;
  }
  below[below_depth++] = current;
  current = made;
  *context = reinterpret_cast<CUcontext>(made);
  return CUDA_SUCCESS;
}

CUresult fake_cuCtxPopCurrent(CUcontext* context) {
  if (current == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  if (context != nullptr) *context = reinterpret_cast<CUcontext>(current);
  current = below_depth > 0 ? below[--below_depth] : nullptr;
  return CUDA_SUCCESS;
}

CUresult fake_cuCtxDestroy(CUcontext context) {
  auto* c = reinterpret_cast<FakeContext*>(context);
  if (c == nullptr || c->tag != kContextTag || c->primary) return CUDA_ERROR_INVALID_CONTEXT;
  std::lock_guard lock(state().mutex);
  c->tag = 0;
  ++state().contexts_destroyed;
  if (current == c) current = nullptr;
  return CUDA_SUCCESS;
}

CUresult fake_cuCtxGetStreamPriorityRange(int* least, int* greatest) {
  if (current == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  *least = 0;
  *greatest = -5;
  return CUDA_SUCCESS;
}

CUresult fake_cuCtxEnablePeerAccess(CUcontext peer, unsigned int flags) {
  if (current == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  if (flags != 0 || peer == nullptr || gpu_of(peer) == current->gpu) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  std::lock_guard lock(state().mutex);
  if (!state().peer_access.emplace(current->gpu, gpu_of(peer)).second) {
    return CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED;
  }
  return CUDA_SUCCESS;
}

// ---- Memory ----

struct Vmm {
  CUdeviceptr next_va = 0x7f0000000000ull;
  std::map<CUdeviceptr, size_t> reserved;
  std::map<CUmemGenericAllocationHandle, std::pair<int, size_t>> physical;  // gpu, bytes
  CUmemGenericAllocationHandle next_handle = 1;
  struct Mapping {
    size_t bytes;
    std::map<int, unsigned long long> access;
  };
  std::map<CUdeviceptr, Mapping> mapped;
  std::set<void*> host_registered;
};
Vmm& vmm() {
  static Vmm* v = new Vmm();
  return *v;
}

CUresult fake_cuMemGetInfo(size_t* free, size_t* total) {
  if (current == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  *free = kGpuMemory - (1ull << 30);
  *total = kGpuMemory;
  return CUDA_SUCCESS;
}

CUresult fake_cuMemGetAllocationGranularity(size_t* granularity, const CUmemAllocationProp* prop,
                                            CUmemAllocationGranularity_flags option) {
  if (prop->type != CU_MEM_ALLOCATION_TYPE_PINNED ||
      prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE || !valid_device(prop->location.id) ||
      option != CU_MEM_ALLOC_GRANULARITY_MINIMUM) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  std::lock_guard lock(state().mutex);
  auto it = state().granularity.find(prop->location.id);
  *granularity = it != state().granularity.end() ? it->second : kGranularity;
  return CUDA_SUCCESS;
}

CUresult fake_cuMemAddressReserve(CUdeviceptr* ptr, size_t size, size_t alignment, CUdeviceptr addr,
                                  unsigned long long flags) {
  if (size == 0 || size % 4096 != 0 || addr != 0 || flags != 0) return CUDA_ERROR_INVALID_VALUE;
  std::lock_guard lock(state().mutex);
  state().reserve_alignments.push_back(alignment);
  state().reserve_sizes.push_back(size);
  Vmm& v = vmm();
  size_t align = alignment == 0 ? kGranularity : alignment;
  v.next_va = (v.next_va + align - 1) / align * align;
  *ptr = v.next_va;
  v.reserved[*ptr] = size;
  v.next_va += size + kGranularity;  // a gap, so ranges are never adjacent by accident
  return CUDA_SUCCESS;
}

CUresult fake_cuMemAddressFree(CUdeviceptr ptr, size_t size) {
  std::lock_guard lock(state().mutex);
  auto it = vmm().reserved.find(ptr);
  if (it == vmm().reserved.end() || it->second != size) return CUDA_ERROR_INVALID_VALUE;
  vmm().reserved.erase(it);
  return CUDA_SUCCESS;
}

CUresult fake_cuMemCreate(CUmemGenericAllocationHandle* handle, size_t size,
                          const CUmemAllocationProp* prop, unsigned long long flags) {
  if (flags != 0 || size == 0 || size % kGranularity != 0 ||
      prop->type != CU_MEM_ALLOCATION_TYPE_PINNED ||
      prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE || !valid_device(prop->location.id)) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  if (size > kGpuMemory) return CUDA_ERROR_OUT_OF_MEMORY;
  (void)expect_current(&contexts()[prop->location.id], "cuMemCreate");
  std::lock_guard lock(state().mutex);
  *handle = vmm().next_handle++;
  vmm().physical[*handle] = {prop->location.id, size};
  return CUDA_SUCCESS;
}

CUresult fake_cuMemRelease(CUmemGenericAllocationHandle handle) {
  std::lock_guard lock(state().mutex);
  return vmm().physical.erase(handle) == 1 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

CUresult fake_cuMemMap(CUdeviceptr ptr, size_t size, size_t offset,
                       CUmemGenericAllocationHandle handle, unsigned long long flags) {
  std::lock_guard lock(state().mutex);
  auto it = vmm().physical.find(handle);
  if (flags != 0 || it == vmm().physical.end() || offset + size > it->second.second ||
      ptr % kGranularity != 0 || size % kGranularity != 0 || offset % kGranularity != 0) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  // As the real driver (580, H100): an allocation maps only from its start, and whole.
  if (offset != 0 || size != it->second.second) return CUDA_ERROR_NOT_SUPPORTED;
  vmm().mapped[ptr] = {size, {}};
  return CUDA_SUCCESS;
}

CUresult fake_cuMemUnmap(CUdeviceptr ptr, size_t size) {
  std::lock_guard lock(state().mutex);
  auto& mapped = vmm().mapped;
  auto first = mapped.find(ptr);
  if (first == mapped.end()) return CUDA_ERROR_INVALID_VALUE;
  auto last = first;
  while (last != mapped.end() && last->first < ptr + size) ++last;
  mapped.erase(first, last);
  return CUDA_SUCCESS;
}

CUresult fake_cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc* desc,
                             size_t count) {
  std::lock_guard lock(state().mutex);
  state().set_access_calls.emplace_back(desc, desc + count);
  for (auto& [va, m] : vmm().mapped) {
    if (va + m.bytes <= ptr || va >= ptr + size) continue;
    for (size_t i = 0; i < count; ++i) m.access[desc[i].location.id] = desc[i].flags;
  }
  return CUDA_SUCCESS;
}

CUresult fake_cuMemGetAccess(unsigned long long* flags, const CUmemLocation* location,
                             CUdeviceptr ptr) {
  std::lock_guard lock(state().mutex);
  for (auto& [va, m] : vmm().mapped) {
    if (ptr >= va && ptr < va + m.bytes) {
      auto it = m.access.find(location->id);
      *flags = it == m.access.end() ? static_cast<unsigned long long>(CU_MEM_ACCESS_FLAGS_PROT_NONE)
                                    : it->second;
      return CUDA_SUCCESS;
    }
  }
  return CUDA_ERROR_INVALID_VALUE;
}

CUresult fake_cuMemHostRegister(void* p, size_t bytes, unsigned int flags) {
  if (current == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  if (p == nullptr || bytes == 0 || flags != CU_MEMHOSTREGISTER_PORTABLE) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  std::lock_guard lock(state().mutex);
  if (!vmm().host_registered.insert(p).second) return CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED;
  return CUDA_SUCCESS;
}

CUresult fake_cuMemHostUnregister(void* p) {
  std::lock_guard lock(state().mutex);
  return vmm().host_registered.erase(p) == 1 ? CUDA_SUCCESS : CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED;
}

// ---- Streams and events ----

CUresult fake_cuStreamCreateWithPriority(CUstream* stream, unsigned int flags, int priority) {
  if (current == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  if (CUresult sticky = current_sticky(); sticky != CUDA_SUCCESS) return sticky;
  std::lock_guard lock(state().mutex);
  state().stream_priorities.push_back(priority);
  state().stream_flags.push_back(flags);
  auto* made = new FakeStream{kStreamTag, current->gpu, current, current->resets};
  made_objects().insert(made);
  *stream = reinterpret_cast<CUstream>(made);
  return CUDA_SUCCESS;
}

CUresult fake_cuStreamDestroy(CUstream stream) {
  FakeStream* s = stream_of(stream);
  if (s == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  // Destroying works after a fault: that is how a program cleans up.
  (void)expect_current(s->context, "cuStreamDestroy");
  s->tag = 0;
  {
    std::lock_guard lock(state().mutex);
    made_objects().erase(s);
  }
  delete s;
  return CUDA_SUCCESS;
}

CUresult fake_cuCtxSynchronize() {
  if (current == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  std::lock_guard lock(state().mutex);
  state().context_synchronizations.push_back(current->gpu);
  return current->sticky;
}

CUresult fake_cuStreamSynchronize(CUstream stream) {
  FakeStream* s = stream_of(stream);
  if (s == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  return expect_current(s->context, "cuStreamSynchronize");
}

CUresult fake_cuStreamQuery(CUstream stream) {
  FakeStream* s = stream_of(stream);
  if (s == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  return expect_current(s->context, "cuStreamQuery");
}

CUresult fake_cuStreamAddCallback(CUstream stream, CUstreamCallback callback, void* user,
                                  unsigned int flags) {
  FakeStream* s = stream_of(stream);
  if (s == nullptr || flags != 0) return CUDA_ERROR_INVALID_HANDLE;
  // The work before it is "done" at once, with the status the test asked for.
  CUresult status;
  {
    std::lock_guard lock(state().mutex);
    status = state().callback_status;
  }
  callback(stream, status, user);
  return CUDA_SUCCESS;
}

CUresult fake_cuStreamWaitEvent(CUstream stream, CUevent event, unsigned int flags) {
  FakeStream* s = stream_of(stream);
  if (s == nullptr || event_of(event) == nullptr || flags != 0) return CUDA_ERROR_INVALID_HANDLE;
  return expect_current(s->context, "cuStreamWaitEvent");
}

CUresult fake_cuEventCreate(CUevent* event, unsigned int flags) {
  if (current == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  if ((flags & ~CU_EVENT_DISABLE_TIMING) != 0) return CUDA_ERROR_INVALID_VALUE;
  if (CUresult sticky = current_sticky(); sticky != CUDA_SUCCESS) return sticky;
  auto* made = new FakeEvent{kEventTag, current->gpu, (flags & CU_EVENT_DISABLE_TIMING) == 0,
                             false,     current,      current_resets()};
  std::lock_guard lock(state().mutex);
  made_objects().insert(made);
  *event = reinterpret_cast<CUevent>(made);
  return CUDA_SUCCESS;
}

CUresult fake_cuEventDestroy(CUevent event) {
  FakeEvent* e = event_of(event);
  if (e == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  e->tag = 0;
  {
    std::lock_guard lock(state().mutex);
    made_objects().erase(e);
  }
  delete e;
  std::lock_guard lock(state().mutex);
  ++state().events_destroyed;
  return CUDA_SUCCESS;
}

CUresult fake_cuEventRecord(CUevent event, CUstream stream) {
  FakeEvent* e = event_of(event);
  FakeStream* s = stream_of(stream);
  // The driver requires both in one context.
  if (e == nullptr || s == nullptr || e->context != s->context) return CUDA_ERROR_INVALID_HANDLE;
  if (CUresult r = expect_current(s->context, "cuEventRecord"); r != CUDA_SUCCESS) return r;
  e->recorded = true;
  return CUDA_SUCCESS;
}

CUresult fake_cuEventSynchronize(CUevent event) {
  FakeEvent* e = event_of(event);
  if (e == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  return expect_current(e->context, "cuEventSynchronize");
}

CUresult fake_cuEventQuery(CUevent event) {
  FakeEvent* e = event_of(event);
  if (e == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  // Polled by the kernel watch with the event's context current, like every event call.
  if (CUresult r = expect_current(e->context, "cuEventQuery"); r != CUDA_SUCCESS) return r;
  std::lock_guard lock(state().mutex);
  return state().events_pending ? CUDA_ERROR_NOT_READY : CUDA_SUCCESS;
}

CUresult fake_cuEventElapsedTime(float* ms, CUevent start, CUevent end) {
  FakeEvent* s = event_of(start);
  FakeEvent* e = event_of(end);
  if (s == nullptr || e == nullptr || !s->timing || !e->timing || !s->recorded || !e->recorded) {
    return CUDA_ERROR_INVALID_HANDLE;
  }
  *ms = 1.5f;
  return CUDA_SUCCESS;
}

// ---- Copies and memset ----

CUresult record_copy(FakeCudaCopy copy, CUstream stream, const char* call) {
  FakeStream* s = stream_of(stream);
  if (s == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  if (CUresult r = expect_current(s->context, call); r != CUDA_SUCCESS) return r;
  copy.gpu = s->gpu;
  std::lock_guard lock(state().mutex);
  state().copies.push_back(copy);
  return CUDA_SUCCESS;
}

CUresult fake_cuMemcpyHtoDAsync(CUdeviceptr dst, const void* src, size_t bytes, CUstream s) {
  return record_copy({"HtoD", dst, reinterpret_cast<CUdeviceptr>(src), bytes, 0, 0, -1, -1}, s,
                     "cuMemcpyHtoDAsync");
}

CUresult fake_cuMemcpyDtoHAsync(void* dst, CUdeviceptr src, size_t bytes, CUstream s) {
  return record_copy({"DtoH", reinterpret_cast<CUdeviceptr>(dst), src, bytes, 0, 0, -1, -1}, s,
                     "cuMemcpyDtoHAsync");
}

CUresult fake_cuMemcpyDtoDAsync(CUdeviceptr dst, CUdeviceptr src, size_t bytes, CUstream s) {
  return record_copy({"DtoD", dst, src, bytes, 0, 0, -1, -1}, s, "cuMemcpyDtoDAsync");
}

CUresult fake_cuMemcpyPeerAsync(CUdeviceptr dst, CUcontext dst_context, CUdeviceptr src,
                                CUcontext src_context, size_t bytes, CUstream s) {
  return record_copy({"Peer", dst, src, bytes, 0, 0, gpu_of(dst_context), gpu_of(src_context)}, s,
                     "cuMemcpyPeerAsync");
}

CUresult fake_cuMemsetD8Async(CUdeviceptr dst, unsigned char value, size_t n, CUstream s) {
  return record_copy({"D8", dst, 0, n, value, 0, -1, -1}, s, "cuMemsetD8Async");
}

CUresult fake_cuMemsetD16Async(CUdeviceptr dst, unsigned short value, size_t n, CUstream s) {
  return record_copy({"D16", dst, 0, n, value, 0, -1, -1}, s, "cuMemsetD16Async");
}

CUresult fake_cuMemsetD32Async(CUdeviceptr dst, unsigned int value, size_t n, CUstream s) {
  return record_copy({"D32", dst, 0, n, value, 0, -1, -1}, s, "cuMemsetD32Async");
}

// ---- Code ----

// Every library has the same three kernels (layouts as nvcc gives them).
CUresult fake_cuLibraryLoadData(CUlibrary* library, const void* code, CUjit_option* jit_options,
                                void** jit_values, unsigned int jit_count, CUlibraryOption* options,
                                void** option_values, unsigned int option_count) {
  if (code == nullptr || jit_options != nullptr || jit_values != nullptr || jit_count != 0 ||
      options != nullptr || option_values != nullptr || option_count != 0) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  uint32_t magic = 0;
  std::memcpy(&magic, code, sizeof magic);
  if (magic != 0xBA55ED50u && std::memcmp(code,
                                          "\x7f"
                                          "ELF",
                                          4) != 0) {
    // PTX: read as the driver does, up to the NUL (ASan catches a missing one).
    std::string text(static_cast<const char*>(code));
    if (text.find(".version") == std::string::npos) return CUDA_ERROR_INVALID_PTX;
  }
  {
    std::lock_guard lock(state().mutex);
    ++state().library_loads;
  }
  auto* lib = new FakeLibrary();
  lib->kernels.push_back(new FakeKernel{kKernelTag, "_Z4noopv", {}});
  lib->kernels.push_back(new FakeKernel{kKernelTag, "_Z11write_valuePii", {{0, 8}, {8, 4}}});
  lib->kernels.push_back(new FakeKernel{
      kKernelTag, "_Z10odd_paramsc9OddStructsPi", {{0, 1}, {8, 24}, {32, 2}, {40, 8}}});
  *library = reinterpret_cast<CUlibrary>(lib);
  return CUDA_SUCCESS;
}

CUresult fake_cuLibraryUnload(CUlibrary library) {
  auto* lib = reinterpret_cast<FakeLibrary*>(library);
  if (lib == nullptr || lib->tag != kLibraryTag) return CUDA_ERROR_INVALID_HANDLE;
  for (FakeKernel* k : lib->kernels) {
    k->tag = 0;
    delete k;
  }
  lib->tag = 0;
  delete lib;
  return CUDA_SUCCESS;
}

CUresult fake_cuLibraryGetKernel(CUkernel* kernel, CUlibrary library, const char* name) {
  auto* lib = reinterpret_cast<FakeLibrary*>(library);
  if (lib == nullptr || lib->tag != kLibraryTag) return CUDA_ERROR_INVALID_HANDLE;
  for (FakeKernel* k : lib->kernels) {
    if (k->name == name) {
      *kernel = reinterpret_cast<CUkernel>(k);
      return CUDA_SUCCESS;
    }
  }
  return CUDA_ERROR_NOT_FOUND;
}

FakeKernel* kernel_of(const void* handle) {
  auto* k = static_cast<FakeKernel*>(const_cast<void*>(handle));
  return k != nullptr && k->tag == kKernelTag ? k : nullptr;
}

CUresult fake_cuKernelGetName(const char** name, CUkernel kernel) {
  FakeKernel* k = kernel_of(kernel);
  if (k == nullptr || name == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *name = k->name.c_str();
  return CUDA_SUCCESS;
}

CUresult fake_cuKernelGetParamInfo(CUkernel kernel, size_t index, size_t* offset, size_t* size) {
  FakeKernel* k = kernel_of(kernel);
  if (k == nullptr || index >= k->params.size()) return CUDA_ERROR_INVALID_VALUE;
  *offset = k->params[index].first;
  if (size != nullptr) *size = k->params[index].second;
  return CUDA_SUCCESS;
}

CUresult fake_cuKernelSetAttribute(CUfunction_attribute attribute, int value, CUkernel kernel,
                                   CUdevice dev) {
  FakeKernel* k = kernel_of(kernel);
  if (k == nullptr || !valid_device(dev)) return CUDA_ERROR_INVALID_VALUE;
  if (attribute == CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES &&
      (value < 0 || value > (227 << 10))) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  std::lock_guard lock(state().mutex);
  state().kernel_attributes.push_back({k->name, attribute, value, dev});
  if (attribute == CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES) {
    k->max_dynamic_shared[dev] = value;
  }
  return CUDA_SUCCESS;
}

CUresult fake_cuLaunchKernel(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz,
                             unsigned int bx, unsigned int by, unsigned int bz,
                             unsigned int shared_bytes, CUstream stream, void** params,
                             void** extra) {
  FakeKernel* k = kernel_of(f);
  FakeStream* s = stream_of(stream);
  if (k == nullptr || s == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  if (params != nullptr) return CUDA_ERROR_INVALID_VALUE;  // the backend only uses `extra`
  if (CUresult r = expect_current(s->context, "cuLaunchKernel"); r != CUDA_SUCCESS) return r;
  {
    // As a real GPU: more than 48 KiB of dynamic shared memory needs the kernel's opt-in.
    std::lock_guard lock(state().mutex);
    if (shared_bytes > (48u << 10) &&
        static_cast<int>(shared_bytes) > k->max_dynamic_shared[s->gpu]) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    // The launch is accepted; the fault it makes shows at the context's next calls.
    if (!state().faulting_kernel.empty() && k->name == state().faulting_kernel) {
      s->context->sticky = CUDA_ERROR_ILLEGAL_ADDRESS;
    }
  }
  FakeCudaLaunch launch{k->name, {gx, gy, gz}, {bx, by, bz}, shared_bytes, s->gpu, extra != nullptr,
                        {}};
  if (extra != nullptr) {
    if (extra[0] != CU_LAUNCH_PARAM_BUFFER_POINTER || extra[2] != CU_LAUNCH_PARAM_BUFFER_SIZE ||
        extra[4] != CU_LAUNCH_PARAM_END) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    size_t bytes = *static_cast<size_t*>(extra[3]);
    const auto* buffer = static_cast<const std::byte*>(extra[1]);
    launch.params.assign(buffer, buffer + bytes);
  }
  std::lock_guard lock(state().mutex);
  state().launches.push_back(std::move(launch));
  return CUDA_SUCCESS;
}

// Every row of the backend's list, each fake checked against the row's PFN type.
struct Entry {
  const char* name;
  void* fn;
};
const Entry kEntries[] = {
#define HIBER_FAKE_ENTRY_(name, version) \
  {#name, reinterpret_cast<void*>(static_cast<PFN_##name##_v##version>(&fake_##name))},
    HIBER_CUDA_DRIVER_ENTRY_POINTS(HIBER_FAKE_ENTRY_)
#undef HIBER_FAKE_ENTRY_
};

}  // namespace

extern "C" __attribute__((visibility("default"))) FakeCuda* fake_cuda() { return &state(); }

// The GPU whose context is current on the calling thread, -1 for none: the fake libraries
// (fake_cublas.cc) check with it that hiberd made the stream's context current before calling
// them, as the real ones need.
extern "C" __attribute__((visibility("default"))) int fake_cuda_current_gpu() {
  return current != nullptr ? current->gpu : -1;
}

extern "C" __attribute__((visibility("default"))) const void* fake_cuda_current_context() {
  return current;
}

extern "C" __attribute__((visibility("default"))) CUresult cuGetProcAddress_v2(
    const char* symbol, void** pfn, int version, cuuint64_t flags,
    CUdriverProcAddressQueryResult* found) {
  {
    std::lock_guard lock(state().mutex);
    state().resolved.emplace_back(symbol, version);
    state().resolve_flags.insert(flags);
  }
  for (const Entry& e : kEntries) {
    if (std::strcmp(e.name, symbol) == 0) {
      *pfn = e.fn;
      if (found != nullptr) *found = CU_GET_PROC_ADDRESS_SUCCESS;
      return CUDA_SUCCESS;
    }
  }
  *pfn = nullptr;
  if (found != nullptr) *found = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
  return CUDA_ERROR_NOT_FOUND;
}
