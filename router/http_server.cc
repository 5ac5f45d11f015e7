#include "router/http_server.h"

#include <optional>

#include <glog/logging.h>
#include <boost/asio/steady_timer.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http.hpp>
#include <nlohmann/json.hpp>

#include "router/listen_address.h"

namespace hiber::router {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using asio::ip::tcp;
using boost::system::error_code;

constexpr uint32_t kMaxHeaderBytes = 16 << 10;

}  // namespace

const std::string& ApiRequest::header(std::string_view name) const {
  static const std::string kNone;
  for (const auto& [key, value] : headers) {
    if (key == name) return value;
  }
  return kNone;
}

ApiResponse error_response(unsigned status, std::string_view message) {
  ApiResponse response;
  response.status = status;
  response.body = nlohmann::json{{"error", message}}.dump();
  return response;
}

class HttpServer::Session : public std::enable_shared_from_this<Session> {
 public:
  Session(tcp::socket socket, const HttpServerOptions& options, const Handler& handler,
          std::shared_ptr<size_t> connections)
      : socket_(std::move(socket)),
        timer_(socket_.get_executor()),
        options_(options),
        handler_(handler),
        connections_(std::move(connections)) {
    ++*connections_;
  }
  ~Session() { --*connections_; }

  void start() {
    error_code ignored;
    socket_.set_option(tcp::no_delay(true), ignored);
    wait_for_request();
  }

  // Refuses the connection at once (too many open).
  void refuse() { send(error_response(503, "too many connections"), /*close=*/true, true); }

 private:
  // An idle keep-alive connection waits for its next request's first byte under the idle
  // timeout; the request itself then has the read timeout.
  void wait_for_request() {
    if (buffer_.size() > 0) return read_request();
    arm_timer(options_.idle_timeout);
    socket_.async_wait(tcp::socket::wait_read, [self = shared_from_this()](error_code ec) {
      if (ec || self->timed_out_) return self->close();
      self->read_request();
    });
  }

  void read_request() {
    parser_.emplace();
    parser_->body_limit(options_.max_body_bytes);
    parser_->header_limit(kMaxHeaderBytes);
    arm_timer(options_.read_timeout);
    http::async_read(socket_, buffer_, *parser_,
                     [self = shared_from_this()](error_code ec, size_t) { self->on_read(ec); });
  }

  void arm_timer(std::chrono::milliseconds timeout) {
    timed_out_ = false;
    timer_.expires_after(timeout);
    timer_.async_wait([weak = weak_from_this()](error_code ec) {
      auto self = weak.lock();
      if (ec || !self) return;
      self->timed_out_ = true;
      error_code ignored;
      self->socket_.cancel(ignored);
    });
  }

