#include "containers/webhook/tls_server.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <optional>

#include <glog/logging.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/core/tcp_stream.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl/ssl_stream.hpp>
#include <nlohmann/json.hpp>

#include "router/listen_address.h"

namespace hiber::inject {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
namespace ssl = asio::ssl;
using asio::ip::tcp;
using boost::system::error_code;

constexpr uint32_t kMaxHeaderBytes = 16 << 10;

HttpReply error_reply(unsigned status, const std::string& message) {
  return HttpReply{status, "application/json", nlohmann::json{{"error", message}}.dump()};
}

// Inode, size and mtime of both files: a Secret's update replaces the files behind symlinks.
std::string stamp(const std::string& cert_file, const std::string& key_file) {
  std::string out;
  for (const std::string* file : {&cert_file, &key_file}) {
    struct stat st {};
    if (::stat(file->c_str(), &st) != 0) return "";
    out +=
        str_cat(st.st_ino, ":", st.st_size, ":", st.st_mtim.tv_sec, ".", st.st_mtim.tv_nsec, ";");
  }
  return out;
}

std::string openssl_message(const error_code& ec) {
  return ec.category() == asio::error::get_ssl_category() ? str_cat(ec.message(), " (OpenSSL)")
                                                          : ec.message();
}

}  // namespace

Result<std::shared_ptr<ssl::context>> load_tls_context(const std::string& cert_file,
                                                       const std::string& key_file) {
  for (const auto& [flag, file] :
       {std::pair<const char*, const std::string&>{"--tls_cert_file", cert_file},
        {"--tls_key_file", key_file}}) {
    if (file.empty()) return error(ErrorCode::kInvalidValue, flag, " is required (a PEM file)");
    if (::access(file.c_str(), R_OK) != 0) {
      return error(ErrorCode::kInvalidValue, flag, " ", file,
                   ": cannot read it: ", std::strerror(errno));
    }
  }
  auto context = std::make_shared<ssl::context>(ssl::context::tls_server);
  context->set_options(ssl::context::default_workarounds | ssl::context::no_sslv2 |
                       ssl::context::no_sslv3 | ssl::context::no_tlsv1 | ssl::context::no_tlsv1_1 |
                       ssl::context::single_dh_use);
  error_code ec;
  context->use_certificate_chain_file(cert_file, ec);
  if (ec) {
    return error(ErrorCode::kInvalidValue, "--tls_cert_file ", cert_file,
                 ": not a PEM certificate: ", openssl_message(ec));
  }
  context->use_private_key_file(key_file, ssl::context::pem, ec);
  if (ec && ec.category() == asio::error::get_ssl_category() &&
      ERR_GET_REASON(static_cast<unsigned long>(ec.value())) == X509_R_KEY_VALUES_MISMATCH) {
    return error(ErrorCode::kInvalidValue, "--tls_key_file ", key_file,
                 " is not the key of the certificate in --tls_cert_file ", cert_file);
  }
  if (ec) {
    return error(ErrorCode::kInvalidValue, "--tls_key_file ", key_file,
                 ": not a PEM private key: ", openssl_message(ec));
  }
  if (SSL_CTX_check_private_key(context->native_handle()) != 1) {
    return error(ErrorCode::kInvalidValue, "--tls_key_file ", key_file,
                 " is not the key of the certificate in --tls_cert_file ", cert_file);
  }
  return context;
}

class TlsServer::Session : public std::enable_shared_from_this<Session> {
 public:
  Session(tcp::socket socket, std::shared_ptr<ssl::context> context,
          const TlsServerOptions& options, const Handler& handler,
          std::shared_ptr<size_t> connections)
      : context_(std::move(context)),
        stream_(beast::tcp_stream(std::move(socket)), *context_),
        options_(options),
        handler_(handler),
        connections_(std::move(connections)) {
    ++*connections_;
  }
  ~Session() { --*connections_; }

  void start() {
    error_code ignored;
    peer_ = beast::get_lowest_layer(stream_).socket().remote_endpoint(ignored);
    beast::get_lowest_layer(stream_).socket().set_option(tcp::no_delay(true), ignored);
    beast::get_lowest_layer(stream_).expires_after(options_.read_timeout);
    stream_.async_handshake(ssl::stream_base::server, [self = shared_from_this()](error_code ec) {
      if (ec) {
        // Plaintext clients, scanners, clients that do not trust the certificate: one line each.
        LOG(INFO) << "TLS handshake with " << self->peer_ << " failed: " << openssl_message(ec);
        return self->close();
      }
      self->read_request();
    });
  }

 private:
  // A keep-alive connection waits for its next request's first bytes under the idle timeout;
  // the request itself then has the read timeout.
  void wait_for_request() {
    if (buffer_.size() > 0) return read_request();
    beast::get_lowest_layer(stream_).expires_after(options_.idle_timeout);
    stream_.async_read_some(buffer_.prepare(4096),
                            [self = shared_from_this()](error_code ec, size_t n) {
                              if (ec) return self->close();
                              self->buffer_.commit(n);
                              self->read_request();
                            });
  }

  void read_request() {
    parser_.emplace();
    parser_->body_limit(options_.max_body_bytes);
    parser_->header_limit(kMaxHeaderBytes);
    beast::get_lowest_layer(stream_).expires_after(options_.read_timeout);
    http::async_read(stream_, buffer_, *parser_,
                     [self = shared_from_this()](error_code ec, size_t) { self->on_read(ec); });
  }

