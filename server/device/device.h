// What hiberd needs from the node's GPUs, behind one interface with two real backends:
//   - CUDA (server/device/cuda_device.h): the CUDA Driver API, on a real GPU;
//   - simulated (server/device/sim_device.h): host memory that behaves like GPU memory, used
//     wherever there is no GPU (development machines, CI) and by timing-faithful tests.
// One behavioural suite (tests/unit/device_contract.h) runs against both.
//
// Model. All GPUs of the node share one virtual address space, as with CUDA's unified
// addressing. Device memory is managed the CUDA VMM way: reserve a virtual range, create
// physical memory on a GPU, map it at an address in a reserved range, and set which GPUs may
// access the mapping. The same physical memory may be mapped at several addresses at once.
// Work is asynchronous and ordered per stream; events mark positions in streams.
//
// Errors are Status values with CUDA driver error codes. Work that fails after it was enqueued
// reports its error at the next synchronisation of its stream (synchronize_stream,
// synchronize_event or a stream callback's status), as CUDA does.
//
// Contexts. Streams and events live in a context of one GPU. Every GPU has a shared context
// (CUDA's primary context), which exists as long as the device; more contexts can be created
// and destroyed. A fault of work in a context (a kernel's illegal address, trap or overrun:
// is_context_fault) is sticky for that context, as on CUDA: the faulting work's error is then
// the answer of every later synchronisation, query and enqueue of its streams and events, and
// its work not yet started does not run. Other contexts, on the same GPU or others, are not
// affected. Memory is not per context: physical memory, reservations and mappings belong to the
// device, and set_access grants GPUs, whatever context their work runs in. A faulted shared
// context stays faulted until reset_shared_context starts it afresh.
//
// Thread safety: every method may be called from any thread concurrently. Handles are plain
// values; the caller owns what it creates and destroys it exactly once. Passing a destroyed or
// foreign handle is a caller bug (the simulated backend reports kInvalidHandle where it can).
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <compare>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "common/device_attributes.h"
#include "common/kernel_info.h"
#include "common/node_config.h"
#include "common/status.h"
#include "library_ops/dispatch.h"

namespace hiber::device {

// A device address: a virtual address in the node's unified address space.
using DevicePtr = uint64_t;

// Opaque handles. `gpu` is the GPU the object belongs to (not meaningful for Module/Function,
// which serve every GPU); `context` is the id of the Context a stream or event lives in.
struct Context {
  uint64_t id = 0;
  int gpu = 0;
  friend auto operator<=>(const Context&, const Context&) = default;
};
struct Stream {
  uint64_t id = 0;
  int gpu = 0;
  uint64_t context = 0;
};
struct Event {
  uint64_t id = 0;
  int gpu = 0;
  uint64_t context = 0;
};
struct PhysicalMemory {
  uint64_t id = 0;
  int gpu = 0;
  uint64_t bytes = 0;
};
struct Module {
  uint64_t id = 0;
};
struct Function {
  uint64_t id = 0;
};

class LibraryBackend;

struct Dim3 {
  uint32_t x = 1;
  uint32_t y = 1;
  uint32_t z = 1;
};

struct LaunchConfig {
  Dim3 grid;
  Dim3 block;
  uint32_t shared_memory_bytes = 0;
  // The longest the kernel may run once it starts; 0: no limit. A kernel past it is stopped
  // (simulated device) or its GPU's context is ended (CUDA), and the launch fails with
  // kLaunchTimeout.
  std::chrono::nanoseconds deadline{0};
  // With a deadline: told when the kernel ran past it, on a device thread (it must not call the
  // device, as a stream callback must not).
  std::function<void(const Status&)> on_timeout;
  // Set once the caller's context is lost (an earlier kernel timed out): a kernel that finds it
  // set when its turn comes does not run, and fails with kLaunchTimeout, as on a dead context.
  std::shared_ptr<const std::atomic<bool>> context_lost;
};

using hiber::KernelInfo;
using hiber::ParamInfo;

// Attributes are indexed by CUdevice_attribute (common/device_attributes.h).
using enum hiber::DeviceAttribute;

struct DeviceProperties {
  int ordinal = 0;
  std::string name;
  std::array<uint8_t, 16> uuid{};
  std::string pci_bus_id;  // "0000:3b:00.0"
  uint64_t total_memory_bytes = 0;
  std::vector<int32_t> attributes = std::vector<int32_t>(kAttrCount, 0);

