// One hiberd node as the router reaches it: asynchronous control exchanges (the Cap'n Proto
// control protocol of wire/schema/control.capnp) over pooled connections to the node's control
// socket, a Unix socket or hiberd's token-authenticated TCP listener.
//
// hiberd answers one request at a time per connection, and requestStart is answered only once
// the request has started, so each exchange takes a connection of its own from the pool (or opens
// one) and gives it back after the reply. A connection that fails is dropped, and the node is
// marked down until an exchange succeeds again; but one taken from the pool that hiberd closed
// for being idle (--control_idle_timeout_ms) before the request reached it is replaced by a new
// one, and the request sent again.
//
// Every request carries the node's control token: the token_file's, or else the one in the
// control-token file beside a Unix control socket (read when first needed, so the router may
// start before hiberd).
//
// Thread safety: every call and every handler runs on the io_context's one thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <boost/asio/generic/stream_protocol.hpp>
#include <boost/asio/io_context.hpp>

#include "common/status.h"
#include "wire/control_types.h"
#include "wire/message.h"

namespace hiber::router {

// "unix:/path", a bare path (a Unix socket), or "tcp:host:port".
struct ControlAddress {
  boost::asio::generic::stream_protocol::endpoint endpoint;
  bool tcp = false;
  std::string text;  // as configured, for messages
};
// Resolves a TCP host at once (the router resolves its nodes when it starts).
Result<ControlAddress> parse_control_address(const std::string& text);

struct NodeConfig {
  std::string name;
  std::string control;  // a ControlAddress
  std::string run_dir;  // where the node's function socket and token are, for workers
  // The control token's file: required for a TCP address; for a Unix socket, empty means the
  // control-token file beside it.
  std::string token_file;
};

class NodeClient {
 public:
  using ReplyHandler = std::function<void(Result<wire::control::Reply>)>;
  using StatusHandler = std::function<void(Result<wire::Message>)>;

  static Result<std::unique_ptr<NodeClient>> create(boost::asio::io_context& io, NodeConfig config);
  ~NodeClient();

  const NodeConfig& config() const { return config_; }
  // False after an exchange failed to connect, send or receive, until one succeeds.
  bool up() const { return up_; }

  // Sends one control request; `done` gets hiberd's reply (its error answer as a Status). A
  // timeout of zero waits as long as hiberd takes (requestStart waits for the GPU).
  void call(wire::control::RequestBody body, ReplyHandler done,
            std::chrono::milliseconds timeout = std::chrono::seconds(10));
  // The node's status report, to read as proto::ControlReply: every function, fetched in pages
  // (wire/status_pages.h) and merged.
  void status(StatusHandler done);

  // Exchanges in flight, for tests and the status page.
  size_t outstanding() const { return outstanding_; }

 private:
  struct Connection;
  struct Exchange;
  NodeClient(boost::asio::io_context& io, NodeConfig config, ControlAddress address,
             std::string token);

  // The token every request carries (read from the default file once it can be).
  const std::string& token();
  Result<std::vector<std::byte>> request_frame(wire::control::RequestBody body);
  void status_from(uint64_t offset, std::shared_ptr<std::vector<wire::Message>> pages,
                   StatusHandler done);
  void start(std::shared_ptr<Exchange> exchange);
  void connect(std::shared_ptr<Exchange> exchange);
  void send(std::shared_ptr<Exchange> exchange);
  void receive(std::shared_ptr<Exchange> exchange);
  void finish(const std::shared_ptr<Exchange>& exchange, Result<wire::Message> reply);

  boost::asio::io_context& io_;
  const NodeConfig config_;
  const ControlAddress address_;
  std::string token_;
  std::vector<std::unique_ptr<Connection>> idle_;
  size_t outstanding_ = 0;
  bool up_ = true;
  // Handlers still in flight hold it weakly, so a callback after destruction does nothing.
  std::shared_ptr<bool> alive_ = std::make_shared<bool>(true);
};

}  // namespace hiber::router
