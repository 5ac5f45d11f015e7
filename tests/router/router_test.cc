// hiber-router end to end: real hiberd (--device=sim), a real hiber-router, real worker
// processes (the C++ SDK's echo and test workers, the Python SDK's echo worker), over HTTP.
// Every answer is checked against what was sent, computed independently by the test.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <sys/stat.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <future>
#include <map>
#include <set>
#include <thread>

#include <gtest/gtest.h>

#include "tests/router/router_harness.h"

namespace hiber::testing {
namespace {

using namespace std::chrono_literals;
using nlohmann::json;

// One hiberd and a router in front of it.
struct Node {
  explicit Node(std::vector<std::string> router_flags = {},
                std::vector<std::string> hiberd_flags = {})
      : hiberd(std::move(hiberd_flags)), state_dir(temp_dir("hiber-router-test")) {
    router_flags.push_back("--run_dir=" + hiberd.run_dir());
    router_flags.push_back("--shim_preload=" + shim_preload());
    router = std::make_unique<RouterProcess>(state_dir, router_flags);
  }
  Hiberd hiberd;
  std::string state_dir;
  std::unique_ptr<RouterProcess> router;
};

// Workers run with Hiber's client libraries preloaded (shim: true), so that each request goes
// through hiberd's arrival, start and done; the SDK's cuInit opens their session.
json echo_registration(json extra = json::object()) {
  json r = {{"command", {echo_worker_path()}},
            {"slo_ms", 5000},
            {"idle_timeout_s", 600},
            {"shim", !shim_preload().empty()}};
  r.update(extra);
  return r;
}

json test_worker_registration(json extra = json::object()) {
  json r = {{"command", {test_worker_path()}},
            {"slo_ms", 5000},
            {"idle_timeout_s", 600},
            {"shim", !shim_preload().empty()}};
  r.update(extra);
  return r;
}

std::string binary_body(size_t bytes, unsigned seed) {
  std::string body(bytes, '\0');
  for (size_t i = 0; i < bytes; ++i) body[i] = static_cast<char>((i * 131 + seed * 7) % 256);
  return body;
}

// Waits until hiberd keeps `sessions` sessions for resuming (their records are written in the
// background once their first request fixed their models).
void wait_until_kept(const Hiberd& hiberd, size_t sessions) {
  ASSERT_GE(hiberd.wait_for_session_records(sessions), sessions) << hiberd.log();
}

// hiberd SIGKILLed and started again at once (within 0.1 s: the router's status polls, a second
// apart, both find a hiberd up) and after a pause (a poll finds the node down): the router
// notices the new hiberd (its incarnation, or hiberd saying it does not know the function) and
// registers its functions again (the new hiberd knows them from its state directory already);
// the worker stays, its shim resuming its session with each new hiberd. A request sent while
// hiberd is down waits for it (--node_wait_ms) and is answered; so is every request after.
TEST(Router, AHiberdKilledAndRestartedIsNoticedAndServesAgain) {
  if (shim_preload().empty()) GTEST_SKIP() << "without the shim no request reaches hiberd";
  Node node;
  RouterProcess& router = *node.router;
  ASSERT_EQ(router.load("echo", echo_registration()).status, 200);
  ASSERT_EQ(router.infer("echo", "before").body, "before") << router.log();
  wait_until_kept(node.hiberd, 1);
  for (const auto pause : {0ms, 2500ms}) {
    SCOPED_TRACE(str_cat("restarted after ", pause.count(), " ms"));
    auto restarted = std::async(std::launch::async, [&] { node.hiberd.kill_and_restart(pause); });
    if (pause > 0ms) {
      std::this_thread::sleep_for(pause / 2);  // hiberd is down
      router::HttpResponse waited = router.infer("echo", "sent while hiberd was down");
      EXPECT_EQ(waited.status, 200) << waited.body << "\nrouter:\n" << router.log();
      EXPECT_EQ(waited.body, "sent while hiberd was down");
    }
    restarted.get();
    for (int i = 0; i < 10; ++i) {
      const std::string body = binary_body(500 + i, static_cast<unsigned>(i));
      router::HttpResponse r = router.infer("echo", body);
      ASSERT_EQ(r.status, 200) << r.body << "\nrouter:\n" << router.log() << "\nhiberd:\n"
                               << node.hiberd.log();
      EXPECT_EQ(r.body, body);
    }
  }
  std::string earlier_runs;
  for (int run = 1; run <= 2; ++run) {
    std::ifstream in(node.hiberd.log_path() + ".run-" + std::to_string(run));
    earlier_runs += "\nhiberd, run " + std::to_string(run) + ":\n" +
                    std::string(std::istreambuf_iterator<char>(in), {});
  }
  EXPECT_EQ(router.metric(R"(hiber_worker_starts_total{function="echo"})"), 1)
      << "one worker for all three hiberds: its session resumed with each\n"
      << router.log() << earlier_runs << "\nhiberd, now:\n"
      << node.hiberd.log();
}

// The upgrade path (docs/deploy.md): `hiberctl drain`, then SIGTERM, then the (newer) hiberd
// started. A request sent while the node drains waits at the router for the new hiberd and is
// answered; so is every request after.
TEST(Router, ADrainedAndRestartedHiberdLosesNoRequest) {
  if (shim_preload().empty()) GTEST_SKIP() << "without the shim no request reaches hiberd";
  Node node;
  RouterProcess& router = *node.router;
  ASSERT_EQ(router.load("echo", echo_registration()).status, 200);
  ASSERT_EQ(router.infer("echo", "before").body, "before") << router.log();
  {
    auto control = node.hiberd.control();
    ASSERT_TRUE(control.ok()) << control.status();
    ASSERT_TRUE(control->drain().ok());
  }
  auto during = std::async(std::launch::async, [&] { return router.infer("echo", "during"); });
  std::this_thread::sleep_for(300ms);  // it reached the draining node, which refused it
  EXPECT_EQ(node.hiberd.stop_and_restart(), 0) << "a clean stop";
  router::HttpResponse waited = during.get();
  EXPECT_EQ(waited.status, 200) << waited.body << "\nrouter:\n" << router.log();
  EXPECT_EQ(waited.body, "during");
  for (int i = 0; i < 10; ++i) {
    const std::string body = binary_body(300 + i, static_cast<unsigned>(i));
    router::HttpResponse r = router.infer("echo", body);
    ASSERT_EQ(r.status, 200) << r.body << "\nrouter:\n" << router.log();
    EXPECT_EQ(r.body, body);
  }
  EXPECT_EQ(router.metric(R"(hiber_worker_starts_total{function="echo"})"), 1)
      << "the worker stays: its session resumed with the new hiberd\n"
      << router.log();
}

TEST(Router, EchoRoundTripsThroughHiberd) {
  Node node;
  RouterProcess& router = *node.router;
  ASSERT_EQ(router.load("echo", echo_registration()).status, 200);

  // Raw bytes, zero bytes included, come back exactly; so does a KServe JSON request.
  for (unsigned i = 0; i < 5; ++i) {
    const std::string body = binary_body(1000 + i * 4099, i);
    router::HttpResponse answer = router.infer("echo", body);
    ASSERT_EQ(answer.status, 200) << answer.body << router.log();
    EXPECT_EQ(answer.body, body);
    if (shim_preload().empty()) continue;  // no toolkit, no shim: hiberd is not involved
    EXPECT_EQ(answer.header("X-Hiber-Node").value_or(""), "node0");
    EXPECT_TRUE(answer.header("X-Hiber-Gpu").has_value());
    EXPECT_TRUE(answer.header("X-Hiber-Source").has_value());
    EXPECT_TRUE(answer.header("X-Hiber-Queued-Ms").has_value());
  }
  const json request = {
      {"inputs", {{{"name", "x"}, {"shape", {2}}, {"datatype", "FP32"}, {"data", {1.5, -2.0}}}}}};
  router::HttpResponse answer =
      router.infer("echo", request.dump(), "application/json", {{"X-Request-Id", "my-request-7"}});
  ASSERT_EQ(answer.status, 200);
  EXPECT_EQ(json::parse(answer.body), request);
  EXPECT_EQ(answer.header("X-Request-Id").value_or(""), "my-request-7");

  // The router's numbers and hiberd's agree with what was sent.
  const json status = router.function_status("echo");
  EXPECT_EQ(status["requests"], 6);
  EXPECT_EQ(status["ok"], 6);
  EXPECT_EQ(router.metric(R"(hiber_invocations_total{function="echo",status="200"})"), 6);
  EXPECT_EQ(router.metric(R"(hiber_worker_starts_total{function="echo"})"), 1);
  auto hiberd_status = node.hiberd.status();
  ASSERT_TRUE(hiberd_status.ok());

  // Metadata and readiness.
  router::HttpResponse metadata = router.request("GET", "/v2/models/echo");
  ASSERT_EQ(metadata.status, 200);
  EXPECT_EQ(json::parse(metadata.body)["name"], "echo");
  EXPECT_EQ(router.request("GET", "/v2/models/echo/ready").status, 200);
  EXPECT_EQ(router.request("GET", "/v2/health/live").status, 200);
  EXPECT_EQ(router.request("GET", "/v2/health/ready").status, 200);
  const json index = json::parse(router.request("GET", "/v2/repository/index").body);
  ASSERT_EQ(index.size(), 1u);
  EXPECT_EQ(index[0]["name"], "echo");
}

// A Python worker without the shim: a function that uses no GPU never involves hiberd.
// hiberd closes control connections left idle (issue 18, item 7): the router's pooled ones,
// found closed by its status polls (every second), are replaced, and the node stays up.
TEST(Router, ControlConnectionsHiberdClosedForIdlenessAreReplaced) {
  Hiberd hiberd({"--control_idle_timeout_ms=200"});
  const std::string state_dir = temp_dir("hiber-router-test");
  RouterProcess router(state_dir,
                       {"--run_dir=" + hiberd.run_dir(), "--shim_preload=" + shim_preload(),
                        "--status_interval_ms=1000"});
  ASSERT_EQ(router.load("echo", echo_registration()).status, 200);
  // Polls that each find their pooled connection closed by hiberd.
  std::this_thread::sleep_for(3500ms);
  EXPECT_EQ(router.log().find("is down"), std::string::npos) << router.log();
  EXPECT_EQ(router.metric(R"(hiber_node_up{node="node0"})"), 1);
  router::HttpResponse answer = router.infer("echo", "after idling");
  ASSERT_EQ(answer.status, 200) << answer.body << router.log();
  EXPECT_EQ(answer.body, "after idling");
}

// Before its first successful answer a function has no latency: p50 and p99 are null (shown as
// "-"), not 0 ms.
TEST(Router, LatenciesAreNullUntilAFunctionHasAnswered) {
  Node node;
  RouterProcess& router = *node.router;
  ASSERT_EQ(router.load("t", test_worker_registration()).status, 200);
  json status = router.function_status("t");
  EXPECT_TRUE(status["p50_ms"].is_null()) << status;
  EXPECT_TRUE(status["p99_ms"].is_null()) << status;
  // A failure is no latency either.
  EXPECT_EQ(router.infer("t", "sad", "application/x-test-error").status, 500);
  status = router.function_status("t");
  EXPECT_TRUE(status["p50_ms"].is_null()) << status;
  ASSERT_EQ(router.infer("t", "fine").status, 200);
  status = router.function_status("t");
  ASSERT_TRUE(status["p50_ms"].is_number()) << status;
  EXPECT_GT(status["p50_ms"].get<double>(), 0.0);
  EXPECT_GE(status["p99_ms"].get<double>(), status["p50_ms"].get<double>());
}

TEST(Router, PythonWorker) {
  Node node;
  RouterProcess& router = *node.router;
  ASSERT_EQ(
      router.load("py", {{"command", {"/usr/bin/python3", python_worker_path()}}, {"slo_ms", 5000}})
          .status,
      200);
  for (unsigned i = 0; i < 3; ++i) {
    const std::string body = binary_body(777 + i, i + 3);
    router::HttpResponse answer = router.infer("py", body);
    ASSERT_EQ(answer.status, 200) << answer.body;
    EXPECT_EQ(answer.body, body);
    EXPECT_FALSE(answer.header("X-Hiber-Gpu").has_value());
  }
}

TEST(Router, ErrorsAreTheRequestsOwn) {
  Node node;
  RouterProcess& router = *node.router;
  ASSERT_EQ(router.load("t", test_worker_registration()).status, 200);
  // Unknown function, malformed JSON, a function's error and exception: each a clear answer.
  router::HttpResponse unknown = router.infer("nope", "x");
  EXPECT_EQ(unknown.status, 404);
  EXPECT_NE(unknown.body.find("not registered"), std::string::npos);
  router::HttpResponse malformed = router.infer("t", "{\"inputs\": [", "application/json");
  EXPECT_EQ(malformed.status, 400);
  router::HttpResponse failed = router.infer("t", "the model is sad", "application/x-test-error");
  EXPECT_EQ(failed.status, 500);
  EXPECT_NE(failed.body.find("the model is sad"), std::string::npos) << failed.body;
  router::HttpResponse thrown = router.infer("t", "boom", "application/x-test-throw");
  EXPECT_EQ(thrown.status, 500);
  EXPECT_NE(thrown.body.find("boom"), std::string::npos) << thrown.body;
  // None of that touched the next request.
  router::HttpResponse fine = router.infer("t", "still here");
  EXPECT_EQ(fine.status, 200);
  EXPECT_EQ(fine.body, "still here");
  // A registration that makes no sense is refused with the reason.
  router::HttpResponse bad = router.load("b", {{"command", json::array()}});
  EXPECT_EQ(bad.status, 400);
  EXPECT_NE(bad.body.find("command"), std::string::npos);
  EXPECT_EQ(router.load("b/c", echo_registration()).status, 404);
  EXPECT_EQ(router.load("b", echo_registration({{"slo_ms", -1}})).status, 400);
  EXPECT_EQ(router.load("b", echo_registration({{"colour", "red"}})).status, 400);
}

TEST(Router, AsyncInvocationAndDeadline) {
  Node node;
  RouterProcess& router = *node.router;
  ASSERT_EQ(router.load("t", test_worker_registration({{"concurrency", 4}})).status, 200);
  router::HttpResponse accepted =
      router.infer("t", "later", "text/plain", {{"Prefer", "respond-async"}});
  ASSERT_EQ(accepted.status, 202) << accepted.body;
  const std::string id = json::parse(accepted.body)["id"];
  EXPECT_EQ(accepted.header("Location").value_or(""), "/v2/invocations/" + id);
  router::HttpResponse result;
  ASSERT_TRUE(eventually([&] {
    result = router.request("GET", "/v2/invocations/" + id);
    return result.status != 202;
  }));
  EXPECT_EQ(result.status, 200);
  EXPECT_EQ(result.body, "later");
  EXPECT_EQ(router.request("GET", "/v2/invocations/" + id).status, 404);  // collected

  // The function sees the deadline that is left.
  router::HttpResponse deadline =
      router.infer("t", "", "application/x-test-deadline", {{"X-Hiber-Deadline-Ms", "20000"}});
  ASSERT_EQ(deadline.status, 200);
  const int left = std::stoi(deadline.body);
  EXPECT_GT(left, 0);
  EXPECT_LE(left, 20000);
  // A request that cannot finish by its deadline gets 504 at the deadline; others don't wait.
  std::thread slow([&] {
    router::HttpResponse late =
        router.infer("t", "2", "application/x-test-barrier", {{"X-Hiber-Deadline-Ms", "300"}});
    EXPECT_EQ(late.status, 504) << late.body;
  });
  slow.join();
  EXPECT_EQ(router.infer("t", "x", "application/x-test-deadline", {{"X-Hiber-Deadline-Ms", "abc"}})
                .status,
            400);
  // The barrier request still holds a slot until the worker answers it (60 s): others proceed.
  EXPECT_EQ(router.infer("t", "next").body, "next");
}

TEST(Router, OverloadGets429WithRetryAfter) {
  Node node({"--max_queue=2"});
  RouterProcess& router = *node.router;
  ASSERT_EQ(router.load("t", test_worker_registration()).status, 200);
  ASSERT_EQ(router.infer("t", "warm").status, 200);
  // concurrency 1: one request in the worker (a barrier that never fills: it waits), two in the
  // queue, the rest refused at once.
  std::vector<std::thread> clients;
  std::atomic<int> refused{0};
  std::atomic<int> answered_with_retry{0};
  for (int i = 0; i < 6; ++i) {
    clients.emplace_back([&, i] {
      std::this_thread::sleep_for(std::chrono::milliseconds(i == 0 ? 0 : 300));
      router::HttpResponse r =
          i == 0 ? router.infer("t", "2", "application/x-test-barrier",
                                {{"X-Hiber-Deadline-Ms", "3000"}})
                 : router.infer("t", "q", "text/plain", {{"X-Hiber-Deadline-Ms", "3000"}});
      if (r.status == 429) {
        ++refused;
        if (r.header("Retry-After")) ++answered_with_retry;
      }
    });
  }
  for (auto& c : clients) c.join();
  EXPECT_EQ(refused.load(), 3);
  EXPECT_EQ(answered_with_retry.load(), 3);
}

// hiberd's admission (--shed=late) answers a request that cannot meet its deadline
// "overloaded": the client gets 503 with Retry-After and says so, and the router counts it as
// shed, not failed, as hiberd does.
TEST(Router, ARequestHiberdShedsGets503AndIsCountedAsShed) {
  if (shim_preload().empty()) GTEST_SKIP() << "no shim (built without the CUDA toolkit)";
  Node node({}, {"--shed=late"});
  RouterProcess& router = *node.router;
  // A second's work against a millisecond's deadline: late from its arrival on.
  ASSERT_EQ(router.load("late", echo_registration({{"slo_ms", 1}, {"exec_ms_hint", 1000}})).status,
            200);
  constexpr int kShed = 3;
  for (int i = 0; i < kShed; ++i) {
    router::HttpResponse r = router.infer("late", "x");
    ASSERT_EQ(r.status, 503) << r.body << router.log();
    EXPECT_EQ(r.header("Retry-After").value_or(""), "1");
    const std::string message = json::parse(r.body).value("error", "");
    EXPECT_EQ(message.rfind("function \"late\" is overloaded: node node0 shed the request "
                            "(overloaded: request ",
                            0),
              0u)
        << message;
    EXPECT_NE(message.find("cannot meet its deadline); retry later"), std::string::npos) << message;
  }
  const json status = router.function_status("late");
  EXPECT_EQ(status["requests"], kShed);
  EXPECT_EQ(status["shed"], kShed);
  EXPECT_EQ(status["failed"], 0);
  EXPECT_EQ(status["rejected"], 0);
  EXPECT_EQ(router.metric(R"(hiber_invocations_shed_total{function="late"})"), kShed);
  EXPECT_EQ(router.metric(R"(hiber_invocations_total{function="late",status="503"})"), kShed);
  // hiberd counted the same requests; the router shows its count once it polled the node.
  EXPECT_TRUE(eventually([&] { return router.status()["nodes"][0]["shed"] == kShed; }))
      << router.status().dump();
  EXPECT_EQ(router.status()["nodes"][0]["preemptions"], 0);
}

TEST(Router, ScalesFromZeroAndToZero) {
  Node node;
  RouterProcess& router = *node.router;
  ASSERT_EQ(router.load("e", echo_registration({{"idle_timeout_s", 1}})).status, 200);
  EXPECT_EQ(router.function_status("e")["instances"], 0);  // nothing runs before a request
  ASSERT_EQ(router.infer("e", "one").body, "one");
  EXPECT_EQ(router.function_status("e")["instances"], 1);
  ASSERT_TRUE(eventually([&] { return router.function_status("e")["instances"] == 0; }, 10s))
      << "the idle worker was not stopped";
  ASSERT_EQ(router.infer("e", "two").body, "two");  // from zero again
  EXPECT_EQ(router.metric(R"(hiber_worker_starts_total{function="e"})"), 2);
  EXPECT_EQ(router.metric(R"(hiber_worker_failures_total{function="e"})"), -1);  // none
}

TEST(Router, AWorkerKilledMidRequestFailsThatRequestOnly) {
  Node node;
  RouterProcess& router = *node.router;
  ASSERT_EQ(router.load("t", test_worker_registration({{"concurrency", 2}})).status, 200);
  ASSERT_EQ(router.load("e", echo_registration()).status, 200);
  const std::string pid_text = router.infer("t", "", "application/x-test-pid").body;
  const pid_t pid = std::stoi(pid_text);
  ASSERT_GT(pid, 0);
  router::HttpResponse lost;
  std::thread waiting([&] { lost = router.infer("t", "3", "application/x-test-barrier"); });
  ASSERT_TRUE(eventually([&] { return router.function_status("t")["busy"] == 1; }));
  ::kill(pid, SIGKILL);
  waiting.join();
  EXPECT_EQ(lost.status, 500);
  EXPECT_NE(lost.body.find("lost"), std::string::npos) << lost.body;
  // The other function never noticed; this one gets a new worker.
  EXPECT_EQ(router.infer("e", "other").body, "other");
  router::HttpResponse again = router.infer("t", "again");
  EXPECT_EQ(again.status, 200);
  EXPECT_EQ(again.body, "again");
  EXPECT_NE(router.infer("t", "", "application/x-test-pid").body, pid_text);
  EXPECT_EQ(router.metric(R"(hiber_worker_failures_total{function="t"})"), 1);
}

TEST(Router, AWorkerThatCannotStartFailsWithItsReason) {
  // An allowed program that is gone by the time its worker starts.
  const std::string dir = temp_dir("hiber-router-vanishing");
  const std::string vanishing = dir + "/worker";
  std::filesystem::copy_file(echo_worker_path(), vanishing);
  std::filesystem::permissions(vanishing, std::filesystem::perms::owner_all);
  Node node({worker_programs_flag({"/bin/false", vanishing})});
  RouterProcess& router = *node.router;
  // A program that does not exist is refused at load time.
  router::HttpResponse r = router.load("x", {{"command", {"/nonexistent/worker"}}});
  EXPECT_EQ(r.status, 400);
  EXPECT_NE(r.body.find("/nonexistent/worker"), std::string::npos) << r.body;
  ASSERT_EQ(router.load("v", {{"command", {vanishing}}}).status, 200);
  std::filesystem::remove_all(dir);
  r = router.infer("v", "a");
  EXPECT_EQ(r.status, 503);
  EXPECT_NE(r.body.find(vanishing), std::string::npos) << r.body;
  EXPECT_TRUE(r.header("Retry-After").has_value());
  EXPECT_NE(router.function_status("v")["last_start_error"].get<std::string>().find(vanishing),
            std::string::npos);
  // Not ready while it cannot start (the protocol's 4xx), with the reason: in the readiness
  // answer, the metadata and hiberctl functions.
  router::HttpResponse ready = router.anonymous_request("GET", "/v2/models/v/ready");
  EXPECT_EQ(ready.status, 400) << ready.body;
  EXPECT_EQ(json::parse(ready.body)["ready"], false) << ready.body;
  EXPECT_NE(ready.body.find(vanishing), std::string::npos) << ready.body;
  const json parameters =
      json::parse(router.anonymous_request("GET", "/v2/models/v").body)["parameters"];
  EXPECT_EQ(parameters["ready"], false) << parameters;
  EXPECT_NE(parameters["last_start_error"].get<std::string>().find(vanishing), std::string::npos);
  const ProgramResult functions =
      run_program({HIBERCTL_PATH, "--router=" + router.target().url(),
                   "--router_token_file=" + node.state_dir + "/operator-token", "functions"});
  EXPECT_EQ(functions.exit_code, 0) << functions.output;
  EXPECT_NE(functions.output.find("cannot start: "), std::string::npos) << functions.output;
  EXPECT_NE(functions.output.find(vanishing), std::string::npos) << functions.output;
  ASSERT_EQ(router.load("y", {{"command", {"/bin/false"}}}).status, 200);
  r = router.infer("y", "a");
  EXPECT_EQ(r.status, 503);
  EXPECT_NE(r.body.find("exited 1"), std::string::npos) << r.body;
}

TEST(Router, ARestartKeepsTheRegistry) {
  Hiberd hiberd;
  const std::string state = temp_dir("hiber-router-restart");
  const std::vector<std::string> flags = {"--run_dir=" + hiberd.run_dir(),
                                          "--shim_preload=" + shim_preload()};
  {
    RouterProcess router(state, flags);
    ASSERT_EQ(router.load("a", echo_registration()).status, 200);
    ASSERT_EQ(router.load("b", test_worker_registration({{"slo_ms", 250}})).status, 200);
    ASSERT_EQ(router.load("c", echo_registration()).status, 200);
    ASSERT_EQ(router.request("POST", "/v2/repository/models/c/unload").status, 200);
    ASSERT_EQ(router.infer("a", "x").body, "x");
    EXPECT_EQ(router.stop(), 0) << router.log();
  }
  RouterProcess router(state, flags);
  const json index = json::parse(router.request("GET", "/v2/repository/index").body);
  // The unloaded one is still in the repository, unavailable, after the restart.
  ASSERT_EQ(index.size(), 3u) << index;
  EXPECT_EQ(index[0]["name"], "a");
  EXPECT_EQ(index[1]["name"], "b");
  EXPECT_EQ(index[2]["name"], "c");
  EXPECT_EQ(index[2]["state"], "UNAVAILABLE");
  EXPECT_EQ(index[2]["reason"], "unloaded");
  EXPECT_EQ(json::parse(router.request("GET", "/v2/models/b").body)["parameters"]["slo_ms"], 250);
  EXPECT_EQ(router.infer("a", "after restart").body, "after restart");
  EXPECT_EQ(router.infer("b", "b too").body, "b too");
  router::HttpResponse unloaded = router.infer("c", "gone");
  EXPECT_EQ(unloaded.status, 400);
  EXPECT_NE(unloaded.body.find("is unloaded"), std::string::npos) << unloaded.body;
  EXPECT_EQ(router.request("GET", "/v2/models/c/ready").status, 400);
  // A load without a body loads it again from the repository.
  ASSERT_EQ(router.request("POST", "/v2/repository/models/c/load").status, 200);
  EXPECT_EQ(router.infer("c", "back").body, "back");
  EXPECT_EQ(router.request("POST", "/v2/repository/models/never/load").status, 404);
}

// Raw TCP, for what a well-behaved client library will not send.
int connect_raw(const router::HttpTarget& target) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(target.port);
  ::inet_pton(AF_INET, target.host.c_str(), &address.sin_addr);
  EXPECT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof address), 0);
  return fd;
}

