// The server's end of one client's channel: creates the memfd, reads request messages and
// writes completion messages.
//
// Thread safety: receive() is called by one thread (the session's). send() and
// release_staging() may be called from any thread (device callbacks post completions); they
// serialise internally. close() may be called from any thread at any time.
#pragma once

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <span>

#include "common/status.h"
#include "common/unique_fd.h"
#include "wire/channel_layout.h"
#include "wire/message.h"
#include "wire/ring.h"

namespace hiber::wire {

class ServerChannel {
 public:
  // Creates and maps a memfd laid out for `config`, with both rings initialised. The memfd is
  // sealed against shrinking and growing: a client that truncated it would make the server's
  // accesses fault (SIGBUS).
  static Result<std::unique_ptr<ServerChannel>> create(const ChannelConfig& config);
  // Closes the channel (see close()) and unmaps it. REQUIRES: no thread is inside a method.
  ~ServerChannel();

  ServerChannel(const ServerChannel&) = delete;
  ServerChannel& operator=(const ServerChannel&) = delete;

  // The memfd to pass to the client (SCM_RIGHTS). Stays owned by the channel.
  int memfd() const { return memfd_.get(); }
  const ChannelLayout& layout() const { return layout_; }

  // Waits for the next request message and copies it into `out`.
  // kDeinitialized after close(); kInvalidValue if the client corrupted the ring (the session
  // must end; every later call returns the same error); kTimeout if `timeout` passed with
  // nothing to read. A client that dies does not wake this: watch its socket and close().
  Status receive(Message& out, std::chrono::nanoseconds timeout);

  // Writes one message on the completion ring, waiting for space until close() or `timeout`.
  // While it waits it rings the request ring's not_full bell, so a client blocked sending
  // requests wakes up and drains completions (neither side can wait on the other forever).
  // kDeinitialized after close(); kTimeout if the client left no room in time (a client that
  // stopped reading); kInvalidValue if the client corrupted the completion ring's consumer
  // position or the message exceeds max_message_bytes. A message of up to a quarter of the
  // completion ring is written whole or not at all. A larger message with a finite timeout is
  // refused (kInvalidValue) before anything is written: once started, a fragmented message
  // must be finished, which can mean waiting for the client as long as it takes.
  Status send(capnp::MessageBuilder& message,
              std::chrono::nanoseconds timeout = std::chrono::nanoseconds::max());

  // The largest message send() accepts with a finite timeout (it fits one ring record).
  uint64_t max_unfragmented_message_bytes() const;

  // Makes a receive() that is waiting (or the next one) return kNotReady at once, so the thread
  // serving the channel can attend to other work (completions posted from device callbacks).
  // Any thread.
  void interrupt();

  // The client's staging bytes before `end` are no longer needed. Positions only move forward;
  // a smaller value than the last one is ignored.
  void release_staging(uint64_t end);

  // The arena as mapped in this process. The client writes it concurrently: read each value
  // once, and treat it as untrusted.
  std::span<std::byte> arena() const { return {views_.arena, views_.arena_bytes}; }

  // Ends the channel: marks it closed in shared memory, wakes every waiter on both sides, and
  // makes later receive()/send() return kDeinitialized. Idempotent. Messages already on the
  // completion ring stay readable by the client (e.g. a final Closing message sent just before).
  void close();
  bool closed() const { return closed_.load(std::memory_order_acquire); }

 private:
  ServerChannel(UniqueFd memfd, std::byte* base, ChannelLayout layout);

  UniqueFd memfd_;
  std::byte* base_;
  ChannelLayout layout_;
  ChannelViews views_;
  std::atomic<bool> closed_{false};
  std::atomic<bool> interrupted_{false};
  RingConsumer requests_;
  std::mutex send_mutex_;
  RingProducer completions_;  // guarded by send_mutex_
  WordBuffer frame_table_;    // guarded by send_mutex_
  // Serialises release_staging, so the shared counter never moves backwards.
  std::mutex staging_mutex_;
  uint64_t staging_released_ = 0;  // guarded by staging_mutex_
};

}  // namespace hiber::wire
