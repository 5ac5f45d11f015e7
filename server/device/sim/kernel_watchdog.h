// Stops simulated kernels that run past their deadline (hiberd's --kernel_deadline_ms): a real
// GPU would be held forever by a kernel that never ends; here the kernel's worker is interrupted
// (fault_guard.h's RunControl) and the launch fails with kLaunchTimeout.
//
// Thread-safe. One thread, which sleeps until the earliest deadline it watches.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <thread>

#include "common/mutex.h"
#include "server/device/sim/fault_guard.h"

namespace hiber::device::sim {

class KernelWatchdog {
 public:
  using Clock = std::chrono::steady_clock;

  KernelWatchdog();
  // Stops the thread; nothing watched is interrupted any more.
  ~KernelWatchdog();
  KernelWatchdog(const KernelWatchdog&) = delete;
  KernelWatchdog& operator=(const KernelWatchdog&) = delete;

  // Interrupts `run` at `deadline` unless unwatch(ticket) comes first.
  uint64_t watch(std::shared_ptr<RunControl> run, Clock::time_point deadline);
  void unwatch(uint64_t ticket);

 private:
  void loop();

  Mutex mu_;
  std::condition_variable changed_;
  // (deadline, ticket) -> the run to stop then.
  std::map<std::pair<Clock::time_point, uint64_t>, std::shared_ptr<RunControl>> watched_
      GUARDED_BY(mu_);
  std::map<uint64_t, Clock::time_point> deadlines_ GUARDED_BY(mu_);  // ticket -> its deadline
  uint64_t next_ticket_ GUARDED_BY(mu_) = 1;
  bool stopping_ GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace hiber::device::sim
