// The control round trip hiber-router adds HTTP to (docs/router.md, docs/perf.md "router"):
// per invocation the router calls hiberd's requestBegin and requestDone over the control socket
// (requestArrived, requestStart and requestDone with a hiberd before protocol 1.13). This
// measures those calls back to back (begin: two; invoke: three), with wire::ControlClient,
// against a real hiberd --device=sim (started here, or a running one with --run_dir),
// from 1 and 2 concurrent clients (each its own connection, as the router keeps one per waiting
// request); and, as the floor, a ping. scripts/router-bench.sh compares wrk against the router
// with a no-op function to these figures.
//
//   control_roundtrip_bench [--mode=invoke,begin,ping] [--clients=1,2] [--iterations=20000]
//                           [--run_dir=PATH] [--same_function] [--function_prefix=P]
//
// hiberd starts a request only for a function with a connected instance, so each benchmark
// function has a session open (a wire::CallClient that makes no calls) while it is timed, as a
// worker's shim session would be.
//
// One RESULT line per figure (as the other benches print them): <mode>_c<clients>_p50 and _p99
// in us per round trip (three calls for invoke, two for begin, one for ping), _rate in round
// trips per second over all clients; for invoke also _arrive_p50, _start_p50 and _done_p50, each
// call's own.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <gflags/gflags.h>

#include "common/paths.h"
#include "tests/integration/hiberd_harness.h"
#include "wire/call_client.h"
#include "wire/control_client.h"

DEFINE_string(mode, "invoke,begin,ping",
              "What to time, comma-separated: invoke (requestArrived + requestStart + "
              "requestDone), begin (requestBegin + requestDone) and ping");
DEFINE_string(clients, "1,2", "Concurrent clients, comma-separated counts");
DEFINE_int32(iterations, 20000, "Timed round trips per client");
DEFINE_int32(warmup, 1000, "Untimed round trips per client first");
DEFINE_string(run_dir, "",
              "A running hiberd's run directory (default: start hiberd --device=sim here)");
DEFINE_bool(same_function, false,
            "invoke: every client invokes one function (default: one function per client, so "
            "their requests do not queue behind each other)");
DEFINE_string(label, "sim", "A label for the RESULT lines");
DEFINE_string(function_prefix, "roundtrip-bench-",
              "The benchmark functions' names: this and a number (runs against one hiberd "
              "need different prefixes if one's functions are still registered)");