std::string read_all(int fd) {
  std::string out;
  char buffer[4096];
  for (;;) {
    const ssize_t n = ::read(fd, buffer, sizeof buffer);
    if (n <= 0) break;
    out.append(buffer, static_cast<size_t>(n));
  }
  return out;
}

TEST(Router, BadHttpGets4xxAndBlocksNoOne) {
  Node node({"--read_timeout_ms=1500", "--max_body_mib=64"});
  RouterProcess& router = *node.router;
  ASSERT_EQ(router.load("e", echo_registration()).status, 200);

  // A slow client, one byte a second: 408 after the read timeout, while others are served.
  std::string slow_answer;
  std::thread slow([&] {
    const int fd = connect_raw(router.target());
    const std::string request = "POST /v2/models/e/infer HTTP/1.1\r\nHost: x\r\n";
    // Five bytes, a second apart: the read timeout (1.5 s) comes long before the request's end.
    for (size_t i = 0; i < 5; ++i) {
      if (::send(fd, &request[i], 1, MSG_NOSIGNAL) != 1) break;
      std::this_thread::sleep_for(1s);
    }
    slow_answer = read_all(fd);
    ::close(fd);
  });
  for (int i = 0; i < 20; ++i) {
    EXPECT_EQ(router.infer("e", "meanwhile " + std::to_string(i)).status, 200);
  }
  slow.join();
  EXPECT_EQ(slow_answer.rfind("HTTP/1.1 408", 0), 0u) << slow_answer;

  // A 100 MiB body: 413 as soon as its length is known.
  {
    const int fd = connect_raw(router.target());
    const std::string header =
        "POST /v2/models/e/infer HTTP/1.1\r\nHost: x\r\nContent-Type: application/octet-stream"
        "\r\nContent-Length: 104857600\r\n\r\n";
    ASSERT_EQ(::write(fd, header.data(), header.size()), static_cast<ssize_t>(header.size()));
    const std::string answer = read_all(fd);
    EXPECT_EQ(answer.rfind("HTTP/1.1 413", 0), 0u) << answer;
    ::close(fd);
  }
  // Garbage instead of HTTP: 400.
  {
    const int fd = connect_raw(router.target());
    const std::string garbage = "\x01\x02 NOT HTTP\r\n\r\n";
    ASSERT_EQ(::write(fd, garbage.data(), garbage.size()), static_cast<ssize_t>(garbage.size()));
    const std::string answer = read_all(fd);
    EXPECT_EQ(answer.rfind("HTTP/1.1 400", 0), 0u) << answer;
    ::close(fd);
  }
  EXPECT_EQ(router.request("GET", "/no/such/thing").status, 404);
  EXPECT_EQ(router.request("DELETE", "/v2/models/e/infer").status, 405);
  EXPECT_EQ(router.infer("unknown-function", "x").status, 404);
  EXPECT_EQ(router.infer("e", "{not json", "application/json").status, 400);
  EXPECT_EQ(router.infer("e", "[1, 2]", "application/json").status, 400);
  EXPECT_EQ(router.infer("e", "after all that").body, "after all that");
}