  int attribute(int index) const {
    return index >= 0 && index < static_cast<int>(attributes.size()) ? attributes[index] : 0;
  }
};

struct MemoryInfo {
  uint64_t free_bytes = 0;
  uint64_t total_bytes = 0;
};

// Runs after all work enqueued before it on its stream, with the status of that work
// (success, or the first error). Must not call back into the Device (as with CUDA host
// callbacks); it may post work to other threads.
using StreamCallback = std::function<void(Status)>;

// Whether an error of work on a GPU ends its context (CUDA's sticky errors): an illegal
// address, a kernel past its deadline, a trap or assertion, a misaligned or illegal
// instruction, a failed launch.
bool is_context_fault(ErrorCode code);

class Device {
 public:
  virtual ~Device() = default;

  // "sim" or "cuda".
  virtual std::string backend_name() const = 0;

  // ---- The node ----
  virtual int gpu_count() const = 0;
  virtual const DeviceProperties& properties(int gpu) const = 0;
  // GPUs, PCIe switches and NVLink links. The simulated backend returns its config; the CUDA
  // backend what it discovered (or was configured with).
  virtual const NodeConfig& topology() const = 0;
  virtual Result<MemoryInfo> memory_info(int gpu) = 0;
  // Physical allocations and mappings of `gpu`'s memory are multiples of this, and so are
  // reserved ranges (a multiple of any one GPU's granularity will do).
  virtual uint64_t allocation_granularity(int gpu) const = 0;
  // Whether work on `gpu` can access memory on `peer` directly (peer copies need not stage
  // through the host).
  virtual bool can_access_peer(int gpu, int peer) const = 0;

  // ---- Virtual memory (CUDA VMM model) ----
  // Reserves a range of the address space; nothing is accessible until mapped.
  virtual Result<DevicePtr> reserve_address_range(uint64_t bytes, uint64_t alignment) = 0;
  // Reserves exactly [va, va + bytes) (a range an earlier hiberd gave a session that is being
  // resumed). kAlreadyMapped if any of it is taken; kNotSupported where the device cannot.
  virtual Result<DevicePtr> reserve_address_range_at(DevicePtr va, uint64_t bytes) {
    (void)va;
    (void)bytes;
    return Status(ErrorCode::kNotSupported, "this device cannot reserve a given address range");
  }
  // REQUIRES: nothing mapped in the range any more.
  virtual Status free_address_range(DevicePtr va, uint64_t bytes) = 0;
  // kOutOfMemory when the GPU has no room left.
  virtual Result<PhysicalMemory> create_physical(int gpu, uint64_t bytes) = 0;
  // [offset, offset + bytes) of `memory` holds nothing anyone needs any more (a pool block
  // freed): a device whose GPU memory is host memory gives the pages back. REQUIRES: nothing
  // uses the range, and nobody has been given it again.
  virtual void discard_physical(PhysicalMemory memory, uint64_t offset, uint64_t bytes) {
    (void)memory;
    (void)offset;
    (void)bytes;
  }
  // The memory goes away once released and unmapped everywhere.
  virtual Status release_physical(PhysicalMemory memory) = 0;
  // Maps [offset, offset + bytes) of `memory` at va, inside a reserved range. Not accessible
  // from any GPU until set_access.
  virtual Status map(DevicePtr va, uint64_t bytes, PhysicalMemory memory, uint64_t offset) = 0;
  virtual Status unmap(DevicePtr va, uint64_t bytes) = 0;
  // Sets exactly which GPUs may access the mapped range [va, va + bytes); others lose access.
  virtual Status set_access(DevicePtr va, uint64_t bytes, std::span<const int> gpus) = 0;

  // Host memory that copies read and write often (a client's arena). Registering it lets the
  // CUDA backend DMA straight from it; copies from unregistered memory still work.
  virtual Status register_host_memory(void* ptr, uint64_t bytes) = 0;
  virtual Status unregister_host_memory(void* ptr) = 0;
  // Whether registered memory's pages are pinned for the device's DMA: then a page given back
  // to the kernel (madvise) would be replaced by a fresh one the device never sees.
  virtual bool registration_pins_pages() const { return true; }

  // ---- Contexts ----
  // The GPU's shared context (REQUIRES: the GPU exists): never destroyed.
  virtual Context shared_context(int gpu) const = 0;
  // A new context on `gpu`, with nothing in it.
  virtual Result<Context> create_context(int gpu) = 0;
  // Destroys a created context (kInvalidValue for a shared one). Its streams and events must be
  // destroyed first; work already enqueued in it finishes or, after a fault, is dropped.
  virtual Status destroy_context(Context context) = 0;
  // kSuccess, or the fault that ended the context (is_context_fault).
  virtual Status context_status(Context context) = 0;
  // Shared mode's recovery after a fault (docs/design.md, "Isolation modes"): ends `gpu`'s
  // shared context, faulted or not, and starts it afresh (CUDA: cuDevicePrimaryCtxReset), so
  // work can run there again. Every stream and event made in it, and what the library backends
  // kept in it, is gone: the caller forgets its handles of them and must not pass them again,
  // not even to destroy them (on CUDA their values may name new objects). Physical memory,
  // reservations, mappings and their access, registered host memory and modules belong to the
  // device and stay. shared_context(gpu) names the fresh context (on CUDA the same value).
  // REQUIRES: nothing uses the old context's streams and events any more, on any thread.
  virtual Status reset_shared_context(int gpu) = 0;

