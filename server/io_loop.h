// hiberd's event loop: socket and control I/O on io_uring.
//
// One thread runs the loop and every completion handler. Other threads hand work to it with
// post() (an eventfd the loop keeps a read on). Operations are identified by an id the caller
// can cancel; a handler runs once per completion, and multishot operations (accept) keep their
// handler until the kernel reports the last completion.
//
// Buffers passed to recv/send/sendmsg/read must stay valid until their handler has run.
//
// Thread safety: post() from any thread; everything else on the loop thread only.
#pragma once

#include <sys/socket.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <unordered_map>
#include <vector>

#include "common/mailbox.h"
#include "common/status.h"
#include "common/unique_fd.h"

// liburing's submission entry; liburing itself stays out of this header.
struct io_uring_sqe;

namespace hiber::server {

class IoLoop {
 public:
  // `result` is the CQE's res: bytes or an fd on success, -errno on failure.
  // `more` is true when a multishot operation will complete again.
  using Handler = std::function<void(int result, bool more)>;
  using OpId = uint64_t;

  // kOperatingSystem with the reason if io_uring is unavailable (e.g. disabled by sysctl).
  // `completion_entries` sizes the completion queue (IORING_SETUP_CQSIZE; at least
  // queue_depth); 0: io_uring's default of twice the queue depth. A small one lets tests
  // overflow it.
  static Result<std::unique_ptr<IoLoop>> create(unsigned queue_depth,
                                                unsigned completion_entries = 0);
  ~IoLoop();

  IoLoop(const IoLoop&) = delete;
  IoLoop& operator=(const IoLoop&) = delete;

  OpId accept_multishot(int listen_fd, Handler handler);
  OpId recv(int fd, std::span<std::byte> buffer, Handler handler);
  OpId sendmsg(int fd, const msghdr* message, Handler handler);
  OpId poll(int fd, uint32_t events, Handler handler);
  OpId read(int fd, std::span<std::byte> buffer, Handler handler);
  OpId timeout(std::chrono::nanoseconds after, Handler handler);

  // Asks the kernel to cancel an operation; its handler still runs (with -ECANCELED, or its
  // real result if it had already completed). Unknown ids are ignored.
  void cancel(OpId op);

  // Runs fn on the loop thread. Thread-safe.
  void post(std::function<void()> fn);

  // Runs until stop() is called from a handler or posted function.
  Status run();
  void stop() { stopping_ = true; }

  // Operations submitted and not yet finished (for leak checks in tests).
  size_t pending_operations() const { return handlers_.size(); }

 private:
  // The io_uring instance and what its operations need kept alive (io_loop.cc).
  struct Ring;

  IoLoop(std::unique_ptr<Ring> ring, UniqueFd wake_fd);
  io_uring_sqe* next_sqe();
  OpId submit(io_uring_sqe* sqe, Handler handler);
  void arm_wake_read();
  void run_posted();

  std::unique_ptr<Ring> ring_;
  UniqueFd wake_fd_;
  uint64_t wake_buffer_ = 0;
  OpId next_id_ = 1;
  bool stopping_ = false;
  std::unordered_map<OpId, Handler> handlers_;

  Mailbox<std::function<void()>> posted_;
};

}  // namespace hiber::server
