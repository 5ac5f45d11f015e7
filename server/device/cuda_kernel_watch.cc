#include "server/device/cuda_kernel_watch.h"

#include <glog/logging.h>

namespace hiber::device {

CudaKernelWatch::CudaKernelWatch(const cuda_driver::CudaDriver& driver,
                                 std::function<Status(Context)> use_context)
    : cu_(driver), use_context_(std::move(use_context)) {}

CudaKernelWatch::~CudaKernelWatch() {
  {
    MutexLock lock(mu_);
    stopping_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
  MutexLock lock(mu_);
  for (auto& [stream, watched] : streams_) {
    if (!use_context_(watched.context).ok()) continue;
    for (Launch& launch : watched.launches) (void)cu_.pfn_cuEventDestroy(launch.done);
  }
}

Status CudaKernelWatch::watch(Context context, CUstream stream, const std::string& kernel,
                              const LaunchConfig& config) {
  Launch launch;
  HIBER_RETURN_IF_ERROR(
      cu_.check(cu_.pfn_cuEventCreate(&launch.done, CU_EVENT_DISABLE_TIMING), "cuEventCreate"));
  Status recorded = cu_.check(cu_.pfn_cuEventRecord(launch.done, stream), "cuEventRecord");
  if (!recorded.ok()) {
    (void)cu_.pfn_cuEventDestroy(launch.done);
    return recorded;
  }
  launch.kernel = kernel;
  launch.deadline = config.deadline;
  launch.on_timeout = config.on_timeout;
  launch.launched = Clock::now();
  MutexLock lock(mu_);
  Watched& watched = streams_[stream];
  watched.context = context;
  if (watched.launches.empty()) watched.head_since = launch.launched;
  watched.launches.push_back(std::move(launch));
  if (!thread_.joinable()) thread_ = std::thread([this] { loop(); });
  return Status();
}

void CudaKernelWatch::forget(Context context) {
  MutexLock lock(mu_);
  for (auto it = streams_.begin(); it != streams_.end();) {
    if (it->second.context != context) {
      ++it;
      continue;
    }
    for (Launch& launch : it->second.launches) (void)cu_.pfn_cuEventDestroy(launch.done);
    it = streams_.erase(it);
  }
}

void CudaKernelWatch::loop() {
  MutexLock lock(mu_);
  while (!stopping_) {
    const Clock::time_point now = Clock::now();
    for (auto it = streams_.begin(); it != streams_.end();) {
      it = poll(it->second, now) ? std::next(it) : streams_.erase(it);
    }
    lock.wait_until(wake_, now + kPoll);
  }
}

bool CudaKernelWatch::poll(Watched& stream, Clock::time_point now) {
  if (!use_context_(stream.context).ok()) return true;
  while (!stream.launches.empty()) {
    Launch& head = stream.launches.front();
    const CUresult state = cu_.pfn_cuEventQuery(head.done);
    if (state == CUDA_ERROR_NOT_READY) {
      const Clock::time_point started = std::max(stream.head_since, head.launched);
      if (!head.reported && now - started > head.deadline) {
        head.reported = true;
        const Status late =
            error(ErrorCode::kLaunchTimeout, "kernel ", head.kernel, " ran past its deadline of ",
                  std::chrono::duration_cast<std::chrono::milliseconds>(head.deadline).count(),
                  " ms; a CUDA kernel cannot be stopped alone, so it runs on until it ends");
        LOG(ERROR) << "GPU " << stream.context.gpu << ": " << late;
        if (head.on_timeout) head.on_timeout(late);
      }
      return true;
    }
    // Done, or failed: either way the kernel no longer runs.
    (void)cu_.pfn_cuEventDestroy(head.done);
    stream.launches.pop_front();
    stream.head_since = now;
  }
  return false;
}

}  // namespace hiber::device
