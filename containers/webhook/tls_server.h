// hiber-inject's HTTPS server: HTTP/1.1 over TLS on Boost.Beast and OpenSSL, the shape of the
// router's HttpServer (router/http_server.h) with a TLS layer and a synchronous handler.
//
// Every connection is bounded: its TLS handshake and each request must arrive whole within the
// read timeout, a keep-alive connection waits at most the idle timeout for the next one, a header
// within 16 KiB, a body within the limit (413); past the connection limit a new connection is
// closed at once. A failed handshake, a plaintext or garbage client, or a slow one ends its own
// connection only: all I/O is asynchronous on one thread.
//
// The certificate and key are read again when either file changes (a renewed Secret): each new
// connection uses the newest pair that loads; a pair that does not load is logged and the last
// good one kept.
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
#include <boost/asio/ssl/context.hpp>
#include <boost/asio/steady_timer.hpp>

#include "common/status.h"

namespace hiber::inject {

struct TlsServerOptions {
  std::string listen = "0.0.0.0:8443";  // host:port; port 0 picks a free port
  std::string cert_file;                // PEM: the certificate, then any intermediates
  std::string key_file;                 // PEM: its private key
  uint64_t max_body_bytes = 8 << 20;
  std::chrono::milliseconds read_timeout{10000};  // a handshake, or a request's bytes
  std::chrono::milliseconds idle_timeout{60000};  // a keep-alive connection with no request
  size_t max_connections = 1000;
};

struct HttpRequest {
  std::string method;
  std::string path;  // the target without its query
  std::string body;
};

struct HttpReply {
  unsigned status = 200;
  std::string content_type = "application/json";
  std::string body;
};

// A TLS server context holding the pair; kInvalidValue naming the flag and the file when either
// cannot be read, is not PEM, or the key is not the certificate's.
Result<std::shared_ptr<boost::asio::ssl::context>> load_tls_context(const std::string& cert_file,
                                                                    const std::string& key_file);

class TlsServer {
 public:
  using Handler = std::function<HttpReply(const HttpRequest&)>;

  // Loads the pair and listens; errors say which.
  static Result<std::unique_ptr<TlsServer>> create(boost::asio::io_context& io,
                                                   TlsServerOptions options, Handler handler);
  ~TlsServer();

  uint16_t port() const { return port_; }
  size_t connections() const { return *connections_; }
  // Stops accepting; open connections end after their current request.
  void stop();

 private:
  class Session;
  TlsServer(boost::asio::io_context& io, TlsServerOptions options, Handler handler);
  void accept();
  // The context for a new connection: reloaded first if the files changed since last looked at.
  std::shared_ptr<boost::asio::ssl::context> current_context();

  const TlsServerOptions options_;
  const Handler handler_;
  boost::asio::ip::tcp::acceptor acceptor_;
  boost::asio::steady_timer accept_pause_;
  std::shared_ptr<boost::asio::ssl::context> context_;
  std::string loaded_stamp_;  // the files' inode, size and mtime when last loaded
  uint16_t port_ = 0;
  std::shared_ptr<size_t> connections_ = std::make_shared<size_t>(0);
};

}  // namespace hiber::inject
