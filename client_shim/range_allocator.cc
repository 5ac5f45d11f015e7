#include "client_shim/range_allocator.h"

#include <iterator>

namespace hiber::shim {

RangeAllocator::RangeAllocator(uint64_t base, uint64_t bytes, uint64_t alignment)
    : base_(base), bytes_(bytes), alignment_(alignment) {
  // Only whole aligned units are usable.
  const uint64_t start = (base + alignment - 1) & ~(alignment - 1);
  const uint64_t end = (base + bytes) & ~(alignment - 1);
  if (end > start) free_.emplace(start, end - start);
}

std::optional<uint64_t> RangeAllocator::allocate(uint64_t bytes) {
  if (bytes == 0) return std::nullopt;
  const uint64_t rounded = round_up(bytes);
  if (rounded < bytes) return std::nullopt;  // overflow
  for (auto it = free_.begin(); it != free_.end(); ++it) {
    if (it->second < rounded) continue;
    const uint64_t start = it->first;
    const uint64_t rest = it->second - rounded;
    free_.erase(it);
    if (rest != 0) free_.emplace(start + rounded, rest);
    live_.emplace(start, rounded);
    allocated_ += rounded;
    return start;
  }
  return std::nullopt;
}

void RangeAllocator::reserve(uint64_t start, uint64_t bytes) {
  if (bytes == 0) return;
  const uint64_t begin = start & ~(alignment_ - 1);
  const uint64_t end = round_up(start + bytes);
  auto it = free_.upper_bound(begin);
  if (it != free_.begin()) --it;
  while (it != free_.end() && it->first < end) {
    const uint64_t f_begin = it->first, f_end = it->first + it->second;
    if (f_end <= begin) {
      ++it;
      continue;
    }
    it = free_.erase(it);
    if (f_begin < begin) free_.emplace(f_begin, begin - f_begin);
    if (f_end > end) free_.emplace(end, f_end - end);
  }
}

uint64_t RangeAllocator::free(uint64_t start) {
  auto live = live_.find(start);
  if (live == live_.end()) return 0;
  uint64_t begin = start;
  uint64_t size = live->second;
  const uint64_t freed = size;
  live_.erase(live);
  allocated_ -= freed;
  auto next = free_.lower_bound(begin);
  if (next != free_.end() && next->first == begin + size) {
    size += next->second;
    next = free_.erase(next);
  }
  if (next != free_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == begin) {
      begin = prev->first;
      size += prev->second;
      free_.erase(prev);
    }
  }
  free_.emplace(begin, size);
  return freed;
}

uint64_t RangeAllocator::size_of(uint64_t start) const {
  auto it = live_.find(start);
  return it == live_.end() ? 0 : it->second;
}

std::optional<std::pair<uint64_t, uint64_t>> RangeAllocator::find(uint64_t address) const {
  auto it = live_.upper_bound(address);
  if (it == live_.begin()) return std::nullopt;
  --it;
  if (address - it->first >= it->second) return std::nullopt;
  return *it;
}

}  // namespace hiber::shim
