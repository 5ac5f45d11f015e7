// Who may call what on hiber-router (docs/router.md, "Who may call what"), with real HTTP
// requests against a real router in front of a real hiberd: the repository API needs the
// operator's token (missing, wrong and right tried), a registration cannot name a program the
// operator did not allow (nothing runs: a marker file the program would make stays absent),
// metadata shows commands only to the operator, the router refuses root without --allow_root,
// and asynchronous invocation ids and the router's request ids cannot be guessed and do not
// repeat after a restart.
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <set>

#include <gtest/gtest.h>

#include "tests/router/router_harness.h"

namespace hiber::testing {
namespace {

using namespace std::chrono_literals;
using nlohmann::json;
namespace fs = std::filesystem;

// No shim: these functions never reach hiberd, so each answer is the echo worker's alone.
json echo_registration() {
  return {{"command", {echo_worker_path()}}, {"slo_ms", 5000}, {"idle_timeout_s", 600}};
}

const router::HttpHeaders kJson = {{"Content-Type", "application/json"}};

router::HttpHeaders bearer(const std::string& token) {
  return {{"Content-Type", "application/json"}, {"Authorization", "Bearer " + token}};
}

class RouterSecurityTest : public ::testing::Test {
 protected:
  RouterSecurityTest()
      : state_(temp_dir("hiber-router-security")),
        router_(std::make_unique<RouterProcess>(state_, router_flags())) {}
  ~RouterSecurityTest() override {
    router_.reset();
    std::error_code ignored;
    fs::remove_all(state_, ignored);
  }

  std::vector<std::string> router_flags() const { return {"--run_dir=" + hiberd_.run_dir()}; }
  void restart() {
    router_.reset();
    router_ = std::make_unique<RouterProcess>(state_, router_flags());
  }
  std::string marker() const { return state_ + "/pwned"; }

