// Where workers that the router does not start attach (docs/router.md, "Attached workers"): a
// Unix socket and a TCP listener. A connection must send its hello, carrying the worker token,
// within the hello timeout; at most max_pending connections wait for their hello at once (more
// are closed as they come). A good hello hands the connection to the router, which checks the
// function it names. Every refusal closes that connection alone, with one log line naming the
// peer and the reason.
//
// Thread safety: everything runs on the io_context's one thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include <boost/asio/generic/stream_protocol.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/local/stream_protocol.hpp>
#include <boost/asio/steady_timer.hpp>

#include "common/status.h"

namespace hiber::router {

struct AttachOptions {
  std::string unix_path;   // empty: no Unix socket
  std::string tcp_listen;  // HOST:PORT (port 0: any free one); empty: no TCP listener
  std::string token;       // what every hello must carry
  size_t max_pending = 64;
  std::chrono::milliseconds hello_timeout{10000};
};

// What a good hello said.
struct AttachHello {
  std::string function;
  std::string run_dir;   // HIBER_RUN_DIR as the worker saw it; empty when it sent none
  std::string instance;  // HIBER_INSTANCE_ID as the worker saw it; empty when it sent none
  std::string peer;      // "unix (pid 12, uid 1000)" or "tcp 10.0.0.5:41234", for log lines
};

class AttachListener {
 public:
  using Socket = boost::asio::generic::stream_protocol::socket;
  // Takes the connection (and returns none), or returns why it is refused (then the listener
  // logs it and closes the connection).
  using OnHello = std::function<std::optional<std::string>(AttachHello, Socket&)>;

  // Binds and listens (a stale Unix socket file is replaced; the socket is made connectable by
  // every user: the token is what authenticates). REQUIRES: a non-empty token.
  static Result<std::unique_ptr<AttachListener>> create(boost::asio::io_context& io,
                                                        AttachOptions options, OnHello on_hello);
  // Closes the listeners and every connection still waiting for its hello.
  ~AttachListener();

  // The TCP listener's port (0 without one).
  uint16_t tcp_port() const;

 private:
  struct Pending;

  AttachListener(boost::asio::io_context& io, AttachOptions options, OnHello on_hello);
  void accept_unix();
  void accept_tcp();
  // After an accept error (out of descriptors), waits a little before accepting again.
  void retry_later(std::function<void()> accept);
  void admit(Socket socket, std::string peer);
  void read_hello(uint64_t id);
  void on_hello_frame(uint64_t id, std::string_view extra);
  void refuse(uint64_t id, const std::string& why);

  boost::asio::io_context& io_;
  const AttachOptions options_;
  OnHello on_hello_;
  boost::asio::local::stream_protocol::acceptor unix_acceptor_;
  boost::asio::ip::tcp::acceptor tcp_acceptor_;
  std::map<uint64_t, std::unique_ptr<Pending>> pending_;
  uint64_t next_id_ = 1;
  std::shared_ptr<bool> alive_ = std::make_shared<bool>(true);
};

}  // namespace hiber::router
