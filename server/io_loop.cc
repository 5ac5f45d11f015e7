#include "server/io_loop.h"

#include <liburing.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <glog/logging.h>

namespace hiber::server {

struct IoLoop::Ring {
  io_uring ring;
  // A timeout's duration must stay readable until the SQE is submitted; kept per operation.
  std::unordered_map<OpId, std::unique_ptr<__kernel_timespec>> timeout_specs;
};

Result<std::unique_ptr<IoLoop>> IoLoop::create(unsigned queue_depth, unsigned completion_entries) {
  if (completion_entries != 0 && completion_entries < queue_depth) {
    return error(ErrorCode::kInvalidValue, "a completion queue of ", completion_entries,
                 " entries is smaller than the queue depth ", queue_depth);
  }
  auto ring = std::make_unique<Ring>();
  io_uring_params params{};
  if (completion_entries != 0) {
    params.flags |= IORING_SETUP_CQSIZE;
    params.cq_entries = completion_entries;
  }
  int rc = io_uring_queue_init_params(queue_depth, &ring->ring, &params);
  if (rc < 0) {
    return error(ErrorCode::kOperatingSystem, "io_uring_queue_init: ", std::strerror(-rc),
                 " (is io_uring disabled? see /proc/sys/kernel/io_uring_disabled)");
  }
  int wake = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (wake < 0) {
    int err = errno;
    io_uring_queue_exit(&ring->ring);
    return error(ErrorCode::kOperatingSystem, "eventfd: ", std::strerror(err));
  }
  std::unique_ptr<IoLoop> loop(new IoLoop(std::move(ring), UniqueFd(wake)));
  loop->arm_wake_read();
  return loop;
}

IoLoop::IoLoop(std::unique_ptr<Ring> ring, UniqueFd wake_fd)
    : ring_(std::move(ring)), wake_fd_(std::move(wake_fd)) {}

IoLoop::~IoLoop() {
  // Operations still pending point into their owners' buffers: cancel them all and wait until
  // the kernel is done with them before the ring (and those buffers) go away. Their handlers
  // are not run: their owners are being destroyed too.
  if (!handlers_.empty()) {
    io_uring_sqe* sqe = next_sqe();
    io_uring_prep_cancel64(sqe, 0, IORING_ASYNC_CANCEL_ANY);
    io_uring_sqe_set_data64(sqe, 0);
    io_uring_submit(&ring_->ring);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(2);
    while (!handlers_.empty() && std::chrono::steady_clock::now() < deadline) {
      __kernel_timespec wait{0, 50'000'000};
      io_uring_cqe* cqe = nullptr;
      if (io_uring_wait_cqe_timeout(&ring_->ring, &cqe, &wait) != 0) continue;
      const OpId id = io_uring_cqe_get_data64(cqe);
      const bool more = (cqe->flags & IORING_CQE_F_MORE) != 0;
      io_uring_cqe_seen(&ring_->ring, cqe);
      if (id != 0 && !more) handlers_.erase(id);
    }
    if (!handlers_.empty()) {
      LOG(ERROR) << handlers_.size() << " io_uring operations did not finish at exit";
    }
  }
  io_uring_queue_exit(&ring_->ring);
}

io_uring_sqe* IoLoop::next_sqe() {
  io_uring_sqe* sqe = io_uring_get_sqe(&ring_->ring);
  while (sqe == nullptr) {
    // The submission queue is full: hand what is queued to the kernel and try again.
    int rc = io_uring_submit(&ring_->ring);
    CHECK(rc >= 0 || rc == -EBUSY || rc == -EAGAIN) << "io_uring_submit: " << std::strerror(-rc);
    sqe = io_uring_get_sqe(&ring_->ring);
  }
  return sqe;
}

IoLoop::OpId IoLoop::submit(io_uring_sqe* sqe, Handler handler) {
  OpId id = next_id_++;
  io_uring_sqe_set_data64(sqe, id);
  handlers_.emplace(id, std::move(handler));
  return id;
}

IoLoop::OpId IoLoop::accept_multishot(int listen_fd, Handler handler) {
  io_uring_sqe* sqe = next_sqe();
  io_uring_prep_multishot_accept(sqe, listen_fd, nullptr, nullptr, SOCK_CLOEXEC);
  return submit(sqe, std::move(handler));
}

IoLoop::OpId IoLoop::recv(int fd, std::span<std::byte> buffer, Handler handler) {
  io_uring_sqe* sqe = next_sqe();
  io_uring_prep_recv(sqe, fd, buffer.data(), buffer.size(), 0);
  return submit(sqe, std::move(handler));
}

IoLoop::OpId IoLoop::sendmsg(int fd, const msghdr* message, Handler handler) {
  io_uring_sqe* sqe = next_sqe();
  io_uring_prep_sendmsg(sqe, fd, message, MSG_NOSIGNAL);
  return submit(sqe, std::move(handler));
}

IoLoop::OpId IoLoop::poll(int fd, uint32_t events, Handler handler) {
  io_uring_sqe* sqe = next_sqe();
  io_uring_prep_poll_add(sqe, fd, events);
  return submit(sqe, std::move(handler));
}

IoLoop::OpId IoLoop::read(int fd, std::span<std::byte> buffer, Handler handler) {
  io_uring_sqe* sqe = next_sqe();
  io_uring_prep_read(sqe, fd, buffer.data(), static_cast<unsigned>(buffer.size()), 0);
  return submit(sqe, std::move(handler));
}

IoLoop::OpId IoLoop::timeout(std::chrono::nanoseconds after, Handler handler) {
  auto spec = std::make_unique<__kernel_timespec>();
  spec->tv_sec = after.count() / 1'000'000'000;
  spec->tv_nsec = after.count() % 1'000'000'000;
  io_uring_sqe* sqe = next_sqe();
  io_uring_prep_timeout(sqe, spec.get(), 0, 0);
  OpId id = submit(sqe, std::move(handler));
  ring_->timeout_specs.emplace(id, std::move(spec));
  return id;
}

void IoLoop::cancel(OpId op) {
  if (handlers_.find(op) == handlers_.end()) return;
  io_uring_sqe* sqe = next_sqe();
  io_uring_prep_cancel64(sqe, op, 0);
  // The cancel request's own completion carries no information we need.
  io_uring_sqe_set_data64(sqe, 0);
}

void IoLoop::post(std::function<void()> fn) {
  posted_.post(std::move(fn));
  uint64_t one = 1;
  // The eventfd counter saturates long before overflow matters; EAGAIN means already signalled.
  ssize_t n = ::write(wake_fd_.get(), &one, sizeof one);
  (void)n;
}

void IoLoop::arm_wake_read() {
  read(wake_fd_.get(), std::as_writable_bytes(std::span(&wake_buffer_, 1)),
       [this](int result, bool) {
         if (result < 0 && result != -EAGAIN && result != -ECANCELED) {
           LOG(ERROR) << "event loop wake-up read failed: " << std::strerror(-result);
         }
         run_posted();
         if (!stopping_) arm_wake_read();
       });
}

void IoLoop::run_posted() {
  for (auto& fn : posted_.take_all()) fn();
}

Status IoLoop::run() {
  stopping_ = false;
  while (!stopping_) {
    int rc = io_uring_submit_and_wait(&ring_->ring, 1);
    if (rc < 0 && rc != -EINTR && rc != -EBUSY && rc != -EAGAIN) {
      return error(ErrorCode::kOperatingSystem, "io_uring_submit_and_wait: ", std::strerror(-rc));
    }
    io_uring_cqe* cqe = nullptr;
    while (io_uring_peek_cqe(&ring_->ring, &cqe) == 0) {
      OpId id = io_uring_cqe_get_data64(cqe);
      int result = cqe->res;
      bool more = (cqe->flags & IORING_CQE_F_MORE) != 0;
      io_uring_cqe_seen(&ring_->ring, cqe);
      if (id == 0) continue;  // a cancel request's own completion
      auto it = handlers_.find(id);
      if (it == handlers_.end()) continue;
      // Take the handler out before running it: it may submit or cancel operations.
      Handler handler = more ? it->second : std::move(it->second);
      if (!more) {
        handlers_.erase(it);
        ring_->timeout_specs.erase(id);
      }
      handler(result, more);
    }
    // Posted work may arrive while handlers run; the eventfd read picks it up next round.
  }
  return Status();
}

}  // namespace hiber::server
