#include "sim/device_malloc.h"

namespace hiber::sim {

Result<uint32_t> TimedChunkSource::create_chunk(uint64_t bytes) {
  Result<uint32_t> chunk = counting_.create_chunk(bytes);
  // A failed cudaMalloc costs its fixed part too.
  pending_ += cost_.malloc_fixed;
  if (!chunk.ok()) return chunk;
  pending_ += cost_.malloc_per_mib * static_cast<scheduler::Duration>(bytes / scheduler::kMiB);
  ++mallocs_;
  if (*chunk >= chunk_bytes_.size()) chunk_bytes_.resize(*chunk + 1, 0);
  chunk_bytes_[*chunk] = bytes;
  return chunk;
}

void TimedChunkSource::release_chunk(uint32_t chunk) noexcept {
  const uint64_t bytes = chunk < chunk_bytes_.size() ? chunk_bytes_[chunk] : 0;
  pending_ += cost_.free_fixed +
              cost_.free_per_mib * static_cast<scheduler::Duration>(bytes / scheduler::kMiB);
  ++frees_;
  counting_.release_chunk(chunk);
}

scheduler::Duration TimedChunkSource::take_cost() {
  const scheduler::Duration cost = pending_;
  pending_ = 0;
  return cost;
}

}  // namespace hiber::sim
