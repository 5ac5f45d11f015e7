#include "wire/socket_frame.h"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <charconv>
#include <cstring>

namespace hiber::wire {
namespace {

static_assert(std::endian::native == std::endian::little, "the length prefix is little-endian");

// SCM_RIGHTS room for a few descriptors: one is expected; more are read so they can be closed.
constexpr size_t kMaxReceivedFds = 8;

Status length_error(uint32_t length, uint32_t max_bytes) {
  return error(ErrorCode::kInvalidValue, "frame length ", length, " is not in [1, ", max_bytes,
               "]");
}

using Clock = std::chrono::steady_clock;

// Waits for `events` on fd until the deadline: true if ready, false on timeout.
Result<bool> poll_until(int fd, short events, Clock::time_point deadline) {
  for (;;) {
    const auto now = Clock::now();
    if (now >= deadline) return false;
    // Round up so we never wake a little early and report a timeout too soon.
    const auto ms = std::chrono::ceil<std::chrono::milliseconds>(deadline - now).count();
    pollfd p{.fd = fd, .events = events, .revents = 0};
    const int n = ::poll(&p, 1, static_cast<int>(std::min<int64_t>(ms, 1 << 30)));
    if (n > 0) return true;
    if (n < 0 && errno != EINTR) return os_error("poll");
  }
}

// Takes every descriptor out of the control messages: the first into *keep (when keep is
// non-null and still empty), the rest closed.
void collect_fds(msghdr& msg, UniqueFd* keep) {
  for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    const size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (size_t i = 0; i < count; ++i) {
      int fd;
      std::memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
      UniqueFd owned(fd);
      if (keep != nullptr && !keep->valid()) *keep = std::move(owned);
    }
  }
}

// Reads exactly bytes.size() bytes.
Status read_exact(int fd, std::span<std::byte> bytes, UniqueFd* received_fd,
                  Clock::time_point deadline, bool frame_started) {
  size_t done = 0;
  while (done < bytes.size()) {
    HIBER_ASSIGN_OR_RETURN(const bool ready, poll_until(fd, POLLIN, deadline));
    if (!ready) return Status(ErrorCode::kTimeout, "no complete frame in time");
    iovec iov{.iov_base = bytes.data() + done, .iov_len = bytes.size() - done};
    alignas(cmsghdr) char control[CMSG_SPACE(kMaxReceivedFds * sizeof(int))];
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control;
    msg.msg_controllen = sizeof(control);
    const ssize_t n = ::recvmsg(fd, &msg, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
    if (n < 0) {
      if (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK) continue;
      if (errno == ECONNRESET)
        return Status(ErrorCode::kDeinitialized, "the peer reset the socket");
      return os_error("recvmsg");
    }
    collect_fds(msg, received_fd);
    if (n == 0) {
      return Status(ErrorCode::kDeinitialized, frame_started || done > 0
                                                   ? "the peer closed the socket inside a frame"
                                                   : "the peer closed the socket");
    }
    done += static_cast<size_t>(n);
  }
  return Status();
}

}  // namespace

Result<std::vector<std::byte>> encode_frame(capnp::MessageBuilder& message, uint32_t max_bytes) {
  WordBuffer table;
  const auto pieces = frame_pieces(message, table);
  size_t length = 0;
  for (const auto& piece : pieces) length += piece.size();
  if (length > max_bytes) {
    return error(ErrorCode::kInvalidValue, "message of ", length, " bytes exceeds the ", max_bytes,
                 "-byte frame limit");
  }
  std::vector<std::byte> frame(sizeof(uint32_t));
  frame.reserve(sizeof(uint32_t) + length);
  const auto prefix = static_cast<uint32_t>(length);
  std::memcpy(frame.data(), &prefix, sizeof(prefix));
  for (const auto& piece : pieces) frame.insert(frame.end(), piece.begin(), piece.end());
  return frame;
}

size_t FrameReader::feed(std::span<const std::byte> bytes) {
  if (!error_.ok() || complete()) return 0;
  size_t used = 0;
  if (!have_length_) {
    const size_t n = std::min(bytes.size(), sizeof(prefix_) - prefix_received_);
    std::memcpy(prefix_ + prefix_received_, bytes.data(), n);
    prefix_received_ += n;
    used = n;
    if (prefix_received_ < sizeof(prefix_)) return used;
    std::memcpy(&length_, prefix_, sizeof(length_));
    if (length_ == 0 || length_ > kMaxFrameBytes) {
      error_ = length_error(length_, kMaxFrameBytes);
      return used;
    }
    have_length_ = true;
    message_.resize(length_);
  }
  const size_t n = std::min(bytes.size() - used, size_t{length_} - received_);
  // resize() to the same length keeps what arrived so far and gives write access.
  std::memcpy(message_.resize(length_).data() + received_, bytes.data() + used, n);
  received_ += n;
  return used + n;
}

void FrameReader::reset() {
  prefix_received_ = 0;
  have_length_ = false;
  length_ = 0;
  received_ = 0;
  error_ = Status();
}

Status send_frame(int socket_fd, std::span<const std::byte> frame, int attach_fd) {
  if (frame.empty()) return Status(ErrorCode::kInvalidValue, "cannot send an empty frame");
  size_t sent = 0;
  bool attach = attach_fd >= 0;
  while (sent < frame.size()) {
    iovec iov{.iov_base = const_cast<std::byte*>(frame.data() + sent),
              .iov_len = frame.size() - sent};
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    if (attach) {
      msg.msg_control = control;
      msg.msg_controllen = sizeof(control);
      cmsghdr* c = CMSG_FIRSTHDR(&msg);
      c->cmsg_level = SOL_SOCKET;
      c->cmsg_type = SCM_RIGHTS;
      c->cmsg_len = CMSG_LEN(sizeof(int));
      std::memcpy(CMSG_DATA(c), &attach_fd, sizeof(int));
    }
    const ssize_t n = ::sendmsg(socket_fd, &msg, MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        pollfd p{.fd = socket_fd, .events = POLLOUT, .revents = 0};
        if (::poll(&p, 1, -1) < 0 && errno != EINTR) return os_error("poll");
        continue;
      }
      if (errno == EPIPE || errno == ECONNRESET) {
        return Status(ErrorCode::kDeinitialized, "the peer closed the socket");
      }
      return os_error("sendmsg");
    }
    // The descriptor went with the first byte that was accepted.
    if (n > 0) attach = false;
    sent += static_cast<size_t>(n);
  }
  return Status();
}

