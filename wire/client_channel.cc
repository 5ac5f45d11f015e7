#include "wire/client_channel.h"

#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include <glog/logging.h>

#include "wire/socket_frame.h"

namespace hiber::wire {
namespace {

using Clock = std::chrono::steady_clock;

// The time left until `deadline`, saturating for "no deadline".
std::chrono::nanoseconds remaining(Clock::time_point deadline) {
  if (deadline == Clock::time_point::max()) return std::chrono::nanoseconds::max();
  return std::max(deadline - Clock::now(), Clock::duration::zero());
}

}  // namespace

Result<std::unique_ptr<ClientChannel>> ClientChannel::connect(const ClientOptions& options) {
  const auto deadline = Clock::now() + options.handshake_timeout;
  HIBER_ASSIGN_OR_RETURN(UniqueFd socket,
                         connect_unix(options.socket_path, options.handshake_timeout));
  const Hello hello{
      .version = current_protocol_version(),
      .function_id = options.function_id,
      .auth_token = options.auth_token,
      .requested_quota_bytes = options.requested_quota_bytes,
      .instance = options.instance,
      .resume_token = options.resume_token,
  };
  HIBER_ASSIGN_OR_RETURN(const std::vector<std::byte> hello_frame, encode_hello_frame(hello));
  Message reply;
  UniqueFd memfd;
  const Status exchanged =
      exchange_frame(socket.get(), hello_frame, reply, &memfd,
                     std::chrono::ceil<std::chrono::milliseconds>(remaining(deadline)));
  if (exchanged.code() == ErrorCode::kTimeout) {
    return error(ErrorCode::kTimeout, "hiberd at ", options.socket_path,
                 " accepted the connection but did not answer the hello within ",
                 options.handshake_timeout.count(), " ms");
  }
  HIBER_RETURN_IF_ERROR(exchanged.with_context("sending hello and waiting for hiberd's reply"));
  HIBER_ASSIGN_OR_RETURN(SessionInfo session, decode_hello_reply(reply));
  if (session.server_version.major != hello.version.major) {
    return error(ErrorCode::kNotSupported, "hiberd speaks protocol ", session.server_version.major,
                 ".", session.server_version.minor, "; this client speaks ", hello.version.major,
                 ".", hello.version.minor);
  }
  if (!memfd) {
    return Status(ErrorCode::kInvalidValue, "hiberd's welcome came without the channel memfd");
  }

  struct stat st {};
  if (::fstat(memfd.get(), &st) != 0) return os_error("fstat of the channel memfd");
  HIBER_RETURN_IF_ERROR(validate_layout(session.layout, static_cast<uint64_t>(st.st_size)));
  void* base = ::mmap(nullptr, session.layout.memfd_bytes, PROT_READ | PROT_WRITE, MAP_SHARED,
                      memfd.get(), 0);
  if (base == MAP_FAILED) return os_error("mmap of the channel");
  const auto* header = static_cast<const ChannelHeader*>(base);
  if (header->magic != kChannelMagic || header->layout_version != kChannelLayoutVersion) {
    const auto magic = header->magic;
    const auto version = header->layout_version;
    ::munmap(base, session.layout.memfd_bytes);
    return error(ErrorCode::kInvalidValue, "the channel memfd has magic ", magic, " and layout ",
                 "version ", version, "; expected ", kChannelMagic, " and ", kChannelLayoutVersion);
  }
  return std::unique_ptr<ClientChannel>(new ClientChannel(
      std::move(socket), std::move(memfd), static_cast<std::byte*>(base), std::move(session)));
}

ClientChannel::ClientChannel(UniqueFd socket, UniqueFd memfd, std::byte* base, SessionInfo session)
    : socket_(std::move(socket)),
      memfd_(std::move(memfd)),
      base_(base),
      session_(std::move(session)),
      views_(views_of(base, session_.layout)),
      requests_(views_.requests),
      completions_(views_.completions) {}

ClientChannel::~ClientChannel() {
  if (::munmap(base_, session_.layout.memfd_bytes) != 0) PLOG(ERROR) << "munmap of the channel";
  if (moved_arena_ && ::munmap(views_.arena, views_.arena_bytes) != 0) {
    PLOG(ERROR) << "munmap of the channel's arena";
  }
}

Status ClientChannel::move_arena(std::byte* at) {
  const uint64_t offset = session_.layout.arena_offset;
  const uint64_t bytes = views_.arena_bytes;
  if (moved_arena_ || offset % static_cast<uint64_t>(::sysconf(_SC_PAGESIZE)) != 0) {
    return Status(ErrorCode::kInvalidValue, "the arena cannot be moved");
  }
  void* mapped = ::mmap(at, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, memfd_.get(),
                        static_cast<off_t>(offset));
  if (mapped != at) {
    return error(ErrorCode::kOperatingSystem, "mapping the arena at ", static_cast<void*>(at),
                 ": ", std::strerror(errno));
  }
  views_.arena = at;
  moved_arena_ = true;
  return Status();
}

bool ClientChannel::server_closed() const {
  return views_.header->server_closed.load(std::memory_order_acquire) != 0;
}

bool ClientChannel::server_alive() {
  if (server_gone_) return false;
  pollfd p{.fd = socket_.get(), .events = POLLRDHUP, .revents = 0};
  const bool hung_up = ::poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR)) != 0;
  if (server_closed() || hung_up) server_gone_ = true;
  return !server_gone_;
}

