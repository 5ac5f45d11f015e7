#include "tools/load/runner.h"

#include <chrono>
#include <deque>
#include <memory>

#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <nlohmann/json.hpp>

namespace hiber::load {
namespace {

namespace beast = boost::beast;
namespace http = beast::http;
namespace net = boost::asio;
using tcp = net::ip::tcp;
using Clock = std::chrono::steady_clock;

double ms_between(Clock::time_point from, Clock::time_point to) {
  return std::chrono::duration<double, std::milli>(to - from).count();
}

std::string host_header(const Endpoint& e) { return str_cat(e.host, ":", e.port); }

Result<tcp::resolver::results_type> resolve(net::io_context& ioc, const Endpoint& e) {
  tcp::resolver resolver(ioc);
  beast::error_code ec;
  auto results = resolver.resolve(e.host, std::to_string(e.port), ec);
  if (ec) return error(ErrorCode::kInvalidValue, "cannot resolve ", e.host, ": ", ec.message());
  return results;
}

class LoadRun {
 public:
  LoadRun(const Endpoint& router, const std::vector<std::string>& functions,
          const std::vector<ScheduledRequest>& schedule,
          const std::function<std::string(const ScheduledRequest&)>& body,
          const RunOptions& options, const std::function<void(const RunProgress&)>& progress)
      : router_(router),
        functions_(functions),
        schedule_(schedule),
        body_(body),
        options_(options),
        progress_(progress),
        timer_(ioc_) {}

  Result<RunResult> run() {
    if (options_.connections < 1) return error(ErrorCode::kInvalidValue, "need >= 1 connection");
    HIBER_ASSIGN_OR_RETURN(endpoints_, resolve(ioc_, router_));
    // Connected before the clock starts, so the first requests do not pay for the handshakes.
    for (int i = 0; i < options_.connections; ++i) {
      auto c = std::make_unique<Connection>(ioc_);
      beast::error_code ec;
      c->stream.socket().open(endpoints_.begin()->endpoint().protocol(), ec);
      if (!ec) c->stream.socket().connect(endpoints_.begin()->endpoint(), ec);
      if (ec)
        return error(ErrorCode::kDeinitialized, "cannot connect to the router at ",
                     host_header(router_), ": ", ec.message());
      c->stream.socket().set_option(tcp::no_delay(true));
      c->open = true;
      idle_.push_back(c.get());
      connections_.push_back(std::move(c));
    }
    records_.resize(schedule_.size());
    for (size_t i = 0; i < schedule_.size(); ++i) records_[i].function = schedule_[i].function;
    progress_state_.total = schedule_.size();
    start_ = Clock::now();
    arm_timer();
    ioc_.run();
    RunResult out;
    out.wall_s = std::chrono::duration<double>(Clock::now() - start_).count();
    out.records = std::move(records_);
    return out;
  }

 private:
  struct Connection {
    explicit Connection(net::io_context& ioc) : stream(ioc) {}
    beast::tcp_stream stream;
    bool open = false;
    bool reused = false;   // it has carried a request before (the router may have closed it)
    bool retried = false;  // the current request was resent once on a fresh connection
    beast::flat_buffer buffer;
    http::request<http::string_body> request;
    std::optional<http::response_parser<http::string_body>> parser;
    size_t current = 0;
  };

  Clock::time_point scheduled(size_t i) const {
    return start_ + std::chrono::nanoseconds(schedule_[i].at_ns);
  }

  void arm_timer() {
    if (next_ >= schedule_.size()) return;
    timer_.expires_at(scheduled(next_));
    timer_.async_wait([this](beast::error_code ec) {
      if (ec) return;
      const auto now = Clock::now();
      while (next_ < schedule_.size() && scheduled(next_) <= now) dispatch(next_++);
      arm_timer();
    });
  }

  void dispatch(size_t i) {
    if (idle_.empty()) {
      waiting_.push_back(i);
      return;
    }
    Connection* c = idle_.back();
    idle_.pop_back();
    send(*c, i);
  }

  void send(Connection& c, size_t i) {
    const ScheduledRequest& s = schedule_[i];
    c.current = i;
    c.retried = false;
    records_[i].send_lag_ms = ms_between(scheduled(i), Clock::now());
    c.request = {};
    c.request.method(http::verb::post);
    c.request.target(str_cat(router_.prefix, "/v2/models/", functions_[s.function], "/infer"));
    c.request.version(11);
    c.request.set(http::field::host, host_header(router_));
    c.request.set(http::field::content_type, options_.content_type);
    c.request.keep_alive(true);
    c.request.body() = body_(s);
    c.request.prepare_payload();
    ++progress_state_.sent;
    start_exchange(c);
  }

  void start_exchange(Connection& c) {
    c.stream.expires_after(
        std::chrono::microseconds(static_cast<int64_t>(options_.timeout_ms * 1000)));
    if (c.open) {
      write(c);
      return;
    }
    c.reused = false;
    c.stream.async_connect(endpoints_, [this, &c](beast::error_code ec, const tcp::endpoint&) {
      if (ec) return finish(c, ec, "connect");
      c.stream.socket().set_option(tcp::no_delay(true), ec);
      c.open = true;
      write(c);
    });
  }

  void write(Connection& c) {
    http::async_write(c.stream, c.request, [this, &c](beast::error_code ec, size_t) {
      if (ec) return finish(c, ec, "send");
      c.parser.emplace();
      c.parser->body_limit(options_.max_answer_bytes);
      http::async_read(c.stream, c.buffer, *c.parser,
                       [this, &c](beast::error_code ec, size_t) { finish(c, ec, "read"); });
    });
  }

