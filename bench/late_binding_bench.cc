// Late binding's costs as the node router sees them (docs/perf.md, "late binding"): a real
// hiberd and real functions (tests/shim/programs/mlp_server through libhibercuda.so), driven
// through the control socket as the router drives them.
//
//   late_binding_bench [--only=latency,swap,ablation] [--device=sim|cuda] [--requests=N]
//                      [--model_mib=N] [--pcie_gbps=G] [--label=TEXT]
//
// Measurements (one RESULT line per figure, as bench/shim_bench.cu prints them):
//   latency   control-call latency, requestArrived to requestStart's answer, p50 and p99 over
//             --requests: with the model resident (warm), and with a model that must be
//             brought from the host first (each request of two functions on a one-GPU node
//             whose pool holds one model evicts the other). Baseline: a control ping.
//   swap      swap-in of a --model_mib model from the host on a link of --pcie_gbps (the
//             simulated device throttled; on --device=cuda the GPU's own link): the swap time
//             hiberd reports (first copy to last group), against the link model bytes / rate,
//             and the achieved bandwidth against the pinned-copy peak hiberd measured at start
//             (its elbow curve, from its log). Two untimed swaps come first (page warm-up).
//   ablation  the paper's Fig. 7 on the throttled link: a swapped request's latency (arrival
//             to answer) with the model in pageable host memory and no pipelining, pinned and
//             no pipelining, pinned and pipelined in 64 KiB groups (per-parameter transfers),
//             and pinned, pipelined, in groups of the measured elbow; for a request whose
//             kernels read only the first block, and for one that reads the whole model.
//             Baseline: the pageable, unpipelined configuration.
#include <signal.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include <gflags/gflags.h>

#include "tests/shim/shim_runner.h"
#include "wire/control_client.h"
#include "wire/message.h"
#include "wire/schema/control.capnp.h"

DEFINE_string(only, "latency,swap,ablation", "Which measurements to run (comma-separated)");
DEFINE_string(device, "sim", "hiberd's device: sim (throttled where a link matters) or cuda");
DEFINE_int32(requests, 200, "Requests per latency figure");
DEFINE_int32(model_mib, 256, "The swapped model's size (mlp_server's table), MiB");
DEFINE_double(pcie_gbps, 12, "Host-to-GPU bandwidth of the simulated node, GB/s");
DEFINE_int32(swaps, 5, "Swaps averaged per swap figure");
DEFINE_string(label, "", "A label for the RESULT lines");

namespace hiber::testing::shim {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
namespace proto = wire::proto;

double ms_since(Clock::time_point start) {
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(p * static_cast<double>(v.size())))];
}

void result(const std::string& name, double value, const std::string& unit,
            const std::string& extra = "") {
  std::printf("RESULT label=%s name=%s value=%.3f unit=%s%s%s\n",
              FLAGS_label.empty() ? FLAGS_device.c_str() : FLAGS_label.c_str(), name.c_str(), value,
              unit.c_str(), extra.empty() ? "" : " ", extra.c_str());
}

// A one- or two-GPU simulated node with small GPUs and the given link, written to `dir`.
std::string node_config(const std::string& dir, uint64_t memory_mib, double gbps) {
  std::ostringstream json;
  json << R"({"name": "late-binding-bench", "gpuModels": [{"name": "m", "productName": "Bench GPU",
    "memoryBytes": )"
       << (memory_mib << 20)
       << R"(, "computeCapabilityMajor": 9, "computeCapabilityMinor": 0, "multiprocessors": 132}],
    "gpus": [{"model": "m", "pcieSwitch": 0, "pciBusId": "0000:10:00.0"}],
    "pcieSwitches": [{"hostToDeviceGBps": )"
       << gbps << R"(, "deviceToHostGBps": )" << gbps << "}]}";
  const std::string path = dir + "/node-" + std::to_string(memory_mib) + ".json";
  std::ofstream(path) << json.str();
  return path;
}

