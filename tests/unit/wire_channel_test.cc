// The channel end to end in one process: a tiny acceptor does hiberd's side of the handshake,
// then batches flow one way and completions the other.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <thread>

#include "tests/integration/wedged_listener.h"
#include "wire/batch_builder.h"
#include "wire/channel_layout.h"
#include "wire/client_channel.h"
#include "wire/handshake.h"
#include "wire/limits.h"
#include "wire/schema/calls.capnp.h"
#include "wire/server_channel.h"
#include "wire/socket_frame.h"

namespace hiber::wire {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

ChannelConfig small_config() {
  return ChannelConfig{.request_ring_bytes = 4096,
                       .completion_ring_bytes = 4096,
                       .arena_bytes = 1 << 20,
                       .max_message_bytes = 1 << 20};
}

// --- Layout ---------------------------------------------------------------------------------

TEST(ChannelLayoutTest, DefaultLayoutIsValid) {
  const auto layout = make_layout(ChannelConfig{});
  ASSERT_TRUE(layout.ok()) << layout.status();
  EXPECT_EQ(layout->request_ring_offset, kPageBytes);
  EXPECT_EQ(layout->request_ring_bytes, 1u << 20);
  EXPECT_EQ(layout->completion_ring_offset, kPageBytes + kPageBytes + (1u << 20));
  EXPECT_EQ(layout->arena_bytes, 64u << 20);
  EXPECT_EQ(layout->memfd_bytes, layout->arena_offset + layout->arena_bytes);
  EXPECT_TRUE(validate_layout(*layout, layout->memfd_bytes).ok());
}

TEST(ChannelLayoutTest, SizesAreRoundedUp) {
  const auto layout = make_layout(ChannelConfig{.request_ring_bytes = 5000,
                                                .completion_ring_bytes = 1,
                                                .arena_bytes = 1,
                                                .max_message_bytes = 100});
  ASSERT_TRUE(layout.ok()) << layout.status();
  EXPECT_EQ(layout->request_ring_bytes, 8192u);
  EXPECT_EQ(layout->completion_ring_bytes, kMinRingBytes);
  EXPECT_EQ(layout->arena_bytes, kPageBytes);
  EXPECT_TRUE(validate_layout(*layout, layout->memfd_bytes).ok());
}

TEST(ChannelLayoutTest, OutOfRangeConfigsAreRefused) {
  for (const ChannelConfig config : {
           ChannelConfig{.request_ring_bytes = 0},
           ChannelConfig{.completion_ring_bytes = kMaxRingBytes + 1},
           ChannelConfig{.max_message_bytes = 0},
           ChannelConfig{.max_message_bytes = kMaxMessageBytes + 1},
           ChannelConfig{.arena_bytes = kMaxArenaBytes + 1},
       }) {
    EXPECT_EQ(make_layout(config).status().code(), ErrorCode::kInvalidValue);
  }
}

TEST(ChannelLayoutTest, BadLayoutsFromAPeerAreRefused) {
  const ChannelLayout good = make_layout(small_config()).value();
  const auto expect_bad = [&](ChannelLayout layout, uint64_t memfd_bytes, const char* why) {
    const Status status = validate_layout(layout, memfd_bytes);
    EXPECT_EQ(status.code(), ErrorCode::kInvalidValue) << why;
  };
  expect_bad(good, good.memfd_bytes + kPageBytes, "memfd size differs");
  ChannelLayout bad = good;
  bad.request_ring_bytes = 6000;
  expect_bad(bad, bad.memfd_bytes, "ring not a power of two");
  bad = good;
  bad.arena_offset += 8;
  expect_bad(bad, bad.memfd_bytes, "arena not page-aligned");
  bad = good;
  bad.completion_ring_offset = bad.request_ring_offset;
  expect_bad(bad, bad.memfd_bytes, "rings overlap");
  bad = good;
  bad.request_ring_offset = 0;
  expect_bad(bad, bad.memfd_bytes, "ring over the channel header");
  bad = good;
  bad.arena_offset = ~uint64_t{0} & ~(kPageBytes - 1);
  expect_bad(bad, bad.memfd_bytes, "arena offset overflows");
  bad = good;
  bad.arena_bytes += kPageBytes;
  expect_bad(bad, bad.memfd_bytes - kPageBytes, "arena past the end");
  bad = good;
  bad.max_message_bytes = 0;
  expect_bad(bad, bad.memfd_bytes, "no message fits");
}

TEST(ChannelLayoutTest, ArenaRangeChecksAreOverflowSafe) {
  EXPECT_TRUE(arena_range_ok(0, 0, 0));
  EXPECT_TRUE(arena_range_ok(0, 100, 100));
  EXPECT_TRUE(arena_range_ok(100, 0, 100));
  EXPECT_FALSE(arena_range_ok(1, 100, 100));
  EXPECT_FALSE(arena_range_ok(101, 0, 100));
  EXPECT_FALSE(arena_range_ok(uint64_t{1} << 63, uint64_t{1} << 63, ~uint64_t{0}));
  EXPECT_FALSE(arena_range_ok(10, ~uint64_t{0} - 5, 100));
}

// --- A test hiberd --------------------------------------------------------------------------

enum class Reply { kWelcome, kReject, kSilent, kWelcomeWithoutMemfd, kWelcomeWithBadLayout };

class TestServer {
 public:
  explicit TestServer(Reply reply = Reply::kWelcome, ChannelConfig config = small_config()) {
    char dir[] = "/tmp/hiber-wire-test-XXXXXX";
    EXPECT_NE(::mkdtemp(dir), nullptr);
    dir_ = dir;
    path_ = dir_ + "/hiberd.sock";
    listener_.reset(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
    sockaddr_un address{};
    address.sun_family = AF_UNIX;
    std::strcpy(address.sun_path, path_.c_str());
    EXPECT_EQ(::bind(listener_.get(), reinterpret_cast<sockaddr*>(&address), sizeof(address)), 0);
    EXPECT_EQ(::listen(listener_.get(), 4), 0);
    acceptor_ = std::thread([this, reply, config] { serve(reply, config); });
  }
  ~TestServer() {
    join();
    ::unlink(path_.c_str());
    ::rmdir(dir_.c_str());
  }

  ClientOptions options() const {
    return ClientOptions{.socket_path = path_,
                         .function_id = "fn-1",
                         .auth_token = "token",
                         .requested_quota_bytes = 1 << 30,
                         .handshake_timeout = 5s};
  }
  // After the client connected.
  ServerChannel& channel() {
    join();
    return *channel_;
  }
  UniqueFd& socket() {
    join();
    return socket_;
  }
  const Hello& hello() {
    join();
    return hello_;
  }

 private:
  void join() {
    if (acceptor_.joinable()) acceptor_.join();
  }

  void serve(Reply reply, ChannelConfig config) {
    socket_.reset(::accept4(listener_.get(), nullptr, nullptr, SOCK_CLOEXEC));
    ASSERT_TRUE(socket_.valid());
    Message message;
    ASSERT_TRUE(receive_frame(socket_.get(), message, nullptr, 5s).ok());
    auto hello = decode_hello(message);
    ASSERT_TRUE(hello.ok()) << hello.status();
    hello_ = *hello;
    if (reply == Reply::kSilent) return;
    if (reply == Reply::kReject) {
      auto frame = encode_rejection_frame(Status(ErrorCode::kNotPermitted, "bad token"));
      ASSERT_TRUE(send_frame(socket_.get(), *frame).ok());
      return;
    }
    auto channel = ServerChannel::create(config);
    ASSERT_TRUE(channel.ok()) << channel.status();
    channel_ = std::move(channel).value();
    SessionInfo session;
    session.session_id = 1;
    session.server_version = current_protocol_version();
    session.grant.allocation_granularity = 2 << 20;
    session.layout = channel_->layout();
    if (reply == Reply::kWelcomeWithBadLayout) session.layout.memfd_bytes += kPageBytes;
    DeviceInfo device;
    device.name = "simulated";
    device.uuid.assign(16, 7);
    session.devices.push_back(device);
    session.node = default_node_config();
    auto frame = encode_welcome_frame(session);
    ASSERT_TRUE(frame.ok()) << frame.status();
    ASSERT_TRUE(send_frame(socket_.get(), *frame,
                           reply == Reply::kWelcomeWithoutMemfd ? -1 : channel_->memfd())
                    .ok());
  }

  std::string dir_, path_;
  UniqueFd listener_;
  std::thread acceptor_;
  UniqueFd socket_;
  Hello hello_;
  std::unique_ptr<ServerChannel> channel_;
};

std::unique_ptr<ClientChannel> connect(TestServer& server) {
  auto client = ClientChannel::connect(server.options());
  EXPECT_TRUE(client.ok()) << client.status();
  return client.ok() ? std::move(client).value() : nullptr;
}

// hiberd's loop in miniature: answers every call with reply = true (echoing ping values) until
// the channel closes or a batch with firstSeq 0 arrives.
void echo(ServerChannel& channel) {
  Message message;
  std::vector<std::pair<uint64_t, uint64_t>> replies;  // (seq, ping value)
  for (;;) {
    if (!channel.receive(message, 10s).ok()) return;
    bool stop = false;
    replies.clear();
    ASSERT_TRUE(read_message<proto::Batch>(message, "batch", [&](proto::Batch::Reader batch) {
                  stop = batch.getFirstSeq() == 0;
                  const auto calls = batch.getCalls();
                  for (uint32_t i = 0; i < calls.size(); ++i) {
                    if (calls[i].getReply()) {
                      replies.emplace_back(batch.getFirstSeq() + i, calls[i].getPing().getValue());
                    }
                  }
                  return Status();
                }).ok());
    if (stop) return;
    if (replies.empty()) continue;
    capnp::MallocMessageBuilder reply;
    auto completions = reply.initRoot<proto::ServerMessage>().initCompletions(replies.size());
    for (size_t i = 0; i < replies.size(); ++i) {
      completions[i].setSeq(replies[i].first);
      completions[i].initResult().setPing(replies[i].second);
    }
    if (!channel.send(reply).ok()) return;
  }
}

// The (seq, ping) pairs of a ServerMessage.
std::vector<std::pair<uint64_t, uint64_t>> completions_of(const Message& message) {
  std::vector<std::pair<uint64_t, uint64_t>> out;
  EXPECT_TRUE(read_message<proto::ServerMessage>(message, "server message",
                                                 [&](proto::ServerMessage::Reader m) {
                                                   for (auto c : m.getCompletions()) {
                                                     out.emplace_back(c.getSeq(),
                                                                      c.getResult().getPing());
                                                   }
                                                   return Status();
                                                 })
                  .ok());
  return out;
}

Status send_stop(ClientChannel& client) {
  BatchBuilder stop(1);
  stop.reset(0);
  stop.add_call().initPing();
  return client.send_pieces(stop.finish());
}

TEST(ChannelTest, ConnectMapsTheChannel) {
  TestServer server;
  auto client = connect(server);
  ASSERT_NE(client, nullptr);
  EXPECT_EQ(server.hello().function_id, "fn-1");
  EXPECT_EQ(server.hello().auth_token, "token");
  EXPECT_EQ(server.hello().requested_quota_bytes, 1u << 30);
  EXPECT_EQ(client->session().session_id, 1u);
  EXPECT_EQ(client->session().devices.at(0).name, "simulated");
  ASSERT_EQ(client->arena().size(), server.channel().arena().size());
  std::memcpy(client->arena().data() + 100, "shared", 6);
  EXPECT_EQ(std::memcmp(server.channel().arena().data() + 100, "shared", 6), 0);
  EXPECT_TRUE(client->server_alive());
}

TEST(ChannelTest, BatchesOneWayCompletionsTheOther) {
  TestServer server(Reply::kWelcome, ChannelConfig{.request_ring_bytes = 64 << 10,
                                                   .completion_ring_bytes = 16 << 10});
  auto client = connect(server);
  ASSERT_NE(client, nullptr);
  std::thread hiberd([&] { echo(server.channel()); });

  BatchBuilder builder(128);
  uint64_t seq = 1;
  std::vector<uint64_t> expected;  // seqs with reply = true
  for (int b = 0; b < 500; ++b) {
    builder.reset(seq);
    const int count = 1 + (b * 37) % 128;
    for (int i = 0; i < count; ++i, ++seq) {
      auto call = builder.add_call();
      call.setReply(seq % 10 == 0);
      call.initPing().setValue(seq * 3);
      if (seq % 10 == 0) expected.push_back(seq);
    }
    ASSERT_TRUE(client->send_pieces(builder.finish()).ok());
  }
  // Sent without reading: completions piled up in the ring and in the client's queue.
  std::vector<uint64_t> got;
  Message message;
  while (got.size() < expected.size()) {
    const Status status = client->receive(message, 5s);
    ASSERT_TRUE(status.ok()) << status;
    for (auto [s, value] : completions_of(message)) {
      EXPECT_EQ(value, s * 3);
      got.push_back(s);
    }
  }
  EXPECT_EQ(got, expected);
  ASSERT_TRUE(send_stop(*client).ok());
  hiberd.join();
}

TEST(ChannelTest, SynchronousRoundTrips) {
  TestServer server;
  auto client = connect(server);
  ASSERT_NE(client, nullptr);
  std::thread hiberd([&] { echo(server.channel()); });
  BatchBuilder builder(1);
  Message message;
  for (uint64_t seq = 1; seq <= 2000; ++seq) {
    builder.reset(seq);
    auto call = builder.add_call();
    call.setReply(true);
    call.initPing().setValue(seq + 5);
    ASSERT_TRUE(client->send_pieces(builder.finish()).ok());
    ASSERT_TRUE(client->receive(message, 5s).ok());
    const auto completions = completions_of(message);
    ASSERT_EQ(completions.size(), 1u);
    ASSERT_EQ(completions[0], std::make_pair(seq, seq + 5));
  }
  ASSERT_TRUE(send_stop(*client).ok());
  hiberd.join();
}

TEST(ChannelTest, NeitherSideWaitsOnTheOtherWhenBothRingsFill) {
  // The server posts completions while the client keeps sending and never receives. Both rings
  // fill; the server's blocked send() wakes the client's blocked send(), which drains
  // completions. Without that nudge every round would cost a 50 ms sleep slice.
  TestServer server;
  auto client = connect(server);
  ASSERT_NE(client, nullptr);
  constexpr int kCompletions = 2000;
  std::atomic<bool> server_done{false};
  Clock::duration server_time{};
  std::thread hiberd([&] {
    const auto start = Clock::now();
    for (int i = 1; i <= kCompletions; ++i) {
      capnp::MallocMessageBuilder reply;
      auto c = reply.initRoot<proto::ServerMessage>().initCompletions(1)[0];
      c.setSeq(i);
      c.initResult().setPing(i);
      ASSERT_TRUE(server.channel().send(reply).ok());
    }
    server_time = Clock::now() - start;
    server_done = true;
    echo(server.channel());  // now drain the requests
  });
  // Fill the request ring; the last send blocks until the server starts reading.
  BatchBuilder builder(8);
  uint64_t seq = 1;
  while (!server_done) {
    builder.reset(seq);
    for (int i = 0; i < 8; ++i) builder.add_call().initPing().setValue(seq++);
    ASSERT_TRUE(client->send_pieces(builder.finish()).ok());
  }
  ASSERT_TRUE(send_stop(*client).ok());
  hiberd.join();
  EXPECT_LT(server_time, 1s) << "the server's sends waited on sleep slices";
  Message message;
  for (int i = 1; i <= kCompletions; ++i) {
    ASSERT_TRUE(client->receive(message, 1s).ok()) << i;
    ASSERT_EQ(completions_of(message).at(0).first, static_cast<uint64_t>(i));
  }
  EXPECT_EQ(client->receive(message, 10ms).code(), ErrorCode::kTimeout);
}

TEST(ChannelTest, SendTimesOutWhenTheClientStopsReading) {
  TestServer server;
  auto client = connect(server);
  ASSERT_NE(client, nullptr);
  ServerChannel& channel = server.channel();
  Status status;
  int sent = 0;
  const auto start = Clock::now();
  while (status.ok()) {
    capnp::MallocMessageBuilder reply;
    reply.initRoot<proto::ServerMessage>().initCompletions(1)[0].setSeq(++sent);
    status = channel.send(reply, 20ms);
  }
  EXPECT_EQ(status.code(), ErrorCode::kTimeout) << status;
  EXPECT_GT(sent, 10);
  EXPECT_LT(Clock::now() - start, 2s);
  // Every completion that was accepted arrives whole.
  Message message;
  for (int i = 1; i < sent; ++i) {
    ASSERT_TRUE(client->receive(message, 1s).ok()) << i;
    ASSERT_TRUE(
        read_message<proto::ServerMessage>(message, "m", [&](proto::ServerMessage::Reader m) {
          EXPECT_EQ(m.getCompletions()[0].getSeq(), static_cast<uint64_t>(i));
          return Status();
        }).ok());
  }
  EXPECT_EQ(client->receive(message, 10ms).code(), ErrorCode::kTimeout);
}

TEST(ChannelTest, AMessageTooBigForOneRecordIsRefusedWhenSentWithATimeLimit) {
  TestServer server;
  auto client = connect(server);
  ASSERT_NE(client, nullptr);
  ServerChannel& channel = server.channel();
  // A message that would need several records: with a time limit it could stop half-way and
  // leave the client's ring in the middle of a message, so it is refused before anything moves.
  capnp::MallocMessageBuilder big;
  auto list = big.initRoot<proto::ServerMessage>().initCompletions(1);
  list[0].setSeq(1);
  list[0].setMessage(std::string(channel.max_unfragmented_message_bytes(), 'x'));
  EXPECT_EQ(channel.send(big, 20ms).code(), ErrorCode::kInvalidValue);
  Message message;
  EXPECT_EQ(client->receive(message, 10ms).code(), ErrorCode::kTimeout) << "something was sent";
  // Without a time limit it goes through, in fragments.
  EXPECT_TRUE(channel.send(big).ok());
  ASSERT_TRUE(client->receive(message, 1s).ok());
  EXPECT_GT(message.size(), channel.max_unfragmented_message_bytes());
}

TEST(ChannelTest, StagingReleaseWakesTheClient) {
  TestServer server;
  auto client = connect(server);
  ASSERT_NE(client, nullptr);
  std::atomic<bool> returned{false};
  Clock::time_point woke;
  std::thread waiter([&] {
    EXPECT_TRUE(client->wait_staging_released(1000, 10s).ok());
    woke = Clock::now();
    returned = true;
  });
  server.channel().release_staging(500);
  std::this_thread::sleep_for(30ms);
  EXPECT_FALSE(returned) << "500 < 1000: still waiting";
  const auto released = Clock::now();
  server.channel().release_staging(1000);
  waiter.join();
  EXPECT_LT(woke - released, 1s);
  server.channel().release_staging(10);  // never backwards
  EXPECT_EQ(client->staging_released(), 1000u);
  EXPECT_EQ(client->wait_staging_released(2000, 30ms).code(), ErrorCode::kTimeout);
}

TEST(ChannelTest, CloseWakesAClientBlockedInReceive) {
  TestServer server;
  auto client = connect(server);
  ASSERT_NE(client, nullptr);
  ServerChannel& channel = server.channel();
  std::thread closer([&] {
    std::this_thread::sleep_for(30ms);
    channel.close();
  });
  Message message;
  const auto start = Clock::now();
  EXPECT_EQ(client->receive(message, 10s).code(), ErrorCode::kDeinitialized);
  EXPECT_LT(Clock::now() - start, 1s);
  closer.join();
  EXPECT_FALSE(client->server_alive());
  EXPECT_EQ(send_stop(*client).code(), ErrorCode::kDeinitialized);
  EXPECT_EQ(client->wait_staging_released(1, 10s).code(), ErrorCode::kDeinitialized);
}

TEST(ChannelTest, CloseWakesTheServerBlockedInReceive) {
  TestServer server;
  auto client = connect(server);
  ASSERT_NE(client, nullptr);
  ServerChannel& channel = server.channel();
  std::thread closer([&] {
    std::this_thread::sleep_for(30ms);
    channel.close();
  });
  Message message;
  const auto start = Clock::now();
  EXPECT_EQ(channel.receive(message, 10s).code(), ErrorCode::kDeinitialized);
  EXPECT_LT(Clock::now() - start, 1s);
  closer.join();
  EXPECT_TRUE(channel.closed());
  capnp::MallocMessageBuilder reply;
  reply.initRoot<proto::ServerMessage>().initClosing();
  EXPECT_EQ(channel.send(reply).code(), ErrorCode::kDeinitialized);
}

TEST(ChannelTest, InterruptWakesTheServerBlockedInReceive) {
  TestServer server;
  auto client = connect(server);
  ASSERT_NE(client, nullptr);
  ServerChannel& channel = server.channel();
  Message message;
  // An interrupt that comes first makes the next receive return at once, once.
  channel.interrupt();
  EXPECT_EQ(channel.receive(message, 10s).code(), ErrorCode::kNotReady);
  EXPECT_EQ(channel.receive(message, 20ms).code(), ErrorCode::kTimeout);
  // An interrupt while blocked wakes the receiver without closing anything.
  std::thread interrupter([&] {
    std::this_thread::sleep_for(30ms);
    channel.interrupt();
  });
  const auto start = Clock::now();
  EXPECT_EQ(channel.receive(message, 10s).code(), ErrorCode::kNotReady);
  EXPECT_LT(Clock::now() - start, 1s);
  interrupter.join();
  EXPECT_FALSE(channel.closed());
  EXPECT_TRUE(client->server_alive());
}

TEST(ChannelTest, MessagesSentBeforeCloseAreDelivered) {
  TestServer server;
  auto client = connect(server);
  ASSERT_NE(client, nullptr);
  capnp::MallocMessageBuilder closing;
  closing.initRoot<proto::ServerMessage>().initClosing().setMessage("draining the node");
  ASSERT_TRUE(server.channel().send(closing).ok());
  server.channel().close();
  Message message;
  ASSERT_TRUE(client->receive(message, 1s).ok());
  EXPECT_TRUE(read_message<proto::ServerMessage>(message, "m", [](proto::ServerMessage::Reader m) {
                EXPECT_EQ(m.which(), proto::ServerMessage::CLOSING);
                EXPECT_EQ(std::string(m.getClosing().getMessage().cStr()), "draining the node");
                return Status();
              }).ok());
  EXPECT_EQ(client->receive(message, 1s).code(), ErrorCode::kDeinitialized);
}

TEST(ChannelTest, ClientNoticesTheServerSocketClosing) {
  TestServer server;
  auto client = connect(server);
  ASSERT_NE(client, nullptr);
  UniqueFd& socket = server.socket();
  std::thread crasher([&] {
    std::this_thread::sleep_for(30ms);
    socket.reset();  // hiberd died: no close(), no bell
  });
  Message message;
  const auto start = Clock::now();
  EXPECT_EQ(client->receive(message, 10s).code(), ErrorCode::kDeinitialized);
  EXPECT_LT(Clock::now() - start, 1s);
  crasher.join();
  EXPECT_FALSE(client->server_alive());
}

TEST(ChannelTest, BlockedSendNoticesTheServerSocketClosing) {
  TestServer server;
  auto client = connect(server);
  ASSERT_NE(client, nullptr);
  UniqueFd& socket = server.socket();
  std::thread crasher([&] {
    std::this_thread::sleep_for(50ms);
    socket.reset();
  });
  BatchBuilder builder(16);
  Status status;
  const auto start = Clock::now();
  for (uint64_t seq = 1; status.ok(); seq += 16) {  // nobody reads: the ring fills, send blocks
    builder.reset(seq);
    for (int i = 0; i < 16; ++i) builder.add_call().initPing();
    status = client->send_pieces(builder.finish());
  }
  EXPECT_EQ(status.code(), ErrorCode::kDeinitialized) << status;
  EXPECT_LT(Clock::now() - start, 2s);
  crasher.join();
}

TEST(ChannelTest, ServerRejectsACorruptRequestRing) {
  TestServer server;
  auto client = connect(server);
  ASSERT_NE(client, nullptr);
  ServerChannel& channel = server.channel();
  // A hostile client writes the request ring's header directly.
  const ChannelLayout& layout = channel.layout();
  void* base =
      ::mmap(nullptr, layout.memfd_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, channel.memfd(), 0);
  ASSERT_NE(base, MAP_FAILED);
  const ChannelViews views = views_of(static_cast<std::byte*>(base), layout);
  views.requests.header->tail.store(layout.request_ring_bytes * 3);
  ring(views.requests.header->not_empty);
  Message message;
  const Status status = channel.receive(message, 1s);
  EXPECT_EQ(status.code(), ErrorCode::kInvalidValue);
  EXPECT_NE(status.message().find("corrupt ring"), std::string::npos) << status;

  // And the completion ring's consumer position.
  views.completions.header->head.store(12345);
  capnp::MallocMessageBuilder reply;
  reply.initRoot<proto::ServerMessage>().initCompletions(1);
  const Status send_status = channel.send(reply);
  EXPECT_EQ(send_status.code(), ErrorCode::kInvalidValue) << send_status;
  ::munmap(base, layout.memfd_bytes);
}

TEST(ChannelTest, TheMemfdCannotBeResized) {
  auto channel = ServerChannel::create(small_config());
  ASSERT_TRUE(channel.ok());
  const int fd = (*channel)->memfd();
  const int seals = ::fcntl(fd, F_GET_SEALS);
  EXPECT_EQ(seals & (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL),
            F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL);
  const off_t size = static_cast<off_t>((*channel)->layout().memfd_bytes);
  EXPECT_NE(::ftruncate(fd, size / 2), 0);
  EXPECT_EQ(errno, EPERM);
  EXPECT_NE(::ftruncate(fd, size * 2), 0);
  EXPECT_NE(::fcntl(fd, F_ADD_SEALS, F_SEAL_WRITE), 0);
}

TEST(ChannelTest, ManySessionsAtOnce) {
  constexpr int kSessions = 4;
  std::vector<std::unique_ptr<TestServer>> servers;
  std::vector<std::unique_ptr<ClientChannel>> clients;
  for (int s = 0; s < kSessions; ++s) {
    servers.push_back(std::make_unique<TestServer>());
    clients.push_back(connect(*servers.back()));
    ASSERT_NE(clients.back(), nullptr);
  }
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int s = 0; s < kSessions; ++s) {
    threads.emplace_back([&, s] { echo(servers[s]->channel()); });
    threads.emplace_back([&, s] {
      BatchBuilder builder(4);
      Message message;
      for (uint64_t seq = 1; seq <= 2000; seq += 4) {
        builder.reset(seq);
        for (int i = 0; i < 4; ++i) {
          auto call = builder.add_call();
          call.setReply(i == 3);
          call.initPing().setValue(seq + i + s);
        }
        if (!clients[s]->send_pieces(builder.finish()).ok() ||
            !clients[s]->receive(message, 5s).ok() ||
            completions_of(message) !=
                std::vector<std::pair<uint64_t, uint64_t>>{{seq + 3, seq + 3 + s}}) {
          ++failures;
          break;
        }
      }
      (void)send_stop(*clients[s]);
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(failures.load(), 0);
}

// --- Handshake failures ---------------------------------------------------------------------

TEST(ChannelConnectTest, RejectionReachesTheClient) {
  TestServer server(Reply::kReject);
  const auto client = ClientChannel::connect(server.options());
  EXPECT_EQ(client.status().code(), ErrorCode::kNotPermitted);
  EXPECT_EQ(client.status().message(), "hiberd rejected the session: bad token");
}

TEST(ChannelConnectTest, NoServerIsNoDevice) {
  ClientOptions options{.socket_path = "/tmp/hiber-wire-test-no-such-dir/hiberd.sock",
                        .function_id = "fn"};
  auto client = ClientChannel::connect(options);
  EXPECT_EQ(client.status().code(), ErrorCode::kNoDevice);
  EXPECT_NE(client.status().message().find("hiberd is not running at"), std::string::npos)
      << client.status();

  // A socket file nobody listens on.
  char dir[] = "/tmp/hiber-wire-test-XXXXXX";
  ASSERT_NE(::mkdtemp(dir), nullptr);
  options.socket_path = std::string(dir) + "/stale.sock";
  {
    UniqueFd stale(::socket(AF_UNIX, SOCK_STREAM, 0));
    sockaddr_un address{};
    address.sun_family = AF_UNIX;
    std::strcpy(address.sun_path, options.socket_path.c_str());
    ASSERT_EQ(::bind(stale.get(), reinterpret_cast<sockaddr*>(&address), sizeof(address)), 0);
  }
  client = ClientChannel::connect(options);
  EXPECT_EQ(client.status().code(), ErrorCode::kNoDevice) << client.status();
  ::unlink(options.socket_path.c_str());
  ::rmdir(dir);
}

TEST(ChannelConnectTest, SilentServerTimesOut) {
  TestServer server(Reply::kSilent);
  ClientOptions options = server.options();
  options.handshake_timeout = 100ms;
  const auto client = ClientChannel::connect(options);
  EXPECT_EQ(client.status().code(), ErrorCode::kTimeout) << client.status();
}

TEST(ChannelConnectTest, ListenerThatAcceptsNothingTimesOut) {
  testing::WedgedListener wedged(testing::WedgedListener::Wedge::kQueueFull);
  ASSERT_TRUE(wedged.ready()) << "could not fill the listen queue of " << wedged.path();
  const ClientOptions options{
      .socket_path = wedged.path(), .function_id = "fn", .handshake_timeout = 100ms};
  const auto client = ClientChannel::connect(options);
  EXPECT_EQ(client.status().code(), ErrorCode::kTimeout) << client.status();
  EXPECT_NE(client.status().message().find(wedged.path()), std::string::npos) << client.status();
  EXPECT_NE(client.status().message().find("accepted no connection within 100 ms"),
            std::string::npos)
      << client.status();
}

TEST(ChannelConnectTest, ConnectDeadlineDoesNotBindLaterSends) {
  testing::WedgedListener listener(testing::WedgedListener::Wedge::kSilent);
  const auto socket = connect_unix(listener.path(), 100ms);
  ASSERT_TRUE(socket.ok()) << socket.status();
  timeval send_timeout{.tv_sec = -1, .tv_usec = -1};
  socklen_t size = sizeof(send_timeout);
  ASSERT_EQ(::getsockopt(socket->get(), SOL_SOCKET, SO_SNDTIMEO, &send_timeout, &size), 0);
  EXPECT_EQ(send_timeout.tv_sec, 0);
  EXPECT_EQ(send_timeout.tv_usec, 0);
}

TEST(ChannelConnectTest, ListenerSilentAfterAcceptTimesOut) {
  testing::WedgedListener wedged(testing::WedgedListener::Wedge::kSilent);
  const ClientOptions options{
      .socket_path = wedged.path(), .function_id = "fn", .handshake_timeout = 100ms};
  const auto client = ClientChannel::connect(options);
  EXPECT_EQ(client.status().code(), ErrorCode::kTimeout) << client.status();
  EXPECT_NE(client.status().message().find("did not answer the hello within 100 ms"),
            std::string::npos)
      << client.status();
}

TEST(ChannelConnectTest, WelcomeWithoutTheMemfdIsInvalid) {
  TestServer server(Reply::kWelcomeWithoutMemfd);
  const auto client = ClientChannel::connect(server.options());
  EXPECT_EQ(client.status().code(), ErrorCode::kInvalidValue) << client.status();
}

TEST(ChannelConnectTest, LayoutNotMatchingTheMemfdIsInvalid) {
  TestServer server(Reply::kWelcomeWithBadLayout);
  const auto client = ClientChannel::connect(server.options());
  EXPECT_EQ(client.status().code(), ErrorCode::kInvalidValue);
  EXPECT_NE(client.status().message().find("bad channel layout"), std::string::npos)
      << client.status();
}

TEST(ChannelConnectTest, BadOptionsAreRefusedBeforeConnecting) {
  ClientOptions options{.socket_path = std::string(200, 'p'), .function_id = "fn"};
  EXPECT_EQ(ClientChannel::connect(options).status().code(), ErrorCode::kInvalidValue);
}

}  // namespace
}  // namespace hiber::wire
