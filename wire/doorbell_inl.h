// Template part of wire/doorbell.h: the spin-then-sleep wait.
#pragma once

#include <algorithm>
#include <thread>

namespace hiber::wire {
namespace doorbell_internal {

// One spin iteration: tells the core we are busy-waiting (saves power, yields the pipeline to a
// hyper-thread sibling) without giving up the time slice.
inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#else
  std::this_thread::yield();
#endif
}

// now + timeout, saturating: callers pass nanoseconds::max() for "no timeout".
inline std::chrono::steady_clock::time_point deadline_after(
    std::chrono::steady_clock::time_point now, std::chrono::nanoseconds timeout) {
  if (timeout <= std::chrono::nanoseconds::zero()) return now;
  if (timeout >= std::chrono::steady_clock::time_point::max() - now) {
    return std::chrono::steady_clock::time_point::max();
  }
  return now + timeout;
}

// Reading the clock costs ~20 ns; ready() usually costs one load. Check the clock every few spins.
inline constexpr int kSpinsPerClockRead = 16;

}  // namespace doorbell_internal

template <typename Ready, typename Cancelled>
WaitResult wait(Doorbell& bell, AdaptiveSpin& spin, Ready&& ready, Cancelled&& cancelled,
                std::chrono::nanoseconds timeout) {
  using Clock = std::chrono::steady_clock;
  namespace internal = doorbell_internal;
  if (ready()) return WaitResult::kReady;
  if (cancelled()) return WaitResult::kCancelled;
  if (timeout <= std::chrono::nanoseconds::zero()) return WaitResult::kTimedOut;  // a poll

  const auto start = Clock::now();
  const auto deadline = internal::deadline_after(start, timeout);
  const auto spin_end = internal::deadline_after(start, std::min(spin.budget(), timeout));

  // Spin phase: cheap when the peer answers within the budget, which is the common case for a
  // round trip. Only the clock bounds it, so a preempted waiter does not over-spin.
  for (int i = 1;; ++i) {
    internal::cpu_relax();
    if (ready()) {
      spin.record(true, Clock::now() - start);
      return WaitResult::kReady;
    }
    if (cancelled()) return WaitResult::kCancelled;
    if (i % internal::kSpinsPerClockRead == 0 && Clock::now() >= spin_end) break;
  }

  // Sleep phase. Announce ourselves (a read-modify-write that ring() is ordered against), then
  // re-check with the epoch read before the check: a ring() after that read changes the epoch,
  // so futex_wait returns at once instead of missing it.
  WaitResult result;
  bell.sleepers.fetch_add(1, std::memory_order_acq_rel);
  for (;;) {
    const uint32_t epoch = bell.epoch.load(std::memory_order_acquire);
    if (ready()) {
      result = WaitResult::kReady;
      break;
    }
    if (cancelled()) {
      result = WaitResult::kCancelled;
      break;
    }
    const auto now = Clock::now();
    if (now >= deadline) {
      result = WaitResult::kTimedOut;
      break;
    }
    futex_wait(
        bell.epoch, epoch,
        deadline == Clock::time_point::max() ? std::chrono::nanoseconds::max() : deadline - now);
  }
  bell.sleepers.fetch_sub(1, std::memory_order_relaxed);
  const auto waited = Clock::now() - start;
  if (result == WaitResult::kReady) spin.record(false, waited);
  // A wait that slept past max before it was cancelled proved, as a timeout does, that spinning
  // would not have caught the data. Without this, a waiter that mail keeps waking (hiberd's
  // session thread: a grant and an end per request) spins its whole budget after every wake.
  if (result == WaitResult::kTimedOut || result == WaitResult::kCancelled) {
    spin.record_timeout(waited);
  }
  return result;
}

}  // namespace hiber::wire
