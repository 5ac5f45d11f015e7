#include "server/device/sim/kernel_watchdog.h"

namespace hiber::device::sim {

KernelWatchdog::KernelWatchdog() : thread_([this] { loop(); }) {}

KernelWatchdog::~KernelWatchdog() {
  {
    MutexLock lock(mu_);
    stopping_ = true;
  }
  changed_.notify_all();
  thread_.join();
}

uint64_t KernelWatchdog::watch(std::shared_ptr<RunControl> run, Clock::time_point deadline) {
  MutexLock lock(mu_);
  const uint64_t ticket = next_ticket_++;
  const bool earliest = watched_.empty() || deadline < watched_.begin()->first.first;
  watched_.emplace(std::make_pair(deadline, ticket), std::move(run));
  deadlines_.emplace(ticket, deadline);
  if (earliest) changed_.notify_all();
  return ticket;
}

void KernelWatchdog::unwatch(uint64_t ticket) {
  MutexLock lock(mu_);
  auto it = deadlines_.find(ticket);
  if (it == deadlines_.end()) return;  // interrupted already
  watched_.erase({it->second, ticket});
  deadlines_.erase(it);
}

void KernelWatchdog::loop() {
  MutexLock lock(mu_);
  while (!stopping_) {
    if (watched_.empty()) {
      lock.wait(changed_);
      continue;
    }
    auto first = watched_.begin();
    // A copy: unwatch() may erase the entry while this thread waits, and wait_until reads its
    // deadline again after waking.
    const Clock::time_point deadline = first->first.first;
    if (Clock::now() < deadline) {
      lock.wait_until(changed_, deadline);
      continue;
    }
    // A run that ended meanwhile ignores the interruption (RunControl is per run).
    first->second->interrupt();
    deadlines_.erase(first->first.second);
    watched_.erase(first);
  }
}

}  // namespace hiber::device::sim