std::string scratch_dir() {
  char tmpl[] = "/tmp/hiber-lbbench-XXXXXX";
  return ::mkdtemp(tmpl);
}

// A running hiberd with registered mlp_server functions.
class Node {
 public:
  Node(const std::vector<std::string>& flags, int functions, int table_mib) {
    HiberdOptions options = sim_hiberd_options();
    options.device = FLAGS_device;
    options.extra_flags = flags;
    hiberd_ = std::make_unique<Hiberd>(options);
    auto client = control();
    for (int i = 0; i < functions; ++i) {
      const std::string id = "bench-" + std::to_string(i);
      wire::FunctionRegistration r;
      r.function_id = id;
      r.slo_ms = 10000;
      (void)client.register_function(r);
      programs_.push_back(std::make_unique<ServedProgram>(
          *hiberd_, ProgramRun{"mlp_server", {std::to_string(100 + i), std::to_string(table_mib)}},
          id, hiberd_->run_dir() + "/" + id + ".log"));
      ids_.push_back(id);
    }
    for (auto& p : programs_) {
      const std::string ready = p->read_line(600s);
      if (ready.rfind("ready", 0) != 0) {
        std::fprintf(stderr, "a function did not start: '%s'\n%s\n", ready.c_str(),
                     hiberd_->log().c_str());
        std::exit(1);
      }
    }
  }
  ~Node() {
    for (auto& p : programs_) p->send_line("quit");
    for (auto& p : programs_) p->finish(60s);
  }

  wire::ControlClient control() {
    auto client = wire::ControlClient::connect(hiberd_->control_socket_path(), 600s);
    if (!client.ok()) {
      std::fprintf(stderr, "control: %s\n", client.status().to_string().c_str());
      std::exit(1);
    }
    return std::move(client).value();
  }

  struct Timing {
    double start_ms = 0;   // arrival to requestStart's answer
    double answer_ms = 0;  // arrival to the function's answer
    std::string source;
  };
  // One request of function i with `line`; exits on any error (a benchmark of wrong answers
  // means nothing).
  Timing request(wire::ControlClient& client, int i, const std::string& line) {
    Timing t;
    const auto start = Clock::now();
    auto id = client.request_arrived(ids_[i]);
    auto started = id.ok() ? client.request_start(*id) : Result<wire::Started>(id.status());
    if (!started.ok()) {
      std::fprintf(stderr, "request: %s\n", started.status().to_string().c_str());
      std::exit(1);
    }
    t.start_ms = ms_since(start);
    t.source = started->source;
    programs_[i]->send_line(line);
    const std::string answer = programs_[i]->read_line(600s);
    t.answer_ms = ms_since(start);
    if (answer.rfind("result", 0) != 0 || !client.request_done(*id).ok()) {
      std::fprintf(stderr, "bad answer '%s'\n", answer.c_str());
      std::exit(1);
    }
    return t;
  }

  // Evicts every model from GPU 0 (drain, then resume).
  void evict_all(wire::ControlClient& client) {
    (void)client.drain(0);
    (void)client.drain(0, true);
  }

  struct SwapTotals {
    uint64_t swaps = 0, bytes = 0;
    double seconds = 0;
  };
  SwapTotals swap_totals(wire::ControlClient& client) {
    SwapTotals totals;
    auto reply = client.status();
    if (!reply.ok()) return totals;
    (void)wire::read_message<proto::ControlReply>(*reply, "status", [&](auto r) {
      for (auto d : r.getStatus().getDevices()) {
        totals.swaps += d.getSwapsIn();
        totals.bytes += d.getSwapInBytes();
        totals.seconds += d.getSwapInSeconds();
      }
      return Status();
    });
    return totals;
  }

