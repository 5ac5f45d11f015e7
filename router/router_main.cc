// hiber-router: the node's invocation API (docs/router.md).
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include <gflags/gflags.h>
#include <glog/logging.h>
#include <boost/asio/io_context.hpp>
#include <boost/asio/signal_set.hpp>
#include <nlohmann/json.hpp>

#include "common/cli.h"
#include "common/paths.h"
#include "common/token.h"
#include "router/http_server.h"
#include "router/router.h"
#include "router/status_page.h"

DEFINE_string(listen, "127.0.0.1:8080", "HTTP address, host:port (port 0: any free port)");
DEFINE_string(port_file, "", "Once listening, write the HTTP port here (for scripts and tests)");
DEFINE_string(run_dir, "",
              "hiberd's run directory, the one node fronted without --config "
              "(default: hiberd's default)");
DEFINE_string(config, "",
              "JSON file listing the nodes: {\"nodes\": [{\"name\", \"control\", \"run_dir\", "
              "\"token_file\"}]} (docs/router.md)");
DEFINE_string(state_dir, "",
              "The registry, worker sockets and worker logs (default: <run_dir>/router)");
DEFINE_string(shim_dir, "",
              "Hiber's client libraries, preloaded into functions registered with shim: true "
              "(default: ../client_shim beside this program, if there)");
DEFINE_string(shim_preload, "",
              "The LD_PRELOAD value for shim: true, space-separated (overrides --shim_dir)");
DEFINE_uint64(max_body_mib, 64, "Largest request body; larger ones get 413");
DEFINE_uint64(read_timeout_ms, 10000, "Time a client has to send a whole request (else 408)");
DEFINE_uint64(idle_connection_timeout_ms, 60000, "An idle keep-alive connection is closed after");
DEFINE_uint64(max_connections, 10000, "Most open HTTP connections; more get 503");
DEFINE_uint64(max_queue, 1024, "Requests a function may have waiting at the router (else 429)");
DEFINE_uint64(worker_start_timeout_ms, 60000, "Time a new worker has to connect");
DEFINE_uint64(worker_stop_timeout_ms, 5000, "Time a stopped worker has before SIGKILL");
DEFINE_uint64(status_interval_ms, 1000, "How often each node's status is read");
DEFINE_uint64(node_wait_ms, 5000,
              "How long a request waits for a hiberd node to answer (one restarting) before it is "
              "answered 503; 0: at once");
DEFINE_uint64(worker_resume_ms, 15000,
              "After a node's hiberd restarts or goes down, how long its GPU workers have to "
              "resume their sessions with it before they are replaced");
DEFINE_uint64(async_result_ttl_s, 600, "How long an asynchronous result waits to be collected");
DEFINE_string(worker_attach_socket, "attach.sock",
              "Unix socket where workers of functions registered with external: true attach "
              "(docs/router.md, \"Attached workers\"); relative to --state_dir; empty: none");
DEFINE_string(worker_attach_listen, "",
              "HOST:PORT where such workers attach over TCP (port 0: any free port); empty: none");
DEFINE_string(worker_attach_port_file, "",
              "Once listening, write the TCP attach port here (for scripts and tests)");
DEFINE_string(worker_token_file, "worker-token",
              "The token attached workers present in their hello: its first line, created "
              "(random, mode 0600) if missing; relative to --state_dir");
DEFINE_uint64(worker_attach_max_pending, 64,
              "Most attach connections waiting for their hello at once; more are closed");
DEFINE_string(operator_token_file, "operator-token",
              "The operator's credential: the repository API (load, unload, index) needs "
              "\"Authorization: Bearer <its first line>\"; created (random, mode 0600) if "
              "missing; relative to --state_dir");
DEFINE_string(worker_programs, "",
              "Comma-separated programs that registrations may name as their command's program "
              "(each an executable file; a registration naming any other is refused with 403); "
              "empty: the router starts no program, functions must be external");
DEFINE_bool(allow_root, false,
            "Run as root although the workers it starts would run as root too (refused "
            "otherwise: give the router a user of its own)");
DEFINE_uint64(worker_hello_timeout_ms, 10000,
              "Time an attach connection has to send its hello before it is closed");

