// The function SDKs (router/function_sdk.h, router/python/hiber_function.py) as real worker
// processes: this test plays hiber-router's side of the worker protocol on a real Unix socket
// and checks every answer against the bytes it sent.
#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "router/worker_protocol.h"

namespace hiber::router {
namespace {

using nlohmann::json;

// A hang must fail the test, not time it out silently; no assertion depends on speed.
constexpr int kFailsafeMs = 60'000;

struct WorkerKind {
  std::string name;
  std::vector<std::string> argv;
  bool test_worker;  // understands the x-test-* content types
};

std::string python_script(const std::string& relative) {
  return std::string(HIBER_SOURCE_DIR) + "/" + relative;
}

std::vector<WorkerKind> all_kinds() {
  return {
      {"CppEcho", {HIBER_ECHO_WORKER}, false},
      {"PythonEcho", {"/usr/bin/python3", python_script("router/python/echo_worker.py")}, false},
      {"CppTest", {HIBER_TEST_WORKER}, true},
      {"PythonTest", {"/usr/bin/python3", python_script("tests/unit/router_test_worker.py")}, true},
  };
}

// One worker process and the router's end of its connection.
class Worker {
 public:
  // Listens, starts `kind` with the worker environment and accepts its connection.
  Worker(const WorkerKind& kind, int concurrency, bool set_socket = true) {
    char dir[] = "/tmp/hiber-sdk-test-XXXXXX";
    EXPECT_NE(::mkdtemp(dir), nullptr);
    dir_ = dir;
    socket_path_ = dir_ + "/worker.sock";
    stderr_path_ = dir_ + "/stderr";
    listener_ = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_un address{};
    address.sun_family = AF_UNIX;
    std::strncpy(address.sun_path, socket_path_.c_str(), sizeof address.sun_path - 1);
    EXPECT_EQ(::bind(listener_, reinterpret_cast<sockaddr*>(&address), sizeof address), 0);
    EXPECT_EQ(::listen(listener_, 4), 0);

    pid_ = ::fork();
    if (pid_ == 0) {
      if (set_socket) {
        ::setenv("HIBER_WORKER_SOCKET", socket_path_.c_str(), 1);
      } else {
        ::unsetenv("HIBER_WORKER_SOCKET");
      }
      ::setenv("HIBER_CONCURRENCY", std::to_string(concurrency).c_str(), 1);
      ::setenv("HIBER_FUNCTION_ID", "fn-sdk-test", 1);
      const int err = ::open(stderr_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
      ::dup2(err, 2);
      std::vector<char*> argv;
      for (const std::string& arg : kind.argv) argv.push_back(const_cast<char*>(arg.c_str()));
      argv.push_back(nullptr);
      ::execv(argv[0], argv.data());
      ::_exit(127);
    }
    if (!set_socket) return;
    pollfd ready{listener_, POLLIN, 0};
    if (::poll(&ready, 1, kFailsafeMs) != 1) {
      ADD_FAILURE() << "the worker did not connect; its stderr:\n" << stderr_text();
      return;
    }
    connection_ = ::accept4(listener_, nullptr, nullptr, SOCK_CLOEXEC);
    EXPECT_GE(connection_, 0);
  }

  ~Worker() {
    close_connection();
    if (pid_ > 0 && !exited_) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
    ::close(listener_);
    std::remove(socket_path_.c_str());
    std::remove(stderr_path_.c_str());
    ::rmdir(dir_.c_str());
  }

  pid_t pid() const { return pid_; }

  void send_bytes(const std::string& bytes) {
    size_t sent = 0;
    while (sent < bytes.size()) {
      const ssize_t n = ::send(connection_, bytes.data() + sent, bytes.size() - sent, MSG_NOSIGNAL);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return;  // the worker may have closed after a malformed frame
      sent += static_cast<size_t>(n);
    }
  }

  void invoke(const std::string& id, const std::string& content_type, const std::string& body,
              std::optional<int> deadline_ms = std::nullopt,
              std::optional<uint64_t> inference_header_bytes = std::nullopt) {
    json header = {{"type", "invoke"}, {"id", id}, {"content_type", content_type}};
    if (deadline_ms) header["deadline_ms"] = *deadline_ms;
    if (inference_header_bytes) header["inference_header_bytes"] = *inference_header_bytes;
    send_bytes(encode_worker_frame(header, body));
  }

  // The next frame from the worker; fails the test at the end of the stream or a bad frame.
  WorkerFrame read_frame() {
    while (!reader_.complete()) {
      if (pending_.empty()) {
        pollfd ready{connection_, POLLIN, 0};
        if (::poll(&ready, 1, kFailsafeMs) != 1) {
          ADD_FAILURE() << "no frame from the worker; its stderr:\n" << stderr_text();
          return {};
        }
        char buffer[65536];
        const ssize_t n = ::read(connection_, buffer, sizeof buffer);
        if (n <= 0) {
          ADD_FAILURE() << "the worker closed the connection; its stderr:\n" << stderr_text();
          return {};
        }
        pending_.assign(buffer, static_cast<size_t>(n));
      }
      pending_.erase(0, reader_.feed(pending_));
      if (!reader_.error().ok()) {
        ADD_FAILURE() << "bad frame from the worker: " << reader_.error();
        return {};
      }
    }
    return reader_.take();
  }

  void close_connection() {
    if (connection_ >= 0) ::close(connection_);
    connection_ = -1;
  }

  // The worker's exit status (as waitpid's status).
  int wait() {
    int status = 0;
    EXPECT_EQ(::waitpid(pid_, &status, 0), pid_);
    exited_ = true;
    return status;
  }

  std::string stderr_text() const {
    std::ifstream in(stderr_path_);
    std::stringstream text;
    text << in.rdbuf();
    return text.str();
  }

 private:
  std::string dir_;
  std::string socket_path_;
  std::string stderr_path_;
  int listener_ = -1;
  int connection_ = -1;
  pid_t pid_ = -1;
  bool exited_ = false;
  WorkerFrameReader reader_;
  std::string pending_;
};

// Bytes 0..255 repeated: zeros, invalid UTF-8 and every other byte value.
std::string binary(size_t size) {
  std::string out(size, '\0');
  for (size_t i = 0; i < size; ++i) out[i] = static_cast<char>((i * 131 + i / 256) & 0xff);
  return out;
}

void expect_hello(Worker& worker) {
  WorkerFrame hello = worker.read_frame();
  EXPECT_EQ(hello.header.value("type", ""), "hello") << hello.header;
  EXPECT_EQ(hello.header.value("protocol", 0), 1) << hello.header;
  EXPECT_EQ(hello.header.value("function", ""), "fn-sdk-test") << hello.header;
  EXPECT_EQ(hello.header.value("pid", -1), worker.pid()) << hello.header;
  EXPECT_EQ(hello.body, "");
}

void expect_echo(const WorkerFrame& result, const std::string& id, const std::string& type,
                 const std::string& body) {
  EXPECT_EQ(result.header.value("type", ""), "result") << result.header;
  EXPECT_EQ(result.header.value("id", ""), id) << result.header;
  EXPECT_EQ(result.header.value("ok", false), true) << result.header;
  EXPECT_EQ(result.header.value("content_type", ""), type) << result.header;
  EXPECT_EQ(result.body.size(), body.size()) << id;
  EXPECT_TRUE(result.body == body) << id << ": the answer differs from the bytes sent";
}

void expect_exit(Worker& worker, int code) {
  const int status = worker.wait();
  ASSERT_TRUE(WIFEXITED(status)) << "status " << status << "; stderr:\n" << worker.stderr_text();
  EXPECT_EQ(WEXITSTATUS(status), code) << worker.stderr_text();
}

class FunctionSdkTest : public testing::TestWithParam<WorkerKind> {};

TEST_P(FunctionSdkTest, EchoesRequestsInTurnAndExitsZeroWhenClosed) {
  Worker worker(GetParam(), 1);
  expect_hello(worker);
  const std::vector<std::pair<std::string, std::string>> requests = {
      {"application/octet-stream", ""},
      {"application/octet-stream", std::string("\0\0a\0", 4)},
      {"application/json", R"({"inputs":[{"name":"x","shape":[1],"datatype":"FP32","data":[1]}]})"},
      {"application/octet-stream", binary(256 * 3)},
      {"image/x-test", binary(3 << 20)},  // larger than one read
  };
  for (size_t i = 0; i < requests.size(); ++i) {
    const std::string id = "req-" + std::to_string(i);
    worker.invoke(id, requests[i].first, requests[i].second);
    expect_echo(worker.read_frame(), id, requests[i].first, requests[i].second);
  }
  worker.close_connection();
  expect_exit(worker, 0);
}

TEST_P(FunctionSdkTest, AnswersPipelinedRequestsWithConcurrencyFour) {
  constexpr int kConcurrency = 4;
  constexpr int kRequests = 40;
  Worker worker(GetParam(), kConcurrency);
  expect_hello(worker);
  std::map<std::string, std::string> sent;  // id -> body
  auto send_next = [&] {
    const int i = static_cast<int>(sent.size());
    const std::string id = "p-" + std::to_string(i);
    sent[id] = binary(static_cast<size_t>(i) * 997) + id;
    worker.invoke(id, "application/octet-stream", sent[id]);
  };
  // Up to kConcurrency outstanding, as the router keeps them: a new one per answer.
  for (int i = 0; i < kConcurrency; ++i) send_next();
  std::set<std::string> answered;
  while (answered.size() < static_cast<size_t>(kRequests)) {
    WorkerFrame result = worker.read_frame();
    const std::string id = result.header.value("id", "");
    ASSERT_TRUE(sent.count(id)) << result.header;
    EXPECT_TRUE(answered.insert(id).second) << id << " answered twice";
    expect_echo(result, id, "application/octet-stream", sent[id]);
    if (sent.size() < static_cast<size_t>(kRequests)) send_next();
  }
  worker.close_connection();
  expect_exit(worker, 0);
}

TEST_P(FunctionSdkTest, MalformedFrameFromTheRouterEndsTheWorkerWithAMessage) {
  // A header length above the limit, a header that is not a JSON object, an invoke with no id.
  const std::vector<std::string> bad = {
      std::string("\x01\x00\x10\x00\x00\x00\x00\x00\x00\x00\x00\x00", 12),
      std::string("\x03\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00[1]", 15),
      encode_worker_frame({{"type", "invoke"}, {"content_type", "a/b"}}, "x"),
  };
  for (const std::string& frame : bad) {
    Worker worker(GetParam(), 1);
    expect_hello(worker);
    worker.invoke("good", "text/plain", "fine");  // served before the bad frame
    expect_echo(worker.read_frame(), "good", "text/plain", "fine");
    worker.send_bytes(frame);
    const int status = worker.wait();
    ASSERT_TRUE(WIFEXITED(status)) << status;
    EXPECT_NE(WEXITSTATUS(status), 0);
    EXPECT_NE(worker.stderr_text().find("malformed frame from the router"), std::string::npos)
        << worker.stderr_text();
  }
}

TEST_P(FunctionSdkTest, WithoutTheSocketVariableExitsWithAMessage) {
  Worker worker(GetParam(), 1, /*set_socket=*/false);
  expect_exit(worker, 2);
  EXPECT_NE(worker.stderr_text().find("HIBER_WORKER_SOCKET"), std::string::npos);
}

// The test workers only: they have requests that fail, throw or wait for one another.
class TestWorkerSdkTest : public testing::TestWithParam<WorkerKind> {};

TEST_P(TestWorkerSdkTest, HandlerErrorsAndExceptionsAnswerErrorsAndServingGoesOn) {
  Worker worker(GetParam(), 1);
  expect_hello(worker);
  worker.invoke("e1", "application/x-test-error", "the input is bad");
  WorkerFrame error = worker.read_frame();
  EXPECT_EQ(error.header,
            json({{"type", "result"}, {"id", "e1"}, {"ok", false}, {"error", "the input is bad"}}));
  EXPECT_EQ(error.body, "");

  worker.invoke("e2", "application/x-test-throw", "boom 42");
  WorkerFrame thrown = worker.read_frame();
  EXPECT_EQ(thrown.header.value("id", ""), "e2");
  EXPECT_EQ(thrown.header.value("ok", true), false);
  EXPECT_NE(thrown.header.value("error", "").find("boom 42"), std::string::npos) << thrown.header;

  worker.invoke("d1", "application/x-test-deadline", "", 1500);
  expect_echo(worker.read_frame(), "d1", "text/plain", "1500");
  worker.invoke("d2", "application/x-test-deadline", "");
  expect_echo(worker.read_frame(), "d2", "text/plain", "none");

  worker.invoke("after", "application/octet-stream", binary(1000));
  expect_echo(worker.read_frame(), "after", "application/octet-stream", binary(1000));
  worker.close_connection();
  expect_exit(worker, 0);
}

// A handler says a request is the client's mistake (C++: throw ClientError; Python: raise or
// return ClientError): the result carries its 4xx, which the router answers.
TEST_P(TestWorkerSdkTest, AClientErrorCarriesItsStatus) {
  Worker worker(GetParam(), 1);
  expect_hello(worker);
  worker.invoke("c1", "application/x-test-client-error", "x must be positive");
  EXPECT_EQ(worker.read_frame().header, json({{"type", "result"},
                                              {"id", "c1"},
                                              {"ok", false},
                                              {"error", "x must be positive"},
                                              {"status", 422}}));
  // A plain error has no status: the function's own failure.
  worker.invoke("e1", "application/x-test-error", "sad");
  EXPECT_FALSE(worker.read_frame().header.contains("status"));
  worker.close_connection();
  expect_exit(worker, 0);
}

// The binary tensor data extension's JSON length reaches the handler and comes back with its
// answer.
TEST_P(TestWorkerSdkTest, InferenceHeaderBytesReachTheHandlerAndComeBack) {
  Worker worker(GetParam(), 1);
  expect_hello(worker);
  worker.invoke("b1", "application/octet-stream", "{}tensor", std::nullopt, 2);
  const WorkerFrame echoed = worker.read_frame();
  EXPECT_EQ(echoed.header.value("inference_header_bytes", 0), 2) << echoed.header;
  EXPECT_EQ(echoed.body, "{}tensor");
  // Past the body: the worker refuses the frame (a protocol error ends it).
  worker.invoke("b2", "application/octet-stream", "{}", std::nullopt, 3);
  expect_exit(worker, 3);
}

TEST_P(TestWorkerSdkTest, ConcurrencyFourRunsFourHandlersAtOnce) {
  // Each request waits inside the handler until four are there: one at a time, the first
  // would answer "barrier timed out".
  Worker worker(GetParam(), 4);
  expect_hello(worker);
  for (int i = 0; i < 4; ++i)
    worker.invoke("b" + std::to_string(i), "application/x-test-barrier", "4");
  std::set<std::string> answered;
  for (int i = 0; i < 4; ++i) {
    WorkerFrame result = worker.read_frame();
    EXPECT_EQ(result.header.value("ok", false), true) << result.header;
    EXPECT_EQ(result.body, "together");
    answered.insert(result.header.value("id", ""));
  }
  EXPECT_EQ(answered, (std::set<std::string>{"b0", "b1", "b2", "b3"}));
  worker.close_connection();
  expect_exit(worker, 0);
}

std::string kind_name(const testing::TestParamInfo<WorkerKind>& info) { return info.param.name; }

std::vector<WorkerKind> test_kinds() {
  std::vector<WorkerKind> kinds;
  for (const WorkerKind& kind : all_kinds()) {
    if (kind.test_worker) kinds.push_back(kind);
  }
  return kinds;
}

INSTANTIATE_TEST_SUITE_P(Workers, FunctionSdkTest, testing::ValuesIn(all_kinds()), kind_name);
INSTANTIATE_TEST_SUITE_P(Workers, TestWorkerSdkTest, testing::ValuesIn(test_kinds()), kind_name);

}  // namespace
}  // namespace hiber::router
