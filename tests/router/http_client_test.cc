// router/http_client.h against real HTTP servers it shares no code with: Python's
// `http.server` (HTTP/1.0, a served folder) and tests/router/echo_server.py (HTTP/1.1,
// keep-alive, echoes each request as JSON); plus a refused port and a server that never answers.
#include "router/http_client.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tests/router/python_server.h"

namespace hiber::router {
namespace {

using nlohmann::json;
using testing::PythonServer;

std::string echo_script() { return std::string(HIBER_SOURCE_DIR) + "/tests/router/echo_server.py"; }

HttpTarget local(uint16_t port) { return HttpTarget{"127.0.0.1", port}; }

// A listening TCP socket on 127.0.0.1 that never accepts: connects succeed (the kernel's
// backlog takes them), requests are never answered.
class SilentListener {
 public:
  SilentListener() {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    ::bind(fd_, reinterpret_cast<sockaddr*>(&a), len);
    ::listen(fd_, 16);
    ::getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len);
    port_ = ntohs(a.sin_port);
  }
  ~SilentListener() { ::close(fd_); }
  uint16_t port() const { return port_; }

 private:
  int fd_ = -1;
  uint16_t port_ = 0;
};

// A port nothing listens on: bound, then released.
uint16_t free_port() {
  SilentListener l;
  return l.port();
}

class EchoServerTest : public ::testing::Test {
 protected:
  EchoServerTest() : server_({echo_script()}, "^([0-9]+)") {}
  void SetUp() override { ASSERT_NE(server_.port(), 0) << "echo_server.py did not start"; }
  HttpTarget target() const { return local(server_.port()); }

  PythonServer server_;
};

TEST(ParseHttpUrl, HostAndPort) {
  auto t = parse_http_url("http://127.0.0.1:8080");
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->host, "127.0.0.1");
  EXPECT_EQ(t->port, 8080);
  EXPECT_EQ(t->url(), "http://127.0.0.1:8080");
  EXPECT_EQ(t->host_header(), "127.0.0.1:8080");
}

TEST(ParseHttpUrl, DefaultsAndSpellings) {
  auto t = parse_http_url("http://router.example/");
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(*t, (HttpTarget{"router.example", 80}));
  t = parse_http_url("HTTP://localhost:1/");
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(*t, (HttpTarget{"localhost", 1}));
  t = parse_http_url("http://[::1]:65535");
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(*t, (HttpTarget{"::1", 65535}));
  EXPECT_EQ(t->url(), "http://[::1]:65535");
  t = parse_http_url("http://[fe80::1]");
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(*t, (HttpTarget{"fe80::1", 80}));
}

TEST(ParseHttpUrl, Rejects) {
  for (const char* bad : {"", "127.0.0.1:8080", "https://h:1", "ftp://h", "http://", "http://:8080",
                          "http://h:", "http://h:0", "http://h:65536", "http://h:80x",
                          "http://h:-1", "http://h:8080/v2", "http://h:1?x=1", "http://u@h:1",
                          "http://[::1", "http://[::1]x", "http://[::1]:"}) {
    auto t = parse_http_url(bad);
    EXPECT_FALSE(t.ok()) << "'" << bad << "' was accepted as " << t->url();
    if (!t.ok()) {
      EXPECT_EQ(t.status().code(), ErrorCode::kInvalidValue) << bad;
    }
  }
}

TEST(HttpClient, GetsFilesFromPythonHttpServer) {
  const auto dir = std::filesystem::temp_directory_path() /
                   ("hiber-http-client-test-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const std::string content = "hello from a file\n" + std::string(100000, 'x');
  std::ofstream(dir / "hello.txt") << content;
  {
    PythonServer server(
        {"-m", "http.server", "0", "--bind", "127.0.0.1", "--directory", dir.string()},
        "port ([0-9]+)");
    ASSERT_NE(server.port(), 0) << "python3 -m http.server did not start";
    auto r = http_request(local(server.port()), "GET", "/hello.txt");
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->status, 200);
    EXPECT_EQ(r->content_type, "text/plain");
    EXPECT_EQ(r->body, content);
    EXPECT_EQ(r->header("content-length"), std::to_string(content.size()));

    // HTTP/1.0 closes after each answer; one HttpConnection still carries several requests.
    HttpConnection c(local(server.port()));
    for (int i = 0; i < 3; ++i) {
      auto again = c.request("GET", "/hello.txt");
      ASSERT_TRUE(again.ok()) << again.status();
      EXPECT_EQ(again->body, content);
    }
    EXPECT_EQ(c.connections_opened(), 3u);

    auto missing = http_request(local(server.port()), "GET", "/missing.txt");
    ASSERT_TRUE(missing.ok()) << missing.status();
    EXPECT_EQ(missing->status, 404);
    EXPECT_FALSE(missing->ok());
  }
  std::filesystem::remove_all(dir);
}

TEST_F(EchoServerTest, PostCarriesMethodPathHeadersAndBody) {
  const std::string raw("binary\0body", 11);
  auto r = http_request(target(), "POST", "/v2/models/fn/infer?x=1", raw,
                        {{"Content-Type", "application/octet-stream"}, {"X-Request-Id", "r-1"}});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(r->content_type, "application/json");
  EXPECT_EQ(r->header("x-echo"), "yes");
  EXPECT_EQ(r->header("X-ECHO"), "yes");
  EXPECT_EQ(r->header("x-absent"), std::nullopt);
  const json echo = json::parse(r->body);
  EXPECT_EQ(echo["method"], "POST");
  EXPECT_EQ(echo["path"], "/v2/models/fn/infer?x=1");
  EXPECT_EQ(echo["headers"]["content-type"], "application/octet-stream");
  EXPECT_EQ(echo["headers"]["x-request-id"], "r-1");
  EXPECT_EQ(echo["headers"]["content-length"], "11");
  EXPECT_EQ(echo["headers"]["host"], "127.0.0.1:" + std::to_string(server_.port()));
  EXPECT_EQ(echo["headers"]["connection"], "close");  // a one-shot request says so
  EXPECT_EQ(echo["body"], std::string("binary\0body", 11));
}