  void on_read(error_code ec) {
    timer_.cancel();
    if (timed_out_) {
      return send(error_response(408, "the request did not arrive in time"), true, true);
    }
    if (ec == http::error::end_of_stream || ec == asio::error::eof ||
        ec == asio::error::connection_reset || ec == asio::error::operation_aborted) {
      return close();
    }
    if (ec == http::error::body_limit) {
      return send(error_response(413, "the body exceeds the router's limit of " +
                                          std::to_string(options_.max_body_bytes) + " bytes"),
                  true, true);
    }
    if (ec == http::error::header_limit) {
      return send(error_response(431, "the request's header is too large"), true, true);
    }
    if (ec) return send(error_response(400, "malformed HTTP request: " + ec.message()), true, true);

    http::request<http::string_body> message = parser_->release();
    ApiRequest request;
    request.method = std::string(message.method_string());
    const std::string_view target(message.target().data(), message.target().size());
    const size_t question = target.find('?');
    request.path = std::string(target.substr(0, question));
    if (question != std::string_view::npos)
      request.query = std::string(target.substr(question + 1));
    for (const auto& field : message) {
      std::string name(field.name_string());
      for (char& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
      request.headers.emplace_back(std::move(name), std::string(field.value()));
    }
    request.body = std::move(message.body());
    const bool keep_alive = message.keep_alive();
    const unsigned version = message.version();
    version_ = version;
    head_ = message.method() == http::verb::head;
    // The answer holds the session: nothing else does while the handler works.
    handler_(std::move(request), [self = shared_from_this(), keep_alive](ApiResponse response) {
      self->send(std::move(response), !keep_alive, false);
    });
  }

  void send(ApiResponse answer, bool close_after, bool refuse_more) {
    auto response = std::make_shared<http::response<http::string_body>>(
        static_cast<http::status>(answer.status), version_);
    response->set(http::field::server, "hiber-router");
    response->set(http::field::content_type, answer.content_type);
    for (auto& [name, value] : answer.headers) response->set(name, value);
    response->body() = std::move(answer.body);
    response->keep_alive(!close_after && !refuse_more);
    response->prepare_payload();
    if (head_) {
      // HEAD: the header GET would have had (its Content-Length too), without the body.
      head_ = false;
      auto serializer = std::make_shared<http::response_serializer<http::string_body>>(*response);
      http::async_write_header(
          socket_, *serializer,
          [self = shared_from_this(), response, serializer](error_code ec, size_t) {
            if (ec || !response->keep_alive()) return self->close();
            self->wait_for_request();
          });
      return;
    }
    http::async_write(socket_, *response,
                      [self = shared_from_this(), response](error_code ec, size_t) {
                        if (ec || !response->keep_alive()) return self->close();
                        self->wait_for_request();
                      });
  }

  void close() {
    timer_.cancel();
    error_code ignored;
    socket_.shutdown(tcp::socket::shutdown_both, ignored);
    socket_.close(ignored);
  }

  tcp::socket socket_;
  asio::steady_timer timer_;
  const HttpServerOptions& options_;
  const Handler& handler_;
  std::shared_ptr<size_t> connections_;
  beast::flat_buffer buffer_;
  std::optional<http::request_parser<http::string_body>> parser_;
  bool timed_out_ = false;
  bool head_ = false;  // the request being answered is a HEAD
  unsigned version_ = 11;
};

HttpServer::HttpServer(asio::io_context& io, HttpServerOptions options, Handler handler)
    : io_(io),
      options_(std::move(options)),
      handler_(std::move(handler)),
      acceptor_(io),
      accept_pause_(io) {}

HttpServer::~HttpServer() { stop(); }

Result<std::unique_ptr<HttpServer>> HttpServer::create(asio::io_context& io,
                                                       HttpServerOptions options, Handler handler) {
  std::unique_ptr<HttpServer> server(new HttpServer(io, std::move(options), std::move(handler)));
  HIBER_RETURN_IF_ERROR(listen_on(server->acceptor_, server->options_.listen));
  server->port_ = server->acceptor_.local_endpoint().port();
  server->accept();
  return server;
}

void HttpServer::accept() {
  acceptor_.async_accept([this](error_code ec, tcp::socket socket) {
    if (ec == asio::error::operation_aborted || !acceptor_.is_open()) return;
    if (!ec) {
      auto session = std::make_shared<Session>(std::move(socket), options_, handler_, connections_);
      if (*connections_ > options_.max_connections) {
        session->refuse();
      } else {
        session->start();
      }
    } else {
      // Out of descriptors and the like: pause rather than spin on an error that persists.
      LOG(WARNING) << "accept: " << ec.message();
      accept_pause_.expires_after(std::chrono::milliseconds(100));
      accept_pause_.async_wait([this](error_code wait) {
        if (!wait && acceptor_.is_open()) accept();
      });
      return;
    }
    accept();
  });
}

void HttpServer::stop() {
  error_code ignored;
  accept_pause_.cancel();
  acceptor_.close(ignored);
}

}  // namespace hiber::router
