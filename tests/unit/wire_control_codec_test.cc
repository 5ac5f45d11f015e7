// The control messages' typed structs round-trip through Cap'n Proto.
#include "wire/control_codec.h"

#include <capnp/message.h>
#include <gtest/gtest.h>

#include <span>

#include "wire/handshake.h"
#include "wire/message.h"
#include "wire/socket_frame.h"

namespace hiber::wire {
namespace {

control::Request round_trip(control::RequestBody body) {
  capnp::MallocMessageBuilder message;
  auto root = message.initRoot<proto::ControlRequest>();
  write_control_request(root, control::Request{ProtocolVersion{1, 2}, std::move(body)});
  auto read = read_control_request(root.asReader());
  EXPECT_TRUE(read.ok()) << read.status();
  return *read;
}

control::Reply round_trip(const control::Reply& reply) {
  capnp::MallocMessageBuilder message;
  auto root = message.initRoot<proto::ControlReply>();
  write_control_reply(root, reply);
  auto read = read_control_reply(root.asReader());
  EXPECT_TRUE(read.ok()) << read.status();
  return *read;
}

TEST(ControlCodec, RequestsRoundTrip) {
  const control::Request registered = round_trip(FunctionRegistration{.function_id = "resnet",
                                                                      .slo_ms = 80,
                                                                      .tail_percentile = 0.99,
                                                                      .quota_bytes = 1 << 20,
                                                                      .stateful = true,
                                                                      .heavy = false,
                                                                      .exec_ms_hint = 12});
  EXPECT_EQ(registered.version.major, 1);
  EXPECT_EQ(registered.version.minor, 2);
  const auto* f = std::get_if<FunctionRegistration>(&registered.body);
  ASSERT_NE(f, nullptr);
  EXPECT_EQ(f->function_id, "resnet");
  EXPECT_EQ(f->slo_ms, 80);
  EXPECT_EQ(f->tail_percentile, 0.99);
  EXPECT_EQ(f->quota_bytes, 1u << 20);
  EXPECT_TRUE(f->stateful);
  EXPECT_EQ(f->heavy, std::optional<bool>(false));
  EXPECT_EQ(f->exec_ms_hint, 12);

  const auto unknown_heaviness = round_trip(FunctionRegistration{.function_id = "x"});
  EXPECT_FALSE(std::get<FunctionRegistration>(unknown_heaviness.body).heavy.has_value());

  const auto done = round_trip(RequestDone{.request_id = 9, .failed = true});
  EXPECT_EQ(std::get<RequestDone>(done.body).request_id, 9u);
  EXPECT_TRUE(std::get<RequestDone>(done.body).failed);

  const auto drain = round_trip(Drain{.gpu = 3, .resume = true});
  EXPECT_EQ(std::get<Drain>(drain.body).gpu, 3);
  EXPECT_TRUE(std::get<Drain>(drain.body).resume);

  EXPECT_EQ(std::get<control::RequestStart>(round_trip(control::RequestStart{5}).body).request_id,
            5u);
  EXPECT_EQ(
      std::get<control::RequestArrived>(round_trip(control::RequestArrived{"f"}).body).function_id,
      "f");
  EXPECT_EQ(
      std::get<control::RequestArrived>(round_trip(control::RequestArrived{"f"}).body).instance,
      "");
  const auto begun = round_trip(control::RequestBegin{"g", "4711.3"});
  EXPECT_EQ(std::get<control::RequestBegin>(begun.body).function_id, "g");
  EXPECT_EQ(std::get<control::RequestBegin>(begun.body).instance, "4711.3");
  EXPECT_EQ(std::get<control::RequestBegin>(round_trip(control::RequestBegin{"g"}).body).instance,
            "");
  const auto arrived = round_trip(control::RequestArrived{"f", "4711.2"});
  EXPECT_EQ(std::get<control::RequestArrived>(arrived.body).function_id, "f");
  EXPECT_EQ(std::get<control::RequestArrived>(arrived.body).instance, "4711.2");
  EXPECT_TRUE(
      std::holds_alternative<control::StatusQuery>(round_trip(control::StatusQuery{}).body));
  const auto page =
      std::get<control::StatusQuery>(round_trip(control::StatusQuery{4500, 1000}).body);
  EXPECT_EQ(page.function_offset, 4500u);
  EXPECT_EQ(page.function_limit, 1000u);
}

TEST(ControlCodec, AStatusRequestBefore15AsksForEveryFunction) {
  capnp::MallocMessageBuilder message;
  auto root = message.initRoot<proto::ControlRequest>();
  root.setStatus();  // as a 1.4 client builds it
  auto read = read_control_request(root.asReader());
  ASSERT_TRUE(read.ok()) << read.status();
  const auto& query = std::get<control::StatusQuery>(read->body);
  EXPECT_EQ(query.function_offset, 0u);
  EXPECT_EQ(query.function_limit, 0u);
}

TEST(ControlCodec, DrainDefaultsToTheWholeNode) {
  capnp::MallocMessageBuilder message;
  auto root = message.initRoot<proto::ControlRequest>();
  root.initDrain();
  auto read = read_control_request(root.asReader());
  ASSERT_TRUE(read.ok());
  EXPECT_EQ(std::get<Drain>(read->body).gpu, -1);
}

TEST(ControlCodec, TheTokenTravelsWithEveryKindOfRequest) {
  for (control::RequestBody body :
       {control::RequestBody(control::Ping{}), control::RequestBody(control::StatusQuery{}),
        control::RequestBody(control::RequestStart{3}), control::RequestBody(Drain{}),
        control::RequestBody(control::RequestBegin{"f"})}) {
    capnp::MallocMessageBuilder message;
    auto root = message.initRoot<proto::ControlRequest>();
    write_control_request(root, control::Request{ProtocolVersion{1, 4}, body, "s3cret\x01"});
    // As the schema has it, not only as our reader reads it back.
    EXPECT_EQ(std::string(root.asReader().getToken().cStr()), "s3cret\x01");
    auto read = read_control_request(root.asReader());
    ASSERT_TRUE(read.ok()) << read.status();
    EXPECT_EQ(read->token, "s3cret\x01");
    EXPECT_EQ(read->body.index(), body.index());
  }
}

// A NUL inside an id or a token is kept, so the id's check refuses it rather than acting on the
// part before the NUL (found by fuzz_control_request).
TEST(ControlCodec, TextWithANulByteIsReadWhole) {
  const std::string id("a\0b", 3);
  capnp::MallocMessageBuilder message;
  auto root = message.initRoot<proto::ControlRequest>();
  root.setRequestArrived(capnp::Text::Reader(id.data(), id.size()));
  root.setToken(capnp::Text::Reader(id.data(), id.size()));
  auto read = read_control_request(root.asReader());
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->token, id);
  const auto* arrived = std::get_if<control::RequestArrived>(&read->body);
  ASSERT_NE(arrived, nullptr);
  EXPECT_EQ(arrived->function_id, id);
  EXPECT_FALSE(check_function_id(arrived->function_id, "requestArrived").ok());
  // Written back whole too, so a request is a fixed point of reading and writing.
  capnp::MallocMessageBuilder again;
  auto written = again.initRoot<proto::ControlRequest>();
  write_control_request(written, *read);
  EXPECT_EQ(written.asReader().getRequestArrived().size(), id.size());
  EXPECT_EQ(written.asReader().getToken().size(), id.size());
}

TEST(ControlCodec, ARequestWithoutATokenReadsAsAnEmptyOne) {
  // What a client older than the token field sends: no token at all.
  capnp::MallocMessageBuilder message;
  auto root = message.initRoot<proto::ControlRequest>();
  root.setPing();
  EXPECT_FALSE(root.asReader().hasToken());
  auto read = read_control_request(root.asReader());
  ASSERT_TRUE(read.ok());
  EXPECT_EQ(read->token, "");
  // And an empty token is not written at all.
  capnp::MallocMessageBuilder empty;
  auto written = empty.initRoot<proto::ControlRequest>();
  write_control_request(written, control::Request{ProtocolVersion{1, 4}, control::Ping{}});
  EXPECT_FALSE(written.asReader().hasToken());
}

TEST(ControlCodec, RepliesRoundTrip) {
  const auto started = round_trip(control::Reply(Started{.gpu = 2,
                                                         .source = "peer",
                                                         .source_gpu = 1,
                                                         .rule = "r",
                                                         .queued_ms = 3.5,
                                                         .link = "nvlink"}));
  const auto& s = std::get<Started>(started);
  EXPECT_EQ(s.gpu, 2);
  EXPECT_EQ(s.source, "peer");
  EXPECT_EQ(s.source_gpu, 1);
  EXPECT_EQ(s.rule, "r");
  EXPECT_EQ(s.queued_ms, 3.5);
  EXPECT_EQ(s.link, "nvlink");

  const auto accepted = round_trip(control::Reply(control::Accepted{7}));
  EXPECT_EQ(std::get<control::Accepted>(accepted).request_id, 7u);
  const auto refused = round_trip(control::Reply(Status(ErrorCode::kNotFound, "no such function")));
  EXPECT_EQ(std::get<Status>(refused).code(), ErrorCode::kNotFound);
  EXPECT_EQ(std::get<Status>(refused).message(), "no such function");
}

TEST(ControlCodec, AStatusReplyIsNotAShortAnswer) {
  capnp::MallocMessageBuilder message;
  auto root = message.initRoot<proto::ControlReply>();
  root.initStatus();
  EXPECT_EQ(read_control_reply(root.asReader()).status().code(), ErrorCode::kInvalidValue);
}

TEST(ControlCodec, AnErrorReplyWithCodeZeroIsRefused) {
  capnp::MallocMessageBuilder message;
  auto error = message.initRoot<proto::ControlReply>().initError();
  error.setCode(0);
  error.setMessage("fine");
  const auto read = read_control_reply(message.getRoot<proto::ControlReply>().asReader());
  EXPECT_EQ(read.status().code(), ErrorCode::kInvalidValue);
  EXPECT_NE(read.status().message().find("code 0"), std::string::npos) << read.status();
}

// The frame fuzz_control_request found (tests/fuzz): an error reply with code 0, which read as
// a control::Reply holding a successful Status, although an error answer is never a success.
TEST(ControlCodec, FuzzFoundErrorReplyWithCodeZero) {
  const uint8_t input[] = {
      0x50, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x09, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
      0x00, 0x02, 0x00, 0x01, 0x00, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
      0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
      0x00, 0x00, 0x00, 0x00, 0x00, 0x14, 0x40, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
      0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x00,
      0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01, 0x00, 0x02, 0x00,
      0xf4, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x05, 0x00, 0x00, 0x00, 0x82, 0x00, 0x00,
      0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x6e, 0x6f, 0x20, 0x66, 0x75, 0x6e,
      0x63, 0x74, 0x69, 0x6f, 0x6e, 0x20, 0x27, 0x78, 0x27, 0x00,
  };
  FrameReader reader;
  // The frame is its first 84 bytes; hiberd's reader leaves the rest for the next frame.
  EXPECT_EQ(reader.feed(std::as_bytes(std::span(input))), 84u);
  ASSERT_TRUE(reader.complete());
  Result<control::Reply> reply = Status(ErrorCode::kUnknown, "not read");
  Status read = read_message<proto::ControlReply>(reader.message(), "control reply",
                                                  [&](proto::ControlReply::Reader r) -> Status {
                                                    reply = read_control_reply(r);
                                                    return Status();
                                                  });
  ASSERT_TRUE(read.ok()) << read;
  EXPECT_EQ(reply.status().code(), ErrorCode::kInvalidValue) << reply.status();
}

}  // namespace
}  // namespace hiber::wire
