// hiberd's /metrics end to end: a real hiberd on the simulated GPUs, a real function session and
// the router's control calls, then the Prometheus text read over a plain socket and checked
// against what the test did and against the status reply of the control socket.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>
#include <thread>

#include "common/unique_fd.h"
#include "tests/integration/hiberd_harness.h"
#include "wire/control_client.h"
#include "wire/limits.h"
#include "wire/message.h"
#include "wire/schema/control.capnp.h"

namespace hiber::testing {
namespace {

using namespace std::chrono_literals;
namespace proto = wire::proto;

// GET `path` from 127.0.0.1:`port` with HTTP/1.0; the whole answer, headers included.
Result<std::string> http_get(int port, const std::string& path) {
  UniqueFd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd) return os_error("socket");
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    return os_error("connect");
  }
  const std::string request = "GET " + path + " HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n";
  if (::send(fd.get(), request.data(), request.size(), MSG_NOSIGNAL) !=
      static_cast<ssize_t>(request.size())) {
    return os_error("send");
  }
  std::string answer;
  char buffer[4096];
  for (ssize_t n; (n = ::recv(fd.get(), buffer, sizeof buffer, 0)) != 0;) {
    if (n < 0) return os_error("recv");
    answer.append(buffer, static_cast<size_t>(n));
  }
  return answer;
}

// The samples of a Prometheus text answer: "name{labels}" (as written) -> value.
std::map<std::string, double> parse_samples(const std::string& text) {
  std::map<std::string, double> samples;
  std::istringstream in(text.substr(text.find("\r\n\r\n") + 4));
  for (std::string line; std::getline(in, line);) {
    if (line.empty() || line[0] == '#') continue;
    const size_t space = line.rfind(' ');
    samples[line.substr(0, space)] = std::strtod(line.c_str() + space + 1, nullptr);
  }
  return samples;
}

// Waits for hiberd to write the port file (it does once /metrics listens).
int read_port(const std::string& path) {
  for (int i = 0; i < 1500; ++i) {
    std::ifstream in(path);
    int port = 0;
    if (in >> port && port > 0) return port;
    std::this_thread::sleep_for(20ms);
  }
  return 0;
}

TEST(HiberdMetrics, HelpListsTheFlags) {
  auto result = run_program({hiberd_path(), "--help"});
  EXPECT_EQ(result.exit_code, 0) << result.output;
  EXPECT_NE(result.output.find("-metrics_listen"), std::string::npos) << result.output;
  EXPECT_NE(result.output.find("-metrics_port_file"), std::string::npos) << result.output;
}

// A node of thousands of functions (issue 18, item 4): a scrape merges every page of the status.
TEST(HiberdMetrics, MetricsCountThousandsOfFunctions) {
  char tmpl[] = "/tmp/hiber-metrics-XXXXXX";
  const std::string dir = ::mkdtemp(tmpl);
  const std::string port_file = dir + "/port";
  constexpr int kFunctions = 5000;
  // More than the default cap on registrations (--max_registered_functions, 4096).
  Hiberd hiberd({"--metrics_listen=127.0.0.1:0", "--metrics_port_file=" + port_file,
                 "--max_registered_functions=" + std::to_string(kFunctions)});
  const int port = read_port(port_file);
  ASSERT_GT(port, 0) << hiberd.log();
  auto control = hiberd.control();
  ASSERT_TRUE(control.ok()) << control.status();
  for (int i = 0; i < kFunctions; ++i) {
    std::string id = "function-" + std::to_string(i) + "-";
    id.resize(wire::kMaxFunctionIdBytes, 'x');
    ASSERT_TRUE(control->register_function({.function_id = id, .slo_ms = 100}).ok()) << i;
  }
  auto answer = http_get(port, "/metrics");
  ASSERT_TRUE(answer.ok()) << answer.status();
  ASSERT_EQ(answer->rfind("HTTP/1.", 0), 0u) << answer->substr(0, 200);
  ASSERT_NE(answer->substr(0, answer->find("\r\n")).find(" 200"), std::string::npos)
      << answer->substr(0, 200);
  EXPECT_EQ(parse_samples(*answer)["hiber_functions"], kFunctions) << hiberd.log();
  std::system(("rm -rf " + dir).c_str());
}

