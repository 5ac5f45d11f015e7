// mlp_server as a function worker: started with HIBER_WORKER_SOCKET, it serves the worker
// protocol (router/function_sdk.h) instead of stdin. This test plays hiber-router's side of the
// protocol against it, run through the shim against hiberd --device=sim, and checks each answer
// against the CPU reference of tiny_mlp_model.h.
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <set>
#include <string>

#include "router/worker_protocol.h"
#include "tests/shim/programs/tiny_mlp_model.h"
#include "tests/shim/shim_runner.h"

namespace hiber::testing::shim {
namespace {

using namespace std::chrono_literals;
using nlohmann::json;
using router::WorkerFrame;

// A hang must fail the test; no assertion depends on speed.
constexpr int kFailsafeMs = 120'000;

// The router's end of one worker connection.
class RouterSide {
 public:
  explicit RouterSide(const std::string& socket_path) : path_(socket_path) {
    listener_ = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_un address{};
    address.sun_family = AF_UNIX;
    std::strncpy(address.sun_path, path_.c_str(), sizeof address.sun_path - 1);
    EXPECT_EQ(::bind(listener_, reinterpret_cast<sockaddr*>(&address), sizeof address), 0);
    EXPECT_EQ(::listen(listener_, 1), 0);
  }
  ~RouterSide() {
    close_connection();
    ::close(listener_);
    std::remove(path_.c_str());
  }

  bool accept() {
    pollfd ready{listener_, POLLIN, 0};
    if (::poll(&ready, 1, kFailsafeMs) != 1) return false;
    connection_ = ::accept4(listener_, nullptr, nullptr, SOCK_CLOEXEC);
    return connection_ >= 0;
  }

  void invoke(const std::string& id, const std::string& content_type, const std::string& body) {
    const std::string frame = router::encode_worker_frame(
        {{"type", "invoke"}, {"id", id}, {"content_type", content_type}}, body);
    ASSERT_EQ(::send(connection_, frame.data(), frame.size(), MSG_NOSIGNAL),
              static_cast<ssize_t>(frame.size()));
  }

  WorkerFrame read_frame() {
    while (!reader_.complete()) {
      if (pending_.empty()) {
        pollfd ready{connection_, POLLIN, 0};
        if (::poll(&ready, 1, kFailsafeMs) != 1) {
          ADD_FAILURE() << "no frame from mlp_server";
          return {};
        }
        char buffer[65536];
        const ssize_t n = ::read(connection_, buffer, sizeof buffer);
        if (n <= 0) {
          ADD_FAILURE() << "mlp_server closed the connection";
          return {};
        }
        pending_.assign(buffer, static_cast<size_t>(n));
      }
      pending_.erase(0, reader_.feed(pending_));
      if (!reader_.error().ok()) {
        ADD_FAILURE() << reader_.error();
        return {};
      }
    }
    return reader_.take();
  }

  void close_connection() {
    if (connection_ >= 0) ::close(connection_);
    connection_ = -1;
  }