TEST_F(EchoServerTest, BodyWithoutContentTypeIsJson) {
  auto r = http_request(target(), "POST", "/x", R"({"inputs": []})");
  ASSERT_TRUE(r.ok()) << r.status();
  const json echo = json::parse(r->body);
  EXPECT_EQ(echo["headers"]["content-type"], "application/json");
  EXPECT_EQ(echo["body"], R"({"inputs": []})");
}

TEST_F(EchoServerTest, KeepAliveReusesOneConnection) {
  HttpConnection c(target());
  int first_port = -1;
  for (int i = 1; i <= 4; ++i) {
    auto r = c.request(i % 2 ? "GET" : "POST", "/n", i % 2 ? "" : "payload");
    ASSERT_TRUE(r.ok()) << r.status();
    const json echo = json::parse(r->body);
    // The server saw every request on the same TCP connection (same client port), in order.
    EXPECT_EQ(echo["request_on_connection"], i);
    if (first_port < 0) first_port = echo["client_port"];
    EXPECT_EQ(echo["client_port"], first_port);
    EXPECT_TRUE(echo["headers"].find("connection") == echo["headers"].end());
  }
  EXPECT_EQ(c.connections_opened(), 1u);
  EXPECT_TRUE(c.connected());
}

TEST_F(EchoServerTest, ConnectionCloseOpensANewConnection) {
  HttpConnection c(target());
  auto r = c.request("GET", "/close");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->status, 200);
  EXPECT_FALSE(c.connected());
  r = c.request("GET", "/after");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(json::parse(r->body)["request_on_connection"], 1);
  EXPECT_EQ(c.connections_opened(), 2u);
}

TEST_F(EchoServerTest, ConnectionDroppedWhileIdleIsReopened) {
  HttpConnection c(target());
  auto r = c.request("GET", "/drop");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(c.connected());  // the answer said nothing about closing
  for (int i = 0; i < 2; ++i) {
    r = c.request("GET", "/after");
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(json::parse(r->body)["request_on_connection"], i + 1);
  }
  EXPECT_EQ(c.connections_opened(), 2u);
}

TEST_F(EchoServerTest, ErrorStatusIsAnAnswer) {
  HttpConnection c(target());
  auto r = c.request("POST", "/status/404", "{}");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->status, 404);
  EXPECT_EQ(json::parse(r->body)["path"], "/status/404");
  r = c.request("GET", "/status/503");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->status, 503);
  EXPECT_EQ(c.connections_opened(), 1u);  // an error status does not end the connection
}

TEST_F(EchoServerTest, ChunkedAnswerIsReassembled) {
  HttpConnection c(target());
  auto r = c.request("GET", "/chunked");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(json::parse(r->body)["path"], "/chunked");
  r = c.request("GET", "/next");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(json::parse(r->body)["request_on_connection"], 2);
}

TEST_F(EchoServerTest, HeadHasNoBody) {
  auto r = http_request(target(), "HEAD", "/h");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->status, 200);
  EXPECT_TRUE(r->body.empty());
  EXPECT_NE(r->header("content-length"), std::nullopt);
}

TEST_F(EchoServerTest, ServerThatNeverAnswersTimesOut) {
  HttpConnection c(target());
  auto r = c.request("GET", "/hang", {}, {}, std::chrono::milliseconds(300));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), ErrorCode::kTimeout) << r.status();
  EXPECT_FALSE(c.connected());
  // The connection is usable again: a fresh TCP connection carries the next request.
  r = c.request("GET", "/fine");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(json::parse(r->body)["request_on_connection"], 1);
  EXPECT_EQ(c.connections_opened(), 2u);
}

TEST(HttpClient, ListenerThatNeverAcceptsTimesOut) {
  SilentListener l;
  auto r = http_request(local(l.port()), "POST", "/v2/models/fn/infer", "{}", {},
                        std::chrono::milliseconds(200));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), ErrorCode::kTimeout) << r.status();
}

TEST(HttpClient, RefusedConnection) {
  auto r = http_request(local(free_port()), "GET", "/v2/health/live");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), ErrorCode::kDeinitialized) << r.status();
  EXPECT_NE(r.status().message().find("refused"), std::string::npos) << r.status();
}

TEST(HttpClient, UnresolvableHost) {
  auto r = http_request(HttpTarget{"no-such-host.invalid", 80}, "GET", "/");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), ErrorCode::kDeinitialized) << r.status();
}

TEST(HttpClient, RejectsBadRequests) {
  HttpConnection c(HttpTarget{"127.0.0.1", 1});
  EXPECT_EQ(c.request("FETCH", "/").status().code(), ErrorCode::kInvalidValue);
  EXPECT_EQ(c.request("GET", "relative").status().code(), ErrorCode::kInvalidValue);
  EXPECT_EQ(c.connections_opened(), 0u);
}

}  // namespace
}  // namespace hiber::router