namespace hiber::bench {
namespace {

using Clock = std::chrono::steady_clock;

std::vector<std::string> split(const std::string& list) {
  std::vector<std::string> out;
  std::stringstream in(list);
  std::string item;
  while (std::getline(in, item, ',')) {
    if (!item.empty()) out.push_back(item);
  }
  return out;
}

double percentile(std::vector<double>& sorted, double p) {
  if (sorted.empty()) return 0;
  const size_t rank = static_cast<size_t>(std::ceil(p * static_cast<double>(sorted.size())));
  return sorted[std::min(sorted.size() - 1, rank == 0 ? 0 : rank - 1)];
}

[[noreturn]] void die(const std::string& what, const Status& status) {
  std::fprintf(stderr, "control_roundtrip_bench: %s: %s\n", what.c_str(),
               status.to_string().c_str());
  std::exit(1);
}

wire::ControlClient connect(const std::string& socket) {
  auto client = wire::ControlClient::connect(socket, std::chrono::seconds(30));
  if (!client.ok()) die("connect " + socket, client.status());
  return std::move(client).value();
}

// Each call of an invoke round trip, timed on its own (us).
struct CallTimes {
  std::vector<double> arrive, start, done;
};

double us_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
}

// One round trip; exits on any error (a benchmark of failing calls means nothing). With `times`,
// records each call's time.
void round_trip(wire::ControlClient& client, const std::string& mode, const std::string& function,
                CallTimes* times = nullptr) {
  if (mode == "ping") {
    if (Status s = client.ping(); !s.ok()) die("ping", s);
    return;
  }
  if (mode == "begin") {
    Result<wire::Started> started = client.request_begin(function);
    if (!started.ok()) die("requestBegin", started.status());
    if (Status s = client.request_done(started->request_id); !s.ok()) die("requestDone", s);
    return;
  }
  auto t0 = Clock::now();
  Result<uint64_t> id = client.request_arrived(function);
  if (!id.ok()) die("requestArrived", id.status());
  if (times != nullptr) times->arrive.push_back(us_since(t0));
  t0 = Clock::now();
  Result<wire::Started> started = client.request_start(*id);
  if (!started.ok()) die("requestStart", started.status());
  if (times != nullptr) times->start.push_back(us_since(t0));
  t0 = Clock::now();
  if (Status s = client.request_done(*id); !s.ok()) die("requestDone", s);
  if (times != nullptr) times->done.push_back(us_since(t0));
}

void result(const std::string& name, double value, const char* unit) {
  std::printf("RESULT label=%s name=%s value=%.3f unit=%s\n", FLAGS_label.c_str(), name.c_str(),
              value, unit);
}

void measure(const std::string& socket, const std::string& mode, int clients,
             const std::vector<std::string>& functions) {
  const bool invoke = mode == "invoke";
  std::vector<std::vector<double>> us(clients);
  std::vector<CallTimes> calls(clients);
  std::atomic<int> ready{0};
  std::atomic<bool> go{false};
  Clock::time_point start, end;
  std::vector<Clock::time_point> finished(clients);
  std::vector<std::thread> threads;
  for (int c = 0; c < clients; ++c) {
    threads.emplace_back([&, c] {
      wire::ControlClient client = connect(socket);
      const std::string& function = functions[FLAGS_same_function ? 0 : c];
      for (int i = 0; i < FLAGS_warmup; ++i) round_trip(client, mode, function);
      us[c].reserve(FLAGS_iterations);
      for (auto* v : {&calls[c].arrive, &calls[c].start, &calls[c].done}) {
        v->reserve(FLAGS_iterations);
      }
      ++ready;
      while (!go.load()) std::this_thread::yield();
      for (int i = 0; i < FLAGS_iterations; ++i) {
        const auto t0 = Clock::now();
        round_trip(client, mode, function, &calls[c]);
        us[c].push_back(us_since(t0));
      }
      finished[c] = Clock::now();
    });
  }
  while (ready.load() < clients) std::this_thread::yield();
  start = Clock::now();
  go = true;
  for (auto& t : threads) t.join();
  end = *std::max_element(finished.begin(), finished.end());
  std::vector<double> all;
  for (auto& v : us) all.insert(all.end(), v.begin(), v.end());
  std::sort(all.begin(), all.end());
  const double seconds = std::chrono::duration<double>(end - start).count();
  const std::string name = mode + "_c" + std::to_string(clients);
  result(name + "_p50", percentile(all, 0.50), "us");
  result(name + "_p99", percentile(all, 0.99), "us");
  result(name + "_rate", static_cast<double>(all.size()) / seconds, "per_s");
  if (invoke) {
    // Which of the three calls the time goes to (their p50s need not add up to the total's).
    for (auto [call, member] : {std::pair{"arrive", &CallTimes::arrive},
                                {"start", &CallTimes::start},
                                {"done", &CallTimes::done}}) {
      std::vector<double> each;
      for (const CallTimes& t : calls)
        each.insert(each.end(), (t.*member).begin(), (t.*member).end());
      std::sort(each.begin(), each.end());
      result(name + "_" + call + "_p50", percentile(each, 0.50), "us");
    }
  }
  std::fprintf(stderr, "%-7s clients=%d  p50 %8.1f us  p99 %8.1f us  %9.0f round trips/s%s\n",
               mode.c_str(), clients, percentile(all, 0.50), percentile(all, 0.99),
               static_cast<double>(all.size()) / seconds,
               invoke ? " (3 control calls each)" : mode == "begin" ? " (2 control calls each)" : "");
}

int run() {
  std::unique_ptr<testing::Hiberd> hiberd;
  std::string run_dir = FLAGS_run_dir;
  if (run_dir.empty()) {
    hiberd = std::make_unique<testing::Hiberd>();
    run_dir = hiberd->run_dir();
  }
  const std::string socket = control_socket_path(run_dir);
  std::string token;
  std::ifstream(auth_token_path(run_dir)) >> token;
  const std::vector<std::string> modes = split(FLAGS_mode);
  std::vector<int> client_counts;
  for (const std::string& c : split(FLAGS_clients)) client_counts.push_back(std::stoi(c));
  const int most = *std::max_element(client_counts.begin(), client_counts.end());

  wire::ControlClient admin = connect(socket);
  std::vector<std::string> functions;
  for (int c = 0; c < most; ++c) {
    wire::FunctionRegistration r;
    r.function_id = FLAGS_function_prefix + std::to_string(c);
    r.slo_ms = 10000;
    if (Status s = admin.register_function(r); !s.ok()) die("register " + r.function_id, s);
    functions.push_back(r.function_id);
  }
  // The functions' instances: sessions that stay open while they are timed.
  std::vector<std::unique_ptr<wire::CallClient>> instances;
  for (const std::string& f : functions) {
    wire::ClientOptions options;
    options.socket_path = function_socket_path(run_dir);
    options.function_id = f;
    options.auth_token = token;
    auto session = wire::CallClient::connect(options);
    if (!session.ok()) die("open a session for " + f, session.status());
    instances.push_back(std::move(session).value());
  }
  for (const std::string& mode : modes) {
    if (mode != "invoke" && mode != "begin" && mode != "ping") {
      std::fprintf(stderr, "unknown --mode '%s' (invoke, begin, ping)\n", mode.c_str());
      return 2;
    }
    for (int clients : client_counts) measure(socket, mode, clients, functions);
  }
  instances.clear();
  for (const std::string& f : functions) (void)admin.unregister_function(f);
  return 0;
}

}  // namespace
}  // namespace hiber::bench

int main(int argc, char** argv) {
  gflags::SetUsageMessage("The control round trip hiber-router makes per invocation, timed");
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  return hiber::bench::run();
}
