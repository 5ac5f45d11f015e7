// The handshake codec: round trips, and every limit a hostile peer could push.
#include "wire/handshake.h"

#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "common/node_config_capnp.h"
#include "wire/limits.h"
#include "wire/schema/handshake.capnp.h"
#include "wire/socket_frame.h"

namespace hiber::wire {
namespace {

// The message inside a frame (what the receiver parses after the length prefix).
Message body(const std::vector<std::byte>& frame) {
  uint32_t length;
  std::memcpy(&length, frame.data(), 4);
  EXPECT_EQ(length + 4, frame.size());
  Message message;
  std::memcpy(message.resize(length).data(), frame.data() + 4, length);
  return message;
}

Message body_of(capnp::MessageBuilder& builder) {
  auto frame = encode_frame(builder);
  EXPECT_TRUE(frame.ok());
  return body(*frame);
}

Hello valid_hello() {
  return Hello{.version = current_protocol_version(),
               .function_id = "resnet50-v2",
               .auth_token = std::string("s3cr\0t", 6),
               .requested_quota_bytes = 8ull << 30,
               .instance = "4711.3"};
}

SessionInfo valid_session() {
  SessionInfo session;
  session.session_id = 17;
  session.server_version = ProtocolVersion{1, 3};
  session.grant = Grant{.va_base = 0x7f0000000000,
                        .va_bytes = 1ull << 36,
                        .quota_bytes = 12ull << 30,
                        .allocation_granularity = 2 << 20,
                        .largest_allocation_bytes = 2ull << 30};
  session.layout = make_layout(ChannelConfig{}).value();
  for (uint32_t d = 0; d < 2; ++d) {
    DeviceInfo device;
    device.ordinal = d;
    device.name = "Tesla V100-SXM2-16GB";
    device.uuid.assign(16, static_cast<uint8_t>(0xa0 + d));
    device.pci_bus_id = "0000:3b:00." + std::to_string(d);
    device.total_memory_bytes = 16ull << 30;
    for (int a = 0; a < 140; ++a) device.attributes.push_back(a * 3 - 7 + static_cast<int>(d));
    session.devices.push_back(device);
  }
  session.node = default_node_config();
  return session;
}

TEST(HandshakeTest, HelloRoundTrips) {
  const Hello hello = valid_hello();
  auto frame = encode_hello_frame(hello);
  ASSERT_TRUE(frame.ok()) << frame.status();
  auto decoded = decode_hello(body(*frame));
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  EXPECT_EQ(decoded->version.major, hello.version.major);
  EXPECT_EQ(decoded->version.minor, hello.version.minor);
  EXPECT_EQ(decoded->function_id, hello.function_id);
  EXPECT_EQ(decoded->auth_token, hello.auth_token);
  EXPECT_EQ(decoded->requested_quota_bytes, hello.requested_quota_bytes);
  EXPECT_EQ(decoded->instance, hello.instance);
  // No key is allowed too: the process is an instance without a name.
  Hello anonymous = hello;
  anonymous.instance.clear();
  auto decoded_anonymous = decode_hello(body(*encode_hello_frame(anonymous)));
  ASSERT_TRUE(decoded_anonymous.ok()) << decoded_anonymous.status();
  EXPECT_EQ(decoded_anonymous->instance, "");
}

TEST(HandshakeTest, HelloLimitsAreCheckedOnBothSides) {
  const auto expect_refused = [](Hello hello, std::string_view why) {
    const auto frame = encode_hello_frame(hello);
    EXPECT_EQ(frame.status().code(), ErrorCode::kInvalidValue) << why;
    EXPECT_NE(frame.status().message().find(why), std::string::npos) << frame.status();
    // The same hello forged past the client's checks: the server refuses it too.
    capnp::MallocMessageBuilder builder;
    auto root = builder.initRoot<proto::Hello>();
    root.setFunctionId(capnp::Text::Reader(hello.function_id.c_str(), hello.function_id.size()));
    root.setAuthToken(capnp::Data::Reader(
        reinterpret_cast<const capnp::byte*>(hello.auth_token.data()), hello.auth_token.size()));
    root.setInstance(capnp::Text::Reader(hello.instance.c_str(), hello.instance.size()));
    const auto decoded = decode_hello(body_of(builder));
    EXPECT_EQ(decoded.status().code(), ErrorCode::kInvalidValue) << why;
  };
  Hello hello = valid_hello();
  hello.function_id = "";
  expect_refused(hello, "empty");
  hello.function_id = std::string(kMaxFunctionIdBytes + 1, 'f');
  expect_refused(hello, "at most 256");
  hello.function_id = "tab\there";
  expect_refused(hello, "non-printable byte 9 at offset 3");
  hello = valid_hello();
  hello.auth_token = std::string(kMaxAuthTokenBytes + 1, 't');
  expect_refused(hello, "auth token");
  hello = valid_hello();
  hello.instance = std::string(kMaxInstanceKeyBytes + 1, 'i');
  expect_refused(hello, "instance key");
  hello.instance = "a\nb";
  expect_refused(hello, "instance key has a non-printable byte 10 at offset 1");

  hello = valid_hello();
  hello.function_id = std::string(kMaxFunctionIdBytes, '~');
  hello.auth_token = std::string(kMaxAuthTokenBytes, '\xff');
  hello.instance = std::string(kMaxInstanceKeyBytes, 'k');
  ASSERT_TRUE(encode_hello_frame(hello).ok()) << "the limits themselves are allowed";
}

TEST(HandshakeTest, WelcomeRoundTripsEveryField) {
  const SessionInfo session = valid_session();
  auto frame = encode_welcome_frame(session);
  ASSERT_TRUE(frame.ok()) << frame.status();
  auto decoded = decode_hello_reply(body(*frame));
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  EXPECT_EQ(decoded->session_id, 17u);
  EXPECT_EQ(decoded->server_version.major, 1);
  EXPECT_EQ(decoded->server_version.minor, 3);
  EXPECT_EQ(decoded->grant.va_base, session.grant.va_base);
  EXPECT_EQ(decoded->grant.va_bytes, session.grant.va_bytes);
  EXPECT_EQ(decoded->grant.quota_bytes, session.grant.quota_bytes);
  EXPECT_EQ(decoded->grant.allocation_granularity, session.grant.allocation_granularity);
  EXPECT_EQ(decoded->grant.largest_allocation_bytes, session.grant.largest_allocation_bytes);
  const ChannelLayout& a = decoded->layout;
  const ChannelLayout& b = session.layout;
  EXPECT_EQ(std::memcmp(&a, &b, sizeof(a)), 0);
  ASSERT_EQ(decoded->devices.size(), 2u);
  for (size_t d = 0; d < 2; ++d) {
    EXPECT_EQ(decoded->devices[d].ordinal, session.devices[d].ordinal);
    EXPECT_EQ(decoded->devices[d].name, session.devices[d].name);
    EXPECT_EQ(decoded->devices[d].uuid, session.devices[d].uuid);
    EXPECT_EQ(decoded->devices[d].pci_bus_id, session.devices[d].pci_bus_id);
    EXPECT_EQ(decoded->devices[d].total_memory_bytes, session.devices[d].total_memory_bytes);
    EXPECT_EQ(decoded->devices[d].attributes, session.devices[d].attributes);
  }
  EXPECT_EQ(describe(decoded->node), describe(session.node));
  EXPECT_EQ(decoded->node.gpu_count(), session.node.gpu_count());
}

TEST(HandshakeTest, WelcomeValuesOutOfBoundsAreRefused) {
  const auto expect_refused = [](SessionInfo session, std::string_view why) {
    EXPECT_EQ(encode_welcome_frame(session).status().code(), ErrorCode::kInvalidValue) << why;
  };
  SessionInfo session = valid_session();
  session.devices[1].uuid.pop_back();
  expect_refused(session, "uuid of 15 bytes");
  session = valid_session();
  session.devices[0].attributes.resize(kMaxDeviceAttributes + 1);
  expect_refused(session, "attributes");
  session = valid_session();
  session.devices.resize(kMaxDevices + 1, session.devices[0]);
  expect_refused(session, "devices");
  session = valid_session();
  session.grant.allocation_granularity = 3 << 20;
  expect_refused(session, "granularity");
  session = valid_session();
  session.grant.va_base = ~uint64_t{0} - 10;
  expect_refused(session, "range overflows");
}

// A Welcome written by hand, so the decoder sees what a broken or hostile server could send.
class ForgedWelcome {
 public:
  ForgedWelcome() {
    const SessionInfo session = valid_session();
    auto welcome = builder_.initRoot<proto::HelloReply>().initWelcome();
    welcome.initGrant().setAllocationGranularity(4096);
    auto devices = welcome.initDevices(1);
    devices[0].setUuid(capnp::Data::Reader(session.devices[0].uuid.data(), 16));
    node_config_to_capnp(session.node, welcome.initNode());
  }
  proto::Welcome::Builder welcome() { return builder_.getRoot<proto::HelloReply>().getWelcome(); }
  Status decode() { return decode_hello_reply(body_of(builder_)).status(); }

