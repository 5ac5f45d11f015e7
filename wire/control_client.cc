#include "wire/control_client.h"

#include <sys/stat.h>

#include <cctype>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <optional>
#include <string_view>

#include <capnp/message.h>

#include "common/paths.h"
#include "wire/control_codec.h"
#include "wire/handshake.h"
#include "wire/limits.h"
#include "wire/socket_frame.h"
#include "wire/status_pages.h"

namespace hiber::wire {

Result<ControlClient> ControlClient::connect(const std::string& control_socket_path,
                                             std::chrono::milliseconds timeout) {
  return connect(control_socket_path, std::string(), timeout);
}

namespace {

constexpr std::string_view kTcp = "tcp:";
constexpr std::string_view kUnix = "unix:";

std::string unix_path(const std::string& address) {
  return address.starts_with(kUnix) ? address.substr(kUnix.size()) : address;
}

}  // namespace

Result<UniqueFd> ControlClient::open(const std::string& address,
                                     std::chrono::milliseconds timeout) {
  if (address.starts_with(kTcp)) {
    HIBER_ASSIGN_OR_RETURN(HostPort where, split_host_port(address.substr(kTcp.size())));
    if (where.host.empty() || where.port == 0) {
      return error(ErrorCode::kInvalidValue, "'", address, "': tcp: needs a host and a port");
    }
    return connect_tcp(where.host, where.port, timeout);
  }
  return connect_unix(unix_path(address));
}

Result<ControlClient> ControlClient::connect(const std::string& address, const std::string& token,
                                             std::chrono::milliseconds timeout) {
  std::string presented = token;
  if (!address.starts_with(kTcp)) {
    // No socket: hiberd is not running there, which says more than a missing token would.
    struct stat st {};
    const std::string socket = unix_path(address);
    if (::stat(socket.c_str(), &st) != 0 && errno == ENOENT) {
      return error(ErrorCode::kDeinitialized, "hiberd is not running at ", socket,
                   " (no socket there): start it, or point --run_dir or --control at it");
    }
  }
  if (presented.empty() && !address.starts_with(kTcp)) {
    const std::string file = control_token_path(unix_path(address));
    auto read = read_token_file(file);
    if (!read.ok()) {
      return read.status().with_context(
          "hiberd's control socket needs its control token (the file beside the socket, or "
          "--control_token_file)");
    }
    presented = std::move(read).value();
  }
  HIBER_ASSIGN_OR_RETURN(UniqueFd fd, open(address, timeout));
  return ControlClient(address, std::move(fd), std::move(presented), timeout);
}

Result<Message> ControlClient::exchange(control::RequestBody body) {
  Result<Message> reply = exchange_once(body);
  // hiberd closes control connections left idle (--control_idle_timeout_ms) without reading
  // what was sent after: such a request was never answered, nor acted on, so it is sent again
  // on a new connection.
  if (!reply.ok() && reply.status().code() == ErrorCode::kDeinitialized && used_) {
    used_ = false;
    HIBER_ASSIGN_OR_RETURN(fd_, open(address_, timeout_));
    reply = exchange_once(body);
  }
  return reply;
}

Result<Message> ControlClient::exchange_once(const control::RequestBody& body) {
  capnp::MallocMessageBuilder request;
  write_control_request(request.initRoot<proto::ControlRequest>(),
                        control::Request{current_protocol_version(), body, token_});
  HIBER_ASSIGN_OR_RETURN(std::vector<std::byte> frame, encode_frame(request));
  Message reply;
  HIBER_RETURN_IF_ERROR(
      exchange_frame(fd_.get(), frame, reply, nullptr, timeout_, kMaxControlReplyBytes));
  Status refused = read_message<proto::ControlReply>(
      reply, "control reply", [](proto::ControlReply::Reader r) -> Status {
        if (!r.isError()) return Status();
        return Status(static_cast<ErrorCode>(r.getError().getCode()), r.getError().getMessage());
      });
  // A refused client (a wrong token, a uid not allowed) was disconnected on purpose: asking
  // again would only be refused again.
  used_ = refused.code() != ErrorCode::kNotPermitted;
  if (!refused.ok()) return refused;
  return reply;
}

template <typename T>
Result<T> ControlClient::call(control::RequestBody body) {
  HIBER_ASSIGN_OR_RETURN(Message message, exchange(std::move(body)));
  Result<control::Reply> reply = Status(ErrorCode::kInvalidValue, "no control reply");
  HIBER_RETURN_IF_ERROR(read_message<proto::ControlReply>(
      message, "control reply", [&](proto::ControlReply::Reader r) -> Status {
        reply = read_control_reply(r);
        return Status();
      }));
  if (!reply.ok()) return reply.status();
  if (T* answer = std::get_if<T>(&*reply)) return std::move(*answer);
  return error(ErrorCode::kInvalidValue, "hiberd answered with reply kind ", reply->index(),
               " of control::Reply, not ", control::Reply(T{}).index());
}

Status ControlClient::ping() { return call<control::Pong>(control::Ping{}).status(); }

Status ControlClient::register_function(const FunctionRegistration& registration) {
  return call<control::Ok>(registration).status();
}

Status ControlClient::unregister_function(const std::string& function_id) {
  return call<control::Ok>(control::UnregisterFunction{function_id}).status();
}

Result<uint64_t> ControlClient::request_arrived(const std::string& function_id,
                                                const std::string& instance) {
  HIBER_ASSIGN_OR_RETURN(auto accepted,
                         call<control::Accepted>(control::RequestArrived{function_id, instance}));
  return accepted.request_id;
}

Result<Started> ControlClient::request_start(uint64_t request) {
  return call<Started>(control::RequestStart{request});
}

Result<Started> ControlClient::request_begin(const std::string& function_id,
                                            const std::string& instance) {
  return call<Started>(control::RequestBegin{function_id, instance});
}

Status ControlClient::request_done(uint64_t request, bool failed) {
  return call<control::Ok>(RequestDone{request, failed}).status();
}

Status ControlClient::drain(int gpu, bool resume) {
  return call<control::Ok>(Drain{gpu, resume}).status();
}

Result<Message> ControlClient::status() {
  std::vector<Message> pages;
  std::optional<uint64_t> offset = 0;
  while (offset) {
    HIBER_ASSIGN_OR_RETURN(Message page,
                           exchange(control::StatusQuery{*offset, kStatusPageFunctions}));
    HIBER_ASSIGN_OR_RETURN(offset, next_status_page(page));
    pages.push_back(std::move(page));
  }
  return merge_status_pages(pages);
}

Result<std::string> read_token_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) {
    return error(ErrorCode::kFileNotFound, "cannot read the control token file ", path, ": ",
                 std::strerror(errno));
  }
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return os_error("stat " + path, errno);
  if ((st.st_mode & (S_IROTH | S_IWOTH)) != 0) {
    return error(ErrorCode::kNotPermitted, "the control token file ", path, " has mode ", std::oct,
                 (st.st_mode & 07777), ": others may read or write it (chmod o-rw)");
  }
  std::string token;
  std::getline(in, token);
  while (!token.empty() && std::isspace(static_cast<unsigned char>(token.back()))) {
    token.pop_back();
  }
  if (token.empty()) {
    return error(ErrorCode::kInvalidValue, "the control token file ", path,
                 " is empty: its first line must hold the token");
  }
  return token;
}

}  // namespace hiber::wire
