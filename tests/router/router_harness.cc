#include "tests/router/router_harness.h"

#include <signal.h>
#include <strings.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <thread>

#include <gtest/gtest.h>

namespace hiber::testing {

std::string router_path() { return HIBER_ROUTER_PATH; }
std::string echo_worker_path() { return HIBER_ECHO_WORKER_PATH; }
std::string test_worker_path() { return HIBER_TEST_WORKER_PATH; }
std::string python_worker_path() { return HIBER_PYTHON_WORKER_PATH; }

std::string shim_preload() {
  const std::string shim = HIBER_SHIM_LIBRARY;
  const std::string runtime = HIBER_SANITIZER_RUNTIME;
  if (shim.empty()) return "";  // built without the CUDA toolkit
  return runtime.empty() ? shim : runtime + " " + shim;
}

std::string worker_programs_flag(const std::vector<std::string>& extra) {
  std::string flag = "--worker_programs=" + echo_worker_path() + "," + test_worker_path();
  if (::access("/usr/bin/python3", X_OK) == 0) flag += ",/usr/bin/python3";
  for (const std::string& program : extra) flag += "," + program;
  return flag;
}

std::string temp_dir(const std::string& prefix) {
  std::string pattern = "/tmp/" + prefix + "-XXXXXX";
  const char* made = ::mkdtemp(pattern.data());
  EXPECT_NE(made, nullptr);
  return pattern;
}

RouterProcess::RouterProcess(std::string state_dir, std::vector<std::string> flags) {
  const std::string port_file = state_dir + "/port";
  ::unlink(port_file.c_str());
  log_path_ = state_dir + "/router.log";
  std::vector<std::string> argv = {router_path(), "--listen=127.0.0.1:0",
                                   "--port_file=" + port_file, "--state_dir=" + state_dir,
                                   "--status_interval_ms=100"};
  if (::geteuid() == 0) argv.push_back("--allow_root");
  if (std::none_of(flags.begin(), flags.end(),
                   [](const std::string& f) { return f.rfind("--worker_programs=", 0) == 0; })) {
    argv.push_back(worker_programs_flag());
  }
  argv.insert(argv.end(), flags.begin(), flags.end());
  pid_ = spawn(argv, log_path_);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  for (;;) {
    std::ifstream in(port_file);
    unsigned port = 0;
    if (in >> port && port > 0) {
      target_ = router::HttpTarget{"127.0.0.1", static_cast<uint16_t>(port)};
      // Written before the router listens (unless a flag put it elsewhere).
      std::ifstream token(state_dir + "/operator-token");
      std::getline(token, operator_token_);
      break;
    }
    int status = 0;
    if (::waitpid(pid_, &status, WNOHANG) == pid_) {
      pid_ = -1;
      ADD_FAILURE() << "hiber-router exited at start:\n" << log();
      return;
    }
    if (std::chrono::steady_clock::now() > deadline) {
      ADD_FAILURE() << "hiber-router did not listen in 30 s:\n" << log();
      return;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  // Ready means a node answers: the router has read the nodes' status and registered with them.
  eventually([&] {
    auto ready = router::http_request(target_, "GET", "/v2/health/ready");
    return ready.ok() && ready->status == 200;
  });
}

RouterProcess::~RouterProcess() {
  if (pid_ > 0) stop();
}

std::string RouterProcess::log() const {
  std::ifstream in(log_path_);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

int RouterProcess::stop(std::chrono::milliseconds timeout) {
  if (pid_ <= 0) return -1;
  ::kill(pid_, SIGTERM);
  const int status = wait_exit(pid_, timeout);
  if (status == -1) {
    ::kill(pid_, SIGKILL);
    wait_exit(pid_, std::chrono::seconds(5));
  }
  pid_ = -1;
  return status;
}

router::HttpResponse RouterProcess::request(const std::string& method, const std::string& path,
                                            std::string body, const router::HttpHeaders& headers,
                                            std::chrono::milliseconds timeout) const {
  router::HttpHeaders with_token = headers;
  if (std::none_of(headers.begin(), headers.end(), [](const auto& h) {
        return strcasecmp(h.first.c_str(), "authorization") == 0;
      })) {
    with_token.emplace_back("Authorization", "Bearer " + operator_token_);
  }
  return anonymous_request(method, path, std::move(body), with_token, timeout);
}

router::HttpResponse RouterProcess::anonymous_request(const std::string& method,
                                                      const std::string& path, std::string body,
                                                      const router::HttpHeaders& headers,
                                                      std::chrono::milliseconds timeout) const {
  auto response = router::http_request(target_, method, path, std::move(body), headers, timeout);
  EXPECT_TRUE(response.ok()) << method << " " << path << ": " << response.status();
  return response.ok() ? std::move(*response) : router::HttpResponse{};
}

router::HttpResponse RouterProcess::load(const std::string& function,
                                         const nlohmann::json& registration) const {
  return request("POST", "/v2/repository/models/" + function + "/load", registration.dump(),
                 {{"Content-Type", "application/json"}});
}

router::HttpResponse RouterProcess::infer(const std::string& function, std::string body,
                                          const std::string& content_type,
                                          router::HttpHeaders headers) const {
  headers.emplace_back("Content-Type", content_type);
  return request("POST", "/v2/models/" + function + "/infer", std::move(body), headers);
}

nlohmann::json RouterProcess::status() const {
  router::HttpResponse response = request("GET", "/v2/status");
  return nlohmann::json::parse(response.body, nullptr, false);
}

nlohmann::json RouterProcess::function_status(const std::string& function) const {
  const nlohmann::json all = status();
  if (all.is_object() && all.contains("functions")) {
    for (const auto& f : all["functions"]) {
      if (f.value("name", "") == function) return f;
    }
  }
  return nullptr;
}

double RouterProcess::metric(const std::string& sample) const {
  router::HttpResponse response = request("GET", "/metrics");
  std::istringstream lines(response.body);
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind(sample + " ", 0) == 0)
      return std::strtod(line.c_str() + sample.size() + 1, nullptr);
  }
  return -1;
}

}  // namespace hiber::testing
