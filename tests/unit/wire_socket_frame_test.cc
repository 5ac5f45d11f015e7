// Framing on stream sockets: the I/O-free FrameReader and the blocking send/receive helpers.
#include "wire/socket_frame.h"

#include <dirent.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>

#include <cstring>
#include <thread>

#include "wire/schema/calls.capnp.h"

namespace hiber::wire {
namespace {

using namespace std::chrono_literals;

std::vector<std::byte> ping_frame(uint64_t value, size_t text_bytes = 0) {
  capnp::MallocMessageBuilder builder;
  auto completion = builder.initRoot<proto::Completion>();
  completion.setSeq(value);
  completion.setMessage(std::string(text_bytes, 'm'));
  auto frame = encode_frame(builder);
  EXPECT_TRUE(frame.ok()) << frame.status();
  return std::move(frame).value();
}

uint64_t seq_of(const Message& message) {
  uint64_t seq = 0;
  EXPECT_TRUE(
      read_message<proto::Completion>(message, "completion", [&](proto::Completion::Reader c) {
        seq = c.getSeq();
        return Status();
      }).ok());
  return seq;
}

std::vector<std::byte> prefix(uint32_t length) {
  std::vector<std::byte> bytes(4);
  std::memcpy(bytes.data(), &length, 4);
  return bytes;
}

struct SocketPair {
  SocketPair() {
    int fds[2];
    EXPECT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds), 0);
    a.reset(fds[0]);
    b.reset(fds[1]);
  }
  UniqueFd a, b;
};

int open_fd_count() {
  int count = 0;
  DIR* dir = ::opendir("/proc/self/fd");
  while (::readdir(dir) != nullptr) ++count;
  ::closedir(dir);
  return count;
}

TEST(FrameReaderTest, ReadsAFrameSplitAtEveryByte) {
  const auto frame = ping_frame(77, 30);
  for (size_t split = 0; split <= frame.size(); ++split) {
    FrameReader reader;
    const auto bytes = std::span(frame);
    EXPECT_EQ(reader.feed(bytes.first(split)), split);
    EXPECT_EQ(reader.complete(), split == frame.size());
    EXPECT_EQ(reader.feed(bytes.subspan(split)), frame.size() - split);
    ASSERT_TRUE(reader.complete()) << "split at " << split;
    ASSERT_TRUE(reader.error().ok());
    EXPECT_EQ(seq_of(reader.message()), 77u);
  }
}

TEST(FrameReaderTest, ReadsOneByteAtATime) {
  const auto frame = ping_frame(5);
  FrameReader reader;
  for (size_t i = 0; i < frame.size(); ++i) {
    EXPECT_FALSE(reader.complete());
    EXPECT_EQ(reader.feed(std::span(frame).subspan(i, 1)), 1u);
  }
  ASSERT_TRUE(reader.complete());
  EXPECT_EQ(seq_of(reader.message()), 5u);
}

TEST(FrameReaderTest, StopsAtTheEndOfAFrame) {
  auto stream = ping_frame(1);
  const size_t first = stream.size();
  const auto second = ping_frame(2, 100);
  stream.insert(stream.end(), second.begin(), second.end());
  FrameReader reader;
  EXPECT_EQ(reader.feed(stream), first);
  ASSERT_TRUE(reader.complete());
  EXPECT_EQ(seq_of(reader.message()), 1u);
  EXPECT_EQ(reader.feed(std::span(stream).subspan(first)), 0u) << "nothing more until reset()";
  reader.reset();
  EXPECT_EQ(reader.feed(std::span(stream).subspan(first)), second.size());
  ASSERT_TRUE(reader.complete());
  EXPECT_EQ(seq_of(reader.message()), 2u);
}

TEST(FrameReaderTest, ZeroAndOversizedLengthsAreErrors) {
  for (const uint32_t length : {0u, kMaxFrameBytes + 1, 0xffffffffu}) {
    FrameReader reader;
    EXPECT_EQ(reader.feed(prefix(length)), 4u);
    EXPECT_FALSE(reader.complete());
    EXPECT_EQ(reader.error().code(), ErrorCode::kInvalidValue) << length;
    EXPECT_EQ(reader.feed(prefix(8)), 0u) << "a broken stream takes nothing more";
  }
  FrameReader reader;
  reader.feed(prefix(kMaxFrameBytes));
  EXPECT_TRUE(reader.error().ok()) << "the limit itself is allowed";
}

