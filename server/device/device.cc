#include "server/device/device.h"

#include <glog/logging.h>

namespace hiber::device {

bool is_context_fault(ErrorCode code) {
  switch (static_cast<uint32_t>(code)) {
    case 700:  // CUDA_ERROR_ILLEGAL_ADDRESS
    case 702:  // CUDA_ERROR_LAUNCH_TIMEOUT
    case 710:  // CUDA_ERROR_ASSERT
    case 714:  // CUDA_ERROR_HARDWARE_STACK_ERROR
    case 715:  // CUDA_ERROR_ILLEGAL_INSTRUCTION
    case 716:  // CUDA_ERROR_MISALIGNED_ADDRESS
    case 717:  // CUDA_ERROR_INVALID_ADDRESS_SPACE
    case 718:  // CUDA_ERROR_INVALID_PC
    case 719:  // CUDA_ERROR_LAUNCH_FAILED
      return true;
    default: return false;
  }
}

namespace {
Status no_such_gpu(const Device& device, int gpu) {
  return error(ErrorCode::kInvalidDevice, "GPU ", gpu, " does not exist (this node has ",
               device.gpu_count(), " GPUs)");
}
}  // namespace

Result<Stream> Device::create_stream(int gpu, int priority) {
  if (gpu < 0 || gpu >= gpu_count()) return no_such_gpu(*this, gpu);
  return create_stream(shared_context(gpu), priority);
}

Result<Event> Device::create_event(int gpu, bool disable_timing) {
  if (gpu < 0 || gpu >= gpu_count()) return no_such_gpu(*this, gpu);
  return create_event(shared_context(gpu), disable_timing);
}

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