  // The best throughput of hiberd's elbow measurement, GB/s (its log); 0 if not there.
  double pinned_peak_gbps() const {
    std::istringstream log(hiberd_->log());
    std::string line;
    double best = 0;
    while (std::getline(log, line)) {
      const size_t at = line.find("measured host-to-GPU transfers (GB/s):");
      if (at == std::string::npos) continue;
      std::istringstream points(line.substr(at + 40));
      std::string point;
      while (points >> point) {
        const size_t colon = point.find(':');
        if (colon != std::string::npos) best = std::max(best, std::atof(point.c_str() + colon + 1));
      }
    }
    return best;
  }

 private:
  std::unique_ptr<Hiberd> hiberd_;
  std::vector<std::unique_ptr<ServedProgram>> programs_;
  std::vector<std::string> ids_;
};

std::vector<std::string> sim_flags(const std::string& node, std::vector<std::string> more) {
  std::vector<std::string> flags;
  if (FLAGS_device == "sim") {
    flags = {"--node_config=" + node, "--gpu_reserve_mib=16", "--host_pool_chunk_mib=1024"};
  }
  flags.insert(flags.end(), more.begin(), more.end());
  return flags;
}

void latency(const std::string& dir) {
  // Warm: one function whose model stays resident.
  {
    Node node(sim_flags(node_config(dir, 2048, FLAGS_pcie_gbps), {}), 1, 4);
    auto client = node.control();
    std::vector<double> pings, starts;
    for (int i = 0; i < FLAGS_requests; ++i) {
      const auto start = Clock::now();
      (void)client.ping();
      pings.push_back(ms_since(start));
    }
    (void)node.request(client, 0, "0 0");  // the first request fixes the model
    for (int i = 0; i < FLAGS_requests; ++i)
      starts.push_back(node.request(client, 0, "1 1").start_ms);
    const double base = percentile(pings, 0.5);
    result("control_ping_p50", base, "ms");
    result("start_warm_p50", percentile(starts, 0.5), "ms",
           "p99=" + std::to_string(percentile(starts, 0.99)) + " baseline=ping:" +
               std::to_string(base) + " ratio=" + std::to_string(percentile(starts, 0.5) / base));
  }
  // Swapped: two functions of 66 MiB models on a GPU whose 128 MiB pool holds one.
  {
    Node node(sim_flags(node_config(dir, 16 + 128, FLAGS_pcie_gbps), {"--sim_throttle"}), 2, 64);
    auto client = node.control();
    for (int f = 0; f < 2; ++f) (void)node.request(client, f, "0 0");
    std::vector<double> starts;
    int swapped = 0;
    for (int i = 0; i < FLAGS_requests / 4; ++i) {
      const Node::Timing t = node.request(client, i % 2, "1 1");
      starts.push_back(t.start_ms);
      swapped += t.source == "host";
    }
    result("start_swap_p50", percentile(starts, 0.5), "ms",
           "p99=" + std::to_string(percentile(starts, 0.99)) +
               " swapped=" + std::to_string(swapped) + "/" + std::to_string(starts.size()));
  }
}

