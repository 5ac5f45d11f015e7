// Physical memory of the simulated GPUs.
//
// Each GPU's memory is one memfd the size of the GPU. It is sparse: only pages that were written
// take host memory, and pages of freed ranges are punched out so the host gets them back.
// Allocations are granularity-aligned ranges of it, placed first fit in a coalescing free list.
//
// The whole memfd is also mapped once into hiberd (view()). Copies and fills reach device memory
// through that view, as a copy engine writes physical memory, rather than through the mapping at
// the device address: a mapping made for one lease is new to the host's page tables, and under
// a hypervisor the first touch of each of its pages costs about 15 us (0.3 GB/s), which would
// swamp the link model. Kernels still run through device addresses.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>

#include "common/mutex.h"
#include "common/status.h"
#include "common/unique_fd.h"

namespace hiber::device::sim {

// Thread-safe.
class GpuMemory {
 public:
  // Creates the memfd; `bytes` is rounded down to the granularity.
  static Result<std::unique_ptr<GpuMemory>> create(int gpu, uint64_t bytes, uint64_t granularity);
  ~GpuMemory();
  GpuMemory(const GpuMemory&) = delete;
  GpuMemory& operator=(const GpuMemory&) = delete;

  int gpu() const { return gpu_; }
  int fd() const { return fd_.get(); }
  uint64_t total_bytes() const { return total_bytes_; }
  uint64_t free_bytes() const;
  // The memfd mapped whole (MAP_SHARED, not populated): byte o of GPU memory is view()[o].
  std::byte* view() const { return view_; }

  // The offset of a free range of `bytes` (a multiple of the granularity); kOutOfMemory if no
  // free range is that large.
  Result<uint64_t> allocate(uint64_t bytes);
  // Returns a range from allocate() and gives its pages back to the host.
  void free(uint64_t offset, uint64_t bytes);

 private:
  GpuMemory(int gpu, UniqueFd fd, uint64_t total_bytes, std::byte* view);

  const int gpu_;
  const UniqueFd fd_;
  const uint64_t total_bytes_;
  std::byte* const view_;
  mutable Mutex mu_;
  // offset -> bytes; never adjacent (coalesced)
  std::map<uint64_t, uint64_t> free_ranges_ GUARDED_BY(mu_);
  uint64_t free_bytes_ GUARDED_BY(mu_);
};

// One physical allocation. Its range goes back to the GPU when the last reference is dropped:
// the handle table holds one until release_physical, and every mapping of it holds one until it
// is unmapped (CUDA frees released memory once it is unmapped everywhere, too).
class PhysicalBlock {
 public:
  PhysicalBlock(GpuMemory& memory, uint64_t offset, uint64_t bytes)
      : memory_(memory), offset_(offset), bytes_(bytes) {}
  ~PhysicalBlock() { memory_.free(offset_, bytes_); }
  PhysicalBlock(const PhysicalBlock&) = delete;
  PhysicalBlock& operator=(const PhysicalBlock&) = delete;

  int gpu() const { return memory_.gpu(); }
  int fd() const { return memory_.fd(); }
  uint64_t offset() const { return offset_; }  // in the GPU's memfd
  // This allocation's bytes through GpuMemory::view().
  std::byte* view() const { return memory_.view() + offset_; }
  uint64_t bytes() const { return bytes_; }

 private:
  GpuMemory& memory_;
  const uint64_t offset_;
  const uint64_t bytes_;
};

}  // namespace hiber::device::sim
