#include "server/io_loop.h"

#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cstring>
#include <thread>

namespace hiber::server {
namespace {

class IoLoopTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto created = IoLoop::create(64);
    ASSERT_TRUE(created.ok()) << created.status();
    loop_ = std::move(created).value();
  }
  std::unique_ptr<IoLoop> loop_;
};

TEST_F(IoLoopTest, ReceivesWhatASocketSends) {
  int fds[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM, 0, fds), 0);
  UniqueFd a(fds[0]), b(fds[1]);
  std::array<std::byte, 16> buffer{};
  int got = -1;
  loop_->recv(a.get(), buffer, [&](int n, bool) {
    got = n;
    loop_->stop();
  });
  ASSERT_EQ(::write(b.get(), "hello", 5), 5);
  ASSERT_TRUE(loop_->run().ok());
  EXPECT_EQ(got, 5);
  EXPECT_EQ(std::memcmp(buffer.data(), "hello", 5), 0);
}

TEST_F(IoLoopTest, PostedWorkRunsOnTheLoopThread) {
  std::atomic<int> ran{0};
  std::thread::id loop_thread;
  std::thread poster([&] {
    for (int i = 0; i < 1000; ++i) loop_->post([&] { ran++; });
    loop_->post([&] {
      loop_thread = std::this_thread::get_id();
      loop_->stop();
    });
  });
  ASSERT_TRUE(loop_->run().ok());
  poster.join();
  EXPECT_EQ(ran.load(), 1000);
  EXPECT_EQ(loop_thread, std::this_thread::get_id());
}

TEST_F(IoLoopTest, CancelledOperationsStillReportOnce) {
  int fds[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM, 0, fds), 0);
  UniqueFd a(fds[0]), b(fds[1]);
  std::array<std::byte, 16> buffer{};
  int calls = 0, result = 0;
  auto op = loop_->recv(a.get(), buffer, [&](int n, bool) {
    ++calls;
    result = n;
  });
  loop_->cancel(op);
  loop_->timeout(std::chrono::milliseconds(50), [&](int, bool) { loop_->stop(); });
  ASSERT_TRUE(loop_->run().ok());
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(result, -ECANCELED);
}

TEST_F(IoLoopTest, MultishotAcceptKeepsItsHandler) {
  int fds[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM, 0, fds), 0);
  ::close(fds[0]);
  ::close(fds[1]);
  UniqueFd listener(::socket(AF_UNIX, SOCK_STREAM, 0));
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::string path = "/tmp/hiber-ioloop-" + std::to_string(::getpid());
  std::strcpy(addr.sun_path, path.c_str());
  ::unlink(path.c_str());
  ASSERT_EQ(::bind(listener.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  ASSERT_EQ(::listen(listener.get(), 8), 0);
  std::vector<UniqueFd> accepted;
  loop_->accept_multishot(listener.get(), [&](int fd, bool more) {
    EXPECT_TRUE(more);
    accepted.emplace_back(fd);
    if (accepted.size() == 3) loop_->stop();
  });
  std::vector<UniqueFd> clients;
  for (int i = 0; i < 3; ++i) {
    clients.emplace_back(::socket(AF_UNIX, SOCK_STREAM, 0));
    ASSERT_EQ(::connect(clients.back().get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  }
  ASSERT_TRUE(loop_->run().ok());
  EXPECT_EQ(accepted.size(), 3u);
  ::unlink(path.c_str());
}

// What hiberd's accept loop relies on (issue 18, item 1): when the completion queue overflows,
// the kernel ends a multishot accept with a last completion that carries an accepted socket
// (res >= 0) and no IORING_CQE_F_MORE. Whoever re-arms only after errors stops accepting.
TEST(IoLoopOverflowTest, AnOverflowingCompletionQueueEndsAMultishotAcceptWithASocket) {
  auto created = IoLoop::create(4, 4);
  ASSERT_TRUE(created.ok()) << created.status();
  IoLoop& loop = **created;
  UniqueFd listener(::socket(AF_UNIX, SOCK_STREAM, 0));
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::string path = "/tmp/hiber-ioloop-overflow-" + std::to_string(::getpid());
  std::strcpy(addr.sun_path, path.c_str());
  ::unlink(path.c_str());
  ASSERT_EQ(::bind(listener.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  ASSERT_EQ(::listen(listener.get(), 256), 0);
  std::vector<UniqueFd> accepted;
  int ended_with_socket = 0;
  loop.accept_multishot(listener.get(), [&](int fd, bool more) {
    if (fd >= 0) accepted.emplace_back(fd);
    if (fd >= 0 && !more) ++ended_with_socket;
  });
  // Submits the accept, then returns.
  loop.post([&] { loop.stop(); });
  ASSERT_TRUE(loop.run().ok());
  // 64 connections while nobody reaps completions: far more than the queue's 4 entries.
  std::vector<UniqueFd> clients;
  for (int i = 0; i < 64; ++i) {
    clients.emplace_back(::socket(AF_UNIX, SOCK_STREAM, 0));
    ASSERT_EQ(::connect(clients.back().get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  }
  loop.timeout(std::chrono::milliseconds(100), [&](int, bool) { loop.stop(); });
  ASSERT_TRUE(loop.run().ok());
  EXPECT_EQ(ended_with_socket, 1);
  // The accept is over: the rest wait in the backlog.
  EXPECT_LT(accepted.size(), clients.size());
  ::unlink(path.c_str());
}

TEST(IoLoopOverflowTest, ACompletionQueueSmallerThanTheQueueIsRefused) {
  auto created = IoLoop::create(8, 4);
  ASSERT_FALSE(created.ok());
  EXPECT_EQ(created.status().code(), ErrorCode::kInvalidValue);
}

}  // namespace
}  // namespace hiber::server
