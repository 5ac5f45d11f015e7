// Wake-ups between the two processes of a channel, without burning CPU when idle.
//
// A Doorbell lives in shared memory. The side that waits for a condition (data in a ring, space
// in a ring, released staging) first spins for a bounded, adaptive time, then sleeps on a futex
// word. The side that makes the condition true calls ring() after publishing it; ring() costs
// one atomic read-modify-write of `sleepers` (about what a fence costs) unless somebody sleeps.
//
// No lost wake-ups: the waiter announces itself (sleepers++), then re-checks the condition and
// sleeps only if the futex word still holds the value it read before the re-check. The ringer
// publishes, then does its read-modify-write of `sleepers`, and bumps the word whenever it sees
// a sleeper. The two read-modify-writes of one variable are ordered: either the ringer's comes
// second and sees the sleeper, or the waiter's comes second, synchronises with the ringer's and
// so sees the published condition (Dekker, without standalone fences, which ThreadSanitizer
// cannot follow).
//
// Every word here is written by an untrusted peer. Nothing read from a Doorbell is used as an
// index or size; at worst a hostile peer causes spurious or missed wake-ups of its own session
// (a missed one costs the waiter its timeout; close() uses ring_always, which ignores sleepers).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>

namespace hiber::wire {

struct Doorbell {
  std::atomic<uint32_t> epoch{0};     // the futex word
  std::atomic<uint32_t> sleepers{0};  // waiters inside the sleep phase
};
static_assert(std::atomic<uint32_t>::is_always_lock_free);

// Wakes every sleeper. Call after making the condition true (with a release store or stronger).
void ring(Doorbell& bell);

// Wakes every sleeper unconditionally, even if none announced itself; used to cancel waits.
void ring_always(Doorbell& bell);

// Spin budgets for every wait in wire/ (docs/perf.md has the measurements behind them).
// Sleeping costs the ringer a futex syscall (~2 us) and the sleeper a wake-up through the
// scheduler (5-10 us on bare metal; 15-25 us on the KVM guest of docs/perf.md, where a halted
// vCPU must be woken; more on a busy node), so spinning for up to about that long is never much
// worse than sleeping at once (the ski-rental argument) and makes a round trip whose answer
// comes within the budget cost no system call at all (0.9 us instead of 17-52 us there).
// kMaxSpin bounds what an idle waiter burns per wait; the floor keeps a quick answer after a run
// of long waits cheap.
inline constexpr std::chrono::nanoseconds kMinSpin = std::chrono::microseconds(2);
inline constexpr std::chrono::nanoseconds kMaxSpin = std::chrono::microseconds(50);

// Chooses how long to spin before sleeping, from how recent waits went: if the condition tends
// to come true while spinning, spin longer (up to max); if spins tend to run out, spin less
// (down to min). One per waiting thread; not shared.
class AdaptiveSpin {
 public:
  // Starts at max: the first waits find out whether spinning pays.
  AdaptiveSpin(std::chrono::nanoseconds min = kMinSpin, std::chrono::nanoseconds max = kMaxSpin);

  std::chrono::nanoseconds budget() const { return budget_; }

  // `during_spin`: the condition came true before the budget ran out; `waited`: how long it took.
  // A success doubles the budget. A wait that slept but ended within max would have been caught
  // by a longer spin, so the budget grows to twice its length; a longer one halves the budget.
  void record(bool during_spin, std::chrono::nanoseconds waited);

  // A wait that timed out, or was cancelled while asleep, after `waited`. Only one longer than
  // max says that spinning would not have helped: it halves the budget.
  void record_timeout(std::chrono::nanoseconds waited);

 private:
  std::chrono::nanoseconds min_;
  std::chrono::nanoseconds max_;
  std::chrono::nanoseconds budget_;
};

enum class WaitResult { kReady, kCancelled, kTimedOut };

// Waits until ready() returns true, cancelled() returns true, or `timeout` passes.
// ready() and cancelled() are re-evaluated after every wake-up; both must be cheap and
// thread-safe. The doorbell must be rung (ring or ring_always) when either becomes true.
// A zero timeout only evaluates them once: a poll, without spinning.
template <typename Ready, typename Cancelled>
WaitResult wait(Doorbell& bell, AdaptiveSpin& spin, Ready&& ready, Cancelled&& cancelled,
                std::chrono::nanoseconds timeout);

// Sleeps on the futex word while it equals `expected`, for at most `timeout`.
// Returns false on timeout. Spurious returns are allowed.
bool futex_wait(std::atomic<uint32_t>& word, uint32_t expected, std::chrono::nanoseconds timeout);
void futex_wake_all(std::atomic<uint32_t>& word);

}  // namespace hiber::wire

#include "wire/doorbell_inl.h"
