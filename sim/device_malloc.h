// The device's own allocator, as the Torpor-Block ablation and the naive pool pay for it: a
// ChunkSource (memory/pool_allocator.h) that counts bytes like CountingChunkSource and charges
// simulated time for every cudaMalloc and cudaFree.
//
// Cost model (ESTIMATED; override with flags): cudaMalloc takes malloc_fixed plus
// malloc_per_mib for each MiB (the driver maps fresh physical pages), cudaFree free_fixed plus
// free_per_mib (it unmaps them, and synchronises the device first). The defaults, 100 us + 2 us
// per MiB and 100 us + 1 us per MiB, sit between the ~50 us a small cudaMalloc takes and the
// milliseconds large ones reach in public measurements (docs/sim.md); the paper's Fig. 13 only
// says Block's per-request allocation reached more than 4x the inference time. The pool asks
// for a device allocation only when its cache has no block that fits, so the cost lands on
// swaps after evictions and on requests whose scratch does not fit a cached block.
//
// The node drains the accumulated cost (take_cost) and adds it to the request that caused it;
// costs incurred when a request ends (its scratch freed) go to the next request on that GPU,
// whose start waits for the synchronising cudaFree.
#pragma once

#include <cstdint>

#include "memory/pool_allocator.h"
#include "scheduler/types.h"

namespace hiber::sim {

struct DeviceMallocCost {
  scheduler::Duration malloc_fixed = 100 * scheduler::kMicrosecond;
  scheduler::Duration malloc_per_mib = 2 * scheduler::kMicrosecond;
  scheduler::Duration free_fixed = 100 * scheduler::kMicrosecond;
  scheduler::Duration free_per_mib = 1 * scheduler::kMicrosecond;
};

class TimedChunkSource final : public memory::ChunkSource {
 public:
  TimedChunkSource(uint64_t capacity_bytes, const DeviceMallocCost& cost)
      : counting_(capacity_bytes), cost_(cost) {}

  Result<uint32_t> create_chunk(uint64_t bytes) override;
  void release_chunk(uint32_t chunk) noexcept override;

  // The time spent in the device allocator since the last call.
  scheduler::Duration take_cost();
  uint64_t mallocs() const { return mallocs_; }
  uint64_t frees() const { return frees_; }

 private:
  memory::CountingChunkSource counting_;
  DeviceMallocCost cost_;
  std::vector<uint64_t> chunk_bytes_;  // by chunk id, for the cost of its release
  scheduler::Duration pending_ = 0;
  uint64_t mallocs_ = 0;
  uint64_t frees_ = 0;
};

}  // namespace hiber::sim
