#include "wire/control_client.h"

#include <capnp/message.h>

#include "wire/control_codec.h"
#include "wire/handshake.h"
#include "wire/limits.h"
#include "wire/socket_frame.h"

namespace hiber::wire {

Result<ControlClient> ControlClient::connect(const std::string& control_socket_path,
                                             std::chrono::milliseconds timeout) {
  HIBER_ASSIGN_OR_RETURN(UniqueFd fd, connect_unix(control_socket_path));
  return ControlClient(std::move(fd), timeout);
}

Result<Message> ControlClient::exchange(control::RequestBody body) {
  capnp::MallocMessageBuilder request;
  write_control_request(request.initRoot<proto::ControlRequest>(),
                        control::Request{current_protocol_version(), std::move(body)});
  HIBER_ASSIGN_OR_RETURN(std::vector<std::byte> frame, encode_frame(request));
  Message reply;
  HIBER_RETURN_IF_ERROR(
      exchange_frame(fd_.get(), frame, reply, nullptr, timeout_, kMaxControlReplyBytes));
  Status refused = read_message<proto::ControlReply>(
      reply, "control reply", [](proto::ControlReply::Reader r) -> Status {
        if (!r.isError()) return Status();
        return Status(static_cast<ErrorCode>(r.getError().getCode()), r.getError().getMessage());
      });
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

Result<uint64_t> ControlClient::request_arrived(const std::string& function_id) {
  HIBER_ASSIGN_OR_RETURN(auto accepted,
                         call<control::Accepted>(control::RequestArrived{function_id}));
  return accepted.request_id;
}

Result<Started> ControlClient::request_start(uint64_t request) {
  return call<Started>(control::RequestStart{request});
}

Status ControlClient::request_done(uint64_t request, bool failed) {
  return call<control::Ok>(RequestDone{request, failed}).status();
}

Status ControlClient::drain(int gpu, bool resume) {
  return call<control::Ok>(Drain{gpu, resume}).status();
}

Result<Message> ControlClient::status() { return exchange(control::StatusQuery{}); }

}  // namespace hiber::wire
