// Attached workers (docs/router.md, "Attached workers"): functions registered with
// external: true, whose workers the test starts itself (as a container runtime would), real
// hiber-echo-worker, hiber_router_test_worker and Python echo worker processes attaching to a
// real hiber-router over its Unix socket and its TCP listener with the worker token. Answers are
// checked against the request bodies; refusals against the router's log lines.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <fstream>
#include <memory>
#include <sstream>
#include <thread>

#include <gtest/gtest.h>

#include "router/worker_protocol.h"
#include "tests/router/router_harness.h"

namespace hiber::testing {
namespace {

using namespace std::chrono_literals;
using nlohmann::json;

size_t count_of(const std::string& text, const std::string& what) {
  size_t count = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++count;
  return count;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// A TCP port nobody listens on now (for a router that must start after its workers).
uint16_t free_tcp_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t length = sizeof address;
  EXPECT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof address), 0);
  EXPECT_EQ(::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length), 0);
  ::close(fd);
  return ntohs(address.sin_port);
}

// One hiberd and a router in front of it that listens for attaching workers on its Unix socket
// (the default, <state_dir>/attach.sock) and on TCP.
struct AttachNode {
  explicit AttachNode(std::vector<std::string> flags = {},
                      std::string state = temp_dir("hiber-attach-test"), uint16_t port = 0)
      : state_dir(std::move(state)), router_flags(std::move(flags)) {
    router_flags.push_back("--run_dir=" + hiberd.run_dir());
    router_flags.push_back("--worker_attach_listen=127.0.0.1:" + std::to_string(port));
    router_flags.push_back("--worker_attach_port_file=" + state_dir + "/attach-port");
    start_router();
  }
  void start_router() {
    ::unlink((state_dir + "/attach-port").c_str());
    router = std::make_unique<RouterProcess>(state_dir, router_flags);
    EXPECT_TRUE(eventually([&] {
      std::ifstream in(state_dir + "/attach-port");
      return static_cast<bool>(in >> tcp_port) && tcp_port > 0;
    })) << router->log();
  }
  std::string unix_address() const { return state_dir + "/attach.sock"; }
  std::string tcp_address() const { return "tcp:127.0.0.1:" + std::to_string(tcp_port); }
  std::string token_file() const { return state_dir + "/worker-token"; }

  Hiberd hiberd;
  std::string state_dir;
  std::vector<std::string> router_flags;
  unsigned tcp_port = 0;
  std::unique_ptr<RouterProcess> router;
};

json external(json extra = json::object()) {
  json r = {{"external", true}, {"slo_ms", 5000}};
  r.update(extra);
  return r;
}

// A worker process the test starts, attaching to `address` as `function`; SIGKILLed at the end.
class AttachedWorker {
 public:
  AttachedWorker(std::vector<std::string> argv, const std::string& address,
                 const std::string& token_file, const std::string& function,
                 std::vector<std::string> env = {})
      : log_path_(temp_dir("hiber-attached-worker") + "/worker.log") {
    env.push_back("HIBER_WORKER_SOCKET=" + address);
    env.push_back("HIBER_WORKER_TOKEN_FILE=" + token_file);
    env.push_back("HIBER_FUNCTION_ID=" + function);
    pid_ = spawn(argv, log_path_, 0, env);
  }
  ~AttachedWorker() { kill(); }
  void kill() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGKILL);
    wait_exit(pid_, 10s);
    pid_ = -1;
  }
  std::string log() const { return read_file(log_path_); }

 private:
  pid_t pid_ = -1;
  std::string log_path_;
};

std::vector<std::string> cpp_echo() { return {echo_worker_path()}; }
std::vector<std::string> python_echo() { return {"/usr/bin/python3", python_worker_path()}; }

std::string body_for(const std::string& what, unsigned i) {
  std::string body = what + " #" + std::to_string(i) + " ";
  for (unsigned j = 0; j < 300 + i * 97; ++j) body.push_back(static_cast<char>((j * 31 + i) % 256));
  return body;
}

void expect_echoes(const RouterProcess& router, const std::string& function) {
  for (unsigned i = 0; i < 3; ++i) {
    const std::string body = body_for(function, i);
    router::HttpResponse answer = router.infer(function, body);
    ASSERT_EQ(answer.status, 200) << function << ": " << answer.body << router.log();
    EXPECT_EQ(answer.body, body) << function;
  }
}