TEST(HiberdMetrics, ServesWhatTheNodeDid) {
  char tmpl[] = "/tmp/hiber-metrics-XXXXXX";
  const std::string dir = ::mkdtemp(tmpl);
  const std::string port_file = dir + "/port";
  Hiberd hiberd({"--metrics_listen=127.0.0.1:0", "--metrics_port_file=" + port_file,
                 "--swap_group_kib=1024"});
  const int port = read_port(port_file);
  ASSERT_GT(port, 0) << hiberd.log();
  EXPECT_NE(hiberd.log().find("serves /metrics on port " + std::to_string(port)), std::string::npos)
      << hiberd.log();

  // A registered function with a connected instance; it remotes some calls.
  auto control = wire::ControlClient::connect(hiberd.control_socket_path(), 60s);
  ASSERT_TRUE(control.ok()) << control.status();
  ASSERT_TRUE(control->register_function({.function_id = "metrics-fn", .slo_ms = 60000}).ok());
  auto client = hiberd.connect("metrics-fn");
  ASSERT_TRUE(client.ok()) << client.status();
  const wire::Grant grant = (*client)->session().grant;
  constexpr int kAllocations = 3;
  for (int i = 0; i < kAllocations; ++i) {
    auto allocated = (*client)->call([&](proto::Call::Builder call) {
      auto a = call.initMemAllocate();
      a.setVa(grant.va_base + (static_cast<uint64_t>(i) << 21));
      a.setBytes(2 << 20);
    });
    ASSERT_TRUE(allocated.ok()) << allocated.status();
  }

  // Requests, as the router makes them; each Started names the link its model came over. The
  // first finds its blocks where they are made (nothing to bring: resident, no swap); then its
  // GPU is drained, so the next one brings the model to another GPU: a real swap.
  constexpr int kRequests = 4;
  std::map<std::string, int> started_links;
  for (int i = 0; i < kRequests; ++i) {
    auto id = control->request_arrived("metrics-fn");
    ASSERT_TRUE(id.ok()) << id.status();
    auto started = control->request_start(*id);
    ASSERT_TRUE(started.ok()) << started.status();
    if (i == 0) {
      EXPECT_EQ(started->source, "resident") << "a first request has nothing to bring";
    }
    if (i == 1) {
      EXPECT_NE(started->source, "resident") << "its GPU is drained";
    }
    const std::string expected_link = started->source == "resident" ? ""
                                      : started->source == "host"   ? "host"
                                                                    : started->link;
    EXPECT_EQ(started->link, expected_link) << started->source;
    if (started->source == "peer") {
      EXPECT_TRUE(started->link == "nvlink" || started->link == "pcie") << started->link;
    }
    if (!started->link.empty()) ++started_links[started->link];
    ASSERT_TRUE(control->request_done(*id).ok());
    // Its GPU drained (the answer comes once the request's GPU is free), the model must move.
    if (i == 0) {
      ASSERT_TRUE(control->drain(started->gpu).ok());
    }
  }
  // A request is completed once its GPU is released, after requestDone's answer.
  std::map<std::string, double> m;
  for (int i = 0; i < 1500; ++i) {
    auto answer = http_get(port, "/metrics");
    ASSERT_TRUE(answer.ok()) << answer.status();
    ASSERT_EQ(answer->rfind("HTTP/1.", 0), 0u) << *answer;
    ASSERT_NE(answer->find(" 200 "), std::string::npos) << answer->substr(0, 200);
    m = parse_samples(*answer);
    if (m["hiber_requests_completed_total"] == kRequests) break;
    std::this_thread::sleep_for(20ms);
  }

  EXPECT_EQ(m["hiber_requests_arrived_total"], kRequests);
  EXPECT_EQ(m["hiber_requests_completed_total"], kRequests);
  EXPECT_EQ(m["hiber_requests_on_time_total"], kRequests);  // a minute's SLO
  EXPECT_EQ(m["hiber_queue_depth"], 0);
  EXPECT_EQ(m["hiber_sessions"], 1);
  EXPECT_EQ(m["hiber_sessions_opened_total"], 1);
  EXPECT_EQ(m["hiber_sessions_closed_total"], 0);
  // Each call() is a batch of one call.
  EXPECT_EQ(m["hiber_remoted_calls_total"], kAllocations);
  EXPECT_EQ(m["hiber_remoted_batches_total"], kAllocations);
  EXPECT_EQ(m["hiber_remoted_batch_size_bucket{le=\"1\"}"], kAllocations);
  EXPECT_EQ(m["hiber_remoted_batch_size_count"], m["hiber_remoted_batches_total"]);
  EXPECT_EQ(m["hiber_remoted_batch_size_bucket{le=\"+Inf\"}"], m["hiber_remoted_batches_total"]);
  EXPECT_EQ(m["hiber_remoted_batch_size_sum"], m["hiber_remoted_calls_total"]);
  EXPECT_EQ(m["hiber_models_resident"], 1);  // its blocks stay on the GPU it ran on
  EXPECT_EQ(m["hiber_models_sleeping"], 0);
  bool build_info = false;
  for (const auto& [name, value] : m) {
    if (name.rfind("hiber_build_info{version=\"0.1.0\",commit=\"", 0) == 0) {
      build_info = true;
      EXPECT_EQ(value, 1);
    }
  }
  EXPECT_TRUE(build_info);
  // Allocations need no GPU: the test's requests are the only ones that brought the model in.
  EXPECT_EQ(m["hiber_background_requests_total"], 0);
  for (const char* link : {"nvlink", "pcie", "host"}) {
    EXPECT_EQ(m["hiber_swaps_total{link=\"" + std::string(link) + "\"}"], started_links[link])
        << link;
  }

  // The same figures as the control socket's status reply.
  auto reply = control->status();
  ASSERT_TRUE(reply.ok()) << reply.status();
  Status read = wire::read_message<proto::ControlReply>(
      *reply, "status", [&](proto::ControlReply::Reader r) -> Status {
        auto s = r.getStatus();
        uint64_t swaps = 0;
        uint64_t swap_bytes = 0;
        for (auto d : s.getDevices()) {
          const std::string gpu = std::to_string(d.getOrdinal());
          swaps += d.getSwapsIn();
          swap_bytes += d.getSwapInBytes();
          EXPECT_EQ(m["hiber_pool_bytes{gpu=\"" + gpu + "\",state=\"used\"}"],
                    static_cast<double>(d.getPoolAllocatedBytes()))
              << gpu;
          EXPECT_EQ(m["hiber_pool_bytes{gpu=\"" + gpu + "\",state=\"used\"}"] +
                        m["hiber_pool_bytes{gpu=\"" + gpu + "\",state=\"free\"}"],
                    static_cast<double>(d.getPoolBytes()))
              << gpu;
          EXPECT_EQ(m.count("hiber_pool_fragmentation_ratio{gpu=\"" + gpu + "\"}"), 1u);
          uint64_t evictions = 0;
          for (const char* reason : {"placement", "memory", "drain"}) {
            const std::string key =
                "hiber_evictions_total{gpu=\"" + gpu + "\",reason=\"" + reason + "\"}";
            EXPECT_EQ(m.count(key), 1u) << key;
            evictions += static_cast<uint64_t>(m[key]);
          }
          EXPECT_EQ(evictions, d.getEvictions()) << gpu;
        }
        double metric_swaps = 0;
        double metric_bytes = 0;
        for (const char* link : {"nvlink", "pcie", "host"}) {
          metric_swaps += m["hiber_swaps_total{link=\"" + std::string(link) + "\"}"];
          metric_bytes += m["hiber_swap_bytes_total{link=\"" + std::string(link) + "\"}"];
        }
        EXPECT_EQ(metric_swaps, static_cast<double>(swaps));
        EXPECT_EQ(metric_bytes, static_cast<double>(swap_bytes));
        EXPECT_EQ(m["hiber_swap_duration_seconds_count"], static_cast<double>(swaps));
        EXPECT_GE(swaps, 1u);  // the second request brought the model to another GPU
        // Each swap brought the whole model: no 0-byte swap is counted.
        EXPECT_EQ(swap_bytes, swaps * kAllocations * (uint64_t{2} << 20));
        EXPECT_EQ(m["hiber_host_repository_bytes{state=\"capacity\"}"],
                  static_cast<double>(s.getScheduler().getHostPoolBytes()));
        return Status();
      });
  EXPECT_TRUE(read.ok()) << read;

  // Anything but /metrics is not found.
  auto other = http_get(port, "/other");
  ASSERT_TRUE(other.ok());
  EXPECT_NE(other->find(" 404 "), std::string::npos) << other->substr(0, 200);

  client->reset();
  EXPECT_EQ(hiberd.stop(), 0) << hiberd.log();
  std::system(("rm -rf " + dir).c_str());
}

