// hiberctl's router commands (tools/router_ctl.h) against a real hiber-router in front of a real
// hiberd (--device=sim): what each prints and its exit status, checked against what the test
// sent and against the router's own answers over HTTP. (hiberctl_wire_test checks what the
// commands send, against an echo server.)
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <sstream>

#include <gtest/gtest.h>

#include "tests/router/router_harness.h"

namespace hiber::testing {
namespace {

using nlohmann::json;

struct Ran {
  int exit_code = -1;
  std::string out;
  std::string err;
};

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

class HiberctlRouterTest : public ::testing::Test {
 protected:
  HiberctlRouterTest()
      : dir_(temp_dir("hiberctl-router-test")),
        router_(dir_, {"--run_dir=" + hiberd_.run_dir(), "--shim_preload=" + shim_preload()}) {}
  ~HiberctlRouterTest() override { std::system(("rm -rf " + dir_).c_str()); }

  std::string url() const { return "http://127.0.0.1:" + std::to_string(router_.target().port); }

  // Runs `hiberctl --router=URL --router_token_file=<the router's> ARGS` (ARGS a shell word
  // list), stdout and stderr apart.
  Ran hiberctl(const std::string& args) {
    return hiberctl_as(str_cat("--router_token_file=", dir_, "/operator-token"), args);
  }
  // The same with other credential flags instead (e.g. none).
  Ran hiberctl_as(const std::string& credential, const std::string& args) {
    const std::string command = str_cat(HIBERCTL_PATH, " --router=", url(), " ", credential, " ",
                                        args, " >", dir_, "/out 2>", dir_, "/err </dev/null");
    const int status = std::system(command.c_str());
    Ran r;
    r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    r.out = slurp(dir_ + "/out");
    r.err = slurp(dir_ + "/err");
    return r;
  }

  // The registration the router keeps for `function` (GET /v2/models/{fn}'s parameters).
  json registration(const std::string& function) {
    router::HttpResponse r = router_.request("GET", "/v2/models/" + function);
    EXPECT_EQ(r.status, 200) << r.body;
    return json::parse(r.body, nullptr, false)["parameters"];
  }

  Hiberd hiberd_;
  std::string dir_;
  RouterProcess router_;
};

bool has_line(const std::string& text, const std::string& line) {
  std::istringstream lines(text);
  for (std::string l; std::getline(lines, l);) {
    if (l == line) return true;
  }
  return false;
}

// The first line of `text` that starts with `prefix` and the words in it.
std::vector<std::string> row(const std::string& text, const std::string& prefix) {
  std::istringstream lines(text);
  for (std::string l; std::getline(lines, l);) {
    if (l.rfind(prefix, 0) != 0) continue;
    std::istringstream words(l);
    std::vector<std::string> out;
    for (std::string w; words >> w;) out.push_back(w);
    return out;
  }
  return {};
}

// Without the operator's token hiberctl cannot change the registry, and says why; a program the
// operator did not allow is refused with the router's reason.
TEST_F(HiberctlRouterTest, LoadNeedsTheOperatorTokenAndAnAllowedProgram) {
  Ran r = hiberctl_as("--router_token_file=" + dir_ + "/no-such-token",
                      "load x --command=" + echo_worker_path());
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("cannot read --router_token_file"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("HTTP 401"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("operator"), std::string::npos) << r.err;
  std::ofstream(dir_ + "/wrong-token") << "0123456789abcdef\n";
  r = hiberctl_as("--router_token_file=" + dir_ + "/wrong-token", "unload x");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("HTTP 401"), std::string::npos) << r.err;
  r = hiberctl_as("--router_token_file=" + dir_ + "/wrong-token", "functions");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("HTTP 401"), std::string::npos) << r.err;
  EXPECT_EQ(router_.request("GET", "/v2/models/x").status, 404);  // nothing was registered

