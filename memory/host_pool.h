// The pinned host pool: host memory registered with the GPUs once, in large chunks, and
// sub-allocated for the two things that live there: the host copy of every function's model
// (kept for as long as the function exists) and the staging buffers swaps go through (per
// GPU). Nothing is pinned per request: registering is slow (milliseconds per call) and
// serialises the driver. The registration itself is hiberd's; this is the bookkeeping.
//
// Placement is the buddy allocator with a 64 KiB minimum block (host copies are copied in
// groups, and DMA wants page-aligned buffers; 64 KiB keeps the per-block waste of small
// tensors' segments low while the page arrays stay small) and tail trimming, so a block's host
// copy wastes under 64 KiB. A function's copies sit together (consolidation), so dropping a
// function frees contiguous memory.
//
// Thread safety: none; hiberd's controller owns it.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <unordered_map>
#include <vector>

#include "memory/buddy_allocator.h"
#include "memory/pool_allocator.h"

namespace hiber::memory {

struct HostPoolStats {
  uint64_t capacity_bytes = 0;
  uint64_t model_bytes = 0;    // host copies of models
  uint64_t staging_bytes = 0;  // staging buffers
  uint64_t free_bytes = 0;
  uint64_t largest_free_bytes = 0;
  uint64_t peak_used_bytes = 0;
  uint64_t allocations = 0;
  uint64_t releases = 0;
  uint64_t failures = 0;
  uint64_t chunks = 0;
  // The fragmentation metric: the largest free block over all free bytes (1 when free memory
  // is one piece; towards 0 as it crumbles; 1 when nothing is free).
  double largest_free_ratio() const {
    return free_bytes == 0 ? 1.0 : static_cast<double>(largest_free_bytes) / free_bytes;
  }
};

class HostPool {
 public:
  static constexpr uint64_t kMinBlockBytes = 64 * kKiB;

  // `chunk_bytes`: the chunks registered at start. `gpu_count`: for staging accounting.
  static Result<std::unique_ptr<HostPool>> create(const std::vector<uint64_t>& chunk_bytes,
                                                  int gpu_count);

  // Another registered chunk (the pool grows by large chunks, never per request). Its index.
  Result<uint32_t> add_chunk(uint64_t bytes);

  // Room for (part of) a function's model host copy.
  AllocationResult allocate_model_copy(FunctionId function, uint64_t bytes);
  // A staging buffer for transfers to or from `gpu`.
  AllocationResult allocate_staging(int gpu, uint64_t bytes);
  // kInvalidValue for anything that is not live.
  Status release(const Allocation& allocation);
  // Releases every model copy of a function (it was deregistered). Bytes released.
  uint64_t release_function(FunctionId function);

  uint64_t model_bytes(FunctionId function) const;
  uint64_t staging_bytes(int gpu) const;
  HostPoolStats stats() const;
  Status check_invariants() const;

 private:
  struct Use {
    std::optional<FunctionId> function;  // a model copy's function
    int gpu = -1;                        // a staging buffer's GPU
    uint64_t bytes = 0;
  };
  explicit HostPool(std::unique_ptr<BuddyAllocator> buddy, int gpu_count);
  static uint64_t key(const PoolLocation& where) {
    return uint64_t{where.chunk} << 40 | where.offset;
  }
  AllocationResult place(uint64_t bytes, FunctionId owner, Use use);

  std::unique_ptr<BuddyAllocator> buddy_;
  std::unordered_map<uint64_t, Use> live_;
  std::unordered_map<FunctionId, uint64_t> model_bytes_;
  std::vector<uint64_t> staging_bytes_;
  uint64_t peak_used_ = 0;
  uint64_t releases_ = 0;
};

}  // namespace hiber::memory
