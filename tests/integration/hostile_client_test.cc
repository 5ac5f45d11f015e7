// Bad input from clients: malformed handshakes, malformed batches, bad arguments, a corrupted
// ring. Each gets a clear error; hiberd keeps serving everybody else.
#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <random>
#include <thread>

#include <capnp/message.h>
#include <capnp/schema.h>

#include "library_ops/blas_ops.h"
#include "library_ops/dnn_ops.h"
#include "tests/integration/hiberd_harness.h"
#include "wire/batch_builder.h"
#include "wire/channel_layout.h"
#include "wire/handshake.h"
#include "wire/limits.h"
#include "wire/message.h"
#include "wire/ring.h"
#include "wire/schema/handshake.capnp.h"
#include "wire/socket_frame.h"

namespace hiber::testing {
namespace {

using namespace std::chrono_literals;
namespace proto = wire::proto;

// ---- Handshakes ----

// hiberd's Rejection on `fd`, kUnknown "accepted" for a Welcome, or an error if the connection
// closed without either.
Status refusal_on(int fd) {
  wire::Message reply;
  UniqueFd memfd;
  Status got = wire::receive_frame(fd, reply, &memfd, 10000ms);
  if (!got.ok()) return got;
  auto session = wire::decode_hello_reply(reply);
  if (session.ok()) return Status(ErrorCode::kUnknown, "accepted");
  return session.status();
}

// Sends raw bytes as a would-be client and returns hiberd's Rejection, or an error if the
// connection closed without one.
Status handshake_with(const Hiberd& hiberd, std::span<const std::byte> bytes,
                      bool close_write = false) {
  auto socket = wire::connect_unix(hiberd.socket_path());
  if (!socket.ok()) return socket.status();
  // hiberd may refuse before reading (a uid not allowed) and close: the send then fails with
  // EPIPE, and the refusal is still there to read.
  if (!bytes.empty() && ::send(socket->get(), bytes.data(), bytes.size(), MSG_NOSIGNAL) < 0 &&
      errno != EPIPE && errno != ECONNRESET) {
    return Status(ErrorCode::kOperatingSystem, "send");
  }
  if (close_write) ::shutdown(socket->get(), SHUT_WR);
  return refusal_on(socket->get());
}

// Encodes a Hello directly, skipping the client library's own checks, so the server sees
// exactly what a broken or hostile client would send.
std::vector<std::byte> hello_frame(const Hiberd& hiberd, wire::Hello hello) {
  if (hello.auth_token == "<good>") hello.auth_token = hiberd.token();
  capnp::MallocMessageBuilder message;
  auto root = message.initRoot<proto::Hello>();
  root.initVersion().setMajor(hello.version.major);
  root.getVersion().setMinor(hello.version.minor);
  root.setFunctionId(hello.function_id);
  root.setAuthToken(kj::arrayPtr(reinterpret_cast<const capnp::byte*>(hello.auth_token.data()),
                                 hello.auth_token.size()));
  root.setRequestedQuotaBytes(hello.requested_quota_bytes);
  auto frame = wire::encode_frame(message);
  EXPECT_TRUE(frame.ok()) << frame.status();
  return frame.ok() ? *frame : std::vector<std::byte>{};
}

wire::Hello good_hello() {
  wire::Hello hello;
  hello.version = wire::current_protocol_version();
  hello.function_id = "hostile";
  hello.auth_token = "<good>";
  return hello;
}

std::vector<std::byte> le32(uint32_t v) {
  std::vector<std::byte> out(4);
  std::memcpy(out.data(), &v, 4);
  return out;
}

TEST(Handshake, EveryMalformedHelloIsRefusedWithAReason) {
  Hiberd hiberd({"--handshake_timeout_ms=400"});
  int refused = 0;
  auto expect_refused = [&](const char* what, std::span<const std::byte> bytes, ErrorCode code,
                            const char* message_part, bool close_write = false) {
    SCOPED_TRACE(what);
    Status s = handshake_with(hiberd, bytes, close_write);
    EXPECT_EQ(s.code(), code) << s;
    EXPECT_NE(s.message().find(message_part), std::string::npos) << s;
    ++refused;
  };

  expect_refused("zero length", le32(0), ErrorCode::kInvalidValue, "");
  expect_refused("oversized length", le32(wire::kMaxFrameBytes + 1), ErrorCode::kInvalidValue, "");
  std::mt19937 rng(5);
  std::vector<std::byte> garbage = le32(256);
  for (int i = 0; i < 256; ++i) garbage.push_back(static_cast<std::byte>(rng()));
  expect_refused("garbage body", garbage, ErrorCode::kInvalidValue, "");

  wire::Hello old = good_hello();
  old.version.major = 99;
  expect_refused("future major version", hello_frame(hiberd, old), ErrorCode::kNotSupported,
                 "not supported");
  wire::Hello bad_token = good_hello();
  bad_token.auth_token = "not-the-token";
  expect_refused("wrong token", hello_frame(hiberd, bad_token), ErrorCode::kNotPermitted,
                 "auth token");
  wire::Hello no_id = good_hello();
  no_id.function_id = "";
  expect_refused("empty function id", hello_frame(hiberd, no_id), ErrorCode::kInvalidValue, "");
  wire::Hello long_id = good_hello();
  long_id.function_id = std::string(wire::kMaxFunctionIdBytes + 1, 'f');
  expect_refused("long function id", hello_frame(hiberd, long_id), ErrorCode::kInvalidValue,
                 "function id");
  wire::Hello control_chars = good_hello();
  control_chars.function_id = "fn\n\x1b[31m";
  expect_refused("control characters in the function id", hello_frame(hiberd, control_chars),
                 ErrorCode::kInvalidValue, "function id");
  auto trailing = hello_frame(hiberd, good_hello());
  trailing.push_back(std::byte{0});
  expect_refused("bytes after the Hello", trailing, ErrorCode::kInvalidValue, "one message");
  expect_refused("silent client", {}, ErrorCode::kTimeout, "no Hello");

  // A truncated Hello and a hang-up: no reply possible, and nothing breaks.
  auto truncated = hello_frame(hiberd, good_hello());
  truncated.resize(truncated.size() / 2);
  Status cut = handshake_with(hiberd, truncated, /*close_write=*/true);
  EXPECT_FALSE(cut.ok());

  // hiberd still serves a proper client, and counted every refusal.
  auto ok = hiberd.connect("after-the-storm");
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_TRUE((*ok)->ping().ok());
  auto view = hiberd.status();
  ASSERT_TRUE(view.ok());
  EXPECT_EQ(view->handshakes_rejected, uint64_t(refused));
  EXPECT_EQ(view->sessions.size(), 1u);
}

// A squatter opens more silent connections than its uid may hold pending (128) and than hiberd
// holds in all (256); every client of the node runs as this same uid. Past the cap each newer
// connection drops the oldest silent one, told why, so hiberd holds a bounded number, and an
// innocent client of the same uid is served while the squatter stays connected.
TEST(Handshake, SilentConnectionsOfAUidCannotLockOutAnotherClientOfThatUid) {
  Hiberd hiberd;
  hiberd.settled_fds();
  const int fds_before = hiberd.settled_fds();
  std::vector<UniqueFd> squatter;
  for (int i = 0; i < 300; ++i) {
    auto s = wire::connect_unix(hiberd.socket_path());
    ASSERT_TRUE(s.ok()) << s.status();
    squatter.push_back(std::move(s).value());
  }
  // The oldest were dropped, each told why; hiberd holds at most the uid's share.
  Status dropped = refusal_on(squatter.front().get());
  EXPECT_EQ(dropped.code(), ErrorCode::kDeviceUnavailable) << dropped;
  EXPECT_NE(dropped.message().find("dropped for a newer connection"), std::string::npos)
      << dropped;
  EXPECT_LE(hiberd.settled_fds(), fds_before + 128 + 8) << hiberd.log();
  // The innocent client of the same uid is served, with the squatter still connected.
  for (int attempt = 0; attempt < 3; ++attempt) {
    auto ok = hiberd.connect("innocent");
    ASSERT_TRUE(ok.ok()) << ok.status();
    EXPECT_TRUE((*ok)->ping().ok());
  }
  // The squatter's newest connections still wait: only their silence ends them.
  for (size_t waiting : {squatter.size() - 1, squatter.size() - 100}) {
    pollfd p{squatter[waiting].get(), POLLIN, 0};
    EXPECT_EQ(::poll(&p, 1, 0), 0) << waiting << ": refused before its time-out";
  }
  EXPECT_LE(hiberd.settled_fds(), fds_before + 128 + 8) << hiberd.log();
  squatter.clear();
  auto after = hiberd.connect("after-the-crowd");
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_TRUE((*after)->ping().ok());
}

TEST(Handshake, RefusesUsersNotAllowed) {
  Hiberd hiberd({"--allowed_uids=4242"});
  Status s = handshake_with(hiberd, hello_frame(hiberd, good_hello()));
  EXPECT_EQ(s.code(), ErrorCode::kNotPermitted) << s;
  EXPECT_NE(s.message().find("uid"), std::string::npos) << s;
  // The client library reports the same reason, however the refusal races its hello.
  for (int i = 0; i < 5; ++i) {
    auto client = hiberd.connect("not-allowed");
    ASSERT_FALSE(client.ok());
    EXPECT_EQ(client.status().code(), ErrorCode::kNotPermitted) << client.status();
  }
  const auto control = hiberd.status();
  ASSERT_FALSE(control.ok()) << "the control socket must refuse too";
  EXPECT_EQ(control.status().code(), ErrorCode::kNotPermitted) << control.status();
}

// ---- Batches ----

// A client that builds its own batches, so it can send what a correct client never would.
class RawClient {
 public:
  explicit RawClient(const Hiberd& hiberd, const std::string& function_id = "raw") {
    auto channel = wire::ClientChannel::connect(hiberd.client_options(function_id));
    EXPECT_TRUE(channel.ok()) << channel.status();
    if (channel.ok()) channel_ = std::move(channel).value();
  }
  bool connected() const { return channel_ != nullptr; }
  wire::ClientChannel& channel() { return *channel_; }
  const wire::Grant& grant() const { return channel_->session().grant; }

