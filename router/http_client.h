// A small synchronous HTTP/1.1 client (Boost.Beast) for talking to hiber-router: hiberctl, the
// benchmarks and the tests use it. One request at a time per connection; no TLS, no redirects,
// no chunked request bodies (answers may be chunked: Beast reassembles them).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/status.h"

namespace hiber::router {

using namespace std::chrono_literals;

// Where an HTTP server listens: what `http://host:port` names.
struct HttpTarget {
  std::string host;
  uint16_t port = 80;

  // "http://host:port" (IPv6 hosts in brackets).
  std::string url() const;
  // "host:port", the Host header's value.
  std::string host_header() const;

  friend bool operator==(const HttpTarget&, const HttpTarget&) = default;
};

// Parses "http://host[:port][/]" (port 80 when absent; "[::1]" for an IPv6 host). A path other
// than "/", a query, user info or another scheme is kInvalidValue: a target is a server, not a
// resource.
Result<HttpTarget> parse_http_url(std::string_view url);

using HttpHeaders = std::vector<std::pair<std::string, std::string>>;

struct HttpResponse {
  int status = 0;
  std::string content_type;  // empty when the answer has none
  HttpHeaders headers;       // every header as received, in order
  std::string body;

  // The first header named `name` (case-insensitive), or none.
  std::optional<std::string> header(std::string_view name) const;
  bool ok() const { return status >= 200 && status < 300; }
};

// One keep-alive connection to `target`, opened on the first request and reused while the
// server keeps it open. A connection the server closed while idle is reopened transparently.
// Errors: kDeinitialized when the server cannot be reached or hangs up before answering,
// kTimeout when the whole exchange takes longer than its timeout (the connection is then closed),
// kInvalidValue for a malformed answer or request. Not thread-safe.
class HttpConnection {
 public:
  explicit HttpConnection(HttpTarget target);
  ~HttpConnection();
  HttpConnection(const HttpConnection&) = delete;
  HttpConnection& operator=(const HttpConnection&) = delete;

  // Sends one request and reads its answer. `path` starts with '/'. A Content-Type header in
  // `headers` is sent as given; a non-empty body without one is sent as application/json.
  // Any status (404, 500...) is a successful exchange: check response.status.
  Result<HttpResponse> request(std::string_view method, std::string_view path,
                               std::string body = {}, const HttpHeaders& headers = {},
                               std::chrono::milliseconds timeout = 30s);

  const HttpTarget& target() const { return target_; }
  // Headers sent with every request that does not give its own of that name (a credential).
  void set_default_headers(HttpHeaders headers) { default_headers_ = std::move(headers); }
  // TCP connections opened so far: 1 after any number of requests on a kept-alive connection.
  uint64_t connections_opened() const { return connections_opened_; }
  bool connected() const;
  void close();

 private:
  struct Impl;
  HttpTarget target_;
  HttpHeaders default_headers_;
  std::unique_ptr<Impl> impl_;
  uint64_t connections_opened_ = 0;
};

// One request on a fresh connection, closed afterwards.
Result<HttpResponse> http_request(const HttpTarget& target, std::string_view method,
                                  std::string_view path, std::string body = {},
                                  HttpHeaders headers = {},
                                  std::chrono::milliseconds timeout = 30s);

}  // namespace hiber::router