// What the scheduler did, counted (issue 20): requests --shed answered "overloaded" and implicit
// leases --lease_slice_ms preempted, each caused a known number of times on one simulated GPU, in
// the status reply, in /metrics and in `hiberctl status`.
TEST(HiberdMetrics, CountsShedRequestsAndPreemptions) {
  char tmpl[] = "/tmp/hiber-metrics-XXXXXX";
  const std::string dir = ::mkdtemp(tmpl);
  const std::string port_file = dir + "/port";
  // Idle implicit leases are kept 30 s, so only the slice takes the GPU from one.
  Hiberd hiberd({"--node_config=" + one_gpu_node_config(16), "--metrics_listen=127.0.0.1:0",
                 "--metrics_port_file=" + port_file, "--shed=late", "--lease_slice_ms=20",
                 "--implicit_lease_idle_us=30000000"});
  const int port = read_port(port_file);
  ASSERT_GT(port, 0) << hiberd.log();
  auto control = wire::ControlClient::connect(hiberd.control_socket_path(), 60s);
  ASSERT_TRUE(control.ok()) << control.status();
  // A second's work against a millisecond's deadline: late from its arrival on.
  ASSERT_TRUE(
      control->register_function({.function_id = "late-fn", .slo_ms = 1, .exec_ms_hint = 1000})
          .ok());
  ASSERT_TRUE(control->register_function({.function_id = "waiting-fn", .slo_ms = 60000}).ok());
  auto late = hiberd.connect("late-fn");
  auto waiting = hiberd.connect("waiting-fn");
  auto hog = hiberd.connect("hog");  // not registered: its GPU use is all implicit leases
  ASSERT_TRUE(late.ok() && waiting.ok() && hog.ok());

  constexpr int kShed = 3;
  for (int i = 0; i < kShed; ++i) {
    auto id = control->request_arrived("late-fn");
    ASSERT_TRUE(id.ok()) << id.status();
    auto started = control->request_start(*id);
    ASSERT_FALSE(started.ok()) << "started on GPU " << started->gpu;
    EXPECT_EQ(started.status().code(), ErrorCode::kDeviceUnavailable) << started.status();
    EXPECT_EQ(started.status().message().rfind("overloaded: request " + std::to_string(*id), 0), 0u)
        << started.status();
    ASSERT_TRUE(control->request_done(*id, /*failed=*/true).ok());
  }

  // Each round the hog takes the GPU with a memset and keeps it idle; a request of another
  // function then waits until the slice ends the hog's lease.
  constexpr int kPreemptions = 2;
  const uint64_t buffer = (*hog)->session().grant.va_base;
  auto allocated = (*hog)->call([&](proto::Call::Builder call) {
    auto a = call.initMemAllocate();
    a.setVa(buffer);
    a.setBytes(2 << 20);
  });
  ASSERT_TRUE(allocated.ok()) << allocated.status();
  for (int round = 0; round < kPreemptions; ++round) {
    auto set = (*hog)->call([&](proto::Call::Builder call) {
      auto m = call.initMemset();
      m.setDst(buffer);
      m.setValue(static_cast<uint32_t>(round));
      m.setElementBytes(4);
      m.setCount(1024);
    });
    ASSERT_TRUE(set.ok()) << set.status();
    auto id = control->request_arrived("waiting-fn");
    ASSERT_TRUE(id.ok()) << id.status();
    auto started = control->request_start(*id);
    ASSERT_TRUE(started.ok()) << started.status();
    ASSERT_TRUE(control->request_done(*id).ok());
  }

  // The last request is completed once its GPU is released, after requestDone's answer.
  std::map<std::string, double> m;
  for (int i = 0; i < 1500; ++i) {
    auto answer = http_get(port, "/metrics");
    ASSERT_TRUE(answer.ok()) << answer.status();
    m = parse_samples(*answer);
    if (m["hiber_requests_completed_total"] == kPreemptions) break;
    std::this_thread::sleep_for(20ms);
  }
  EXPECT_EQ(m["hiber_requests_shed_total"], kShed);
  EXPECT_EQ(m["hiber_lease_preemptions_total"], kPreemptions);
  // Shed requests arrived but never completed.
  EXPECT_EQ(m["hiber_requests_arrived_total"], kShed + kPreemptions);
  EXPECT_EQ(m["hiber_requests_completed_total"], kPreemptions);
  EXPECT_EQ(m["hiber_background_requests_total"], kPreemptions);

  auto reply = control->status();
  ASSERT_TRUE(reply.ok()) << reply.status();
  Status read = wire::read_message<proto::ControlReply>(
      *reply, "status", [&](proto::ControlReply::Reader r) -> Status {
        EXPECT_EQ(r.getStatus().getScheduler().getShed(), uint64_t{kShed});
        EXPECT_EQ(r.getStatus().getScheduler().getPreemptions(), uint64_t{kPreemptions});
        return Status();
      });
  EXPECT_TRUE(read.ok()) << read;

  auto printed = run_program({HIBERCTL_PATH, "--run_dir=" + hiberd.run_dir(), "status"});
  ASSERT_EQ(printed.exit_code, 0) << printed.output;
  EXPECT_NE(printed.output.find(std::to_string(kShed) + " shed as overloaded, "), std::string::npos)
      << printed.output;
  EXPECT_NE(printed.output.find(" " + std::to_string(kPreemptions) + " background (" +
                                std::to_string(kPreemptions) + " preempted)"),
            std::string::npos)
      << printed.output;
  // Every figure in words: no empty name for an idle GPU, no GPU -1 for a session between
  // leases, the SLO window said as such, counts with their plural.
  for (const char* never : {"running ''", "GPU -1", "RRC", "1 swaps", "1 sessions"}) {
    EXPECT_EQ(printed.output.find(never), std::string::npos) << never << "\n" << printed.output;
  }
  EXPECT_TRUE(printed.output.find("; idle;") != std::string::npos ||
              printed.output.find("; running '") != std::string::npos)
      << printed.output;
  EXPECT_TRUE(printed.output.find(", no GPU:") != std::string::npos ||
              printed.output.find(", on GPU ") != std::string::npos)
      << printed.output;
  EXPECT_NE(printed.output.find("window: "), std::string::npos) << printed.output;
  EXPECT_NE(printed.output.find(" completed ("), std::string::npos) << printed.output;

  // --json: the same reply as JSON, under the schema's names (64-bit integers as strings).
  auto as_json = run_program({HIBERCTL_PATH, "--run_dir=" + hiberd.run_dir(), "status", "--json"});
  ASSERT_EQ(as_json.exit_code, 0) << as_json.output;
  const nlohmann::json status = nlohmann::json::parse(as_json.output, nullptr, false);
  ASSERT_TRUE(status.is_object()) << as_json.output;
  EXPECT_EQ(status["scheduler"]["shed"], std::to_string(kShed)) << status["scheduler"];
  EXPECT_EQ(status["scheduler"]["preemptions"], std::to_string(kPreemptions));
  ASSERT_TRUE(status["devices"].is_array());
  EXPECT_FALSE(status["devices"].empty());
  EXPECT_TRUE(status["sessions"].is_array());

  late->reset();
  waiting->reset();
  hog->reset();
  EXPECT_EQ(hiberd.stop(), 0) << hiberd.log();
  std::system(("rm -rf " + dir).c_str());
}

