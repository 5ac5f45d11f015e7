#include "server/staging_tracker.h"

namespace hiber::server {

StagingTracker::StagingTracker(std::function<void(uint64_t)> release)
    : release_(std::move(release)) {}

Result<StagingTracker::Ticket> StagingTracker::begin(uint64_t end) {
  MutexLock lock(mutex_);
  if (end < last_end_) {
    return error(ErrorCode::kInvalidValue, "staging end ", end,
                 " is before the previous call's end ", last_end_,
                 ": staging positions must not decrease");
  }
  last_end_ = end;
  entries_.push_back({end, false});
  return first_ticket_ + entries_.size() - 1;
}

void StagingTracker::finish(Ticket ticket) {
  uint64_t released = 0;
  bool advanced = false;
  {
    MutexLock lock(mutex_);
    if (ticket < first_ticket_ || ticket - first_ticket_ >= entries_.size()) return;
    entries_[ticket - first_ticket_].finished = true;
    while (!entries_.empty() && entries_.front().finished) {
      released = entries_.front().end;
      entries_.pop_front();
      ++first_ticket_;
      advanced = true;
    }
  }
  if (advanced) release_(released);
}

size_t StagingTracker::outstanding() const {
  MutexLock lock(mutex_);
  return entries_.size();
}

}  // namespace hiber::server