namespace hiber::router {
namespace {

namespace fs = std::filesystem;

Result<std::vector<NodeConfig>> read_nodes() {
  if (FLAGS_config.empty()) {
    const std::string run_dir = FLAGS_run_dir.empty() ? default_run_dir() : FLAGS_run_dir;
    return std::vector<NodeConfig>{{"node0", control_socket_path(run_dir), run_dir, ""}};
  }
  std::ifstream in(FLAGS_config);
  std::stringstream text;
  text << in.rdbuf();
  if (!in) return error(ErrorCode::kFileNotFound, "cannot read --config ", FLAGS_config);
  const nlohmann::json config = nlohmann::json::parse(text.str(), nullptr, false);
  if (config.is_discarded() || !config.is_object() || !config.contains("nodes") ||
      !config["nodes"].is_array() || config["nodes"].empty()) {
    return error(ErrorCode::kInvalidValue, FLAGS_config,
                 ": expected {\"nodes\": [{\"name\", \"control\", \"run_dir\"}, ...]}");
  }
  std::vector<NodeConfig> nodes;
  for (const auto& node : config["nodes"]) {
    NodeConfig c;
    auto text_field = [&](const char* key, std::string& out, bool required) -> Status {
      if (!node.is_object() || !node.contains(key)) {
        return required
                   ? error(ErrorCode::kInvalidValue, FLAGS_config, ": a node lacks \"", key, "\"")
                   : Status();
      }
      if (!node[key].is_string()) {
        return error(ErrorCode::kInvalidValue, FLAGS_config, ": \"", key, "\" is not a string");
      }
      out = node[key].get<std::string>();
      return Status();
    };
    HIBER_RETURN_IF_ERROR(text_field("name", c.name, true));
    HIBER_RETURN_IF_ERROR(text_field("run_dir", c.run_dir, true));
    HIBER_RETURN_IF_ERROR(text_field("control", c.control, false));
    HIBER_RETURN_IF_ERROR(text_field("token_file", c.token_file, false));
    if (c.control.empty()) c.control = control_socket_path(c.run_dir);
    nodes.push_back(std::move(c));
  }
  return nodes;
}

std::string shim_preload(const char* argv0) {
  if (!FLAGS_shim_preload.empty()) return FLAGS_shim_preload;
  fs::path dir = FLAGS_shim_dir;
  if (dir.empty()) {
    std::error_code ec;
    const fs::path self = fs::read_symlink("/proc/self/exe", ec);
    dir = (ec ? fs::path(argv0) : self).parent_path().parent_path() / "client_shim";
  }
  std::string preload;
  for (const char* library : {"libhibercuda.so", "libhibercublas.so", "libhibercublasLt.so",
                              "libhibercudnn.so", "libhibernvml.so"}) {
    const fs::path path = fs::absolute(dir / library);
    if (fs::exists(path)) preload += (preload.empty() ? "" : " ") + path.string();
  }
  if (preload.empty() && !FLAGS_shim_dir.empty()) {
    LOG(WARNING) << "--shim_dir " << FLAGS_shim_dir << " holds no Hiber client library";
  }
  return preload;
}

int run(const char* argv0) {
  if (::geteuid() == 0 && !FLAGS_allow_root) {
    LOG(ERROR) << "hiber-router refuses to run as root: the workers it starts would run as root. "
                  "Run it as a user of its own (docs/deploy.md), or give --allow_root";
    return 2;
  }
  if (::geteuid() == 0) LOG(WARNING) << "running as root (--allow_root): so do its workers";
  Result<WorkerPrograms> programs = WorkerPrograms::parse(FLAGS_worker_programs);
  if (!programs.ok()) {
    LOG(ERROR) << programs.status();
    return 2;
  }
  Result<std::vector<NodeConfig>> nodes = read_nodes();
  if (!nodes.ok()) {
    LOG(ERROR) << nodes.status();
    return 2;
  }
  RouterOptions options;
  options.nodes = std::move(*nodes);
  options.state_dir = FLAGS_state_dir.empty()
                          ? (fs::path(options.nodes[0].run_dir) / "router").string()
                          : FLAGS_state_dir;
  options.shim_preload = shim_preload(argv0);
  options.worker_programs = std::move(*programs);
  std::string allowed;
  for (const std::string& p : options.worker_programs.programs()) allowed += " " + p;
  LOG(INFO) << "workers may run:"
            << (allowed.empty() ? " no program (external functions only)" : allowed);
  options.max_queue = FLAGS_max_queue;
  options.worker_start_timeout = std::chrono::milliseconds(FLAGS_worker_start_timeout_ms);
  options.worker_stop_timeout = std::chrono::milliseconds(FLAGS_worker_stop_timeout_ms);
  options.node_wait = std::chrono::milliseconds(FLAGS_node_wait_ms);
  options.worker_resume = std::chrono::milliseconds(FLAGS_worker_resume_ms);
  options.status_interval =
      std::chrono::milliseconds(std::max<uint64_t>(FLAGS_status_interval_ms, 10));
  options.async_result_ttl = std::chrono::seconds(FLAGS_async_result_ttl_s);
  const auto in_state_dir = [&](const std::string& path) {
    return path.empty() ? path : (fs::path(options.state_dir) / path).string();
  };
  options.attach.unix_path = in_state_dir(FLAGS_worker_attach_socket);
  options.attach.tcp_listen = FLAGS_worker_attach_listen;
  options.attach.max_pending = std::max<uint64_t>(FLAGS_worker_attach_max_pending, 1);
  options.attach.hello_timeout = std::chrono::milliseconds(FLAGS_worker_hello_timeout_ms);
  std::error_code ec;
  fs::create_directories(options.state_dir, ec);  // a token may be the first file there
  Result<std::string> operator_token =
      load_or_create_token(in_state_dir(FLAGS_operator_token_file));
  if (!operator_token.ok()) {
    LOG(ERROR) << operator_token.status().with_context("--operator_token_file");
    return 1;
  }
  options.operator_token = std::move(*operator_token);
  if (!options.attach.unix_path.empty() || !options.attach.tcp_listen.empty()) {
    Result<std::string> token = load_or_create_token(in_state_dir(FLAGS_worker_token_file));
    if (!token.ok()) {
      LOG(ERROR) << token.status().with_context("--worker_token_file");
      return 1;
    }
    options.attach.token = std::move(*token);
  }

  boost::asio::io_context io(1);
  Result<std::unique_ptr<Router>> router = Router::create(io, options);
  if (!router.ok()) {
    LOG(ERROR) << router.status();
    return 1;
  }
  Router& core = **router;
  HttpServerOptions http;
  http.listen = FLAGS_listen;
  http.max_body_bytes = FLAGS_max_body_mib << 20;
  http.read_timeout = std::chrono::milliseconds(FLAGS_read_timeout_ms);
  http.idle_timeout = std::chrono::milliseconds(FLAGS_idle_connection_timeout_ms);
  http.max_connections = FLAGS_max_connections;
  HttpServer* server_ptr = nullptr;
  Result<std::unique_ptr<HttpServer>> server =
      HttpServer::create(io, http, [&core, &server_ptr](ApiRequest request, Respond respond) {
        if (request.path == "/" || request.path == "/index.html") {
          if (request.method != "GET") return respond(error_response(405, "GET only"));
          return respond(
              ApiResponse{200, "text/html; charset=utf-8", {}, std::string(status_page_html())});
        }
        if (request.path == "/metrics") {
          if (request.method != "GET") return respond(error_response(405, "GET only"));
          if (server_ptr != nullptr) {
            core.metrics().set_connections(static_cast<double>(server_ptr->connections()));
          }
          return respond(ApiResponse{
              200, "text/plain; version=0.0.4; charset=utf-8", {}, core.metrics().serialize()});
        }
        core.handle(std::move(request), std::move(respond));
      });
  if (!server.ok()) {
    LOG(ERROR) << server.status();
    return 1;
  }
  server_ptr = server->get();
  const uint16_t port = (*server)->port();
  if (!FLAGS_port_file.empty()) {
    if (Status written = write_port_file(FLAGS_port_file, port); !written.ok()) {
      LOG(ERROR) << written;
      return 1;
    }
  }
  LOG(INFO) << "hiber-router listening on http://"
            << FLAGS_listen.substr(0, FLAGS_listen.rfind(':')) << ":" << port << " (state in "
            << options.state_dir << ")";
  if (const uint16_t attach_port = core.attach_port(); attach_port != 0) {
    LOG(INFO) << "workers attach over TCP on port " << attach_port;
    if (!FLAGS_worker_attach_port_file.empty()) {
      if (Status written = write_port_file(FLAGS_worker_attach_port_file, attach_port);
          !written.ok()) {
        LOG(ERROR) << written;
        return 1;
      }
    }
  }
  core.start();

  boost::asio::signal_set signals(io, SIGTERM, SIGINT);
  bool stopping = false;
  signals.async_wait([&](boost::system::error_code ec, int signal) {
    if (ec || stopping) return;
    stopping = true;
    LOG(INFO) << "signal " << signal << ": stopping";
    (*server)->stop();
    core.shutdown([&io] { io.stop(); });
  });
  io.run();
  return 0;
}

}  // namespace
}  // namespace hiber::router

int main(int argc, char** argv) {
  hiber::init_program(&argc, &argv,
                      "hiber-router: the node's invocation API (KServe Open Inference Protocol v2 "
                      "over HTTP), function registry and workers, metrics and status page.\n"
                      "Usage: hiber-router [--listen=HOST:PORT] [--run_dir=DIR | --config=FILE]",
                      __FILE__);
  return hiber::router::run(argv[0]);
}
