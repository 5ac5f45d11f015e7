// The device contexts function instances run in (docs/design.md, "Isolation modes").
//
//   - kContext (hiberd's --isolation=context, the default): each instance gets a context of its
//     own on each GPU it runs on, so a fault of its kernels (an illegal address, a trap, a kernel
//     past its deadline) ends that context only, and the other instances on the GPU go on. The
//     pool keeps a few made ahead per GPU, so making one (tens of milliseconds on CUDA) is off the
//     request path, and destroys each once its instance is done with it: a context another
//     instance's code ran in is never handed out again.
//   - kShared (--isolation=shared, for trusted nodes): every instance runs in its GPU's shared
//     context, which costs no memory per instance; a fault in it fails every instance on the GPU.
//
// Thread safety: every method may be called from any thread. A thread of the pool's own makes
// and destroys contexts.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <string_view>
#include <thread>
#include <vector>

#include "common/mutex.h"
#include "common/status.h"
#include "server/device/device.h"

namespace hiber::server {

enum class Isolation { kContext, kShared };

// "context" or "shared"; kInvalidValue naming the choices otherwise.
Result<Isolation> parse_isolation(std::string_view text);
std::string_view isolation_name(Isolation isolation);

struct ContextPoolStats {
  uint64_t created = 0;      // contexts made (ahead or on demand)
  uint64_t taken_ready = 0;  // handed out from the ready ones
  uint64_t taken_made = 0;   // made on demand, none being ready
  uint64_t destroyed = 0;
  uint64_t failed = 0;  // creations or destructions the device refused
};

class ContextPool {
 public:
  // `device` must outlive the pool. `ready_per_gpu` contexts are kept made ahead on each GPU
  // in kContext mode (0: each is made when asked for).
  ContextPool(device::Device& device, Isolation isolation, int ready_per_gpu);
  // Destroys the contexts still ready and those given back. REQUIRES: every taken context was
  // given back.
  ~ContextPool();
  ContextPool(const ContextPool&) = delete;
  ContextPool& operator=(const ContextPool&) = delete;

  // A context for one instance on `gpu`: the GPU's shared context in kShared mode, a fresh one
  // otherwise (a ready one, or one made now). kInvalidDevice for a GPU the device lacks.
  Result<device::Context> take(int gpu);
  // The instance is done with `context`: its streams, events and library handles are gone. A
  // context of its own is destroyed, off the caller's thread; the shared one stays.
  void give_back(device::Context context);

  ContextPoolStats stats() const;

 private:
  void run();
  // Destroys `context`, logging a refusal; whether it was destroyed.
  bool destroy(device::Context context);

  device::Device& device_;
  const Isolation isolation_;
  const int ready_per_gpu_;
  mutable Mutex mutex_;
  std::condition_variable wake_;
  std::vector<std::deque<device::Context>> ready_ GUARDED_BY(mutex_);  // per GPU
  std::vector<device::Context> given_back_ GUARDED_BY(mutex_);
  ContextPoolStats stats_ GUARDED_BY(mutex_);
  bool stopping_ GUARDED_BY(mutex_) = false;
  std::thread thread_;  // kContext mode only
};

}  // namespace hiber::server