 private:
  capnp::MallocMessageBuilder builder_;
};

TEST(HandshakeTest, ForgedWelcomesAreInvalid) {
  {
    ForgedWelcome forged;
    EXPECT_TRUE(forged.decode().ok()) << forged.decode();
  }
  {
    ForgedWelcome forged;
    const uint8_t short_uuid[15] = {};
    forged.welcome().getDevices()[0].setUuid(capnp::Data::Reader(short_uuid, 15));
    const Status status = forged.decode();
    EXPECT_EQ(status.code(), ErrorCode::kInvalidValue);
    EXPECT_NE(status.message().find("uuid of 15 bytes"), std::string::npos) << status;
  }
  {
    ForgedWelcome forged;
    forged.welcome().getDevices()[0].initAttributes(kMaxDeviceAttributes + 1);
    EXPECT_EQ(forged.decode().code(), ErrorCode::kInvalidValue);
  }
  {
    ForgedWelcome forged;
    forged.welcome().initDevices(kMaxDevices + 1);
    EXPECT_EQ(forged.decode().code(), ErrorCode::kInvalidValue);
  }
  {
    ForgedWelcome forged;
    forged.welcome().getNode().setName("");
    const Status status = forged.decode();
    EXPECT_EQ(status.code(), ErrorCode::kInvalidValue);
    EXPECT_NE(status.message().find("node config"), std::string::npos) << status;
  }
  {
    ForgedWelcome forged;
    forged.welcome().getGrant().setAllocationGranularity(0);
    EXPECT_EQ(forged.decode().code(), ErrorCode::kInvalidValue);
  }
}

TEST(HandshakeTest, RejectionCarriesItsCodeAndMessage) {
  auto frame = encode_rejection_frame(Status(ErrorCode::kNotPermitted, "bad token"));
  ASSERT_TRUE(frame.ok());
  const auto reply = decode_hello_reply(body(*frame));
  EXPECT_EQ(reply.status().code(), ErrorCode::kNotPermitted);
  EXPECT_EQ(reply.status().message(), "hiberd rejected the session: bad token");

  EXPECT_EQ(encode_rejection_frame(Status()).status().code(), ErrorCode::kInvalidValue);

  // A long reason is cut so the frame always fits.
  frame = encode_rejection_frame(Status(ErrorCode::kOutOfMemory, std::string(1 << 20, 'x')));
  ASSERT_TRUE(frame.ok()) << frame.status();
  EXPECT_EQ(decode_hello_reply(body(*frame)).status().code(), ErrorCode::kOutOfMemory);

  capnp::MallocMessageBuilder forged;
  forged.initRoot<proto::HelloReply>().initRejected().setCode(0);
  EXPECT_EQ(decode_hello_reply(body_of(forged)).status().code(), ErrorCode::kInvalidValue);
}

TEST(HandshakeTest, GarbageIsInvalid) {
  std::mt19937_64 random(301);
  for (int round = 0; round < 2000; ++round) {
    std::vector<uint64_t> words(1 + random() % 40);
    for (auto& w : words) w = random() % 2 ? random() : random() % 256;
    words[0] = (words.size() - 1) << 32;  // a plausible segment table
    Message message;
    std::memcpy(message.resize(words.size() * 8).data(), words.data(), words.size() * 8);
    const auto hello = decode_hello(message);
    ASSERT_TRUE(hello.ok() || hello.status().code() == ErrorCode::kInvalidValue) << hello.status();
    const auto reply = decode_hello_reply(message);
    // A garbage reply may decode as a rejection with any code; it must never crash.
    (void)reply;
  }
}

TEST(HandshakeTest, ProtocolVersionComesFromTheSchema) {
  EXPECT_EQ(current_protocol_version().major, proto::PROTOCOL_MAJOR);
  EXPECT_EQ(current_protocol_version().minor, proto::PROTOCOL_MINOR);
}

}  // namespace
}  // namespace hiber::wire