TEST(EncodeFrameTest, RefusesMessagesAboveTheLimit) {
  capnp::MallocMessageBuilder builder;
  builder.initRoot<proto::Completion>().setMessage(std::string(kMaxFrameBytes, 'x'));
  const auto frame = encode_frame(builder);
  EXPECT_EQ(frame.status().code(), ErrorCode::kInvalidValue);
}

TEST(SocketFrameTest, SendsAndReceivesWithADescriptor) {
  SocketPair pair;
  UniqueFd memfd(::memfd_create("test", MFD_CLOEXEC));
  ASSERT_TRUE(memfd.valid());
  ASSERT_TRUE(send_frame(pair.a.get(), ping_frame(9), memfd.get()).ok());
  Message message;
  UniqueFd received;
  ASSERT_TRUE(receive_frame(pair.b.get(), message, &received, 1s).ok());
  EXPECT_EQ(seq_of(message), 9u);
  ASSERT_TRUE(received.valid());
  struct stat original {
  }, copy{};
  ASSERT_EQ(::fstat(memfd.get(), &original), 0);
  ASSERT_EQ(::fstat(received.get(), &copy), 0);
  EXPECT_EQ(original.st_ino, copy.st_ino);
  EXPECT_EQ(::fcntl(received.get(), F_GETFD) & FD_CLOEXEC, FD_CLOEXEC);

  // The next frame has no descriptor: any earlier one is dropped.
  ASSERT_TRUE(send_frame(pair.a.get(), ping_frame(10)).ok());
  ASSERT_TRUE(receive_frame(pair.b.get(), message, &received, 1s).ok());
  EXPECT_EQ(seq_of(message), 10u);
  EXPECT_FALSE(received.valid());
}

TEST(SocketFrameTest, ExtraDescriptorsAreClosed) {
  SocketPair pair;
  const int before = open_fd_count();
  {
    // Two descriptors with one frame, as a hostile peer might send.
    UniqueFd one(::memfd_create("one", MFD_CLOEXEC)), two(::memfd_create("two", MFD_CLOEXEC));
    const auto frame = ping_frame(3);
    iovec iov{.iov_base = const_cast<std::byte*>(frame.data()), .iov_len = frame.size()};
    alignas(cmsghdr) char control[CMSG_SPACE(2 * sizeof(int))] = {};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control;
    msg.msg_controllen = sizeof(control);
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(2 * sizeof(int));
    const int fds[2] = {one.get(), two.get()};
    std::memcpy(CMSG_DATA(c), fds, sizeof(fds));
    ASSERT_EQ(::sendmsg(pair.a.get(), &msg, 0), static_cast<ssize_t>(frame.size()));
  }
  Message message;
  UniqueFd received;
  ASSERT_TRUE(receive_frame(pair.b.get(), message, &received, 1s).ok());
  EXPECT_TRUE(received.valid());
  EXPECT_EQ(open_fd_count(), before + 1) << "only the first descriptor is kept";
  received.reset();
  ASSERT_TRUE(send_frame(pair.a.get(), ping_frame(4), pair.a.get()).ok());
  ASSERT_TRUE(receive_frame(pair.b.get(), message, nullptr, 1s).ok());
  EXPECT_EQ(open_fd_count(), before) << "a descriptor nobody asked for is closed";
}

TEST(SocketFrameTest, LargeFramesSurvivePartialWrites) {
  SocketPair pair;
  const int small = 4096;
  ASSERT_EQ(::setsockopt(pair.a.get(), SOL_SOCKET, SO_SNDBUF, &small, sizeof(small)), 0);
  const auto frame = ping_frame(11, kMaxFrameBytes - 200);
  std::thread reader([&] {
    Message message;
    ASSERT_TRUE(receive_frame(pair.b.get(), message, nullptr, 5s).ok());
    EXPECT_EQ(seq_of(message), 11u);
  });
  ASSERT_TRUE(send_frame(pair.a.get(), frame).ok());
  reader.join();
}

