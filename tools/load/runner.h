// hiber-load's HTTP side: sends a schedule of requests to the router open-loop (each at its
// time, whatever the answers do) over a fixed set of keep-alive connections, and records each
// request's status, latency and X-Hiber-* headers.
//
// HTTP/1.1 carries one request at a time per connection, so a request whose time comes while
// every connection is busy waits at the client for the first free one; its latency still counts
// from its scheduled time (no coordinated omission), and its send lag is recorded so the report
// can say that more connections were needed.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"
#include "tools/load/schedule.h"
#include "tools/load/summary.h"

namespace hiber::load {

struct RunOptions {
  int connections = 16;
  double timeout_ms = 60000;  // per request, from its send
  std::string content_type = "application/octet-stream";
  uint64_t max_answer_bytes = uint64_t{64} << 20;
};

struct RunProgress {
  uint64_t total = 0;
  uint64_t sent = 0;
  uint64_t done = 0;
  uint64_t failed = 0;  // non-2xx or no answer
  double elapsed_s = 0;
};

struct RunResult {
  std::vector<RequestRecord> records;  // in schedule order
  double wall_s = 0;
};

// `body(request)` is the request's body. `progress` (optional) is called after each answer,
// from the thread that called run_load.
Result<RunResult> run_load(const Endpoint& router, const std::vector<std::string>& functions,
                           const std::vector<ScheduledRequest>& schedule,
                           const std::function<std::string(const ScheduledRequest&)>& body,
                           const RunOptions& options,
                           const std::function<void(const RunProgress&)>& progress = nullptr);

// One blocking GET: the status and body (for the set-up queries before a run).
struct HttpAnswer {
  int status = 0;
  std::string body;
};
Result<HttpAnswer> http_get(const Endpoint& router, const std::string& target,
                            double timeout_ms = 10000);

// A function's slo_ms as the router knows it: `parameters.slo_ms` of GET /v2/models/{fn}, else
// its entry in GET /v2/status; nullopt when neither has it (or the function is unknown).
Result<std::optional<double>> fetch_slo_ms(const Endpoint& router, const std::string& function);

}  // namespace hiber::load
