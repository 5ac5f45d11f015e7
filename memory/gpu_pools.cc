#include "memory/gpu_pools.h"

#include <optional>

#include "memory/block_allocator.h"
#include "memory/naive_allocator.h"

namespace hiber::memory {

Result<PoolKind> parse_pool_kind(std::string_view name) {
  if (name == "buddy") return PoolKind::kBuddy;
  if (name == "block") return PoolKind::kBlock;
  if (name == "naive") return PoolKind::kNaive;
  return error(ErrorCode::kInvalidValue, "unknown memory pool '", name,
               "' (choose buddy, block or naive)");
}

std::string_view pool_kind_name(PoolKind kind) {
  switch (kind) {
    case PoolKind::kBuddy: return "buddy";
    case PoolKind::kBlock: return "block";
    case PoolKind::kNaive: return "naive";
  }
  return "?";
}

Result<std::unique_ptr<GpuPools>> GpuPools::create_buddy(
    const std::vector<std::vector<uint64_t>>& chunks_per_gpu, BuddyOptions options) {
  std::unique_ptr<GpuPools> pools(new GpuPools());
  for (size_t gpu = 0; gpu < chunks_per_gpu.size(); ++gpu) {
    auto buddy = BuddyAllocator::create(chunks_per_gpu[gpu], options);
    if (!buddy.ok()) return buddy.status().with_context(str_cat("GPU ", gpu));
    pools->pools_.push_back(std::move(*buddy));
  }
  return pools;
}

Result<std::unique_ptr<GpuPools>> GpuPools::create_upstream(
    PoolKind kind, const std::vector<ChunkSource*>& upstreams, const std::vector<uint64_t>& budgets,
    uint64_t granularity_bytes) {
  if (kind == PoolKind::kBuddy || upstreams.size() != budgets.size() || granularity_bytes == 0) {
    return error(ErrorCode::kInvalidValue, "GpuPools: ", pool_kind_name(kind), " with ",
                 upstreams.size(), " upstreams and ", budgets.size(), " budgets");
  }
  std::unique_ptr<GpuPools> pools(new GpuPools());
  for (size_t gpu = 0; gpu < upstreams.size(); ++gpu) {
    if (kind == PoolKind::kBlock) {
      pools->pools_.push_back(
          std::make_unique<BlockAllocator>(*upstreams[gpu], budgets[gpu], granularity_bytes));
    } else {
      pools->pools_.push_back(
          std::make_unique<NaiveAllocator>(*upstreams[gpu], budgets[gpu], granularity_bytes));
    }
  }
  return pools;
}

void GpuPools::set_quota(FunctionId function, uint64_t bytes) {
  std::lock_guard lock(mutex_);
  if (bytes == 0) {
    quotas_.erase(function);
  } else {
    quotas_[function] = bytes;
  }
}

AllocationResult GpuPools::allocate(int gpu, uint64_t bytes, FunctionId function,
                                    const EvictablePredicate& evictable, EvictionAdvice advice) {
  std::lock_guard lock(mutex_);
  if (gpu < 0 || gpu >= gpu_count()) {
    Shortfall shortfall;
    shortfall.gpu = gpu;
    shortfall.requested_bytes = shortfall.needed_bytes = bytes;
    shortfall.never_fits = true;
    return shortfall;
  }
  auto held = function_bytes_.find(function);
  const uint64_t held_here = held == function_bytes_.end() ? 0 : held->second[gpu];
  const auto quota = quotas_.find(function);
  // Over the quota: what the function would hold after the allocation took `taken` bytes.
  const auto over_quota = [&](uint64_t taken) -> std::optional<Shortfall> {
    if (quota == quotas_.end() || (taken <= quota->second && held_here <= quota->second - taken)) {
      return std::nullopt;
    }
    Shortfall shortfall;
    shortfall.gpu = gpu;
    shortfall.requested_bytes = bytes;
    shortfall.needed_bytes = taken;
    shortfall.over_quota = true;
    shortfall.never_fits = taken > quota->second;
    shortfall.evict_bytes = shortfall.never_fits ? 0 : held_here + taken - quota->second;
    const PoolStats now = pools_[gpu]->stats();
    shortfall.free_bytes = now.free_bytes + now.cached_bytes;
    shortfall.largest_free_bytes = now.largest_free_bytes;
    return shortfall;
  };
  // The request as asked first; then what the pool took, which rounding may have made larger.
  if (std::optional<Shortfall> refused = over_quota(bytes)) return std::move(*refused);
  AllocationResult result = pools_[gpu]->allocate(bytes, function, evictable, advice);
  if (!result.ok()) {
    result.shortfall().gpu = gpu;
    return result;
  }
  if (std::optional<Shortfall> refused = over_quota(result->bytes)) {
    (void)pools_[gpu]->deallocate(*result);  // just allocated: cannot fail
    return std::move(*refused);
  }
  if (held == function_bytes_.end()) {
    held = function_bytes_.emplace(function, std::vector<uint64_t>(pools_.size(), 0)).first;
  }
  held->second[gpu] += result->bytes;
  return result;
}

Status GpuPools::deallocate(int gpu, const Allocation& allocation) {
  std::lock_guard lock(mutex_);
  if (gpu < 0 || gpu >= gpu_count()) {
    return error(ErrorCode::kInvalidDevice, "deallocate on GPU ", gpu, " of ", gpu_count());
  }
  // The pool knows each live allocation's owner (the buddy allocator in its page arrays, which
  // the deallocation reads next): no table of its own to miss in.
  const std::optional<FunctionId> owner = pools_[gpu]->owner(allocation);
  if (!owner) {
    return error(ErrorCode::kInvalidValue, "GPU ", gpu, ": no live allocation of ",
                 allocation.bytes, " bytes at chunk ", allocation.where.chunk, " offset ",
                 allocation.where.offset);
  }
  // The context is built only on error: this is the hot path of every eviction.
  if (Status freed = pools_[gpu]->deallocate(allocation); !freed.ok()) {
    return freed.with_context(str_cat("GPU ", gpu));
  }
  auto held = function_bytes_.find(*owner);
  held->second[gpu] -= allocation.bytes;
  bool none = true;
  for (uint64_t bytes : held->second) none &= bytes == 0;
  if (none) function_bytes_.erase(held);
  return Status();
}

uint64_t GpuPools::function_bytes(FunctionId function, int gpu) const {
  std::lock_guard lock(mutex_);
  auto it = function_bytes_.find(function);
  if (it == function_bytes_.end() || gpu < 0 || gpu >= gpu_count()) return 0;
  return it->second[gpu];
}

uint64_t GpuPools::function_bytes(FunctionId function) const {
  std::lock_guard lock(mutex_);
  auto it = function_bytes_.find(function);
  if (it == function_bytes_.end()) return 0;
  uint64_t total = 0;
  for (uint64_t bytes : it->second) total += bytes;
  return total;
}

PoolStats GpuPools::stats(int gpu) const {
  std::lock_guard lock(mutex_);
  return gpu >= 0 && gpu < gpu_count() ? pools_[gpu]->stats() : PoolStats{};
}

void GpuPools::release_cached() {
  std::lock_guard lock(mutex_);
  for (auto& pool : pools_) pool->release_cached();
}

Status GpuPools::check_invariants() const {
  std::lock_guard lock(mutex_);
  for (int gpu = 0; gpu < gpu_count(); ++gpu) {
    HIBER_RETURN_IF_ERROR(pools_[gpu]->check_invariants().with_context(str_cat("GPU ", gpu)));
    uint64_t by_function = 0;
    for (const auto& [function, held] : function_bytes_) by_function += held[gpu];
    const PoolStats stats = pools_[gpu]->stats();
    if (by_function != stats.allocated_bytes) {
      return error(ErrorCode::kIllegalState, "GPU ", gpu, ": pool holds ", stats.allocated_bytes,
                   " bytes, functions ", by_function);
    }
  }
  return Status();
}

}  // namespace hiber::memory
