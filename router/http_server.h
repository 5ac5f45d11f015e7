// The router's HTTP/1.1 server, on Boost.Beast (docs/router.md says why Beast): keep-alive
// connections, one request at a time each, answered in order; a handler may answer later.
//
// Every connection is bounded: a request must arrive whole within the read timeout (a client
// sending one byte a second gets 408 and is closed), its header within 16 KiB and its body within
// the body limit (413, read no further); a malformed request gets 400. None of these touches
// another connection: all I/O is asynchronous on one thread.
//
// Thread safety: runs on the io_context's one thread; stop() there too.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>

#include "common/status.h"
#include "router/http_types.h"

namespace hiber::router {

struct HttpServerOptions {
  std::string listen = "127.0.0.1:8080";  // host:port; port 0 picks a free port
  uint64_t max_body_bytes = 64 << 20;
  std::chrono::milliseconds read_timeout{10000};  // from a request's first byte to its last
  std::chrono::milliseconds idle_timeout{60000};  // a keep-alive connection with no request
  size_t max_connections = 10000;
};

class HttpServer {
 public:
  using Handler = std::function<void(ApiRequest, Respond)>;

  static Result<std::unique_ptr<HttpServer>> create(boost::asio::io_context& io,
                                                    HttpServerOptions options, Handler handler);
  ~HttpServer();

  uint16_t port() const { return port_; }
  size_t connections() const { return *connections_; }
  // Stops accepting; open connections end after their current request.
  void stop();

 private:
  class Session;
  HttpServer(boost::asio::io_context& io, HttpServerOptions options, Handler handler);
  void accept();

  boost::asio::io_context& io_;
  const HttpServerOptions options_;
  const Handler handler_;
  boost::asio::ip::tcp::acceptor acceptor_;
  boost::asio::steady_timer accept_pause_;
  uint16_t port_ = 0;
  std::shared_ptr<size_t> connections_ = std::make_shared<size_t>(0);
};

}  // namespace hiber::router
