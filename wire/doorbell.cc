#include "wire/doorbell.h"

#include <linux/futex.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>

#include <glog/logging.h>

namespace hiber::wire {
namespace {

// The word is shared between processes through a MAP_SHARED mapping, so the futex must be keyed
// by the physical page: plain FUTEX_WAIT/FUTEX_WAKE, never the *_PRIVATE variants.
long futex(std::atomic<uint32_t>& word, int op, uint32_t value, const timespec* timeout) {
  return ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(&word), op, value, timeout, nullptr, 0);
}

}  // namespace

void ring(Doorbell& bell) {
  // A read-modify-write, not a load: ordered against the waiter's sleepers++ (see doorbell.h),
  // either we see the sleeper or it sees the condition we published before calling ring().
  if (bell.sleepers.fetch_add(0, std::memory_order_acq_rel) == 0) return;
  bell.epoch.fetch_add(1, std::memory_order_release);
  futex_wake_all(bell.epoch);
}

void ring_always(Doorbell& bell) {
  // A waiter that read the old epoch finds it changed (FUTEX_WAIT fails) or is woken.
  bell.epoch.fetch_add(1, std::memory_order_release);
  futex_wake_all(bell.epoch);
}

AdaptiveSpin::AdaptiveSpin(std::chrono::nanoseconds min, std::chrono::nanoseconds max)
    : min_(min), max_(max), budget_(max) {
  CHECK(min >= std::chrono::nanoseconds::zero() && min <= max)
      << "AdaptiveSpin: need 0 <= min <= max, got " << min.count() << " and " << max.count()
      << " ns";
}

void AdaptiveSpin::record(bool during_spin, std::chrono::nanoseconds waited) {
  if (during_spin) {
    budget_ = std::min(max_, budget_ * 2);
  } else if (waited <= max_) {
    budget_ = std::clamp(waited * 2, min_, max_);
  } else {
    budget_ = std::max(min_, budget_ / 2);
  }
}

void AdaptiveSpin::record_timeout(std::chrono::nanoseconds waited) {
  if (waited > max_) budget_ = std::max(min_, budget_ / 2);
}

bool futex_wait(std::atomic<uint32_t>& word, uint32_t expected, std::chrono::nanoseconds timeout) {
  if (timeout <= std::chrono::nanoseconds::zero()) return false;
  timespec relative{};
  const timespec* timeout_ptr = nullptr;
  // Beyond ~68 years is "forever"; FUTEX_WAIT takes a relative timeout.
  if (timeout < std::chrono::seconds(INT_MAX)) {
    relative.tv_sec = static_cast<time_t>(timeout.count() / 1'000'000'000);
    relative.tv_nsec = static_cast<long>(timeout.count() % 1'000'000'000);
    timeout_ptr = &relative;
  }
  if (futex(word, FUTEX_WAIT, expected, timeout_ptr) == 0) return true;
  switch (errno) {
    case EAGAIN:  // the word changed before we slept: a wake-up we did not have to wait for
    case EINTR:   // a signal; callers re-check and wait again
      return true;
    case ETIMEDOUT: return false;
    default: PLOG(FATAL) << "FUTEX_WAIT failed";
  }
  return false;
}

void futex_wake_all(std::atomic<uint32_t>& word) {
  if (futex(word, FUTEX_WAKE, INT_MAX, nullptr) < 0) PLOG(FATAL) << "FUTEX_WAKE failed";
}

}  // namespace hiber::wire
