#include "server/queue_meter.h"

#include <algorithm>

namespace hiber::server {

Status QueueMeter::admit(std::string_view call, Clock::time_point now,
                         std::vector<device::Stream>& unmarked) {
  unmarked.clear();
  uint64_t queued = 0;
  std::optional<Clock::time_point> oldest;
  {
    MutexLock lock(mutex_);
    for (auto& [id, s] : streams_) {
      if (!s.marked_at) {
        // Its work may be done already; a marker placed now tells.
        if (s.open_bytes > 0) unmarked.push_back(s.stream);
        continue;
      }
      queued += s.marked_bytes + s.open_bytes;
      if (!oldest || *s.marked_at < *oldest) oldest = s.marked_at;
    }
  }
  if (limits_.max_bytes != 0 && queued >= limits_.max_bytes) {
    return error(ErrorCode::kOutOfMemory, call, " refused: the session already has ", queued >> 20,
                 " MiB of copies and memsets queued on its GPU, and at most ",
                 limits_.max_bytes >> 20, " MiB may wait (--session_max_queued_mib)");
  }
  if (limits_.max_age.count() != 0 && oldest && now - *oldest > limits_.max_age) {
    const auto behind = std::chrono::duration_cast<std::chrono::milliseconds>(now - *oldest);
    return error(ErrorCode::kTimeout, call, " refused: work the session queued ", behind.count(),
                 " ms ago has not finished, and its GPU may fall at most ",
                 std::chrono::duration_cast<std::chrono::milliseconds>(limits_.max_age).count(),
                 " ms behind (--session_max_queue_age_ms)");
  }
  return Status();
}

bool QueueMeter::enqueued(device::Stream stream, uint64_t bytes) {
  MutexLock lock(mutex_);
  PerStream& s = streams_[stream.id];
  s.stream = stream;
  s.open_bytes += bytes;
  return !s.marked_at;
}

void QueueMeter::marked(device::Stream stream, Clock::time_point now) {
  MutexLock lock(mutex_);
  PerStream& s = streams_[stream.id];
  s.stream = stream;
  s.marked_bytes = std::exchange(s.open_bytes, 0);
  s.marked_at = now;
}

void QueueMeter::finished(device::Stream stream) {
  MutexLock lock(mutex_);
  auto it = streams_.find(stream.id);
  if (it == streams_.end()) return;
  it->second.marked_bytes = 0;
  it->second.marked_at.reset();
  if (it->second.open_bytes == 0) streams_.erase(it);
}

uint64_t QueueMeter::queued_bytes() const {
  MutexLock lock(mutex_);
  uint64_t queued = 0;
  for (const auto& [id, s] : streams_) {
    if (s.marked_at) queued += s.marked_bytes + s.open_bytes;
  }
  return queued;
}

}  // namespace hiber::server
