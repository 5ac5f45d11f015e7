// The Device interface on the CUDA Driver API. See cuda_device.h for the model and
// cuda_driver.h for how entry points are found.
//
// Threading. Every method may run on any thread, concurrently. The CUDA "current context" is per
// thread, so each method makes the context it works in current before its first driver call (a
// stream's or event's own context, or the GPU's primary context for the rest; cuCtxSetCurrent is
// a thread-local store in the driver, cheap enough to repeat); nothing assumes a context left
// current by an earlier call. State of our own:
//   - constant after create(): gpus_, peer_, topology_, min_granularity_, max_granularity_;
//   - reservations_ and mappings_ under mappings_mutex_: the reserved and the mapped ranges, so
//     map/unmap/free reject misuse with a clear message before the driver sees it, and
//     set_access knows which GPUs own the memory behind a range;
//   - kernels_ and module_kernels_ under kernels_mutex_: parameter layouts of the kernels handed
//     out by get_function, so launch checks the parameter buffer without a driver call, and the
//     dynamic shared memory each kernel has been allowed on each GPU;
//   - created_ under contexts_mutex_: the contexts create_context made, each with an idle probe
//     stream whose query answers context_status without waiting for the context's work.
//
// Handles carry the driver's own handle values (CUcontext, CUstream, CUevent, CUlibrary, CUkernel,
// CUmemGenericAllocationHandle) in their id, with `gpu` set where the object belongs to one GPU
// and a stream's or event's `context` its CUcontext.
// They come only from hiberd's own code, never from a client, so they are trusted like the
// driver's handles would be.
#include "server/device/cuda_device.h"

#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <optional>
#include <unordered_map>
#include <utility>
#include <vector>

#include <glog/logging.h>

#include "common/fatbin.h"
#include "common/mutex.h"
#include "server/device/cuda_driver.h"
#include "server/device/cuda_kernel_watch.h"
#include "server/device/cuda_libraries.h"
#include "server/device/cuda_topology.h"

