#include "scheduler/id_index.h"

#include <bit>

namespace hiber::scheduler {

IdIndex::IdIndex() : slots_(16), shift_(64 - 4) {}

size_t IdIndex::home(FunctionId id) const {
  // Fibonacci hashing: the top bits of id x 2^64 / phi spread consecutive ids apart.
  return static_cast<size_t>((uint64_t{id.value()} * 0x9e3779b97f4a7c15ULL) >> shift_);
}

std::optional<FunctionIndex> IdIndex::find(FunctionId id) const {
  for (size_t i = home(id); slots_[i].index != kEmpty; i = next(i)) {
    if (slots_[i].id == id) return slots_[i].index;
  }
  return std::nullopt;
}

void IdIndex::insert(FunctionId id, FunctionIndex index) {
  if (2 * (size_ + 1) > slots_.size()) grow();
  size_t i = home(id);
  while (slots_[i].index != kEmpty) i = next(i);
  slots_[i] = Slot{id, index};
  ++size_;
}

bool IdIndex::erase(FunctionId id) {
  size_t i = home(id);
  while (slots_[i].id != id || slots_[i].index == kEmpty) {
    if (slots_[i].index == kEmpty) return false;
    i = next(i);
  }
  // Backward shift: move each later entry of the run into the hole unless its home lies
  // cyclically in (hole, entry], where it would become unreachable.
  for (size_t j = next(i); slots_[j].index != kEmpty; j = next(j)) {
    const size_t h = home(slots_[j].id);
    const bool stays = i <= j ? (i < h && h <= j) : (i < h || h <= j);
    if (stays) continue;
    slots_[i] = slots_[j];
    i = j;
  }
  slots_[i] = Slot{};
  --size_;
  return true;
}

void IdIndex::grow() {
  std::vector<Slot> old(2 * slots_.size());
  old.swap(slots_);
  shift_ = 64 - std::countr_zero(slots_.size());
  size_ = 0;
  for (const Slot& s : old) {
    if (s.index != kEmpty) insert(s.id, s.index);
  }
}

}  // namespace hiber::scheduler
