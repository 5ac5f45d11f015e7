// The stream-ordered allocator (cudaMallocAsync, cudaFreeAsync, memory pools), carved from the
// function's memory: a pool's segments are blocks in hiberd like cudaMalloc's, so they count
// against the quota and travel with the function under late binding and swaps.
#include <algorithm>
#include <cstring>

#include "client_shim/client.h"

namespace hiber::shim {
namespace {

// Pool allocations share segments at this alignment (cudaMallocAsync guarantees 256 bytes).
constexpr uint64_t kPoolAlignment = 256;
// A pool grows by segments of at least this many granules, so that small allocations share
// one block instead of taking a granule each.
constexpr uint64_t kSegmentGranules = 16;

// cudaMemPoolAttr, which CUmemPool_attribute mirrors.
enum PoolAttribute {
  kReuseFollowEventDependencies = 1,
  kReuseAllowOpportunistic = 2,
  kReuseAllowInternalDependencies = 3,
  kReleaseThreshold = 4,
  kReservedMemCurrent = 5,
  kReservedMemHigh = 6,
  kUsedMemCurrent = 7,
  kUsedMemHigh = 8,
};

}  // namespace

MemPoolObj* Client::default_pool_locked() {
  if (!default_pool_) default_pool_ = std::make_unique<MemPoolObj>();
  if (current_pool_ == nullptr) current_pool_ = default_pool_.get();
  return default_pool_.get();
}

Result<MemPoolObj*> Client::mem_pool(const void* handle) {
  std::lock_guard lock(mu_);
  if (handle != nullptr && handle == default_pool_.get()) return default_pool_.get();
  auto it = pools_.find(handle);
  if (it == pools_.end() || it->second->destroyed) {
    return error(ErrorCode::kInvalidValue, "unknown memory pool ", handle);
  }
  return it->second.get();
}

Result<MemPoolObj*> Client::default_mem_pool(int device) {
  std::lock_guard lock(mu_);
  HIBER_RETURN_IF_ERROR(ensure_open_locked());
  if (device != 0) return error(ErrorCode::kInvalidDevice, "device ", device, " does not exist");
  return default_pool_locked();
}

Result<MemPoolObj*> Client::current_mem_pool(int device) {
  std::lock_guard lock(mu_);
  HIBER_RETURN_IF_ERROR(ensure_open_locked());
  if (device != 0) return error(ErrorCode::kInvalidDevice, "device ", device, " does not exist");
  default_pool_locked();
  return current_pool_;
}

Status Client::set_current_mem_pool(int device, MemPoolObj* pool) {
  std::lock_guard lock(mu_);
  HIBER_RETURN_IF_ERROR(ensure_open_locked());
  if (device != 0) return error(ErrorCode::kInvalidDevice, "device ", device, " does not exist");
  default_pool_locked();
  current_pool_ = pool;
  return Status();
}

Result<MemPoolObj*> Client::create_mem_pool() {
  std::lock_guard lock(mu_);
  HIBER_RETURN_IF_ERROR(ensure_open_locked());
  auto pool = std::make_unique<MemPoolObj>();
  MemPoolObj* made = pool.get();
  pools_.emplace(made, std::move(pool));
  return made;
}

Status Client::destroy_mem_pool(MemPoolObj* pool) {
  std::lock_guard lock(mu_);
  HIBER_RETURN_IF_ERROR(ensure_open_locked());
  if (pool == default_pool_.get()) {
    return error(ErrorCode::kInvalidValue, "cudaMemPoolDestroy: the device's default pool");
  }
  HIBER_RETURN_IF_ERROR(trim_pool_locked(pool, 0));
  if (current_pool_ == pool) current_pool_ = default_pool_locked();
  for (const auto& [stream, frees] : pool->frees) {
    HIBER_RETURN_IF_ERROR(enqueue_locked(wire::calls::EventDestroy{.event = frees.event}));
  }
  pool->frees.clear();
  pool->waited.clear();
  if (pool->segments.empty()) {
    pools_.erase(pool);
  } else {
    pool->destroyed = true;  // goes when its last allocation is freed
  }
  return Status();
}

Result<uint64_t> Client::malloc_async(uint64_t bytes, MemPoolObj* pool, StreamObj* stream) {
  std::lock_guard lock(mu_);
  HIBER_RETURN_IF_ERROR(ensure_open_locked());
  if (pool == nullptr) {
    default_pool_locked();
    pool = current_pool_;
  }
  if (bytes == 0) return uint64_t{0};
  if (CaptureObj* capture = capture_of_locked(stream)) {
    return refuse_in_capture_locked(*capture, "cudaMallocAsync (memory nodes)");
  }
  HIBER_RETURN_IF_ERROR(order_for_work_locked(stream));
  // Reused memory may have been freed on another stream: this stream waits for those frees.
  const wire::StreamHandle here = stream_wire(stream);
  for (const auto& [freeing, frees] : pool->frees) {
    if (freeing == here) continue;
    uint64_t& waited = pool->waited[{here, freeing}];
    if (waited == frees.count) continue;
    HIBER_RETURN_IF_ERROR(
        enqueue_locked(wire::calls::StreamWaitEvent{.stream = here, .event = frees.event}));
    waited = frees.count;
  }
  std::optional<uint64_t> address;
  for (auto& [start, space] : pool->segments) {
    if ((address = space.allocate(bytes))) break;
  }
  if (!address) {
    const uint64_t granule = calls_->session().grant.allocation_granularity;
    const uint64_t size = std::max(segments_.round_up(bytes), kSegmentGranules * granule);
    Result<uint64_t> segment = allocate_segment_locked(size, bytes, "cudaMallocAsync");
    if (!segment.ok() && segment.status().code() == ErrorCode::kOutOfMemory) {
      // Other pools' unused memory first, then a segment of just this size.
      if (trim_pools_locked(/*all=*/true)) {
        segment = allocate_segment_locked(size, bytes, "cudaMallocAsync");
      }
      if (!segment.ok() && size > segments_.round_up(bytes)) {
        segment = allocate_segment_locked(segments_.round_up(bytes), bytes, "cudaMallocAsync");
      }
    }
    HIBER_RETURN_IF_ERROR(segment.status());
    const uint64_t segment_bytes = segments_.size_of(*segment);
    RangeAllocator& space =
        pool->segments.emplace(*segment, RangeAllocator(*segment, segment_bytes, kPoolAlignment))
            .first->second;
    pool->reserved_bytes += segment_bytes;
    pool->reserved_high = std::max(pool->reserved_high, pool->reserved_bytes);
    address = space.allocate(bytes);
  }
  pool->used_bytes += bytes;
  pool->used_high = std::max(pool->used_high, pool->used_bytes);
  allocations_.emplace(*address, bytes);
  pool_allocations_.emplace(*address, pool);
  return *address;
}

Status Client::free_async(uint64_t address, StreamObj* stream) {
  std::lock_guard lock(mu_);
  HIBER_RETURN_IF_ERROR(ensure_open_locked());
  if (address == 0) return Status();
  if (CaptureObj* capture = capture_of_locked(stream)) {
    return refuse_in_capture_locked(*capture, "cudaFreeAsync (memory nodes)");
  }
  // A cudaMalloc allocation may be freed this way too, as cudaFree frees it.
  if (pool_allocations_.count(address) == 0) return free_device_locked(address, "cudaFreeAsync");
  HIBER_RETURN_IF_ERROR(order_for_work_locked(stream));
  return free_to_pool_locked(address, stream, /*ordered=*/true);
}

Status Client::free_to_pool_locked(uint64_t address, StreamObj* stream, bool ordered) {
  auto owner = pool_allocations_.find(address);
  MemPoolObj* pool = owner->second;
  pool_allocations_.erase(owner);
  pool->used_bytes -= allocations_[address];
  allocations_.erase(address);
  auto segment = pool->segments.upper_bound(address);
  --segment;
  segment->second.free(address);
  if (ordered) {
    // The range may be reused once the work before this free on `stream` is done.
    const wire::StreamHandle here = stream_wire(stream);
    MemPoolObj::StreamFrees& frees = pool->frees[here];
    if (frees.event.is_zero()) {
      HIBER_ASSIGN_OR_RETURN(frees.event, create_wire_event_locked(/*disable_timing=*/true));
    }
    HIBER_RETURN_IF_ERROR(
        enqueue_locked(wire::calls::EventRecord{.stream = here, .event = frees.event}));
    ++frees.count;
    // The freeing stream itself is ordered after its own free.
    pool->waited[{here, here}] = frees.count;
  }
  if (pool->reserved_bytes > pool->release_threshold) pools_over_threshold_ = true;
  if (pool->destroyed && pool->used_bytes == 0) {
    bool empty = true;
    for (const auto& [start, space] : pool->segments) empty &= space.empty();
    if (empty) {
      HIBER_RETURN_IF_ERROR(trim_pool_locked(pool, 0));
      pools_.erase(pool);
    }
  }
  return Status();
}

Status Client::trim_pool_locked(MemPoolObj* pool, uint64_t keep_bytes) {
  bool synchronized = false;
  for (auto it = pool->segments.begin();
       it != pool->segments.end() && pool->reserved_bytes > keep_bytes;) {
    if (!it->second.empty()) {
      ++it;
      continue;
    }
    // Work on any stream may still use memory freed in stream order: the device first.
    if (!synchronized) {
      HIBER_RETURN_IF_ERROR(enqueue_locked(wire::calls::DeviceSynchronize{}));
      synchronized = true;
    }
    pool->reserved_bytes -= it->second.capacity();
    HIBER_RETURN_IF_ERROR(release_segment_locked(it->first));
    it = pool->segments.erase(it);
  }
  return Status();
}

bool Client::trim_pools_locked(bool all) {
  if (!all && !pools_over_threshold_) return false;
  pools_over_threshold_ = false;
  const uint64_t before = quota_used_;
  auto trim = [&](MemPoolObj* pool) {
    Status trimmed = trim_pool_locked(pool, all ? 0 : pool->release_threshold);
    (void)trimmed;  // a failure to send is the session's sticky error
  };
  if (default_pool_) trim(default_pool_.get());
  for (const auto& [key, pool] : pools_) trim(pool.get());
  return quota_used_ < before;
}

Status Client::trim_mem_pool(MemPoolObj* pool, uint64_t keep_bytes) {
  std::lock_guard lock(mu_);
  HIBER_RETURN_IF_ERROR(ensure_open_locked());
  return trim_pool_locked(pool, keep_bytes);
}

Status Client::reset_pools_locked() {
  // The caller freed every segment with the allocations (none is live any more).
  auto clear = [&](MemPoolObj* pool) {
    for (const auto& [stream, frees] : pool->frees) {
      (void)enqueue_locked(wire::calls::EventDestroy{.event = frees.event});
    }
    pool->segments.clear();
    pool->frees.clear();
    pool->waited.clear();
    pool->reserved_bytes = pool->used_bytes = 0;
  };
  if (default_pool_) clear(default_pool_.get());
  for (const auto& [key, pool] : pools_) clear(pool.get());
  std::erase_if(pools_, [](const auto& entry) { return entry.second->destroyed; });
  pool_allocations_.clear();
  return Status();
}

Status Client::mem_pool_attribute(MemPoolObj* pool, int attr, void* value, bool set) {
  std::lock_guard lock(mu_);
  if (value == nullptr) return error(ErrorCode::kInvalidValue, "memory pool attribute: null value");
  auto flag = [&](int& field) {
    if (set) {
      std::memcpy(&field, value, sizeof(int));
    } else {
      std::memcpy(value, &field, sizeof(int));
    }
    return Status();
  };
  auto read_only = [&](uint64_t field) -> Status {
    if (set)
      return error(ErrorCode::kInvalidValue, "memory pool attribute ", attr, " is read-only");
    std::memcpy(value, &field, sizeof(uint64_t));
    return Status();
  };
  // A high watermark reads, or is reset (to 0, which restarts it from the current value).
  auto high = [&](uint64_t& field, uint64_t current) -> Status {
    if (!set) return read_only(field);
    uint64_t v = 0;
    std::memcpy(&v, value, sizeof(v));
    if (v != 0) {
      return error(ErrorCode::kInvalidValue, "memory pool attribute ", attr,
                   " may only be reset, to 0");
    }
    field = current;
    return Status();
  };
  switch (attr) {
    case kReuseFollowEventDependencies: return flag(pool->reuse_follow_event_dependencies);
    case kReuseAllowOpportunistic: return flag(pool->reuse_allow_opportunistic);
    case kReuseAllowInternalDependencies: return flag(pool->reuse_allow_internal_dependencies);
    case kReleaseThreshold:
      if (!set) return read_only(pool->release_threshold);
      std::memcpy(&pool->release_threshold, value, sizeof(uint64_t));
      if (pool->reserved_bytes > pool->release_threshold) pools_over_threshold_ = true;
      return Status();
    case kReservedMemCurrent: return read_only(pool->reserved_bytes);
    case kReservedMemHigh: return high(pool->reserved_high, pool->reserved_bytes);
    case kUsedMemCurrent: return read_only(pool->used_bytes);
    case kUsedMemHigh: return high(pool->used_high, pool->used_bytes);
    default: return error(ErrorCode::kInvalidValue, "unknown memory pool attribute ", attr);
  }
}

}  // namespace hiber::shim