  // Adds a call; returns its sequence number.
  template <typename Fill>
  uint64_t add(Fill&& fill) {
    if (batch_.empty()) batch_.reset(next_seq_);
    fill(batch_.add_call());
    return next_seq_++;
  }
  Status send() {
    Status s = channel_->send_pieces(batch_.finish());
    batch_.reset(next_seq_);
    return s;
  }
  // Collects completions until the one for `seq` arrived; returns all by seq.
  std::map<uint64_t, Status> collect_until(uint64_t seq) {
    std::map<uint64_t, Status> got;
    wire::Message m;
    const auto deadline = std::chrono::steady_clock::now() + 30s;
    while (got.count(seq) == 0 && std::chrono::steady_clock::now() < deadline) {
      if (!channel_->receive(m, 1s).ok()) continue;
      Status read = wire::read_message<proto::ServerMessage>(
          m, "completions", [&](proto::ServerMessage::Reader r) -> Status {
            for (auto c : r.getCompletions()) {
              got[c.getSeq()] = c.getCode() == 0
                                    ? Status()
                                    : Status(static_cast<ErrorCode>(c.getCode()), c.getMessage());
            }
            return Status();
          });
      EXPECT_TRUE(read.ok()) << read;
    }
    return got;
  }
  uint64_t ping() {
    uint64_t seq = add([](proto::Call::Builder c) {
      c.setReply(true);
      c.initPing().setValue(1);
    });
    EXPECT_TRUE(send().ok());
    return seq;
  }

 private:
  std::unique_ptr<wire::ClientChannel> channel_;
  wire::BatchBuilder batch_{wire::kMaxCallsPerBatch};
  uint64_t next_seq_ = 1;
};

// Calls sent through `raw`, each expected to fail with its own code and a message saying
// `says` (kSuccess: not to fail); check() pings and compares what came back.
class ExpectedErrors {
 public:
  explicit ExpectedErrors(RawClient& raw) : raw_(raw) {}
  template <typename Fill>
  void add(const char* what, ErrorCode code, Fill fill, const char* says = "") {
    expects_.push_back({what, raw_.add(fill), code, says});
  }
  void check() {
    const uint64_t last = raw_.ping();
    auto got = raw_.collect_until(last);
    for (const Expect& e : expects_) {
      SCOPED_TRACE(e.what);
      if (e.code == ErrorCode::kSuccess) {
        EXPECT_TRUE(got.count(e.seq) == 0 || got[e.seq].ok()) << got[e.seq];
      } else {
        ASSERT_TRUE(got.count(e.seq)) << "no error came back";
        EXPECT_EQ(got[e.seq].code(), e.code) << got[e.seq];
        EXPECT_FALSE(got[e.seq].message().empty());
        EXPECT_NE(got[e.seq].message().find(e.says), std::string::npos) << got[e.seq];
      }
    }
    EXPECT_TRUE(got[last].ok());
  }

