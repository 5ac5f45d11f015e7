// hiberctl: talks to hiber-router over its HTTP API (docs/router.md), and to hiberd over its
// control socket, as an operator or in place of the router.
// The router (--router, default $HIBER_ROUTER, else http://127.0.0.1:8080):
//   hiberctl functions                the registry with each function's numbers
//   hiberctl invoke FN [--data=S | --data_file=P | -] [--content_type=T] [--async]
//                      [--deadline_ms=N] [--request_id=ID]
//   hiberctl load FN --file=R.json | --command="..." [--slo_ms=..] [--env=K=V,..] ...
//   hiberctl unload FN
//   hiberctl top [--interval_ms=1000] [--iterations=N]
// hiberd (--run_dir or --control_socket):
//   hiberctl status                   devices, executors, functions, sessions, counters
//   hiberctl ping                     is hiberd answering?
//   hiberctl register FN --slo_ms=80 [--tail=0.98] [--quota_mib=N] [--stateful] [--heavy=yes|no]
//   hiberctl unregister FN
//   hiberctl arrive FN                a request of FN arrived: prints its id
//   hiberctl start ID                 waits until request ID may run: prints the GPU
//   hiberctl done ID [--failed]       the request finished
//   hiberctl node-invoke FN           arrive + start: prints the id and the GPU
//   hiberctl drain [--gpu=N] [--resume]
#include <unistd.h>

// Every request carries hiberd's control token: --control_token_file, by default the
// control-token file beside the control socket (readable by hiberd's uid only, unless the
// operator shares it). A node elsewhere: --control=tcp:HOST:PORT --control_token_file=FILE
// (hiberd's --control_tcp_listen and --control_token_file).
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <iterator>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <capnp/compat/json.h>
#include <gflags/gflags.h>
#include <glog/logging.h>

#include "common/cli.h"
#include "common/paths.h"
#include "router/http_client.h"
#include "tools/registration.h"
#include "tools/router_ctl.h"
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
              "File whose first line is the node's control token (required over tcp:; "
              "default on a Unix socket: the control-token file beside it)");
DEFINE_int32(timeout_ms, 30000,
             "How long to wait for hiberd's or the router's answer (invoke --async: for the "
             "invocation to finish)");
DEFINE_string(router, "",
              "hiber-router's address, http://host:port (default: $HIBER_ROUTER, else "
              "http://127.0.0.1:8080)");
DEFINE_string(router_token_file, "",
              "load, unload, functions: file whose first line is the router's operator token "
              "(hiber-router --operator_token_file; default: $HIBER_ROUTER_TOKEN_FILE, else "
              "<run_dir>/router/operator-token, the router's default, when readable)");
DEFINE_double(slo_ms, 0, "register, load: the function's deadline, ms");
DEFINE_double(tail, 0, "register, load: the share of requests that must meet it (0: 0.98)");
DEFINE_uint64(quota_mib, 0,
              "register, load: device memory the function may hold (0: hiberd's default)");
DEFINE_bool(stateful, false, "register, load: swap every block both ways");
DEFINE_string(heavy, "", "register, load: yes or no, a heaviness hint until hiberd has measured");
DEFINE_double(exec_ms, 0, "register, load: expected execution time with the model resident, ms");
DEFINE_string(data, "", "invoke: the request body");
DEFINE_string(data_file, "", "invoke: a file holding the request body ('-' as argument: stdin)");
DEFINE_string(content_type, "application/json",
              "invoke: the body's type (application/json or application/octet-stream)");
DEFINE_bool(async, false, "invoke: ask for an asynchronous invocation and poll until it is done");
DEFINE_int64(deadline_ms, 0, "invoke: answer within this many ms of arrival (0: no deadline)");
DEFINE_string(request_id, "", "invoke: the request's X-Request-Id (default: the router makes one)");
DEFINE_string(file, "", "load: a registration JSON file (flags given as well override it)");
DEFINE_string(command, "", "load: the worker's command line, split like a shell's words");
DEFINE_bool(external, false,
            "load: the function's workers attach to the router by themselves, none is started "
            "(no --command; docs/router.md, \"Attached workers\")");
