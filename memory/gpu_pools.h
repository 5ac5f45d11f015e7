// Every GPU's pool on the node, the per-function accounting across them, and per-function
// quotas: what hiberd's sessions and controller (and hiber-sim) allocate through.
//
// Each GPU's memory is reserved once at start, all of it except a configured reserve, in a
// few large chunks (server/device/device.h reserve_pool); with the buddy allocator those chunks
// are the pool and nothing is allocated on the device afterwards. The block and naive
// baselines allocate on the device per request through a ChunkSource instead.
//
// Thread safety: every method may be called from any thread; one mutex serialises them.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "common/status.h"
#include "memory/buddy_allocator.h"
#include "memory/pool_allocator.h"

namespace hiber::memory {

enum class PoolKind { kBuddy, kBlock, kNaive };
// "buddy", "block" or "naive"; kInvalidValue names the choices otherwise.
Result<PoolKind> parse_pool_kind(std::string_view name);
std::string_view pool_kind_name(PoolKind kind);

class GpuPools {
 public:
  // Buddy pools over the chunks reserved on each GPU (chunks_per_gpu[g] are GPU g's sizes).
  static Result<std::unique_ptr<GpuPools>> create_buddy(
      const std::vector<std::vector<uint64_t>>& chunks_per_gpu, BuddyOptions options = {});
  // Block or naive pools allocating from each GPU's ChunkSource within its budget. The
  // sources must outlive the pools.
  static Result<std::unique_ptr<GpuPools>> create_upstream(
      PoolKind kind, const std::vector<ChunkSource*>& upstreams,
      const std::vector<uint64_t>& budgets, uint64_t granularity_bytes = 2 * kMiB);

  int gpu_count() const { return static_cast<int>(pools_.size()); }
  std::string_view pool_name() const { return pools_.empty() ? "none" : pools_[0]->name(); }

  // The most a function may hold on any one GPU, counted as the pools count it (after rounding);
  // 0 = no limit. Applies to later allocations.
  void set_quota(FunctionId function, uint64_t bytes);

  // Places `bytes` for `function` on `gpu`. The shortfall names the GPU and, over quota, says so;
  // `advice` as for PoolAllocator::allocate.
  AllocationResult allocate(int gpu, uint64_t bytes, FunctionId function,
                            const EvictablePredicate& evictable = {},
                            EvictionAdvice advice = EvictionAdvice::kWanted);
  // kInvalidValue for anything that is not a live allocation on that GPU.
  Status deallocate(int gpu, const Allocation& allocation);

  // Bytes a function holds on one GPU, or on all of them.
  uint64_t function_bytes(FunctionId function, int gpu) const;
  uint64_t function_bytes(FunctionId function) const;
  PoolStats stats(int gpu) const;
  void release_cached();
  Status check_invariants() const;

 private:
  GpuPools() = default;

  mutable std::mutex mutex_;
  std::vector<std::unique_ptr<PoolAllocator>> pools_;
  std::unordered_map<FunctionId, std::vector<uint64_t>> function_bytes_;  // per GPU
  std::unordered_map<FunctionId, uint64_t> quotas_;
};

}  // namespace hiber::memory
