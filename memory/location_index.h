// Pool location key -> (owner, bytes) of a live allocation, as an open-addressing hash table
// with linear probing: GpuPools' record of who holds what, looked up on every allocation and
// deallocation.
//
// std::unordered_map chases a node pointer from its bucket array, two or three cache misses per
// lookup once a GPU holds thousands of blocks; here a lookup reads one or two adjacent slots.
// Deletion shifts the following entries back (no tombstones), so lookups stay short however
// many blocks come and go. The same scheme as scheduler/id_index.h.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "common/ids.h"

namespace hiber::memory {

struct Owned {
  FunctionId function{0};
  uint64_t bytes = 0;  // > 0: a slot with 0 bytes is empty
};

class LocationIndex {
 public:
  LocationIndex();

  // nullptr when absent. The pointer lives until the next insert or erase.
  const Owned* find(uint64_t key) const;
  // REQUIRES: key is absent and owned.bytes > 0.
  void insert(uint64_t key, Owned owned);
  // Removes key; false if it was absent.
  bool erase(uint64_t key);
  size_t size() const { return size_; }

  // visit(key, owned) for every entry, in no particular order.
  template <typename Visit>
  void for_each(Visit&& visit) const {
    for (const Slot& s : slots_) {
      if (s.owned.bytes != 0) visit(s.key, s.owned);
    }
  }

 private:
  struct Slot {
    uint64_t key = 0;
    Owned owned;
  };
  size_t home(uint64_t key) const;
  size_t next(size_t i) const { return (i + 1) & (slots_.size() - 1); }
  void grow();

  std::vector<Slot> slots_;  // a power of two, at most half full
  int shift_ = 0;            // 64 - log2(slots_.size())
  size_t size_ = 0;
};

}  // namespace hiber::memory