 private:
  struct Expect {
    const char* what;
    uint64_t seq;
    ErrorCode code;
    const char* says;
  };
  RawClient& raw_;
  std::vector<Expect> expects_;
};

TEST(Batches, MalformedMessagesAreRefusedAndTheSessionGoesOn) {
  Hiberd hiberd;
  RawClient raw(hiberd);
  ASSERT_TRUE(raw.connected());

  // Garbage that is not a Cap'n Proto message at all.
  std::mt19937 rng(9);
  std::vector<std::byte> garbage(1000);
  for (auto& b : garbage) b = static_cast<std::byte>(rng());
  std::span<const std::byte> piece(garbage);
  ASSERT_TRUE(raw.channel().send_pieces({&piece, 1}).ok());
  auto got = raw.collect_until(0);
  ASSERT_TRUE(got.count(0));
  EXPECT_EQ(got[0].code(), ErrorCode::kInvalidValue) << got[0];
  EXPECT_NE(got[0].message().find("batch"), std::string::npos) << got[0];

  // A truncated message: a real batch cut short.
  {
    wire::BatchBuilder b(8);
    b.reset(1);
    b.add_call().initPing().setValue(5);
    std::vector<std::byte> whole;
    for (auto p : b.finish()) whole.insert(whole.end(), p.begin(), p.end());
    whole.resize(whole.size() - 8);
    std::span<const std::byte> cut(whole);
    ASSERT_TRUE(raw.channel().send_pieces({&cut, 1}).ok());
  }
  got = raw.collect_until(0);
  EXPECT_EQ(got[0].code(), ErrorCode::kInvalidValue) << got[0];

  // The same session goes on: its first well-formed batch (call 1) is served.
  uint64_t seq = raw.ping();
  EXPECT_EQ(seq, 1u);
  got = raw.collect_until(seq);
  EXPECT_TRUE(got[seq].ok()) << got[seq];
  auto view = hiberd.status();
  ASSERT_TRUE(view.ok());
  EXPECT_EQ(view->malformed_messages, 2u);
}

TEST(Batches, AnUnknownCallFailsAloneWithNotSupported) {
  Hiberd hiberd;
  RawClient raw(hiberd);
  ASSERT_TRUE(raw.connected());
  // A call from a newer protocol: its union discriminant is past every known member.
  const auto call_schema = capnp::Schema::from<proto::Call>().getProto().getStruct();
  const uint32_t discriminant_offset = call_schema.getDiscriminantOffset();
  uint64_t future = raw.add([&](proto::Call::Builder c) {
    c.initPing().setValue(1);
    auto data = capnp::toAny(c).getDataSection();
    const uint16_t unknown = 999;
    std::memcpy(data.begin() + 2 * discriminant_offset, &unknown, 2);
  });
  uint64_t ping = raw.add([](proto::Call::Builder c) {
    c.setReply(true);
    c.initPing().setValue(2);
  });
  ASSERT_TRUE(raw.send().ok());
  auto got = raw.collect_until(ping);
  ASSERT_TRUE(got.count(future));
  EXPECT_EQ(got[future].code(), ErrorCode::kNotSupported) << got[future];
  EXPECT_NE(got[future].message().find("999"), std::string::npos) << got[future];
  EXPECT_TRUE(got[ping].ok()) << "the call after the unknown one still runs";
}

TEST(Batches, BadArgumentsGetTheirOwnErrors) {
  Hiberd hiberd({"--default_quota_mib=64"});
  RawClient raw(hiberd);
  ASSERT_TRUE(raw.connected());
  const wire::Grant g = raw.grant();
  const uint64_t va = g.va_base;
  const uint64_t arena = raw.channel().arena().size();

  ExpectedErrors errors(raw);
  auto expect = [&](const char* what, ErrorCode code, auto fill) { errors.add(what, code, fill); };
  // A real allocation to aim at.
  expect("allocate", ErrorCode::kSuccess, [&](proto::Call::Builder c) {
    c.setReply(true);
    auto a = c.initMemAllocate();
    a.setVa(va);
    a.setBytes(4 << 20);
  });
  expect("unaligned allocation", ErrorCode::kInvalidValue, [&](proto::Call::Builder c) {
    auto a = c.initMemAllocate();
    a.setVa(va + (8 << 20) + 4096);
    a.setBytes(4096);
  });
  expect("allocation outside the grant", ErrorCode::kInvalidValue, [&](proto::Call::Builder c) {
    auto a = c.initMemAllocate();
    a.setVa(g.va_base - (2 << 20));
    a.setBytes(2 << 20);
  });
  expect("allocation over the quota", ErrorCode::kOutOfMemory, [&](proto::Call::Builder c) {
    auto a = c.initMemAllocate();
    a.setVa(va + (8 << 20));
    a.setBytes(64 << 20);
  });
  expect("zero-byte allocation", ErrorCode::kInvalidValue, [&](proto::Call::Builder c) {
    auto a = c.initMemAllocate();
    a.setVa(va + (8 << 20));
    a.setBytes(0);
  });
  expect("free of no allocation", ErrorCode::kInvalidValue,
         [&](proto::Call::Builder c) { c.initMemFree().setVa(va + 4096); });
  expect("copy from beyond the arena", ErrorCode::kInvalidValue, [&](proto::Call::Builder c) {
    auto m = c.initMemcpyHtoD();
    m.setDst(va);
    m.setSrcOffset(arena - 8);
    m.setBytes(16);
  });
  expect("copy with a wrapping arena offset", ErrorCode::kInvalidValue,
         [&](proto::Call::Builder c) {
           auto m = c.initMemcpyDtoH();
           m.setDstOffset(UINT64_MAX - 4);
           m.setSrc(va);
           m.setBytes(16);
         });
  expect("copy into memory it does not own", ErrorCode::kInvalidValue, [&](proto::Call::Builder c) {
    auto m = c.initMemcpyHtoD();
    m.setDst(va + (4 << 20) - 8);
    m.setSrcOffset(0);
    m.setBytes(16);
  });
  expect("device to device into another address space", ErrorCode::kInvalidValue,
         [&](proto::Call::Builder c) {
           auto m = c.initMemcpyDtoD();
           m.setDst(0x1000);
           m.setSrc(va);
           m.setBytes(64);
         });
  expect("memset of 3-byte elements", ErrorCode::kInvalidValue, [&](proto::Call::Builder c) {
    auto m = c.initMemset();
    m.setDst(va);
    m.setElementBytes(3);
    m.setCount(1);
  });
  expect("memset whose size overflows", ErrorCode::kInvalidValue, [&](proto::Call::Builder c) {
    auto m = c.initMemset();
    m.setDst(va);
    m.setElementBytes(4);
    m.setCount(UINT64_MAX / 2);
  });
  expect("unknown stream", ErrorCode::kInvalidHandle,
         [&](proto::Call::Builder c) { c.initStreamSynchronize().setStream(77); });
  expect("stream handle 0", ErrorCode::kInvalidValue,
         [&](proto::Call::Builder c) { c.initStreamCreate().setStream(0); });
  expect("stream", ErrorCode::kSuccess,
         [&](proto::Call::Builder c) { c.initStreamCreate().setStream(5); });
  expect("the same stream twice", ErrorCode::kInvalidValue,
         [&](proto::Call::Builder c) { c.initStreamCreate().setStream(5); });
  expect("unknown event", ErrorCode::kInvalidHandle, [&](proto::Call::Builder c) {
    auto r = c.initEventRecord();
    r.setEvent(3);
    r.setStream(5);
  });
  expect("unknown module", ErrorCode::kInvalidHandle, [&](proto::Call::Builder c) {
    auto f = c.initFunctionGet();
    f.setFunction(1);
    f.setModule(42);
    f.setName("k");
  });
  // Names reach logs and error messages: no escape sequence gets there.
  expect("kernel name with an escape", ErrorCode::kInvalidValue, [&](proto::Call::Builder c) {
    auto f = c.initFunctionGet();
    f.setFunction(1);
    f.setModule(42);
    f.setName("k\x1b[2J");
  });
  expect("unknown function", ErrorCode::kInvalidHandle,
         [&](proto::Call::Builder c) { c.initLaunchKernel().setFunction(9); });
  // A module image that is not code.
  std::memset(raw.channel().arena().data(), 0x5a, 4096);
  expect("garbage module image", ErrorCode::kInvalidImage, [&](proto::Call::Builder c) {
    auto m = c.initModuleLoad();
    m.setModule(1);
    m.setImageOffset(0);
    m.setImageBytes(4096);
  });
  errors.check();
}

// Graphs (protocol 1.9): misuse of graphBegin/End/Launch/Destroy fails alone, with its own
// error; a call a graph may not hold fails, and so does the graphEnd, which defines nothing; a
// graph of a bad copy fails when launched, naming the call; the session goes on.
TEST(Batches, GraphMisuseGetsItsOwnErrors) {
  Hiberd hiberd({"--default_quota_mib=64"});
  RawClient raw(hiberd);
  ASSERT_TRUE(raw.connected());
  const uint64_t va = raw.grant().va_base;
  ExpectedErrors errors(raw);
  auto expect = [&](const char* what, ErrorCode code, const char* says, auto fill) {
    errors.add(what, code, fill, says);
  };
  expect("allocate", ErrorCode::kSuccess, "", [&](proto::Call::Builder c) {
    auto a = c.initMemAllocate();
    a.setVa(va);
    a.setBytes(2 << 20);
  });
  expect("launch of an unknown graph", ErrorCode::kInvalidHandle, "unknown graph",
         [&](proto::Call::Builder c) { c.initGraphLaunch().setGraph(7); });
  expect("end of a graph never begun", ErrorCode::kInvalidValue, "is not being defined",
         [&](proto::Call::Builder c) { c.initGraphEnd().setGraph(7); });
  expect("destroy of an unknown graph", ErrorCode::kInvalidHandle, "unknown graph",
         [&](proto::Call::Builder c) { c.initGraphDestroy().setGraph(7); });
  expect("graph 0", ErrorCode::kInvalidValue, "is 0",
         [&](proto::Call::Builder c) { c.initGraphBegin().setGraph(0); });
  // Graph 1: an allocation inside the definition cannot be kept; the graph is not defined.
  expect("begin 1", ErrorCode::kSuccess, "",
         [&](proto::Call::Builder c) { c.initGraphBegin().setGraph(1); });
  expect("an allocation in a graph", ErrorCode::kInvalidValue, "cannot be part of a graph",
         [&](proto::Call::Builder c) {
           auto a = c.initMemAllocate();
           a.setVa(va + (4 << 20));
           a.setBytes(2 << 20);
         });
  expect("end 1", ErrorCode::kInvalidValue, "cannot be part of a graph",
         [&](proto::Call::Builder c) { c.initGraphEnd().setGraph(1); });
  expect("launch of the refused graph", ErrorCode::kInvalidHandle, "unknown graph",
         [&](proto::Call::Builder c) { c.initGraphLaunch().setGraph(1); });
  // Graph 2: a memset outside every allocation is kept, and fails when the graph runs.
  expect("begin 2", ErrorCode::kSuccess, "",
         [&](proto::Call::Builder c) { c.initGraphBegin().setGraph(2); });
  expect("a wild memset, kept", ErrorCode::kSuccess, "", [&](proto::Call::Builder c) {
    auto m = c.initMemset();
    m.setDst(va + (1ull << 40));
    m.setElementBytes(1);
    m.setCount(16);
  });
  expect("end 2", ErrorCode::kSuccess, "",
         [&](proto::Call::Builder c) { c.initGraphEnd().setGraph(2); });
  expect("begin 2 again", ErrorCode::kInvalidValue, "exists already",
         [&](proto::Call::Builder c) { c.initGraphBegin().setGraph(2); });
  expect("launch of the wild memset", ErrorCode::kInvalidValue, "graph 2, call 0 of 1",
         [&](proto::Call::Builder c) { c.initGraphLaunch().setGraph(2); });
  expect("destroy 2", ErrorCode::kSuccess, "",
         [&](proto::Call::Builder c) { c.initGraphDestroy().setGraph(2); });
  // Graph 3: a good memset, launched; the session goes on.
  expect("begin 3", ErrorCode::kSuccess, "",
         [&](proto::Call::Builder c) { c.initGraphBegin().setGraph(3); });
  expect("a memset, kept", ErrorCode::kSuccess, "", [&](proto::Call::Builder c) {
    auto m = c.initMemset();
    m.setDst(va);
    m.setElementBytes(1);
    m.setCount(4096);
  });
  expect("end 3", ErrorCode::kSuccess, "",
         [&](proto::Call::Builder c) { c.initGraphEnd().setGraph(3); });
  expect("launch 3", ErrorCode::kSuccess, "", [&](proto::Call::Builder c) {
    c.setReply(true);
    c.initGraphLaunch().setGraph(3);
  });
  errors.check();
}

TEST(Batches, AMessageLargerThanTheRingGetsThroughIntact) {
  Hiberd hiberd({"--request_ring_kib=16"});
  RawClient raw(hiberd);
  ASSERT_TRUE(raw.connected());
  for (uint32_t i = 0; i + 1 < wire::kMaxCallsPerBatch; ++i) {
    raw.add([&](proto::Call::Builder c) { c.initPing().setValue(i); });
  }
  uint64_t last = raw.add([](proto::Call::Builder c) {
    c.setReply(true);
    c.initPing().setValue(7);
  });
  ASSERT_TRUE(raw.send().ok());
  auto got = raw.collect_until(last);
  ASSERT_TRUE(got.count(last));
  EXPECT_TRUE(got[last].ok()) << got[last];
  EXPECT_EQ(got.size(), 1u) << "no call of the big batch failed";
}

TEST(Batches, AMessageAboveTheLimitIsRefusedBeforeSending) {
  Hiberd hiberd({"--max_message_mib=1"});
  RawClient raw(hiberd);
  ASSERT_TRUE(raw.connected());
  std::vector<std::byte> huge((1 << 20) + 8);
  std::span<const std::byte> piece(huge);
  Status s = raw.channel().send_pieces({&piece, 1});
  EXPECT_EQ(s.code(), ErrorCode::kInvalidValue) << s;
  uint64_t seq = raw.ping();
  auto got = raw.collect_until(seq);
  EXPECT_TRUE(got[seq].ok()) << "the session must be usable after a refused message";
}

// Completions for a slow reader on a tiny completion ring, with long error messages (they quote
// client-chosen names): every one arrives, none is cut in half.
TEST(Batches, LargeCompletionsForASlowReaderArriveWhole) {
  Hiberd hiberd({"--completion_ring_kib=4"});
  RawClient raw(hiberd);
  ASSERT_TRUE(raw.connected());
  const std::string long_name(600, 'k');
  uint64_t last = 0;
  for (int batch = 0; batch < 3; ++batch) {
    for (int i = 0; i < 40; ++i) {
      last = raw.add([&](proto::Call::Builder c) {
        auto f = c.initFunctionGet();
        f.setFunction(1000 + last);
        f.setModule(99);  // unknown: every call fails, with the name in its message
        f.setName(long_name);
      });
    }
    ASSERT_TRUE(raw.send().ok());
    std::this_thread::sleep_for(100ms);  // the client reads late
  }
  auto got = raw.collect_until(last);
  EXPECT_EQ(got.size(), 120u) << "completions were lost or mangled";
  for (const auto& [seq, status] : got) EXPECT_EQ(status.code(), ErrorCode::kInvalidHandle) << seq;
}

TEST(Batches, TheClientRecoversFromABatchHiberdCannotTake) {
  Hiberd hiberd({"--max_message_mib=1"});
  auto client = hiberd.connect("too-big");
  ASSERT_TRUE(client.ok());
  // 256 calls with 5000-byte names: a batch over the 1 MiB limit, refused before sending.
  const std::string name(5000, 'n');
  Status refused;
  for (int i = 0; i < 256 && refused.ok(); ++i) {
    refused = (*client)->enqueue([&](proto::Call::Builder c) {
      auto f = c.initFunctionGet();
      f.setFunction(1 + i);
      f.setModule(1);
      f.setName(name);
    });
  }
  if (refused.ok()) refused = (*client)->flush();
  EXPECT_EQ(refused.code(), ErrorCode::kInvalidValue) << refused;
  // The session goes on: later calls are numbered as hiberd expects and get their replies fast.
  EXPECT_EQ((*client)->take_error().code(), ErrorCode::kInvalidValue);
  const auto start = std::chrono::steady_clock::now();
  EXPECT_TRUE((*client)->ping().ok());
  // Far below the 60 s a session waiting for the refused calls would take to time out.
  EXPECT_LT(std::chrono::steady_clock::now() - start, 10s);
  EXPECT_TRUE((*client)->take_error().ok());
}

TEST(Batches, ACopyThatFailsStillGivesItsStagingBack) {
  Hiberd hiberd({"--arena_mib=1"});
  auto client = hiberd.connect("staging");
  ASSERT_TRUE(client.ok());
  // Each staged copy names a stream that does not exist, so none runs; the FIFO must still
  // move on, many times around the arena.
  for (int i = 0; i < 20; ++i) {
    auto staged = (*client)->stage(400 << 10);
    ASSERT_TRUE(staged.ok()) << "round " << i << ": " << staged.status();
    ASSERT_TRUE((*client)
                    ->enqueue([&](proto::Call::Builder c) {
                      auto m = c.initMemcpyHtoD();
                      m.setDst((*client)->session().grant.va_base);
                      m.setSrcOffset(staged->offset);
                      m.setBytes(400 << 10);
                      m.setStagingEnd(staged->staging_end);
                      m.setStream(99);
                    })
                    .ok());
  }
  EXPECT_EQ((*client)->take_error().code(), ErrorCode::kInvalidHandle);
}

TEST(Batches, NotReadyIsAnAnswerNotAnError) {
  Hiberd hiberd(
      {"--sim_throttle", "--default_quota_mib=64", "--node_config=" + slow_node_config()});
  auto client = hiberd.connect("query");
  ASSERT_TRUE(client.ok());
  const uint64_t va = (*client)->session().grant.va_base;
  ASSERT_TRUE((*client)
                  ->enqueue([&](proto::Call::Builder c) {
                    auto a = c.initMemAllocate();
                    a.setVa(va);
                    a.setBytes(32 << 20);
                  })
                  .ok());
  auto staged = (*client)->stage(32 << 20);
  ASSERT_TRUE(staged.ok());
  for (int i = 0; i < 2; ++i) {  // 0.7 s of throttled copying keeps stream 0 busy
    ASSERT_TRUE((*client)
                    ->enqueue([&](proto::Call::Builder c) {
                      auto m = c.initMemcpyHtoD();
                      m.setDst(va);
                      m.setSrcOffset(staged->offset);
                      m.setBytes(32 << 20);
                    })
                    .ok());
  }
  auto query = (*client)->call([](proto::Call::Builder c) { c.initStreamQuery().setStream(0); });
  EXPECT_EQ(query.status().code(), ErrorCode::kNotReady) << query.status();
  EXPECT_TRUE((*client)->take_error().ok()) << "not ready must not become the sticky error";
  auto view = hiberd.status();
  ASSERT_TRUE(view.ok());
  ASSERT_EQ(view->sessions.size(), 1u);
  EXPECT_EQ(view->sessions[0].failed_calls, 0u);
}

// A session whose channel the test maps itself, to do what the client library never would.
struct ManualSession {
  UniqueFd socket;
  UniqueFd memfd;
  wire::SessionInfo info;
  std::byte* base = nullptr;
  wire::ChannelViews views;

