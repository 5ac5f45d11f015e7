// The paper's Torpor-Block ablation (§7.2): freed blocks go to one cache; a request takes a
// cached block that is big enough, and otherwise frees cached blocks, oldest first, until the
// device places a new allocation. It makes device allocations after start, so its
// latency depends on the device, and a cached block larger than the request wastes the
// difference. Best fit among cached blocks (the smallest that is big enough), which is kinder
// than the paper's description requires: the comparison is against a fair baseline.
#pragma once

#include <cstdint>
#include <list>
#include <map>
#include <memory>
#include <unordered_map>

#include "memory/pool_allocator.h"

namespace hiber::memory {

class BlockAllocator final : public PoolAllocator {
 public:
  // `budget_bytes` of the device may be in use (live + cached); requests are rounded up to
  // `granularity_bytes` (the device's allocation granularity). `upstream` must outlive this.
  BlockAllocator(ChunkSource& upstream, uint64_t budget_bytes,
                 uint64_t granularity_bytes = 2 * kMiB);
  ~BlockAllocator() override;

  std::string_view name() const override { return "block"; }
  std::optional<FunctionId> owner(const Allocation& allocation) const noexcept override;
  void release_cached() noexcept override;
  PoolStats stats() const override;
  Status check_invariants() const override;

 private:
  struct Cached {
    uint32_t chunk;
    uint64_t bytes;
  };
  struct Live {
    uint64_t bytes;
    uint64_t requested;
    FunctionId owner;
  };
  using Age = std::list<Cached>::iterator;

  AllocationResult do_allocate(uint64_t bytes, FunctionId owner,
                               const EvictablePredicate& evictable, EvictionAdvice advice) override;
  Status do_deallocate(const Allocation& allocation) noexcept override;
  uint64_t max_request_bytes() const override {
    return budget_bytes_ / granularity_ * granularity_;  // rounded requests must fit the budget
  }
  void release_oldest();

  ChunkSource& upstream_;
  uint64_t budget_bytes_;
  uint64_t granularity_;
  std::list<Cached> by_age_;                 // oldest first
  std::multimap<uint64_t, Age> by_size_;     // cached blocks by size
  std::unordered_map<uint32_t, Live> live_;  // by chunk
  uint64_t live_bytes_ = 0;
  uint64_t cached_bytes_ = 0;
  uint64_t requested_bytes_ = 0;
  PoolStats counters_;
};

}  // namespace hiber::memory
