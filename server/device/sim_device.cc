// The simulated GPU: the Device interface over the parts in sim/ (memory, address space, links,
// streams, kernels, fault catching). This file checks arguments and handles, and turns each call
// into work on a stream.
//
// Destroying the device finishes all work already enqueued (callbacks included), then joins its
// threads, unmaps everything and unloads its kernel plugins.
#include "server/device/sim_device.h"

#include <fcntl.h>

#include <glog/logging.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstring>
#include <map>

#include "common/fatbin.h"
#include "common/mutex.h"
#include "server/device/sim/address_space.h"
#include "server/device/sim/blas_host.h"
#include "server/device/sim/dnn_host.h"
#include "server/device/sim/fault_guard.h"
#include "server/device/sim/handle_table.h"
#include "server/device/sim/kernel_registry.h"
#include "server/device/sim/kernel_watchdog.h"
#include "server/device/sim/link_model.h"
#include "server/device/sim/physical_memory.h"
#include "server/device/sim/properties.h"
#include "server/device/sim/scheduler.h"
#include "server/device/sim/transfer.h"

namespace hiber::device {
namespace {

using sim::Scheduler;
using ContextState = Scheduler::ContextState;
using StreamState = Scheduler::StreamState;
using EventState = Scheduler::EventState;

constexpr int kMaxGpus = 64;  // access rights are a 64-bit mask
constexpr int kMaxWorkersPerGpu = 64;
// CUdevice_attribute values that device.h does not name.
constexpr int kAttrMaxGridDimY = 6;
constexpr int kAttrMaxGridDimZ = 7;

struct ModuleState {
  explicit ModuleState(std::vector<KernelInfo> k) : kernels(std::move(k)) {}
  const std::vector<KernelInfo> kernels;  // sorted by name
  Mutex mu;
  bool unloaded GUARDED_BY(mu) = false;
  std::map<std::string, uint64_t> functions GUARDED_BY(mu);  // name -> function id
};

struct FunctionState {
  uint64_t module = 0;
  KernelInfo info;
};

// What one launch hands to its kernel: a copy of the parameters taken at launch time.
struct LaunchData {
  KernelInfo info;
  HiberSimKernelFn run = nullptr;
  const sim::AddressSpace* space = nullptr;
  std::vector<std::max_align_t> storage;  // the packed parameter buffer, maximally aligned
  std::vector<void*> params;              // into storage
  HiberSimLaunch launch{};                // launch.device_context points back here
  int result = 0;
  std::chrono::nanoseconds deadline{0};
  std::function<void(const Status&)> on_timeout;
  std::shared_ptr<const std::atomic<bool>> context_lost;
  // The first range check_access refused: the launch's error.
  Mutex refused_mu;
  Status refused GUARDED_BY(refused_mu);

  std::span<const std::byte> param_bytes() const {
    return {reinterpret_cast<const std::byte*>(storage.data()), info.param_bytes()};
  }
};

// The pointer arguments of a launch, before its kernel runs (sim_kernel_plugin.h, "Isolation"):
// each word that may be a pointer and is a device address must reach memory the launch's GPU
// may access, which under Hiber is the calling function's own blocks.
Status check_arguments(const LaunchData& d) {
  const std::span<const std::byte> bytes = d.param_bytes();
  for (const ParamInfo& param : d.info.params) {
    if (!may_hold_pointer(param)) continue;
    for (uint64_t at = param.offset; at + 8 <= uint64_t{param.offset} + param.bytes; at += 8) {
      uint64_t word;
      std::memcpy(&word, bytes.data() + at, sizeof(word));
      Status allowed = d.space->check_argument(word, d.launch.gpu);
      if (!allowed.ok())
        return allowed.with_context(str_cat("kernel ", d.info.name, ", argument word at offset ",
                                            at, " (not memory of the caller's own blocks)"));
    }
  }
  return Status();
}

// HiberSimLaunch::check_access.
int check_kernel_access(const HiberSimLaunch* launch, const void* address, uint64_t bytes) {
  auto* d = static_cast<LaunchData*>(launch->device_context);
  if (bytes == 0) return 0;
  Result<int> owner = d->space->check({reinterpret_cast<DevicePtr>(address), bytes, launch->gpu});
  if (owner.ok()) return 0;
  MutexLock lock(d->refused_mu);
  if (d->refused.ok()) d->refused = Status(ErrorCode::kIllegalAddress, owner.status().message());
  return static_cast<int>(ErrorCode::kIllegalAddress);
}

Status check_node(const NodeConfig& node) {
  const int n = node.gpu_count();
  if (n == 0 || n > kMaxGpus)
    return error(ErrorCode::kInvalidValue, "simulated device: ", n, " GPUs (1..", kMaxGpus, ")");
  const int switches = static_cast<int>(node.pcie_switches.size());
  for (int g = 0; g < n; ++g) {
    if (node.gpus[g].pcie_switch < 0 || node.gpus[g].pcie_switch >= switches)
      return error(ErrorCode::kInvalidValue, "simulated device: GPU ", g, " is behind PCIe switch ",
                   node.gpus[g].pcie_switch, " of ", switches);
  }
  auto valid = [n](int g) { return g >= 0 && g < n; };
  for (const NvLinkSpec& l : node.nvlinks)
    if (!valid(l.gpu_a) || !valid(l.gpu_b) || l.gpu_a == l.gpu_b || l.bandwidth_gbps <= 0)
      return error(ErrorCode::kInvalidValue, "simulated device: bad NVLink ", l.gpu_a, "-",
                   l.gpu_b);
  for (const NvSwitchSpec& s : node.nvswitches) {
    if (s.port_bandwidth_gbps <= 0)
      return error(ErrorCode::kInvalidValue,
                   "simulated device: NVSwitch port bandwidth must be > 0");
    for (int g : s.gpus)
      if (!valid(g)) return error(ErrorCode::kInvalidValue, "simulated device: NVSwitch GPU ", g);
  }
  for (const PcieSwitchSpec& s : node.pcie_switches)
    if (s.host_to_device_gbps <= 0 || s.device_to_host_gbps <= 0)
      return error(ErrorCode::kInvalidValue, "simulated device: PCIe switch bandwidth must be > 0");
  return Status();
}

}  // namespace

struct SimDevice::Impl {
  explicit Impl(const SimDeviceOptions& o)
      : options(o),
        space(o.allocation_granularity),
        links(options.node),
        mover(space, o.throttle_copies ? &links : nullptr),
        scheduler(options.node.gpu_count(), o.workers_per_gpu) {}

