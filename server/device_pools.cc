#include "server/device_pools.h"

#include <algorithm>
#include <unordered_map>

#include <glog/logging.h>

#include "common/mutex.h"

namespace hiber::server {

// A ChunkSource whose chunks are device allocations on one GPU.
class DevicePools::DeviceChunks final : public memory::ChunkSource {
 public:
  DeviceChunks(device::Device& device, int gpu) : device_(device), gpu_(gpu) {}
  ~DeviceChunks() override {
    for (const auto& [id, memory] : chunks_) {
      Status released = device_.release_physical(memory);
      LOG_IF(ERROR, !released.ok())
          << "GPU " << gpu_ << ": releasing chunk " << id << ": " << released;
    }
  }

  Result<uint32_t> create_chunk(uint64_t bytes) override {
    HIBER_ASSIGN_OR_RETURN(device::PhysicalMemory memory, device_.create_physical(gpu_, bytes));
    MutexLock lock(mutex_);
    const uint32_t id = next_id_++;
    chunks_.emplace(id, memory);
    return id;
  }

  void release_chunk(uint32_t chunk) noexcept override {
    device::PhysicalMemory memory;
    {
      MutexLock lock(mutex_);
      auto it = chunks_.find(chunk);
      if (it == chunks_.end()) return;
      memory = it->second;
      chunks_.erase(it);
    }
    Status released = device_.release_physical(memory);
    LOG_IF(ERROR, !released.ok()) << "GPU " << gpu_ << ": releasing chunk " << chunk << ": "
                                  << released;
  }

  Result<device::PhysicalMemory> find(uint32_t chunk) const {
    MutexLock lock(mutex_);
    auto it = chunks_.find(chunk);
    if (it == chunks_.end()) {
      return error(ErrorCode::kInvalidValue, "GPU ", gpu_, " has no allocation ", chunk);
    }
    return it->second;
  }

 private:
  device::Device& device_;
  const int gpu_;
  mutable Mutex mutex_;
  // Ids are never reused, so a stale one cannot name a new allocation.
  uint32_t next_id_ GUARDED_BY(mutex_) = 0;
  std::unordered_map<uint32_t, device::PhysicalMemory> chunks_ GUARDED_BY(mutex_);
};

DevicePools::DevicePools(device::Device& device, memory::PoolKind kind)
    : device_(device), kind_(kind) {}

Result<std::unique_ptr<DevicePools>> DevicePools::create(device::Device& device,
                                                         const DevicePoolsOptions& options) {
  std::unique_ptr<DevicePools> pools(new DevicePools(device, options.kind));
  const int gpus = device.gpu_count();
  pools->pool_bytes_.assign(gpus, 0);
  if (options.kind == memory::PoolKind::kBuddy) {
    std::vector<std::vector<uint64_t>> sizes(gpus);
    pools->reserved_.resize(gpus);
    for (int g = 0; g < gpus; ++g) {
      HIBER_ASSIGN_OR_RETURN(device::MemoryInfo info, device.memory_info(g));
      if (info.free_bytes <= options.reserve_bytes) {
        return error(ErrorCode::kOutOfMemory, "GPU ", g, " has ", info.free_bytes,
                     " bytes free, no more than the reserve of ", options.reserve_bytes);
      }
      const uint64_t granularity = device.allocation_granularity(g);
      // Chunks of the buddy allocator must be multiples of its minimum block.
      const uint64_t unit = std::max(granularity, options.buddy.min_block_bytes);
      // As few chunks as chunk_bytes allows, of equal size, covering all but the reserve.
      const uint64_t usable = info.free_bytes - options.reserve_bytes;
      const uint64_t count =
          (usable + options.chunk_bytes - 1) / std::max<uint64_t>(options.chunk_bytes, 1);
      const uint64_t chunk = usable / std::max<uint64_t>(count, 1) / unit * unit;
      if (chunk == 0) {
        return error(ErrorCode::kOutOfMemory, "GPU ", g, ": less than one block (", unit,
                     " bytes) beyond the reserve");
      }
      HIBER_ASSIGN_OR_RETURN(pools->reserved_[g],
                             device::reserve_pool(device, g, options.reserve_bytes, chunk));
      for (const device::PhysicalMemory& m : pools->reserved_[g]) {
        sizes[g].push_back(m.bytes / unit * unit);
        pools->pool_bytes_[g] += sizes[g].back();
      }
      LOG(INFO) << "GPU " << g << ": reserved " << (pools->pool_bytes_[g] >> 20) << " MiB in "
                << sizes[g].size() << " chunks for the buddy pool";
    }
    HIBER_ASSIGN_OR_RETURN(pools->pools_, GpuPools::create_buddy(sizes, options.buddy));
    return pools;
  }
  std::vector<memory::ChunkSource*> upstreams;
  std::vector<uint64_t> budgets;
  for (int g = 0; g < gpus; ++g) {
    HIBER_ASSIGN_OR_RETURN(device::MemoryInfo info, device.memory_info(g));
    if (info.free_bytes <= options.reserve_bytes) {
      return error(ErrorCode::kOutOfMemory, "GPU ", g, " has no memory beyond the reserve");
    }
    pools->upstreams_.push_back(std::make_unique<DeviceChunks>(device, g));
    upstreams.push_back(pools->upstreams_.back().get());
    pools->pool_bytes_[g] = info.free_bytes - options.reserve_bytes;
    budgets.push_back(pools->pool_bytes_[g]);
  }
  HIBER_ASSIGN_OR_RETURN(pools->pools_,
                         GpuPools::create_upstream(options.kind, upstreams, budgets,
                                                   device.allocation_granularity(0)));
  return pools;
}

DevicePools::~DevicePools() {
  // The pools first: block's cache gives its allocations back to the upstreams.
  pools_.reset();
  upstreams_.clear();
  for (size_t g = 0; g < reserved_.size(); ++g) {
    for (const device::PhysicalMemory& m : reserved_[g]) {
      Status released = device_.release_physical(m);
      LOG_IF(ERROR, !released.ok()) << "GPU " << g << ": releasing a pool chunk: " << released;
    }
  }
}

Result<device::PhysicalMemory> DevicePools::physical(int gpu, uint32_t chunk) const {
  if (gpu < 0 || gpu >= static_cast<int>(pool_bytes_.size())) {
    return error(ErrorCode::kInvalidDevice, "no GPU ", gpu);
  }
  if (kind_ == memory::PoolKind::kBuddy) {
    if (chunk >= reserved_[gpu].size()) {
      return error(ErrorCode::kInvalidValue, "GPU ", gpu, " has no pool chunk ", chunk);
    }
    return reserved_[gpu][chunk];
  }
  return upstreams_[gpu]->find(chunk);
}

}  // namespace hiber::server
