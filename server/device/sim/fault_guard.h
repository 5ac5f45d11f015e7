// Runs simulated kernels so that a bad memory access fails the launch instead of the process.
//
// A process-wide SIGSEGV/SIGBUS handler jumps back (siglongjmp) into run_guarded() when the
// faulting thread is inside it, and otherwise passes the signal to the handler that was
// installed before it (AddressSanitizer's, glog's, or the default action), so crashes elsewhere
// still crash and still get reported.
//
// The handler is installed once per process, by the first run_guarded(), and never again: a
// handler installed later by someone else stays in charge, and must chain to the one it replaced
// (as crash reporters do) for faults inside kernels to keep being caught. Re-installing ours over
// it would make it our "previous" handler while it chains to us, a cycle.
//
// Another thread can stop a guarded run (a kernel past its deadline) through its RunControl: a
// private real-time signal (kInterruptSignal) makes the running thread jump back the same way,
// and run_guarded() reports an interruption instead of a fault.
//
// A fault or an interruption abandons the guarded function's frames without unwinding them:
// kernels must not hold locks or own memory across accesses to device memory that may fault, nor
// across any point where they may run past their deadline.
#pragma once

#include <pthread.h>

#include <atomic>
#include <cstdint>
#include <optional>

#include "common/mutex.h"

namespace hiber::device::sim {

struct Fault {
  int signal = 0;            // SIGSEGV or SIGBUS; kInterruptSignal for an interruption
  uintptr_t address = 0;     // the address accessed (none for an interruption)
  bool interrupted = false;  // stopped by RunControl::interrupt(), not a bad access
};

// The signal that interrupts a guarded run: SIGRTMIN + 5 (glibc keeps the first real-time signals
// for itself; SIGRTMIN already starts past them).
int interrupt_signal();

// Lets one thread stop the guarded run of another. One run at a time; thread-safe.
class RunControl {
 public:
  // Stops the run if it is still going (it returns a Fault with `interrupted`); a run that has
  // not started yet is stopped as soon as it starts. Any thread.
  void interrupt();

 private:
  friend std::optional<Fault> run_guarded(void (*fn)(void*), void* arg, RunControl* control);
  Mutex mu_;
  bool running_ GUARDED_BY(mu_) = false;
  pthread_t thread_ GUARDED_BY(mu_){};
  // Read by the signal handler: whether this run was asked to stop.
  std::atomic<bool> requested_{false};
};

// Calls fn(arg) on this thread; returns the fault if fn touched memory it may not, or an
// interruption if `control` (optional) interrupted it.
std::optional<Fault> run_guarded(void (*fn)(void*), void* arg, RunControl* control = nullptr);

}  // namespace hiber::device::sim
