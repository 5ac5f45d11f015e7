// A control request from socket bytes, read as hiberd's ControlService reads it (a FrameReader,
// then read_message<ControlRequest> and read_control_request, as ControlService::answer and
// check_token do), and the same frame read as a control reply, as ControlClient and hiberctl do.
//
// Promises checked: nothing crashes, leaks or hangs; a request or reply that decodes re-encodes
// (write_control_request / write_control_reply) to a message whose decoding encodes to the same
// bytes; an error reply is never a success (control::Reply's Status is "never ok").
#include <capnp/message.h>

#include "tests/fuzz/fuzz_frames.h"
#include "wire/control_codec.h"

namespace hiber {
namespace {

namespace proto = wire::proto;

// Encodes with the production writer and frames as a socket would carry it.
template <typename Root, typename T, typename Write>
wire::Message encoded(const T& value, Write write) {
  capnp::MallocMessageBuilder builder;
  write(builder.initRoot<Root>(), value);
  const std::vector<std::byte> bytes = wire::frame_bytes(builder);
  wire::Message message;
  auto out = message.resize(bytes.size());
  std::copy(bytes.begin(), bytes.end(), out.begin());
  return message;
}

Result<wire::control::Request> read_request(const wire::Message& frame) {
  Result<wire::control::Request> request = Status(ErrorCode::kInvalidValue, "no control request");
  HIBER_RETURN_IF_ERROR(wire::read_message<proto::ControlRequest>(
      frame, "control request", [&](proto::ControlRequest::Reader r) -> Status {
        request = wire::read_control_request(r);
        return Status();
      }));
  return request;
}

Result<wire::control::Reply> read_reply(const wire::Message& frame) {
  Result<wire::control::Reply> reply = Status(ErrorCode::kInvalidValue, "no control reply");
  HIBER_RETURN_IF_ERROR(wire::read_message<proto::ControlReply>(
      frame, "control reply", [&](proto::ControlReply::Reader r) -> Status {
        reply = wire::read_control_reply(r);
        return Status();
      }));
  return reply;
}

void check_request(const wire::Message& frame) {
  Result<wire::control::Request> request = read_request(frame);
  if (!request.ok()) return;
  const wire::Message once = encoded<proto::ControlRequest>(*request, wire::write_control_request);
  Result<wire::control::Request> back = read_request(once);
  CHECK(back.ok()) << "a re-encoded control request does not decode: " << back.status();
  const wire::Message twice = encoded<proto::ControlRequest>(*back, wire::write_control_request);
  CHECK(fuzz::same_bytes(once.bytes(), twice.bytes()))
      << "a control request changed through decode and encode";
}

void check_reply(const wire::Message& frame) {
  Result<wire::control::Reply> reply = read_reply(frame);
  if (!reply.ok()) return;
  if (const Status* refused = std::get_if<Status>(&*reply)) {
    CHECK(!refused->ok()) << "an error reply decoded as a success";
  }
  const wire::Message once = encoded<proto::ControlReply>(*reply, wire::write_control_reply);
  Result<wire::control::Reply> back = read_reply(once);
  CHECK(back.ok()) << "a re-encoded control reply does not decode: " << back.status();
  const wire::Message twice = encoded<proto::ControlReply>(*back, wire::write_control_reply);
  CHECK(fuzz::same_bytes(once.bytes(), twice.bytes()))
      << "a control reply changed through decode and encode";
}

}  // namespace
}  // namespace hiber

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  hiber::fuzz::quiet_logging();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  hiber::wire::FrameReader whole, pieces;
  const hiber::wire::Message* frame =
      hiber::fuzz::read_frame(hiber::fuzz::bytes_of(data, size), whole, pieces);
  if (frame == nullptr) return 0;
  hiber::check_request(*frame);
  hiber::check_reply(*frame);
  return 0;
}
