// A client of hiberd's control socket (wire/schema/control.capnp): what the node router,
// hiberctl and the tests use. One request at a time per client, each answered by one reply;
// request_start() waits until the request has started, so a caller with several requests in
// flight keeps a client per waiting request.
//
// Errors hiberd answers with come back as a Status with hiberd's code and message; a broken
// connection or a reply that cannot be read is kDeinitialized or kInvalidValue.
//
// Thread safety: a client is used by one thread at a time.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

#include "common/status.h"
#include "common/unique_fd.h"
#include "wire/control_types.h"
#include "wire/message.h"

namespace hiber::wire {

class ControlClient {
 public:
  static Result<ControlClient> connect(
      const std::string& control_socket_path,
      std::chrono::milliseconds timeout = std::chrono::seconds(30));

  Status ping();
  Status register_function(const FunctionRegistration& registration);
  Status unregister_function(const std::string& function_id);
  // The request's id.
  Result<uint64_t> request_arrived(const std::string& function_id);
  Result<Started> request_start(uint64_t request);
  Status request_done(uint64_t request, bool failed = false);
  // gpu -1: the node.
  Status drain(int gpu = -1, bool resume = false);
  // The status reply, to read with read_message<proto::ControlReply>.
  Result<Message> status();

 private:
  ControlClient(UniqueFd fd, std::chrono::milliseconds timeout)
      : fd_(std::move(fd)), timeout_(timeout) {}
  // Sends a request and returns hiberd's reply message, or its error answer as a Status.
  Result<Message> exchange(control::RequestBody body);
  // The same, for a reply of kind T.
  template <typename T>
  Result<T> call(control::RequestBody body);

  UniqueFd fd_;
  std::chrono::milliseconds timeout_;
};

}  // namespace hiber::wire
