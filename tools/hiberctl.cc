// hiberctl: talks to hiberd over its control socket, as an operator or in place of the node
// router (until hiber-router exists).
//   hiberctl status                   devices, executors, functions, sessions, counters
//   hiberctl ping                     is hiberd answering?
//   hiberctl register FN --slo_ms=80 [--tail=0.98] [--quota_mib=N] [--stateful] [--heavy=yes|no]
//   hiberctl unregister FN
//   hiberctl arrive FN                a request of FN arrived: prints its id
//   hiberctl start ID                 waits until request ID may run: prints the GPU
//   hiberctl done ID [--failed]       the request finished
//   hiberctl invoke FN                arrive + start: prints the id and the GPU
//   hiberctl drain [--gpu=N] [--resume]
// A node elsewhere: --control=tcp:HOST:PORT --control_token_file=FILE (hiberd's
// --control_tcp_listen and --control_token_file).
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include <gflags/gflags.h>
#include <glog/logging.h>

#include "common/cli.h"
#include "common/paths.h"
#include "wire/control_client.h"
#include "wire/message.h"
#include "wire/schema/control.capnp.h"

DEFINE_string(run_dir, "",
              "hiberd's run directory (default: $HIBER_RUN_DIR, /run/hiber as root, "
              "else /tmp/hiber-<uid>)");
DEFINE_string(control_socket, "", "hiberd's control socket (default: <run_dir>/control.sock)");
DEFINE_string(control, "",
              "Where hiberd's control protocol is: unix:/path (or a bare path) or tcp:host:port "
              "(hiberd's --control_tcp_listen; needs --control_token_file). Overrides "
              "--control_socket");
DEFINE_string(control_token_file, "",
              "File whose first line is the node's control token (required over tcp:)");
DEFINE_int32(timeout_ms, 30000, "How long to wait for hiberd's answer");
DEFINE_double(slo_ms, 0, "register: the function's deadline, ms");
DEFINE_double(tail, 0, "register: the share of requests that must meet it (0: 0.98)");
DEFINE_uint64(quota_mib, 0, "register: device memory the function may hold (0: hiberd's default)");
DEFINE_bool(stateful, false, "register: swap every block both ways");
DEFINE_string(heavy, "", "register: yes or no, a heaviness hint until hiberd has measured");
DEFINE_double(exec_ms, 0, "register: expected execution time with the model resident, ms");
DEFINE_bool(failed, false, "done: the request gave no answer");
DEFINE_int32(gpu, -1, "drain: one GPU (default: the whole node)");
DEFINE_bool(resume, false, "drain: undo a drain");