  r = hiberctl("load x --command=/bin/sh");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("HTTP 403"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("--worker_programs"), std::string::npos) << r.err;
  EXPECT_EQ(router_.request("GET", "/v2/models/x").status, 404);
}

TEST_F(HiberctlRouterTest, LoadInvokeListTopUnload) {
  const bool shim = !shim_preload().empty();
  // Load from a registration file...
  const std::string file = dir_ + "/echo.json";
  std::ofstream(file) << json{
      {"command", {echo_worker_path()}},
      {"slo_ms", 250},
      {"idle_timeout_s", 600},
      {"shim", shim}}.dump();
  Ran r = hiberctl("load echo --file=" + file);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "loaded 'echo'\n");
  json reg = registration("echo");
  EXPECT_EQ(reg["command"], json::array({echo_worker_path()}));
  EXPECT_EQ(reg["slo_ms"], 250);
  // ... and from flags.
  r = hiberctl(str_cat("load tw --command='", test_worker_path(), "' --slo_ms=300 --concurrency=2",
                       " --idle_timeout_s=600 --shim=", shim ? "true" : "false",
                       " --env=COLOUR=blue"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "loaded 'tw'\n");
  reg = registration("tw");
  EXPECT_EQ(reg["command"], json::array({test_worker_path()}));
  EXPECT_EQ(reg["slo_ms"], 300);
  EXPECT_EQ(reg["concurrency"], 2);
  EXPECT_EQ(reg["shim"], shim);
  EXPECT_FALSE(reg.contains("env"));  // the router keeps it to itself: it may hold secrets
  const json saved = json::parse(slurp(dir_ + "/functions/tw.json"), nullptr, false);
  EXPECT_EQ(saved["env"], json({{"COLOUR", "blue"}})) << saved;

  // A flag not given is not sent: the router's default applies (shim: false), as --help says.
  r = hiberctl("load plain --command=" + echo_worker_path());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(registration("plain")["shim"], false);
  r = hiberctl("load plain --command=" + echo_worker_path() + " --shim");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(registration("plain")["shim"], true);
  ASSERT_EQ(hiberctl("unload plain").exit_code, 0);
  {
    const ProgramResult help = run_program({HIBERCTL_PATH, "--helpon=hiberctl"});
    const size_t shim_flag = help.output.find("-shim (");
    ASSERT_NE(shim_flag, std::string::npos) << help.output;
    const size_t its_default = help.output.find("default: ", shim_flag);  // the flag's own
    ASSERT_NE(its_default, std::string::npos) << help.output;
    EXPECT_EQ(help.output.substr(its_default, 14), "default: false")
        << help.output.substr(shim_flag, 300);
  }

  // invoke: the body on stdout exactly, the headers on stderr.
  for (int i = 0; i < 3; ++i) {
    const std::string body = str_cat("hello ", i);
    r = hiberctl(str_cat("invoke echo --data='", body,
                         "' --content_type=application/octet-stream --request_id=req-", i));
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(r.out, body);
    EXPECT_TRUE(has_line(r.err, str_cat("X-Request-Id: req-", i))) << r.err;
    if (!shim) continue;  // without the shim the request never reaches hiberd
    EXPECT_TRUE(has_line(r.err, "X-Hiber-Node: node0")) << r.err;
    EXPECT_NE(r.err.find("X-Hiber-Gpu: "), std::string::npos) << r.err;
  }
  // A body from a file, bytes the shell would not pass, comes back the same.
  std::string binary;
  for (int i = 0; i < 3000; ++i) binary += static_cast<char>((i * 37) % 256);
  std::ofstream(dir_ + "/body.bin", std::ios::binary) << binary;
  r = hiberctl("invoke echo --data_file=" + dir_ +
               "/body.bin --content_type=application/octet-stream");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, binary);
  // Asynchronously: hiberctl names the invocation, polls it and prints the answer.
  r = hiberctl("invoke tw --async --data=later --content_type=text/plain");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "later");
  EXPECT_NE(r.err.find("invocation "), std::string::npos) << r.err;
  // A function's own error: exit 1 with its message.
  r = hiberctl("invoke tw --data='the model is sad' --content_type=application/x-test-error");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("HTTP 500"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("the model is sad"), std::string::npos) << r.err;

  // functions: a row per function with the router's numbers (echo 4 requests, tw 2).
  r = hiberctl("functions");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::vector<std::string> echo_row = row(r.out, "echo ");
  ASSERT_GE(echo_row.size(), 6u) << r.out;
  EXPECT_EQ(echo_row[2], "1") << r.out;    // instances
  EXPECT_EQ(echo_row[3], "4") << r.out;    // requests
  EXPECT_EQ(echo_row[4], "250") << r.out;  // SLO ms
  EXPECT_EQ(echo_row[5], "100.0%") << r.out;
  std::vector<std::string> tw_row = row(r.out, "tw ");
  ASSERT_GE(tw_row.size(), 5u) << r.out;
  EXPECT_EQ(tw_row[3], "2") << r.out;
  EXPECT_EQ(tw_row[4], "300") << r.out;

  // top, once: the node with its GPUs, and both functions. With the shim, echo ran on some GPU:
  // once the router has read hiberd's status since, its tile lists echo resident.
  ASSERT_TRUE(!shim || eventually([&] {
    const json now = router_.status();
    for (const auto& g : now["nodes"][0]["gpus"]) {
      for (const auto& fn : g["resident"]) {
        if (fn == "echo") return true;
      }
    }
    return false;
  })) << router_.status().dump(1);
  const json status = router_.status();
  r = hiberctl("top --iterations=1");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("hiber-router " + url()), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("NODE node0  up"), std::string::npos) << r.out;
  const json& gpus = status["nodes"][0]["gpus"];
  ASSERT_FALSE(gpus.empty());
  for (const auto& g : gpus) {
    const std::vector<std::string> gpu_row =
        row(r.out, str_cat("    ", g["ordinal"].get<int>(), "  "));
    EXPECT_FALSE(gpu_row.empty()) << "GPU " << g["ordinal"] << " missing:\n" << r.out;
  }
  echo_row = row(r.out, "echo ");
  ASSERT_GE(echo_row.size(), 2u) << r.out;
  EXPECT_EQ(echo_row[1], "4") << r.out;  // REQS
  EXPECT_FALSE(row(r.out, "tw ").empty()) << r.out;
  if (shim) {
    EXPECT_NE(r.out.find("resident: echo"), std::string::npos) << r.out;
  }

  // unload: the function stays in the repository, unavailable; invoking it is the router's
  // 400, and a name never registered its 404, each message relayed.
  r = hiberctl("unload tw");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "unloaded 'tw'\n");
  const json index = json::parse(router_.request("GET", "/v2/repository/index").body);
  // "plain" was unloaded above: both stay listed, unavailable.
  ASSERT_EQ(index.size(), 3u) << index;
  EXPECT_EQ(index[0]["name"], "echo");
  EXPECT_EQ(index[0]["state"], "READY") << index;
  EXPECT_EQ(index[2]["name"], "tw");
  EXPECT_NE(index[2]["state"], "READY") << index;
  r = hiberctl("unload tw");  // already unloaded: nothing changes
  EXPECT_EQ(r.exit_code, 0) << r.err;
  r = hiberctl("unload nope");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("HTTP 404"), std::string::npos) << r.err;

  for (const auto& [name, status] : {std::pair<std::string, int>{"tw", 400}, {"nope", 404}}) {
    router::HttpResponse direct = router_.infer(name, "x");
    ASSERT_EQ(direct.status, status) << direct.body;
    const json message = json::parse(direct.body, nullptr, false);
    const std::string expected = message.is_object() && message.contains("error")
                                     ? message["error"].get<std::string>()
                                     : direct.body;
    ASSERT_FALSE(expected.empty());
    r = hiberctl("invoke " + name + " --data=x");
    EXPECT_NE(r.exit_code, 0);
    EXPECT_TRUE(r.out.empty()) << r.out;
    EXPECT_NE(r.err.find("HTTP " + std::to_string(status)), std::string::npos) << r.err;
    EXPECT_NE(r.err.find(expected), std::string::npos) << r.err << " lacks " << expected;
  }
}

// No router there: a clear error (an HTTP one, without a CUDA error name), not a hang.
TEST(HiberctlNoRouter, SaysSo) {
  const std::string dir = temp_dir("hiberctl-no-router");
  const int status = std::system(str_cat(HIBERCTL_PATH, " --router=http://127.0.0.1:1 functions",
                                         " >", dir, "/out 2>", dir, "/err")
                                     .c_str());
  EXPECT_EQ(WIFEXITED(status) ? WEXITSTATUS(status) : -1, 1);
  const std::string err = slurp(dir + "/err");
  EXPECT_NE(err.find("hiberctl: cannot connect to http://127.0.0.1:1"), std::string::npos) << err;
  EXPECT_EQ(err.find("CUDA_ERROR"), std::string::npos) << "no CUDA error name for HTTP: " << err;
  std::system(("rm -rf " + dir).c_str());
}

}  // namespace
}  // namespace hiber::testing
