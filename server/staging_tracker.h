// Tells a client which of its staging bytes it may reuse.
//
// The client copies pageable data into a FIFO staging area of its arena and names, in each call,
// the staging position just after that call's bytes. Calls finish out of order (they run on
// different streams), but the client can only reuse a prefix of its FIFO; so the tracker
// releases the end of the longest prefix of calls that have all finished.
//
// Thread safety: all methods may be called from any thread (finish() runs in device callbacks).
#pragma once

#include <cstdint>
#include <deque>
#include <functional>

#include "common/mutex.h"
#include "common/status.h"

namespace hiber::server {

class StagingTracker {
 public:
  using Ticket = uint64_t;

  // `release` is called with each new released position, outside the lock. Two threads finishing
  // at once may deliver their positions out of order; the receiver keeps the maximum
  // (ServerChannel::release_staging does).
  explicit StagingTracker(std::function<void(uint64_t end)> release);

  // A call using staging up to `end` starts. Ends never decrease in a well-behaved client;
  // a smaller end is kInvalidValue and nothing is tracked.
  Result<Ticket> begin(uint64_t end);

  // The call of `ticket` no longer needs its bytes.
  void finish(Ticket ticket);

  // Calls begun and not yet released (for status and leak checks).
  size_t outstanding() const;

 private:
  struct Entry {
    uint64_t end;
    bool finished;
  };

  std::function<void(uint64_t)> release_;
  mutable Mutex mutex_;
  std::deque<Entry> entries_ GUARDED_BY(mutex_);  // entries_[0] has ticket first_ticket_
  Ticket first_ticket_ GUARDED_BY(mutex_) = 0;
  uint64_t last_end_ GUARDED_BY(mutex_) = 0;
};

}  // namespace hiber::server
