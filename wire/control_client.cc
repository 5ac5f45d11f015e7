#include "wire/control_client.h"

#include <capnp/message.h>

#include "wire/handshake.h"
#include "wire/limits.h"
#include "wire/schema/control.capnp.h"
#include "wire/socket_frame.h"

namespace hiber::wire {

Result<ControlClient> ControlClient::connect(const std::string& control_socket_path,
                                             std::chrono::milliseconds timeout) {
  HIBER_ASSIGN_OR_RETURN(UniqueFd fd, connect_unix(control_socket_path));
  return ControlClient(std::move(fd), timeout);
}

// Sends the request `fill` builds and returns the reply, or hiberd's error as a Status.
template <typename Fill>
Result<Message> ControlClient::call(Fill&& fill) {
  capnp::MallocMessageBuilder request;
  auto root = request.initRoot<proto::ControlRequest>();
  const ProtocolVersion version = current_protocol_version();
  root.initVersion().setMajor(version.major);
  root.getVersion().setMinor(version.minor);
  fill(root);
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

namespace {

// Reads a reply expected to be of kind `which`.
template <typename Read>
Status read_reply(const Message& reply, proto::ControlReply::Which which, Read&& read) {
  return read_message<proto::ControlReply>(
      reply, "control reply", [&](proto::ControlReply::Reader r) -> Status {
        if (r.which() != which) {
          return error(ErrorCode::kInvalidValue, "hiberd answered with reply kind ",
                       static_cast<unsigned>(r.which()), ", not ", static_cast<unsigned>(which));
        }
        return read(r);
      });
}

Status expect_ok(const Result<Message>& reply) {
  if (!reply.ok()) return reply.status();
  return read_reply(*reply, proto::ControlReply::OK, [](auto) { return Status(); });
}

}  // namespace

Status ControlClient::ping() {
  auto reply = call([](proto::ControlRequest::Builder r) { r.setPing(); });
  if (!reply.ok()) return reply.status();
  return read_reply(*reply, proto::ControlReply::PONG, [](auto) { return Status(); });
}

Status ControlClient::register_function(const FunctionRegistration& f) {
  return expect_ok(call([&](proto::ControlRequest::Builder r) {
    auto out = r.initRegisterFunction();
    out.setFunctionId(f.function_id);
    out.setSloMs(f.slo_ms);
    out.setTailPercentile(f.tail_percentile);
    out.setQuotaBytes(f.quota_bytes);
    out.setStateful(f.stateful);
    out.setHeavyHint(!f.heavy ? proto::Heaviness::UNKNOWN
                              : (*f.heavy ? proto::Heaviness::HEAVY : proto::Heaviness::LIGHT));
    out.setExecMsHint(f.exec_ms_hint);
  }));
}

Status ControlClient::unregister_function(const std::string& function_id) {
  return expect_ok(
      call([&](proto::ControlRequest::Builder r) { r.setUnregisterFunction(function_id); }));
}

Result<uint64_t> ControlClient::request_arrived(const std::string& function_id) {
  auto reply = call([&](proto::ControlRequest::Builder r) { r.setRequestArrived(function_id); });
  if (!reply.ok()) return reply.status();
  uint64_t id = 0;
  HIBER_RETURN_IF_ERROR(read_reply(*reply, proto::ControlReply::ACCEPTED, [&](auto r) {
    id = r.getAccepted();
    return Status();
  }));
  return id;
}

Result<Started> ControlClient::request_start(uint64_t request) {
  auto reply = call([&](proto::ControlRequest::Builder r) { r.setRequestStart(request); });
  if (!reply.ok()) return reply.status();
  Started started;
  HIBER_RETURN_IF_ERROR(read_reply(*reply, proto::ControlReply::STARTED, [&](auto r) {
    auto s = r.getStarted();
    started.gpu = static_cast<int>(s.getGpu());
    started.source = s.getSource().cStr();
    started.source_gpu = s.getSourceGpu();
    started.rule = s.getRule().cStr();
    started.queued_ms = s.getQueuedMs();
    return Status();
  }));
  return started;
}

Status ControlClient::request_done(uint64_t request, bool failed) {
  return expect_ok(call([&](proto::ControlRequest::Builder r) {
    auto done = r.initRequestDone();
    done.setRequestId(request);
    done.setFailed(failed);
  }));
}

Status ControlClient::drain(int gpu, bool resume) {
  return expect_ok(call([&](proto::ControlRequest::Builder r) {
    auto d = r.initDrain();
    d.setGpu(gpu);
    d.setResume(resume);
  }));
}

Result<Message> ControlClient::status() {
  return call([](proto::ControlRequest::Builder r) { r.setStatus(); });
}

}  // namespace hiber::wire
