// Runs simulated kernels so that a bad memory access fails the launch instead of the process.
//
// A process-wide SIGSEGV/SIGBUS handler jumps back (siglongjmp) into run_guarded() when the
// faulting thread is inside it, and otherwise passes the signal to the handler installed before
// it (AddressSanitizer's, glog's, or the default action), so crashes elsewhere still crash and
// still get reported. The handler is (re)installed on each call, so a handler installed later by
// someone else is chained rather than lost.
//
// A fault abandons the guarded function's frames without unwinding them: kernels must not hold
// locks or own memory across accesses to device memory that may fault.
#pragma once

#include <cstdint>
#include <optional>

namespace hiber::device::sim {

struct Fault {
  int signal = 0;         // SIGSEGV or SIGBUS
  uintptr_t address = 0;  // the address accessed
};

// Calls fn(arg) on this thread; returns the fault if fn touched memory it may not.
std::optional<Fault> run_guarded(void (*fn)(void*), void* arg);

}  // namespace hiber::device::sim
