// The simulated GPU: a real implementation of the Device interface in host memory.
//
//  - Each simulated GPU's physical memory is a memfd the size of the GPU (sparse: only touched
//    pages take host memory). Physical allocations are ranges of it.
//  - Reserved address ranges are PROT_NONE mappings; map() aliases the physical pages at the
//    address with mmap(MAP_FIXED), so one allocation is visible at several addresses at once,
//    exactly as with CUDA VMM. Access per GPU is tracked and enforced on copies and memsets;
//    as with CUDA, only the memory's own GPU and its peers may be granted it.
//  - Streams are ordered queues run by a pool of worker threads per GPU; events mark positions
//    in streams and carry timestamps. Contexts group streams and events; a fault (an illegal
//    address, a kernel stopped past its deadline) ends its context only (sim/scheduler.h).
//  - Copies move real bytes. With throttling on, each transfer takes the time the config's links
//    allow: host<->GPU through the GPU's PCIe switch (shared by the GPUs behind it, each direction
//    separately), GPU<->GPU over the NVLink or NVSwitch port between them, or through the host.
//    Concurrent transfers on one link share its bandwidth.
//  - Modules are real fatbins, cubins or PTX; kernels and their parameter layouts come from the
//    image. A launch runs the host implementation registered for the kernel's mangled name
//    (server/device/sim_kernel_plugin.h). A kernel with no implementation fails loudly.
//  - A fault inside a kernel on an address that is not mapped fails that launch with
//    kIllegalAddress instead of crashing the process.
//  - A kernel reaches only memory its GPU may access: its pointer arguments are checked before
//    it runs, and it checks the other ranges it touches (sim_kernel_plugin.h, "Isolation");
//    either refusal fails the launch with kIllegalAddress naming the address.
#pragma once

#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "common/node_config.h"
#include "server/device/device.h"
#include "server/device/sim_kernel_plugin.h"

namespace hiber::device {

struct SimDeviceOptions {
  NodeConfig node = default_node_config();
  // Slow copies to the config's link bandwidths (for timing-faithful tests and the demo).
  bool throttle_copies = false;
  // Granularity of physical allocations and mappings, like CUDA's (2 MiB on current GPUs).
  uint64_t allocation_granularity = 2 << 20;
  // Worker threads per simulated GPU; streams of one GPU run concurrently up to this many.
  int workers_per_gpu = 2;
  // Plugin shared libraries with host kernel implementations, loaded at creation.
  std::vector<std::string> kernel_plugins;
  // With throttling, a copy to or from host memory that is not registered (pageable) moves at
  // this fraction of the link: CUDA stages pageable memory through a pinned bounce buffer, which
  // on PCIe 3 systems runs at about half the pinned rate.
  double pageable_rate = 0.5;
  // Fault injection for tests: host-to-device copies to this GPU fail (CUDA_ERROR_UNKNOWN)
  // once fail_after_transfers of them have run. -1: never.
  int fail_transfers_to_gpu = -1;
  uint64_t fail_after_transfers = 0;
};

class SimDevice final : public Device {
 public:
  static Result<std::unique_ptr<SimDevice>> create(const SimDeviceOptions& options);
  // Finishes all work already enqueued (callbacks included), then stops the device's threads.
  ~SimDevice() override;

  // Loads a plugin (dlopen) and registers its kernels. A name registered twice keeps the first
  // and fails with kInvalidValue naming both plugins.
  Status load_kernel_plugin(const std::string& path);
  // Registers one host implementation directly (tests).
  Status register_kernel(const std::string& mangled_name, HiberSimKernelFn run);

  // Device interface; see device.h.
  std::string backend_name() const override;
  int gpu_count() const override;
  const DeviceProperties& properties(int gpu) const override;
  const NodeConfig& topology() const override;
  Result<MemoryInfo> memory_info(int gpu) override;
  uint64_t allocation_granularity(int gpu) const override;
  bool can_access_peer(int gpu, int peer) const override;
  Result<DevicePtr> reserve_address_range(uint64_t bytes, uint64_t alignment) override;
  Result<DevicePtr> reserve_address_range_at(DevicePtr va, uint64_t bytes) override;
  void discard_physical(PhysicalMemory memory, uint64_t offset, uint64_t bytes) override;
  Status free_address_range(DevicePtr va, uint64_t bytes) override;
  Result<PhysicalMemory> create_physical(int gpu, uint64_t bytes) override;
  Status release_physical(PhysicalMemory memory) override;
  Status map(DevicePtr va, uint64_t bytes, PhysicalMemory memory, uint64_t offset) override;
  Status unmap(DevicePtr va, uint64_t bytes) override;
  Status set_access(DevicePtr va, uint64_t bytes, std::span<const int> gpus) override;
  Status register_host_memory(void* ptr, uint64_t bytes) override;
  Status unregister_host_memory(void* ptr) override;
  // Registration is bookkeeping here: the simulated GPUs copy through the host's own pages.
  bool registration_pins_pages() const override { return false; }
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
  LibraryBackend* library(library_ops::Library library) override;

  // A device range a host implementation reads or writes.
  struct Operand {
    DevicePtr va = 0;
    uint64_t bytes = 0;
  };
  // Host implementations of library calls (sim/blas_host.cc, sim/dnn_host.cc) run here: `work`
  // runs on `stream`'s worker in stream order, as a kernel does. Every operand must be mapped
  // and accessible from the stream's GPU (checked now: kInvalidValue naming the address). A
  // fault inside `work` fails it with kIllegalAddress naming `what`; its frames are abandoned,
  // so `work` must take no lock and allocate nothing it needs freed while it touches device
  // memory (scratch belongs in what the closure owns).
  Status enqueue_host_work(Stream stream, std::span<const Operand> operands, std::string what,
                           std::function<Status()> work);

 private:
  struct Impl;
  explicit SimDevice(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace hiber::device