  void close(Connection& c) {
    beast::error_code ignored;
    c.stream.socket().shutdown(tcp::socket::shutdown_both, ignored);
    c.stream.close();
    c.buffer.clear();
    c.open = false;
  }

  void finish(Connection& c, beast::error_code ec, const char* what) {
    RequestRecord& r = records_[c.current];
    if (ec) {
      close(c);
      // A kept-alive connection the router closed while idle fails the next request before
      // any answer: resend once on a new connection (the request never reached the router).
      if (c.reused && !c.retried && ec != beast::error::timeout) {
        c.retried = true;
        start_exchange(c);
        return;
      }
      r.status = 0;
      r.error = str_cat(what, ": ", ec.message());
    } else {
      const auto& answer = c.parser->get();
      r.status = static_cast<int>(answer.result_int());
      auto header = [&](const char* name) { return std::string(answer[name]); };
      r.source = header("X-Hiber-Source");
      r.link = header("X-Hiber-Link");
      r.node = header("X-Hiber-Node");
      r.gpu = header("X-Hiber-Gpu");
      r.instance = header("X-Hiber-Instance");
      if (!answer.keep_alive()) {
        close(c);
      } else {
        c.reused = true;
      }
    }
    r.latency_ms = ms_between(scheduled(c.current), Clock::now());
    ++progress_state_.done;
    if (r.status < 200 || r.status >= 300) ++progress_state_.failed;
    if (progress_) {
      progress_state_.elapsed_s = std::chrono::duration<double>(Clock::now() - start_).count();
      progress_(progress_state_);
    }
    if (!waiting_.empty()) {
      const size_t i = waiting_.front();
      waiting_.pop_front();
      send(c, i);
    } else {
      idle_.push_back(&c);
    }
  }

  const Endpoint& router_;
  const std::vector<std::string>& functions_;
  const std::vector<ScheduledRequest>& schedule_;
  const std::function<std::string(const ScheduledRequest&)>& body_;
  const RunOptions& options_;
  const std::function<void(const RunProgress&)>& progress_;

  net::io_context ioc_;
  net::steady_timer timer_;
  tcp::resolver::results_type endpoints_;
  std::vector<std::unique_ptr<Connection>> connections_;
  std::vector<Connection*> idle_;
  std::deque<size_t> waiting_;  // due requests waiting for a connection, oldest first
  size_t next_ = 0;             // the next request to dispatch
  std::vector<RequestRecord> records_;
  RunProgress progress_state_;
  Clock::time_point start_;
};

}  // namespace

Result<RunResult> run_load(const Endpoint& router, const std::vector<std::string>& functions,
                           const std::vector<ScheduledRequest>& schedule,
                           const std::function<std::string(const ScheduledRequest&)>& body,
                           const RunOptions& options,
                           const std::function<void(const RunProgress&)>& progress) {
  for (const ScheduledRequest& s : schedule) {
    if (s.function >= functions.size())
      return error(ErrorCode::kInvalidValue, "request ", s.sequence, " names function ", s.function,
                   " of ", functions.size());
  }
  LoadRun run(router, functions, schedule, body, options, progress);
  return run.run();
}

Result<HttpAnswer> http_get(const Endpoint& router, const std::string& target, double timeout_ms) {
  net::io_context ioc;
  HIBER_ASSIGN_OR_RETURN(tcp::resolver::results_type endpoints, resolve(ioc, router));
  beast::tcp_stream stream(ioc);
  stream.expires_after(std::chrono::microseconds(static_cast<int64_t>(timeout_ms * 1000)));
  beast::error_code ec;
  stream.connect(endpoints, ec);
  if (ec)
    return error(ErrorCode::kDeinitialized, "cannot connect to the router at ", host_header(router),
                 ": ", ec.message());
  http::request<http::empty_body> request(http::verb::get, router.prefix + target, 11);
  request.set(http::field::host, host_header(router));
  request.keep_alive(false);
  http::write(stream, request, ec);
  beast::flat_buffer buffer;
  http::response<http::string_body> answer;
  if (!ec) http::read(stream, buffer, answer, ec);
  if (ec) return error(ErrorCode::kDeinitialized, "GET ", target, ": ", ec.message());
  stream.socket().shutdown(tcp::socket::shutdown_both, ec);
  return HttpAnswer{static_cast<int>(answer.result_int()), std::move(answer.body())};
}

Result<std::optional<double>> fetch_slo_ms(const Endpoint& router, const std::string& function) {
  HIBER_ASSIGN_OR_RETURN(HttpAnswer model, http_get(router, "/v2/models/" + function));
  if (model.status == 200) {
    const nlohmann::json j = nlohmann::json::parse(model.body, nullptr, /*allow_exceptions=*/false);
    if (j.is_object() && j.contains("parameters") && j["parameters"].is_object()) {
      const nlohmann::json& p = j["parameters"];
      if (p.contains("slo_ms") && p["slo_ms"].is_number())
        return std::optional<double>(p["slo_ms"].get<double>());
    }
  }
  HIBER_ASSIGN_OR_RETURN(HttpAnswer status, http_get(router, "/v2/status"));
  if (status.status != 200) return std::optional<double>();
  const nlohmann::json j = nlohmann::json::parse(status.body, nullptr, false);
  if (!j.is_object() || !j.contains("functions") || !j["functions"].is_array())
    return std::optional<double>();
  for (const nlohmann::json& f : j["functions"]) {
    if (f.is_object() && f.value("name", "") == function && f.contains("slo_ms") &&
        f["slo_ms"].is_number())
      return std::optional<double>(f["slo_ms"].get<double>());
  }
  return std::optional<double>();
}

}  // namespace hiber::load
