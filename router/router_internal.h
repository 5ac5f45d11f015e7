// The router's private parts, shared by its two halves: router.cc (creation, the invocation
// pipeline, workers and nodes, shutdown) and router_api.cc (the HTTP API, registration and the
// status report). Not for use outside router/.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "router/router.h"
#include "wire/control_types.h"

namespace hiber::router {
namespace detail {

using Clock = std::chrono::steady_clock;

constexpr size_t kLatencyWindow = 2048;  // recent answers per function, for p50 and p99
// The window of a function's request rate (`rps` in /v2/status): answers in the last 10 s.
constexpr std::chrono::seconds kRateWindow{10};
constexpr size_t kRecentSwaps = 50;

inline double wall_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// The media type of a Content-Type value, lower case, without parameters.
inline std::string media_type(const std::string& content_type) {
  std::string type = content_type.substr(0, content_type.find(';'));
  while (!type.empty() && type.back() == ' ') type.pop_back();
  for (char& c : type) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return type;
}

// Transport failures make a node unreachable (503, retry); anything else hiberd said is the
// request's own failure.
inline unsigned status_for(const Status& status) {
  switch (status.code()) {
    case ErrorCode::kDeinitialized:
    case ErrorCode::kTimeout:
    case ErrorCode::kNoDevice:
    case ErrorCode::kDeviceUnavailable: return 503;
    default: return 500;
  }
}

inline ApiResponse retry_later(unsigned status, std::string_view message) {
  ApiResponse response = error_response(status, message);
  response.headers.emplace_back("Retry-After", "1");
  return response;
}

}  // namespace detail

struct Router::Invocation {
  std::string id;          // the router's: worker protocol and asynchronous result id
  std::string request_id;  // X-Request-Id
  // The JSON request's "id": its answer's "id" (the protocol's), whatever the worker wrote.
  std::optional<std::string> client_id;
  std::string function;
  std::string content_type;
  std::string body;
  // A request in the binary tensor data extension: its JSON's length at the body's start.
  std::optional<uint64_t> inference_header_bytes;
  detail::Clock::time_point arrival;
  std::optional<detail::Clock::time_point> deadline;
  Respond respond;  // empty for an asynchronous invocation
  bool answered = false;
  std::unique_ptr<boost::asio::steady_timer> deadline_timer;
  // Times it went back to the queue because its node or its worker's session was lost.
  int requeued = 0;
  // Set when it waits for a node to answer (none did, or its node was lost): past it, 503.
  std::optional<detail::Clock::time_point> node_wait_until;
  // Requeued after its node was lost: not dispatched again before this (no busy retries).
  std::optional<detail::Clock::time_point> retry_at;
  // Once it has left the router's queue.
  std::optional<uint64_t> instance;
  size_t node = 0;
  std::optional<uint64_t> hiberd_request;
  std::optional<wire::Started> started;
  bool shed = false;  // hiberd answered its start "overloaded"
  // The worker answered that the request was the client's mistake (a 4xx of its choosing).
  bool client_error = false;
  detail::Clock::time_point dispatched;
  detail::Clock::time_point started_at;
};

struct Router::Instance {
  std::unique_ptr<Worker> worker;
  size_t node = 0;
  uint64_t generation = 0;   // the registration it was started with
  size_t busy = 0;           // requests given to it, from hiberd's arrival to done
  bool scaled_down = false;  // stopped by the router, not lost
  bool became_ready = false;
  detail::Clock::time_point spawned;
  detail::Clock::time_point idle_since;
  // hiberd said it has no session of this worker (a restarted hiberd before the worker's shim
  // resumed, or a session that ended): since then.
  std::optional<detail::Clock::time_point> session_missing_since;
};

struct Router::Function {
  FunctionSpec spec;
  uint64_t generation = 0;
  bool unloading = false;
  std::deque<std::shared_ptr<Invocation>> queue;
  std::map<uint64_t, Instance> instances;
  // Start failures in a row, and when the next start may be tried.
  int start_failures = 0;
  detail::Clock::time_point next_start;
  std::string last_start_error;
  // Answers.
  // rejected: by the router (its queue full, no node up); shed: by hiberd, as overloaded.
  uint64_t requests = 0, ok = 0, failed = 0, on_time = 0, rejected = 0, shed = 0;
  std::deque<double> latencies_ms;
  std::deque<detail::Clock::time_point> answered_at;  // of `requests`, the last kRateWindow's
};

struct Router::NodeView {
  bool up = false;
  bool registered = false;  // every function was registered since it last came up
  uint64_t incarnation = 0;  // hiberd's run (NodeStatus.incarnation): another one restarted
  bool begins_requests = false;  // it answers requestBegin (protocol 1.13)
  double uptime_seconds = 0;
  std::string backend;
  uint64_t queued = 0;
  uint64_t shed = 0;         // hiberd's requests answered "overloaded"
  uint64_t preemptions = 0;  // and background leases ended at their slice
  nlohmann::json gpus = nlohmann::json::array();
  std::set<std::string> resident;  // functions with a model resident on one of its GPUs
  std::set<std::string> session_instances;  // the instance keys of its sessions
  std::set<std::string> refused_resumes;    // instance keys whose sessions it did not resume
  // It restarted or went down at `lost_at`: the GPU workers started before must resume their
  // sessions by `resume_by`, or are replaced.
  std::optional<detail::Clock::time_point> lost_at, resume_by;
};

struct Router::AsyncResult {
  bool done = false;
  ApiResponse response;
  detail::Clock::time_point expires;
};

struct Router::Swap {
  double time;
  std::string function;
  std::string node;
  wire::Started started;
};

}  // namespace hiber::router
