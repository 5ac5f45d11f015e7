// When a client event's latest record completed, on the host's steady clock. Two records on
// different GPUs (the function moved between leases) are timed by these, as GPUs' event clocks
// cannot be compared.
//
// The time is part of the record's completion: whoever in hiberd first sees the record complete
// stamps it (the record's own stream callback, an eventSynchronize's callback, an eventQuery or
// eventElapsedTime that finds the device event complete). So a client told that the event is
// complete always finds its time, whichever callback the device runs first.
//
// Thread safety: any thread (device callbacks stamp it).
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>

#include "common/mutex.h"
#include "common/thread_annotations.h"

namespace hiber::server {

class RecordTime {
 public:
  // A new record, pending until stamped; returns its number, for stamp().
  uint64_t begin() {
    MutexLock lock(mutex_);
    ns_.reset();
    return ++record_;
  }

  // Stamps record `record` as completed now, unless it was stamped already or a later record
  // began (a late callback of an earlier record must not complete the current one).
  void stamp(uint64_t record) {
    const int64_t now = std::chrono::duration_cast<std::chrono::nanoseconds>(
                            std::chrono::steady_clock::now().time_since_epoch())
                            .count();
    MutexLock lock(mutex_);
    if (record == record_ && !ns_) ns_ = now;
  }

  uint64_t latest() const {
    MutexLock lock(mutex_);
    return record_;
  }

  // When the latest record completed; none while it is pending.
  std::optional<int64_t> ns() const {
    MutexLock lock(mutex_);
    return ns_;
  }

 private:
  mutable Mutex mutex_;
  uint64_t record_ GUARDED_BY(mutex_) = 0;
  std::optional<int64_t> ns_ GUARDED_BY(mutex_);
};

}  // namespace hiber::server
