// The node's GPU memory as hiberd hands it out: one pool per GPU (memory/gpu_pools.h) over
// physical memory of that GPU.
//
// With the buddy allocator (the default) each GPU's memory is reserved once, at start, in a few
// large chunks (device::reserve_pool): all of it but `reserve_bytes`, which stays free for the
// driver, contexts and library workspaces. Nothing is allocated on the device afterwards. The
// paper's baselines allocate on the device per block instead: "block" keeps freed allocations in
// one cache, "naive" allocates and frees every time; for them this class is the ChunkSource that
// turns a pool's chunk ids into device allocations.
//
// A placement (memory::Allocation) names a chunk and an offset; physical() gives the device
// memory to map it from.
//
// Thread safety: every method may be called from any thread (GpuPools serialises placements;
// the chunk tables are guarded here).
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "common/status.h"
#include "memory/buddy_allocator.h"
#include "memory/gpu_pools.h"
#include "server/device/device.h"

namespace hiber::server {

using memory::GpuPools;

struct DevicePoolsOptions {
  memory::PoolKind kind = memory::PoolKind::kBuddy;
  // Left unreserved on each GPU.
  uint64_t reserve_bytes = 512ull << 20;
  // The size of the chunks a GPU's memory is reserved in (buddy). Capped at what the GPU has.
  uint64_t chunk_bytes = 4ull << 30;
  memory::BuddyOptions buddy;
};

class DevicePools {
 public:
  // kOutOfMemory if a GPU has no memory left beyond the reserve.
  static Result<std::unique_ptr<DevicePools>> create(device::Device& device,
                                                     const DevicePoolsOptions& options);
  // Releases every chunk. REQUIRES: nothing is mapped from them any more.
  ~DevicePools();

  GpuPools& pools() { return *pools_; }
  const GpuPools& pools() const { return *pools_; }
  std::string_view kind_name() const { return memory::pool_kind_name(kind_); }

  // The device memory a placement on `gpu` lives in. kInvalidValue for an unknown chunk.
  Result<device::PhysicalMemory> physical(int gpu, uint32_t chunk) const;
  // Bytes of GPU memory given to the pool (buddy: reserved; block, naive: the budget).
  uint64_t pool_bytes(int gpu) const { return pool_bytes_[gpu]; }

 private:
  // Device allocations on demand, for the block and naive baselines.
  class DeviceChunks;

  DevicePools(device::Device& device, memory::PoolKind kind);

  device::Device& device_;
  const memory::PoolKind kind_;
  std::unique_ptr<GpuPools> pools_;
  std::vector<uint64_t> pool_bytes_;
  // buddy: the chunks reserved at start, per GPU, by chunk index.
  std::vector<std::vector<device::PhysicalMemory>> reserved_;
  // block, naive: one upstream per GPU.
  std::vector<std::unique_ptr<DeviceChunks>> upstreams_;
};

}  // namespace hiber::server
