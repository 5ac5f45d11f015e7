// Handles of the simulated device: ids mapped to shared objects, so that a destroyed, foreign or
// made-up handle is found missing (kInvalidHandle) instead of being cast to a pointer.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <unordered_map>
#include <vector>

#include "common/mutex.h"

namespace hiber::device::sim {

// Ids for every kind of handle of one device come from one counter and are never reused, so a
// stream id passed as an event id is not found either.
class IdSource {
 public:
  uint64_t next() { return next_.fetch_add(1, std::memory_order_relaxed); }

 private:
  std::atomic<uint64_t> next_{1};
};

// Thread-safe. Objects live as long as the table or any user holds them.
template <typename T>
class HandleTable {
 public:
  explicit HandleTable(IdSource& ids) : ids_(ids) {}

  uint64_t insert(std::shared_ptr<T> object) {
    uint64_t id = ids_.next();
    MutexLock lock(mu_);
    objects_.emplace(id, std::move(object));
    return id;
  }

  // nullptr if `id` is not in the table.
  std::shared_ptr<T> find(uint64_t id) const {
    MutexLock lock(mu_);
    auto it = objects_.find(id);
    return it == objects_.end() ? nullptr : it->second;
  }

  // Removes and returns the object; nullptr if `id` is not in the table.
  std::shared_ptr<T> erase(uint64_t id) {
    MutexLock lock(mu_);
    auto it = objects_.find(id);
    if (it == objects_.end()) return nullptr;
    std::shared_ptr<T> object = std::move(it->second);
    objects_.erase(it);
    return object;
  }

  // Removes every object `match` accepts.
  template <typename Match>
  void erase_if(Match&& match) {
    MutexLock lock(mu_);
    std::erase_if(objects_, [&](const auto& entry) { return match(*entry.second); });
  }

 private:
  IdSource& ids_;
  mutable Mutex mu_;
  std::unordered_map<uint64_t, std::shared_ptr<T>> objects_ GUARDED_BY(mu_);
};

}  // namespace hiber::device::sim
