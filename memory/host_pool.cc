#include "memory/host_pool.h"

#include <algorithm>

namespace hiber::memory {
namespace {

// Staging buffers are owned, for consolidation, by pseudo-functions at the top of the id
// space, one per GPU, so they cluster apart from model copies.
constexpr uint32_t kStagingOwnerBase = 0xFFFF0000u;

}  // namespace

Result<std::unique_ptr<HostPool>> HostPool::create(const std::vector<uint64_t>& chunk_bytes,
                                                   int gpu_count) {
  if (gpu_count < 0) return error(ErrorCode::kInvalidValue, "host pool: ", gpu_count, " GPUs");
  BuddyOptions options;
  options.min_block_bytes = kMinBlockBytes;
  options.shared_sizes = {};  // host copies stay with their function; nothing to share
  auto buddy = BuddyAllocator::create(chunk_bytes, options);
  if (!buddy.ok()) return buddy.status().with_context("host pool");
  return std::unique_ptr<HostPool>(new HostPool(std::move(*buddy), gpu_count));
}

HostPool::HostPool(std::unique_ptr<BuddyAllocator> buddy, int gpu_count)
    : buddy_(std::move(buddy)), staging_bytes_(gpu_count, 0) {}

Result<uint32_t> HostPool::add_chunk(uint64_t bytes) { return buddy_->add_chunk(bytes); }

AllocationResult HostPool::place(uint64_t bytes, FunctionId owner, Use use) {
  AllocationResult result = buddy_->allocate(bytes, owner);
  if (!result.ok()) return result;
  use.bytes = result->bytes;
  live_.emplace(key(result->where), use);
  const PoolStats now = buddy_->stats();
  peak_used_ = std::max(peak_used_, now.allocated_bytes);
  return result;
}

AllocationResult HostPool::allocate_model_copy(FunctionId function, uint64_t bytes) {
  AllocationResult result = place(bytes, function, Use{function, -1, 0});
  if (result.ok()) model_bytes_[function] += result->bytes;
  return result;
}

AllocationResult HostPool::allocate_staging(int gpu, uint64_t bytes) {
  if (gpu < 0 || gpu >= static_cast<int>(staging_bytes_.size())) {
    Shortfall shortfall;
    shortfall.gpu = gpu;
    shortfall.requested_bytes = shortfall.needed_bytes = bytes;
    shortfall.never_fits = true;
    return shortfall;
  }
  AllocationResult result = place(bytes, FunctionId{kStagingOwnerBase + static_cast<uint32_t>(gpu)},
                                  Use{std::nullopt, gpu, 0});
  if (result.ok()) {
    staging_bytes_[gpu] += result->bytes;
  } else {
    result.shortfall().gpu = gpu;
  }
  return result;
}

Status HostPool::release(const Allocation& allocation) {
  auto it = live_.find(key(allocation.where));
  if (it == live_.end() || it->second.bytes != allocation.bytes) {
    return error(ErrorCode::kInvalidValue, "host pool: no live allocation of ", allocation.bytes,
                 " bytes at chunk ", allocation.where.chunk, " offset ", allocation.where.offset);
  }
  HIBER_RETURN_IF_ERROR(buddy_->deallocate(allocation));
  const Use use = it->second;
  if (use.gpu >= 0) {
    staging_bytes_[use.gpu] -= use.bytes;
  } else if (auto held = model_bytes_.find(*use.function); held != model_bytes_.end()) {
    held->second -= use.bytes;
    if (held->second == 0) model_bytes_.erase(held);
  }
  live_.erase(it);
  ++releases_;
  return Status();
}

uint64_t HostPool::release_function(FunctionId function) {
  std::vector<Allocation> owned;
  for (const auto& [where, use] : live_) {
    if (use.gpu < 0 && use.function == function) {
      owned.push_back(Allocation{
          {static_cast<uint32_t>(where >> 40), where & ((uint64_t{1} << 40) - 1)}, use.bytes});
    }
  }
  uint64_t released = 0;
  for (const Allocation& allocation : owned) {
    if (release(allocation).ok()) released += allocation.bytes;
  }
  return released;
}

uint64_t HostPool::model_bytes(FunctionId function) const {
  auto it = model_bytes_.find(function);
  return it == model_bytes_.end() ? 0 : it->second;
}

uint64_t HostPool::staging_bytes(int gpu) const {
  return gpu >= 0 && gpu < static_cast<int>(staging_bytes_.size()) ? staging_bytes_[gpu] : 0;
}

HostPoolStats HostPool::stats() const {
  const PoolStats pool = buddy_->stats();
  HostPoolStats stats;
  stats.capacity_bytes = pool.capacity_bytes;
  for (uint64_t bytes : staging_bytes_) stats.staging_bytes += bytes;
  stats.model_bytes = pool.allocated_bytes - stats.staging_bytes;
  stats.free_bytes = pool.free_bytes;
  stats.largest_free_bytes = pool.largest_free_bytes;
  stats.peak_used_bytes = peak_used_;
  stats.allocations = pool.allocations;
  stats.releases = releases_;
  stats.failures = pool.failures;
  stats.chunks = buddy_->chunk_count();
  return stats;
}

Status HostPool::check_invariants() const {
  HIBER_RETURN_IF_ERROR(buddy_->check_invariants().with_context("host pool"));
  uint64_t models = 0, staging = 0;
  for (const auto& [where, use] : live_) (use.gpu >= 0 ? staging : models) += use.bytes;
  uint64_t by_function = 0, by_gpu = 0;
  for (const auto& [function, bytes] : model_bytes_) by_function += bytes;
  for (uint64_t bytes : staging_bytes_) by_gpu += bytes;
  if (models != by_function || staging != by_gpu ||
      models + staging != buddy_->stats().allocated_bytes) {
    return error(ErrorCode::kIllegalState, "host pool: models ", models, " (by function ",
                 by_function, "), staging ", staging, " (by GPU ", by_gpu, ")");
  }
  return Status();
}

}  // namespace hiber::memory
