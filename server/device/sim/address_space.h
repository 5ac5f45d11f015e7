// The simulated GPUs' virtual address space: reserved ranges, mappings of physical memory into
// them, and which GPUs may access each mapping.
//
// Device addresses are host addresses. A reserved range is a PROT_NONE mapping of the process;
// map() replaces part of it with the GPU memfd's pages (MAP_SHARED | MAP_FIXED), so one physical
// allocation mapped at two addresses shows the same bytes at both. unmap() puts PROT_NONE
// anonymous memory back.
//
// Copies and memsets run their device-side memory accesses through access(), which holds a
// shared lock while it checks and runs them: a mapping cannot go away under a copy, and a copy
// that finds its memory gone fails instead of faulting. Kernels touch memory without the lock
// (a fault there is caught by fault_guard.h); what is checked against set_access for them is
// their pointer arguments (check_argument) and the ranges they ask about (check), as
// sim_kernel_plugin.h describes.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <span>

#include "common/mutex.h"
#include "common/status.h"
#include "server/device/device.h"
#include "server/device/sim/physical_memory.h"

namespace hiber::device::sim {

// A device range that an operation touches, and the GPU that must be allowed to access it.
struct DeviceRange {
  DevicePtr va = 0;
  uint64_t bytes = 0;
  int gpu = 0;
};

// Thread-safe.
class AddressSpace {
 public:
  explicit AddressSpace(uint64_t granularity) : granularity_(granularity) {}
  ~AddressSpace();  // releases every range still reserved (and so every mapping)
  AddressSpace(const AddressSpace&) = delete;
  AddressSpace& operator=(const AddressSpace&) = delete;

  Result<DevicePtr> reserve(uint64_t bytes, uint64_t alignment);
  // Exactly [va, va + bytes); kAlreadyMapped if any of it is taken.
  Result<DevicePtr> reserve_at(DevicePtr va, uint64_t bytes);
  // [va, va + bytes) must be exactly a reserved range with nothing mapped in it.
  Status free(DevicePtr va, uint64_t bytes);
  // Maps [offset, offset + bytes) of `block` at va; accessible from no GPU until set_access.
  Status map(DevicePtr va, uint64_t bytes, std::shared_ptr<PhysicalBlock> block, uint64_t offset);
  // [va, va + bytes) must be exactly one or more whole, adjacent mappings; the same rule holds
  // for set_access (as CUDA requires for cuMemUnmap).
  Status unmap(DevicePtr va, uint64_t bytes);
  // gpu_mask has bit g set for each GPU g that may access the range. reachers[o] has bit g set
  // for each GPU g that can reach GPU o's memory at all (o itself and its peers): granting any
  // other GPU access to memory of o is kPeerAccessUnsupported, as with CUDA, and changes nothing.
  Status set_access(DevicePtr va, uint64_t bytes, uint64_t gpu_mask,
                    std::span<const uint64_t> reachers);

  // If every byte of `range` is mapped and accessible from range.gpu, the GPU whose memory is
  // mapped at range.va (where a copy's data physically starts); otherwise kInvalidValue naming
  // the first address that is not. REQUIRES: range.bytes > 0.
  Result<int> check(const DeviceRange& range) const;
  // A kernel argument word, before the kernel runs: OK unless `word` lies in a reserved range
  // and neither it nor the byte before it in the same range (a pointer one past the end of a
  // block) is mapped and accessible from `gpu`; then kIllegalAddress naming the address. Words
  // outside every reserved range are not device addresses (integers, say) and pass.
  Status check_argument(uint64_t word, int gpu) const;
  static constexpr size_t kMaxAccessRanges = 2;
  // Checks each range (at most kMaxAccessRanges) as check() does, then runs
  // fn(std::span<std::byte* const> direct) while no mapping can change. direct[i] is where
  // ranges[i]'s bytes are: in the GPU memory's view (physical_memory.h) when the range lies in
  // one mapping, else its device address; null for an empty range. `code` is the error code for
  // a range that fails the check.
  template <typename F>
  Status access(std::span<const DeviceRange> ranges, ErrorCode code, F&& fn) const {
    std::array<std::byte*, kMaxAccessRanges> direct{};
    if (ranges.size() > direct.size())
      return error(ErrorCode::kInvalidValue, "access: ", ranges.size(), " ranges");
    ReaderLock lock(mu_);
    for (size_t i = 0; i < ranges.size(); ++i) {
      Status s = check_locked(ranges[i], code);
      if (!s.ok()) return s;
      direct[i] = direct_locked(ranges[i]);
    }
    fn(std::span<std::byte* const>(direct.data(), ranges.size()));
    return Status();
  }

 private:
  struct Mapping {
    uint64_t bytes = 0;
    std::shared_ptr<PhysicalBlock> block;
    uint64_t block_offset = 0;
    uint64_t access_mask = 0;
  };
  using MappingMap = std::map<DevicePtr, Mapping>;

  Status check_locked(const DeviceRange& range, ErrorCode code) const REQUIRES_SHARED(mu_);
  // direct[i] of access(). REQUIRES: check_locked(range) passed.
  std::byte* direct_locked(const DeviceRange& range) const REQUIRES_SHARED(mu_);
  // The mappings that exactly tile [va, va + bytes), or an error naming what does not.
  Result<std::pair<MappingMap::iterator, MappingMap::iterator>> whole_mappings(
      DevicePtr va, uint64_t bytes, const char* operation) REQUIRES(mu_);
  // The reserved range containing [va, va + bytes), or end().
  std::map<DevicePtr, uint64_t>::const_iterator reservation_of(DevicePtr va, uint64_t bytes) const
      REQUIRES_SHARED(mu_);

  const uint64_t granularity_;
  mutable SharedMutex mu_;
  std::map<DevicePtr, uint64_t> reservations_ GUARDED_BY(mu_);  // start -> bytes
  // Where the next reservation is tried in the preferred region (address_space.cc); freed
  // ranges there are not reused.
  uint64_t next_preferred_ GUARDED_BY(mu_) = 0x7e8000000000;
  MappingMap mappings_ GUARDED_BY(mu_);  // start -> mapping, never overlapping
};

}  // namespace hiber::device::sim
