// Runs a real hiber-router process for integration tests, in front of real hiberd processes
// (tests/integration/hiberd_harness.h), and talks to it over HTTP (router/http_client.h).
#pragma once

#include <sys/types.h>

#include <chrono>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "router/http_client.h"
#include "tests/integration/hiberd_harness.h"

namespace hiber::testing {

std::string router_path();         // hiber-router
std::string echo_worker_path();    // hiber-echo-worker
std::string test_worker_path();    // hiber_router_test_worker
std::string python_worker_path();  // router/python/echo_worker.py
// LD_PRELOAD for workers registered with shim: true: the sanitizer runtime of this build (if
// any), then libhibercuda.so.
std::string shim_preload();
// --worker_programs= for the router: the echo worker, the test worker, /usr/bin/python3 (the
// Python SDK's workers), and `extra`.
std::string worker_programs_flag(const std::vector<std::string>& extra = {});

class RouterProcess {
 public:
  // Starts hiber-router --listen=127.0.0.1:0 with its state in `state_dir` (kept by the caller,
  // so that a second router can reuse it) and `flags`, and waits until it listens. Adds
  // worker_programs_flag() unless `flags` has a --worker_programs, and --allow_root as root.
  RouterProcess(std::string state_dir, std::vector<std::string> flags);
  // SIGTERM and wait, if still running.
  ~RouterProcess();
  RouterProcess(const RouterProcess&) = delete;
  RouterProcess& operator=(const RouterProcess&) = delete;

  pid_t pid() const { return pid_; }
  const router::HttpTarget& target() const { return target_; }
  std::string log() const;
  // SIGTERM, then waits; the exit status as from waitpid (or -1).
  int stop(std::chrono::milliseconds timeout = std::chrono::seconds(20));

  // One request on a fresh connection, as the operator (with the operator token the router
  // created in its state folder, unless `headers` has an Authorization); fails the test on a
  // transport error.
  router::HttpResponse request(const std::string& method, const std::string& path,
                               std::string body = {}, const router::HttpHeaders& headers = {},
                               std::chrono::milliseconds timeout = std::chrono::seconds(60)) const;
  // The same without any credential: what anybody who reaches the port can do.
  router::HttpResponse anonymous_request(
      const std::string& method, const std::string& path, std::string body = {},
      const router::HttpHeaders& headers = {},
      std::chrono::milliseconds timeout = std::chrono::seconds(60)) const;
  const std::string& operator_token() const { return operator_token_; }
  router::HttpResponse load(const std::string& function, const nlohmann::json& registration) const;
  router::HttpResponse infer(const std::string& function, std::string body,
                             const std::string& content_type = "application/octet-stream",
                             router::HttpHeaders headers = {}) const;
  nlohmann::json status() const;  // GET /v2/status
  // The status entry of `function` (null when absent).
  nlohmann::json function_status(const std::string& function) const;
  // GET /metrics: the value of the sample `name{labels}` exactly as written, or -1 if absent.
  double metric(const std::string& sample) const;

 private:
  pid_t pid_ = -1;
  std::string log_path_;
  std::string operator_token_;
  router::HttpTarget target_;
};

// A fresh temporary folder (removed by the caller, or left in /tmp for post-mortems).
std::string temp_dir(const std::string& prefix);

// Polls `pred` every 20 ms until it holds or `timeout` passes; returns whether it held.
template <typename Pred>
bool eventually(Pred pred, std::chrono::milliseconds timeout = std::chrono::seconds(30)) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    if (pred()) return true;
    if (std::chrono::steady_clock::now() > deadline) return false;
    ::usleep(20000);
  }
}

}  // namespace hiber::testing