TEST(Router, StatusPageAndMetricsAreServed) {
  Node node;
  RouterProcess& router = *node.router;
  router::HttpResponse page = router.request("GET", "/");
  EXPECT_EQ(page.status, 200);
  EXPECT_NE(page.content_type.find("text/html"), std::string::npos);
  router::HttpResponse metrics = router.request("GET", "/metrics");
  EXPECT_EQ(metrics.status, 200);
  EXPECT_NE(metrics.body.find("hiber_build_info{"), std::string::npos);
  EXPECT_NE(metrics.body.find("hiber_node_up{node=\"node0\"} 1"), std::string::npos)
      << metrics.body;
}

}  // namespace
}  // namespace hiber::testing

namespace hiber::testing {
namespace {

// Three hiberd processes, reached over their token-authenticated TCP control listeners.
TEST(Router, ThreeNodes) {
  const std::string dir = temp_dir("hiber-router-nodes");
  const std::string token_file = dir + "/control-token";
  {
    std::ofstream(token_file) << "three-nodes-token\n";
    ::chmod(token_file.c_str(), 0600);
  }
  std::vector<std::unique_ptr<Hiberd>> nodes;
  json config = {{"nodes", json::array()}};
  for (int i = 0; i < 3; ++i) {
    const std::string port_file = dir + "/port" + std::to_string(i);
    nodes.push_back(std::make_unique<Hiberd>(std::vector<std::string>{
        "--control_tcp_listen=127.0.0.1:0", "--control_tcp_port_file=" + port_file,
        "--control_token_file=" + token_file}));
    unsigned port = 0;
    ASSERT_TRUE(eventually([&] { return static_cast<bool>(std::ifstream(port_file) >> port); }));
    config["nodes"].push_back({{"name", str_cat("n", i)},
                               {"control", str_cat("tcp:127.0.0.1:", port)},
                               {"run_dir", nodes.back()->run_dir()},
                               {"token_file", token_file}});
  }
  std::ofstream(dir + "/router.json") << config.dump(2);
  RouterProcess router(dir,
                       {"--config=" + dir + "/router.json", "--shim_preload=" + shim_preload()});
  if (shim_preload().empty()) GTEST_SKIP() << "no shim (built without the CUDA toolkit)";

  // Workers are placed on the least loaded node: three functions, three nodes.
  std::map<std::string, std::string> node_of;
  for (int f = 0; f < 3; ++f) {
    const std::string name = str_cat("f", f);
    ASSERT_EQ(router.load(name, echo_registration()).status, 200);
    for (int i = 0; i < 3; ++i) {
      const std::string body = binary_body(100 + i, f * 10 + i);
      router::HttpResponse r = router.infer(name, body);
      ASSERT_EQ(r.status, 200) << r.body;
      EXPECT_EQ(r.body, body);
      const std::string node = r.header("X-Hiber-Node").value_or("");
      if (i > 0) {
        EXPECT_EQ(node, node_of[name]) << "a warm worker stays on its node";
      }
      node_of[name] = node;
    }
  }
  std::set<std::string> used;
  for (const auto& [f, node] : node_of) used.insert(node);
  EXPECT_EQ(used.size(), 3u);
  // Each node's hiberd saw its own function's requests.
  for (int i = 0; i < 3; ++i) {
    auto status = nodes[i]->status();
    ASSERT_TRUE(status.ok());
    ASSERT_EQ(status->sessions.size(), 1u);
    EXPECT_EQ(node_of[status->sessions[0].function_id], str_cat("n", i));
  }

  // A node dies: its function moves to another node.
  const std::string moved = node_of.begin()->first;  // f0
  const int lost = node_of[moved].back() - '0';
  ::kill(nodes[lost]->pid(), SIGKILL);
  const std::string lost_name = str_cat("n", lost);
  ASSERT_TRUE(eventually([&] {
    const json status = router.status();
    for (const auto& n : status["nodes"]) {
      if (n.value("name", "") == lost_name) return !n.value("up", true);
    }
    return false;
  }));
  router::HttpResponse r = router.infer(moved, "moved");
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.body, "moved");
  EXPECT_NE(r.header("X-Hiber-Node").value_or(""), lost_name);
  for (const auto& [f, node] : node_of) {
    if (f != moved) {
      EXPECT_EQ(router.infer(f, "still").body, "still");
    }
  }
}

}  // namespace
}  // namespace hiber::testing

