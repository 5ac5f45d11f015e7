#include "memory/location_index.h"

#include <bit>

namespace hiber::memory {

LocationIndex::LocationIndex() : slots_(16), shift_(64 - 4) {}

size_t LocationIndex::home(uint64_t key) const {
  // Fibonacci hashing: keys are chunk << 40 | offset, offsets multiples of 2 MiB; multiplying
  // by 2^64 / phi and keeping the top bits spreads them over the whole table.
  return static_cast<size_t>((key * 0x9e3779b97f4a7c15ULL) >> shift_);
}

const Owned* LocationIndex::find(uint64_t key) const {
  for (size_t i = home(key); slots_[i].owned.bytes != 0; i = next(i)) {
    if (slots_[i].key == key) return &slots_[i].owned;
  }
  return nullptr;
}

void LocationIndex::insert(uint64_t key, Owned owned) {
  if (2 * (size_ + 1) > slots_.size()) grow();
  size_t i = home(key);
  while (slots_[i].owned.bytes != 0) i = next(i);
  slots_[i] = Slot{key, owned};
  ++size_;
}

bool LocationIndex::erase(uint64_t key) {
  size_t i = home(key);
  while (slots_[i].key != key || slots_[i].owned.bytes == 0) {
    if (slots_[i].owned.bytes == 0) return false;
    i = next(i);
  }
  // Backward shift: move each later entry of the run into the hole unless its home lies
  // cyclically in (hole, entry], where it would become unreachable.
  for (size_t j = next(i); slots_[j].owned.bytes != 0; j = next(j)) {
    const size_t h = home(slots_[j].key);
    const bool stays = i <= j ? (i < h && h <= j) : (i < h || h <= j);
    if (stays) continue;
    slots_[i] = slots_[j];
    i = j;
  }
  slots_[i] = Slot{};
  --size_;
  return true;
}

void LocationIndex::grow() {
  std::vector<Slot> old(2 * slots_.size());
  old.swap(slots_);
  shift_ = 64 - std::countr_zero(slots_.size());
  size_ = 0;
  for (const Slot& s : old) {
    if (s.owned.bytes != 0) insert(s.key, s.owned);
  }
}

}  // namespace hiber::memory
