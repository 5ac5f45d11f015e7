// First-fit allocation of aligned ranges inside one fixed range, with coalescing frees.
//
// The shim places three kinds of things with it, all without a round trip to hiberd: device
// segments inside the granted virtual-address range, small device allocations inside a slab,
// and pinned host buffers inside the channel arena. Sizes are a few hundred to a few thousand
// live ranges, so an address-ordered map of free ranges is simple and fast enough.
//
// Thread safety: none; the owner locks.
#pragma once

#include <cstdint>
#include <map>
#include <optional>

namespace hiber::shim {

class RangeAllocator {
 public:
  RangeAllocator() = default;
  // Manages [base, base + bytes). `alignment` (a power of two) applies to every range's start
  // and size.
  RangeAllocator(uint64_t base, uint64_t bytes, uint64_t alignment);

  // The start of a free range of `bytes` (rounded up to the alignment), or nullopt if none is
  // large enough or bytes is 0.
  std::optional<uint64_t> allocate(uint64_t bytes);
  // Takes [start, start + bytes) (widened to whole aligned units) out of the free space for
  // good, as if allocated; parts already taken are skipped.
  void reserve(uint64_t start, uint64_t bytes);
  // Frees the range allocate() returned at `start`. Returns its size, or 0 if `start` is not
  // the start of a live range (nothing changes then).
  uint64_t free(uint64_t start);
  // The size of the live range starting at `start`, or 0.
  uint64_t size_of(uint64_t start) const;
  // The live range containing `address`, as {start, size}; nullopt if none.
  std::optional<std::pair<uint64_t, uint64_t>> find(uint64_t address) const;

  uint64_t base() const { return base_; }
  uint64_t capacity() const { return bytes_; }
  uint64_t allocated_bytes() const { return allocated_; }
  bool empty() const { return live_.empty(); }
  uint64_t round_up(uint64_t bytes) const { return (bytes + alignment_ - 1) & ~(alignment_ - 1); }

 private:
  uint64_t base_ = 0;
  uint64_t bytes_ = 0;
  uint64_t alignment_ = 1;
  uint64_t allocated_ = 0;
  std::map<uint64_t, uint64_t> free_;  // start -> size, disjoint and never adjacent
  std::map<uint64_t, uint64_t> live_;  // start -> size
};

}  // namespace hiber::shim
