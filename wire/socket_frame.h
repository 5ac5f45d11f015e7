// Framed messages on a stream socket (handshake and control): a 4-byte little-endian length,
// then one Cap'n Proto message in standard stream framing. The length counts the message only
// and is at most kMaxFrameBytes.
//
// encode_frame and FrameReader are I/O-free: hiberd feeds bytes from io_uring. send_frame and
// receive_frame are small blocking helpers for the client's handshake, tools and tests.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "common/unique_fd.h"
#include "wire/limits.h"
#include "wire/message.h"

namespace hiber::wire {

// Encodes a message as one frame. kInvalidValue if it would exceed `max_bytes` (kMaxFrameBytes
// for anything a client sends; hiberd's control replies may be larger, kMaxControlReplyBytes).
Result<std::vector<std::byte>> encode_frame(capnp::MessageBuilder& message,
                                            uint32_t max_bytes = kMaxFrameBytes);

// Accumulates stream bytes until one frame is complete.
class FrameReader {
 public:
  // Feeds bytes; returns how many were consumed (it stops at the end of a frame).
  size_t feed(std::span<const std::byte> bytes);

  // True when a frame is complete; its message is then in message().
  bool complete() const { return have_length_ && received_ == length_; }

  // A length prefix of 0 or above kMaxFrameBytes makes the stream unusable: the peer must be
  // disconnected with this error.
  const Status& error() const { return error_; }

  const Message& message() const { return message_; }

  // Starts over for the next frame.
  void reset();

 private:
  std::byte prefix_[4] = {};
  size_t prefix_received_ = 0;
  bool have_length_ = false;
  uint32_t length_ = 0;
  size_t received_ = 0;
  Message message_;
  Status error_;
};

// Writes all of `frame` to a stream socket, retrying partial writes and EINTR (and waiting if
// the socket is non-blocking), without SIGPIPE. When attach_fd >= 0 it travels with the frame's
// first byte (SCM_RIGHTS). kDeinitialized if the peer has closed; kOperatingSystem otherwise.
Status send_frame(int socket_fd, std::span<const std::byte> frame, int attach_fd = -1);

// Reads exactly one frame into `out`, waiting at most `timeout` for all of it. A file
// descriptor sent with the frame goes to *received_fd (close-on-exec; left invalid when none
// came, or closed when received_fd is null); any further descriptors are closed.
// kInvalidValue for a length prefix of 0 or above `max_bytes`, kDeinitialized if the peer
// closed the socket, kTimeout if the frame did not arrive in time, kOperatingSystem otherwise.
Status receive_frame(int socket_fd, Message& out, UniqueFd* received_fd,
                     std::chrono::milliseconds timeout, uint32_t max_bytes = kMaxFrameBytes);

// Sends `frame`, then receives the one-frame answer as receive_frame does. A peer may answer
// and close before it reads anything (hiberd refusing a connection at accept: a uid not
// allowed, too many waiting); the send then fails although the answer is in the socket, so
// the answer is read (for at most `timeout`) and returned instead of the send's error.
Status exchange_frame(int socket_fd, std::span<const std::byte> frame, Message& reply,
                      UniqueFd* received_fd, std::chrono::milliseconds timeout,
                      uint32_t max_bytes = kMaxFrameBytes);

// Connects a blocking Unix stream socket to `path`. kNoDevice (with "hiberd is not running")
// when nothing listens there; kInvalidValue for a path that cannot be a socket address. With a
// `timeout`, a listener whose queue stays full (a wedged hiberd that accepts nothing) makes it
// fail with kTimeout after that long instead of waiting for as long as the listener does.
Result<UniqueFd> connect_unix(const std::string& path,
                              std::optional<std::chrono::milliseconds> timeout = std::nullopt);

// Splits "host:port" (an IPv6 host in brackets: "[::1]:7070") into host and port. An empty host
// is allowed (":7070": every address, for a listener). kInvalidValue naming what is wrong.
struct HostPort {
  std::string host;
  uint16_t port = 0;
};
Result<HostPort> split_host_port(std::string_view address);

// Connects a blocking TCP socket (TCP_NODELAY: control requests are small and each waits for its
// answer) to `host` (a name, resolved with getaddrinfo, or a numeric address) and `port`, trying
// each address the name has until one answers within `timeout`. kNoDevice (with "hiberd is not
// running") when every address refuses; kTimeout when none answered in time; kInvalidValue for a
// name that does not resolve.
Result<UniqueFd> connect_tcp(const std::string& host, uint16_t port,
                             std::chrono::milliseconds timeout = std::chrono::seconds(10));

}  // namespace hiber::wire
