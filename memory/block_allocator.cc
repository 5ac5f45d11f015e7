#include "memory/block_allocator.h"

namespace hiber::memory {

BlockAllocator::BlockAllocator(ChunkSource& upstream, uint64_t budget_bytes,
                               uint64_t granularity_bytes)
    : upstream_(upstream), budget_bytes_(budget_bytes), granularity_(granularity_bytes) {}

BlockAllocator::~BlockAllocator() {
  release_cached();
  for (const auto& [chunk, live] : live_) upstream_.release_chunk(chunk);
}

void BlockAllocator::release_oldest() {
  const Cached oldest = by_age_.front();
  for (auto [it, end] = by_size_.equal_range(oldest.bytes); it != end; ++it) {
    if (it->second == by_age_.begin()) {
      by_size_.erase(it);
      break;
    }
  }
  by_age_.pop_front();
  cached_bytes_ -= oldest.bytes;
  upstream_.release_chunk(oldest.chunk);
  ++counters_.upstream_releases;
}

void BlockAllocator::release_cached() noexcept {
  while (!by_age_.empty()) release_oldest();
}

AllocationResult BlockAllocator::do_allocate(uint64_t bytes, FunctionId owner,
                                             const EvictablePredicate&, EvictionAdvice) {
  const uint64_t needed = round_up(bytes, granularity_);
  if (auto it = by_size_.lower_bound(needed); it != by_size_.end()) {
    const Cached block = *it->second;
    by_age_.erase(it->second);
    by_size_.erase(it);
    cached_bytes_ -= block.bytes;
    live_.emplace(block.chunk, Live{block.bytes, bytes, owner});
    live_bytes_ += block.bytes;
    requested_bytes_ += bytes;
    ++counters_.cache_hits;
    ++counters_.allocations;
    return Allocation{{block.chunk, 0}, block.bytes};
  }
  while (budget_bytes_ - live_bytes_ - cached_bytes_ < needed && !by_age_.empty()) {
    release_oldest();
  }
  Shortfall shortfall;
  shortfall.requested_bytes = bytes;
  shortfall.needed_bytes = needed;
  if (budget_bytes_ - live_bytes_ >= needed) {
    // The budget has room; the device may still refuse (fragmented, or shared with others).
    // Then free more of the cache, oldest first, until it places the request or nothing is left.
    for (;;) {
      auto chunk = upstream_.create_chunk(needed);
      if (chunk.ok()) {
        ++counters_.upstream_allocations;
        live_.emplace(*chunk, Live{needed, bytes, owner});
        live_bytes_ += needed;
        requested_bytes_ += bytes;
        ++counters_.allocations;
        return Allocation{{*chunk, 0}, needed};
      }
      if (by_age_.empty()) break;
      release_oldest();
    }
    ++counters_.fragmentation_failures;
    shortfall.evict_bytes = needed;
  } else {
    shortfall.evict_bytes = needed - (budget_bytes_ - live_bytes_);
  }
  ++counters_.failures;
  shortfall.free_bytes = budget_bytes_ - live_bytes_ - cached_bytes_;
  shortfall.largest_free_bytes = shortfall.free_bytes;
  return shortfall;
}

std::optional<FunctionId> BlockAllocator::owner(const Allocation& allocation) const noexcept {
  auto it = live_.find(allocation.where.chunk);
  if (allocation.where.offset != 0 || it == live_.end() || it->second.bytes != allocation.bytes) {
    return std::nullopt;
  }
  return it->second.owner;
}

Status BlockAllocator::do_deallocate(const Allocation& allocation) noexcept {
  auto it = live_.find(allocation.where.chunk);
  if (allocation.where.offset != 0 || it == live_.end() || it->second.bytes != allocation.bytes) {
    return error(ErrorCode::kInvalidValue, "block: no live allocation of ", allocation.bytes,
                 " bytes in chunk ", allocation.where.chunk);
  }
  live_bytes_ -= it->second.bytes;
  requested_bytes_ -= it->second.requested;
  by_age_.push_back(Cached{it->first, it->second.bytes});
  by_size_.emplace(it->second.bytes, std::prev(by_age_.end()));
  cached_bytes_ += it->second.bytes;
  live_.erase(it);
  ++counters_.deallocations;
  return Status();
}

PoolStats BlockAllocator::stats() const {
  PoolStats stats = counters_;
  stats.max_block_bytes = max_request_bytes();
  stats.capacity_bytes = budget_bytes_;
  stats.allocated_bytes = live_bytes_;
  stats.requested_bytes = requested_bytes_;
  stats.cached_bytes = cached_bytes_;
  stats.free_bytes = budget_bytes_ - live_bytes_ - cached_bytes_;
  // The device places each new allocation; as far as this allocator knows, free bytes are one
  // piece. The largest cached block may be larger still.
  stats.largest_free_bytes = stats.free_bytes;
  if (!by_size_.empty())
    stats.largest_free_bytes = std::max(stats.largest_free_bytes, by_size_.rbegin()->first);
  stats.live_allocations = live_.size();
  return stats;
}

Status BlockAllocator::check_invariants() const {
  uint64_t live = 0, cached = 0;
  for (const auto& [chunk, block] : live_) live += block.bytes;
  for (const Cached& block : by_age_) cached += block.bytes;
  if (live != live_bytes_ || cached != cached_bytes_ || by_size_.size() != by_age_.size()) {
    return error(ErrorCode::kIllegalState, "block: accounting off (live ", live, " vs ",
                 live_bytes_, ", cached ", cached, " vs ", cached_bytes_, ")");
  }
  if (live + cached > budget_bytes_) {
    return error(ErrorCode::kIllegalState, "block: ", live + cached, " bytes over the budget ",
                 budget_bytes_);
  }
  for (const Cached& block : by_age_) {
    if (live_.count(block.chunk) != 0) {
      return error(ErrorCode::kIllegalState, "block: chunk ", block.chunk, " is live and cached");
    }
  }
  return Status();
}

}  // namespace hiber::memory
