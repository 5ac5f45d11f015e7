// hiberd's control service: reads the requests of the control socket (wire/schema/control.capnp,
// as wire/control_types.h) and answers them with the controller: registrations, requests'
// arrival, start and end, drains, and status reports, which add the daemon's own view (its
// sessions and counters) to the controller's.
//
// Thread safety: answer() on the daemon's loop thread. Replies that wait for the controller
// (requestStart, drain, status, ...) are sent from the controller's thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string_view>
#include <vector>

#include "common/histogram.h"
#include "common/status.h"
#include "server/controller.h"
#include "server/device/device.h"
#include "server/module_cache.h"
#include "server/session_types.h"
#include "wire/control_types.h"
#include "wire/message.h"

namespace hiber::server {

class ControlService {
 public:
  // Sends one reply frame (or, when none could be encoded, why) to the requesting connection.
  using ReplySender = std::function<void(Result<std::vector<std::byte>>)>;

  // What the daemon adds to a status report, taken on its loop thread when the request comes.
  struct DaemonReport {
    std::vector<SessionSnapshot> sessions;
    uint64_t sessions_opened = 0;
    uint64_t sessions_closed = 0;
    uint64_t handshakes_rejected = 0;
    uint64_t malformed_messages = 0;  // handshakes, control requests and batches, ever
    uint64_t control_requests = 0;
    double uptime_seconds = 0;
    uint64_t incarnation = 0;  // this run of hiberd's (NodeStatus.incarnation)
    std::vector<std::string> refused_resumes;  // NodeStatus.refusedResumes
    // Every session's, those that ended included.
    uint64_t remoted_calls = 0;
    uint64_t remoted_batches = 0;
    Histogram batch_sizes{batch_size_bounds()};
  };

  // `device`, `controller` and `modules` must outlive the service.
  ControlService(device::Device& device, Controller& controller, const ModuleCache& modules,
                 std::function<DaemonReport()> daemon_report);

  // Answers a request: at once, or later (requestStart waits for the request to start, drain
  // for the node to be quiet, status for the controller's view), always through `send`. An
  // error means the request could not be read.
  Status answer(const wire::Message& request, ReplySender send);

  // Whether a request carries `token` (compared in constant time): what every control request
  // must carry, on the Unix socket and over TCP. kNotPermitted when the token is missing or
  // wrong; kInvalidValue when the request cannot be read.
  static Status check_token(const wire::Message& request, std::string_view token);

  // The error reply frame that answers a control request with `why`.
  static Result<std::vector<std::byte>> error_frame(const Status& why);

  // Answers a status request: the reply frame (a ControlReply holding a NodeStatus) comes
  // through `send`, later, on the controller's thread. On the daemon's loop thread, as answer().
  // hiberd's /metrics gets its report here too, so a scrape sees exactly what a status request
  // would. `page` picks the functions listed (all of them by default).
  void answer_status(ReplySender send, wire::control::StatusQuery page = {});

 private:
  device::Device& device_;
  Controller& controller_;
  const ModuleCache& modules_;
  const std::function<DaemonReport()> daemon_report_;
};

}  // namespace hiber::server