  void on_read(error_code ec) {
    // A timed-out stream is closed already: nothing can be sent.
    if (ec == beast::error::timeout || ec == http::error::end_of_stream || ec == asio::error::eof ||
        ec == ssl::error::stream_truncated || ec == asio::error::connection_reset ||
        ec == asio::error::operation_aborted) {
      return close();
    }
    if (ec == http::error::body_limit) {
      return send(error_reply(413, str_cat("the body exceeds hiber-inject's limit of ",
                                           options_.max_body_bytes, " bytes")),
                  false);
    }
    if (ec == http::error::header_limit) {
      return send(error_reply(431, "the request's header is too large"), false);
    }
    if (ec) return send(error_reply(400, "malformed HTTP request: " + ec.message()), false);

    http::request<http::string_body> message = parser_->release();
    HttpRequest request;
    request.method = std::string(message.method_string());
    const std::string_view target(message.target().data(), message.target().size());
    request.path = std::string(target.substr(0, target.find('?')));
    request.body = std::move(message.body());
    version_ = message.version();
    send(handler_(request), message.keep_alive());
  }

  void send(HttpReply reply, bool keep_alive) {
    auto response = std::make_shared<http::response<http::string_body>>(
        static_cast<http::status>(reply.status), version_);
    response->set(http::field::server, "hiber-inject");
    response->set(http::field::content_type, reply.content_type);
    response->body() = std::move(reply.body);
    response->keep_alive(keep_alive);
    response->prepare_payload();
    beast::get_lowest_layer(stream_).expires_after(options_.read_timeout);
    http::async_write(stream_, *response,
                      [self = shared_from_this(), response](error_code ec, size_t) {
                        if (ec || !response->keep_alive()) return self->close();
                        self->wait_for_request();
                      });
  }

  void close() { beast::get_lowest_layer(stream_).close(); }

  // Held for the connection's life: a reload does not pull the pair from under it.
  std::shared_ptr<ssl::context> context_;
  beast::ssl_stream<beast::tcp_stream> stream_;
  const TlsServerOptions& options_;
  const Handler& handler_;
  std::shared_ptr<size_t> connections_;
  tcp::endpoint peer_;
  beast::flat_buffer buffer_;
  std::optional<http::request_parser<http::string_body>> parser_;
  unsigned version_ = 11;
};

TlsServer::TlsServer(asio::io_context& io, TlsServerOptions options, Handler handler)
    : options_(std::move(options)),
      handler_(std::move(handler)),
      acceptor_(io),
      accept_pause_(io) {}

TlsServer::~TlsServer() { stop(); }

Result<std::unique_ptr<TlsServer>> TlsServer::create(asio::io_context& io, TlsServerOptions options,
                                                     Handler handler) {
  const std::string loaded_stamp = stamp(options.cert_file, options.key_file);
  HIBER_ASSIGN_OR_RETURN(std::shared_ptr<ssl::context> context,
                         load_tls_context(options.cert_file, options.key_file));
  std::unique_ptr<TlsServer> server(new TlsServer(io, std::move(options), std::move(handler)));
  server->context_ = std::move(context);
  server->loaded_stamp_ = loaded_stamp;
  HIBER_RETURN_IF_ERROR(router::listen_on(server->acceptor_, server->options_.listen));
  server->port_ = server->acceptor_.local_endpoint().port();
  server->accept();
  return server;
}

std::shared_ptr<ssl::context> TlsServer::current_context() {
  const std::string now = stamp(options_.cert_file, options_.key_file);
  if (now.empty() || now == loaded_stamp_) return context_;
  // Looked at once per change: a pair caught half-written is tried again when it changes again.
  loaded_stamp_ = now;
  Result<std::shared_ptr<ssl::context>> reloaded =
      load_tls_context(options_.cert_file, options_.key_file);
  if (!reloaded.ok()) {
    LOG(WARNING) << "the certificate or key changed but does not load; keeping the previous "
                    "pair: "
                 << reloaded.status();
    return context_;
  }
  LOG(INFO) << "loaded the changed certificate " << options_.cert_file << " and key "
            << options_.key_file;
  context_ = std::move(*reloaded);
  return context_;
}

void TlsServer::accept() {
  acceptor_.async_accept([this](error_code ec, tcp::socket socket) {
    if (ec == asio::error::operation_aborted || !acceptor_.is_open()) return;
    if (ec) {
      // Out of descriptors and the like: pause rather than spin on an error that persists.
      LOG(WARNING) << "accept: " << ec.message();
      accept_pause_.expires_after(std::chrono::milliseconds(100));
      accept_pause_.async_wait([this](error_code wait) {
        if (!wait && acceptor_.is_open()) accept();
      });
      return;
    }
    if (*connections_ >= options_.max_connections) {
      LOG_EVERY_N(WARNING, 100) << "refusing a connection: " << *connections_
                                << " are open (--max_connections)";
      error_code ignored;
      socket.close(ignored);
    } else {
      std::make_shared<Session>(std::move(socket), current_context(), options_, handler_,
                                connections_)
          ->start();
    }
    accept();
  });
}

void TlsServer::stop() {
  error_code ignored;
  accept_pause_.cancel();
  acceptor_.close(ignored);
}

}  // namespace hiber::inject
