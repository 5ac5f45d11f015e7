#include "server/context_pool.h"

#include <glog/logging.h>

#include <algorithm>
#include <utility>

namespace hiber::server {

Result<Isolation> parse_isolation(std::string_view text) {
  if (text == "context") return Isolation::kContext;
  if (text == "shared") return Isolation::kShared;
  return error(ErrorCode::kInvalidValue, "isolation '", text,
               "' is not one of: context (a CUDA context per instance), shared (one per GPU)");
}

std::string_view isolation_name(Isolation isolation) {
  return isolation == Isolation::kContext ? "context" : "shared";
}

ContextPool::ContextPool(device::Device& device, Isolation isolation, int ready_per_gpu)
    : device_(device),
      isolation_(isolation),
      ready_per_gpu_(std::max(ready_per_gpu, 0)),
      ready_(device.gpu_count()) {
  if (isolation_ == Isolation::kContext) {
    LOG(INFO) << "isolation: each function instance runs in a context of its own on each GPU it "
                 "uses (--isolation="
              << isolation_name(isolation_) << "), " << ready_per_gpu_ << " made ahead per GPU";
    thread_ = std::thread([this] { run(); });
  } else {
    LOG(INFO) << "isolation: every function instance runs in its GPU's shared context "
                 "(--isolation="
              << isolation_name(isolation_) << "): a fault there fails every instance on that GPU";
  }
}

bool ContextPool::destroy(device::Context context) {
  Status destroyed = device_.destroy_context(context);
  LOG_IF(WARNING, !destroyed.ok())
      << "destroying a context of GPU " << context.gpu << ": " << destroyed;
  return destroyed.ok();
}

ContextPool::~ContextPool() {
  {
    MutexLock lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
  MutexLock lock(mutex_);
  for (std::deque<device::Context>& ready : ready_) {
    for (const device::Context& c : ready) given_back_.push_back(c);
    ready.clear();
  }
  for (const device::Context& c : given_back_) (void)destroy(c);
  given_back_.clear();
}

Result<device::Context> ContextPool::take(int gpu) {
  if (gpu < 0 || gpu >= device_.gpu_count())
    return error(ErrorCode::kInvalidDevice, "GPU ", gpu, " does not exist (this node has ",
                 device_.gpu_count(), " GPUs)");
  if (isolation_ == Isolation::kShared) return device_.shared_context(gpu);
  {
    MutexLock lock(mutex_);
    std::deque<device::Context>& ready = ready_[gpu];
    if (!ready.empty()) {
      const device::Context context = ready.front();
      ready.pop_front();
      ++stats_.taken_ready;
      wake_.notify_all();  // make the next one
      return context;
    }
  }
  Result<device::Context> made = device_.create_context(gpu);
  MutexLock lock(mutex_);
  if (!made.ok()) {
    ++stats_.failed;
    return made.status().with_context(str_cat("a context for an instance on GPU ", gpu));
  }
  ++stats_.created;
  ++stats_.taken_made;
  wake_.notify_all();
  return made;
}

void ContextPool::give_back(device::Context context) {
  if (context == device_.shared_context(context.gpu)) return;
  MutexLock lock(mutex_);
  given_back_.push_back(context);
  wake_.notify_all();
}

ContextPoolStats ContextPool::stats() const {
  MutexLock lock(mutex_);
  return stats_;
}

void ContextPool::run() {
  MutexLock lock(mutex_);
  while (!stopping_) {
    // Destroying first: a context given back holds GPU memory a new one may need.
    if (!given_back_.empty()) {
      std::vector<device::Context> gone = std::exchange(given_back_, {});
      lock.unlock();
      uint64_t failed = 0;
      for (const device::Context& c : gone) failed += destroy(c) ? 0 : 1;
      lock.lock();
      stats_.destroyed += gone.size() - failed;
      stats_.failed += failed;
      continue;
    }
    int short_gpu = -1;
    for (int g = 0; g < static_cast<int>(ready_.size()); ++g) {
      if (static_cast<int>(ready_[g].size()) < ready_per_gpu_) {
        short_gpu = g;
        break;
      }
    }
    if (short_gpu < 0) {
      lock.wait(wake_);
      continue;
    }
    lock.unlock();
    Result<device::Context> made = device_.create_context(short_gpu);
    lock.lock();
    if (!made.ok()) {
      // Not retried in a loop: the next take() makes one itself and reports the error.
      ++stats_.failed;
      LOG(WARNING) << "making a context ahead on GPU " << short_gpu << ": " << made.status();
      lock.wait(wake_);
      continue;
    }
    ++stats_.created;
    ready_[short_gpu].push_back(*made);
  }
}

}  // namespace hiber::server
