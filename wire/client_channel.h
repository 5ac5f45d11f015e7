// The client's end of a channel: connects to hiberd, performs the handshake, maps the memfd,
// sends batches and receives completions.
//
// This is the transport only. The CUDA shim (client_shim/) decides what to put in batches and
// when to flush; tools and tests use it directly.
//
// Thread safety: one thread at a time (callers serialise, as the shim does with its lock).
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "common/node_config.h"
#include "common/status.h"
#include "common/unique_fd.h"
#include "wire/channel_layout.h"
#include "wire/handshake.h"
#include "wire/message.h"
#include "wire/ring.h"

namespace hiber::wire {

struct ClientOptions {
  std::string socket_path;  // hiberd's function socket
  std::string function_id;
  std::string auth_token;
  uint64_t requested_quota_bytes = 0;  // 0 = the server's default
  std::string instance;                // which of the function's instances this is; "": none
  std::string resume_token;            // the session to resume (SessionInfo::resume_token); "": new
  // The deadline for connecting and for hiberd's answer to the Hello (kTimeout after it).
  // hiberd answers once the session exists, which on a node busy opening many sessions takes
  // seconds; a hiberd that dies closes the socket and ends the wait at once, so only a wedged
  // one (its listen queue full, or silent after accepting) meets this limit.
  std::chrono::milliseconds handshake_timeout{60000};
};

class ClientChannel {
 public:
  // Connects, says Hello and maps the channel. A Rejection comes back as its code and message;
  // a malformed reply or layout as kInvalidValue; an unreachable server as kNoDevice.
  static Result<std::unique_ptr<ClientChannel>> connect(const ClientOptions& options);
  ~ClientChannel();

  ClientChannel(const ClientChannel&) = delete;
  ClientChannel& operator=(const ClientChannel&) = delete;

  const SessionInfo& session() const { return session_; }

  // Sends one message on the request ring. While the ring is full it drains the completion
  // ring into an internal queue, so neither side can wait on the other forever.
  // kDeinitialized if the server went away (noticed within kAliveCheckInterval);
  // kInvalidValue if the message is too large, or the server's side of the rings is corrupt
  // (sticky: every later call fails the same way).
  Status send(capnp::MessageBuilder& message);
  Status send_pieces(std::span<const std::span<const std::byte>> pieces);

  // Takes the next completion message (from the internal queue first), waiting up to `timeout`.
  // kTimeout if none came; kDeinitialized if the server ended the session or died, once every
  // message it sent before has been taken. A zero timeout only looks at the ring: it notices a
  // close() but not a crashed server (that costs a poll() of the socket, done by waiting calls).
  Status receive(Message& out, std::chrono::nanoseconds timeout);

  // The arena as mapped in this process.
  std::span<std::byte> arena() const { return {views_.arena, views_.arena_bytes}; }
  // Maps the arena at `at` as well (MAP_FIXED: what was there goes), and arena() is there from
  // now on: a resumed session's arena takes the lost one's place, so pointers into it stay good.
  Status move_arena(std::byte* at);

  // The server's staging_released counter, and a wait for it to reach `position`
  // (kTimeout, or kDeinitialized if the server is gone first).
  uint64_t staging_released() const;
  Status wait_staging_released(uint64_t position, std::chrono::nanoseconds timeout);

  // False once the server closed the session or its socket went away. Costs a poll() call.
  bool server_alive();
  // The session's socket: it hangs up when hiberd goes away (for a thread that waits for that).
  int socket_fd() const { return socket_.get(); }

  // How often a waiting client checks that the server's socket is still open: a server that
  // dies without closing the channel is noticed within this time.
  static constexpr std::chrono::milliseconds kAliveCheckInterval{50};

 private:
  ClientChannel(UniqueFd socket, UniqueFd memfd, std::byte* base, SessionInfo session);
  // The server's flag in shared memory (one load; for spin predicates).
  bool server_closed() const;
  // Moves every complete completion message into pending_; a corrupt ring breaks the channel.
  void drain_completions();
  // After the server is gone: a message it left on the ring, or kDeinitialized.
  Status take_last(Message& out);

  UniqueFd socket_;
  UniqueFd memfd_;
  std::byte* base_;
  SessionInfo session_;
  ChannelViews views_;
  RingProducer requests_;
  RingConsumer completions_;
  std::deque<Message> pending_;
  WordBuffer frame_table_;
  AdaptiveSpin staging_spin_;
  bool server_gone_ = false;
  bool moved_arena_ = false;  // views_.arena is a mapping of its own (move_arena)
  Status broken_;  // sticky: a corrupt completion ring
};

}  // namespace hiber::wire
