// Kernel deadlines on CUDA (LaunchConfig::deadline): which launches ran past theirs.
//
// The driver cannot stop one kernel, and cannot say when a kernel started, so each watched
// launch records an event after the kernel, and one thread polls the events of every stream every
// kPoll: a launch's run counts from when the launch before it on its stream was seen complete (or
// from the launch call, when there was none), so a deadline is kept to within about kPoll. A
// launch past its deadline is reported once, through its on_timeout, and watched until its event
// completes, to destroy it then.
//
// What is reported is all this backend does: every GPU's primary context is shared by every
// session (runtime sharing), so ending it would take down the other functions' memory on that
// GPU too; the kernel runs on until it ends by itself (docs/gpu-runs.md lists the check pending
// on a real GPU, and docs/reliability.md what a per-function context would add).
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

  // `use_gpu` makes a GPU's context current on the calling thread.
  CudaKernelWatch(const cuda_driver::CudaDriver& driver, std::function<Status(int)> use_gpu);
  ~CudaKernelWatch();
  CudaKernelWatch(const CudaKernelWatch&) = delete;
  CudaKernelWatch& operator=(const CudaKernelWatch&) = delete;

  // Watches the launch just enqueued on `stream` (of `gpu`): records an event after it. REQUIRES:
  // the GPU's context is current on this thread.
  Status watch(int gpu, CUstream stream, const std::string& kernel, const LaunchConfig& config);

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
    int gpu = 0;
    std::deque<Launch> launches;   // in stream order
    Clock::time_point head_since;  // when the head launch could start at the earliest
  };

  void loop();
  // Polls one stream's launches; false when none is left.
  bool poll(Watched& stream, Clock::time_point now);

  const cuda_driver::CudaDriver& cu_;
  const std::function<Status(int)> use_gpu_;
  Mutex mu_;
  std::condition_variable wake_;
  std::map<CUstream, Watched> streams_ GUARDED_BY(mu_);
  bool stopping_ GUARDED_BY(mu_) = false;
  std::thread thread_;  // started by the first watch()
};

}  // namespace hiber::device
