// A client of hiberd's control socket (wire/schema/control.capnp): what the node router,
// hiberctl and the tests use. One request at a time per client, each answered by one reply;
// request_start() waits until the request has started, so a caller with several requests in
// flight keeps a client per waiting request.
//
// Errors hiberd answers with come back as a Status with hiberd's code and message; a broken
// connection or a reply that cannot be read is kDeinitialized or kInvalidValue.
//
// hiberd listens on its Unix control socket and, with --control_tcp_listen, on TCP; every
// request carries the node's control token, which the client adds. hiberd closes a connection
// left idle (--control_idle_timeout_ms): the next request then reconnects once, transparently.
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
  // A Unix control socket's path, with the token of the control-token file beside it
  // (common/paths.h); `timeout` bounds each reply.
  static Result<ControlClient> connect(
      const std::string& control_socket_path,
      std::chrono::milliseconds timeout = std::chrono::seconds(30));
  // `address` is "unix:/path", a bare path (the same) or "tcp:host:port" (an IPv6 host in
  // brackets); `token` goes in every request. An empty token on a Unix socket: the one in the
  // control-token file beside it (an error naming the file when it cannot be read); over TCP
  // it must be given. `timeout` bounds the TCP connect and each reply.
  static Result<ControlClient> connect(
      const std::string& address, const std::string& token,
      std::chrono::milliseconds timeout = std::chrono::seconds(30));

  Status ping();
  Status register_function(const FunctionRegistration& registration);
  Status unregister_function(const std::string& function_id);
  // The request's id. `instance`: the key of the function's instance that serves it (its Hello's
  // instance); "": any instance.
  Result<uint64_t> request_arrived(const std::string& function_id,
                                   const std::string& instance = "");
  Result<Started> request_start(uint64_t request);
  // (1.13) Both in one round trip: Started.request_id is the request's id. On failure hiberd has
  // ended the request.
  Result<Started> request_begin(const std::string& function_id, const std::string& instance = "");
  Status request_done(uint64_t request, bool failed = false);
  // gpu -1: the node.
  Status drain(int gpu = -1, bool resume = false);
  // The status reply, to read with read_message<proto::ControlReply>: every function, fetched
  // in pages of kStatusPageFunctions (wire/status_pages.h) and merged.
  Result<Message> status();

 private:
  ControlClient(std::string address, UniqueFd fd, std::string token,
                std::chrono::milliseconds timeout)
      : address_(std::move(address)),
        fd_(std::move(fd)),
        token_(std::move(token)),
        timeout_(timeout) {}
  static Result<UniqueFd> open(const std::string& address, std::chrono::milliseconds timeout);
  // One request and its reply on the connection as it is.
  Result<Message> exchange_once(const control::RequestBody& body);
  // Sends a request and returns hiberd's reply message, or its error answer as a Status.
  Result<Message> exchange(control::RequestBody body);
  // The same, for a reply of kind T.
  template <typename T>
  Result<T> call(control::RequestBody body);

  std::string address_;  // to reconnect
  UniqueFd fd_;
  bool used_ = false;  // an exchange has succeeded on fd_: hiberd may since have closed it idle
  std::string token_;
  std::chrono::milliseconds timeout_;
};

// Reads a control token file (hiberd's --control_token_file): the token is its first line.
// kNotPermitted when others than the owner and its group may read it (a token anyone can read
// protects nothing); kInvalidValue when the first line is empty.
Result<std::string> read_token_file(const std::string& path);

}  // namespace hiber::wire
