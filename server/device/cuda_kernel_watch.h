// Kernel deadlines on CUDA (LaunchConfig::deadline): which launches ran past theirs.
//
// The driver cannot stop one kernel, and cannot say when a kernel started, so each watched
// launch records an event after the kernel, and one thread polls the events of every stream every
// kPoll: a launch's run counts from when the launch before it on its stream was seen complete (or
// from the launch call, when there was none), so a deadline is kept to within about kPoll. A
// launch past its deadline is reported once, through its on_timeout, and watched until its event
// completes, to destroy it then.
//
// What is reported is all this backend does: the driver has no call that stops one kernel, in
// its own context or a shared one, so the kernel runs on until it ends by itself; the session
// that launched it ends its context (docs/gpu-runs.md lists the check pending on a real GPU).
//
// Thread-safe. REQUIRES at destruction: no watched work is still queued on the GPUs.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <string>
#include <thread>

#include <cuda.h>

#include "common/mutex.h"
#include "server/device/cuda_driver.h"
#include "server/device/device.h"

namespace hiber::device {

class CudaKernelWatch {
 public:
  using Clock = std::chrono::steady_clock;
  static constexpr std::chrono::milliseconds kPoll{10};

  // `use_context` makes a context current on the calling thread.
  CudaKernelWatch(const cuda_driver::CudaDriver& driver,
                  std::function<Status(Context)> use_context);
  ~CudaKernelWatch();
  CudaKernelWatch(const CudaKernelWatch&) = delete;
  CudaKernelWatch& operator=(const CudaKernelWatch&) = delete;

  // Watches the launch just enqueued on `stream` (in `context`): records an event after it.
  // REQUIRES: the context is current on this thread.
  Status watch(Context context, CUstream stream, const std::string& kernel,
               const LaunchConfig& config);
  // Stops watching the launches in `context`, which is about to be destroyed (and its events
  // with it). REQUIRES: the context is current on this thread.
  void forget(Context context);

 private:
  struct Launch {
    CUevent done = nullptr;
    std::string kernel;
    std::chrono::nanoseconds deadline{0};
    std::function<void(const Status&)> on_timeout;
    Clock::time_point launched;
    bool reported = false;
  };
  struct Watched {
    Context context;
    std::deque<Launch> launches;   // in stream order
    Clock::time_point head_since;  // when the head launch could start at the earliest
  };

  void loop();
  // Polls one stream's launches; false when none is left.
  bool poll(Watched& stream, Clock::time_point now);

  const cuda_driver::CudaDriver& cu_;
  const std::function<Status(Context)> use_context_;
  Mutex mu_;
  std::condition_variable wake_;
  std::map<CUstream, Watched> streams_ GUARDED_BY(mu_);
  bool stopping_ GUARDED_BY(mu_) = false;
  std::thread thread_;  // started by the first watch()
};

}  // namespace hiber::device