DEFINE_string(env, "", "load: the worker's environment, NAME=VALUE,NAME2=VALUE2");
DEFINE_bool(shim, false,
            "load: preload Hiber's client libraries into the worker (--shim for a function that "
            "uses a GPU; not given: the router's default, false)");
DEFINE_uint64(concurrency, 1, "load: requests one worker takes at once");
DEFINE_uint64(max_instances, 1, "load: workers the router may start");
DEFINE_uint64(idle_timeout_s, 60, "load: stop a worker idle this long (scale to zero)");
DEFINE_int32(interval_ms, 1000, "top: time between refreshes");
DEFINE_uint64(iterations, 0, "top: refreshes before exiting (0: until interrupted)");
DEFINE_bool(failed, false, "done: the request gave no answer");
DEFINE_uint64(wait_ms, 0,
              "arrive, node-invoke: wait up to this long for an instance of the function to "
              "connect (0: fail at once when none is connected)");
DEFINE_bool(json, false,
            "status: print hiberd's status as one JSON object (the fields of NodeStatus in "
            "wire/schema/control.capnp, in camelCase; 64-bit integers as strings) instead of text");
DEFINE_int32(gpu, -1, "drain: one GPU (default: the whole node)");
DEFINE_bool(resume, false, "drain: undo a drain");

