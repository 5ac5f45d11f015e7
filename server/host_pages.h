// The whole host pages of a byte range: what can be given back to the kernel (madvise, a hole
// punched in a file) of a range whose first and last pages may hold a neighbour's bytes.
#pragma once

#include <unistd.h>

#include <cstdint>

namespace hiber::server {

struct PageSpan {
  uint64_t begin = 0;  // page-aligned
  uint64_t end = 0;    // page-aligned; <= begin: no whole page
  bool empty() const { return end <= begin; }
  uint64_t bytes() const { return empty() ? 0 : end - begin; }
};

// The pages wholly inside [offset, offset + bytes).
inline PageSpan whole_pages(uint64_t offset, uint64_t bytes) {
  static const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  return PageSpan{(offset + page - 1) / page * page, (offset + bytes) / page * page};
}

}  // namespace hiber::server
