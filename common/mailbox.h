// A mailbox: any thread posts items, one thread takes them all at once and may wait for them.
//
// Thread safety: every member from any thread.
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <utility>
#include <vector>

namespace hiber {

template <typename T>
class Mailbox {
 public:
  // Queues `item` and wakes a waiter. False (the item is dropped) once the mailbox is closed.
  bool post(T item) {
    {
      std::lock_guard lock(mutex_);
      if (closed_) return false;
      items_.push_back(std::move(item));
    }
    ready_.notify_all();
    return true;
  }

  // Everything posted so far, in posting order; the mailbox is empty afterwards.
  std::vector<T> take_all() {
    std::vector<T> items;
    std::lock_guard lock(mutex_);
    items.swap(items_);
    return items;
  }

  // Waits until an item is waiting, the mailbox is closed, or `timeout` passes. Returns whether
  // an item is waiting.
  bool wait_for(std::chrono::nanoseconds timeout) {
    std::unique_lock lock(mutex_);
    ready_.wait_for(lock, timeout, [this] { return !items_.empty() || closed_; });
    return !items_.empty();
  }

  // Refuses later posts and wakes every waiter; items already posted can still be taken.
  void close() {
    {
      std::lock_guard lock(mutex_);
      closed_ = true;
    }
    ready_.notify_all();
  }

  bool closed() const {
    std::lock_guard lock(mutex_);
    return closed_;
  }

 private:
  mutable std::mutex mutex_;
  std::condition_variable ready_;
  std::vector<T> items_;  // guarded by mutex_
  bool closed_ = false;   // guarded by mutex_
};

}  // namespace hiber