  // ---- Streams and events ----
  // Lower priority values run first, as in CUDA; 0 is the default.
  virtual Result<Stream> create_stream(Context context, int priority) = 0;
  // In the GPU's shared context.
  Result<Stream> create_stream(int gpu, int priority);
  // Work already enqueued still runs.
  virtual Status destroy_stream(Stream stream) = 0;
  virtual Status synchronize_stream(Stream stream) = 0;
  // kSuccess when idle, kNotReady while work is pending, or the error of failed work.
  virtual Status query_stream(Stream stream) = 0;
  virtual Status add_callback(Stream stream, StreamCallback callback) = 0;
  // Drops the work enqueued on the stream that has not started (for a client that is gone):
  // it never runs, and the stream's error becomes `why`. Records, waits and callbacks still
  // complete in order (callbacks with `why`), so nothing waiting on the stream hangs; work
  // running now finishes. kNotSupported where work handed to the device cannot be taken back
  // (CUDA); the work then runs to its end.
  virtual Status cancel_stream(Stream stream, const Status& why) = 0;

  virtual Result<Event> create_event(Context context, bool disable_timing) = 0;
  // In the GPU's shared context.
  Result<Event> create_event(int gpu, bool disable_timing);
  virtual Status destroy_event(Event event) = 0;
  // The event and the stream must share a context (kInvalidHandle otherwise).
  virtual Status record_event(Event event, Stream stream) = 0;
  // Later work on `stream` waits until the work before the event's latest record is done.
  // An event never recorded is complete. The event may be of another context or GPU.
  virtual Status wait_event(Stream stream, Event event) = 0;
  virtual Status synchronize_event(Event event) = 0;
  virtual Status query_event(Event event) = 0;
  // Milliseconds between two completed records. kNotReady if either is pending;
  // kInvalidHandle if either was created with timing disabled.
  virtual Result<float> elapsed_ms(Event start, Event end) = 0;

  // ---- Copies and memset, asynchronous on a stream ----
  // Device ranges must be mapped and accessible from the stream's GPU. Host pointers must
  // stay valid until the copy completes.
  virtual Status copy_host_to_device(Stream stream, DevicePtr dst, const void* src,
                                     uint64_t bytes) = 0;
  virtual Status copy_device_to_host(Stream stream, void* dst, DevicePtr src, uint64_t bytes) = 0;
  virtual Status copy_device_to_device(Stream stream, DevicePtr dst, DevicePtr src,
                                       uint64_t bytes) = 0;
  // dst accessible from dst_gpu, src from src_gpu; travels over NVLink where the topology has
  // a link, through the host otherwise.
  virtual Status copy_peer(Stream stream, DevicePtr dst, int dst_gpu, DevicePtr src, int src_gpu,
                           uint64_t bytes) = 0;
  // Sets `count` elements of element_bytes (1, 2 or 4) to the low bytes of `value`.
  virtual Status memset(Stream stream, DevicePtr dst, uint32_t value, int element_bytes,
                        uint64_t count) = 0;

  // ---- Code ----
  // Loads a fatbin, cubin or PTX image once for every GPU. kInvalidImage if unreadable,
  // kNoBinaryForGpu if it has no code any GPU can run.
  virtual Result<Module> load_module(std::span<const std::byte> image) = 0;
  virtual Status unload_module(Module module) = 0;
  // kNotFound if the module has no kernel of that (mangled) name.
  virtual Result<Function> get_function(Module module, const std::string& name) = 0;
  virtual Result<KernelInfo> function_info(Function function) = 0;
  // `params` is the packed parameter buffer, laid out as function_info says; its size must be
  // the kernel's param_bytes().
  virtual Status launch(Stream stream, Function function, const LaunchConfig& config,
                        std::span<const std::byte> params) = 0;

  // ---- Remoted libraries (server/device/library.h) ----
  // The backend that runs `library`'s calls, or nullptr where this device has none.
  virtual LibraryBackend* library(library_ops::Library library) = 0;
};

// Creates physical chunks of `chunk_bytes` on `gpu` until only `reserve_bytes` of its memory
// would remain free: the reservation hiberd makes once at start. Rounds chunk_bytes up to the
// allocation granularity. Returns the chunks (possibly none if the GPU is smaller than the
// reserve); on an error, releases what it created.
Result<std::vector<PhysicalMemory>> reserve_pool(Device& device, int gpu, uint64_t reserve_bytes,
                                                 uint64_t chunk_bytes);

}  // namespace hiber::device