TEST(SocketFrameTest, ReceiveTimesOut) {
  SocketPair pair;
  Message message;
  const auto start = std::chrono::steady_clock::now();
  EXPECT_EQ(receive_frame(pair.b.get(), message, nullptr, 50ms).code(), ErrorCode::kTimeout);
  EXPECT_GE(std::chrono::steady_clock::now() - start, 50ms);
  // Half a frame, then silence: still a timeout.
  const auto frame = ping_frame(1);
  ASSERT_EQ(::write(pair.a.get(), frame.data(), 6), 6);
  EXPECT_EQ(receive_frame(pair.b.get(), message, nullptr, 50ms).code(), ErrorCode::kTimeout);
}

TEST(SocketFrameTest, EndOfStreamIsDeinitialized) {
  SocketPair pair;
  pair.a.reset();
  Message message;
  const Status status = receive_frame(pair.b.get(), message, nullptr, 1s);
  EXPECT_EQ(status.code(), ErrorCode::kDeinitialized) << status;
}

TEST(SocketFrameTest, EndOfStreamInsideAFrameIsDeinitialized) {
  SocketPair pair;
  const auto frame = ping_frame(1);
  ASSERT_EQ(::write(pair.a.get(), frame.data(), 10), 10);
  pair.a.reset();
  Message message;
  const Status status = receive_frame(pair.b.get(), message, nullptr, 1s);
  EXPECT_EQ(status.code(), ErrorCode::kDeinitialized);
  EXPECT_NE(status.message().find("inside a frame"), std::string::npos) << status;
}

TEST(SocketFrameTest, BadLengthPrefixIsInvalid) {
  SocketPair pair;
  const auto bad = prefix(kMaxFrameBytes + 1);
  ASSERT_EQ(::write(pair.a.get(), bad.data(), 4), 4);
  Message message;
  EXPECT_EQ(receive_frame(pair.b.get(), message, nullptr, 1s).code(), ErrorCode::kInvalidValue);
}

TEST(SocketFrameTest, SendingToAClosedPeerIsDeinitializedWithoutSigpipe) {
  SocketPair pair;
  pair.b.reset();
  const Status status = send_frame(pair.a.get(), ping_frame(1));
  EXPECT_EQ(status.code(), ErrorCode::kDeinitialized) << status;
}

// hiberd refuses some connections before reading them (a uid not allowed): it answers and
// closes, and the client's send then fails. The answer must still reach the client.
TEST(SocketFrameTest, ExchangeReturnsAnAnswerSentBeforeThePeerClosed) {
  SocketPair pair;
  const auto answer = ping_frame(42);
  ASSERT_TRUE(send_frame(pair.b.get(), answer).ok());
  pair.b.reset();
  Message reply;
  const Status status = exchange_frame(pair.a.get(), ping_frame(1), reply, nullptr, 1s);
  ASSERT_TRUE(status.ok()) << status;
  EXPECT_EQ(seq_of(reply), 42u);
}

TEST(SocketFrameTest, ExchangeWithAPeerThatClosedSilentlyReportsTheSend) {
  SocketPair pair;
  pair.b.reset();
  Message reply;
  const Status status = exchange_frame(pair.a.get(), ping_frame(1), reply, nullptr, 1s);
  EXPECT_EQ(status.code(), ErrorCode::kDeinitialized) << status;
}

TEST(SocketFrameTest, ExchangeSendsThenReceives) {
  SocketPair pair;
  std::thread peer([&] {
    Message request;
    ASSERT_TRUE(receive_frame(pair.b.get(), request, nullptr, 5s).ok());
    ASSERT_TRUE(send_frame(pair.b.get(), ping_frame(seq_of(request) + 1)).ok());
  });
  Message reply;
  const Status status = exchange_frame(pair.a.get(), ping_frame(7), reply, nullptr, 5s);
  peer.join();
  ASSERT_TRUE(status.ok()) << status;
  EXPECT_EQ(seq_of(reply), 8u);
}

}  // namespace
}  // namespace hiber::wire