 private:
  std::string path_;
  int listener_ = -1;
  int connection_ = -1;
  router::WorkerFrameReader reader_;
  std::string pending_;
};

void expect_text(const WorkerFrame& result, const std::string& id, const std::string& answer) {
  EXPECT_EQ(result.header.value("id", ""), id) << result.header;
  EXPECT_EQ(result.header.value("ok", false), true) << result.header;
  EXPECT_EQ(result.header.value("content_type", ""), "text/plain") << result.header;
  EXPECT_EQ(result.body, answer) << id;
}

TEST(MlpServerWorker, AnswersTheRoutersRequestsOverTheWorkerProtocol) {
  if (std::string why = missing_shim(); !why.empty()) GTEST_SKIP() << why;
  constexpr uint64_t kSeed = 5;
  Hiberd hiberd(sim_hiberd_options());
  const std::string socket_path = hiberd.run_dir() + "/worker-test.sock";
  const std::string log_path = hiberd.run_dir() + "/mlp_server.log";
  RouterSide router(socket_path);
  std::vector<std::string> env = shim_environment(hiberd, "mlp-worker");
  env.push_back("HIBER_WORKER_SOCKET=" + socket_path);
  env.push_back("HIBER_CONCURRENCY=2");
  const pid_t pid =
      spawn(program_argv({"mlp_server", {std::to_string(kSeed), "1"}}), log_path, 0, env);
  ASSERT_TRUE(router.accept()) << read_file(log_path) << "\nhiberd:\n" << hiberd.log();

  WorkerFrame hello = router.read_frame();
  EXPECT_EQ(hello.header.value("type", ""), "hello") << hello.header;
  EXPECT_EQ(hello.header.value("function", ""), "mlp-worker") << hello.header;
  EXPECT_EQ(hello.header.value("pid", -1), pid) << hello.header;

  router.invoke("raw", "application/octet-stream", "3 17\n");
  expect_text(router.read_frame(), "raw", mlp_server_answer(kSeed, 3, 17));

  router.invoke("kserve", "application/json",
                R"({"inputs":[{"name":"line","shape":[1],"datatype":"BYTES","data":["0 -1"]}]})");
  WorkerFrame kserve = router.read_frame();
  EXPECT_EQ(kserve.header.value("ok", false), true) << kserve.header;
  EXPECT_EQ(kserve.header.value("content_type", ""), "application/json");
  EXPECT_EQ(json::parse(kserve.body, nullptr, false),
            json({{"id", "kserve"},
                  {"outputs",
                   {{{"name", "answer"},
                     {"datatype", "BYTES"},
                     {"shape", {1}},
                     {"data", {mlp_server_answer(kSeed, 0, -1)}}}}}}))
      << kserve.body;

  // State kept in device memory between requests.
  router.invoke("count-1", "text/plain", "count");
  expect_text(router.read_frame(), "count-1", "count 1");
  router.invoke("count-2", "text/plain", "count");
  expect_text(router.read_frame(), "count-2", "count 2");

  // A bad request line is the client's mistake (400), and serving goes on.
  router.invoke("bad", "text/plain", "nonsense");
  EXPECT_EQ(router.read_frame().header, json({{"type", "result"},
                                              {"id", "bad"},
                                              {"ok", false},
                                              {"error", "bad request: nonsense"},
                                              {"status", 400}}));

  // Two outstanding at once (HIBER_CONCURRENCY=2), answered in any order.
  router.invoke("p1", "application/octet-stream", "1 5");
  router.invoke("p2", "application/octet-stream", "2 262143");  // the table's last entry
  std::set<std::string> answered;
  for (int i = 0; i < 2; ++i) {
    WorkerFrame result = router.read_frame();
    const std::string id = result.header.value("id", "");
    answered.insert(id);
    expect_text(result, id,
                id == "p1" ? mlp_server_answer(kSeed, 1, 5) : mlp_server_answer(kSeed, 2, 262143));
  }
  EXPECT_EQ(answered, (std::set<std::string>{"p1", "p2"}));

  router.close_connection();
  EXPECT_EQ(wait_exit(pid, 120s), 0) << read_file(log_path);
  EXPECT_EQ(hiberd.stop(), 0) << hiberd.log();
}

// On the simulated GPU without its kernels' host implementations (no --sim_kernel_plugins), a
// request's answer says so, in hiberd's words, instead of the worker dying ("worker was lost");
// the worker goes on answering.
TEST(MlpServerWorker, WithoutItsKernelsOnTheSimulatedGpuARequestSaysWhy) {
  if (std::string why = missing_shim(); !why.empty()) GTEST_SKIP() << why;
  Hiberd hiberd(HiberdOptions{});  // no kernel plugin
  const std::string socket_path = hiberd.run_dir() + "/worker-test.sock";
  const std::string log_path = hiberd.run_dir() + "/mlp_server.log";
  RouterSide router(socket_path);
  std::vector<std::string> env = shim_environment(hiberd, "mlp-no-kernels");
  env.push_back("HIBER_WORKER_SOCKET=" + socket_path);
  const pid_t pid = spawn(program_argv({"mlp_server", {"5", "1"}}), log_path, 0, env);
  ASSERT_TRUE(router.accept()) << read_file(log_path) << "\nhiberd:\n" << hiberd.log();
  ASSERT_EQ(router.read_frame().header.value("type", ""), "hello");
  for (const char* id : {"first", "second"}) {
    router.invoke(id, "application/octet-stream", "3 17");
    const WorkerFrame result = router.read_frame();
    EXPECT_EQ(result.header.value("ok", true), false) << result.header;
    EXPECT_FALSE(result.header.contains("status")) << "the function's failure, not the client's";
    const std::string error = result.header.value("error", "");
    EXPECT_NE(error.find("has no host implementation of this kernel"), std::string::npos)
        << error << "\n" << read_file(log_path);
  }
  router.close_connection();
  EXPECT_EQ(wait_exit(pid, 120s), 0) << read_file(log_path);
  EXPECT_EQ(hiberd.stop(), 0) << hiberd.log();
}

}  // namespace
}  // namespace hiber::testing::shim