namespace hiber::device {
namespace {

using cuda_driver::CudaDriver;

// common/device_attributes.h names the attributes Hiber reads by their CUdevice_attribute values.
#define HIBER_CUDA_SAME_ATTRIBUTE_(ours, theirs) \
  static_assert(static_cast<int>(ours) == static_cast<int>(theirs), #ours " != " #theirs);
HIBER_CUDA_SAME_ATTRIBUTE_(kAttrMaxThreadsPerBlock, CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK)
HIBER_CUDA_SAME_ATTRIBUTE_(kAttrMaxBlockDimX, CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X)
HIBER_CUDA_SAME_ATTRIBUTE_(kAttrMaxGridDimX, CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X)
HIBER_CUDA_SAME_ATTRIBUTE_(kAttrMaxSharedMemoryPerBlock,
                           CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK)
HIBER_CUDA_SAME_ATTRIBUTE_(kAttrWarpSize, CU_DEVICE_ATTRIBUTE_WARP_SIZE)
HIBER_CUDA_SAME_ATTRIBUTE_(kAttrClockRate, CU_DEVICE_ATTRIBUTE_CLOCK_RATE)
HIBER_CUDA_SAME_ATTRIBUTE_(kAttrMultiprocessorCount, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
HIBER_CUDA_SAME_ATTRIBUTE_(kAttrMemoryClockRate, CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE)
HIBER_CUDA_SAME_ATTRIBUTE_(kAttrGlobalMemoryBusWidth, CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH)
HIBER_CUDA_SAME_ATTRIBUTE_(kAttrL2CacheSize, CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE)
HIBER_CUDA_SAME_ATTRIBUTE_(kAttrMaxThreadsPerMultiprocessor,
                           CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR)
HIBER_CUDA_SAME_ATTRIBUTE_(kAttrUnifiedAddressing, CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING)
HIBER_CUDA_SAME_ATTRIBUTE_(kAttrCanMapHostMemory, CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY)
HIBER_CUDA_SAME_ATTRIBUTE_(kAttrMaxSharedMemoryPerMultiprocessor,
                           CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR)
HIBER_CUDA_SAME_ATTRIBUTE_(kAttrMaxSharedMemoryPerBlockOptin,
                           CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)
HIBER_CUDA_SAME_ATTRIBUTE_(kAttrMaxBlocksPerMultiprocessor,
                           CU_DEVICE_ATTRIBUTE_MAX_BLOCKS_PER_MULTIPROCESSOR)
HIBER_CUDA_SAME_ATTRIBUTE_(kAttrComputeCapabilityMajor,
                           CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)
HIBER_CUDA_SAME_ATTRIBUTE_(kAttrComputeCapabilityMinor,
                           CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)
HIBER_CUDA_SAME_ATTRIBUTE_(kAttrVirtualMemoryManagementSupported,
                           CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED)
#undef HIBER_CUDA_SAME_ATTRIBUTE_
static_assert(static_cast<int>(kAttrCount) >= static_cast<int>(CU_DEVICE_ATTRIBUTE_MAX),
              "DeviceProperties::attributes has no room for every CUdevice_attribute of cuda.h");

// Calls a driver entry point through the table and turns its CUresult into a Status naming the
// call: HIBER_CU(cuMemCreate, &handle, bytes, &prop, 0).
#define HIBER_CU(name, ...) cu_.check(cu_.pfn_##name(__VA_ARGS__), #name)

template <typename Handle>
uint64_t to_id(Handle handle) {
  return static_cast<uint64_t>(reinterpret_cast<uintptr_t>(handle));
}

template <typename Handle>
Handle from_id(uint64_t id) {
  return reinterpret_cast<Handle>(static_cast<uintptr_t>(id));
}

// `status` with "<context>: " in front when it is an error. The context is built only then, so
// the hot paths (copies, launches) format nothing when they succeed.
template <typename MakeContext>
Status on_error(Status status, MakeContext&& make_context) {
  if (status.ok()) return status;
  return status.with_context(make_context());
}

bool is_power_of_two(uint64_t v) { return v != 0 && (v & (v - 1)) == 0; }

// Every physical allocation is pinned device memory on one GPU, with no shareable handle type:
// memory never leaves the hiberd process (clients see it through the mappings hiberd makes).
CUmemAllocationProp device_allocation_prop(CUdevice device) {
  CUmemAllocationProp prop = {};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = device;
  return prop;
}

// Runs on a driver thread once the work before it on its stream is done. It makes no CUDA call
// (the driver forbids it in stream callbacks), so the error is described by our own code names
// rather than cuGetErrorString. noexcept: a throwing callback terminates the process instead of
// unwinding through the driver.
void CUDA_CB run_stream_callback(CUstream, CUresult status, void* user) noexcept {
  std::unique_ptr<StreamCallback> callback(static_cast<StreamCallback*>(user));
  if (status == CUDA_SUCCESS) {
    (*callback)(Status());
  } else {
    (*callback)(Status(static_cast<ErrorCode>(static_cast<uint32_t>(status)),
                       "work enqueued on the stream before the callback failed"));
  }
}

// __fatBinC_Wrapper_t's magic: {int magic, int version, const unsigned long long* data, ...}.
constexpr uint32_t kFatbinWrapperMagic = 0x466243b1;

class CudaDevice final : public Device, private CudaContexts {
 public:
  static Result<std::unique_ptr<Device>> create(const CudaDeviceOptions& options);
  ~CudaDevice() override;

  std::string backend_name() const override { return "cuda"; }
  int gpu_count() const override { return static_cast<int>(gpus_.size()); }
  const DeviceProperties& properties(int gpu) const override;
  const NodeConfig& topology() const override { return topology_; }
  Result<MemoryInfo> memory_info(int gpu) override;
  uint64_t allocation_granularity(int gpu) const override;
  bool can_access_peer(int gpu, int peer) const override;

  Result<DevicePtr> reserve_address_range(uint64_t bytes, uint64_t alignment) override;
  Result<DevicePtr> reserve_address_range_at(DevicePtr va, uint64_t bytes) override;
  Status free_address_range(DevicePtr va, uint64_t bytes) override;
  Result<PhysicalMemory> create_physical(int gpu, uint64_t bytes) override;
  Status release_physical(PhysicalMemory memory) override;
  Status map(DevicePtr va, uint64_t bytes, PhysicalMemory memory, uint64_t offset) override;
  Status unmap(DevicePtr va, uint64_t bytes) override;
  Status set_access(DevicePtr va, uint64_t bytes, std::span<const int> gpus) override;
  Status register_host_memory(void* ptr, uint64_t bytes) override;
  Status unregister_host_memory(void* ptr) override;

  Context shared_context(int gpu) const override;
  Result<Context> create_context(int gpu) override;
  Status destroy_context(Context context) override;
  Status context_status(Context context) override;
  Status reset_shared_context(int gpu) override;

  using Device::create_event;
  using Device::create_stream;
  Result<Stream> create_stream(Context context, int priority) override;
  Status destroy_stream(Stream stream) override;
  Status synchronize_stream(Stream stream) override;
  Status query_stream(Stream stream) override;
  Status add_callback(Stream stream, StreamCallback callback) override;
  Status cancel_stream(Stream stream, const Status& why) override;
  Result<Event> create_event(Context context, bool disable_timing) override;
  Status destroy_event(Event event) override;
  Status record_event(Event event, Stream stream) override;
  Status wait_event(Stream stream, Event event) override;
  Status synchronize_event(Event event) override;
  Status query_event(Event event) override;
  Result<float> elapsed_ms(Event start, Event end) override;

  Status copy_host_to_device(Stream stream, DevicePtr dst, const void* src,
                             uint64_t bytes) override;
  Status copy_device_to_host(Stream stream, void* dst, DevicePtr src, uint64_t bytes) override;
  Status copy_device_to_device(Stream stream, DevicePtr dst, DevicePtr src,
                               uint64_t bytes) override;
  Status copy_peer(Stream stream, DevicePtr dst, int dst_gpu, DevicePtr src, int src_gpu,
                   uint64_t bytes) override;
  Status memset(Stream stream, DevicePtr dst, uint32_t value, int element_bytes,
                uint64_t count) override;

  Result<Module> load_module(std::span<const std::byte> image) override;
  Status unload_module(Module module) override;
  Result<Function> get_function(Module module, const std::string& name) override;
  Result<KernelInfo> function_info(Function function) override;
  Status launch(Stream stream, Function function, const LaunchConfig& config,
                std::span<const std::byte> params) override;
  // The real cuBLAS (with cuBLASLt) and cuDNN (cuda_libraries.h).
  LibraryBackend* library(library_ops::Library library) override;

 private:
  struct Gpu {
    CUdevice device = 0;
    CUcontext context = nullptr;  // the primary context, retained until destruction
    DeviceProperties properties;
    uint64_t granularity = 0;   // CU_MEM_ALLOC_GRANULARITY_MINIMUM, see allocation_granularity
    int least_priority = 0;     // cuCtxGetStreamPriorityRange: numerically largest
    int greatest_priority = 0;  // numerically smallest
  };
  struct Mapping {
    uint64_t bytes = 0;
    int gpu = 0;  // where the physical memory lives
  };
  // A PhysicalMemory on CUDA: cuMemMap maps an allocation only from its start (its offset
  // "must be zero"; the 580 driver answers CUDA_ERROR_NOT_SUPPORTED otherwise), so memory that
  // is mapped in pieces at offsets is made of one allocation per granularity unit.
  struct Physical {
    int gpu = 0;
    std::vector<CUmemGenericAllocationHandle> chunks;  // chunk i backs [i * granularity, ...)
  };

  explicit CudaDevice(const CudaDriver& driver) : cu_(driver) {}

  Status init_gpu(int ordinal);
  // Makes `gpu`'s primary context current and gives it an idle probe stream (at creation, and
  // again after a reset destroyed the last one).
  Status make_primary_probe(int gpu);
  // Peer access between the primary contexts of `gpu` and every capable peer (both ways), or
  // of every capable pair when none.
  Status enable_peer_access(std::optional<int> gpu);
  Status init_peers();
  Status discover_topology();
  Status use_configured_topology(const NodeConfig& node);

  bool valid_gpu(int gpu) const { return gpu >= 0 && gpu < gpu_count(); }
  Status no_such_gpu(int gpu) const;
  std::string gpu_model(int gpu) const override;
  // Validates `gpu` and makes its primary context current on this thread (also what the library
  // backends use, through CudaContexts).
  Status use_gpu(int gpu) const override;
  // Makes a context current: its id is its CUcontext (0 stands for the GPU's primary context).
  Status use_context(Context context) const override;
  // Validates a stream handle and makes its context current: a Stream's id is its CUstream.
  Result<CUstream> use_stream(Stream stream) const override;
  Status synchronize_context(Context context) const override;
  // The idle stream of a context of this device; kInvalidContext for a context it did not make
  // or already destroyed.
  Result<CUstream> probe_of(Context context) const;
  Result<CUevent> event_of(Event event) const;
  // Grid and block within the GPU's limits, so a bad launch is refused with the reason rather
  // than the driver's bare CUDA_ERROR_INVALID_VALUE.
  Status check_launch_dimensions(int gpu, const LaunchConfig& config) const;
  // Lets `kernel` use `bytes` of dynamic shared memory on `gpu`. Beyond the GPU's default
  // per-block limit (48 KiB) a kernel must opt in, per GPU, up to the GPU's opt-in limit, or the
  // launch fails; the driver is asked once per kernel, GPU and larger size.
  Status allow_dynamic_shared_memory(CUkernel kernel, int gpu, uint32_t bytes);

  const CudaDriver& cu_;

  // Constant after create().
  std::vector<Gpu> gpus_;
  // peer_[gpu][peer]: cuDeviceCanAccessPeer (false on the diagonal).
  std::vector<std::vector<bool>> peer_;
  NodeConfig topology_;
  // Over all GPUs: a reserved range is a multiple of the smallest (so of the granularity of
  // the GPU whose memory it is for), and is reserved from the driver in, and aligned to, the
  // largest, so memory of any GPU can be mapped anywhere in it on its own granularity.
  uint64_t min_granularity_ = 0;
  uint64_t max_granularity_ = 0;

  struct Reservation {
    uint64_t bytes = 0;         // as asked for, and as free_address_range must give back
    uint64_t driver_bytes = 0;  // bytes rounded up to max_granularity_: what the driver holds
  };
  mutable Mutex mappings_mutex_;
  std::map<DevicePtr, Reservation> reservations_ GUARDED_BY(mappings_mutex_);  // by start
  std::map<DevicePtr, Mapping> mappings_ GUARDED_BY(mappings_mutex_);          // by start address
  // PhysicalMemory ids (never 0) to their allocations.
  std::unordered_map<uint64_t, Physical> physical_ GUARDED_BY(mappings_mutex_);
  uint64_t next_physical_id_ GUARDED_BY(mappings_mutex_) = 1;

  struct KernelState {
    KernelInfo info;
    // Per GPU: the CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES set for the kernel so far
    // (0: the GPU's default per-block limit applies).
    std::vector<uint32_t> max_dynamic_shared;
  };
  mutable SharedMutex kernels_mutex_;
  // Kernels by handle, and the kernels handed out per module.
  std::unordered_map<CUkernel, KernelState> kernels_ GUARDED_BY(kernels_mutex_);
  std::unordered_map<CUlibrary, std::vector<CUkernel>> module_kernels_ GUARDED_BY(kernels_mutex_);

  struct CreatedContext {
    int gpu = 0;
    CUstream probe = nullptr;
  };
  mutable Mutex contexts_mutex_;
  std::unordered_map<CUcontext, CreatedContext> created_ GUARDED_BY(contexts_mutex_);
  // Per GPU: an idle stream of the primary context (context_status), remade after a reset.
  std::vector<CUstream> primary_probes_ GUARDED_BY(contexts_mutex_);

  // The remoted libraries' backends, made at creation (they open nothing until a client creates
  // a handle) and destroyed first, while the contexts their handles live in still exist.
  std::unique_ptr<LibraryBackend> blas_;
  std::unique_ptr<LibraryBackend> dnn_;
  // Kernel deadlines (LaunchConfig::deadline); destroyed before the contexts are released.
  std::unique_ptr<CudaKernelWatch> watch_;
};

// ---- Creation ----

Result<std::unique_ptr<Device>> CudaDevice::create(const CudaDeviceOptions& options) {
  HIBER_ASSIGN_OR_RETURN(const CudaDriver* cu, cuda_driver::load_driver());
  int count = 0;
  HIBER_RETURN_IF_ERROR(cu->check(cu->pfn_cuDeviceGetCount(&count), "cuDeviceGetCount"));
  if (count <= 0) {
    const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
    return Status(ErrorCode::kNoDevice,
                  str_cat("the NVIDIA driver reports no GPU",
                          visible != nullptr ? str_cat(" (CUDA_VISIBLE_DEVICES='", visible, "')")
                                             : std::string()));
  }
  // The destructor releases whatever primary contexts were retained if a later step fails.
  std::unique_ptr<CudaDevice> device(new CudaDevice(*cu));
  for (int i = 0; i < count; ++i) HIBER_RETURN_IF_ERROR(device->init_gpu(i));
  device->min_granularity_ = device->gpus_[0].granularity;
  device->max_granularity_ = device->gpus_[0].granularity;
  for (const Gpu& gpu : device->gpus_) {
    device->min_granularity_ = std::min(device->min_granularity_, gpu.granularity);
    device->max_granularity_ = std::max(device->max_granularity_, gpu.granularity);
  }
  HIBER_RETURN_IF_ERROR(device->init_peers());
  if (options.node.has_value()) {
    HIBER_RETURN_IF_ERROR(device->use_configured_topology(*options.node));
  } else {
    HIBER_RETURN_IF_ERROR(device->discover_topology());
  }
  device->blas_ = make_cuda_blas_backend(*device, options.libraries);
  device->dnn_ = make_cuda_dnn_backend(*device, options.libraries);
  device->watch_ = std::make_unique<CudaKernelWatch>(
      *cu, [d = device.get()](Context context) { return d->use_context(context); });
  LOG(INFO) << "CUDA backend: " << describe(device->topology_);
  return std::unique_ptr<Device>(std::move(device));
}

CudaDevice::~CudaDevice() {
  // Library handles and watched launches first: destroying them needs their GPU's context.
  watch_.reset();
  blas_.reset();
  dnn_.reset();
  {
    MutexLock lock(contexts_mutex_);
    for (auto& [context, created] : created_) {
      LOG(WARNING) << "a context of GPU " << created.gpu << " was never destroyed; destroying it";
      (void)cu_.pfn_cuCtxDestroy(context);
    }
    created_.clear();
  }
  for (const Gpu& gpu : gpus_) {
    if (gpu.context == nullptr) continue;
    const int g = gpu.properties.ordinal;
    CUstream probe = nullptr;
    {
      MutexLock lock(contexts_mutex_);
      if (g < static_cast<int>(primary_probes_.size())) probe = primary_probes_[g];
    }
    if (probe != nullptr && use_gpu(g).ok()) (void)cu_.pfn_cuStreamDestroy(probe);
    Status s = HIBER_CU(cuDevicePrimaryCtxRelease, gpu.device);
    // At process exit the driver may already be torn down; nothing is left to release then.
    if (!s.ok() && s.code() != ErrorCode::kDeinitialized) {
      LOG(WARNING) << "releasing the primary context of GPU " << gpu.properties.ordinal << ": "
                   << s;
    }
  }
}

Status CudaDevice::init_gpu(int ordinal) {
  Gpu& gpu = gpus_.emplace_back();
  gpu.properties.ordinal = ordinal;
  HIBER_RETURN_IF_ERROR(HIBER_CU(cuDeviceGet, &gpu.device, ordinal));
  HIBER_RETURN_IF_ERROR(HIBER_CU(cuDevicePrimaryCtxRetain, &gpu.context, gpu.device));
  DeviceProperties& p = gpu.properties;
  auto context = [&](std::string_view what) {
    return str_cat("GPU ", ordinal, p.name.empty() ? "" : str_cat(" (", p.name, ")"), ": ", what);
  };

  char name[256] = {};
  HIBER_RETURN_IF_ERROR(
      HIBER_CU(cuDeviceGetName, name, sizeof name - 1, gpu.device).with_context(context("name")));
  p.name = name;
  CUuuid uuid;
  HIBER_RETURN_IF_ERROR(HIBER_CU(cuDeviceGetUuid, &uuid, gpu.device).with_context(context("uuid")));
  std::memcpy(p.uuid.data(), uuid.bytes, p.uuid.size());
  char bus_id[64] = {};
  HIBER_RETURN_IF_ERROR(HIBER_CU(cuDeviceGetPCIBusId, bus_id, sizeof bus_id - 1, gpu.device)
                            .with_context(context("PCI bus id")));
  Result<std::string> normalized = cuda_topology::normalize_pci_bus_id(bus_id);
  if (!normalized.ok()) return normalized.status().with_context(context("cuDeviceGetPCIBusId"));
  p.pci_bus_id = *normalized;
  size_t total = 0;
  HIBER_RETURN_IF_ERROR(
      HIBER_CU(cuDeviceTotalMem, &total, gpu.device).with_context(context("total memory")));
  p.total_memory_bytes = total;

  // Every index the table has room for. The enum has gaps and drivers add attributes, so an
  // index the driver does not know (CUDA_ERROR_INVALID_VALUE) or does not report for this GPU
  // (CUDA_ERROR_NOT_SUPPORTED) reads as 0; any other error is real and fails creation.
  p.attributes.assign(kAttrCount, 0);
  for (int a = 1; a < kAttrCount; ++a) {
    int value = 0;
    CUresult r =
        cu_.pfn_cuDeviceGetAttribute(&value, static_cast<CUdevice_attribute>(a), gpu.device);
    if (r == CUDA_SUCCESS) {
      p.attributes[a] = value;
    } else if (r != CUDA_ERROR_INVALID_VALUE && r != CUDA_ERROR_NOT_SUPPORTED) {
      return cu_.check(r, "cuDeviceGetAttribute").with_context(context(str_cat("attribute ", a)));
    }
  }
  if (p.attribute(kAttrVirtualMemoryManagementSupported) != 1) {
    return Status(ErrorCode::kNotSupported,
                  context("does not support CUDA virtual memory management (cuMemCreate/"
                          "cuMemMap), which Hiber's memory pools are built on"));
  }
  if (p.attribute(kAttrUnifiedAddressing) != 1) {
    return Status(ErrorCode::kNotSupported,
                  context("has no unified addressing, which Hiber's shared address space needs"));
  }

  // MINIMUM, not RECOMMENDED: it is the unit cuMemMap/cuMemSetAccess actually require, and
  // Hiber maps every block of a function at the function's own address, so a larger unit would
  // round each block up and waste memory. The pools themselves are created in large chunks, so
  // the driver still backs them with large pages where it can.
  CUmemAllocationProp prop = device_allocation_prop(gpu.device);
  size_t granularity = 0;
  HIBER_RETURN_IF_ERROR(
      HIBER_CU(cuMemGetAllocationGranularity, &granularity, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM)
          .with_context(context("allocation granularity")));
  if (!is_power_of_two(granularity)) {
    return Status(ErrorCode::kNotSupported, context(str_cat("allocation granularity ", granularity,
                                                            " is not a power of two")));
  }
  gpu.granularity = granularity;

  HIBER_RETURN_IF_ERROR(HIBER_CU(cuCtxSetCurrent, gpu.context));
  HIBER_RETURN_IF_ERROR(
      HIBER_CU(cuCtxGetStreamPriorityRange, &gpu.least_priority, &gpu.greatest_priority)
          .with_context(context("stream priorities")));
  return make_primary_probe(ordinal);
}

Status CudaDevice::make_primary_probe(int gpu) {
  HIBER_RETURN_IF_ERROR(use_gpu(gpu));
  CUstream probe = nullptr;
  HIBER_RETURN_IF_ERROR(HIBER_CU(cuStreamCreateWithPriority, &probe, CU_STREAM_NON_BLOCKING, 0)
                            .with_context(str_cat("GPU ", gpu, ": the primary context's probe")));
  MutexLock lock(contexts_mutex_);
  if (static_cast<int>(primary_probes_.size()) <= gpu) primary_probes_.resize(gpu + 1, nullptr);
  primary_probes_[gpu] = probe;
  return Status();
}

Status CudaDevice::init_peers() {
  const int n = gpu_count();
  // A GPU is not its own peer (cuDeviceCanAccessPeer answers 0 for it, and so do we).
  peer_.assign(n, std::vector<bool>(n, false));
  for (int g = 0; g < n; ++g) {
    for (int p = 0; p < n; ++p) {
      if (p == g) continue;
      int can = 0;
      HIBER_RETURN_IF_ERROR(HIBER_CU(cuDeviceCanAccessPeer, &can, gpus_[g].device, gpus_[p].device)
                                .with_context(str_cat("GPU ", g, " -> GPU ", p)));
      peer_[g][p] = can != 0;
    }
  }
  return enable_peer_access(std::nullopt);
}

Status CudaDevice::enable_peer_access(std::optional<int> gpu) {
  const int n = gpu_count();
  // Peer access for every capable pair: peer copies between the primary contexts then go
  // GPU to GPU instead of through the host. (VMM mappings get their peer access from
  // set_access; this covers cuMemcpyPeerAsync and anything else using the legacy mechanism.)
  for (int g = 0; g < n; ++g) {
    for (int p = 0; p < n; ++p) {
      if (p == g || !peer_[g][p] || (gpu && g != *gpu && p != *gpu)) continue;
      HIBER_RETURN_IF_ERROR(use_gpu(g));
      CUresult r = cu_.pfn_cuCtxEnablePeerAccess(gpus_[p].context, 0);
      if (r == CUDA_SUCCESS || r == CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED) continue;
      if (r == CUDA_ERROR_TOO_MANY_PEERS) {
        // The legacy mechanism has a per-GPU peer limit (8); VMM access via set_access has
        // none, so the pair stays peer-capable and only cuMemcpyPeerAsync stages through the
        // host for it.
        LOG(WARNING) << "GPU " << g << " -> GPU " << p << ": "
                     << cu_.check(r, "cuCtxEnablePeerAccess")
                     << "; peer copies between them will stage through the host";
        continue;
      }
      return cu_.check(r, "cuCtxEnablePeerAccess").with_context(str_cat("GPU ", g, " -> GPU ", p));
    }
  }
  return Status();
}

Status CudaDevice::discover_topology() {
  const int n = gpu_count();
  NodeConfig node;
  char host[256] = {};
  node.name = gethostname(host, sizeof host - 1) == 0 && host[0] != '\0' ? host : "cuda-node";
  node.description =
      "discovered by the CUDA backend; bandwidths are estimates from PCIe link speeds (sysfs) "
      "and P2P performance ranks, not measurements";

  std::vector<std::string> bus_ids;
  for (const Gpu& gpu : gpus_) bus_ids.push_back(gpu.properties.pci_bus_id);
  cuda_topology::PcieLayout pcie = cuda_topology::discover_pcie_layout(bus_ids);
  for (const std::string& note : pcie.notes) LOG(WARNING) << "topology: " << note;
  node.pcie_switches = pcie.switches;

  for (int g = 0; g < n; ++g) {
    const DeviceProperties& p = gpus_[g].properties;
    GpuSpec spec;
    spec.model = cuda_topology::model_key(p.name);
    spec.product_name = p.name;
    spec.memory_bytes = p.total_memory_bytes;
    spec.compute_capability_major = p.attribute(kAttrComputeCapabilityMajor);
    spec.compute_capability_minor = p.attribute(kAttrComputeCapabilityMinor);
    spec.multiprocessors = p.attribute(kAttrMultiprocessorCount);
    spec.clock_rate_khz = p.attribute(kAttrClockRate);
    spec.memory_clock_rate_khz = p.attribute(kAttrMemoryClockRate);
    spec.memory_bus_width_bits = p.attribute(kAttrGlobalMemoryBusWidth);
    spec.l2_cache_bytes = p.attribute(kAttrL2CacheSize);
    // Theoretical peak: two transfers per memory clock (DDR/HBM) over the whole bus. For an
    // H100 SXM (2619 MHz, 5120 bits) this gives 3352 GB/s against the 3350 NVIDIA quotes. 0 when
    // the driver does not report the memory clock.
    spec.memory_bandwidth_gbps =
        2.0 * spec.memory_clock_rate_khz * 1e3 * spec.memory_bus_width_bits / 8.0 / 1e9;
    spec.pcie_switch = pcie.switch_of_gpu[g];
    spec.pci_bus_id = p.pci_bus_id;
    node.gpus.push_back(std::move(spec));
  }

  for (int a = 0; a < n; ++a) {
    for (int b = a + 1; b < n; ++b) {
      // Both directions must allow access for a usable link; the worse rank of the two counts.
      int access = 1, rank = 0, atomics = 1;
      for (auto [src, dst] : {std::pair{a, b}, std::pair{b, a}}) {
        int value = 0;
        HIBER_RETURN_IF_ERROR(HIBER_CU(cuDeviceGetP2PAttribute, &value,
                                       CU_DEVICE_P2P_ATTRIBUTE_ACCESS_SUPPORTED, gpus_[src].device,
                                       gpus_[dst].device));
        access &= value != 0 ? 1 : 0;
        HIBER_RETURN_IF_ERROR(HIBER_CU(cuDeviceGetP2PAttribute, &value,
                                       CU_DEVICE_P2P_ATTRIBUTE_PERFORMANCE_RANK, gpus_[src].device,
                                       gpus_[dst].device));
        rank = std::max(rank, value);
        HIBER_RETURN_IF_ERROR(HIBER_CU(cuDeviceGetP2PAttribute, &value,
                                       CU_DEVICE_P2P_ATTRIBUTE_NATIVE_ATOMIC_SUPPORTED,
                                       gpus_[src].device, gpus_[dst].device));
        atomics &= value != 0 ? 1 : 0;
      }
      if (!access) continue;
      const GpuSpec& ga = node.gpus[a];
      const GpuSpec& gb = node.gpus[b];
      // The older GPU of the pair bounds the link.
      bool a_older = std::pair(ga.compute_capability_major, ga.compute_capability_minor) <
                     std::pair(gb.compute_capability_major, gb.compute_capability_minor);
      const GpuSpec& older = a_older ? ga : gb;
      // Only NVLink pairs are links of the topology: peers over PCIe share their switches'
      // bandwidth, which the PCIe switches already model, and a link would let the scheduler
      // count on bandwidth that is not there.
      std::optional<double> gbps = cuda_topology::nvlink_bandwidth_estimate_gbps(
          older.compute_capability_major, older.compute_capability_minor, rank, atomics != 0);
      if (gbps.has_value()) node.nvlinks.push_back({a, b, *gbps});
    }
  }
  topology_ = std::move(node);
  return Status();
}

Status CudaDevice::use_configured_topology(const NodeConfig& node) {
  if (node.gpu_count() != gpu_count()) {
    return Status(ErrorCode::kInvalidValue,
                  str_cat("node config '", node.name, "' describes ", node.gpu_count(),
                          " GPUs but the NVIDIA driver sees ", gpu_count()));
  }
  for (int g = 0; g < gpu_count(); ++g) {
    Result<std::string> configured = cuda_topology::normalize_pci_bus_id(node.gpus[g].pci_bus_id);
    if (!configured.ok()) {
      return configured.status().with_context(
          str_cat("node config '", node.name, "': gpus[", g, "].pciBusId"));
    }
    const std::string& actual = gpus_[g].properties.pci_bus_id;
    if (*configured != actual) {
      return Status(
          ErrorCode::kInvalidValue,
          str_cat("node config '", node.name, "': GPU ", g, " is at PCI bus ", *configured,
                  " in the config but the driver's GPU ", g, " is at ", actual,
                  " (set CUDA_DEVICE_ORDER=PCI_BUS_ID so the driver numbers "
                  "GPUs in bus order)"));
    }
  }
  topology_ = node;
  for (int g = 0; g < gpu_count(); ++g) {
    topology_.gpus[g].pci_bus_id = gpus_[g].properties.pci_bus_id;
  }
  return Status();
}

// ---- Helpers ----

Status CudaDevice::no_such_gpu(int gpu) const {
  return Status(ErrorCode::kInvalidDevice,
                str_cat("GPU ", gpu, " does not exist (this node has ", gpu_count(), " GPUs)"));
}

std::string CudaDevice::gpu_model(int gpu) const {
  if (!valid_gpu(gpu)) return "no such GPU";
  const DeviceProperties& p = gpus_[gpu].properties;
  return str_cat(p.name, " sm_", p.attribute(kAttrComputeCapabilityMajor),
                 p.attribute(kAttrComputeCapabilityMinor), " with ",
                 p.attribute(kAttrMultiprocessorCount), " SMs");
}

Status CudaDevice::use_gpu(int gpu) const {
  if (!valid_gpu(gpu)) return no_such_gpu(gpu);
  return HIBER_CU(cuCtxSetCurrent, gpus_[gpu].context);
}

Status CudaDevice::use_context(Context context) const {
  if (!valid_gpu(context.gpu)) return no_such_gpu(context.gpu);
  CUcontext c = context.id != 0 ? from_id<CUcontext>(context.id) : gpus_[context.gpu].context;
  return HIBER_CU(cuCtxSetCurrent, c);
}

Result<CUstream> CudaDevice::use_stream(Stream stream) const {
  if (stream.id == 0) {
    // 0 would be CUDA's legacy default stream, which Hiber never uses: it synchronises with
    // every other stream of the context and so with every other function on the GPU.
    return Status(ErrorCode::kInvalidHandle, "stream handle 0 was not made by create_stream");
  }
  HIBER_RETURN_IF_ERROR(use_context(Context{stream.context, stream.gpu}));
  return from_id<CUstream>(stream.id);
}

Status CudaDevice::synchronize_context(Context context) const {
  HIBER_RETURN_IF_ERROR(use_context(context));
  return HIBER_CU(cuCtxSynchronize);
}

Result<CUstream> CudaDevice::probe_of(Context context) const {
  if (!valid_gpu(context.gpu)) return no_such_gpu(context.gpu);
  MutexLock lock(contexts_mutex_);
  if (context.id == 0 || from_id<CUcontext>(context.id) == gpus_[context.gpu].context) {
    return primary_probes_.at(context.gpu);
  }
  auto it = created_.find(from_id<CUcontext>(context.id));
  if (it == created_.end() || it->second.gpu != context.gpu) {
    return Status(ErrorCode::kInvalidContext,
                  str_cat("context ", hex(context.id), " of GPU ", context.gpu,
                          " was not made by create_context, or is destroyed"));
  }
  return it->second.probe;
}

Result<CUevent> CudaDevice::event_of(Event event) const {
  if (event.id == 0) {
    return Status(ErrorCode::kInvalidHandle, "event handle 0 was not made by create_event");
  }
  if (!valid_gpu(event.gpu)) return no_such_gpu(event.gpu);
  return from_id<CUevent>(event.id);
}

Status CudaDevice::check_launch_dimensions(int gpu, const LaunchConfig& config) const {
  const DeviceProperties& p = gpus_[gpu].properties;
  const Dim3& grid = config.grid;
  const Dim3& block = config.block;
  auto dims = [](const Dim3& d) { return str_cat(d.x, "x", d.y, "x", d.z); };
  auto too_big = [&](uint32_t value, int attribute) {
    return value > static_cast<uint32_t>(std::max(p.attribute(attribute), 0));
  };
  if (grid.x == 0 || grid.y == 0 || grid.z == 0 || block.x == 0 || block.y == 0 || block.z == 0) {
    return Status(ErrorCode::kInvalidValue, str_cat("launch: grid ", dims(grid), ", block ",
                                                    dims(block), " has a zero dimension"));
  }
  if (too_big(block.x, CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X) ||
      too_big(block.y, CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y) ||
      too_big(block.z, CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z) ||
      uint64_t{block.x} * block.y * block.z >
          static_cast<uint64_t>(std::max(p.attribute(kAttrMaxThreadsPerBlock), 0))) {
    return Status(ErrorCode::kInvalidValue,
                  str_cat("launch: block ", dims(block), " exceeds GPU ", gpu, "'s limits (",
                          p.attribute(CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X), "x",
                          p.attribute(CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y), "x",
                          p.attribute(CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z), ", ",
                          p.attribute(kAttrMaxThreadsPerBlock), " threads)"));
  }
  if (too_big(grid.x, CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X) ||
      too_big(grid.y, CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y) ||
      too_big(grid.z, CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z)) {
    return Status(ErrorCode::kInvalidValue,
                  str_cat("launch: grid ", dims(grid), " exceeds GPU ", gpu, "'s limits (",
                          p.attribute(CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X), "x",
                          p.attribute(CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y), "x",
                          p.attribute(CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z), ")"));
  }
  return Status();
}

Status CudaDevice::allow_dynamic_shared_memory(CUkernel kernel, int gpu, uint32_t bytes) {
  const DeviceProperties& p = gpus_[gpu].properties;
  if (bytes <= static_cast<uint32_t>(std::max(p.attribute(kAttrMaxSharedMemoryPerBlock), 0))) {
    return Status();
  }
  const auto opt_in = static_cast<uint32_t>(
      std::max(p.attribute(CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN), 0));
  if (bytes > opt_in) {
    return Status(ErrorCode::kInvalidValue,
                  str_cat("launch: ", bytes, " bytes of shared memory exceed GPU ", gpu,
                          "'s limit of ", opt_in, " per block"));
  }
  {
    ReaderLock lock(kernels_mutex_);
    auto it = kernels_.find(kernel);
    if (it != kernels_.end() && it->second.max_dynamic_shared[gpu] >= bytes) return Status();
  }
  // Exclusive while asking the driver, so two launches raising the limit at once cannot leave
  // the smaller value set and the larger one cached.
  WriterLock lock(kernels_mutex_);
  auto it = kernels_.find(kernel);
  if (it == kernels_.end()) {
    return Status(ErrorCode::kInvalidHandle,
                  "launch: not a function from get_function, or its module was unloaded");
  }
  uint32_t& allowed = it->second.max_dynamic_shared[gpu];
  if (allowed >= bytes) return Status();
  HIBER_RETURN_IF_ERROR(
      HIBER_CU(cuKernelSetAttribute, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
               static_cast<int>(bytes), kernel, gpus_[gpu].device)
          .with_context(str_cat("launch(", it->second.info.name, ") on GPU ", gpu, " with ", bytes,
                                " bytes of dynamic shared memory")));
  allowed = bytes;
  return Status();
}

// ---- The node ----

const DeviceProperties& CudaDevice::properties(int gpu) const {
  CHECK(valid_gpu(gpu)) << "properties(" << gpu << "): this node has " << gpu_count() << " GPUs";
  return gpus_[gpu].properties;
}

Result<MemoryInfo> CudaDevice::memory_info(int gpu) {
  HIBER_RETURN_IF_ERROR(use_gpu(gpu));
  size_t free_bytes = 0, total_bytes = 0;
  HIBER_RETURN_IF_ERROR(HIBER_CU(cuMemGetInfo, &free_bytes, &total_bytes)
                            .with_context(str_cat("memory_info(GPU ", gpu, ")")));
  return MemoryInfo{free_bytes, total_bytes};
}

uint64_t CudaDevice::allocation_granularity(int gpu) const {
  return valid_gpu(gpu) ? gpus_[gpu].granularity : 0;
}

bool CudaDevice::can_access_peer(int gpu, int peer) const {
  return valid_gpu(gpu) && valid_gpu(peer) && peer_[gpu][peer];
}

// ---- Virtual memory ----

Result<DevicePtr> CudaDevice::reserve_address_range(uint64_t bytes, uint64_t alignment) {
  // Granularities are powers of two, so a multiple of the smallest is a multiple of the
  // granularity of every GPU whose granularity is that small: what allocation_granularity(gpu)
  // tells a caller reserving for that GPU's memory.
  if (bytes == 0 || bytes % min_granularity_ != 0 || bytes > UINT64_MAX - max_granularity_) {
    return Status(ErrorCode::kInvalidValue,
                  str_cat("reserve_address_range: ", bytes,
                          " bytes is not a positive multiple of a GPU's allocation granularity "
                          "(the smallest is ",
                          min_granularity_, ")"));
  }
  if (alignment != 0 && !is_power_of_two(alignment)) {
    return Status(ErrorCode::kInvalidValue, str_cat("reserve_address_range: alignment ", alignment,
                                                    " is not a power of two"));
  }
  // Anything mapped into the range must sit on its GPU's granularity boundary, so the range
  // starts on the largest one, and the driver reserves whole units of it.
  alignment = std::max(alignment, max_granularity_);
  const uint64_t driver_bytes =
      (bytes + max_granularity_ - 1) / max_granularity_ * max_granularity_;
  HIBER_RETURN_IF_ERROR(use_gpu(0));
  CUdeviceptr va = 0;
  HIBER_RETURN_IF_ERROR(HIBER_CU(cuMemAddressReserve, &va, driver_bytes, alignment, 0, 0)
                            .with_context(str_cat("reserve_address_range(", bytes, " bytes)")));
  MutexLock lock(mappings_mutex_);
  reservations_.emplace(va, Reservation{bytes, driver_bytes});
  return static_cast<DevicePtr>(va);
}

Result<DevicePtr> CudaDevice::reserve_address_range_at(DevicePtr va, uint64_t bytes) {
  if (bytes == 0 || bytes % max_granularity_ != 0 || va % max_granularity_ != 0 ||
      va > UINT64_MAX - bytes) {
    return Status(ErrorCode::kInvalidValue,
                  str_cat("reserve_address_range_at(", hex(va), ", ", bytes,
                          "): not whole units of the largest granularity (", max_granularity_,
                          ")"));
  }
  HIBER_RETURN_IF_ERROR(use_gpu(0));
  // The address is a hint to the driver: anything else means the range is taken.
  CUdeviceptr got = 0;
  HIBER_RETURN_IF_ERROR(
      HIBER_CU(cuMemAddressReserve, &got, bytes, max_granularity_, va, 0)
          .with_context(str_cat("reserve_address_range_at(", hex(va), ", ", bytes, ")")));
  if (got != va) {
    (void)HIBER_CU(cuMemAddressFree, got, bytes);
    return Status(ErrorCode::kAlreadyMapped,
                  str_cat("reserve_address_range_at: [", hex(va), ", +", bytes, ") is taken"));
  }
  MutexLock lock(mappings_mutex_);
  reservations_.emplace(va, Reservation{bytes, bytes});
  return va;
}

Status CudaDevice::free_address_range(DevicePtr va, uint64_t bytes) {
  auto where = [&] { return str_cat("free_address_range(", hex(va), ", ", bytes, ")"); };
  MutexLock lock(mappings_mutex_);
  // cuMemAddressFree takes back exactly what cuMemAddressReserve gave.
  auto reserved = reservations_.find(va);
  if (reserved == reservations_.end() || reserved->second.bytes != bytes) {
    return Status(ErrorCode::kInvalidValue,
                  where() + ": not a range reserve_address_range returned");
  }
  auto it = mappings_.lower_bound(va);
  if (it != mappings_.begin()) {
    auto before = std::prev(it);
    if (before->first + before->second.bytes > va) it = before;
  }
  if (it != mappings_.end() && it->first < va + bytes) {
    return Status(ErrorCode::kInvalidValue, where() + ": " +
                                                str_cat(hex(it->first), " (", it->second.bytes,
                                                        " bytes) is still mapped; unmap it first"));
  }
  HIBER_RETURN_IF_ERROR(use_gpu(0));
  HIBER_RETURN_IF_ERROR(
      HIBER_CU(cuMemAddressFree, va, reserved->second.driver_bytes).with_context(where()));
  reservations_.erase(reserved);
  return Status();
}

Result<PhysicalMemory> CudaDevice::create_physical(int gpu, uint64_t bytes) {
  HIBER_RETURN_IF_ERROR(use_gpu(gpu));
  const uint64_t granularity = gpus_[gpu].granularity;
  if (bytes == 0 || bytes % granularity != 0) {
    return Status(
        ErrorCode::kInvalidValue,
        str_cat("create_physical(GPU ", gpu, "): ", bytes,
                " bytes is not a positive multiple of the allocation granularity ", granularity));
  }
  CUmemAllocationProp prop = device_allocation_prop(gpus_[gpu].device);
  Physical physical{gpu, {}};
  physical.chunks.reserve(bytes / granularity);
  for (uint64_t made = 0; made < bytes; made += granularity) {
    CUmemGenericAllocationHandle handle = 0;
    Status created = HIBER_CU(cuMemCreate, &handle, granularity, &prop, 0);
    if (!created.ok()) {
      for (CUmemGenericAllocationHandle chunk : physical.chunks) (void)cu_.pfn_cuMemRelease(chunk);
      return created.with_context(
          str_cat("create_physical(GPU ", gpu, ", ", bytes, " bytes), after ", made, " bytes"));
    }
    physical.chunks.push_back(handle);
  }
  MutexLock lock(mappings_mutex_);
  const uint64_t id = next_physical_id_++;
  physical_.emplace(id, std::move(physical));
  return PhysicalMemory{id, gpu, bytes};
}

Status CudaDevice::release_physical(PhysicalMemory memory) {
  Physical physical;
  {
    MutexLock lock(mappings_mutex_);
    auto it = physical_.find(memory.id);
    if (it == physical_.end()) {
      return Status(ErrorCode::kInvalidHandle,
                    str_cat("release_physical: handle ", memory.id,
                            " was not made by create_physical, or is released"));
    }
    physical = std::move(it->second);
    physical_.erase(it);
  }
  HIBER_RETURN_IF_ERROR(use_gpu(physical.gpu));
  Status released;
  // Mapped chunks live on until unmapped (the driver's reference), like one allocation would.
  for (CUmemGenericAllocationHandle chunk : physical.chunks) {
    Status s = HIBER_CU(cuMemRelease, chunk);
    if (released.ok() && !s.ok()) released = std::move(s);
  }
  return released.with_context(
      str_cat("release_physical(GPU ", physical.gpu, ", ", memory.bytes, " bytes)"));
}

Status CudaDevice::map(DevicePtr va, uint64_t bytes, PhysicalMemory memory, uint64_t offset) {
  if (memory.id == 0) {
    return Status(ErrorCode::kInvalidHandle,
                  "map: physical memory handle 0 was not made by create_physical");
  }
  HIBER_RETURN_IF_ERROR(use_gpu(memory.gpu));
  const uint64_t g = gpus_[memory.gpu].granularity;
  auto where = [&] {
    return str_cat("map(", hex(va), ", ", bytes, " bytes, GPU ", memory.gpu, " memory of ",
                   memory.bytes, " bytes at offset ", offset, ")");
  };
  if (bytes == 0) return Status(ErrorCode::kInvalidValue, where() + ": nothing to map");
  if (va % g != 0 || bytes % g != 0 || offset % g != 0) {
    return Status(ErrorCode::kInvalidValue,
                  where() + ": " +
                      str_cat("address, size and offset must be multiples of the "
                              "allocation granularity ",
                              g));
  }
  if (offset > memory.bytes || bytes > memory.bytes - offset) {
    return Status(ErrorCode::kInvalidValue,
                  where() + ": the range runs past the end of the physical memory");
  }
  if (va + bytes < va) return Status(ErrorCode::kInvalidValue, where() + ": address overflow");

  MutexLock lock(mappings_mutex_);
  auto physical = physical_.find(memory.id);
  if (physical == physical_.end() || physical->second.gpu != memory.gpu ||
      physical->second.chunks.size() * g != memory.bytes) {
    return Status(ErrorCode::kInvalidHandle,
                  where() + ": not physical memory that create_physical made, or released");
  }
  // Inside one reserved range: the driver maps only into reservations.
  auto reserved = reservations_.upper_bound(va);
  if (reserved == reservations_.begin() ||
      std::prev(reserved)->first + std::prev(reserved)->second.bytes < va + bytes) {
    return Status(ErrorCode::kInvalidValue,
                  where() + ": the range is not inside one range from reserve_address_range");
  }
  auto next = mappings_.lower_bound(va);
  if (next != mappings_.end() && next->first < va + bytes) {
    return Status(ErrorCode::kAlreadyMapped,
                  where() + ": " +
                      str_cat("overlaps the mapping at ", hex(next->first), " (",
                              next->second.bytes, " bytes)"));
  }
  if (next != mappings_.begin()) {
    auto before = std::prev(next);
    if (before->first + before->second.bytes > va) {
      return Status(ErrorCode::kAlreadyMapped,
                    where() + ": " +
                        str_cat("overlaps the mapping at ", hex(before->first), " (",
                                before->second.bytes, " bytes)"));
    }
  }
  // One cuMemMap per chunk, each from the chunk's start; one unmap takes them all back.
  const std::vector<CUmemGenericAllocationHandle>& chunks = physical->second.chunks;
  for (uint64_t done = 0; done < bytes; done += g) {
    Status mapped = HIBER_CU(cuMemMap, va + done, g, 0, chunks[(offset + done) / g], 0);
    if (!mapped.ok()) {
      if (done > 0) (void)cu_.pfn_cuMemUnmap(va, done);
      return mapped.with_context(where());
    }
  }
  mappings_.emplace(va, Mapping{bytes, memory.gpu});
  return Status();
}

Status CudaDevice::unmap(DevicePtr va, uint64_t bytes) {
  auto where = [&] { return str_cat("unmap(", hex(va), ", ", bytes, " bytes)"); };
  if (bytes == 0) return Status(ErrorCode::kInvalidValue, where() + ": nothing to unmap");
  MutexLock lock(mappings_mutex_);
  auto first = mappings_.lower_bound(va);
  if (first != mappings_.begin()) {
    auto before = std::prev(first);
    if (before->first + before->second.bytes > va) {
      // cuMemUnmap cannot split a mapping.
      return Status(ErrorCode::kInvalidValue,
                    where() + ": " +
                        str_cat("starts inside the mapping at ", hex(before->first), " (",
                                before->second.bytes, " bytes); unmap whole mappings"));
    }
  }
  auto last = first;
  while (last != mappings_.end() && last->first < va + bytes) {
    if (last->first + last->second.bytes > va + bytes) {
      return Status(ErrorCode::kInvalidValue,
                    where() + ": " +
                        str_cat("ends inside the mapping at ", hex(last->first), " (",
                                last->second.bytes, " bytes); unmap whole mappings"));
    }
    ++last;
  }
  if (first == last) return Status(ErrorCode::kNotMapped, where() + ": nothing is mapped there");
  HIBER_RETURN_IF_ERROR(use_gpu(first->second.gpu));
  HIBER_RETURN_IF_ERROR(HIBER_CU(cuMemUnmap, va, bytes).with_context(where()));
  mappings_.erase(first, last);
  return Status();
}

Status CudaDevice::set_access(DevicePtr va, uint64_t bytes, std::span<const int> gpus) {
  auto where = [&] { return str_cat("set_access(", hex(va), ", ", bytes, " bytes)"); };
  if (bytes == 0) return Status(ErrorCode::kInvalidValue, where() + ": empty range");
  std::vector<bool> wanted(gpu_count(), false);
  for (int g : gpus) {
    if (!valid_gpu(g)) return no_such_gpu(g).with_context(where());
    wanted[g] = true;
  }

  MutexLock lock(mappings_mutex_);
  // The GPUs whose memory backs the range; the range must be mapped end to end.
  std::vector<bool> owner(gpu_count(), false);
  uint64_t covered = va;
  auto it = mappings_.upper_bound(va);
  if (it != mappings_.begin()) --it;
  for (; it != mappings_.end() && it->first < va + bytes; ++it) {
    if (it->first + it->second.bytes <= va) continue;
    if (it->first > covered) break;
    owner[it->second.gpu] = true;
    covered = it->first + it->second.bytes;
  }
  if (covered < va + bytes) {
    return Status(ErrorCode::kNotMapped,
                  where() + ": " + str_cat("nothing is mapped at ", hex(covered)));
  }

  // One descriptor per GPU, so the call sets exactly the wanted GPUs and revokes the rest. A GPU
  // that cannot reach some owner's memory at all is left out: it has no access to revoke, and
  // the driver may reject a descriptor naming it.
  std::vector<CUmemAccessDesc> descs;
  for (int g = 0; g < gpu_count(); ++g) {
    bool reaches_all = true;
    for (int o = 0; o < gpu_count(); ++o) {
      if (!owner[o] || o == g || peer_[g][o]) continue;
      reaches_all = false;
      if (wanted[g]) {
        return Status(ErrorCode::kPeerAccessUnsupported,
                      where() + ": " +
                          str_cat("GPU ", g, " cannot access memory of GPU ", o,
                                  " (no peer access between them)"));
      }
    }
    if (!wanted[g] && !reaches_all) continue;
    CUmemAccessDesc desc = {};
    desc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    desc.location.id = gpus_[g].device;
    desc.flags = wanted[g] ? CU_MEM_ACCESS_FLAGS_PROT_READWRITE : CU_MEM_ACCESS_FLAGS_PROT_NONE;
    descs.push_back(desc);
  }
  HIBER_RETURN_IF_ERROR(use_gpu(0));
  return HIBER_CU(cuMemSetAccess, va, bytes, descs.data(), descs.size()).with_context(where());
}

Status CudaDevice::register_host_memory(void* ptr, uint64_t bytes) {
  if (ptr == nullptr || bytes == 0) {
    return Status(ErrorCode::kInvalidValue, "register_host_memory: null pointer or empty range");
  }
  // A current context is needed for the call; PORTABLE makes the registration count for every
  // context (every GPU), not just that one.
  HIBER_RETURN_IF_ERROR(use_gpu(0));
  return HIBER_CU(cuMemHostRegister, ptr, bytes, CU_MEMHOSTREGISTER_PORTABLE)
      .with_context(str_cat("register_host_memory(", ptr, ", ", bytes, " bytes)"));
}

Status CudaDevice::unregister_host_memory(void* ptr) {
  HIBER_RETURN_IF_ERROR(use_gpu(0));
  return HIBER_CU(cuMemHostUnregister, ptr)
      .with_context(str_cat("unregister_host_memory(", ptr, ")"));
}

// ---- Contexts ----

Context CudaDevice::shared_context(int gpu) const {
  CHECK(valid_gpu(gpu)) << "shared_context(" << gpu << "): this node has " << gpu_count()
                        << " GPUs";
  return Context{to_id(gpus_[gpu].context), gpu};
}

Result<Context> CudaDevice::create_context(int gpu) {
  if (!valid_gpu(gpu)) return no_such_gpu(gpu);
  auto where = [&] { return str_cat("create_context(GPU ", gpu, ")"); };
  // cuCtxCreate pushes the new context on this thread's stack; it is popped again below, so the
  // stack stays as deep as it was (everything else here only ever replaces its top).
  CUcontext context = nullptr;
  HIBER_RETURN_IF_ERROR(
      HIBER_CU(cuCtxCreate, &context, nullptr, CU_CTX_SCHED_AUTO, gpus_[gpu].device)
          .with_context(where()));
  CUstream probe = nullptr;
  Status made = HIBER_CU(cuStreamCreateWithPriority, &probe, CU_STREAM_NON_BLOCKING, 0);
  CUcontext popped = nullptr;
  (void)cu_.pfn_cuCtxPopCurrent(&popped);
  if (!made.ok()) {
    (void)cu_.pfn_cuCtxDestroy(context);
    return made.with_context(where());
  }
  MutexLock lock(contexts_mutex_);
  created_.emplace(context, CreatedContext{gpu, probe});
  return Context{to_id(context), gpu};
}

Status CudaDevice::destroy_context(Context context) {
  auto where = [&] { return str_cat("destroy_context(GPU ", context.gpu, ")"); };
  if (valid_gpu(context.gpu) && from_id<CUcontext>(context.id) == gpus_[context.gpu].context) {
    return Status(ErrorCode::kInvalidValue,
                  where() + ": the primary context is shared and never destroyed");
  }
  CreatedContext created;
  {
    MutexLock lock(contexts_mutex_);
    auto it = created_.find(from_id<CUcontext>(context.id));
    if (it == created_.end() || it->second.gpu != context.gpu) {
      return Status(ErrorCode::kInvalidContext,
                    where() + ": not a context create_context made, or already destroyed");
    }
    created = it->second;
    created_.erase(it);
  }
  HIBER_RETURN_IF_ERROR(use_context(context).with_context(where()));
  watch_->forget(context);
  (void)cu_.pfn_cuStreamDestroy(created.probe);
  // Destroys what is left in it (streams, events, the kernels loaded into it), after a fault too.
  return HIBER_CU(cuCtxDestroy, from_id<CUcontext>(context.id)).with_context(where());
}

Status CudaDevice::context_status(Context context) {
  HIBER_ASSIGN_OR_RETURN(CUstream probe, probe_of(context));
  HIBER_RETURN_IF_ERROR(use_context(context));
  // The probe never has work: a query answers at once, with the context's sticky error if a
  // fault ended it.
  CUresult r = cu_.pfn_cuStreamQuery(probe);
  if (r == CUDA_SUCCESS || r == CUDA_ERROR_NOT_READY) return Status();
  return cu_.check(r, "cuStreamQuery").with_context("context_status");
}

Status CudaDevice::reset_shared_context(int gpu) {
  if (!valid_gpu(gpu)) return no_such_gpu(gpu);
  auto where = [&] { return str_cat("reset_shared_context(GPU ", gpu, ")"); };
  const Context shared = shared_context(gpu);
  // What was kept in the context goes with it: forgotten, never destroyed (the reset frees it,
  // and destroying it after would pass freed handles to the driver).
  watch_->forget(shared);
  blas_->forget_context(shared);
  dnn_->forget_context(shared);
  {
    MutexLock lock(contexts_mutex_);
    primary_probes_.at(gpu) = nullptr;
  }
  HIBER_RETURN_IF_ERROR(HIBER_CU(cuDevicePrimaryCtxReset, gpus_[gpu].device).with_context(where()));
  // The primary context stays retained (a reset does not release it) and is made afresh when
  // next made current; its peer access went with it.
  HIBER_RETURN_IF_ERROR(make_primary_probe(gpu).with_context(where()));
  return enable_peer_access(gpu).with_context(where());
}

// ---- Streams and events ----

Result<Stream> CudaDevice::create_stream(Context context, int priority) {
  HIBER_RETURN_IF_ERROR(use_context(context));
  const int gpu = context.gpu;
  // CUDA clamps out-of-range priorities too; clamping here keeps it explicit. Lower is higher
  // priority, so greatest_priority is the numerically smallest value.
  const Gpu& g = gpus_[gpu];
  int clamped = std::clamp(priority, g.greatest_priority, g.least_priority);
  // NON_BLOCKING: never synchronise with the legacy default stream, which other libraries in the
  // process might use.
  CUstream stream = nullptr;
  HIBER_RETURN_IF_ERROR(
      HIBER_CU(cuStreamCreateWithPriority, &stream, CU_STREAM_NON_BLOCKING, clamped)
          .with_context(str_cat("create_stream(GPU ", gpu, ", priority ", priority, ")")));
  return Stream{to_id(stream), gpu, context.id};
}

Status CudaDevice::destroy_stream(Stream stream) {
  HIBER_ASSIGN_OR_RETURN(CUstream s, use_stream(stream));
  // Returns at once; work already enqueued still runs, as the interface promises.
  return HIBER_CU(cuStreamDestroy, s);
}

Status CudaDevice::cancel_stream(Stream stream, const Status&) {
  HIBER_ASSIGN_OR_RETURN(CUstream s, use_stream(stream));
  (void)s;
  // The driver has no call that takes back work already enqueued on a stream.
  return Status(ErrorCode::kNotSupported, "CUDA cannot cancel work enqueued on a stream");
}

Status CudaDevice::synchronize_stream(Stream stream) {
  HIBER_ASSIGN_OR_RETURN(CUstream s, use_stream(stream));
  return HIBER_CU(cuStreamSynchronize, s);
}

Status CudaDevice::query_stream(Stream stream) {
  HIBER_ASSIGN_OR_RETURN(CUstream s, use_stream(stream));
  CUresult r = cu_.pfn_cuStreamQuery(s);
  // Polled often: the common answer is built without asking the driver for strings.
  if (r == CUDA_ERROR_NOT_READY) return Status(ErrorCode::kNotReady, "stream has pending work");
  return cu_.check(r, "cuStreamQuery");
}

Status CudaDevice::add_callback(Stream stream, StreamCallback callback) {
  if (!callback) return Status(ErrorCode::kInvalidValue, "add_callback: empty callback");
  HIBER_ASSIGN_OR_RETURN(CUstream s, use_stream(stream));
  // run_stream_callback owns and deletes it once the driver has accepted it (it may already have
  // run by the time cuStreamAddCallback returns); if the driver refuses it, it never runs.
  auto* owned = new StreamCallback(std::move(callback));
  Status added = HIBER_CU(cuStreamAddCallback, s, &run_stream_callback, owned, 0);
  if (!added.ok()) delete owned;
  return added;
}

Result<Event> CudaDevice::create_event(Context context, bool disable_timing) {
  HIBER_RETURN_IF_ERROR(use_context(context));
  CUevent event = nullptr;
  HIBER_RETURN_IF_ERROR(
      HIBER_CU(cuEventCreate, &event, disable_timing ? CU_EVENT_DISABLE_TIMING : CU_EVENT_DEFAULT)
          .with_context(str_cat("create_event(GPU ", context.gpu, ")")));
  return Event{to_id(event), context.gpu, context.id};
}

Status CudaDevice::destroy_event(Event event) {
  HIBER_ASSIGN_OR_RETURN(CUevent e, event_of(event));
  HIBER_RETURN_IF_ERROR(use_context(Context{event.context, event.gpu}));
  return HIBER_CU(cuEventDestroy, e);
}

Status CudaDevice::record_event(Event event, Stream stream) {
  HIBER_ASSIGN_OR_RETURN(CUevent e, event_of(event));
  if (event.gpu != stream.gpu) {
    // The driver requires the event and the stream to share a context.
    return Status(ErrorCode::kInvalidHandle,
                  str_cat("record_event: an event of GPU ", event.gpu,
                          " cannot be recorded on a stream of GPU ", stream.gpu));
  }
  if (event.context != stream.context) {
    return Status(ErrorCode::kInvalidHandle,
                  "record_event: the event and the stream are in different contexts");
  }
  HIBER_ASSIGN_OR_RETURN(CUstream s, use_stream(stream));
  return HIBER_CU(cuEventRecord, e, s);
}

Status CudaDevice::wait_event(Stream stream, Event event) {
  HIBER_ASSIGN_OR_RETURN(CUevent e, event_of(event));
  // Waiting on an event of another GPU is allowed: that is how cross-GPU work is ordered.
  HIBER_ASSIGN_OR_RETURN(CUstream s, use_stream(stream));
  return HIBER_CU(cuStreamWaitEvent, s, e, CU_EVENT_WAIT_DEFAULT);
}

Status CudaDevice::synchronize_event(Event event) {
  HIBER_ASSIGN_OR_RETURN(CUevent e, event_of(event));
  HIBER_RETURN_IF_ERROR(use_context(Context{event.context, event.gpu}));
  return HIBER_CU(cuEventSynchronize, e);
}

Status CudaDevice::query_event(Event event) {
  HIBER_ASSIGN_OR_RETURN(CUevent e, event_of(event));
  HIBER_RETURN_IF_ERROR(use_context(Context{event.context, event.gpu}));
  CUresult r = cu_.pfn_cuEventQuery(e);
  if (r == CUDA_ERROR_NOT_READY) return Status(ErrorCode::kNotReady, "event has pending work");
  return cu_.check(r, "cuEventQuery");
}

Result<float> CudaDevice::elapsed_ms(Event start, Event end) {
  HIBER_ASSIGN_OR_RETURN(CUevent s, event_of(start));
  HIBER_ASSIGN_OR_RETURN(CUevent e, event_of(end));
  HIBER_RETURN_IF_ERROR(use_context(Context{start.context, start.gpu}));
  float ms = 0;
  // The driver answers kNotReady for a pending record and kInvalidHandle for an event created
  // with timing disabled or never recorded, as the interface specifies.
  HIBER_RETURN_IF_ERROR(HIBER_CU(cuEventElapsedTime, &ms, s, e));
  return ms;
}

// ---- Copies and memset ----

Status CudaDevice::copy_host_to_device(Stream stream, DevicePtr dst, const void* src,
                                       uint64_t bytes) {
  HIBER_ASSIGN_OR_RETURN(CUstream s, use_stream(stream));
  if (bytes == 0) return Status();  // nothing to copy; the pointers may be anything
  return on_error(HIBER_CU(cuMemcpyHtoDAsync, dst, src, bytes, s), [&] {
    return str_cat("copy_host_to_device(", hex(dst), ", ", bytes, " bytes)");
  });
}

Status CudaDevice::copy_device_to_host(Stream stream, void* dst, DevicePtr src, uint64_t bytes) {
  HIBER_ASSIGN_OR_RETURN(CUstream s, use_stream(stream));
  if (bytes == 0) return Status();
  return on_error(HIBER_CU(cuMemcpyDtoHAsync, dst, src, bytes, s), [&] {
    return str_cat("copy_device_to_host(", hex(src), ", ", bytes, " bytes)");
  });
}

Status CudaDevice::copy_device_to_device(Stream stream, DevicePtr dst, DevicePtr src,
                                         uint64_t bytes) {
  HIBER_ASSIGN_OR_RETURN(CUstream s, use_stream(stream));
  if (bytes == 0) return Status();
  return on_error(HIBER_CU(cuMemcpyDtoDAsync, dst, src, bytes, s), [&] {
    return str_cat("copy_device_to_device(", hex(dst), " <- ", hex(src), ", ", bytes, " bytes)");
  });
}

Status CudaDevice::copy_peer(Stream stream, DevicePtr dst, int dst_gpu, DevicePtr src, int src_gpu,
                             uint64_t bytes) {
  if (!valid_gpu(dst_gpu)) return no_such_gpu(dst_gpu).with_context("copy_peer destination");
  if (!valid_gpu(src_gpu)) return no_such_gpu(src_gpu).with_context("copy_peer source");
  HIBER_ASSIGN_OR_RETURN(CUstream s, use_stream(stream));
  if (bytes == 0) return Status();
  // The driver copies GPU to GPU directly when the contexts have peer access (enabled at
  // creation) and stages through the host otherwise.
  // UNVERIFIED (needs 2 GPUs): peer access of contexts covers cuMemAlloc memory only; VMM
  // mappings are reachable only by the GPUs set_access names (PyTorch's expandable segments and
  // XLA's VMM allocator had to grant peers access for their copies). If the direct path needs
  // the copying GPU to reach both ranges, copy_peer between ranges that only their own GPUs may
  // access fails or faults, and the contract must say so (or this must stage through the host).
  // DeviceContractTest.PeerCopiesMoveTheRightBytes on a 2-GPU machine decides.
  // The stream's own context stands for its GPU's side (a created context has no legacy peer
  // access enabled, so the driver may stage such a copy through the host; also unverified).
  auto side = [&](int gpu) {
    return gpu == stream.gpu && stream.context != 0 ? from_id<CUcontext>(stream.context)
                                                    : gpus_[gpu].context;
  };
  return on_error(HIBER_CU(cuMemcpyPeerAsync, dst, side(dst_gpu), src, side(src_gpu), bytes, s),
                  [&] {
                    return str_cat("copy_peer(GPU ", dst_gpu, " ", hex(dst), " <- GPU ", src_gpu,
                                   " ", hex(src), ", ", bytes, " bytes)");
                  });
}

Status CudaDevice::memset(Stream stream, DevicePtr dst, uint32_t value, int element_bytes,
                          uint64_t count) {
  auto where = [&] {
    return str_cat("memset(", hex(dst), ", ", count, " x ", element_bytes, " bytes)");
  };
  if (element_bytes != 1 && element_bytes != 2 && element_bytes != 4) {
    return Status(ErrorCode::kInvalidValue, where() + ": element size must be 1, 2 or 4 bytes");
  }
  if (dst % static_cast<uint64_t>(element_bytes) != 0) {
    return Status(ErrorCode::kInvalidValue,
                  where() + ": the address must be aligned to the element size");
  }
  HIBER_ASSIGN_OR_RETURN(CUstream s, use_stream(stream));
  if (count == 0) return Status();
  switch (element_bytes) {
    case 1:
      return on_error(HIBER_CU(cuMemsetD8Async, dst, static_cast<unsigned char>(value), count, s),
                      where);
    case 2:
      return on_error(HIBER_CU(cuMemsetD16Async, dst, static_cast<unsigned short>(value), count, s),
                      where);
    default: return on_error(HIBER_CU(cuMemsetD32Async, dst, value, count, s), where);
  }
}

// ---- Code ----

Result<Module> CudaDevice::load_module(std::span<const std::byte> image) {
  auto where = [&] { return str_cat("load_module(", image.size(), " bytes)"); };
  // cuLibraryLoadData takes a pointer and no size, and trusts what it finds there: the client's
  // image is read by our own reader first, which checks every size and offset against the bytes
  // we hold (headers, fatbin entries, ELF sections and segments, cubins inside fatbins) and
  // accepts only a fatbin, an ELF cubin or text that begins like PTX.
  uint32_t magic = 0;
  if (image.size() >= sizeof magic) std::memcpy(&magic, image.data(), sizeof magic);
  if (magic == kFatbinWrapperMagic) {
    // The driver accepts the wrapper nvcc emits around a fatbin, but it holds a pointer into
    // the client's address space, which means nothing here.
    return Status(ErrorCode::kInvalidImage,
                  where() +
                      ": a fatbin wrapper (__fatBinC_Wrapper_t) holds a host pointer; send "
                      "the fatbin it points to");
  }
  Result<std::vector<KernelInfo>> readable = fatbin::image_kernels(image);
  if (!readable.ok()) return readable.status().with_context(where());
  const void* code = image.data();
  std::string ptx;
  if (!fatbin::is_fatbin(image) && !fatbin::is_elf(image) &&
      std::memchr(image.data(), 0, image.size()) == nullptr) {
    // PTX is read up to its NUL, so one must end the bytes we checked.
    ptx.assign(reinterpret_cast<const char*>(image.data()), image.size());
    code = ptx.c_str();
  }

  // Context-independent loading: one CUlibrary serves every GPU's context, present and future.
  CUlibrary library = nullptr;
  HIBER_RETURN_IF_ERROR(
      HIBER_CU(cuLibraryLoadData, &library, code, nullptr, nullptr, 0, nullptr, nullptr, 0)
          .with_context(where()));
  return Module{to_id(library)};
}

Status CudaDevice::unload_module(Module module) {
  if (module.id == 0) {
    return Status(ErrorCode::kInvalidHandle, "unload_module: handle 0 was not made by load_module");
  }
  auto library = from_id<CUlibrary>(module.id);
  WriterLock lock(kernels_mutex_);
  HIBER_RETURN_IF_ERROR(HIBER_CU(cuLibraryUnload, library));
  // Its kernels are gone; a later library may reuse their handle values.
  if (auto it = module_kernels_.find(library); it != module_kernels_.end()) {
    for (CUkernel k : it->second) kernels_.erase(k);
    module_kernels_.erase(it);
  }
  return Status();
}

Result<Function> CudaDevice::get_function(Module module, const std::string& name) {
  if (module.id == 0) {
    return Status(ErrorCode::kInvalidHandle, "get_function: handle 0 was not made by load_module");
  }
  auto library = from_id<CUlibrary>(module.id);
  CUkernel kernel = nullptr;
  CUresult r = cu_.pfn_cuLibraryGetKernel(&kernel, library, name.c_str());
  if (r == CUDA_ERROR_NOT_FOUND) {
    return Status(ErrorCode::kNotFound, str_cat("get_function: the module has no kernel '", name,
                                                "' (names are mangled)"));
  }
  HIBER_RETURN_IF_ERROR(cu_.check(r, "cuLibraryGetKernel").with_context(name));
  {
    ReaderLock lock(kernels_mutex_);
    if (kernels_.count(kernel) != 0) return Function{to_id(kernel)};
  }

  // The layout, once per kernel: cuKernelGetParamInfo answers CUDA_ERROR_INVALID_VALUE for the
  // first index past the last parameter.
  HIBER_RETURN_IF_ERROR(use_gpu(0));
  KernelInfo info;
  const char* kernel_name = nullptr;
  HIBER_RETURN_IF_ERROR(HIBER_CU(cuKernelGetName, &kernel_name, kernel).with_context(name));
  info.name = kernel_name != nullptr ? kernel_name : name;
  // A kernel can take at most 32764 bytes of parameters (CUDA 12.1+), so at most that many.
  constexpr size_t kMaxParams = 32764;
  for (size_t i = 0;; ++i) {
    if (i == kMaxParams) {
      return Status(ErrorCode::kInvalidImage,
                    str_cat("get_function(", name, "): cuKernelGetParamInfo reports more than ",
                            kMaxParams, " parameters"));
    }
    size_t offset = 0, size = 0;
    r = cu_.pfn_cuKernelGetParamInfo(kernel, i, &offset, &size);
    if (r == CUDA_ERROR_INVALID_VALUE) break;
    HIBER_RETURN_IF_ERROR(
        cu_.check(r, "cuKernelGetParamInfo").with_context(str_cat(name, " parameter ", i)));
    info.params.push_back({static_cast<uint32_t>(offset), static_cast<uint32_t>(size)});
  }

  WriterLock lock(kernels_mutex_);
  KernelState state{std::move(info), std::vector<uint32_t>(gpus_.size(), 0)};
  if (kernels_.emplace(kernel, std::move(state)).second) {
    module_kernels_[library].push_back(kernel);
  }
  return Function{to_id(kernel)};
}

Result<KernelInfo> CudaDevice::function_info(Function function) {
  ReaderLock lock(kernels_mutex_);
  auto it = kernels_.find(from_id<CUkernel>(function.id));
  if (it == kernels_.end()) {
    return Status(ErrorCode::kInvalidHandle,
                  "function_info: not a function from get_function, or its module was unloaded");
  }
  return it->second.info;
}

Status CudaDevice::launch(Stream stream, Function function, const LaunchConfig& config,
                          std::span<const std::byte> params) {
  auto kernel = from_id<CUkernel>(function.id);
  {
    ReaderLock lock(kernels_mutex_);
    auto it = kernels_.find(kernel);
    if (it == kernels_.end()) {
      return Status(ErrorCode::kInvalidHandle,
                    "launch: not a function from get_function, or its module was unloaded");
    }
    const KernelInfo& info = it->second.info;
    if (params.size() != info.param_bytes()) {
      return Status(ErrorCode::kInvalidValue,
                    str_cat("launch(", info.name, "): the kernel takes ", info.param_bytes(),
                            " bytes of parameters (", info.params.size(), " parameters), got ",
                            params.size()));
    }
  }
  if (config.context_lost && config.context_lost->load()) {
    return Status(ErrorCode::kLaunchTimeout,
                  "launch: an earlier kernel of this context ran past its deadline");
  }
  HIBER_ASSIGN_OR_RETURN(CUstream s, use_stream(stream));
  HIBER_RETURN_IF_ERROR(check_launch_dimensions(stream.gpu, config));
  HIBER_RETURN_IF_ERROR(
      allow_dynamic_shared_memory(kernel, stream.gpu, config.shared_memory_bytes));
  // The packed buffer goes in `extra`; the driver copies it before cuLaunchKernel returns. A
  // CUkernel may be launched as a CUfunction (CUDA 12.0+), in the context of the stream.
  size_t size = params.size();
  void* extra[] = {CU_LAUNCH_PARAM_BUFFER_POINTER, const_cast<std::byte*>(params.data()),
                   CU_LAUNCH_PARAM_BUFFER_SIZE, &size, CU_LAUNCH_PARAM_END};
  Status launched =
      HIBER_CU(cuLaunchKernel, reinterpret_cast<CUfunction>(kernel), config.grid.x, config.grid.y,
               config.grid.z, config.block.x, config.block.y, config.block.z,
               config.shared_memory_bytes, s, nullptr, size != 0 ? extra : nullptr);
  if (launched.ok() && config.deadline.count() > 0) {
    std::string name;
    {
      ReaderLock lock(kernels_mutex_);
      auto it = kernels_.find(kernel);
      if (it != kernels_.end()) name = it->second.info.name;
    }
    launched = watch_->watch(Context{stream.context, stream.gpu}, s, name, config);
  }
  return on_error(std::move(launched), [&] {
    ReaderLock lock(kernels_mutex_);
    auto it = kernels_.find(kernel);
    return str_cat("launch(", it != kernels_.end() ? it->second.info.name : "?", ", grid ",
                   config.grid.x, "x", config.grid.y, "x", config.grid.z, ", block ",
                   config.block.x, "x", config.block.y, "x", config.block.z, ")");
  });
}

#undef HIBER_CU

}  // namespace

LibraryBackend* CudaDevice::library(library_ops::Library library) {
  switch (library) {
    case library_ops::Library::kBlas: return blas_.get();
    case library_ops::Library::kDnn: return dnn_.get();
  }
  return nullptr;
}

Result<std::unique_ptr<Device>> create_cuda_device(const CudaDeviceOptions& options) {
  return CudaDevice::create(options);
}

}  // namespace hiber::device
