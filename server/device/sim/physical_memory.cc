#include "server/device/sim/physical_memory.h"

#include <fcntl.h>
#include <glog/logging.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace hiber::device::sim {

Result<std::unique_ptr<GpuMemory>> GpuMemory::create(int gpu, uint64_t bytes,
                                                     uint64_t granularity) {
  const uint64_t usable = bytes / granularity * granularity;
  if (usable == 0)
    return error(ErrorCode::kInvalidValue, "simulated GPU ", gpu, ": ", bytes,
                 " bytes of memory is less than one allocation granule (", granularity, ")");
  std::string name = str_cat("hiber-sim-gpu", gpu);
  UniqueFd fd(::memfd_create(name.c_str(), MFD_CLOEXEC));
  if (!fd) return os_error("memfd_create");
  if (::ftruncate(fd.get(), static_cast<off_t>(usable)) != 0)
    return error(ErrorCode::kOperatingSystem, "ftruncate of GPU ", gpu, " memory to ", usable,
                 " bytes: ", std::strerror(errno));
  void* view =
      ::mmap(nullptr, usable, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_NORESERVE, fd.get(), 0);
  if (view == MAP_FAILED)
    return error(ErrorCode::kOperatingSystem, "mapping GPU ", gpu, " memory (", usable,
                 " bytes): ", std::strerror(errno));
  return std::unique_ptr<GpuMemory>(
      new GpuMemory(gpu, std::move(fd), usable, static_cast<std::byte*>(view)));
}

GpuMemory::GpuMemory(int gpu, UniqueFd fd, uint64_t total_bytes, std::byte* view)
    : gpu_(gpu),
      fd_(std::move(fd)),
      total_bytes_(total_bytes),
      view_(view),
      free_bytes_(total_bytes) {
  free_ranges_.emplace(0, total_bytes);
}

GpuMemory::~GpuMemory() { ::munmap(view_, total_bytes_); }

uint64_t GpuMemory::free_bytes() const {
  MutexLock lock(mu_);
  return free_bytes_;
}

Result<uint64_t> GpuMemory::allocate(uint64_t bytes) {
  MutexLock lock(mu_);
  for (auto it = free_ranges_.begin(); it != free_ranges_.end(); ++it) {
    if (it->second < bytes) continue;
    const uint64_t offset = it->first;
    const uint64_t left = it->second - bytes;
    free_ranges_.erase(it);
    if (left > 0) free_ranges_.emplace(offset + bytes, left);
    free_bytes_ -= bytes;
    return offset;
  }
  return error(ErrorCode::kOutOfMemory, "simulated GPU ", gpu_, " has no free range of ", bytes,
               " bytes (", free_bytes_, " of ", total_bytes_, " bytes free)");
}

void GpuMemory::free(uint64_t offset, uint64_t bytes) {
  // Outside the lock: the range is still ours, and punching holes can take a while.
  if (::fallocate(fd_.get(), FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, static_cast<off_t>(offset),
                  static_cast<off_t>(bytes)) != 0)
    LOG(WARNING) << "simulated GPU " << gpu_ << ": punching out " << bytes << " bytes at " << offset
                 << " failed (" << std::strerror(errno)
                 << "); the host keeps that memory until the device is destroyed";
  MutexLock lock(mu_);
  auto next = free_ranges_.lower_bound(offset);
  uint64_t start = offset;
  uint64_t end = offset + bytes;
  if (next != free_ranges_.begin()) {
    auto prev = std::prev(next);
    CHECK_LE(prev->first + prev->second, offset) << "double free in simulated GPU memory";
    if (prev->first + prev->second == offset) {
      start = prev->first;
      free_ranges_.erase(prev);
    }
  }
  if (next != free_ranges_.end()) {
    CHECK_LE(end, next->first) << "double free in simulated GPU memory";
    if (next->first == end) {
      end += next->second;
      free_ranges_.erase(next);
    }
  }
  free_ranges_.emplace(start, end - start);
  free_bytes_ += bytes;
}

}  // namespace hiber::device::sim