void swap(const std::string& dir) {
  Node node(
      sim_flags(node_config(dir, 16 + 2 * FLAGS_model_mib, FLAGS_pcie_gbps), {"--sim_throttle"}), 1,
      FLAGS_model_mib);
  auto client = node.control();
  (void)node.request(client, 0, "0 0");
  const long long last = (static_cast<long long>(FLAGS_model_mib) << 20) / 4 - 1;
  // Two swaps first: on the simulated device the first touch of each page of GPU memory costs
  // a host page fault (about 15 us in a VM), which a real GPU's memory never does.
  for (int i = 0; i < 2; ++i) {
    node.evict_all(client);
    (void)node.request(client, 0, "1 " + std::to_string(last));
  }
  const Node::SwapTotals before = node.swap_totals(client);
  for (int i = 0; i < FLAGS_swaps; ++i) {
    node.evict_all(client);
    (void)node.request(client, 0, "1 " + std::to_string(last));
  }
  const Node::SwapTotals after = node.swap_totals(client);
  const double bytes = static_cast<double>(after.bytes - before.bytes);
  const double seconds = after.seconds - before.seconds;
  const uint64_t swaps = after.swaps - before.swaps;
  if (swaps == 0 || seconds <= 0) {
    std::fprintf(stderr, "no swaps were reported\n");
    return;
  }
  const double per_swap_ms = seconds / static_cast<double>(swaps) * 1e3;
  const double gbps = bytes / seconds / 1e9;
  if (FLAGS_device == "sim") {
    const double model_ms = bytes / static_cast<double>(swaps) / (FLAGS_pcie_gbps * 1e9) * 1e3;
    result("swap_in_ms", per_swap_ms, "ms",
           "baseline=link_model:" + std::to_string(model_ms) +
               " ratio=" + std::to_string(per_swap_ms / model_ms) + " bytes=" +
               std::to_string(static_cast<uint64_t>(bytes / static_cast<double>(swaps))));
  }
  const double peak = node.pinned_peak_gbps();
  result("swap_in_gbps", gbps, "GB/s",
         "baseline=pinned_peak:" + std::to_string(peak) +
             (peak > 0 ? " ratio=" + std::to_string(gbps / peak) : ""));
}

void ablation(const std::string& dir) {
  struct Config {
    std::string name;
    std::vector<std::string> flags;
  };
  const std::vector<Config> configs = {
      {"pageable_whole", {"--pinned_host_copies=false", "--pipelined=false"}},
      {"pinned_whole", {"--pipelined=false"}},
      {"pinned_pipelined_64k", {"--swap_group_kib=64"}},
      {"pinned_pipelined_elbow", {}},
  };
  const long long last = (static_cast<long long>(FLAGS_model_mib) << 20) / 4 - 1;
  double base_first = 0, base_whole = 0;
  for (const Config& c : configs) {
    std::vector<std::string> flags = c.flags;
    flags.push_back("--sim_throttle");
    Node node(sim_flags(node_config(dir, 16 + 2 * FLAGS_model_mib, FLAGS_pcie_gbps), flags), 1,
              FLAGS_model_mib);
    auto client = node.control();
    (void)node.request(client, 0, "0 -1");  // the first request: the weights, not the table
    std::vector<double> first, whole;
    for (int i = 0; i < FLAGS_swaps; ++i) {
      node.evict_all(client);
      first.push_back(node.request(client, 0, "1 -1").answer_ms);
      node.evict_all(client);
      whole.push_back(node.request(client, 0, "1 " + std::to_string(last)).answer_ms);
    }
    const double f = percentile(first, 0.5), w = percentile(whole, 0.5);
    if (base_first == 0) {
      base_first = f;
      base_whole = w;
    }
    result("fig7_" + c.name + "_first_block", f, "ms",
           "baseline=pageable_whole:" + std::to_string(base_first) +
               " ratio=" + std::to_string(f / base_first));
    result("fig7_" + c.name + "_whole_model", w, "ms",
           "baseline=pageable_whole:" + std::to_string(base_whole) +
               " ratio=" + std::to_string(w / base_whole));
  }
}

}  // namespace
}  // namespace hiber::testing::shim

int main(int argc, char** argv) {
  gflags::SetUsageMessage("late_binding_bench: late binding as the node router sees it");
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  ::signal(SIGPIPE, SIG_IGN);
  using namespace hiber::testing::shim;
  if (std::string why = missing_shim(); !why.empty()) {
    std::fprintf(stderr, "%s\n", why.c_str());
    return 1;
  }
  const std::string dir = scratch_dir();
  const std::string only = "," + FLAGS_only + ",";
  if (only.find(",latency,") != std::string::npos) latency(dir);
  if (only.find(",swap,") != std::string::npos) swap(dir);
  if (only.find(",ablation,") != std::string::npos && FLAGS_device == "sim") ablation(dir);
  return 0;
}