  Hiberd hiberd_;
  std::string state_;
  std::unique_ptr<RouterProcess> router_;
};

TEST_F(RouterSecurityTest, TheOperatorTokenIsMadePrivate) {
  struct stat st {};
  ASSERT_EQ(::stat((state_ + "/operator-token").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  EXPECT_TRUE(std::regex_match(router_->operator_token(), std::regex("[0-9a-f]{64}")))
      << router_->operator_token();
}

TEST_F(RouterSecurityTest, TheRepositoryApiNeedsTheOperatorToken) {
  const std::string load = "/v2/repository/models/echo/load";
  const std::string body = echo_registration().dump();
  const std::string wrong = std::string(router_->operator_token().size(), 'a');
  struct Attempt {
    std::string what;
    router::HttpHeaders headers;
  };
  const std::vector<Attempt> refused = {
      {"no credential", kJson},
      {"a wrong token", bearer(wrong)},
      {"a prefix of the token", bearer(router_->operator_token().substr(0, 63))},
      {"the token with more after it", bearer(router_->operator_token() + "0")},
      {"another scheme", {{"Authorization", "Basic " + router_->operator_token()}}},
  };
  for (const Attempt& a : refused) {
    for (const auto& [method, path] : std::vector<std::pair<std::string, std::string>>{
             {"POST", load},
             {"POST", "/v2/repository/models/echo/unload"},
             {"GET", "/v2/repository/index"},
             {"POST", "/v2/repository/index"}}) {
      router::HttpResponse r = router_->anonymous_request(method, path, body, a.headers);
      EXPECT_EQ(r.status, 401) << a.what << ": " << method << " " << path << ": " << r.body;
      EXPECT_NE(r.header("WWW-Authenticate").value_or("").find("Bearer"), std::string::npos)
          << a.what;
    }
  }
  EXPECT_EQ(router_->anonymous_request("GET", "/v2/models/echo").status, 404);
  EXPECT_FALSE(fs::exists(state_ + "/functions/echo.json"));

  // The right one.
  router::HttpResponse loaded =
      router_->anonymous_request("POST", load, body, bearer(router_->operator_token()));
  ASSERT_EQ(loaded.status, 200) << loaded.body;
  router::HttpResponse index = router_->anonymous_request("GET", "/v2/repository/index", {},
                                                          bearer(router_->operator_token()));
  ASSERT_EQ(index.status, 200);
  EXPECT_EQ(json::parse(index.body)[0]["name"], "echo");
  // Inference stays open to anybody who reaches the port.
  router::HttpResponse answer = router_->anonymous_request(
      "POST", "/v2/models/echo/infer", "hello", {{"Content-Type", "application/octet-stream"}});
  ASSERT_EQ(answer.status, 200) << answer.body;
  EXPECT_EQ(answer.body, "hello");
  EXPECT_EQ(router_->anonymous_request("POST", "/v2/repository/models/echo/unload").status, 401);
  EXPECT_EQ(router_
                ->anonymous_request("POST", "/v2/repository/models/echo/unload", {},
                                    bearer(router_->operator_token()))
                .status,
            200);
}

TEST_F(RouterSecurityTest, ARegistrationCannotNameAProgramTheOperatorDidNotAllow) {
  const std::string touch = "touch " + marker();
  // The attack, with the operator's token even: the program is not allowed.
  for (const json& command : {json{"/bin/sh", "-c", touch}, json{"sh", "-c", touch},
                              json{"/usr/bin/env", "sh", "-c", touch}}) {
    router::HttpResponse r = router_->load("pwn", {{"command", command}});
    EXPECT_EQ(r.status, 403) << command << ": " << r.body;
    EXPECT_NE(r.body.find("--worker_programs"), std::string::npos) << r.body;
  }
  // A program that does not exist is refused at load time, not at the first request.
  router::HttpResponse missing = router_->load("gone", {{"command", {state_ + "/no-such"}}});
  EXPECT_EQ(missing.status, 400) << missing.body;
  EXPECT_NE(missing.body.find("no executable program"), std::string::npos) << missing.body;
  // An allowed program cannot be made to load the caller's code through the loader.
  for (const char* variable : {"LD_PRELOAD", "LD_LIBRARY_PATH", "LD_AUDIT", "GCONV_PATH"}) {
    json registration = echo_registration();
    registration["env"] = {{variable, state_ + "/evil.so"}};
    router::HttpResponse r = router_->load("env", registration);
    EXPECT_EQ(r.status, 400) << variable << ": " << r.body;
    EXPECT_NE(r.body.find(variable), std::string::npos) << r.body;
  }
  for (const char* fn : {"pwn", "gone", "env"}) {
    EXPECT_EQ(router_->infer(fn, "x").status, 404) << fn;
  }
  EXPECT_FALSE(fs::exists(marker()));
}

// A registration already in the registry (written before the operator's list changed, or by
// hand) whose program is not allowed never starts.
TEST_F(RouterSecurityTest, ARegistryFileNamingAnotherProgramNeverStarts) {
  router_.reset();
  std::ofstream(state_ + "/functions/old.json")
      << json{{"command", {"/bin/sh", "-c", "touch " + marker()}}}.dump();
  restart();
  router::HttpResponse r = router_->infer("old", "x");
  EXPECT_EQ(r.status, 503) << r.body;
  EXPECT_NE(r.body.find("--worker_programs"), std::string::npos) << r.body;
  EXPECT_NE(router_->function_status("old")["last_start_error"].get<std::string>().find(
                "not one the operator allows"),
            std::string::npos)
      << router_->function_status("old");
  EXPECT_FALSE(fs::exists(marker()));
}

TEST_F(RouterSecurityTest, OnlyTheOperatorSeesAWorkersCommand) {
  json registration = echo_registration();
  registration["command"] = {echo_worker_path(), "--secret-flag=hunter2"};
  registration["env"] = {{"API_KEY", "s3cr3t"}};
  ASSERT_EQ(router_->load("echo", registration).status, 200);
  ASSERT_EQ(router_->infer("echo", "warm").status, 200);

  router::HttpResponse anonymous = router_->anonymous_request("GET", "/v2/models/echo");
  ASSERT_EQ(anonymous.status, 200);
  const json parameters = json::parse(anonymous.body)["parameters"];
  EXPECT_FALSE(parameters.contains("command")) << parameters;
  EXPECT_FALSE(parameters.contains("env")) << parameters;
  for (const char* path :
       {"/v2/models/echo", "/v2/models/echo/ready", "/v2/status", "/v2", "/metrics", "/"}) {
    const std::string body = router_->anonymous_request("GET", path).body;
    EXPECT_EQ(body.find("hunter2"), std::string::npos) << path;
    EXPECT_EQ(body.find("s3cr3t"), std::string::npos) << path;
    EXPECT_EQ(body.find(echo_worker_path()), std::string::npos) << path;
  }
  // The operator sees the command (never the environment: it may hold secrets).
  const json as_operator =
      json::parse(router_->request("GET", "/v2/models/echo").body)["parameters"];
  EXPECT_EQ(as_operator["command"], registration["command"]);
  EXPECT_FALSE(as_operator.contains("env"));
}

TEST(RouterRoot, RefusesRootWithoutAllowRoot) {
  if (::geteuid() != 0) GTEST_SKIP() << "not root: the refusal cannot be tried";
  const std::string state = temp_dir("hiber-router-root");
  const ProgramResult r =
      run_program({router_path(), "--listen=127.0.0.1:0", "--state_dir=" + state}, 20s);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("refuses to run as root"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("--allow_root"), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(state + "/functions"));  // it stopped before anything else
  fs::remove_all(state);
}

// The ids of asynchronous invocations are 128 random bits: unguessable, and new after a
// restart; so are the X-Request-Id values the router makes.
TEST_F(RouterSecurityTest, AsyncIdsAndRequestIdsCannotBeGuessedNorRepeat) {
  ASSERT_EQ(router_->load("echo", echo_registration()).status, 200);
  std::set<std::string> ids, request_ids;
  const auto send = [&](int n) {
    for (int i = 0; i < n; ++i) {
      router::HttpResponse accepted = router_->infer("echo", "later", "application/octet-stream",
                                                     {{"Prefer", "respond-async"}});
      ASSERT_EQ(accepted.status, 202) << accepted.body;
      const std::string id = json::parse(accepted.body)["id"];
      EXPECT_TRUE(std::regex_match(id, std::regex("[0-9a-f]{32}"))) << id;
      EXPECT_TRUE(ids.insert(id).second) << "id " << id << " repeated";
      const std::string request_id = accepted.header("X-Request-Id").value_or("");
      EXPECT_TRUE(std::regex_match(request_id, std::regex("hiber-[0-9a-f]{32}"))) << request_id;
      EXPECT_TRUE(request_ids.insert(request_id).second) << request_id << " repeated";
      // Guesses: small numbers (the old counter) and the real id with one digit changed.
      std::string near = id;
      near[31] = near[31] == '0' ? '1' : '0';
      for (const std::string& guess : {std::to_string(i + 1), std::to_string(i + 2), near}) {
        EXPECT_EQ(router_->anonymous_request("GET", "/v2/invocations/" + guess).status, 404)
            << guess;
      }
      router::HttpResponse result;
      ASSERT_TRUE(eventually([&] {
        result = router_->anonymous_request("GET", "/v2/invocations/" + id);
        return result.status != 202;
      }));
      EXPECT_EQ(result.status, 200) << result.body;
      EXPECT_EQ(result.body, "later");
    }
  };
  send(5);
  restart();
  send(5);
  EXPECT_EQ(ids.size(), 10u);
  EXPECT_EQ(request_ids.size(), 10u);
}

}  // namespace
}  // namespace hiber::testing