Status receive_frame(int socket_fd, Message& out, UniqueFd* received_fd,
                     std::chrono::milliseconds timeout, uint32_t max_bytes) {
  if (received_fd != nullptr) received_fd->reset();
  const auto deadline = Clock::now() + timeout;
  uint32_t length = 0;
  HIBER_RETURN_IF_ERROR(read_exact(socket_fd, std::as_writable_bytes(std::span(&length, 1)),
                                   received_fd, deadline, false));
  if (length == 0 || length > max_bytes) return length_error(length, max_bytes);
  return read_exact(socket_fd, out.resize(length), received_fd, deadline, true);
}

Status exchange_frame(int socket_fd, std::span<const std::byte> frame, Message& reply,
                      UniqueFd* received_fd, std::chrono::milliseconds timeout,
                      uint32_t max_bytes) {
  const Status sent = send_frame(socket_fd, frame);
  if (!sent.ok() && sent.code() != ErrorCode::kDeinitialized) return sent;
  const Status got = receive_frame(socket_fd, reply, received_fd, timeout, max_bytes);
  if (!sent.ok() && !got.ok()) return sent;
  return got;
}

namespace {

// The kernel bounds a blocking connect's wait for room in the listener's queue by the socket's
// send timeout (a non-blocking connect to a full Unix listener fails with EAGAIN at once, and
// poll cannot wait for room), so the deadline is given as SO_SNDTIMEO; 0 means no limit.
Status set_send_timeout(int fd, std::chrono::microseconds timeout) {
  const timeval tv{.tv_sec = static_cast<time_t>(timeout.count() / 1000000),
                   .tv_usec = static_cast<suseconds_t>(timeout.count() % 1000000)};
  if (::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv)) != 0) {
    return error(ErrorCode::kOperatingSystem, "setsockopt(SO_SNDTIMEO): ", std::strerror(errno));
  }
  return Status();
}

}  // namespace

Result<UniqueFd> connect_unix(const std::string& path,
                              std::optional<std::chrono::milliseconds> timeout) {
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  if (path.empty() || path.size() >= sizeof(address.sun_path)) {
    return error(ErrorCode::kInvalidValue, "socket path '", path, "' is empty or longer than ",
                 sizeof(address.sun_path) - 1, " bytes");
  }
  std::memcpy(address.sun_path, path.data(), path.size());
  UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd) return error(ErrorCode::kOperatingSystem, "socket: ", std::strerror(errno));
  const auto deadline = timeout ? Clock::now() + *timeout : Clock::time_point::max();
  int rc = -1;
  do {
    if (timeout) {
      const auto left = std::chrono::ceil<std::chrono::microseconds>(deadline - Clock::now());
      if (left.count() <= 0) {
        errno = EAGAIN;
        break;
      }
      HIBER_RETURN_IF_ERROR(set_send_timeout(fd.get(), left));
    }
    rc = ::connect(fd.get(), reinterpret_cast<const sockaddr*>(&address), sizeof(address));
  } while (rc != 0 && errno == EINTR);
  if (rc != 0) {
    if (errno == ECONNREFUSED || errno == ENOENT) {
      return error(ErrorCode::kNoDevice, "hiberd is not running at ", path, ": ",
                   std::strerror(errno));
    }
    if (errno == EAGAIN && timeout) {
      return error(ErrorCode::kTimeout, "hiberd at ", path, " accepted no connection within ",
                   timeout->count(), " ms (its listen queue stayed full)");
    }
    return error(ErrorCode::kOperatingSystem, "connect to ", path, ": ", std::strerror(errno));
  }
  // The send timeout was for the connect only: later sends block as the callers expect.
  if (timeout) HIBER_RETURN_IF_ERROR(set_send_timeout(fd.get(), std::chrono::microseconds(0)));
  return fd;
}

