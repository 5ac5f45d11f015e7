// Doorbell: spin-then-sleep waits across threads without lost wake-ups or idle CPU burn.
#include "wire/doorbell.h"

#include <gtest/gtest.h>
#include <time.h>

#include <atomic>
#include <chrono>
#include <thread>

namespace hiber::wire {
namespace {

using namespace std::chrono_literals;

std::chrono::nanoseconds thread_cpu_time() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return std::chrono::seconds(ts.tv_sec) + std::chrono::nanoseconds(ts.tv_nsec);
}

TEST(AdaptiveSpinTest, StartsAtMaxAndStaysWithinBounds) {
  AdaptiveSpin spin(1us, 64us);
  EXPECT_EQ(spin.budget(), 64us);
  for (int i = 0; i < 20; ++i) spin.record(false, 10ms);  // long waits: spinning does not pay
  EXPECT_EQ(spin.budget(), 1us);
  spin.record(true, 500ns);  // a success doubles
  EXPECT_EQ(spin.budget(), 2us);
  for (int i = 0; i < 20; ++i) spin.record(true, 1us);
  EXPECT_EQ(spin.budget(), 64us);
}

TEST(AdaptiveSpinTest, ShortSleepsGrowTheBudget) {
  AdaptiveSpin spin(1us, 64us);
  for (int i = 0; i < 20; ++i) spin.record(false, 10ms);
  // Slept, but the answer came within max: a longer spin would have caught it.
  spin.record(false, 20us);
  EXPECT_EQ(spin.budget(), 40us);
}

TEST(AdaptiveSpinTest, OnlyLongTimeoutsShrinkTheBudget) {
  AdaptiveSpin spin(1us, 64us);
  spin.record_timeout(10us);  // a short timeout says nothing about spinning
  EXPECT_EQ(spin.budget(), 64us);
  spin.record_timeout(50ms);
  EXPECT_EQ(spin.budget(), 32us);
}

TEST(DoorbellTest, ZeroTimeoutPollsWithoutTouchingTheBudget) {
  Doorbell bell;
  AdaptiveSpin spin;
  for (int i = 0; i < 100; ++i) {
    EXPECT_EQ(wait(
                  bell, spin, [] { return false; }, [] { return false; }, 0ns),
              WaitResult::kTimedOut);
  }
  EXPECT_EQ(spin.budget(), kMaxSpin);
  EXPECT_EQ(bell.sleepers.load(), 0u);
}

TEST(AdaptiveSpinTest, DefaultsAreTheDocumentedBudgets) {
  AdaptiveSpin spin;
  EXPECT_EQ(spin.budget(), kMaxSpin);
  for (int i = 0; i < 40; ++i) spin.record(false, 1s);
  EXPECT_EQ(spin.budget(), kMinSpin);
}

TEST(FutexTest, WaitTimesOutWhenNobodyWakes) {
  std::atomic<uint32_t> word{7};
  const auto start = std::chrono::steady_clock::now();
  EXPECT_FALSE(futex_wait(word, 7, 20ms));
  EXPECT_GE(std::chrono::steady_clock::now() - start, 20ms);
}

TEST(FutexTest, WaitReturnsAtOnceWhenTheWordDiffers) {
  std::atomic<uint32_t> word{7};
  const auto start = std::chrono::steady_clock::now();
  EXPECT_TRUE(futex_wait(word, 8, 10s));
  EXPECT_LT(std::chrono::steady_clock::now() - start, 1s);
}

TEST(DoorbellTest, ReadyConditionReturnsWithoutWaiting) {
  Doorbell bell;
  AdaptiveSpin spin;
  EXPECT_EQ(wait(
                bell, spin, [] { return true; }, [] { return false; }, 0ns),
            WaitResult::kReady);
}

TEST(DoorbellTest, TimesOut) {
  Doorbell bell;
  AdaptiveSpin spin;
  const auto start = std::chrono::steady_clock::now();
  EXPECT_EQ(wait(
                bell, spin, [] { return false; }, [] { return false; }, 30ms),
            WaitResult::kTimedOut);
  EXPECT_GE(std::chrono::steady_clock::now() - start, 30ms);
  EXPECT_EQ(bell.sleepers.load(), 0u);
}

TEST(DoorbellTest, CancellationWakesASleeper) {
  Doorbell bell;
  std::atomic<bool> cancelled{false};
  std::atomic<bool> sleeping{false};
  WaitResult result = WaitResult::kReady;
  std::chrono::steady_clock::time_point woke;
  std::thread waiter([&] {
    AdaptiveSpin spin(0ns, 0ns);  // straight to sleep
    result = wait(
        bell, spin,
        [&] {
          sleeping = true;
          return false;
        },
        [&] { return cancelled.load(); }, 30s);
    woke = std::chrono::steady_clock::now();
  });
  while (!sleeping || bell.sleepers.load() == 0) std::this_thread::sleep_for(1ms);
  std::this_thread::sleep_for(20ms);
  const auto cancelled_at = std::chrono::steady_clock::now();
  cancelled = true;
  ring_always(bell);
  waiter.join();
  EXPECT_EQ(result, WaitResult::kCancelled);
  EXPECT_LT(woke - cancelled_at, 1s);
}

// hiberd's session thread is woken by mail (cancellations) far more often than by data: such
// waits must shrink the budget as timeouts do, or every wake-up costs a whole spin.
TEST(DoorbellTest, ALongSleepEndedByCancellationShrinksTheBudget) {
  Doorbell bell;
  std::atomic<bool> cancelled{false};
  AdaptiveSpin spin(1us, 64us);
  std::thread waiter([&] {
    EXPECT_EQ(wait(
                  bell, spin, [] { return false; }, [&] { return cancelled.load(); }, 30s),
              WaitResult::kCancelled);
  });
  // Cancelled once asleep, well past the 64 us budget.
  while (bell.sleepers.load() == 0) std::this_thread::sleep_for(1ms);
  std::this_thread::sleep_for(5ms);
  cancelled = true;
  ring_always(bell);
  waiter.join();
  EXPECT_EQ(spin.budget(), 32us);
}

// Two threads pass a token back and forth; every hand-off goes through ring()/wait(). A lost
// wake-up would leave a thread asleep until its (long) timeout and fail the test.
void ping_pong(std::chrono::nanoseconds spin_max, int rounds) {
  Doorbell bells[2];
  std::atomic<uint64_t> turn{0};  // even: thread 0 plays, odd: thread 1
  std::atomic<int> timeouts{0};
  auto player = [&](int me) {
    AdaptiveSpin spin(0ns, spin_max);
    for (int i = 0; i < rounds; ++i) {
      const uint64_t mine = 2 * static_cast<uint64_t>(i) + static_cast<uint64_t>(me);
      if (wait(
              bells[me], spin, [&] { return turn.load(std::memory_order_acquire) == mine; },
              [] { return false; }, 10s) != WaitResult::kReady) {
        ++timeouts;
        return;
      }
      turn.store(mine + 1, std::memory_order_release);
      ring(bells[1 - me]);
    }
  };
  std::thread a(player, 0), b(player, 1);
  a.join();
  b.join();
  EXPECT_EQ(timeouts.load(), 0);
  EXPECT_EQ(turn.load(), 2 * static_cast<uint64_t>(rounds));
}

TEST(DoorbellTest, NoLostWakeUpsWhenAlwaysSleeping) { ping_pong(0ns, 20000); }

TEST(DoorbellTest, NoLostWakeUpsWithShortSpins) { ping_pong(2us, 20000); }

TEST(DoorbellTest, NoLostWakeUpsWithManyWaitersOnOneBell) {
  // Several threads sleep on one bell for a shared counter; one thread bumps it and rings.
  Doorbell bell;
  std::atomic<uint64_t> counter{0};
  constexpr uint64_t kTarget = 5000;
  std::atomic<int> failures{0};
  std::vector<std::thread> waiters;
  for (int t = 0; t < 4; ++t) {
    waiters.emplace_back([&] {
      AdaptiveSpin spin(0ns, 1us);
      for (uint64_t seen = 0; seen < kTarget;) {
        const uint64_t next = seen + 1;
        if (wait(
                bell, spin, [&] { return counter.load() >= next; }, [] { return false; }, 10s) !=
            WaitResult::kReady) {
          ++failures;
          return;
        }
        seen = counter.load();
      }
    });
  }
  for (uint64_t i = 0; i < kTarget; ++i) {
    counter.fetch_add(1);
    ring(bell);
    if (i % 64 == 0) std::this_thread::yield();
  }
  for (auto& t : waiters) t.join();
  EXPECT_EQ(failures.load(), 0);
}

TEST(DoorbellTest, AnIdleSleeperBurnsNoCpu) {
  Doorbell bell;
  std::chrono::nanoseconds cpu{};
  std::chrono::nanoseconds wall{};
  std::thread waiter([&] {
    AdaptiveSpin spin;  // the defaults: spins at most kMaxSpin, then sleeps
    const auto cpu_start = thread_cpu_time();
    const auto start = std::chrono::steady_clock::now();
    EXPECT_EQ(wait(
                  bell, spin, [] { return false; }, [] { return false; }, 300ms),
              WaitResult::kTimedOut);
    wall = std::chrono::steady_clock::now() - start;
    cpu = thread_cpu_time() - cpu_start;
  });
  waiter.join();
  EXPECT_GE(wall, 300ms);
  // kMaxSpin of spinning plus a few system calls; allow generous slack for sanitizers.
  EXPECT_LT(cpu, 10ms) << "cpu " << cpu.count() << " ns over " << wall.count() << " ns";
}

}  // namespace
}  // namespace hiber::wire
