// FunctionId -> FunctionIndex, as an open-addressing hash table with linear probing.
//
// Every arrival looks its function up by id. std::unordered_map chases a node pointer from its
// bucket array, a second cache miss per lookup once thousands of functions are registered;
// here a lookup reads one or two adjacent slots. Deletion shifts the following entries back
// (no tombstones), so lookups stay short however many functions come and go.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

#include "scheduler/types.h"

namespace hiber::scheduler {

class IdIndex {
 public:
  IdIndex();

  // nullopt when absent.
  std::optional<FunctionIndex> find(FunctionId id) const;
  // REQUIRES: id is absent and index != kEmpty.
  void insert(FunctionId id, FunctionIndex index);
  // Removes id; false if it was absent.
  bool erase(FunctionId id);
  size_t size() const { return size_; }

 private:
  static constexpr FunctionIndex kEmpty{UINT32_MAX};  // Slot::index of an empty slot
  struct Slot {
    FunctionId id{0};  // meaningful while not empty
    FunctionIndex index = kEmpty;
  };
  size_t home(FunctionId id) const;
  size_t next(size_t i) const { return (i + 1) & (slots_.size() - 1); }
  void grow();

  std::vector<Slot> slots_;  // a power of two, at most half full
  int shift_ = 0;            // 64 - log2(slots_.size())
  size_t size_ = 0;
};

}  // namespace hiber::scheduler