Result<HostPort> split_host_port(std::string_view address) {
  const size_t colon = address.rfind(':');
  if (colon == std::string_view::npos) {
    return error(ErrorCode::kInvalidValue, "'", address, "' is not host:port");
  }
  std::string_view host = address.substr(0, colon);
  const std::string_view port = address.substr(colon + 1);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  } else if (host.find(':') != std::string_view::npos) {
    return error(ErrorCode::kInvalidValue, "'", address,
                 "': an IPv6 address goes in brackets, as [::1]:7070");
  }
  HostPort out{std::string(host), 0};
  const auto [end, ec] = std::from_chars(port.data(), port.data() + port.size(), out.port);
  if (port.empty() || ec != std::errc() || end != port.data() + port.size()) {
    return error(ErrorCode::kInvalidValue, "'", address,
                 "': the port must be a number in [0, 65535]");
  }
  return out;
}

namespace {

// One connection attempt to `ai` that gives up at `deadline`. *refused tells whether the peer
// refused (nothing listens there).
Result<UniqueFd> connect_one(const addrinfo& ai, Clock::time_point deadline, bool* refused) {
  *refused = false;
  UniqueFd fd(
      ::socket(ai.ai_family, ai.ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, ai.ai_protocol));
  if (!fd) return os_error("socket");
  if (::connect(fd.get(), ai.ai_addr, ai.ai_addrlen) != 0) {
    if (errno != EINPROGRESS) {
      *refused = errno == ECONNREFUSED;
      return os_error("connect", errno);
    }
    HIBER_ASSIGN_OR_RETURN(bool ready, poll_until(fd.get(), POLLOUT, deadline));
    if (!ready) return Status(ErrorCode::kTimeout, "no answer");
    int so_error = 0;
    socklen_t length = sizeof so_error;
    if (::getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &so_error, &length) != 0) {
      return os_error("getsockopt", errno);
    }
    if (so_error != 0) {
      *refused = so_error == ECONNREFUSED;
      return os_error("connect", so_error);
    }
  }
  // Blocking from now on, as the frame helpers expect of a client's socket.
  const int flags = ::fcntl(fd.get(), F_GETFL);
  if (flags < 0 || ::fcntl(fd.get(), F_SETFL, flags & ~O_NONBLOCK) != 0) {
    return os_error("fcntl", errno);
  }
  const int one = 1;
  if (::setsockopt(fd.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof one) != 0) {
    return os_error("setsockopt TCP_NODELAY", errno);
  }
  return fd;
}

}  // namespace

Result<UniqueFd> connect_tcp(const std::string& host, uint16_t port,
                             std::chrono::milliseconds timeout) {
  const std::string where = host + ":" + std::to_string(port);
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV | AI_ADDRCONFIG;
  addrinfo* found = nullptr;
  const int rc = ::getaddrinfo(host.empty() ? nullptr : host.c_str(), std::to_string(port).c_str(),
                               &hints, &found);
  if (rc != 0) {
    return error(ErrorCode::kInvalidValue, "cannot resolve ", where, ": ", ::gai_strerror(rc));
  }
  const auto deadline = Clock::now() + timeout;
  Status last(ErrorCode::kInvalidValue, "no address");
  bool all_refused = true;
  for (addrinfo* ai = found; ai != nullptr; ai = ai->ai_next) {
    bool refused = false;
    auto fd = connect_one(*ai, deadline, &refused);
    if (fd.ok()) {
      ::freeaddrinfo(found);
      return fd;
    }
    last = fd.status();
    all_refused = all_refused && refused;
    if (last.code() == ErrorCode::kTimeout) break;
  }
  ::freeaddrinfo(found);
  if (last.code() == ErrorCode::kTimeout) {
    return error(ErrorCode::kTimeout, "connect to ", where, ": no answer within ", timeout.count(),
                 " ms");
  }
  if (all_refused) {
    return error(ErrorCode::kNoDevice, "hiberd is not running at ", where, ": ", last.message());
  }
  return last.with_context("connect to " + where);
}

}  // namespace hiber::wire