void ClientChannel::drain_completions() {
  while (broken_.ok()) {
    Message message;
    Status status = completions_.try_read(message);
    if (status.code() == ErrorCode::kNotReady) return;
    if (!status.ok()) {
      broken_ = status;
      return;
    }
    pending_.push_back(std::move(message));
  }
}

Status ClientChannel::send(capnp::MessageBuilder& message) {
  const auto pieces = frame_pieces(message, frame_table_);
  return send_pieces(pieces);
}

Status ClientChannel::send_pieces(std::span<const std::span<const std::byte>> pieces) {
  HIBER_RETURN_IF_ERROR(broken_);
  if (server_gone_ || server_closed()) {
    server_gone_ = true;
    return Status(ErrorCode::kDeinitialized, "hiberd ended the session");
  }
  Status status = requests_.write(
      pieces, [this] { return broken_.ok() && !server_gone_ && !server_closed(); },
      [this] {
        drain_completions();
        server_alive();
      },
      [this] { return completions_.has_data(); });
  if (status.code() == ErrorCode::kDeinitialized) {
    HIBER_RETURN_IF_ERROR(broken_);
    server_gone_ = true;
    return Status(ErrorCode::kDeinitialized, "hiberd ended the session while a message was sent");
  }
  return status;
}

Status ClientChannel::take_last(Message& out) {
  Status status = completions_.try_read(out);
  if (status.ok()) return status;
  if (status.code() == ErrorCode::kInvalidValue) {
    broken_ = status;
    return status;
  }
  server_gone_ = true;
  return Status(ErrorCode::kDeinitialized, "hiberd ended the session");
}

Status ClientChannel::receive(Message& out, std::chrono::nanoseconds timeout) {
  if (!pending_.empty()) {
    std::swap(out, pending_.front());
    pending_.pop_front();
    return Status();
  }
  HIBER_RETURN_IF_ERROR(broken_);
  const auto deadline = doorbell_internal::deadline_after(Clock::now(), timeout);
  for (;;) {
    if (server_gone_) return take_last(out);
    const auto left = remaining(deadline);
    Status status = completions_.read(
        out, [this] { return server_closed(); },
        std::min<std::chrono::nanoseconds>(left, kAliveCheckInterval));
    switch (status.code()) {
      case ErrorCode::kSuccess: return status;
      case ErrorCode::kDeinitialized: return take_last(out);
      case ErrorCode::kTimeout:
        // A zero timeout is a poll of the ring: it should not cost a system call.
        if (left > std::chrono::nanoseconds::zero() && !server_alive()) return take_last(out);
        if (left <= kAliveCheckInterval) {
          return error(ErrorCode::kTimeout, "no completion within ",
                       std::chrono::duration_cast<std::chrono::milliseconds>(timeout).count(),
                       " ms");
        }
        break;
      default: broken_ = status; return status;
    }
  }
}

uint64_t ClientChannel::staging_released() const {
  return views_.header->staging_released.load(std::memory_order_acquire);
}

Status ClientChannel::wait_staging_released(uint64_t position, std::chrono::nanoseconds timeout) {
  const auto deadline = doorbell_internal::deadline_after(Clock::now(), timeout);
  const auto gone = [] { return Status(ErrorCode::kDeinitialized, "hiberd ended the session"); };
  for (;;) {
    if (server_gone_ && staging_released() < position) return gone();
    const auto left = remaining(deadline);
    switch (wait(
        views_.header->staging_bell, staging_spin_, [&] { return staging_released() >= position; },
        [this] { return server_closed(); },
        std::min<std::chrono::nanoseconds>(left, kAliveCheckInterval))) {
      case WaitResult::kReady: return Status();
      case WaitResult::kCancelled: server_gone_ = true; return gone();
      case WaitResult::kTimedOut:
        if (left > std::chrono::nanoseconds::zero() && !server_alive()) return gone();
        if (left <= kAliveCheckInterval) {
          return error(ErrorCode::kTimeout, "staging position ", position, " not released within ",
                       std::chrono::duration_cast<std::chrono::milliseconds>(timeout).count(),
                       " ms (released: ", staging_released(), ")");
        }
        break;
    }
  }
}

}  // namespace hiber::wire