  explicit ManualSession(const Hiberd& hiberd) {
    auto connected = wire::connect_unix(hiberd.socket_path());
    EXPECT_TRUE(connected.ok()) << connected.status();
    if (!connected.ok()) return;
    socket = std::move(connected).value();
    wire::Hello hello = good_hello();
    hello.auth_token = hiberd.token();
    EXPECT_TRUE(wire::send_frame(socket.get(), *wire::encode_hello_frame(hello)).ok());
    wire::Message reply;
    EXPECT_TRUE(wire::receive_frame(socket.get(), reply, &memfd, 5000ms).ok());
    auto session = wire::decode_hello_reply(reply);
    EXPECT_TRUE(session.ok()) << session.status();
    if (!session.ok() || !memfd.valid()) return;
    info = *session;
    void* mapped = ::mmap(nullptr, info.layout.memfd_bytes, PROT_READ | PROT_WRITE, MAP_SHARED,
                          memfd.get(), 0);
    EXPECT_NE(mapped, MAP_FAILED);
    if (mapped == MAP_FAILED) return;
    base = static_cast<std::byte*>(mapped);
    views = wire::views_of(base, info.layout);
  }
  ~ManualSession() {
    if (base != nullptr) ::munmap(base, info.layout.memfd_bytes);
  }
  bool ok() const { return base != nullptr; }
  // True once hiberd has closed our socket.
  bool closed_by_server() {
    char byte;
    return ::recv(socket.get(), &byte, 1, MSG_DONTWAIT) == 0;
  }
};

// A client that goes away with seconds of work queued: hiberd executes none of what was still
// waiting. The last call would copy device bytes into the client's arena, which this test still
// maps after it disconnects; the bytes never arrive.
TEST(Queues, AGoneClientsQueuedWorkIsCancelled) {
  Hiberd hiberd({"--sim_throttle", "--node_config=" + slow_node_config()});
  ManualSession gone(hiberd);
  ASSERT_TRUE(gone.ok());
  const uint64_t va = gone.info.grant.va_base;
  constexpr uint64_t kCopy = 32 << 20;  // a third of a second each, throttled
  constexpr uint64_t kOut = 40 << 20;   // where the last copy would land in the arena
  constexpr uint32_t kCopies = 30;      // ten seconds of copying
  wire::RingProducer requests(gone.views.requests);
  wire::BatchBuilder batch(wire::kMaxCallsPerBatch);
  batch.reset(1);
  auto a = batch.add_call().initMemAllocate();
  a.setVa(va);
  a.setBytes(kCopy);
  for (uint32_t i = 0; i < kCopies; ++i) {
    auto m = batch.add_call().initMemcpyHtoD();
    m.setDst(va);
    m.setSrcOffset(0);
    m.setBytes(kCopy);
  }
  auto set = batch.add_call().initMemset();
  set.setDst(va);
  set.setValue(0xab);
  set.setElementBytes(1);
  set.setCount(4096);
  auto out = batch.add_call().initMemcpyDtoH();
  out.setDstOffset(kOut);
  out.setSrc(va);
  out.setBytes(4096);
  const uint64_t calls = batch.size();
  ASSERT_TRUE(requests.write(batch.finish(), [] { return true; }).ok());
  // Every call is on the GPU's queue (the session has executed them all) before the client goes.
  auto queued = hiberd.wait_for(
      [&](const StatusView& v) { return v.sessions.size() == 1 && v.sessions[0].calls == calls; },
      30s);
  ASSERT_TRUE(queued.ok()) << queued.status();
  ASSERT_EQ(queued->sessions.size(), 1u);
  ASSERT_EQ(queued->sessions[0].calls, calls) << hiberd.log();
  gone.socket.reset();
  auto closed = hiberd.wait_for(
      [](const StatusView& v) { return v.sessions.empty() && v.sessions_closed == 1; }, 60s);
  ASSERT_TRUE(closed.ok()) << closed.status();
  EXPECT_TRUE(closed->sessions.empty()) << hiberd.log();
  const std::byte* landed = gone.base + gone.info.layout.arena_offset + kOut;
  EXPECT_EQ(std::count(landed, landed + 4096, std::byte{0}), 4096)
      << "the gone client's last copy ran";
}

// Past the session's queue limit a copy fails with the limit's name; the work already queued
// runs, and once it has, copies go through again.
TEST(Queues, CopiesPastTheQueueLimitFail) {
  // A 20 MB/s link: a copy of 32 MiB takes 1.7 s, far longer than the session takes to queue
  // the next two even on a loaded machine (at 100 MB/s, a third of a second was not always).
  Hiberd hiberd({"--sim_throttle", "--session_max_queued_mib=64",
                 "--node_config=" + one_gpu_node_config(0.02)});
  auto client = hiberd.connect("queue-limit");
  ASSERT_TRUE(client.ok()) << client.status();
  const uint64_t va = (*client)->session().grant.va_base;
  ASSERT_TRUE((*client)
                  ->call([&](proto::Call::Builder c) {
                    auto a = c.initMemAllocate();
                    a.setVa(va);
                    a.setBytes(32 << 20);
                  })
                  .ok());
  auto staged = (*client)->stage(32 << 20);
  ASSERT_TRUE(staged.ok());
  auto copy = [&] {
    return (*client)->enqueue([&](proto::Call::Builder c) {
      auto m = c.initMemcpyHtoD();
      m.setDst(va);
      m.setSrcOffset(staged->offset);
      m.setBytes(32 << 20);
    });
  };
  // In one batch: the first copy takes 1.7 s, so all three are queued at once.
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(copy().ok());
  auto sync =
      (*client)->call([](proto::Call::Builder c) { c.initStreamSynchronize().setStream(0); });
  EXPECT_TRUE(sync.ok()) << sync.status();
  const Status refused = (*client)->take_error();
  EXPECT_EQ(refused.code(), ErrorCode::kOutOfMemory) << refused;
  EXPECT_NE(refused.message().find("--session_max_queued_mib"), std::string::npos) << refused;
  ASSERT_TRUE(copy().ok());
  sync = (*client)->call([](proto::Call::Builder c) { c.initStreamSynchronize().setStream(0); });
  EXPECT_TRUE(sync.ok()) << sync.status();
  EXPECT_TRUE((*client)->take_error().ok());
}

// A client that makes the server produce completions and never reads them must not stall
// anybody else on its GPU (device callbacks never wait for a client), and is eventually cut off.
TEST(Batches, AClientThatNeverReadsItsCompletionsStallsNobody) {
  // One simulated GPU with one worker thread: every session shares the same device threads.
  Hiberd hiberd({"--node_config=" + one_gpu_node_config(10), "--sim_workers_per_gpu=1"});
  ManualSession flood(hiberd);
  ASSERT_TRUE(flood.ok());
  // Batches of synchronous calls written straight onto the request ring; the completion ring is
  // never read. Each completion comes from a callback on the GPU's only device thread.
  wire::RingProducer requests(flood.views.requests);
  wire::BatchBuilder batch(wire::kMaxCallsPerBatch);
  uint64_t seq = 1;
  for (int b = 0; b < 24 && !flood.closed_by_server(); ++b) {
    batch.reset(seq);
    for (uint32_t i = 0; i < wire::kMaxCallsPerBatch; ++i, ++seq) {
      auto c = batch.add_call();
      c.setReply(true);
      c.initStreamSynchronize().setStream(0);
    }
    auto pieces = batch.finish();
    if (!requests.write(pieces, [&] { return !flood.closed_by_server(); }).ok()) break;
  }
  // Meanwhile, on the same GPU and the same device thread, another function works normally.
  auto result =
      run_program({test_client_path(), "--mode=verify", "--socket=" + hiberd.socket_path(),
                   "--token=" + hiberd.token(), "--iterations=3"},
                  60s);
  EXPECT_EQ(result.exit_code, 0) << result.output;
  // The flooding session is cut off once too many completions wait for it.
  const auto deadline = std::chrono::steady_clock::now() + 30s;
  while (!flood.closed_by_server() && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(20ms);
  }
  EXPECT_TRUE(flood.closed_by_server());
  EXPECT_NE(hiberd.log().find("does not read its completion ring"), std::string::npos)
      << hiberd.log();
  auto view = hiberd.wait_for([](const StatusView& v) { return v.sessions.empty(); }, 10s);
  ASSERT_TRUE(view.ok());
  EXPECT_TRUE(view->sessions.empty());
}

// The client scribbles over its request ring's cursors. Only its own session ends.
TEST(Batches, ACorruptRingEndsOnlyThatSession) {
  Hiberd hiberd;
  auto bystander = hiberd.connect("bystander");
  ASSERT_TRUE(bystander.ok());
  ManualSession corrupt(hiberd);
  ASSERT_TRUE(corrupt.ok());

  // The client cannot resize the shared memory under the server either: the memfd is sealed.
  EXPECT_NE(::ftruncate(corrupt.memfd.get(), 4096), 0) << "a client could truncate the channel";

  corrupt.views.requests.header->tail.store(corrupt.views.requests.capacity * 3 + 8);
  wire::ring(corrupt.views.requests.header->not_empty);

  auto view = hiberd.wait_for([](const StatusView& v) { return v.sessions.size() == 1; }, 10s);
  ASSERT_TRUE(view.ok());
  ASSERT_EQ(view->sessions.size(), 1u) << "the corrupt session is still open";
  EXPECT_EQ(view->sessions[0].function_id, "bystander");
  EXPECT_GE(view->malformed_messages, 1u);
  const auto deadline = std::chrono::steady_clock::now() + 10s;
  while (!corrupt.closed_by_server() && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(20ms);
  }
  EXPECT_TRUE(corrupt.closed_by_server());
  EXPECT_TRUE((*bystander)->ping().ok());
}

// A cuDNN operation graph (ReLU of a 1x2x3x4 tensor), encoded as the client encodes it.
std::vector<std::byte> relu_graph() {
  namespace dnn = library_ops::dnn;
  dnn::Graph g;
  auto attr = [](int32_t name, int32_t type, const void* p, size_t bytes) {
    dnn::Attr a{name, type, std::vector<std::byte>(bytes)};
    std::memcpy(a.bytes.data(), p, bytes);
    return a;
  };
  const int32_t f32 = dnn::kFloat, relu = dnn::kPwReluFwd;
  const int64_t dims[4] = {1, 2, 3, 4}, strides[4] = {24, 12, 4, 1};
  for (int64_t uid : {1, 2}) {
    g.nodes.push_back({dnn::kTensor,
                       {attr(dnn::kTensorDataType, dnn::kTypeDataType, &f32, 4),
                        attr(dnn::kTensorDimensions, dnn::kTypeInt64, dims, 32),
                        attr(dnn::kTensorStrides, dnn::kTypeInt64, strides, 32),
                        attr(dnn::kTensorUniqueId, dnn::kTypeInt64, &uid, 8)}});
  }
  g.nodes.push_back(
      {dnn::kPointwise, {attr(dnn::kPointwiseMode, dnn::kTypePointwiseMode, &relu, 4)}});
  const uint64_t x = 0, y = 1, pw = 2, op = 3;
  g.nodes.push_back({dnn::kOpPointwise,
                     {attr(dnn::kOpPointwisePwDesc, dnn::kTypeBackendDescriptor, &pw, 8),
                      attr(dnn::kOpPointwiseX, dnn::kTypeBackendDescriptor, &x, 8),
                      attr(dnn::kOpPointwiseY, dnn::kTypeBackendDescriptor, &y, 8)}});
  g.nodes.push_back(
      {dnn::kOperationGraph, {attr(dnn::kOperationGraphOps, dnn::kTypeBackendDescriptor, &op, 8)}});
  return dnn::encode_graph(g);
}

// A cuDNN handle is worth nothing to another session: hiberd refuses it before reading anything
// else. In its own session the same query is answered, and malformed graph bytes are refused
// with a reason.
TEST(Libraries, AHandleFromAnotherSessionIsRefused) {
  Hiberd hiberd;
  RawClient owner(hiberd), thief(hiberd);
  ASSERT_TRUE(owner.connected());
  ASSERT_TRUE(thief.connected());
  const uint64_t handle = 0x4242;
  const auto graph = relu_graph();
  const kj::ArrayPtr<const kj::byte> graph_bytes(reinterpret_cast<const kj::byte*>(graph.data()),
                                                 graph.size());
  const uint16_t finalize = static_cast<uint16_t>(library_ops::LibraryOp::kDnnFinalize);
  const uint64_t created = owner.add([&](proto::Call::Builder c) {
    c.setReply(true);
    auto h = c.initLibraryHandleCreate();
    h.setHandle(handle);
    h.setLibrary(static_cast<uint8_t>(library_ops::Library::kDnn));
  });
  const uint64_t answered = owner.add([&](proto::Call::Builder c) {
    c.setReply(true);
    auto q = c.initLibraryQuery();
    q.setHandle(handle);
    q.setOp(finalize);
    q.setArgs(graph_bytes);
  });
  const std::vector<std::byte> truncated(graph.begin(), graph.begin() + graph.size() / 2);
  const uint64_t malformed = owner.add([&](proto::Call::Builder c) {
    c.setReply(true);
    auto q = c.initLibraryQuery();
    q.setHandle(handle);
    q.setOp(finalize);
    q.setArgs(kj::ArrayPtr<const kj::byte>(reinterpret_cast<const kj::byte*>(truncated.data()),
                                           truncated.size()));
  });
  ASSERT_TRUE(owner.send().ok());
  auto got = owner.collect_until(malformed);
  EXPECT_TRUE(got[created].ok()) << got[created];
  EXPECT_TRUE(got[answered].ok()) << got[answered];
  EXPECT_EQ(got[malformed].code(), ErrorCode::kInvalidValue) << got[malformed];
  EXPECT_NE(got[malformed].message().find("cuDNN graph"), std::string::npos) << got[malformed];

  const uint64_t stolen_query = thief.add([&](proto::Call::Builder c) {
    c.setReply(true);
    auto q = c.initLibraryQuery();
    q.setHandle(handle);
    q.setOp(finalize);
    q.setArgs(graph_bytes);
  });
  const uint64_t stolen_call = thief.add([&](proto::Call::Builder c) {
    c.setReply(true);
    auto l = c.initLibraryCall();
    l.setHandle(handle);
    l.setOp(static_cast<uint16_t>(library_ops::LibraryOp::kDnnExecute));
    l.setArgs(graph_bytes);
  });
  ASSERT_TRUE(thief.send().ok());
  auto refused = thief.collect_until(stolen_call);
  for (uint64_t seq : {stolen_query, stolen_call}) {
    EXPECT_EQ(refused[seq].code(), ErrorCode::kInvalidHandle) << refused[seq];
    EXPECT_NE(refused[seq].message().find("not created by this session"), std::string::npos)
        << refused[seq];
  }
}

// Library calls naming a handle the session did not create, or carrying an argument struct of
// another size, are refused with their own errors, and the session goes on: a handle of another
// session is worth nothing here.
TEST(Libraries, ForeignHandlesAndBadArgumentsAreRefusedAndTheSessionGoesOn) {
  Hiberd hiberd;
  RawClient raw(hiberd);
  ASSERT_TRUE(raw.connected());
  const uint16_t matmul = static_cast<uint16_t>(library_ops::LibraryOp::kLtMatmul);
  const uint16_t heuristic = static_cast<uint16_t>(library_ops::LibraryOp::kLtHeuristic);
  library_ops::blas::LtHeuristic query;
  query.problem.a = {.rows = 4, .cols = 4, .ld = 4};  // fp32 4 x 4 everywhere
  query.problem.b = query.problem.c = query.problem.d = query.problem.a;
  query.problem.compute_type = 68;  // CUBLAS_COMPUTE_32F
  const auto bytes = library_ops::op_bytes(query);
  const kj::ArrayPtr<const kj::byte> query_bytes(reinterpret_cast<const kj::byte*>(bytes.data()),
                                                 bytes.size());
  std::vector<kj::byte> short_args(sizeof(library_ops::blas::LtMatmul) - 8, kj::byte{0});

  raw.add([](proto::Call::Builder c) {
    auto h = c.initLibraryHandleCreate();
    h.setHandle(7);
    h.setLibrary(1);
  });
  const uint64_t foreign = raw.add([&](proto::Call::Builder c) {
    auto call = c.initLibraryCall();
    call.setHandle(99);  // never created in this session
    call.setOp(matmul);
    call.setArgs(kj::arrayPtr(short_args.data(), short_args.size()));
  });
  const uint64_t wrong_size = raw.add([&](proto::Call::Builder c) {
    auto call = c.initLibraryCall();
    call.setHandle(7);
    call.setOp(matmul);
    call.setArgs(kj::arrayPtr(short_args.data(), short_args.size()));
  });
  const uint64_t foreign_query = raw.add([&](proto::Call::Builder c) {
    c.setReply(true);
    auto q = c.initLibraryQuery();
    q.setHandle(99);
    q.setOp(heuristic);
    q.setArgs(query_bytes);
  });
  const uint64_t good_query = raw.add([&](proto::Call::Builder c) {
    c.setReply(true);
    auto q = c.initLibraryQuery();
    q.setHandle(7);
    q.setOp(heuristic);
    q.setArgs(query_bytes);
  });
  ASSERT_TRUE(raw.send().ok());
  const uint64_t last = raw.ping();
  auto got = raw.collect_until(last);
  ASSERT_TRUE(got.count(foreign));
  EXPECT_EQ(got[foreign].code(), ErrorCode::kInvalidHandle) << got[foreign];
  ASSERT_TRUE(got.count(wrong_size));
  EXPECT_EQ(got[wrong_size].code(), ErrorCode::kInvalidValue) << got[wrong_size];
  EXPECT_NE(got[wrong_size].message().find("bytes of arguments"), std::string::npos)
      << got[wrong_size];
  ASSERT_TRUE(got.count(foreign_query));
  EXPECT_EQ(got[foreign_query].code(), ErrorCode::kInvalidHandle) << got[foreign_query];
  EXPECT_TRUE(got.count(good_query) == 0 || got[good_query].ok()) << got[good_query];
  EXPECT_TRUE(got[last].ok()) << "the session goes on";
}

}  // namespace
}  // namespace hiber::testing