// A raw connection to the attach socket, as a broken or hostile peer would open.
class RawPeer {
 public:
  explicit RawPeer(const std::string& path) : fd_(::socket(AF_UNIX, SOCK_STREAM, 0)) {
    sockaddr_un address{};
    address.sun_family = AF_UNIX;
    std::snprintf(address.sun_path, sizeof address.sun_path, "%s", path.c_str());
    connected_ = ::connect(fd_, reinterpret_cast<sockaddr*>(&address), sizeof address) == 0;
  }
  ~RawPeer() { ::close(fd_); }
  bool connected() const { return connected_; }
  void send(const std::string& bytes) {
    EXPECT_EQ(::send(fd_, bytes.data(), bytes.size(), MSG_NOSIGNAL),
              static_cast<ssize_t>(bytes.size()));
  }
  // Whether the router closed the connection within `timeout` (a read finds its end).
  bool closed_by_router(std::chrono::milliseconds timeout = 20s) {
    pollfd p{fd_, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(timeout.count())) != 1) return false;
    char byte;
    return ::recv(fd_, &byte, 1, 0) <= 0;
  }

 private:
  int fd_;
  bool connected_ = false;
};

TEST(AttachedWorkers, CppAndPythonServeOverUnixAndTcp) {
  AttachNode node;
  RouterProcess& router = *node.router;
  struct Case {
    std::string function;
    std::vector<std::string> argv;
    std::string address;
  };
  const std::vector<Case> cases = {{"cpp-unix", cpp_echo(), node.unix_address()},
                                   {"cpp-tcp", cpp_echo(), node.tcp_address()},
                                   {"py-unix", python_echo(), node.unix_address()},
                                   {"py-tcp", python_echo(), node.tcp_address()}};
  std::vector<std::unique_ptr<AttachedWorker>> workers;
  for (const Case& c : cases) {
    ASSERT_EQ(router.load(c.function, external()).status, 200);
    workers.push_back(
        std::make_unique<AttachedWorker>(c.argv, c.address, node.token_file(), c.function));
  }
  for (size_t i = 0; i < cases.size(); ++i) {
    expect_echoes(router, cases[i].function);
    EXPECT_EQ(router.function_status(cases[i].function)["instances"], 1) << workers[i]->log();
    EXPECT_EQ(router.function_status(cases[i].function)["external"], true);
  }
  // The token file is the router's secret: created private.
  struct stat st {};
  ASSERT_EQ(::stat(node.token_file().c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
}

// A GPU function's attached worker, with the shim preloaded as a container's environment would
// have it, runs its requests through hiberd like a started one.
TEST(AttachedWorkers, AShimFunctionsRequestsGoThroughHiberd) {
  if (shim_preload().empty()) GTEST_SKIP() << "built without the CUDA toolkit: no shim";
  AttachNode node;
  RouterProcess& router = *node.router;
  ASSERT_EQ(router.load("gpu", external({{"shim", true}})).status, 200);
  AttachedWorker worker(cpp_echo(), node.tcp_address(), node.token_file(), "gpu",
                        {"LD_PRELOAD=" + shim_preload(), "HIBER_RUN_DIR=" + node.hiberd.run_dir()});
  for (unsigned i = 0; i < 3; ++i) {
    const std::string body = body_for("gpu", i);
    router::HttpResponse answer = router.infer("gpu", body);
    ASSERT_EQ(answer.status, 200) << answer.body << worker.log() << router.log();
    EXPECT_EQ(answer.body, body);
    EXPECT_EQ(answer.header("X-Hiber-Node").value_or(""), "node0");
    EXPECT_TRUE(answer.header("X-Hiber-Gpu").has_value());
  }
}

// hiberd gives a request's lease to the session its requestArrived names, so once a GPU function
// has several attached workers each must name its own (HIBER_INSTANCE_ID): a second worker of a
// function whose first named none is refused, saying why, and workers that name theirs attach
// side by side and each serves requests.
TEST(AttachedWorkers, SeveralWorkersOfAGpuFunctionMustNameTheirInstances) {
  if (shim_preload().empty()) GTEST_SKIP() << "built without the CUDA toolkit: no shim";
  AttachNode node;
  RouterProcess& router = *node.router;
  const auto shim_env = [&](const std::string& instance) {
    std::vector<std::string> env = {"LD_PRELOAD=" + shim_preload(),
                                    "HIBER_RUN_DIR=" + node.hiberd.run_dir()};
    if (!instance.empty()) env.push_back("HIBER_INSTANCE_ID=" + instance);
    return env;
  };
  ASSERT_EQ(router.load("unnamed", external({{"shim", true}, {"max_instances", 2}})).status, 200);
  AttachedWorker first(cpp_echo(), node.tcp_address(), node.token_file(), "unnamed", shim_env(""));
  expect_echoes(router, "unnamed");
  AttachedWorker second(cpp_echo(), node.tcp_address(), node.token_file(), "unnamed",
                        shim_env("b"));
  EXPECT_TRUE(eventually([&] {
    return router.log().find("each of its workers must set HIBER_INSTANCE_ID") != std::string::npos;
  })) << router.log();
  EXPECT_EQ(router.function_status("unnamed")["instances"], 1);
  expect_echoes(router, "unnamed");

  ASSERT_EQ(router.load("named", external({{"shim", true}, {"max_instances", 2}})).status, 200);
  AttachedWorker one(cpp_echo(), node.tcp_address(), node.token_file(), "named", shim_env("one"));
  AttachedWorker two(cpp_echo(), node.tcp_address(), node.token_file(), "named", shim_env("two"));
  EXPECT_TRUE(eventually([&] { return router.function_status("named")["instances"] == 2; }))
      << one.log() << two.log() << router.log();
  for (unsigned i = 0; i < 6; ++i) {
    const std::string body = body_for("named", i);
    router::HttpResponse answer = router.infer("named", body);
    ASSERT_EQ(answer.status, 200) << answer.body << router.log();
    EXPECT_EQ(answer.body, body);
  }
}

TEST(AttachedWorkers, StartedBeforeTheRouterTheyAttachOnceItIsUpAndAfterItRestarts) {
  const std::string state_dir = temp_dir("hiber-attach-early");
  {
    std::ofstream token(state_dir + "/worker-token");
    token << "a-token-made-before-the-router\n";
  }
  ASSERT_EQ(::chmod((state_dir + "/worker-token").c_str(), 0600), 0);
  const uint16_t port = free_tcp_port();
  const std::string tcp = "tcp:127.0.0.1:" + std::to_string(port);
  AttachedWorker cpp(cpp_echo(), state_dir + "/attach.sock", state_dir + "/worker-token", "early");
  AttachedWorker py(python_echo(), tcp, state_dir + "/worker-token", "early-py");
  // Nothing listens yet: both keep trying (and say so once).
  ASSERT_TRUE(eventually([&] {
    return cpp.log().find("retrying") != std::string::npos &&
           py.log().find("retrying") != std::string::npos;
  }));

  AttachNode node({}, state_dir, port);
  RouterProcess* router = node.router.get();
  ASSERT_EQ(router->load("early", external()).status, 200);
  ASSERT_EQ(router->load("early-py", external()).status, 200);
  // The first requests wait at the router until the workers' next try attaches them.
  expect_echoes(*router, "early");
  expect_echoes(*router, "early-py");

  // A restarted router (same state: registry and token) gets them back by themselves.
  EXPECT_EQ(router->stop(), 0);
  node.start_router();
  router = node.router.get();
  expect_echoes(*router, "early");
  expect_echoes(*router, "early-py");
  EXPECT_NE(py.log().find("closed the connection; attaching again"), std::string::npos) << py.log();
}

TEST(AttachedWorkers, BadPeersAreRefusedAndTheGoodWorkerKeepsServing) {
  AttachNode node({"--worker_hello_timeout_ms=1500", "--worker_attach_max_pending=2"});
  RouterProcess& router = *node.router;
  ASSERT_EQ(router.load("good", external()).status, 200);
  ASSERT_EQ(router.load("started", {{"command", {echo_worker_path()}}}).status, 200);
  AttachedWorker good(cpp_echo(), node.tcp_address(), node.token_file(), "good");
  expect_echoes(router, "good");

  const std::string wrong_token_file = node.state_dir + "/wrong-token";
  {
    std::ofstream out(wrong_token_file);
    out << "not-the-token\n";
  }
  // Worker processes with a wrong token, an unknown function, a function the router starts.
  AttachedWorker wrong(cpp_echo(), node.unix_address(), wrong_token_file, "good");
  AttachedWorker unknown(python_echo(), node.tcp_address(), node.token_file(), "nobody");
  AttachedWorker not_external(cpp_echo(), node.unix_address(), node.token_file(), "started");
  ASSERT_TRUE(eventually([&] {
    const std::string log = router.log();
    return log.find("refused: a wrong worker token") != std::string::npos &&
           log.find("refused: unknown function \"nobody\"") != std::string::npos &&
           log.find("refused: function \"started\" is not registered with external: true") !=
               std::string::npos;
  })) << router.log();
  expect_echoes(router, "good");
  // Their retries would take the slots the silent peers below count on.
  wrong.kill();
  unknown.kill();
  not_external.kill();

  // Raw peers: a frame that is not a hello, no token, a header that is not JSON.
  const std::string token = read_file(node.token_file()).substr(0, 64);
  struct Bad {
    std::string bytes;
    std::string reason;
  };
  std::string not_json = router::encode_worker_frame({{"x", 1}}, "");
  not_json.replace(router::kWorkerPrefixBytes, 7, "{not js");
  const std::vector<Bad> bad = {
      {router::encode_worker_frame({{"type", "result"}, {"token", token}}, ""),
       "refused: expected a hello, got a frame of type \"result\""},
      {router::encode_worker_frame({{"type", "hello"}, {"function", "good"}}, ""),
       "refused: no worker token in its hello"},
      {not_json, "refused: a bad hello: worker frame header is not valid JSON"},
      {router::encode_worker_frame({{"type", "hello"}, {"function", "good"}, {"token", token}},
                                   "") +
           "trailing",
       "refused: bytes after its hello"}};
  for (const Bad& b : bad) {
    RawPeer peer(node.unix_address());
    ASSERT_TRUE(peer.connected());
    peer.send(b.bytes);
    EXPECT_TRUE(peer.closed_by_router()) << b.reason;
    EXPECT_NE(router.log().find(b.reason), std::string::npos) << b.reason << router.log();
  }
  expect_echoes(router, "good");

  // Silent peers: two wait for their hello (the bound; accepted in the order they connected), a
  // third is closed at once, and the two are closed at the hello deadline.
  RawPeer silent1(node.unix_address()), silent2(node.unix_address());
  RawPeer third(node.unix_address());
  EXPECT_TRUE(third.closed_by_router());
  EXPECT_TRUE(silent1.closed_by_router());
  EXPECT_TRUE(silent2.closed_by_router());
  const std::string log = router.log();
  EXPECT_NE(log.find("connections already wait for their hello (--worker_attach_max_pending)"),
            std::string::npos)
      << log;
  EXPECT_GE(count_of(log, "refused: no hello within 1500 ms"), 2u) << log;
  expect_echoes(router, "good");
  EXPECT_EQ(router.function_status("good")["instances"], 1);
  EXPECT_EQ(router.function_status("good")["failed"], 0);
}

TEST(AttachedWorkers, ADyingWorkerFailsItsRequestAndTheNextWaitsForAnother) {
  AttachNode node({"--worker_start_timeout_ms=3000"});
  RouterProcess& router = *node.router;
  ASSERT_EQ(router.load("t", external({{"concurrency", 2}})).status, 200);
  auto worker = std::make_unique<AttachedWorker>(std::vector<std::string>{test_worker_path()},
                                                 node.unix_address(), node.token_file(), "t");
  EXPECT_EQ(router.infer("t", "first").body, "first");

  router::HttpResponse lost;
  std::thread waiting([&] { lost = router.infer("t", "3", "application/x-test-barrier"); });
  ASSERT_TRUE(eventually([&] { return router.function_status("t")["busy"] == 1; }));
  worker->kill();
  waiting.join();
  EXPECT_EQ(lost.status, 500);
  EXPECT_NE(lost.body.find("lost mid-request"), std::string::npos) << lost.body;

  // No worker now: the next request waits at the router; a worker that attaches serves it.
  router::HttpResponse next;
  std::thread queued([&] { next = router.infer("t", "next"); });
  ASSERT_TRUE(eventually([&] { return router.function_status("t")["queued"] == 1; }));
  worker = std::make_unique<AttachedWorker>(std::vector<std::string>{test_worker_path()},
                                            node.tcp_address(), node.token_file(), "t");
  queued.join();
  EXPECT_EQ(next.status, 200) << next.body;
  EXPECT_EQ(next.body, "next");

  // None attaches within the worker start timeout: 503, saying so.
  worker->kill();
  ASSERT_TRUE(eventually([&] { return router.function_status("t")["instances"] == 0; }));
  router::HttpResponse alone = router.infer("t", "alone");
  EXPECT_EQ(alone.status, 503);
  EXPECT_NE(alone.body.find("no worker of function \\\"t\\\" attached within 3000 ms"),
            std::string::npos)
      << alone.body;
  EXPECT_TRUE(alone.header("Retry-After").has_value());

  // Unloading closes an attached worker's connection; it keeps trying, and is refused.
  worker = std::make_unique<AttachedWorker>(std::vector<std::string>{test_worker_path()},
                                            node.unix_address(), node.token_file(), "t");
  EXPECT_EQ(router.infer("t", "before unload").body, "before unload");
  ASSERT_EQ(router.request("POST", "/v2/repository/models/t/unload").status, 200);
  ASSERT_TRUE(eventually([&] {
    return worker->log().find("closed the connection; attaching again") != std::string::npos &&
           router.log().find("refused: unknown function \"t\"") != std::string::npos;
  })) << worker->log()
      << router.log();
  EXPECT_EQ(router.infer("t", "gone").status, 400);  // unloaded: in the repository, not ready
}

}  // namespace
}  // namespace hiber::testing
