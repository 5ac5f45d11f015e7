// What `hiberctl` sends for its router commands (docs/router.md's paths, headers and bodies),
// seen by tests/router/echo_server.py, which answers every request with a JSON echo of it. The
// router's answers themselves (async invocations, errors, status) are tested end to end against
// hiber-router.
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "router/http_client.h"
#include "tests/router/python_server.h"

namespace hiber {
namespace {

using nlohmann::json;

struct Ran {
  int exit_code = -1;
  std::string out;
  std::string err;
};

std::string slurp(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

class HiberctlWireTest : public ::testing::Test {
 protected:
  HiberctlWireTest()
      : server_({std::string(HIBER_SOURCE_DIR) + "/tests/router/echo_server.py"}, "^([0-9]+)"),
        dir_(std::filesystem::temp_directory_path() /
             ("hiberctl-wire-test-" + std::to_string(::getpid()))) {
    std::filesystem::create_directories(dir_);
  }
  ~HiberctlWireTest() override { std::filesystem::remove_all(dir_); }
  void SetUp() override { ASSERT_NE(server_.port(), 0) << "echo_server.py did not start"; }

  // The last request the echo server saw (before this question).
  json last_request() const {
    auto log = router::http_request(router::HttpTarget{"127.0.0.1", server_.port()}, "GET", "/log");
    EXPECT_TRUE(log.ok()) << log.status();
    if (!log.ok()) return json();
    const json all = json::parse(log->body);
    return all.empty() ? json() : all.back();
  }

  std::string router() const { return "http://127.0.0.1:" + std::to_string(server_.port()); }

  // Runs hiberctl with `args` (a shell word list) and `input` on stdin.
  Ran hiberctl(const std::string& args, const std::string& input = "") {
    std::ofstream(dir_ / "in", std::ios::binary) << input;
    const std::string command = str(HIBERCTL_PATH, " ", args, " <", (dir_ / "in").string(), " >",
                                    (dir_ / "out").string(), " 2>", (dir_ / "err").string());
    const int status = std::system(command.c_str());
    Ran r;
    r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    r.out = slurp(dir_ / "out");
    r.err = slurp(dir_ / "err");
    return r;
  }

  template <typename... A>
  static std::string str(const A&... a) {
    std::ostringstream s;
    (s << ... << a);
    return s.str();
  }

  testing::PythonServer server_;
  std::filesystem::path dir_;
};

TEST_F(HiberctlWireTest, InvokeSendsTheBodyAndHeaders) {
  Ran r = hiberctl(str("--router=", router(),
                       " invoke fn-1 --data='{\"inputs\": []}' --deadline_ms=50 --request_id=r-7"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const json echo = json::parse(r.out);  // the answer's body, as it came
  EXPECT_EQ(echo["method"], "POST");
  EXPECT_EQ(echo["path"], "/v2/models/fn-1/infer");
  EXPECT_EQ(echo["headers"]["content-type"], "application/json");
  EXPECT_EQ(echo["headers"]["x-hiber-deadline-ms"], "50");
  EXPECT_EQ(echo["headers"]["x-request-id"], "r-7");
  EXPECT_FALSE(echo["headers"].contains("prefer"));
  EXPECT_EQ(echo["body"], "{\"inputs\": []}");
}

TEST_F(HiberctlWireTest, InvokeReadsStdinAndEscapesTheName) {
  // The router comes from $HIBER_ROUTER when --router is absent.
  ::setenv("HIBER_ROUTER", router().c_str(), 1);
  Ran r = hiberctl("invoke 'fn 2' - --content_type=application/octet-stream --async", "raw bytes");
  ::unsetenv("HIBER_ROUTER");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const json echo = json::parse(r.out);
  EXPECT_EQ(echo["path"], "/v2/models/fn%202/infer");
  EXPECT_EQ(echo["headers"]["content-type"], "application/octet-stream");
  EXPECT_EQ(echo["headers"]["prefer"], "respond-async");
  EXPECT_EQ(echo["body"], "raw bytes");
}

TEST_F(HiberctlWireTest, InvokeReadsAFile) {
  std::ofstream(dir_ / "body.json") << "{\"id\": \"from-file\"}";
  Ran r = hiberctl(str("--router=", router(), " invoke fn --data_file=", (dir_ / "body.json")));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(json::parse(r.out)["body"], "{\"id\": \"from-file\"}");
  // Two bodies at once are refused before anything is sent.
  r = hiberctl(str("--router=", router(), " invoke fn --data=x -"));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("one of --data"), std::string::npos) << r.err;
}

TEST_F(HiberctlWireTest, LoadSendsTheRegistration) {
  std::ofstream(dir_ / "reg.json") << R"({"command": ["old"], "env": {"A": "file"},
                                          "percentile": 0.99})";
  Ran r = hiberctl(str("--router=", router(), " load my-fn --file=", (dir_ / "reg.json"),
                       " --command=\"python3 'my worker.py' --x\" --env=A=1,B=2 --slo_ms=80",
                       " --max_instances=3 --shim=false --heavy=yes"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "loaded 'my-fn'\n");
  const json sent = last_request();
  EXPECT_EQ(sent["method"], "POST");
  EXPECT_EQ(sent["path"], "/v2/repository/models/my-fn/load");
  EXPECT_EQ(sent["headers"]["content-type"], "application/json");
  // The file's fields, with the flags given set over them; flags not given are not sent.
  EXPECT_EQ(json::parse(sent["body"].get<std::string>()),
            json::parse(R"({"command": ["python3", "my worker.py", "--x"],
                            "env": {"A": "1", "B": "2"}, "percentile": 0.99, "slo_ms": 80.0,
                            "max_instances": 3, "shim": false, "heavy": true})"));
}

TEST_F(HiberctlWireTest, LoadFromFlagsOnly) {
  Ran r = hiberctl(str("--router=", router(),
                       " load f --command=/bin/worker --stateful"
                       " --tail=0.9 --quota_mib=512 --concurrency=4 --idle_timeout_s=5"
                       " --exec_ms=2.5"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(json::parse(last_request()["body"].get<std::string>()),
            json::parse(R"({"command": ["/bin/worker"], "stateful": true, "percentile": 0.9,
                            "quota_mib": 512, "concurrency": 4, "idle_timeout_s": 5,
                            "exec_ms_hint": 2.5})"));
  // Without a command nothing is sent.
  r = hiberctl(str("--router=", router(), " load g --slo_ms=5"));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("command"), std::string::npos) << r.err;
  EXPECT_EQ(last_request()["path"], "/v2/repository/models/f/load");
}

TEST_F(HiberctlWireTest, UnloadAndRefusal) {
  Ran r = hiberctl(str("--router=", router(), " unload my-fn"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "unloaded 'my-fn'\n");
  EXPECT_EQ(last_request()["method"], "POST");
  EXPECT_EQ(last_request()["path"], "/v2/repository/models/my-fn/unload");
  r = hiberctl("--router=http://127.0.0.1:1 unload my-fn");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("Connection refused"), std::string::npos) << r.err;
  r = hiberctl("--router=127.0.0.1:8080 functions");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("http://"), std::string::npos) << r.err;
}

// `top` and `functions` read GET /v2/status and /v2/repository/index: here python3's
// http.server serves them from files (the status is top_view_test's fixture).
TEST_F(HiberctlWireTest, TopAndFunctionsReadTheRouter) {
  std::filesystem::create_directories(dir_ / "root/v2/repository");
  std::filesystem::copy_file(std::string(HIBER_SOURCE_DIR) + "/tests/router/top_view_status.json",
                             dir_ / "root/v2/status");
  std::ofstream(dir_ / "root/v2/repository/index")
      << R"([{"name": "fn-1", "state": "READY"}, {"name": "fn-9", "state": "UNAVAILABLE"}])";
  testing::PythonServer files(
      {"-m", "http.server", "0", "--bind", "127.0.0.1", "--directory", (dir_ / "root").string()},
      "port ([0-9]+)");
  ASSERT_NE(files.port(), 0);
  const std::string url = "http://127.0.0.1:" + std::to_string(files.port());

  Ran r = hiberctl(str("--router=", url, " top --iterations=1"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out.find('\x1b'), std::string::npos);  // plain: no escapes
  EXPECT_EQ(r.out.substr(0, r.out.find('\n')),
            "hiber-router " + url + "  2025-11-26 01:20:00 UTC  3 functions, 2 nodes, 35 requests");
  // The first refresh has the router's rate already.
  EXPECT_NE(r.out.find("\nresnet-big    25  10.0    96.0%"), std::string::npos) << r.out;

  // Two refreshes, one after the other.
  r = hiberctl(str("--router=", url, " top --iterations=2 --interval_ms=1"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out.find("hiber-router", 1), r.out.find("\n\nhiber-router") + 2) << r.out;

  r = hiberctl(str("--router=", url, " functions"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out,
            "FUNCTION  STATE        INSTANCES  REQUESTS  SLO ms  ON-TIME  P50 ms  P99 ms\n"
            "fn-1      READY                1        10     100    80.0%     3.1     9.8\n"
            "fn-9      UNAVAILABLE          -         -       -        -       -       -\n");

  // A router that does not answer the status: one refresh fails, with the reason.
  std::filesystem::remove(dir_ / "root/v2/status");
  r = hiberctl(str("--router=", url, " top --iterations=1"));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("HTTP 404"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace hiber