namespace hiber::testing {
namespace {

TEST(Router, AnswersHelp) {
  const ProgramResult help = run_program({router_path(), "--help"});
  EXPECT_EQ(help.exit_code, 0);
  for (const char* flag : {"listen", "config", "run_dir", "state_dir", "max_queue", "shim_dir"}) {
    EXPECT_NE(help.output.find(std::string("-") + flag + " "), std::string::npos) << flag;
  }
  // One project version, the same in every program's --version and in GET /v2.
  for (const std::string& program : {router_path(), hiberd_path(), std::string(HIBERCTL_PATH)}) {
    const ProgramResult version = run_program({program, "--version"});
    EXPECT_EQ(version.exit_code, 0) << program;
    EXPECT_NE(version.output.find(std::string(" version ") + HIBER_PROJECT_VERSION + " (commit "),
              std::string::npos)
        << program << ": " << version.output;
  }
  {
    Node node;
    const json v2 = json::parse(node.router->anonymous_request("GET", "/v2").body);
    EXPECT_EQ(v2["version"], HIBER_PROJECT_VERSION) << v2;
  }
  std::vector<std::string> bad_argv = {router_path(), "--config=/nonexistent.json"};
  if (::geteuid() == 0) bad_argv.push_back("--allow_root");
  const ProgramResult bad = run_program(bad_argv);
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.output.find("/nonexistent.json"), std::string::npos) << bad.output;
}

}  // namespace
}  // namespace hiber::testing
