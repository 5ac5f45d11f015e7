#include "server/device/device.h"

#include <glog/logging.h>

namespace hiber::device {

Result<std::vector<PhysicalMemory>> reserve_pool(Device& device, int gpu, uint64_t reserve_bytes,
                                                 uint64_t chunk_bytes) {
  const uint64_t granularity = device.allocation_granularity(gpu);
  if (chunk_bytes == 0 || granularity == 0 || chunk_bytes > UINT64_MAX - granularity)
    return error(ErrorCode::kInvalidValue, "reserve_pool: chunk size ", chunk_bytes,
                 " (granularity ", granularity, ")");
  const uint64_t chunk = (chunk_bytes + granularity - 1) / granularity * granularity;

  std::vector<PhysicalMemory> chunks;
  auto release_all = [&](const Status& cause) {
    for (const PhysicalMemory& m : chunks) {
      Status s = device.release_physical(m);
      LOG_IF(ERROR, !s.ok()) << "reserve_pool: releasing a chunk after an error: " << s;
    }
    return cause.with_context(str_cat("reserve_pool on GPU ", gpu, " after ", chunks.size(),
                                      " chunks of ", chunk, " bytes"));
  };
  // Free memory is asked again after each chunk: a real GPU may spend more than the chunk on it.
  while (true) {
    Result<MemoryInfo> info = device.memory_info(gpu);
    if (!info.ok()) return release_all(info.status());
    if (info->free_bytes < reserve_bytes || info->free_bytes - reserve_bytes < chunk) break;
    Result<PhysicalMemory> memory = device.create_physical(gpu, chunk);
    if (!memory.ok()) return release_all(memory.status());
    chunks.push_back(*memory);
  }
  return chunks;
}

}  // namespace hiber::device
