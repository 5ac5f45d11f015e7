// A set of the node's GPUs: what a lease names (server/lease.h). Every lease holds one GPU today;
// a function that spans GPUs will hold more, and nothing that passes a lease around changes.
#pragma once

#include <bit>
#include <cstdint>
#include <ostream>
#include <vector>

#include "common/ids.h"

namespace hiber {

class GpuSet {
 public:
  // A node has at most this many GPUs (scheduler::Topology refuses more).
  static constexpr int kMaxGpus = 64;

  constexpr GpuSet() = default;
  // REQUIRES: 0 <= gpu < kMaxGpus.
  static constexpr GpuSet of(GpuId gpu) {
    GpuSet set;
    set.insert(gpu);
    return set;
  }

  constexpr void insert(GpuId gpu) { bits_ |= bit(gpu); }
  constexpr void erase(GpuId gpu) { bits_ &= ~bit(gpu); }
  constexpr bool contains(GpuId gpu) const { return (bits_ & bit(gpu)) != 0; }
  constexpr bool empty() const { return bits_ == 0; }
  constexpr int size() const { return std::popcount(bits_); }
  // The lowest GPU of the set. REQUIRES: !empty().
  constexpr GpuId first() const { return GpuId{std::countr_zero(bits_)}; }
  // In increasing order.
  std::vector<GpuId> gpus() const {
    std::vector<GpuId> out;
    for (uint64_t rest = bits_; rest != 0; rest &= rest - 1) {
      out.push_back(GpuId{std::countr_zero(rest)});
    }
    return out;
  }

  friend constexpr bool operator==(GpuSet, GpuSet) = default;
  // "{0,3}".
  friend std::ostream& operator<<(std::ostream& out, GpuSet set) {
    out << '{';
    const char* separator = "";
    for (GpuId gpu : set.gpus()) {
      out << separator << gpu;
      separator = ",";
    }
    return out << '}';
  }

 private:
  static constexpr uint64_t bit(GpuId gpu) {
    return uint64_t{1} << static_cast<unsigned>(gpu.value());
  }

  uint64_t bits_ = 0;
};

}  // namespace hiber
