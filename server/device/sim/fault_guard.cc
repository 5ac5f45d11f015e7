#include "server/device/sim/fault_guard.h"

#include <glog/logging.h>

#include <csetjmp>
#include <csignal>
#include <mutex>

namespace hiber::device::sim {
namespace {

constexpr int kSignals[] = {SIGSEGV, SIGBUS};

struct GuardState {
  sigjmp_buf env{};
  volatile sig_atomic_t active = 0;
  Fault fault;
  // The running guarded call's stop request, if another thread may interrupt it.
  std::atomic<bool>* volatile stop = nullptr;
};
// Read by the signal handler, so it must not need a lazy TLS allocation (__tls_get_addr may
// call malloc, which is not async-signal-safe): initial-exec TLS is at a fixed offset from the
// thread pointer even when this code ends up in a shared library. constinit: no guard variable.
__attribute__((tls_model("initial-exec"))) constinit thread_local GuardState t_guard;

// The handlers found when ours was installed; written once, before ours is installed, and
// never again, so the handler can read them from any thread without a lock.
struct sigaction g_previous[2];
std::once_flag g_installed;

int signal_slot(int sig) { return sig == SIGSEGV ? 0 : 1; }

// Async-signal-safe: only sigaction, raise and the previous handler itself.
void pass_on(int sig, siginfo_t* info, void* context) {
  const struct sigaction& previous = g_previous[signal_slot(sig)];
  if ((previous.sa_flags & SA_SIGINFO) && previous.sa_sigaction != nullptr) {
    previous.sa_sigaction(sig, info, context);
    return;
  }
  if (previous.sa_handler != SIG_DFL && previous.sa_handler != SIG_IGN) {
    previous.sa_handler(sig);
    return;
  }
  // Default action (an ignored fault would loop forever): die with this signal once we return.
  struct sigaction default_action {};
  default_action.sa_handler = SIG_DFL;
  sigemptyset(&default_action.sa_mask);
  sigaction(sig, &default_action, nullptr);
  raise(sig);
}

void on_fault(int sig, siginfo_t* info, void* context) {
  GuardState& guard = t_guard;
  if (guard.active) {
    guard.active = 0;
    guard.fault.signal = sig;
    guard.fault.address = reinterpret_cast<uintptr_t>(info->si_addr);
    siglongjmp(guard.env, 1);
  }
  pass_on(sig, info, context);
}

// The interrupt signal is ours alone: one that finds no interruptible run (it finished just
// before the signal landed) is dropped.
void on_interrupt(int sig, siginfo_t*, void*) {
  GuardState& guard = t_guard;
  std::atomic<bool>* stop = guard.stop;
  if (guard.active && stop != nullptr && stop->load(std::memory_order_relaxed)) {
    guard.active = 0;
    guard.fault = Fault{.signal = sig, .address = 0, .interrupted = true};
    siglongjmp(guard.env, 1);
  }
}

void install() {
  struct sigaction interrupt {};
  interrupt.sa_sigaction = on_interrupt;
  interrupt.sa_flags = SA_SIGINFO | SA_ONSTACK | SA_RESTART;
  sigemptyset(&interrupt.sa_mask);
  PCHECK(sigaction(interrupt_signal(), &interrupt, nullptr) == 0);
  for (int sig : kSignals) {
    // Saved before ours goes in, so the handler never sees a half-written entry.
    PCHECK(sigaction(sig, nullptr, &g_previous[signal_slot(sig)]) == 0);
    struct sigaction ours {};
    ours.sa_sigaction = on_fault;
    ours.sa_flags = SA_SIGINFO | SA_ONSTACK;  // ONSTACK: keep working where an alt stack is set
    sigemptyset(&ours.sa_mask);
    PCHECK(sigaction(sig, &ours, nullptr) == 0);
  }
}

}  // namespace

int interrupt_signal() { return SIGRTMIN + 5; }

void RunControl::interrupt() {
  MutexLock lock(mu_);
  requested_.store(true, std::memory_order_relaxed);
  if (running_) pthread_kill(thread_, interrupt_signal());
}

std::optional<Fault> run_guarded(void (*fn)(void*), void* arg, RunControl* control) {
  std::call_once(g_installed, install);
  GuardState& guard = t_guard;
  auto finish = [&] {
    guard.stop = nullptr;
    if (control == nullptr) return;
    MutexLock lock(control->mu_);
    control->running_ = false;
  };
  // savemask = 1: the jump restores the signal mask, unblocking the signal being handled.
  if (sigsetjmp(guard.env, 1) != 0) {
    finish();
    return guard.fault;
  }
  if (control != nullptr) {
    MutexLock lock(control->mu_);
    control->running_ = true;
    control->thread_ = pthread_self();
    guard.stop = &control->requested_;
  }
  guard.active = 1;
  // Interrupted before it began (the signal, if any, found it inactive and was dropped).
  if (control != nullptr && control->requested_.load(std::memory_order_relaxed)) {
    guard.active = 0;
    finish();
    return Fault{.signal = interrupt_signal(), .address = 0, .interrupted = true};
  }
  fn(arg);
  guard.active = 0;
  finish();
  return std::nullopt;
}

}  // namespace hiber::device::sim
