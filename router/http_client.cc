#include "router/http_client.h"

#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <limits>
#include <optional>

#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

namespace hiber::router {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = boost::beast::http;
using tcp = asio::ip::tcp;

bool iequals(std::string_view a, std::string_view b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
           return std::tolower(static_cast<unsigned char>(x)) ==
                  std::tolower(static_cast<unsigned char>(y));
         });
}

// Errors that mean the server hung up (or never listened), rather than a malformed answer.
Status transport_error(const beast::error_code& ec, std::string_view what,
                       const HttpTarget& target) {
  if (ec == beast::error::timeout) {
    return error(ErrorCode::kTimeout, what, " ", target.url(), ": no answer in time");
  }
  if (ec.category() == beast::error_code(http::error::bad_version).category() &&
      ec != http::error::end_of_stream && ec != http::error::partial_message) {
    return error(ErrorCode::kInvalidValue, what, " ", target.url(),
                 ": malformed answer: ", ec.message());
  }
  return error(ErrorCode::kDeinitialized, what, " ", target.url(), ": ", ec.message());
}

}  // namespace

std::string HttpTarget::host_header() const {
  const bool v6 = host.find(':') != std::string::npos;
  return str_cat(v6 ? "[" : "", host, v6 ? "]" : "", ":", port);
}

std::string HttpTarget::url() const { return "http://" + host_header(); }

Result<HttpTarget> parse_http_url(std::string_view url) {
  auto bad = [&](std::string_view why) {
    return error(ErrorCode::kInvalidValue, "'", url, "' is not an http://host:port URL: ", why);
  };
  constexpr std::string_view kScheme = "http://";
  if (url.size() < kScheme.size() || !iequals(url.substr(0, kScheme.size()), kScheme)) {
    return bad("it must start with http://");
  }
  std::string_view rest = url.substr(kScheme.size());
  if (!rest.empty() && rest.back() == '/') rest.remove_suffix(1);
  if (rest.find_first_of("/?#@") != std::string_view::npos) {
    return bad("a path, query or user is not allowed");
  }
  HttpTarget target;
  std::string_view port;
  if (!rest.empty() && rest.front() == '[') {
    const size_t close = rest.find(']');
    if (close == std::string_view::npos) return bad("unterminated [");
    target.host = std::string(rest.substr(1, close - 1));
    std::string_view after = rest.substr(close + 1);
    if (!after.empty()) {
      if (after.front() != ':') return bad("junk after ]");
      port = after.substr(1);
      if (port.empty()) return bad("empty port");
    }
  } else {
    const size_t colon = rest.find(':');
    target.host = std::string(rest.substr(0, colon));
    if (colon != std::string_view::npos) {
      port = rest.substr(colon + 1);
      if (port.empty()) return bad("empty port");
    }
  }
  if (target.host.empty()) return bad("no host");
  if (!port.empty()) {
    unsigned value = 0;
    auto [end, ec] = std::from_chars(port.data(), port.data() + port.size(), value);
    if (ec != std::errc() || end != port.data() + port.size() || value == 0 || value > 65535) {
      return bad("the port must be 1 to 65535");
    }
    target.port = static_cast<uint16_t>(value);
  }
  return target;
}

std::optional<std::string> HttpResponse::header(std::string_view name) const {
  for (const auto& [key, value] : headers) {
    if (iequals(key, name)) return value;
  }
  return std::nullopt;
}

struct HttpConnection::Impl {
  asio::io_context ioc;
  std::optional<beast::tcp_stream> stream;
  beast::flat_buffer buffer;

  // Runs the queued asynchronous operations to completion; the stream's expiry bounds them.
  void run() {
    ioc.restart();
    ioc.run();
  }
};

HttpConnection::HttpConnection(HttpTarget target)
    : target_(std::move(target)), impl_(std::make_unique<Impl>()) {}

HttpConnection::~HttpConnection() { close(); }

bool HttpConnection::connected() const { return impl_->stream.has_value(); }

void HttpConnection::close() {
  if (!impl_->stream) return;
  beast::error_code ignored;
  impl_->stream->socket().shutdown(tcp::socket::shutdown_both, ignored);
  impl_->stream->socket().close(ignored);
  impl_->stream.reset();
  impl_->buffer.clear();
}