namespace hiber {
namespace {

namespace proto = wire::proto;

// "1 swap", "2 swaps".
std::string count_of(uint64_t n, const char* thing) {
  return std::to_string(n) + " " + thing + (n == 1 ? "" : "s");
}

// What the scheduler's RRC says, in words: the on-time requests a function still needs in its
// window to reach its SLO's percentile (scheduler/queue.h), or that it meets it.
std::string slo_standing(double rrc, uint64_t requests) {
  char text[96];
  if (requests == 0) return "no requests in the window yet";
  if (rrc <= 0) return "meets its SLO in the window";
  std::snprintf(text, sizeof text, "needs %.1f more on-time requests to meet its SLO", rrc);
  return text;
}

void print_status(proto::NodeStatus::Reader s) {
  std::printf("hiberd %u.%u on node %s (%s device), up %.1f s\n", s.getServerVersion().getMajor(),
              s.getServerVersion().getMinor(), s.getNodeName().cStr(), s.getBackend().cStr(),
              s.getUptimeSeconds());
  for (auto d : s.getDevices()) {
    const std::string running =
        d.getRunningFunction().size() == 0
            ? std::string("idle")
            : "running '" + std::string(d.getRunningFunction().cStr()) + "'";
    std::printf("  GPU %u %s%s%s: pool %" PRIu64 " MiB, %" PRIu64
                " MiB placed, largest free %" PRIu64 " MiB, fragmentation %.2f; %s; %s in (%" PRIu64
                " MiB), %s\n",
                d.getOrdinal(), d.getName().cStr(), d.getHealthy() ? "" : " UNHEALTHY",
                d.getDrained() ? " drained" : "", d.getPoolBytes() >> 20,
                d.getPoolAllocatedBytes() >> 20, d.getPoolLargestFreeBytes() >> 20,
                d.getPoolFragmentation(), running.c_str(), count_of(d.getSwapsIn(), "swap").c_str(),
                d.getSwapInBytes() >> 20, count_of(d.getEvictions(), "eviction").c_str());
    if (d.getEvictions() > 0) {
      std::string reasons;
      for (auto r : d.getEvictionsByReason()) {
        if (r.getCount() == 0) continue;
        reasons += (reasons.empty() ? "" : ", ") + std::string(r.getReason().cStr()) + " " +
                   std::to_string(r.getCount());
      }
      std::printf("    evictions by reason: %s\n", reasons.c_str());
    }
  }
  std::string links;
  for (auto l : s.getSwapsByLink()) {
    links += (links.empty() ? "" : ", ") + std::string(l.getLink().cStr()) + " " +
             std::to_string(l.getSwaps()) + " (" + std::to_string(l.getBytes() >> 20) + " MiB)";
  }
  const auto durations = s.getSwapDuration();
  if (links.empty()) {
    std::printf("  swaps by link: none\n");
  } else {
    std::printf("  swaps by link: %s; %.2f ms each on average\n", links.c_str(),
                durations.getCount() ? 1e3 * durations.getSum() / durations.getCount() : 0.0);
  }
  auto q = s.getScheduler();
  std::printf(
      "  scheduler: placement %s, eviction %s, queue %s%s; since start: %" PRIu64
      " arrived, %" PRIu64 " completed (%" PRIu64 " on time), %" PRIu64
      " shed as overloaded, %" PRIu64 " queued now, %" PRIu64 " background (%" PRIu64
      " preempted); starts: %" PRIu64 " resident, %" PRIu64 " peer, %" PRIu64
      " host; %s; swap groups of %" PRIu64 " KiB; host pool %" PRIu64 " of %" PRIu64 " MiB\n",
      q.getPlacement().cStr(), q.getEviction().cStr(), q.getQueue().cStr(),
      q.getDrainingNode() ? " (draining)" : "", q.getArrivals(), q.getCompleted(), q.getOnTime(),
      q.getShed(), q.getQueued(), q.getBackground(), q.getPreemptions(), q.getResidentStarts(),
      q.getPeerSwaps(), q.getHostSwaps(), count_of(q.getEvictions(), "eviction").c_str(),
      q.getSwapGroupBytes() >> 10, q.getHostPoolUsedBytes() >> 20, q.getHostPoolBytes() >> 20);
  std::printf("  %s\n", count_of(s.getFunctions().size(), "function").c_str());
  for (auto f : s.getFunctions()) {
    std::string gpus;
    for (uint32_t g : f.getResidentGpus()) {
      if (!gpus.empty()) gpus += ',';
      gpus += std::to_string(g);
    }
    // requests and onTime count the scheduler's sliding window (its SLO accounting), not the
    // function's whole life: the scheduler line above has those.
    std::printf("    '%s'%s%s %s, %s: model %" PRIu64
                " MiB (per instance), resident on [%s]; "
                "window: %s, %" PRIu64 " on time, %s\n",
                f.getFunctionId().cStr(), f.getRegistered() ? "" : " (unregistered)",
                f.getStateful() ? " stateful" : "", f.getHeavy() ? "heavy" : "light",
                count_of(f.getInstances(), "instance").c_str(), f.getModelBytes() >> 20,
                gpus.c_str(), count_of(f.getRequests(), "request").c_str(), f.getOnTime(),
                slo_standing(f.getRrc(), f.getRequests()).c_str());
  }
  std::printf("  %s\n", count_of(s.getSessions().size(), "session").c_str());
  for (auto x : s.getSessions()) {
    const std::string gpu =
        x.getBoundGpu() < 0 ? std::string("no GPU") : "on GPU " + std::to_string(x.getBoundGpu());
    const std::string instance =
        x.getInstance().size() == 0 ? "" : str_cat(" instance '", x.getInstance().cStr(), "'");
    std::printf("    session %" PRIu64 " '%s'%s pid %d uid %u, %s: %" PRIu64 " of %" PRIu64
                " MiB, %" PRIu64 " batches, %" PRIu64 " calls (%" PRIu64 " failed), %.1f s\n",
                x.getId(), x.getFunctionId().cStr(), instance.c_str(), x.getPid(), x.getUid(),
                gpu.c_str(), x.getAllocatedBytes() >> 20, x.getQuotaBytes() >> 20, x.getBatches(),
                x.getCalls(), x.getFailedCalls(), x.getConnectedSeconds());
  }
  auto c = s.getCounters();
  std::printf("  counters: sessions opened %" PRIu64 ", closed %" PRIu64
              ", handshakes rejected %" PRIu64 ", malformed messages %" PRIu64
              ", control requests %" PRIu64 "\n",
              c.getSessionsOpened(), c.getSessionsClosed(), c.getHandshakesRejected(),
              c.getMalformedMessages(), c.getControlRequests());
  std::printf("  remoted: %" PRIu64 " calls in %" PRIu64 " batches\n", c.getRemotedCalls(),
              c.getRemotedBatches());
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

// Was the flag given on the command line (rather than left at its default)?
bool given(const char* flag) { return !gflags::GetCommandLineFlagInfoOrDie(flag).is_default; }

Result<std::string> read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return error(ErrorCode::kFileNotFound, "cannot read ", path);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

Result<router::HttpTarget> router_target() {
  std::string url = FLAGS_router;
  if (url.empty()) {
    const char* env = std::getenv("HIBER_ROUTER");
    url = env != nullptr && *env != '\0' ? env : "http://127.0.0.1:8080";
  }
  return router::parse_http_url(url);
}

// The operator token to present to the router, or none when no token file can be read (the
// router's 401 then says what it needs).
std::optional<std::string> router_operator_token() {
  std::string path = FLAGS_router_token_file;
  if (path.empty()) {
    const char* env = std::getenv("HIBER_ROUTER_TOKEN_FILE");
    path = env != nullptr && *env != '\0'
               ? env
               : (FLAGS_run_dir.empty() ? default_run_dir() : FLAGS_run_dir) +
                     "/router/operator-token";
  }
  std::ifstream in(path);
  std::string token;
  if (!std::getline(in, token)) {
    if (!FLAGS_router_token_file.empty()) {
      std::fprintf(stderr, "hiberctl: cannot read --router_token_file %s\n", path.c_str());
    }
    return std::nullopt;
  }
  while (!token.empty() && (token.back() == '\r' || token.back() == ' ')) token.pop_back();
  return token;
}

bool is_router_command(const std::string& command) {
  return command == "functions" || command == "invoke" || command == "load" ||
         command == "unload" || command == "top";
}

Result<std::string> invoke_body(const std::vector<std::string>& args) {
  const bool from_stdin = args.size() == 3 && args[2] == "-";
  if (args.size() > 3 || (args.size() == 3 && !from_stdin)) {
    return Status(ErrorCode::kInvalidValue, "invoke takes FN and optionally '-' (stdin)");
  }
  if (given("data") + !FLAGS_data_file.empty() + from_stdin > 1) {
    return Status(ErrorCode::kInvalidValue, "give one of --data, --data_file and '-'");
  }
  if (!FLAGS_data_file.empty()) return read_file(FLAGS_data_file);
  if (from_stdin) return std::string(std::istreambuf_iterator<char>(std::cin), {});
  return FLAGS_data;
}

Result<nlohmann::json> registration_from_flags() {
  nlohmann::json base;
  if (!FLAGS_file.empty()) {
    HIBER_ASSIGN_OR_RETURN(std::string text, read_file(FLAGS_file));
    base = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (base.is_discarded()) return error(ErrorCode::kInvalidValue, FLAGS_file, " is not JSON");
  }
  tools::RegistrationFlags f;
  if (given("command")) f.command = FLAGS_command;
  if (given("external")) f.external = FLAGS_external;
  if (given("env")) f.env = FLAGS_env;
  if (given("shim")) f.shim = FLAGS_shim;
  if (given("slo_ms")) f.slo_ms = FLAGS_slo_ms;
  if (given("tail")) f.percentile = FLAGS_tail;
  if (given("quota_mib")) f.quota_mib = FLAGS_quota_mib;
  if (given("concurrency")) f.concurrency = FLAGS_concurrency;
  if (given("max_instances")) f.max_instances = FLAGS_max_instances;
  if (given("stateful")) f.stateful = FLAGS_stateful;
  if (given("idle_timeout_s")) f.idle_timeout_s = FLAGS_idle_timeout_s;
  if (given("exec_ms")) f.exec_ms_hint = FLAGS_exec_ms;
  if (FLAGS_heavy == "yes") f.heavy = true;
  if (FLAGS_heavy == "no") f.heavy = false;
  if (!FLAGS_heavy.empty() && !f.heavy) {
    return Status(ErrorCode::kInvalidValue, "--heavy must be yes or no");
  }
  return tools::build_registration(std::move(base), f);
}

int run_router(const std::vector<std::string>& args) {
  // Router commands' errors come without the CUDA error name (tools/router_ctl.h).
  const auto fail = [](const Status& s) { return tools::fail_router_command(s); };
  auto target = router_target();
  if (!target.ok()) return fail(target.status());
  router::HttpConnection connection(*target);
  if (std::optional<std::string> token = router_operator_token()) {
    connection.set_default_headers({{"Authorization", "Bearer " + *token}});
  }
  const auto timeout = std::chrono::milliseconds(FLAGS_timeout_ms);
  const std::string& command = args[0];
  if (command == "functions" || command == "top") {
    if (args.size() != 1)
      return fail(error(ErrorCode::kInvalidValue, command, " takes no argument"));
    if (command == "functions") return tools::ctl_functions(connection, timeout);
    tools::TopLoopOptions o;
    o.interval = std::chrono::milliseconds(std::max(FLAGS_interval_ms, 1));
    o.iterations = FLAGS_iterations;
    o.live = ::isatty(STDOUT_FILENO) && FLAGS_iterations != 1;
    o.timeout = timeout;
    return tools::ctl_top(connection, o);
  }
  if (args.size() < 2) return fail(error(ErrorCode::kInvalidValue, command, " needs FN"));
  const std::string& function = args[1];
  if (command == "invoke") {
    tools::InvokeOptions o;
    o.function = function;
    auto body = invoke_body(args);
    if (!body.ok()) return fail(body.status());
    o.body = std::move(*body);
    o.content_type = FLAGS_content_type;
    o.async = FLAGS_async;
    o.deadline_ms = FLAGS_deadline_ms;
    o.request_id = FLAGS_request_id;
    o.timeout = timeout;
    return tools::ctl_invoke(connection, o);
  }
  if (args.size() != 2) return fail(error(ErrorCode::kInvalidValue, command, " takes only FN"));
  if (command == "load") {
    auto registration = registration_from_flags();
    if (!registration.ok()) return fail(registration.status());
    return tools::ctl_load(connection, function, *registration, timeout);
  }
  return tools::ctl_unload(connection, function, timeout);
}

int run(const std::vector<std::string>& args) {
  if (is_router_command(args[0])) return run_router(args);
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
          if (FLAGS_json) {
            // The schema's own names (wire/schema/control.capnp), every field: for scripts.
            capnp::JsonCodec codec;
            std::printf("%s\n", codec.encode(r.getStatus()).cStr());
          } else {
            print_status(r.getStatus());
          }
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
  if (command == "arrive" || command == "node-invoke") {
    auto function = function_arg();
    if (!function.ok()) return fail(function.status());
    auto id = client->request_arrived(*function);
    // A function whose instance is still connecting: wait for it, if asked to.
    const auto give_up =
        std::chrono::steady_clock::now() + std::chrono::milliseconds(FLAGS_wait_ms);
    while (!id.ok() && id.status().code() == ErrorCode::kDeviceUnavailable &&
           id.status().message().find("no connected instance") != std::string::npos &&
           std::chrono::steady_clock::now() < give_up) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      id = client->request_arrived(*function);
    }
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
    if (!started->link.empty()) std::printf(" over %s", started->link.c_str());
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
  hiber::init_program(
      &argc, &argv,
      "hiberctl: talks to hiber-router's HTTP API and hiberd's control socket.\n"
      "hiber-router (--router):\n"
      "  hiberctl functions\n"
      "  hiberctl invoke FN [--data=S | --data_file=P | -] [--content_type=T]\n"
      "                     [--async] [--deadline_ms=N] [--request_id=ID]\n"
      "  hiberctl load FN --file=R.json | --command=\"...\" | --external "
      "[--slo_ms=MS]\n"
      "                   [--env=K=V,...] [--max_instances=N] ...\n"
      "  hiberctl unload FN\n"
      "  hiberctl top [--interval_ms=1000] [--iterations=N]\n"
      "hiberd (--run_dir, --control_socket):\n"
      "  hiberctl status [--json] | ping\n"
      "  hiberctl register FN --slo_ms=MS [--tail=P] [--quota_mib=N] [--stateful]\n"
      "  hiberctl unregister FN\n"
      "  hiberctl arrive FN | start ID | done ID [--failed] | node-invoke FN [--wait_ms=N]\n"
      "  hiberctl drain [--gpu=N] [--resume]\n"
      "  hiberctl --control=tcp:HOST:PORT --control_token_file=FILE COMMAND ...",
      __FILE__);
  if (argc < 2) {
    std::fprintf(stderr, "usage: hiberctl [flags] COMMAND [ARG] (see --help)\n");
    return 2;
  }
  return hiber::run(std::vector<std::string>(argv + 1, argv + argc));
}
