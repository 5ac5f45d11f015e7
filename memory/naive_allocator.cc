#include "memory/naive_allocator.h"

namespace hiber::memory {

NaiveAllocator::NaiveAllocator(ChunkSource& upstream, uint64_t budget_bytes,
                               uint64_t granularity_bytes)
    : upstream_(upstream), budget_bytes_(budget_bytes), granularity_(granularity_bytes) {}

NaiveAllocator::~NaiveAllocator() {
  for (const auto& [chunk, live] : live_) upstream_.release_chunk(chunk);
}

AllocationResult NaiveAllocator::do_allocate(uint64_t bytes, FunctionId owner,
                                             const EvictablePredicate&, EvictionAdvice) {
  const uint64_t needed = round_up(bytes, granularity_);
  Shortfall shortfall;
  shortfall.requested_bytes = bytes;
  shortfall.needed_bytes = needed;
  if (budget_bytes_ - live_bytes_ >= needed) {
    auto chunk = upstream_.create_chunk(needed);
    if (chunk.ok()) {
      ++counters_.upstream_allocations;
      ++counters_.allocations;
      live_.emplace(*chunk, Live{needed, bytes, owner});
      live_bytes_ += needed;
      requested_bytes_ += bytes;
      return Allocation{{*chunk, 0}, needed};
    }
    ++counters_.fragmentation_failures;
    shortfall.evict_bytes = needed;
  } else {
    shortfall.evict_bytes = needed - (budget_bytes_ - live_bytes_);
  }
  ++counters_.failures;
  shortfall.free_bytes = budget_bytes_ - live_bytes_;
  shortfall.largest_free_bytes = shortfall.free_bytes;
  return shortfall;
}

std::optional<FunctionId> NaiveAllocator::owner(const Allocation& allocation) const noexcept {
  auto it = live_.find(allocation.where.chunk);
  if (allocation.where.offset != 0 || it == live_.end() || it->second.bytes != allocation.bytes) {
    return std::nullopt;
  }
  return it->second.owner;
}

Status NaiveAllocator::do_deallocate(const Allocation& allocation) noexcept {
  auto it = live_.find(allocation.where.chunk);
  if (allocation.where.offset != 0 || it == live_.end() || it->second.bytes != allocation.bytes) {
    return error(ErrorCode::kInvalidValue, "naive: no live allocation of ", allocation.bytes,
                 " bytes in chunk ", allocation.where.chunk);
  }
  live_bytes_ -= it->second.bytes;
  requested_bytes_ -= it->second.requested;
  upstream_.release_chunk(it->first);
  ++counters_.upstream_releases;
  ++counters_.deallocations;
  live_.erase(it);
  return Status();
}

PoolStats NaiveAllocator::stats() const {
  PoolStats stats = counters_;
  stats.max_block_bytes = max_request_bytes();
  stats.capacity_bytes = budget_bytes_;
  stats.allocated_bytes = live_bytes_;
  stats.requested_bytes = requested_bytes_;
  stats.free_bytes = budget_bytes_ - live_bytes_;
  stats.largest_free_bytes = stats.free_bytes;
  stats.live_allocations = live_.size();
  return stats;
}

Status NaiveAllocator::check_invariants() const {
  uint64_t live = 0;
  for (const auto& [chunk, block] : live_) live += block.bytes;
  if (live != live_bytes_ || live > budget_bytes_) {
    return error(ErrorCode::kIllegalState, "naive: ", live, " live bytes, counted ", live_bytes_,
                 ", budget ", budget_bytes_);
  }
  return Status();
}

}  // namespace hiber::memory