TEST(HiberdMetrics, APortInUseStopsHiberdSayingWhy) {
  UniqueFd taken(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  ASSERT_TRUE(taken);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(taken.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  ASSERT_EQ(::listen(taken.get(), 1), 0);
  socklen_t length = sizeof addr;
  ASSERT_EQ(::getsockname(taken.get(), reinterpret_cast<sockaddr*>(&addr), &length), 0);
  const int port = ntohs(addr.sin_port);
  char tmpl[] = "/tmp/hiber-metrics-XXXXXX";
  const std::string run_dir = ::mkdtemp(tmpl);
  auto result =
      run_program({hiberd_path(), "--device=sim", "--run_dir=" + run_dir, "--swap_group_kib=1024",
                   "--metrics_listen=127.0.0.1:" + std::to_string(port)},
                  60s);
  EXPECT_EQ(result.exit_code, 1) << result.output;
  EXPECT_NE(result.output.find("cannot serve metrics on '127.0.0.1:" + std::to_string(port)),
            std::string::npos)
      << result.output;
  EXPECT_NE(::access((run_dir + "/control.sock").c_str(), F_OK), 0) << "no stale socket";
  std::system(("rm -rf " + run_dir).c_str());
}

TEST(HiberdMetrics, OffByDefault) {
  Hiberd hiberd;
  EXPECT_EQ(hiberd.log().find("/metrics"), std::string::npos) << hiberd.log();
}

}  // namespace
}  // namespace hiber::testing