namespace hiber {
namespace {

namespace proto = wire::proto;

void print_status(proto::NodeStatus::Reader s) {
  std::printf("hiberd %u.%u on node %s (%s device), up %.1f s\n", s.getServerVersion().getMajor(),
              s.getServerVersion().getMinor(), s.getNodeName().cStr(), s.getBackend().cStr(),
              s.getUptimeSeconds());
  for (auto d : s.getDevices()) {
    std::printf(
        "  GPU %u %s%s%s: pool %" PRIu64 " MiB, %" PRIu64 " MiB placed, largest free %" PRIu64
        " MiB, fragmentation %.2f; running '%s'; %" PRIu64 " swaps in (%" PRIu64 " MiB), %" PRIu64
        " evictions\n",
        d.getOrdinal(), d.getName().cStr(), d.getHealthy() ? "" : " UNHEALTHY",
        d.getDrained() ? " drained" : "", d.getPoolBytes() >> 20, d.getPoolAllocatedBytes() >> 20,
        d.getPoolLargestFreeBytes() >> 20, d.getPoolFragmentation(), d.getRunningFunction().cStr(),
        d.getSwapsIn(), d.getSwapInBytes() >> 20, d.getEvictions());
  }
  auto q = s.getScheduler();
  std::printf("  scheduler: placement %s, eviction %s, queue %s%s; %" PRIu64 " queued, %" PRIu64
              " arrived, %" PRIu64 " done (%" PRIu64 " on time), %" PRIu64
              " background; starts: %" PRIu64 " resident, %" PRIu64 " peer, %" PRIu64
              " host; %" PRIu64 " evictions; swap groups of %" PRIu64 " KiB; host pool %" PRIu64
              " of %" PRIu64 " MiB\n",
              q.getPlacement().cStr(), q.getEviction().cStr(), q.getQueue().cStr(),
              q.getDrainingNode() ? " (draining)" : "", q.getQueued(), q.getArrivals(),
              q.getCompleted(), q.getOnTime(), q.getBackground(), q.getResidentStarts(),
              q.getPeerSwaps(), q.getHostSwaps(), q.getEvictions(), q.getSwapGroupBytes() >> 10,
              q.getHostPoolUsedBytes() >> 20, q.getHostPoolBytes() >> 20);
  std::printf("  %u functions\n", s.getFunctions().size());
  for (auto f : s.getFunctions()) {
    std::string gpus;
    for (uint32_t g : f.getResidentGpus()) {
      if (!gpus.empty()) gpus += ',';
      gpus += std::to_string(g);
    }
    std::printf("    '%s'%s%s %s: model %" PRIu64 " MiB, resident on [%s], %" PRIu64
                " requests (%" PRIu64 " on time in the window), RRC %.2f\n",
                f.getFunctionId().cStr(), f.getRegistered() ? "" : " (unregistered)",
                f.getStateful() ? " stateful" : "", f.getHeavy() ? "heavy" : "light",
                f.getModelBytes() >> 20, gpus.c_str(), f.getRequests(), f.getOnTime(), f.getRrc());
  }
  std::printf("  %u sessions\n", s.getSessions().size());
  for (auto x : s.getSessions()) {
    std::printf("    session %" PRIu64 " '%s' pid %d uid %u GPU %d: %" PRIu64 " of %" PRIu64
                " MiB, %" PRIu64 " batches, %" PRIu64 " calls (%" PRIu64 " failed), %.1f s\n",
                x.getId(), x.getFunctionId().cStr(), x.getPid(), x.getUid(), x.getBoundGpu(),
                x.getAllocatedBytes() >> 20, x.getQuotaBytes() >> 20, x.getBatches(), x.getCalls(),
                x.getFailedCalls(), x.getConnectedSeconds());
  }
  auto c = s.getCounters();
  std::printf("  counters: sessions opened %" PRIu64 ", closed %" PRIu64
              ", handshakes rejected %" PRIu64 ", malformed messages %" PRIu64
              ", control requests %" PRIu64 "\n",
              c.getSessionsOpened(), c.getSessionsClosed(), c.getHandshakesRejected(),
              c.getMalformedMessages(), c.getControlRequests());
  std::printf("  module cache: %" PRIu64 " images (%" PRIu64 " MiB), %" PRIu64 " hits, %" PRIu64
              " misses, %" PRIu64 " unknown hashes\n",
              c.getCachedModules(), c.getCachedModuleBytes() >> 20, c.getModuleCacheHits(),
              c.getModuleCacheMisses(), c.getModuleCacheUnknownHashes());
}

int fail(const Status& s) {
  std::fprintf(stderr, "hiberctl: %s\n", s.to_string().c_str());
  return 1;
}

Result<uint64_t> parse_id(const std::vector<std::string>& args) {
  if (args.size() != 2) return Status(ErrorCode::kInvalidValue, "expected a request id");
  char* end = nullptr;
  const uint64_t id = std::strtoull(args[1].c_str(), &end, 10);
  if (end == args[1].c_str() || *end != '\0') {
    return error(ErrorCode::kInvalidValue, "'", args[1], "' is not a request id");
  }
  return id;
}

int run(const std::vector<std::string>& args) {
  const std::string run_dir = FLAGS_run_dir.empty() ? default_run_dir() : FLAGS_run_dir;
  std::string path =
      FLAGS_control_socket.empty() ? control_socket_path(run_dir) : FLAGS_control_socket;
  if (!FLAGS_control.empty()) path = FLAGS_control;
  std::string token;
  if (!FLAGS_control_token_file.empty()) {
    auto read = wire::read_token_file(FLAGS_control_token_file);
    if (!read.ok()) return fail(read.status().with_context("--control_token_file"));
    token = *read;
  } else if (path.starts_with("tcp:")) {
    return fail(Status(ErrorCode::kInvalidValue,
                       "--control=tcp:... needs --control_token_file (hiberd admits only "
                       "requests that carry the control token over TCP)"));
  }
  auto client =
      wire::ControlClient::connect(path, token, std::chrono::milliseconds(FLAGS_timeout_ms));
  if (!client.ok()) return fail(client.status());
  const std::string& command = args[0];
  auto function_arg = [&]() -> Result<std::string> {
    if (args.size() != 2) return Status(ErrorCode::kInvalidValue, "expected a function id");
    return args[1];
  };

  if (command == "ping") {
    if (Status s = client->ping(); !s.ok()) return fail(s);
    std::printf("hiberd is answering on %s\n", path.c_str());
    return 0;
  }
  if (command == "status") {
    auto reply = client->status();
    if (!reply.ok()) return fail(reply.status());
    Status read = wire::read_message<proto::ControlReply>(
        *reply, "status", [](proto::ControlReply::Reader r) -> Status {
          if (!r.isStatus()) return Status(ErrorCode::kInvalidValue, "not a status reply");
          print_status(r.getStatus());
          return Status();
        });
    return read.ok() ? 0 : fail(read);
  }
  if (command == "register") {
    auto function = function_arg();
    if (!function.ok()) return fail(function.status());
    wire::FunctionRegistration r;
    r.function_id = *function;
    r.slo_ms = FLAGS_slo_ms;
    r.tail_percentile = FLAGS_tail;
    r.quota_bytes = FLAGS_quota_mib << 20;
    r.stateful = FLAGS_stateful;
    if (FLAGS_heavy == "yes") r.heavy = true;
    if (FLAGS_heavy == "no") r.heavy = false;
    if (!FLAGS_heavy.empty() && !r.heavy) {
      return fail(Status(ErrorCode::kInvalidValue, "--heavy must be yes or no"));
    }
    r.exec_ms_hint = FLAGS_exec_ms;
    if (Status s = client->register_function(r); !s.ok()) return fail(s);
    std::printf("registered '%s'\n", r.function_id.c_str());
    return 0;
  }
  if (command == "unregister") {
    auto function = function_arg();
    if (!function.ok()) return fail(function.status());
    if (Status s = client->unregister_function(*function); !s.ok()) return fail(s);
    return 0;
  }
  if (command == "arrive" || command == "invoke") {
    auto function = function_arg();
    if (!function.ok()) return fail(function.status());
    auto id = client->request_arrived(*function);
    if (!id.ok()) return fail(id.status());
    if (command == "arrive") {
      std::printf("%" PRIu64 "\n", *id);
      return 0;
    }
    auto started = client->request_start(*id);
    if (!started.ok()) return fail(started.status());
    std::printf("request %" PRIu64 " runs on GPU %d (model %s", *id, started->gpu,
                started->source.c_str());
    if (started->source_gpu >= 0) std::printf(" from GPU %d", started->source_gpu);
    std::printf(", %s, queued %.2f ms)\n", started->rule.c_str(), started->queued_ms);
    return 0;
  }
  if (command == "start") {
    auto id = parse_id(args);
    if (!id.ok()) return fail(id.status());
    auto started = client->request_start(*id);
    if (!started.ok()) return fail(started.status());
    std::printf("%d %s %d %s %.3f\n", started->gpu, started->source.c_str(), started->source_gpu,
                started->rule.c_str(), started->queued_ms);
    return 0;
  }
  if (command == "done") {
    auto id = parse_id(args);
    if (!id.ok()) return fail(id.status());
    if (Status s = client->request_done(*id, FLAGS_failed); !s.ok()) return fail(s);
    return 0;
  }
  if (command == "drain") {
    if (Status s = client->drain(FLAGS_gpu, FLAGS_resume); !s.ok()) return fail(s);
    if (FLAGS_gpu < 0) {
      std::printf("the node %s\n", FLAGS_resume ? "resumed" : "is drained");
    } else {
      std::printf("GPU %d %s\n", FLAGS_gpu, FLAGS_resume ? "resumed" : "is drained");
    }
    return 0;
  }
  std::fprintf(stderr, "hiberctl: unknown command '%s' (see --help)\n", command.c_str());
  return 2;
}

}  // namespace
}  // namespace hiber

int main(int argc, char** argv) {
  hiber::init_program(&argc, &argv,
                      "hiberctl: talks to hiberd's control socket.\n"
                      "  hiberctl status | ping\n"
                      "  hiberctl register FN --slo_ms=MS [--tail=P] [--quota_mib=N] [--stateful]\n"
                      "  hiberctl unregister FN\n"
                      "  hiberctl arrive FN | start ID | done ID [--failed] | invoke FN\n"
                      "  hiberctl drain [--gpu=N] [--resume]\n"
                      "  hiberctl --control=tcp:HOST:PORT --control_token_file=FILE COMMAND ...",
                      __FILE__);
  if (argc < 2) {
    std::fprintf(stderr, "usage: hiberctl [flags] COMMAND [ARG] (see --help)\n");
    return 2;
  }
  return hiber::run(std::vector<std::string>(argv + 1, argv + argc));
}
