// What one session has queued on its GPU and not yet seen finish: the bytes of its copies and
// memsets, and how long ago the oldest unfinished work was queued. The session refuses GPU calls
// past its limits (--session_max_queued_mib, --session_max_queue_age_ms), so that a client cannot
// pile up hours of work that holds a GPU, and its memory, long after it stopped caring.
//
// Finishing is seen through markers: a stream callback placed after some of the work, at most one
// per stream at a time, so a busy stream costs one callback per marker round trip rather than one
// per call. Work queued on a stream whose marker is outstanding joins the next marker, placed by
// the first call on that stream after the marker ran (or by admit()). The figures are therefore
// those of the work behind an unfinished marker: never more than is really queued, and short of
// it by at most the work queued since a stream's last marker ran.
//
// Thread safety: admit(), enqueued() and the limits' checks on the session thread; finished()
// from device callbacks, on any thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <unordered_map>
#include <vector>

#include "common/mutex.h"
#include "common/status.h"
#include "server/device/device.h"

namespace hiber::server {

class QueueMeter {
 public:
  using Clock = std::chrono::steady_clock;
  struct Limits {
    uint64_t max_bytes = 0;               // 0: no limit
    std::chrono::nanoseconds max_age{0};  // 0: no limit
  };

  explicit QueueMeter(Limits limits) : limits_(limits) {}

  // Whether another GPU call may go on now: kOutOfMemory when max_bytes are queued already (so
  // the bytes may pass it by one call's), kTimeout when work queued more than max_age ago has not
  // finished. `call` names the call in the message. Returns the streams that need a marker first
  // (work queued after their last marker ran): the caller places one on each and then calls
  // marked() for it.
  Status admit(std::string_view call, Clock::time_point now, std::vector<device::Stream>& unmarked);
  // `bytes` were queued on `stream`. True when the caller must place a marker after them (none is
  // outstanding on the stream): it then calls marked().
  bool enqueued(device::Stream stream, uint64_t bytes);
  // A marker is now placed on `stream` after everything queued there so far.
  void marked(device::Stream stream, Clock::time_point now);
  // The marker on `stream` ran (or could not be placed): the work before it is done.
  void finished(device::Stream stream);

  uint64_t queued_bytes() const;

 private:
  struct PerStream {
    device::Stream stream;
    uint64_t open_bytes = 0;    // queued since the marker was placed, not behind one yet
    uint64_t marked_bytes = 0;  // behind the outstanding marker
    std::optional<Clock::time_point> marked_at;  // the outstanding marker's; none: no marker
  };

  const Limits limits_;
  mutable Mutex mutex_;
  std::unordered_map<uint64_t, PerStream> streams_ GUARDED_BY(mutex_);  // by device stream id
};

}  // namespace hiber::server
