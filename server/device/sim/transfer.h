// Moving bytes for copies and memsets, as the stream workers execute them.
//
// Work goes in chunks. Each chunk re-checks, under the address space's shared lock, that its
// device ranges are still mapped and accessible, then touches the memory while holding that lock:
// a range unmapped after the operation was enqueued fails the operation (kIllegalAddress, the
// stream's error) and never faults, and map/unmap wait for one chunk at most, not for the whole
// operation. With throttling, the transfer joins the link model (link_model.h) and each chunk
// is moved once the model says it has crossed the links.
#pragma once

#include <cstdint>

#include "common/status.h"
#include "server/device/sim/address_space.h"
#include "server/device/sim/link_model.h"

namespace hiber::device::sim {

struct CopySpec {
  void* dst = nullptr;
  const void* src = nullptr;
  uint64_t bytes = 0;
  int dst_gpu = -1;  // >= 0: dst is device memory that must be accessible from this GPU
  int src_gpu = -1;  // likewise for src
  LinkModel::Path path;
};

struct FillSpec {
  DevicePtr dst = 0;
  int gpu = 0;  // must have access to dst
  uint32_t value = 0;
  int element_bytes = 1;  // 1, 2 or 4; dst is aligned to it
  uint64_t count = 0;
  LinkModel::Path path;
};

class Mover {
 public:
  // `links` null: no throttling.
  Mover(const AddressSpace& space, LinkModel* links) : space_(space), links_(links) {}

  Status copy(const CopySpec& spec) const;
  Status fill(const FillSpec& spec) const;

 private:
  // Calls touch(offset, bytes, direct) for consecutive chunks of [0, total), each under the checks
  // of ranges(offset, bytes) (direct: AddressSpace::access), paced by the link model along `path`.
  template <typename Ranges, typename Touch>
  Status chunked(uint64_t total, const LinkModel::Path& path, Ranges&& ranges, Touch&& touch) const;

  const AddressSpace& space_;
  LinkModel* links_;
};

}  // namespace hiber::device::sim
