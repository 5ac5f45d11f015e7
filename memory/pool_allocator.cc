#include "memory/pool_allocator.h"

#include <algorithm>
#include <sstream>

namespace hiber::memory {

std::string Shortfall::describe() const {
  std::ostringstream out;
  out << "cannot place " << requested_bytes << " bytes";
  if (needed_bytes != requested_bytes) out << " (" << needed_bytes << " after rounding)";
  if (gpu >= 0) out << " on GPU " << gpu;
  if (never_fits) {
    out << ": larger than any block the pool can give";
    return out.str();
  }
  if (over_quota) {
    out << ": over the function's quota; " << evict_bytes << " bytes of its own must go";
    return out.str();
  }
  out << ": " << free_bytes << " bytes free, largest free block " << largest_free_bytes;
  if (!advised) return out.str();
  if (evict_bytes == 0) {
    out << "; nothing evictable makes room";
  } else {
    out << "; evict " << evict_bytes << " bytes";
    for (const OwnerBytes& owner : evict) {
      out << " [function " << owner.function << ": " << owner.bytes << "]";
    }
  }
  return out.str();
}

double PoolStats::fragmentation() const {
  const uint64_t all_free = free_bytes + cached_bytes;
  const uint64_t whole = max_block_bytes == 0 ? all_free : std::min(all_free, max_block_bytes);
  if (whole == 0) return 0.0;
  return std::max(0.0, 1.0 - static_cast<double>(largest_free_bytes) / static_cast<double>(whole));
}

AllocationResult PoolAllocator::allocate(uint64_t bytes, FunctionId owner,
                                         const EvictablePredicate& evictable,
                                         EvictionAdvice advice) {
  if (bytes == 0 || bytes > max_request_bytes()) {
    Shortfall shortfall;
    shortfall.requested_bytes = bytes;
    shortfall.needed_bytes = bytes;
    shortfall.never_fits = true;
    shortfall.advised = advice == EvictionAdvice::kWanted;
    const PoolStats now = stats();
    shortfall.free_bytes = now.free_bytes + now.cached_bytes;
    shortfall.largest_free_bytes = now.largest_free_bytes;
    return shortfall;
  }
  AllocationResult result = do_allocate(bytes, owner, evictable, advice);
  if (!result.ok() && advice == EvictionAdvice::kSkipped) {
    // The same answer from every allocator, whether or not finding it cost anything.
    Shortfall& shortfall = result.shortfall();
    shortfall.advised = false;
    shortfall.evict_bytes = 0;
    shortfall.evict.clear();
  }
  return result;
}

Status PoolAllocator::deallocate(const Allocation& allocation) noexcept {
  return do_deallocate(allocation);
}

Result<uint32_t> CountingChunkSource::create_chunk(uint64_t bytes) {
  if (bytes == 0 || bytes > capacity_bytes_ - live_bytes_) {
    return error(ErrorCode::kOutOfMemory, "device has ", capacity_bytes_ - live_bytes_, " of ",
                 capacity_bytes_, " bytes free; ", bytes, " requested");
  }
  uint32_t id;
  if (!free_ids_.empty()) {
    id = free_ids_.back();
    free_ids_.pop_back();
  } else {
    id = static_cast<uint32_t>(bytes_.size());
    bytes_.push_back(0);
  }
  bytes_[id] = bytes;
  live_bytes_ += bytes;
  ++live_chunks_;
  return id;
}

void CountingChunkSource::release_chunk(uint32_t chunk) noexcept {
  if (chunk >= bytes_.size() || bytes_[chunk] == 0) return;
  live_bytes_ -= bytes_[chunk];
  --live_chunks_;
  bytes_[chunk] = 0;
  free_ids_.push_back(chunk);
}

}  // namespace hiber::memory