Result<HttpResponse> HttpConnection::request(std::string_view method, std::string_view path,
                                             std::string body, const HttpHeaders& headers,
                                             std::chrono::milliseconds timeout) {
  const http::verb verb = http::string_to_verb(beast::string_view(method.data(), method.size()));
  if (verb == http::verb::unknown) {
    return error(ErrorCode::kInvalidValue, "unknown HTTP method '", method, "'");
  }
  if (path.empty() || path.front() != '/') {
    return error(ErrorCode::kInvalidValue, "the path '", path, "' must start with /");
  }
  const auto deadline = std::chrono::steady_clock::now() + timeout;

  http::request<http::string_body> req{verb, beast::string_view(path.data(), path.size()), 11};
  req.set(http::field::host, target_.host_header());
  req.set(http::field::user_agent, "hiber");
  bool has_type = false;
  for (const auto& [name, value] : headers) {
    req.insert(name, value);
    has_type = has_type || iequals(name, "content-type");
  }
  for (const auto& [name, value] : default_headers_) {
    if (req.find(beast::string_view(name.data(), name.size())) == req.end())
      req.insert(name, value);
  }
  if (!body.empty() && !has_type) req.set(http::field::content_type, "application/json");
  req.body() = std::move(body);
  req.prepare_payload();

  // An idle kept-alive connection that is readable has been closed by the server (or holds
  // junk): either way it cannot carry this request.
  if (connected()) {
    pollfd p{impl_->stream->socket().native_handle(), POLLIN | POLLRDHUP, 0};
    if (::poll(&p, 1, 0) != 0) close();
  }

  for (int attempt = 0;; ++attempt) {
    const bool reused = connected();
    if (!reused) {
      beast::error_code ec;
      tcp::resolver resolver(impl_->ioc);
      auto endpoints = resolver.resolve(target_.host, std::to_string(target_.port), ec);
      if (ec) {
        return error(ErrorCode::kDeinitialized, "cannot resolve ", target_.host, ": ",
                     ec.message());
      }
      impl_->stream.emplace(impl_->ioc);
      impl_->stream->expires_at(deadline);
      impl_->stream->async_connect(
          endpoints, [&](const beast::error_code& e, const tcp::endpoint&) { ec = e; });
      impl_->run();
      if (ec) {
        close();
        return transport_error(ec, "cannot connect to", target_);
      }
      ++connections_opened_;
      beast::error_code ignored;
      impl_->stream->socket().set_option(tcp::no_delay(true), ignored);
    }

    http::response_parser<http::string_body> parser;
    parser.body_limit(std::numeric_limits<std::uint64_t>::max());
    parser.header_limit(64 << 10);
    if (verb == http::verb::head) parser.skip(true);
    beast::error_code ec;
    bool written = false;
    impl_->stream->expires_at(deadline);
    http::async_write(*impl_->stream, req, [&](const beast::error_code& e, size_t) {
      ec = e;
      if (e) return;
      written = true;
      http::async_read(*impl_->stream, impl_->buffer, parser,
                       [&](const beast::error_code& r, size_t) { ec = r; });
    });
    impl_->run();
    if (ec) {
      const bool got_some = parser.got_some();
      close();
      // The server may close an idle connection just as the request leaves; a request that
      // got no answer at all on a reused connection is sent once more on a fresh one: when the
      // write itself failed, or for a request without side effects (a POST the server may
      // have seen is not repeated).
      const bool idempotent = verb == http::verb::get || verb == http::verb::head;
      if (reused && attempt == 0 && !got_some && ec != beast::error::timeout &&
          (!written || idempotent)) {
        continue;
      }
      return transport_error(ec, str_cat(method, " ", path, " to").c_str(), target_);
    }
    impl_->stream->expires_never();

    auto& msg = parser.get();
    HttpResponse response;
    response.status = static_cast<int>(msg.result_int());
    for (const auto& field : msg) {
      response.headers.emplace_back(std::string(field.name_string()), std::string(field.value()));
    }
    if (auto it = msg.find(http::field::content_type); it != msg.end()) {
      response.content_type = std::string(it->value());
    }
    if (!msg.keep_alive()) close();
    response.body = std::move(msg.body());
    return response;
  }
}

Result<HttpResponse> http_request(const HttpTarget& target, std::string_view method,
                                  std::string_view path, std::string body, HttpHeaders headers,
                                  std::chrono::milliseconds timeout) {
  const bool has_connection = std::any_of(
      headers.begin(), headers.end(), [](const auto& h) { return iequals(h.first, "connection"); });
  if (!has_connection) headers.emplace_back("Connection", "close");
  HttpConnection connection(target);
  return connection.request(method, path, std::move(body), headers, timeout);
}

}  // namespace hiber::router
