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
