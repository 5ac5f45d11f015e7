// The "naive" baseline: one device allocation per request and one release per free, as a
// server without a pool would do (and as hiberd did before it had one). Fragmentation is the
// device's business, so a shortfall can only name bytes, not owners.
#pragma once

#include <cstdint>
#include <unordered_map>

#include "memory/pool_allocator.h"

namespace hiber::memory {

class NaiveAllocator final : public PoolAllocator {
 public:
  // `upstream` must outlive this. Requests are rounded up to `granularity_bytes`.
  NaiveAllocator(ChunkSource& upstream, uint64_t budget_bytes,
                 uint64_t granularity_bytes = 2 * kMiB);
  ~NaiveAllocator() override;

  std::string_view name() const override { return "naive"; }
  std::optional<FunctionId> owner(const Allocation& allocation) const noexcept override;
  void release_cached() noexcept override {}
  PoolStats stats() const override;
  Status check_invariants() const override;

 private:
  struct Live {
    uint64_t bytes;
    uint64_t requested;
    FunctionId owner;
  };
  AllocationResult do_allocate(uint64_t bytes, FunctionId owner,
                               const EvictablePredicate& evictable, EvictionAdvice advice) override;
  Status do_deallocate(const Allocation& allocation) noexcept override;
  uint64_t max_request_bytes() const override {
    return budget_bytes_ / granularity_ * granularity_;  // rounded requests must fit the budget
  }

  ChunkSource& upstream_;
  uint64_t budget_bytes_;
  uint64_t granularity_;
  std::unordered_map<uint32_t, Live> live_;
  uint64_t live_bytes_ = 0;
  uint64_t requested_bytes_ = 0;
  PoolStats counters_;
};

}  // namespace hiber::memory