  // Whether `gpu` can reach `peer`'s memory directly (REQUIRES: both exist): an NVLink, an
  // NVSwitch or a shared PCIe switch between them. A GPU is not its own peer.
  bool peers(int gpu, int peer) const {
    const NodeConfig& node = options.node;
    return gpu != peer &&
           (node.nvlink(gpu, peer) != nullptr || node.nvswitch(gpu, peer) != nullptr ||
            node.share_pcie_switch(gpu, peer));
  }
  Status check_gpu(int gpu) const {
    if (gpu < 0 || gpu >= options.node.gpu_count())
      return error(ErrorCode::kInvalidDevice, "GPU ", gpu, " does not exist (",
                   options.node.gpu_count(), " GPUs)");
    return Status();
  }
  // A context that exists and was not destroyed; with `usable`, also not ended by a fault (its
  // fault is the error then, as CUDA answers every call in a faulted context).
  Result<std::shared_ptr<ContextState>> context(Context c, bool usable) {
    auto state = contexts.find(c.id);
    if (!state || state->gpu != c.gpu)
      return error(ErrorCode::kInvalidContext, "context ", c.id, " (GPU ", c.gpu,
                   ") does not exist");
    HIBER_RETURN_IF_ERROR(live(*state, usable));
    return state;
  }
  Status live(const ContextState& c, bool usable) {
    if (c.destroyed.load(std::memory_order_acquire))
      return error(ErrorCode::kInvalidContext, "its context (GPU ", c.gpu, ") was destroyed");
    if (usable) return scheduler.fault(c);
    return Status();
  }
  // A stream or event that exists; with `usable` (every call but destroy), in a context that
  // is usable.
  Result<std::shared_ptr<StreamState>> stream(Stream s, bool usable = true) {
    auto state = streams.find(s.id);
    if (!state || state->gpu != s.gpu)
      return error(ErrorCode::kInvalidHandle, "stream ", s.id, " (GPU ", s.gpu, ") does not exist");
    HIBER_RETURN_IF_ERROR(live(*state->context, usable));
    return state;
  }
  Result<std::shared_ptr<EventState>> event(Event e, bool usable = true) {
    auto state = events.find(e.id);
    if (!state || state->gpu != e.gpu)
      return error(ErrorCode::kInvalidHandle, "event ", e.id, " (GPU ", e.gpu, ") does not exist");
    HIBER_RETURN_IF_ERROR(live(*state->context, usable));
    return state;
  }
  Result<std::shared_ptr<sim::PhysicalBlock>> block(const PhysicalMemory& m) const {
    auto b = physical.find(m.id);
    if (!b || b->gpu() != m.gpu || b->bytes() != m.bytes)
      return error(ErrorCode::kInvalidHandle, "physical memory ", m.id, " (GPU ", m.gpu, ", ",
                   m.bytes, " bytes) does not exist");
    return b;
  }
  // Checks the device range at enqueue time (kInvalidValue names the address); returns the GPU
  // whose memory it is.
  Result<int> check_range(const char* operation, DevicePtr va, uint64_t bytes, int gpu) const {
    auto owner = space.check({va, bytes, gpu});
    if (!owner.ok()) return owner.status().with_context(operation);
    return owner;
  }
  // The path of a copy to or from host memory at `host`: slowed to the pageable rate unless
  // the memory is registered.
  sim::LinkModel::Path host_path(sim::LinkModel::Path path, const void* host, uint64_t bytes) {
    const auto start = reinterpret_cast<uintptr_t>(host);
    MutexLock lock(host_mu);
    auto it = registered_host.upper_bound(start);
    const bool pinned = it != registered_host.begin() &&
                        std::prev(it)->first + std::prev(it)->second >= start + bytes;
    if (!pinned) path.rate_factor = options.pageable_rate;
    return path;
  }
  // Fault injection (SimDeviceOptions::fail_transfers_to_gpu).
  bool inject_transfer_failure(int gpu) {
    if (gpu != options.fail_transfers_to_gpu) return false;
    return transfers_to_failing_gpu.fetch_add(1) >= options.fail_after_transfers;
  }
  void enqueue_copy(const std::shared_ptr<StreamState>& stream, sim::CopySpec spec,
                    std::string what) {
    scheduler.enqueue_work(stream, [this, spec = std::move(spec), what = std::move(what)] {
      return mover.copy(spec).with_context(what);
    });
  }

