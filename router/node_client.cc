#include "router/node_client.h"

#include <netdb.h>

#include <array>
#include <cstring>
#include <optional>

#include <capnp/message.h>
#include <glog/logging.h>
#include <boost/asio/connect.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/local/stream_protocol.hpp>
#include <boost/asio/read.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/write.hpp>

#include "common/paths.h"
#include "wire/control_client.h"
#include "wire/control_codec.h"
#include "wire/limits.h"
#include "wire/schema/control.capnp.h"
#include "wire/socket_frame.h"
#include "wire/status_pages.h"

namespace hiber::router {
namespace {

namespace asio = boost::asio;
using boost::system::error_code;

Status io_status(const error_code& ec, std::string_view what, const std::string& node) {
  return error(ErrorCode::kDeinitialized, "node ", node, ": ", what, ": ", ec.message());
}

}  // namespace

Result<ControlAddress> parse_control_address(const std::string& text) {
  ControlAddress address;
  address.text = text;
  if (text.rfind("tcp:", 0) == 0) {
    const std::string rest = text.substr(4);
    const size_t colon = rest.rfind(':');
    if (colon == std::string::npos || colon == 0 || colon + 1 == rest.size()) {
      return error(ErrorCode::kInvalidValue, "control address \"", text,
                   "\": expected tcp:host:port");
    }
    const std::string host = rest.substr(0, colon);
    const std::string port = rest.substr(colon + 1);
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* found = nullptr;
    const int rc = ::getaddrinfo(host.c_str(), port.c_str(), &hints, &found);
    if (rc != 0 || found == nullptr) {
      return error(ErrorCode::kInvalidValue, "control address \"", text, "\": ", gai_strerror(rc));
    }
    address.endpoint = asio::generic::stream_protocol::endpoint(found->ai_addr, found->ai_addrlen);
    ::freeaddrinfo(found);
    address.tcp = true;
    return address;
  }
  std::string path = text.rfind("unix:", 0) == 0 ? text.substr(5) : text;
  if (path.empty() || path.size() >= sizeof(sockaddr_un::sun_path)) {
    return error(ErrorCode::kInvalidValue, "control address \"", text,
                 "\": a Unix socket path of 1 to ", sizeof(sockaddr_un::sun_path) - 1, " bytes");
  }
  address.endpoint = asio::local::stream_protocol::endpoint(path);
  return address;
}

struct NodeClient::Connection {
  explicit Connection(asio::io_context& io) : socket(io) {}
  asio::generic::stream_protocol::socket socket;
  bool connected = false;
};

struct NodeClient::Exchange {
  std::unique_ptr<Connection> connection;
  std::vector<std::byte> frame;
  // The reply's first bytes: its length prefix and, for the small replies of the invocation
  // path, the whole body, so that one read takes the reply.
  std::array<std::byte, 512> inbox{};
  size_t received = 0;
  wire::Message reply;
  std::function<void(Result<wire::Message>)> done;
  std::unique_ptr<asio::steady_timer> timer;
  bool timed_out = false;
  bool reused = false;  // the connection came from the pool
};

Result<std::unique_ptr<NodeClient>> NodeClient::create(asio::io_context& io, NodeConfig config) {
  HIBER_ASSIGN_OR_RETURN(ControlAddress address, parse_control_address(config.control));
  std::string token;
  if (!config.token_file.empty()) {
    Result<std::string> read = wire::read_token_file(config.token_file);
    if (!read.ok()) return read.status().with_context("node " + config.name);
    token = std::move(*read);
  } else if (address.tcp) {
    return error(ErrorCode::kInvalidValue, "node ", config.name,
                 ": a TCP control address needs a token_file");
  }
  return std::unique_ptr<NodeClient>(
      new NodeClient(io, std::move(config), std::move(address), std::move(token)));
}

const std::string& NodeClient::token() {
  if (token_.empty() && !address_.tcp) {
    // Until it can be read (hiberd creates it as it starts), requests go without one and hiberd
    // refuses them saying so.
    const std::string path =
        address_.text.rfind("unix:", 0) == 0 ? address_.text.substr(5) : address_.text;
    Result<std::string> read = wire::read_token_file(control_token_path(path));
    if (read.ok()) {
      token_ = std::move(*read);
    } else {
      LOG_EVERY_N(WARNING, 100) << "node " << config_.name << ": " << read.status();
    }
  }
  return token_;
}

Result<std::vector<std::byte>> NodeClient::request_frame(wire::control::RequestBody body) {
  capnp::MallocMessageBuilder request;
  wire::control::Request typed{wire::current_protocol_version(), std::move(body)};
  typed.token = token();
  wire::write_control_request(request.initRoot<wire::proto::ControlRequest>(), typed);
  return wire::encode_frame(request);
}

NodeClient::NodeClient(asio::io_context& io, NodeConfig config, ControlAddress address,
                       std::string token)
    : io_(io), config_(std::move(config)), address_(std::move(address)), token_(std::move(token)) {}

NodeClient::~NodeClient() { *alive_ = false; }

void NodeClient::call(wire::control::RequestBody body, ReplyHandler done,
                      std::chrono::milliseconds timeout) {
  Result<std::vector<std::byte>> frame = request_frame(std::move(body));
  if (!frame.ok()) {
    asio::post(io_, [done = std::move(done), status = frame.status()] { done(status); });
    return;
  }
  auto exchange = std::make_shared<Exchange>();
  exchange->frame = std::move(*frame);
  exchange->done = [done = std::move(done)](Result<wire::Message> message) {
    if (!message.ok()) return done(message.status());
    Result<wire::control::Reply> reply = Status(ErrorCode::kInvalidValue, "no control reply");
    Status read = wire::read_message<wire::proto::ControlReply>(
        *message, "control reply", [&](wire::proto::ControlReply::Reader r) -> Status {
          if (r.isError()) {
            reply =
                Status(static_cast<ErrorCode>(r.getError().getCode()), r.getError().getMessage());
          } else {
            reply = wire::read_control_reply(r);
          }
          return Status();
        });
    if (!read.ok()) return done(read);
    done(std::move(reply));
  };
  if (timeout.count() > 0) {
    exchange->timer = std::make_unique<asio::steady_timer>(io_, timeout);
  }
  start(std::move(exchange));
}

void NodeClient::status(StatusHandler done) {
  status_from(0, std::make_shared<std::vector<wire::Message>>(), std::move(done));
}

void NodeClient::status_from(uint64_t offset, std::shared_ptr<std::vector<wire::Message>> pages,
                             StatusHandler done) {
  Result<std::vector<std::byte>> frame =
      request_frame(wire::control::StatusQuery{offset, wire::kStatusPageFunctions});
  if (!frame.ok()) {
    asio::post(io_, [done = std::move(done), status = frame.status()] { done(status); });
    return;
  }
  auto exchange = std::make_shared<Exchange>();
  exchange->frame = std::move(*frame);
  exchange->done = [this, pages, done = std::move(done),
                    alive = std::weak_ptr<bool>(alive_)](Result<wire::Message> page) mutable {
    if (!page.ok()) return done(page.status());
    Result<std::optional<uint64_t>> next = wire::next_status_page(*page);
    if (!next.ok()) return done(next.status());
    pages->push_back(std::move(*page));
    if (!*next) return done(wire::merge_status_pages(*pages));
    if (alive.expired()) return;
    status_from(**next, std::move(pages), std::move(done));
  };
  exchange->timer = std::make_unique<asio::steady_timer>(io_, std::chrono::seconds(10));
  start(std::move(exchange));
}

void NodeClient::start(std::shared_ptr<Exchange> exchange) {
  ++outstanding_;
  if (exchange->timer) {
    exchange->timer->async_wait([exchange, alive = std::weak_ptr<bool>(alive_)](error_code ec) {
      if (ec || alive.expired() || !exchange->connection) return;
      exchange->timed_out = true;
      error_code ignored;
      exchange->connection->socket.close(ignored);
    });
  }
  if (!idle_.empty()) {
    exchange->connection = std::move(idle_.back());
    idle_.pop_back();
    exchange->reused = true;
    send(std::move(exchange));
    return;
  }
  connect(std::move(exchange));
}

void NodeClient::connect(std::shared_ptr<Exchange> exchange) {
  exchange->connection = std::make_unique<Connection>(io_);
  Connection& connection = *exchange->connection;
  connection.socket.async_connect(
      address_.endpoint, [this, exchange, alive = std::weak_ptr<bool>(alive_)](error_code ec) {
        if (alive.expired()) return;
        if (ec) return finish(exchange, io_status(ec, "connect " + address_.text, config_.name));
        if (address_.tcp) {
          error_code ignored;
          exchange->connection->socket.set_option(asio::ip::tcp::no_delay(true), ignored);
        }
        exchange->connection->connected = true;
        send(exchange);
      });
}

void NodeClient::send(std::shared_ptr<Exchange> exchange) {
  auto& socket = exchange->connection->socket;
  asio::async_write(socket, asio::buffer(exchange->frame),
                    [this, exchange, alive = std::weak_ptr<bool>(alive_)](error_code ec, size_t) {
                      if (alive.expired()) return;
                      if (ec) return finish(exchange, io_status(ec, "send", config_.name));
                      receive(exchange);
                    });
}

void NodeClient::receive(std::shared_ptr<Exchange> exchange) {
  auto& inbox = exchange->inbox;
  exchange->connection->socket.async_read_some(
      asio::buffer(inbox.data() + exchange->received, inbox.size() - exchange->received),
      [this, exchange, alive = std::weak_ptr<bool>(alive_)](error_code ec, size_t n) {
        if (alive.expired()) return;
        if (ec) return finish(exchange, io_status(ec, "receive", config_.name));
        exchange->received += n;
        if (exchange->received < 4) return receive(exchange);
        uint32_t length = 0;
        for (int i = 3; i >= 0; --i) {
          length = (length << 8) | std::to_integer<uint32_t>(exchange->inbox[i]);
        }
        const size_t have = exchange->received - 4;
        // hiberd answers one request at a time per connection: nothing may follow the reply.
        if (length == 0 || length > wire::kMaxControlReplyBytes || have > length) {
          return finish(exchange, error(ErrorCode::kInvalidValue, "node ", config_.name,
                                        ": control reply of ", length, " bytes",
                                        have > length ? " followed by more bytes" : ""));
        }
        std::span<std::byte> body = exchange->reply.resize(length);
        std::memcpy(body.data(), exchange->inbox.data() + 4, have);
        if (have == length) return finish(exchange, std::move(exchange->reply));
        asio::async_read(exchange->connection->socket,
                         asio::buffer(body.data() + have, body.size() - have),
                         [this, exchange, alive](error_code ec, size_t) {
                           if (alive.expired()) return;
                           if (ec) return finish(exchange, io_status(ec, "receive", config_.name));
                           finish(exchange, std::move(exchange->reply));
                         });
      });
}

void NodeClient::finish(const std::shared_ptr<Exchange>& exchange, Result<wire::Message> reply) {
  // hiberd closed a pooled connection for being idle before it read this request (nothing of
  // the reply came): the request was not acted on, so it goes again on a new connection.
  if (!reply.ok() && exchange->reused && !exchange->timed_out && exchange->received == 0) {
    exchange->reused = false;
    connect(exchange);
    return;
  }
  --outstanding_;
  if (exchange->timer) exchange->timer->cancel();
  if (reply.ok()) {
    up_ = true;
    // A bounded pool: more idle connections than this only cost hiberd descriptors.
    if (idle_.size() < 64) idle_.push_back(std::move(exchange->connection));
  } else {
    if (exchange->timed_out) {
      reply = error(ErrorCode::kTimeout, "node ", config_.name, ": no control reply in time");
    } else {
      up_ = false;
    }
    exchange->connection.reset();
  }
  auto done = std::move(exchange->done);
  done(std::move(reply));
}

}  // namespace hiber::router
