// hiber-load's HTTP side (tools/load/runner.h) against a small HTTP server in the test that
// answers as docs/router.md says the router does: each request is sent, with its body, to its
// function's infer path, and each answer's status and X-Hiber-* headers land in its record.
#include "tools/load/runner.h"

#include <sys/socket.h>

#include <gtest/gtest.h>

#include <map>
#include <mutex>
#include <set>
#include <thread>

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

namespace hiber::load {
namespace {

namespace beast = boost::beast;
namespace http = beast::http;
namespace net = boost::asio;
using tcp = net::ip::tcp;

// Answers infer requests (fn-0 resident, fn-1 from a peer over NVLink, "down" 503, "closer"
// 200 and closes the connection) and the metadata queries fetch_slo_ms makes.
class FakeRouter {
 public:
  FakeRouter() : acceptor_(ioc_, tcp::endpoint(net::ip::make_address("127.0.0.1"), 0)) {
    accept_thread_ = std::thread([this] {
      while (true) {
        tcp::socket socket(ioc_);
        beast::error_code ec;
        acceptor_.accept(socket, ec);
        if (ec) return;
        std::lock_guard lock(mu_);
        connections_.emplace_back([this, s = std::move(socket)]() mutable { serve(std::move(s)); });
      }
    });
  }
  ~FakeRouter() {
    // close() does not wake a thread blocked in accept(); shutdown() does (EINVAL).
    ::shutdown(acceptor_.native_handle(), SHUT_RDWR);
    accept_thread_.join();
    beast::error_code ec;
    acceptor_.close(ec);
    std::lock_guard lock(mu_);
    for (auto& t : connections_) t.join();
  }

  Endpoint endpoint() const { return Endpoint{"127.0.0.1", acceptor_.local_endpoint().port(), ""}; }
  std::multiset<std::string> received() {
    std::lock_guard lock(mu_);
    return received_;
  }

 private:
  void serve(tcp::socket socket) {
    beast::flat_buffer buffer;
    while (true) {
      http::request<http::string_body> request;
      beast::error_code ec;
      http::read(socket, buffer, request, ec);
      if (ec) return;
      const std::string target(request.target());
      http::response<http::string_body> answer(http::status::ok, 11);
      bool close = false;
      if (request.method() == http::verb::post) {
        {
          std::lock_guard lock(mu_);
          received_.insert(target + " " + request.body());
        }
        answer.body() = request.body();
        if (target == "/v2/models/fn-0/infer") {
          answer.set("X-Hiber-Source", "resident");
        } else if (target == "/v2/models/fn-1/infer") {
          answer.set("X-Hiber-Source", "peer");
          answer.set("X-Hiber-Link", "nvlink");
          answer.set("X-Hiber-Node", "n0");
          answer.set("X-Hiber-Gpu", "3");
        } else if (target == "/v2/models/down/infer") {
          answer.result(http::status::service_unavailable);
        } else if (target == "/v2/models/closer/infer") {
          answer.set("X-Hiber-Source", "host");
          close = true;
        } else {
          answer.result(http::status::not_found);
        }
      } else if (target == "/v2/models/fn-0") {
        answer.body() = R"({"name": "fn-0", "parameters": {"slo_ms": 100}})";
      } else if (target == "/v2/models/fn-1") {
        answer.body() = R"({"name": "fn-1"})";
      } else if (target == "/v2/status") {
        answer.body() =
            R"({"functions": [{"name": "fn-0", "slo_ms": 1}, {"name": "fn-1", "slo_ms": 250}]})";
      } else {
        answer.result(http::status::not_found);
      }
      answer.keep_alive(!close && request.keep_alive());
      answer.prepare_payload();
      http::write(socket, answer, ec);
      if (ec || !answer.keep_alive()) return;
    }
  }

