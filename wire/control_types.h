// The control socket's messages (wire/schema/control.capnp) as typed structs: what the control
// client sends and reads, and what hiberd's control service reads and answers, so that each is
// written once. wire/control_codec.h converts them to and from Cap'n Proto.
//
// The status reply is the exception: a large report that hiberd builds straight into its
// message and readers (hiberctl, the tests) read as the schema's NodeStatus.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <variant>

#include "common/status.h"
#include "wire/handshake.h"

namespace hiber::wire {

// registerFunction.
struct FunctionRegistration {
  std::string function_id;
  double slo_ms = 0;
  double tail_percentile = 0;  // 0: hiberd's default (0.98)
  uint64_t quota_bytes = 0;    // 0: hiberd's default
  bool stateful = false;
  std::optional<bool> heavy;  // a hint until hiberd has measured
  double exec_ms_hint = 0;
};

// requestDone.
struct RequestDone {
  uint64_t request_id = 0;
  bool failed = false;  // the function gave no answer
};

// drain: gpu -1 is the whole node.
struct Drain {
  int gpu = -1;
  bool resume = false;
};

// The answer to requestStart.
struct Started {
  int gpu = -1;
  std::string source;   // "resident", "peer" or "host"
  int source_gpu = -1;  // for "peer"
  std::string rule;     // the placement rule that chose the GPU
  double queued_ms = 0;
  // The link the model came over: "nvlink" or "pcie" for "peer" (by the node's topology),
  // "host" for "host", "" for "resident".
  std::string link;
  uint64_t request_id = 0;  // (1.13) requestBegin's request; 0 from requestStart
};

namespace control {

// A status request; from 1.5 it may ask for a page of the functions list (docs/wire-format.md).
struct StatusQuery {
  uint64_t function_offset = 0;
  uint32_t function_limit = 0;  // 0: every function from function_offset on
};
struct Ping {};
struct UnregisterFunction {
  std::string function_id;
};
struct RequestArrived {
  std::string function_id;
  // (1.7) The instance that serves it (its Hello's instance key); "": any.
  std::string instance = {};
};
struct RequestStart {
  uint64_t request_id = 0;
};
// (1.13) RequestArrived then RequestStart in one round trip; answered with Started (request_id
// set). On failure hiberd has ended the request.
struct RequestBegin {
  std::string function_id;
  std::string instance = {};  // as RequestArrived's
};
using RequestBody = std::variant<StatusQuery, Ping, FunctionRegistration, UnregisterFunction,
                                 RequestArrived, RequestStart, RequestDone, Drain, RequestBegin>;

struct Request {
  ProtocolVersion version;  // the sender's
  RequestBody body;
  // The control token (hiberd's --control_token_file), required on every request. Empty: none
  // sent.
  std::string token = {};
};

struct Pong {};
struct Ok {};
struct Accepted {
  uint64_t request_id = 0;  // requestArrived: the new request's id
};
// Every reply but status; a Status is hiberd's error answer (never ok).
using Reply = std::variant<Pong, Ok, Accepted, Started, Status>;

}  // namespace control
}  // namespace hiber::wire
