// hiber-inject: the mutating admission webhook that injects Hiber's shim into function pods
// (docs/deploy.md, "The admission webhook").
#include <csignal>
#include <sstream>

#include <gflags/gflags.h>
#include <glog/logging.h>
#include <boost/asio/io_context.hpp>
#include <boost/asio/signal_set.hpp>

#include "common/cli.h"
#include "common/paths.h"
#include "containers/webhook/admission_review.h"
#include "containers/webhook/tls_server.h"

DEFINE_string(listen, "0.0.0.0:8443", "HTTPS address, host:port (port 0: any free port)");
DEFINE_string(tls_cert_file, "",
              "PEM certificate (then intermediates) for the webhook's Service name; re-read when "
              "it changes");
DEFINE_string(tls_key_file, "", "PEM private key of --tls_cert_file; re-read when it changes");
DEFINE_string(port_file, "", "Once listening, write the HTTPS port here (for scripts and tests)");
DEFINE_string(shim_host_path, "/var/lib/hiber/shim",
              "The node's folder where hiberd's DaemonSet leaves the shim libraries");
DEFINE_string(shim_mount_path, "/opt/hiber/shim", "Where pods see the shim folder (read-only)");
DEFINE_string(shim_libraries,
              "libhibercuda.so,libhibercublas.so,libhibercublasLt.so,libhibercudnn.so,"
              "libhibernvml.so",
              "The shim folder's libraries to preload, comma-separated, in LD_PRELOAD order");
DEFINE_string(run_dir_host_path, "/run/hiber", "hiberd's run directory on the node");
DEFINE_string(run_dir_mount_path, "/run/hiber", "Where pods see hiberd's run directory");
DEFINE_string(token_secret, "hiber-function-token",
              "Secret (in the pod's namespace) holding hiberd's function token");
DEFINE_string(token_secret_key, "auth-token", "The token's key in --token_secret");
DEFINE_string(router_worker_address, "tcp:hiber-router.hiber-system.svc:7071",
              "HIBER_WORKER_SOCKET: where function workers reach hiber-router");
DEFINE_string(worker_token_secret, "hiber-worker-token",
              "Secret (in the pod's namespace) holding the router's worker token");
DEFINE_string(worker_token_secret_key, "worker-token", "The token's key in --worker_token_secret");
DEFINE_uint64(max_body_mib, 8, "Largest AdmissionReview accepted; larger ones get 413");
DEFINE_uint64(max_connections, 1000, "Most open connections; more are closed at once");
DEFINE_uint64(read_timeout_ms, 10000,
              "Time a client has for its TLS handshake, and for sending each whole request");
DEFINE_uint64(idle_connection_timeout_ms, 60000, "An idle keep-alive connection is closed after");

namespace hiber::inject {
namespace {

std::vector<std::string> split_list(const std::string& text) {
  std::vector<std::string> items;
  std::stringstream in(text);
  for (std::string item; std::getline(in, item, ',');) items.push_back(item);
  return items;
}

HttpReply handle(const HttpRequest& request, const InjectConfig& config) {
  if (request.path == "/healthz") {
    if (request.method != "GET")
      return HttpReply{405, "application/json", R"({"error":"GET only"})"};
    return HttpReply{200, "text/plain; charset=utf-8", "ok\n"};
  }
  if (request.path == "/mutate") {
    if (request.method != "POST") {
      return HttpReply{405, "application/json", R"({"error":"POST an AdmissionReview"})"};
    }
    ReviewAnswer answer = review(request.body, config);
    if (answer.http_status != 200) {
      LOG(WARNING) << answer.log;
    } else {
      LOG(INFO) << answer.log;
    }
    return HttpReply{answer.http_status, "application/json", std::move(answer.body)};
  }
  return HttpReply{404, "application/json", R"({"error":"not found: POST /mutate, GET /healthz"})"};
}

int run() {
  InjectConfig config;
  config.shim_host_path = FLAGS_shim_host_path;
  config.shim_mount_path = FLAGS_shim_mount_path;
  config.shim_libraries = split_list(FLAGS_shim_libraries);
  config.run_dir_host_path = FLAGS_run_dir_host_path;
  config.run_dir_mount_path = FLAGS_run_dir_mount_path;
  config.token_secret = FLAGS_token_secret;
  config.token_secret_key = FLAGS_token_secret_key;
  config.router_worker_address = FLAGS_router_worker_address;
  config.worker_token_secret = FLAGS_worker_token_secret;
  config.worker_token_secret_key = FLAGS_worker_token_secret_key;
  if (Status valid = check_config(config); !valid.ok()) {
    LOG(ERROR) << valid.message();
    return 2;
  }

  TlsServerOptions options;
  options.listen = FLAGS_listen;
  options.cert_file = FLAGS_tls_cert_file;
  options.key_file = FLAGS_tls_key_file;
  options.max_body_bytes = FLAGS_max_body_mib << 20;
  options.max_connections = FLAGS_max_connections;
  options.read_timeout = std::chrono::milliseconds(FLAGS_read_timeout_ms);
  options.idle_timeout = std::chrono::milliseconds(FLAGS_idle_connection_timeout_ms);

  boost::asio::io_context io(1);
  Result<std::unique_ptr<TlsServer>> server = TlsServer::create(
      io, options, [&config](const HttpRequest& request) { return handle(request, config); });
  if (!server.ok()) {
    LOG(ERROR) << server.status().message();
    return 2;
  }
  const uint16_t port = (*server)->port();
  if (!FLAGS_port_file.empty()) {
    if (Status written = write_port_file(FLAGS_port_file, port); !written.ok()) {
      LOG(ERROR) << written;
      return 1;
    }
  }
  LOG(INFO) << "hiber-inject listening on https://"
            << FLAGS_listen.substr(0, FLAGS_listen.rfind(':')) << ":" << port
            << " (POST /mutate, GET /healthz)";

  boost::asio::signal_set signals(io, SIGTERM, SIGINT);
  signals.async_wait([&](boost::system::error_code ec, int signal) {
    if (ec) return;
    LOG(INFO) << "signal " << signal << ": stopping";
    (*server)->stop();
    io.stop();
  });
  io.run();
  return 0;
}

}  // namespace
}  // namespace hiber::inject

int main(int argc, char** argv) {
  hiber::init_program(&argc, &argv,
                      "hiber-inject: the mutating admission webhook (AdmissionReview v1 over "
                      "HTTPS) that injects Hiber's shim into pods labelled hiber.io/inject=true.\n"
                      "Usage: hiber-inject --tls_cert_file=CERT.pem --tls_key_file=KEY.pem "
                      "[--listen=HOST:PORT]",
                      __FILE__);
  return hiber::inject::run();
}