  net::io_context ioc_;
  tcp::acceptor acceptor_;
  std::thread accept_thread_;
  std::mutex mu_;
  std::vector<std::thread> connections_;
  std::multiset<std::string> received_;
};

TEST(LoadRunnerTest, SendsEveryRequestAndRecordsAnswers) {
  FakeRouter router;
  const std::vector<std::string> functions = {"fn-0", "fn-1", "down", "closer"};
  // 40 requests, 10 per function, 0.2 ms apart: more than the 2 connections carry at once,
  // so some wait for a connection, and "closer" makes the client reconnect.
  std::vector<ScheduledRequest> schedule;
  std::vector<uint64_t> per_function(functions.size(), 0);
  for (uint64_t i = 0; i < 40; ++i) {
    ScheduledRequest r;
    r.at_ns = static_cast<int64_t>(i) * 200'000;
    r.function = static_cast<uint32_t>(i % functions.size());
    r.sequence = i;
    r.per_function = per_function[r.function]++;
    schedule.push_back(r);
  }
  RunOptions options;
  options.connections = 2;
  uint64_t last_done = 0;
  auto result = run_load(
      router.endpoint(), functions, schedule,
      [&](const ScheduledRequest& r) {
        return expand_body("{function}:{k}", functions[r.function], r.function, r);
      },
      options, [&](const RunProgress& p) { last_done = p.done; });
  ASSERT_TRUE(result.ok()) << result.status().to_string();
  EXPECT_EQ(last_done, 40u);
  ASSERT_EQ(result->records.size(), 40u);

  std::multiset<std::string> expected;
  for (const auto& r : schedule) {
    const std::string& fn = functions[r.function];
    expected.insert("/v2/models/" + fn + "/infer " + fn + ":" + std::to_string(r.per_function));
  }
  EXPECT_EQ(router.received(), expected);

  for (size_t i = 0; i < schedule.size(); ++i) {
    const RequestRecord& rec = result->records[i];
    const std::string& fn = functions[schedule[i].function];
    EXPECT_EQ(rec.function, schedule[i].function);
    EXPECT_GT(rec.latency_ms, 0);
    EXPECT_EQ(rec.status, fn == "down" ? 503 : 200) << fn << ": " << rec.error;
    if (fn == "fn-0") {
      EXPECT_EQ(rec.source, "resident");
    }
    if (fn == "fn-1") {
      EXPECT_EQ(rec.source, "peer");
      EXPECT_EQ(rec.link, "nvlink");
      EXPECT_EQ(rec.node, "n0");
      EXPECT_EQ(rec.gpu, "3");
    }
    if (fn == "closer") {
      EXPECT_EQ(rec.source, "host");
    }
  }

  Summary s = summarize(functions, {100.0, 100.0, 100.0, 100.0}, result->records, result->wall_s);
  EXPECT_EQ(s.total.requests, 40u);
  EXPECT_EQ(s.total.ok, 30u);
  EXPECT_EQ(s.functions[2].errors.at(503), 10u);
  EXPECT_EQ(s.functions[1].peer_nvlink, 10u);
}

TEST(LoadRunnerTest, FetchesSloFromModelMetadataThenStatus) {
  FakeRouter router;
  auto a = fetch_slo_ms(router.endpoint(), "fn-0");
  ASSERT_TRUE(a.ok()) << a.status().to_string();
  EXPECT_EQ(*a, std::optional<double>(100));  // parameters win over /v2/status
  auto b = fetch_slo_ms(router.endpoint(), "fn-1");
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(*b, std::optional<double>(250));
  auto c = fetch_slo_ms(router.endpoint(), "unknown");
  ASSERT_TRUE(c.ok());
  EXPECT_FALSE(c->has_value());
}

TEST(LoadRunnerTest, AnUnreachableRouterIsAnError) {
  Endpoint nowhere;
  {
    // A port that was just free: bind one, note it, close it.
    net::io_context ioc;
    tcp::acceptor a(ioc, tcp::endpoint(net::ip::make_address("127.0.0.1"), 0));
    nowhere = Endpoint{"127.0.0.1", a.local_endpoint().port(), ""};
  }
  std::vector<ScheduledRequest> schedule(1);
  auto result = run_load(
      nowhere, {"fn"}, schedule, [](const ScheduledRequest&) { return ""; }, RunOptions{});
  EXPECT_FALSE(result.ok());
  EXPECT_FALSE(fetch_slo_ms(nowhere, "fn").ok());
}

}  // namespace
}  // namespace hiber::load
