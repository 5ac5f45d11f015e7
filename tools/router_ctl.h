// hiberctl's commands that talk to hiber-router over its HTTP API (docs/router.md): each prints
// what it got (answers to stdout, diagnostics to stderr) and returns the exit status.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "router/http_client.h"

namespace hiber::tools {

// The message a non-2xx answer carries: the "error" field of a JSON body, else the body.
std::string router_error_message(const router::HttpResponse& response);

// Prints "hiberctl: <message>" on stderr (without the CUDA error name Status::to_string gives)
// and returns 1: how a router command fails before or without an answer.
int fail_router_command(const Status& s);

// `hiberctl functions`: the registry with each function's numbers.
int ctl_functions(router::HttpConnection& router, std::chrono::milliseconds timeout);

struct InvokeOptions {
  std::string function;
  std::string body;
  std::string content_type = "application/json";
  bool async = false;
  int64_t deadline_ms = 0;                   // 0: none
  std::string request_id;                    // empty: the router makes one
  std::chrono::milliseconds timeout{30000};  // per exchange; with async, for the whole wait
};

// `hiberctl invoke`: the answer's body to stdout, X-Request-Id and X-Hiber-* headers to stderr
// ("Name: value" lines); 1 with the router's message on a non-2xx answer.
int ctl_invoke(router::HttpConnection& router, const InvokeOptions& options);

// `hiberctl load` / `hiberctl unload`.
int ctl_load(router::HttpConnection& router, const std::string& function,
             const nlohmann::json& registration, std::chrono::milliseconds timeout);
int ctl_unload(router::HttpConnection& router, const std::string& function,
               std::chrono::milliseconds timeout);

struct TopLoopOptions {
  std::chrono::milliseconds interval{1000};
  uint64_t iterations = 0;  // 0: until interrupted
  bool live = true;         // clear and redraw (a terminal); else print each refresh in turn
  std::chrono::milliseconds timeout{30000};
};

// `hiberctl top`: redraws tools/top_view.h's screen every interval.
int ctl_top(router::HttpConnection& router, const TopLoopOptions& options);

}  // namespace hiber::tools