  const SimDeviceOptions options;
  std::vector<DeviceProperties> properties;
  // reachers[o]: bit g set for each GPU g that set_access may grant GPU o's memory to (o and
  // its peers).
  std::vector<uint64_t> reachers;
  std::vector<std::unique_ptr<sim::GpuMemory>> memories;
  sim::AddressSpace space;  // after memories: its mappings hold blocks of them
  sim::LinkModel links;
  sim::Mover mover;
  sim::KernelRegistry kernels;
  sim::IdSource ids;
  sim::HandleTable<sim::PhysicalBlock> physical{ids};
  sim::HandleTable<ContextState> contexts{ids};
  mutable Mutex shared_mu;
  std::vector<Context> shared_contexts GUARDED_BY(shared_mu);  // per GPU
  sim::HandleTable<StreamState> streams{ids};
  sim::HandleTable<EventState> events{ids};
  sim::HandleTable<ModuleState> modules{ids};
  sim::HandleTable<FunctionState> functions{ids};
  Mutex host_mu;
  std::map<uintptr_t, uint64_t> registered_host GUARDED_BY(host_mu);  // start -> bytes
  std::atomic<uint64_t> transfers_to_failing_gpu{0};
  // Remoted libraries' host implementations (made once the device exists).
  std::unique_ptr<LibraryBackend> blas;
  std::unique_ptr<LibraryBackend> dnn;
  sim::KernelWatchdog watchdog;
  // Last, so it is destroyed first: it finishes work that uses everything above.
  Scheduler scheduler;
};

Result<std::unique_ptr<SimDevice>> SimDevice::create(const SimDeviceOptions& options) {
  HIBER_RETURN_IF_ERROR(check_node(options.node));
  if (!(options.pageable_rate > 0 && options.pageable_rate <= 1))
    return error(ErrorCode::kInvalidValue, "simulated device: pageable_rate ",
                 options.pageable_rate, " must be in (0, 1]");
  const uint64_t granularity = options.allocation_granularity;
  const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  if (granularity < page || (granularity & (granularity - 1)) != 0)
    return error(ErrorCode::kInvalidValue, "simulated device: allocation granularity ", granularity,
                 " must be a power of two of at least the page size (", page, ")");
  if (options.workers_per_gpu < 1 || options.workers_per_gpu > kMaxWorkersPerGpu)
    return error(ErrorCode::kInvalidValue, "simulated device: workers_per_gpu ",
                 options.workers_per_gpu, " (1..", kMaxWorkersPerGpu, ")");
  auto impl = std::make_unique<Impl>(options);
  for (int g = 0; g < options.node.gpu_count(); ++g) {
    HIBER_ASSIGN_OR_RETURN(
        auto memory, sim::GpuMemory::create(g, options.node.gpus[g].memory_bytes, granularity));
    impl->memories.push_back(std::move(memory));
    impl->properties.push_back(sim::make_properties(options.node, g));
    uint64_t reach = uint64_t{1} << g;
    for (int peer = 0; peer < options.node.gpu_count(); ++peer)
      if (impl->peers(peer, g)) reach |= uint64_t{1} << peer;
    impl->reachers.push_back(reach);
    MutexLock lock(impl->shared_mu);
    impl->shared_contexts.push_back(
        Context{impl->contexts.insert(impl->scheduler.create_context(g, /*shared=*/true)), g});
  }
  for (const std::string& plugin : options.kernel_plugins)
    HIBER_RETURN_IF_ERROR(impl->kernels.load_plugin(plugin));
  return std::unique_ptr<SimDevice>(new SimDevice(std::move(impl)));
}

SimDevice::SimDevice(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {
  impl_->blas = sim::make_blas_backend(*this);
  impl_->dnn = sim::make_dnn_backend(*this);
}
SimDevice::~SimDevice() = default;

Status SimDevice::load_kernel_plugin(const std::string& path) {
  return impl_->kernels.load_plugin(path);
}

Status SimDevice::register_kernel(const std::string& mangled_name, HiberSimKernelFn run) {
  return impl_->kernels.add(mangled_name, run, "register_kernel()");
}

std::string SimDevice::backend_name() const { return "sim"; }

int SimDevice::gpu_count() const { return impl_->options.node.gpu_count(); }

const DeviceProperties& SimDevice::properties(int gpu) const {
  if (impl_->check_gpu(gpu).ok()) return impl_->properties[gpu];
  LOG(ERROR) << "SimDevice::properties: GPU " << gpu << " does not exist";
  static const DeviceProperties kNone = [] {
    DeviceProperties p;
    p.ordinal = -1;
    return p;
  }();
  return kNone;
}

const NodeConfig& SimDevice::topology() const { return impl_->options.node; }

Result<MemoryInfo> SimDevice::memory_info(int gpu) {
  HIBER_RETURN_IF_ERROR(impl_->check_gpu(gpu));
  return MemoryInfo{impl_->memories[gpu]->free_bytes(), impl_->options.node.gpus[gpu].memory_bytes};
}

uint64_t SimDevice::allocation_granularity(int) const {
  return impl_->options.allocation_granularity;
}

bool SimDevice::can_access_peer(int gpu, int peer) const {
  if (!impl_->check_gpu(gpu).ok() || !impl_->check_gpu(peer).ok()) return false;
  return impl_->peers(gpu, peer);
}

// ---- Virtual memory ----

Result<DevicePtr> SimDevice::reserve_address_range(uint64_t bytes, uint64_t alignment) {
  return impl_->space.reserve(bytes, alignment);
}

Result<DevicePtr> SimDevice::reserve_address_range_at(DevicePtr va, uint64_t bytes) {
  return impl_->space.reserve_at(va, bytes);
}

Status SimDevice::free_address_range(DevicePtr va, uint64_t bytes) {
  return impl_->space.free(va, bytes);
}

Result<PhysicalMemory> SimDevice::create_physical(int gpu, uint64_t bytes) {
  HIBER_RETURN_IF_ERROR(impl_->check_gpu(gpu));
  const uint64_t granularity = impl_->options.allocation_granularity;
  if (bytes == 0 || bytes % granularity != 0)
    return error(ErrorCode::kInvalidValue, "create_physical: ", bytes,
                 " bytes is not a positive multiple of the granularity (", granularity, ")");
  HIBER_ASSIGN_OR_RETURN(uint64_t offset, impl_->memories[gpu]->allocate(bytes));
  auto block = std::make_shared<sim::PhysicalBlock>(*impl_->memories[gpu], offset, bytes);
  return PhysicalMemory{impl_->physical.insert(std::move(block)), gpu, bytes};
}

void SimDevice::discard_physical(PhysicalMemory memory, uint64_t offset, uint64_t bytes) {
  auto block = impl_->block(memory);
  if (!block.ok() || offset > (*block)->bytes() || bytes > (*block)->bytes() - offset) return;
  // The pool keeps its chunk; the host gets the freed block's pages back (they read as zeros).
  (void)::fallocate((*block)->fd(), FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
                    static_cast<off_t>((*block)->offset() + offset), static_cast<off_t>(bytes));
}

Status SimDevice::release_physical(PhysicalMemory memory) {
  HIBER_RETURN_IF_ERROR(impl_->block(memory).status());
  if (!impl_->physical.erase(memory.id))
    return error(ErrorCode::kInvalidHandle, "physical memory ", memory.id, " was already released");
  return Status();
}

Status SimDevice::map(DevicePtr va, uint64_t bytes, PhysicalMemory memory, uint64_t offset) {
  HIBER_ASSIGN_OR_RETURN(auto block, impl_->block(memory));
  return impl_->space.map(va, bytes, std::move(block), offset);
}

Status SimDevice::unmap(DevicePtr va, uint64_t bytes) { return impl_->space.unmap(va, bytes); }

Status SimDevice::set_access(DevicePtr va, uint64_t bytes, std::span<const int> gpus) {
  uint64_t mask = 0;
  for (int g : gpus) {
    HIBER_RETURN_IF_ERROR(impl_->check_gpu(g).with_context("set_access"));
    mask |= uint64_t{1} << g;
  }
  return impl_->space.set_access(va, bytes, mask, impl_->reachers);
}

Status SimDevice::register_host_memory(void* ptr, uint64_t bytes) {
  const auto start = reinterpret_cast<uintptr_t>(ptr);
  if (ptr == nullptr || bytes == 0 || bytes > UINTPTR_MAX - start)
    return error(ErrorCode::kInvalidValue, "register_host_memory: null pointer or bad size");
  MutexLock lock(impl_->host_mu);
  auto& ranges = impl_->registered_host;
  auto next = ranges.lower_bound(start);
  bool overlaps =
      (next != ranges.end() && next->first < start + bytes) ||
      (next != ranges.begin() && std::prev(next)->first + std::prev(next)->second > start);
  if (overlaps)
    return error(ErrorCode::kInvalidValue, "register_host_memory: [", hex(start), ", +", bytes,
                 ") overlaps memory already registered");
  ranges.emplace(start, bytes);
  return Status();
}

Status SimDevice::unregister_host_memory(void* ptr) {
  MutexLock lock(impl_->host_mu);
  if (impl_->registered_host.erase(reinterpret_cast<uintptr_t>(ptr)) == 0)
    return error(ErrorCode::kInvalidValue,
                 "unregister_host_memory: ", hex(reinterpret_cast<uintptr_t>(ptr)),
                 " is not the start of registered memory");
  return Status();
}

// ---- Contexts ----

Context SimDevice::shared_context(int gpu) const {
  CHECK(impl_->check_gpu(gpu).ok()) << "shared_context(" << gpu << "): no such GPU";
  MutexLock lock(impl_->shared_mu);
  return impl_->shared_contexts[gpu];
}

Result<Context> SimDevice::create_context(int gpu) {
  HIBER_RETURN_IF_ERROR(impl_->check_gpu(gpu));
  return Context{impl_->contexts.insert(impl_->scheduler.create_context(gpu, /*shared=*/false)),
                 gpu};
}

Status SimDevice::destroy_context(Context context) {
  HIBER_ASSIGN_OR_RETURN(auto state, impl_->context(context, /*usable=*/false));
  if (state->shared)
    return error(ErrorCode::kInvalidValue, "destroy_context: GPU ", context.gpu,
                 "'s shared context is never destroyed");
  // Its streams and events fail from now on (kInvalidContext); work already enqueued holds the
  // state it needs and finishes.
  state->destroyed.store(true, std::memory_order_release);
  impl_->contexts.erase(context.id);
  return Status();
}

Status SimDevice::reset_shared_context(int gpu) {
  HIBER_RETURN_IF_ERROR(impl_->check_gpu(gpu));
  MutexLock lock(impl_->shared_mu);
  const Context old = impl_->shared_contexts[gpu];
  std::shared_ptr<ContextState> state = impl_->contexts.erase(old.id);
  CHECK(state != nullptr) << "GPU " << gpu << "'s shared context is missing";
  // The old context's streams and events go with it: a handle of them that is passed again
  // finds nothing (kInvalidHandle), and work still holding their state finishes as destroyed.
  state->destroyed.store(true, std::memory_order_release);
  impl_->streams.erase_if([&](const StreamState& s) { return s.context == state; });
  impl_->events.erase_if([&](const EventState& e) { return e.context == state; });
  impl_->shared_contexts[gpu] =
      Context{impl_->contexts.insert(impl_->scheduler.create_context(gpu, /*shared=*/true)), gpu};
  return Status();
}

Status SimDevice::context_status(Context context) {
  HIBER_ASSIGN_OR_RETURN(auto state, impl_->context(context, /*usable=*/false));
  return impl_->scheduler.fault(*state);
}

// ---- Streams and events ----

Result<Stream> SimDevice::create_stream(Context context, int priority) {
  HIBER_ASSIGN_OR_RETURN(auto c, impl_->context(context, /*usable=*/true));
  return Stream{impl_->streams.insert(impl_->scheduler.create_stream(c, priority)), context.gpu,
                context.id};
}

Status SimDevice::destroy_stream(Stream stream) {
  HIBER_RETURN_IF_ERROR(impl_->stream(stream, /*usable=*/false).status());
  // Work already enqueued holds the stream's state and still runs.
  if (!impl_->streams.erase(stream.id))
    return error(ErrorCode::kInvalidHandle, "stream ", stream.id, " was already destroyed");
  return Status();
}

// Synchronisations and queries find a faulted context's streams and events too: they wait for
// the work enqueued (which a fault skips) and then answer the fault (sim/scheduler.h).
Status SimDevice::synchronize_stream(Stream stream) {
  HIBER_ASSIGN_OR_RETURN(auto s, impl_->stream(stream, /*usable=*/false));
  return impl_->scheduler.synchronize(*s);
}

Status SimDevice::query_stream(Stream stream) {
  HIBER_ASSIGN_OR_RETURN(auto s, impl_->stream(stream, /*usable=*/false));
  return impl_->scheduler.query(*s);
}

Status SimDevice::cancel_stream(Stream stream, const Status& why) {
  HIBER_ASSIGN_OR_RETURN(auto s, impl_->stream(stream, /*usable=*/false));
  impl_->scheduler.cancel(*s, why.ok() ? Status(ErrorCode::kUnknown, "cancelled") : why);
  return Status();
}

Status SimDevice::add_callback(Stream stream, StreamCallback callback) {
  HIBER_ASSIGN_OR_RETURN(auto s, impl_->stream(stream));
  if (!callback) return error(ErrorCode::kInvalidValue, "add_callback: empty callback");
  impl_->scheduler.enqueue_callback(s, std::move(callback));
  return Status();
}

Result<Event> SimDevice::create_event(Context context, bool disable_timing) {
  HIBER_ASSIGN_OR_RETURN(auto c, impl_->context(context, /*usable=*/true));
  return Event{impl_->events.insert(impl_->scheduler.create_event(c, !disable_timing)), context.gpu,
               context.id};
}

Status SimDevice::destroy_event(Event event) {
  HIBER_RETURN_IF_ERROR(impl_->event(event, /*usable=*/false).status());
  if (!impl_->events.erase(event.id))
    return error(ErrorCode::kInvalidHandle, "event ", event.id, " was already destroyed");
  return Status();
}

Status SimDevice::record_event(Event event, Stream stream) {
  HIBER_ASSIGN_OR_RETURN(auto e, impl_->event(event));
  HIBER_ASSIGN_OR_RETURN(auto s, impl_->stream(stream));
  if (e->gpu != s->gpu)
    return error(ErrorCode::kInvalidHandle, "record_event: event of GPU ", e->gpu,
                 " recorded on a stream of GPU ", s->gpu);
  if (e->context != s->context)
    return error(ErrorCode::kInvalidHandle,
                 "record_event: the event and the stream are in different contexts");
  impl_->scheduler.enqueue_record(s, e);
  return Status();
}

Status SimDevice::wait_event(Stream stream, Event event) {
  HIBER_ASSIGN_OR_RETURN(auto s, impl_->stream(stream));
  HIBER_ASSIGN_OR_RETURN(auto e, impl_->event(event));
  impl_->scheduler.enqueue_wait(s, e);
  return Status();
}

Status SimDevice::synchronize_event(Event event) {
  HIBER_ASSIGN_OR_RETURN(auto e, impl_->event(event, /*usable=*/false));
  return impl_->scheduler.synchronize(*e);
}

Status SimDevice::query_event(Event event) {
  HIBER_ASSIGN_OR_RETURN(auto e, impl_->event(event, /*usable=*/false));
  return impl_->scheduler.query(*e);
}

Result<float> SimDevice::elapsed_ms(Event start, Event end) {
  HIBER_ASSIGN_OR_RETURN(auto a, impl_->event(start));
  HIBER_ASSIGN_OR_RETURN(auto b, impl_->event(end));
  return impl_->scheduler.elapsed_ms(*a, *b);
}

// ---- Copies and memset ----

Status SimDevice::copy_host_to_device(Stream stream, DevicePtr dst, const void* src,
                                      uint64_t bytes) {
  HIBER_ASSIGN_OR_RETURN(auto s, impl_->stream(stream));
  if (bytes == 0) return Status();
  if (src == nullptr) return error(ErrorCode::kInvalidValue, "copy_host_to_device: null source");
  HIBER_ASSIGN_OR_RETURN(int owner, impl_->check_range("copy_host_to_device", dst, bytes, s->gpu));
  if (impl_->inject_transfer_failure(owner)) {
    impl_->scheduler.enqueue_work(s, [dst] {
      return error(ErrorCode::kUnknown, "copy_host_to_device to ", hex(dst),
                   ": simulated transfer failure (fault injection)");
    });
    return Status();
  }
  sim::CopySpec spec{reinterpret_cast<void*>(dst),
                     src,
                     bytes,
                     s->gpu,
                     -1,
                     impl_->host_path(impl_->links.host_to_device(owner), src, bytes)};
  impl_->enqueue_copy(s, std::move(spec), str_cat("copy_host_to_device to ", hex(dst)));
  return Status();
}

Status SimDevice::copy_device_to_host(Stream stream, void* dst, DevicePtr src, uint64_t bytes) {
  HIBER_ASSIGN_OR_RETURN(auto s, impl_->stream(stream));
  if (bytes == 0) return Status();
  if (dst == nullptr)
    return error(ErrorCode::kInvalidValue, "copy_device_to_host: null destination");
  HIBER_ASSIGN_OR_RETURN(int owner, impl_->check_range("copy_device_to_host", src, bytes, s->gpu));
  sim::CopySpec spec{dst,    reinterpret_cast<const void*>(src),
                     bytes,  -1,
                     s->gpu, impl_->host_path(impl_->links.device_to_host(owner), dst, bytes)};
  impl_->enqueue_copy(s, std::move(spec), str_cat("copy_device_to_host from ", hex(src)));
  return Status();
}

Status SimDevice::copy_device_to_device(Stream stream, DevicePtr dst, DevicePtr src,
                                        uint64_t bytes) {
  HIBER_ASSIGN_OR_RETURN(auto s, impl_->stream(stream));
  if (bytes == 0) return Status();
  HIBER_ASSIGN_OR_RETURN(
      int dst_owner, impl_->check_range("copy_device_to_device (destination)", dst, bytes, s->gpu));
  HIBER_ASSIGN_OR_RETURN(int src_owner,
                         impl_->check_range("copy_device_to_device (source)", src, bytes, s->gpu));
  // The path follows where the memory physically is, as a real copy would.
  sim::CopySpec spec{reinterpret_cast<void*>(dst),
                     reinterpret_cast<const void*>(src),
                     bytes,
                     s->gpu,
                     s->gpu,
                     impl_->links.peer(src_owner, dst_owner)};
  impl_->enqueue_copy(s, std::move(spec),
                      str_cat("copy_device_to_device from ", hex(src), " to ", hex(dst)));
  return Status();
}

Status SimDevice::copy_peer(Stream stream, DevicePtr dst, int dst_gpu, DevicePtr src, int src_gpu,
                            uint64_t bytes) {
  HIBER_ASSIGN_OR_RETURN(auto s, impl_->stream(stream));
  HIBER_RETURN_IF_ERROR(impl_->check_gpu(dst_gpu).with_context("copy_peer"));
  HIBER_RETURN_IF_ERROR(impl_->check_gpu(src_gpu).with_context("copy_peer"));
  if (bytes == 0) return Status();
  HIBER_RETURN_IF_ERROR(
      impl_->check_range("copy_peer (destination)", dst, bytes, dst_gpu).status());
  HIBER_RETURN_IF_ERROR(impl_->check_range("copy_peer (source)", src, bytes, src_gpu).status());
  sim::CopySpec spec{reinterpret_cast<void*>(dst),
                     reinterpret_cast<const void*>(src),
                     bytes,
                     dst_gpu,
                     src_gpu,
                     impl_->links.peer(src_gpu, dst_gpu)};
  impl_->enqueue_copy(
      s, std::move(spec),
      str_cat("copy_peer from GPU ", src_gpu, " ", hex(src), " to GPU ", dst_gpu, " ", hex(dst)));
  return Status();
}

Status SimDevice::memset(Stream stream, DevicePtr dst, uint32_t value, int element_bytes,
                         uint64_t count) {
  HIBER_ASSIGN_OR_RETURN(auto s, impl_->stream(stream));
  if (element_bytes != 1 && element_bytes != 2 && element_bytes != 4)
    return error(ErrorCode::kInvalidValue, "memset: element size ", element_bytes,
                 " is not 1, 2 or 4");
  if (dst % static_cast<uint64_t>(element_bytes) != 0)
    return error(ErrorCode::kInvalidValue, "memset: ", hex(dst), " is not aligned to ",
                 element_bytes, " bytes");
  if (count == 0) return Status();
  if (count > UINT64_MAX / static_cast<uint64_t>(element_bytes))
    return error(ErrorCode::kInvalidValue, "memset: ", count, " elements overflow");
  HIBER_ASSIGN_OR_RETURN(int owner,
                         impl_->check_range("memset", dst, count * element_bytes, s->gpu));
  sim::FillSpec spec{dst, s->gpu, value, element_bytes, count, impl_->links.within(owner)};
  impl_->scheduler.enqueue_work(s, [impl = impl_.get(), spec] {
    return impl->mover.fill(spec).with_context(str_cat("memset at ", hex(spec.dst)));
  });
  return Status();
}

// ---- Code ----

Result<Module> SimDevice::load_module(std::span<const std::byte> image) {
  // Kernels run as host code, so any architecture's cubin or PTX will do.
  std::vector<KernelInfo> kernels;
  if (fatbin::is_fatbin(image)) {
    HIBER_ASSIGN_OR_RETURN(auto entries, fatbin::parse_fatbin(image));
    if (entries.empty())
      return error(ErrorCode::kNoBinaryForGpu,
                   "load_module: the fatbin has no cubin or PTX entry to load");
    HIBER_ASSIGN_OR_RETURN(kernels, fatbin::fatbin_kernels(entries));
  } else {
    HIBER_ASSIGN_OR_RETURN(kernels, fatbin::image_kernels(image));
  }
  VLOG(1) << "load_module: " << image.size() << " bytes, " << kernels.size() << " kernels";
  return Module{impl_->modules.insert(std::make_shared<ModuleState>(std::move(kernels)))};
}

Status SimDevice::unload_module(Module module) {
  auto state = impl_->modules.erase(module.id);
  if (!state) return error(ErrorCode::kInvalidHandle, "module ", module.id, " does not exist");
  MutexLock lock(state->mu);
  state->unloaded = true;
  for (const auto& [name, id] : state->functions) impl_->functions.erase(id);
  return Status();
}

Result<Function> SimDevice::get_function(Module module, const std::string& name) {
  auto state = impl_->modules.find(module.id);
  if (!state) return error(ErrorCode::kInvalidHandle, "module ", module.id, " does not exist");
  auto it = std::lower_bound(state->kernels.begin(), state->kernels.end(), name,
                             [](const KernelInfo& k, const std::string& n) { return k.name < n; });
  if (it == state->kernels.end() || it->name != name)
    return error(ErrorCode::kNotFound, "module ", module.id, " has no kernel named ", name,
                 " (it has ", state->kernels.size(), ")");
  MutexLock lock(state->mu);
  if (state->unloaded)
    return error(ErrorCode::kInvalidHandle, "module ", module.id, " was unloaded");
  auto [known, inserted] = state->functions.try_emplace(name, 0);
  if (inserted)
    known->second =
        impl_->functions.insert(std::make_shared<FunctionState>(FunctionState{module.id, *it}));
  return Function{known->second};
}

Result<KernelInfo> SimDevice::function_info(Function function) {
  auto state = impl_->functions.find(function.id);
  if (!state) return error(ErrorCode::kInvalidHandle, "function ", function.id, " does not exist");
  return state->info;
}

Status SimDevice::launch(Stream stream, Function function, const LaunchConfig& config,
                         std::span<const std::byte> params) {
  HIBER_ASSIGN_OR_RETURN(auto s, impl_->stream(stream));
  auto f = impl_->functions.find(function.id);
  if (!f) return error(ErrorCode::kInvalidHandle, "function ", function.id, " does not exist");
  const KernelInfo& info = f->info;
  const DeviceProperties& props = impl_->properties[s->gpu];
  const Dim3 g = config.grid;
  const Dim3 b = config.block;
  auto limit = [&](int attribute) { return static_cast<uint32_t>(props.attribute(attribute)); };
  if (g.x == 0 || g.y == 0 || g.z == 0 || g.x > limit(kAttrMaxGridDimX) ||
      g.y > limit(kAttrMaxGridDimY) || g.z > limit(kAttrMaxGridDimZ))
    return error(ErrorCode::kInvalidValue, "launch of ", info.name, ": grid ", g.x, "x", g.y, "x",
                 g.z, " is empty or beyond the limits");
  if (b.x == 0 || b.y == 0 || b.z == 0 || b.x > 1024 || b.y > 1024 || b.z > 64 ||
      uint64_t{b.x} * b.y * b.z > limit(kAttrMaxThreadsPerBlock))
    return error(ErrorCode::kInvalidValue, "launch of ", info.name, ": block ", b.x, "x", b.y, "x",
                 b.z, " is empty or beyond 1024 threads");
  if (config.shared_memory_bytes > limit(kAttrMaxSharedMemoryPerBlockOptin))
    return error(ErrorCode::kInvalidValue, "launch of ", info.name, ": ",
                 config.shared_memory_bytes, " bytes of shared memory exceed the GPU's ",
                 limit(kAttrMaxSharedMemoryPerBlockOptin));
  if (params.size() != info.param_bytes())
    return error(ErrorCode::kInvalidValue, "launch of ", info.name, ": ", params.size(),
                 " bytes of parameters, the kernel takes ", info.param_bytes());
  HiberSimKernelFn run = impl_->kernels.find(info.name);
  if (run == nullptr)
    return error(ErrorCode::kNotSupported, "launch of ", info.name,
                 ": the simulated GPU has no host implementation of this kernel; register one with "
                 "SimDevice::register_kernel() or a kernel plugin exporting ",
                 HIBER_SIM_KERNELS_V1_SYMBOL, " (server/device/sim_kernel_plugin.h)");

  auto data = std::make_shared<LaunchData>();
  data->info = info;
  data->run = run;
  data->space = &impl_->space;
  data->storage.resize((params.size() + sizeof(std::max_align_t) - 1) / sizeof(std::max_align_t));
  if (!params.empty()) std::memcpy(data->storage.data(), params.data(), params.size());
  auto* base = reinterpret_cast<std::byte*>(data->storage.data());
  for (const ParamInfo& p : info.params) data->params.push_back(base + p.offset);
  data->launch.name = data->info.name.c_str();
  data->launch.grid = {g.x, g.y, g.z};
  data->launch.block = {b.x, b.y, b.z};
  data->launch.shared_memory_bytes = config.shared_memory_bytes;
  data->launch.gpu = s->gpu;
  data->launch.param_count = static_cast<uint32_t>(data->params.size());
  data->launch.params = data->params.data();
  data->launch.check_access = check_kernel_access;
  data->launch.device_context = data.get();
  data->deadline = config.deadline;
  data->on_timeout = config.on_timeout;
  data->context_lost = config.context_lost;

  impl_->scheduler.enqueue_work(
      s,
      [data, watchdog = &impl_->watchdog] {
        if (data->context_lost && data->context_lost->load())
          return error(ErrorCode::kLaunchTimeout, "kernel ", data->info.name,
                       " not run: an earlier kernel of its context ran past its deadline");
        // When it runs, not when enqueued: what the GPU may access is what holds then.
        HIBER_RETURN_IF_ERROR(check_arguments(*data));
        auto body = [](void* arg) {
          auto* d = static_cast<LaunchData*>(arg);
          d->result = d->run(&d->launch);
        };
        // The deadline counts from the kernel's start on its worker, not from the launch call.
        std::shared_ptr<sim::RunControl> control;
        uint64_t ticket = 0;
        if (data->deadline.count() > 0) {
          control = std::make_shared<sim::RunControl>();
          ticket = watchdog->watch(control, sim::KernelWatchdog::Clock::now() + data->deadline);
        }
        const std::optional<sim::Fault> fault = sim::run_guarded(body, data.get(), control.get());
        if (control) watchdog->unwatch(ticket);
        if (fault && fault->interrupted) {
          Status late = error(
              ErrorCode::kLaunchTimeout, "kernel ", data->info.name, " ran past its deadline of ",
              std::chrono::duration_cast<std::chrono::milliseconds>(data->deadline).count(),
              " ms and was stopped");
          if (data->on_timeout) data->on_timeout(late);
          return late;
        }
        if (fault)
          return error(ErrorCode::kIllegalAddress, "kernel ", data->info.name, " touched ",
                       hex(fault->address), " (", strsignal(fault->signal),
                       "), which is not mapped memory of the simulated GPU");
        {
          // A refused access fails the launch whatever the kernel returned, as a fault would.
          MutexLock lock(data->refused_mu);
          if (!data->refused.ok())
            return data->refused.with_context(
                str_cat("kernel ", data->info.name, " (not memory of the caller's own blocks)"));
        }
        if (data->result != 0)
          return error(static_cast<ErrorCode>(data->result), "kernel ", data->info.name,
                       " failed with CUresult ", data->result);
        return Status();
      },
      /*kernel=*/true);
  return Status();
}

// What one host library call hands to its worker.
struct HostWork {
  std::string what;
  std::function<Status()> work;
  Status result;
};

Status SimDevice::enqueue_host_work(Stream stream, std::span<const Operand> operands,
                                    std::string what, std::function<Status()> work) {
  HIBER_ASSIGN_OR_RETURN(auto s, impl_->stream(stream));
  for (const Operand& o : operands) {
    if (o.bytes == 0) continue;
    HIBER_RETURN_IF_ERROR(impl_->check_range(what.c_str(), o.va, o.bytes, s->gpu).status());
  }
  auto data = std::make_shared<HostWork>(HostWork{std::move(what), std::move(work), Status()});
  impl_->scheduler.enqueue_work(
      s,
      [data] {
        auto body = [](void* arg) {
          auto* d = static_cast<HostWork*>(arg);
          d->result = d->work();
        };
        if (std::optional<sim::Fault> fault = sim::run_guarded(body, data.get()))
          return error(ErrorCode::kIllegalAddress, data->what, " touched ", hex(fault->address),
                       " (", strsignal(fault->signal),
                       "), which is not mapped memory of the simulated GPU");
        return data->result.with_context(data->what);
      },
      /*kernel=*/true);
  return Status();
}

LibraryBackend* SimDevice::library(library_ops::Library library) {
  switch (library) {
    case library_ops::Library::kBlas: return impl_->blas.get();
    case library_ops::Library::kDnn: return impl_->dnn.get();
  }
  return nullptr;
}

}  // namespace hiber::device
