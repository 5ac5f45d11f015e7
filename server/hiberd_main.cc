// hiberd: Hiber's GPU server. One per node; functions' CUDA calls execute here.
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <sstream>

#include <gflags/gflags.h>
#include <glog/logging.h>

#include "common/cli.h"
#include "common/node_config.h"
#include "common/paths.h"
#include "server/auth.h"
#include "server/daemon.h"
#include "server/device/sim_device.h"
#include "server/session_store.h"
#include "wire/control_client.h"
#if HIBER_HAVE_CUDA
#include "server/device/cuda_device.h"
#endif

DEFINE_string(device, "cuda",
              "GPU backend: 'cuda' (the node's GPUs through the CUDA driver) or 'sim' (simulated "
              "GPUs in host memory, for machines without a GPU)");
DEFINE_string(node_config, "",
              "Node config: a JSON file (see configs/nodes/) or an embedded one by name "
              "(nvswitch-8gpu, torpor-4gpu). For --device=sim it defines the simulated GPUs and "
              "links (default: nvswitch-8gpu, 8 H100s; torpor-4gpu is the paper's 4x V100 "
              "node); for --device=cuda it overrides the discovered topology's bandwidths");
DEFINE_string(cuda_library_path, "/usr/local/cuda/lib64",
              "With --device=cuda, folders (colon-separated) searched for the real "
              "libcublas.so.13, libcublasLt.so.13 and libcudnn.so.9 after the loader's default "
              "search path (LD_LIBRARY_PATH, ldconfig); they are opened when a client first uses "
              "them, and a missing one fails only that library's handles");
DEFINE_bool(sim_throttle, false,
            "With --device=sim, slow copies to the config's PCIe and NVLink bandwidths");
DEFINE_string(sim_kernel_plugins, "",
              "With --device=sim, comma-separated shared libraries with host implementations of "
              "kernels (server/device/sim_kernel_plugin.h)");
DEFINE_int32(sim_workers_per_gpu, 2, "With --device=sim, worker threads per simulated GPU");
DEFINE_string(run_dir, "",
              "Directory for the sockets and the auth token (default: $HIBER_RUN_DIR, else "
              "/run/hiber as root, else /tmp/hiber-<uid>)");
DEFINE_string(socket, "", "Function socket (default: <run_dir>/hiberd.sock)");
DEFINE_string(control_socket, "", "Control socket (default: <run_dir>/control.sock)");
DEFINE_string(auth_token_file, "",
              "File holding the token functions must present; created with a random token if "
              "missing (default: <run_dir>/auth-token)");
DEFINE_string(control_tcp_listen, "",
              "Also serve the control protocol on this TCP address, host:port (e.g. "
              "0.0.0.0:7070; port 0 picks a free port, see --control_tcp_port_file), for a "
              "router on another machine; every request there must carry the token of "
              "--control_token_file. Default: off (the Unix control socket only)");
DEFINE_string(control_tcp_port_file, "",
              "With --control_tcp_listen, write the bound TCP port to this file once listening");
DEFINE_string(control_token_file, "",
              "File whose first line is the control token every control request must carry, on "
              "the Unix control socket and over --control_tcp_listen (where it must be given); "
              "it must not be readable by others. Default: control-token beside the control "
              "socket, created with a random token (mode 0600) if missing");
DEFINE_uint64(control_idle_timeout_ms, 60000,
              "A control connection that sends no request for this long is closed");
DEFINE_uint64(max_pending_connections, 256,
              "Most connections waiting to become sessions or between control requests; past it "
              "the oldest that has proven nothing (no Hello, no control token) is dropped, or "
              "the new one refused if none");
DEFINE_uint64(max_pending_per_peer, 128,
              "Most of those one peer may hold (a uid on the Unix sockets, an address over TCP)");
DEFINE_uint32(io_queue_depth, 1024, "Entries of hiberd's io_uring submission queue");
DEFINE_uint32(io_completion_entries, 0,
              "Entries of its completion queue, at least --io_queue_depth (0: twice that)");
DEFINE_string(allowed_uids, "",
              "Comma-separated uids allowed to connect (default: root and hiberd's own uid)");
DEFINE_uint64(default_quota_mib, 0,
              "Device memory per session when a function asks for none (0: one GPU's pool)");
DEFINE_uint64(max_quota_mib, 0,
              "The most device memory a function may ask for (0: one GPU's pool)");
DEFINE_uint64(max_registered_functions, 4096,
              "The most functions registered at once; registerFunction past it is refused "
              "(0: no cap)");
DEFINE_uint32(max_instances_per_function, 64,
              "The most connected instances (sessions) of one registered function; a session "
              "past it is refused (0: no cap)");
// What one client may make hiberd hold (docs/hiberd.md, "Limits").
DEFINE_uint64(session_max_queued_mib, 16384,
              "The most bytes of copies and memsets one session may have queued on its GPU and "
              "not finished, MiB; a copy or memset past it fails (0: no cap)");
DEFINE_uint64(session_max_queue_age_ms, 120000,
              "GPU work a session queued this long ago and not finished makes its next GPU call "
              "fail: how far behind a session may let its GPU fall (0: no cap)");
DEFINE_uint64(session_max_module_mib, 4096,
              "The most bytes of code images (fatbins, cubins, PTX) one session may hold loaded, "
              "MiB (0: no cap)");
DEFINE_uint64(max_module_mib, 16384,
              "The most bytes of distinct code images hiberd keeps loaded for all sessions, MiB "
              "(0: no cap)");
// Late binding (docs/hiberd.md, "Late binding").
DEFINE_string(placement, "algorithm1",
              "GPU choice per request: algorithm1 (Torpor's Algorithm 1) "
              "or random (the Torpor-Random ablation)");
DEFINE_string(eviction, "heaviness",
              "Which models leave a full GPU: heaviness (Torpor), lru, lfu, "
              "random, mcache, cremebrulee or slack (keeps models whose host load would "
              "take most of their SLO)");
DEFINE_string(queue, "rrc", "Request order: rrc (Torpor's SLO-aware queue), fifo or gshare");
DEFINE_string(shed, "none",
              "Admission: none, late (answer 'overloaded' to a request that cannot meet its "
              "deadline even if started now) or hopeless (also when the host swap alone ends "
              "past it and no GPU holds the model)");
DEFINE_string(sharing, "off",
              "Spatial sharing (several functions on one GPU at once): off; any other value is "
              "refused at start with the reason (docs/hiberd.md, \"Spatial sharing\")");
DEFINE_string(prewarm, "none",
              "Prewarming from predicted arrivals: only none here (histogram is hiber-sim's; "
              "hiberd loads a model only into a function session's lease)");
DEFINE_uint64(scheduler_seed, 1, "Seed of the scheduler's random choices (random policies)");
DEFINE_string(memory_pool, "buddy",
              "GPU memory management: buddy (pools reserved at start), block "
              "(Torpor-Block: a cache of device allocations) or naive (one "
              "device allocation per block)");
DEFINE_uint64(gpu_reserve_mib, 512,
              "GPU memory left out of the pool (driver, contexts, libraries)");
DEFINE_uint64(pool_chunk_mib, 4096, "Size of the chunks each GPU's pool is reserved in");
DEFINE_uint64(host_pool_chunk_mib, 1024,
              "Host memory for model copies is pinned in chunks of this");
DEFINE_uint64(host_pool_max_mib, 65536, "The most host memory model copies may take");
DEFINE_bool(pinned_host_copies, true,
            "Keep model copies in pinned host memory (false: pageable, "
            "for the swap ablation)");
DEFINE_uint64(swap_group_kib, 0,
              "Bytes per swap transfer group, KiB; 0 = the elbow hiberd "
              "measures on this node (see --elbow_cache)");
DEFINE_string(elbow_cache, "", "File remembering the measured elbow (default: <run_dir>/elbow)");
DEFINE_bool(pipelined, true,
            "Kernels wait only for the swap groups their arguments touch (false: "
            "for the whole model)");
DEFINE_double(session_va_factor, 0,
              "A session's device address range as a multiple of its quota (1.25 to 64): room for "
              "client virtual memory reservations, such as PyTorch's expandable segments, which "
              "reserve 1.125 times the device's memory per stream. 0: 2.5 with --device=cuda (GPU "
              "addresses cost nothing), 1.25 with --device=sim (whose device addresses are "
              "hiberd's own address space, shared by every session)");
DEFINE_uint64(implicit_lease_idle_us, 5000,
              "A GPU used outside any request goes back after this long without a GPU call");
DEFINE_uint64(kernel_deadline_ms, 10000,
              "The longest one kernel may run (a registered function gets at least its SLO); a "
              "kernel past it is stopped and its function's later calls fail with "
              "CUDA_ERROR_LAUNCH_TIMEOUT. 0 = no limit");
DEFINE_string(isolation, "context",
              "context: each function instance runs in a CUDA context of its own on each GPU, so "
              "a fault of its kernels fails that instance only; shared: every instance runs in "
              "its GPU's primary context (no memory per instance, but a fault fails every "
              "instance on that GPU; trusted nodes only)");
DEFINE_int32(contexts_ready_per_gpu, 1,
             "With --isolation=context, contexts made ahead per GPU, so making one is off the "
             "request path (each costs GPU memory)");
DEFINE_uint64(lease_slice_ms, 100,
              "An implicit lease (GPU use outside any request) held this long gives the GPU up "
              "when other functions wait for one; the function's next GPU call waits for a new "
              "lease. 0 = never preempt");
DEFINE_double(default_slo_ms, 10000, "The SLO of functions that connect without being registered");
DEFINE_int32(sim_fail_transfers_to_gpu, -1,
             "With --device=sim, fault injection: host-to-GPU transfers to this GPU fail after "
             "--sim_fail_after_transfers of them (for fault tests)");
DEFINE_uint64(sim_fail_after_transfers, 0, "See --sim_fail_transfers_to_gpu");
DEFINE_uint64(request_ring_kib, 1024, "Request ring per session, KiB (a power of two)");
DEFINE_uint64(completion_ring_kib, 256, "Completion ring per session, KiB (a power of two)");
DEFINE_uint64(arena_mib, 64, "Bulk data arena per session, MiB");
DEFINE_uint64(max_message_mib, 16, "Largest message a client may send, MiB");
DEFINE_uint64(max_sessions, 1024, "Most sessions served at once; more are refused");
DEFINE_uint64(handshake_timeout_ms, 5000, "Time a new connection has to say Hello");
DEFINE_uint64(shutdown_timeout_ms, 30000,
              "On SIGTERM, how long sessions may take to finish their device work before hiberd "
              "exits without them (a second signal exits at once)");
DEFINE_bool(keep_sessions, true,
            "Keep what a restarted hiberd needs to resume its functions' sessions (the model "
            "repository's host copies and one record per session) in --state_dir; false: a "
            "restart ends every session");
DEFINE_string(state_dir, "",
              "Where sessions are kept across restarts; best on a tmpfs that outlives hiberd's "
              "process (the host copies are as large as the models). Empty: <run_dir>/state");
DEFINE_uint64(resume_window_ms, 600000,
              "After a restart, how long a kept session waits for its client to resume it before "
              "it is dropped");
DEFINE_string(metrics_listen, "",
              "Serve Prometheus metrics (GET /metrics) on this host:port, e.g. 127.0.0.1:9400; "
              "port 0 picks a free one (logged, and written to --metrics_port_file). Empty: off");
DEFINE_string(metrics_port_file, "",
              "With --metrics_listen, write the port /metrics listens on to this file once it "
              "listens");

namespace hiber {
namespace {

std::vector<std::string> split_list(const std::string& list, char separator) {
  std::vector<std::string> items;
  std::stringstream in(list);
  for (std::string item; std::getline(in, item, separator);) {
    if (!item.empty()) items.push_back(item);
  }
  return items;
}

Result<std::unique_ptr<device::Device>> make_device() {
  std::optional<NodeConfig> node;
  if (!FLAGS_node_config.empty()) {
    auto loaded = node_config_by_name_or_path(FLAGS_node_config);
    if (!loaded.ok()) return loaded.status();
    node = std::move(loaded).value();
  }
  if (FLAGS_device == "sim") {
    device::SimDeviceOptions options;
    if (node) options.node = *node;
    options.throttle_copies = FLAGS_sim_throttle;
    options.workers_per_gpu = FLAGS_sim_workers_per_gpu;
    options.kernel_plugins = split_list(FLAGS_sim_kernel_plugins, ',');
    options.fail_transfers_to_gpu = FLAGS_sim_fail_transfers_to_gpu;
    options.fail_after_transfers = FLAGS_sim_fail_after_transfers;
    auto sim = device::SimDevice::create(options);
    if (!sim.ok()) return sim.status();
    return std::unique_ptr<device::Device>(std::move(sim).value());
  }
  if (FLAGS_device == "cuda") {
#if HIBER_HAVE_CUDA
    device::CudaDeviceOptions options;
    options.node = node;
    options.libraries.folders = split_list(FLAGS_cuda_library_path, ':');
    auto cuda = device::create_cuda_device(options);
    if (!cuda.ok()) {
      return cuda.status().with_context(
          "no usable GPU (use --device=sim to run on simulated GPUs)");
    }
    return cuda;
#else
    return Status(ErrorCode::kNotSupported,
                  "this hiberd was built without the CUDA toolkit; use --device=sim");
#endif
  }
  return error(ErrorCode::kInvalidValue, "--device must be 'cuda' or 'sim', not '", FLAGS_device,
               "'");
}

Result<server::DaemonOptions> make_options(const std::string& run_dir) {
  server::DaemonOptions options;
  options.socket_path = FLAGS_socket.empty() ? function_socket_path(run_dir) : FLAGS_socket;
  options.control_socket_path =
      FLAGS_control_socket.empty() ? control_socket_path(run_dir) : FLAGS_control_socket;
  auto token = load_or_create_token(FLAGS_auth_token_file.empty() ? auth_token_path(run_dir)
                                                                  : FLAGS_auth_token_file);
  if (!token.ok()) return token.status();
  options.auth_token = *token;
  options.control_tcp_listen = FLAGS_control_tcp_listen;
  if (!FLAGS_control_tcp_listen.empty()) {
    // The token must travel to the router's machine: the operator picks it, not hiberd.
    if (FLAGS_control_token_file.empty()) {
      return Status(ErrorCode::kInvalidValue,
                    "--control_tcp_listen needs --control_token_file: the TCP control listener "
                    "admits only requests that carry the control token");
    }
  } else if (!FLAGS_control_tcp_port_file.empty()) {
    return Status(ErrorCode::kInvalidValue, "--control_tcp_port_file needs --control_tcp_listen");
  }
  if (FLAGS_control_token_file.empty()) {
    auto control_token = load_or_create_token(control_token_path(options.control_socket_path));
    if (!control_token.ok()) return control_token.status().with_context("the control token");
    options.control_token = *control_token;
  } else {
    auto control_token = wire::read_token_file(FLAGS_control_token_file);
    if (!control_token.ok()) return control_token.status().with_context("--control_token_file");
    options.control_token = *control_token;
  }
  options.control_idle_timeout = std::chrono::milliseconds(FLAGS_control_idle_timeout_ms);
  options.max_pending_connections = FLAGS_max_pending_connections;
  options.max_pending_per_peer = FLAGS_max_pending_per_peer;
  options.io_queue_depth = FLAGS_io_queue_depth;
  options.io_completion_entries = FLAGS_io_completion_entries;
  if (FLAGS_allowed_uids.empty()) {
    options.allowed_uids = {0, ::geteuid()};
  } else {
    auto uids = server::parse_uid_list(FLAGS_allowed_uids);
    if (!uids.ok()) return uids.status().with_context("--allowed_uids");
    options.allowed_uids = *uids;
  }
  server::ControllerOptions& c = options.controller;
  c.default_quota_bytes = FLAGS_default_quota_mib << 20;
  c.max_quota_bytes = FLAGS_max_quota_mib << 20;
  c.max_registered_functions = FLAGS_max_registered_functions;
  c.max_instances_per_function = FLAGS_max_instances_per_function;
  c.scheduler.placement = FLAGS_placement;
  c.scheduler.eviction = FLAGS_eviction;
  c.scheduler.queue = FLAGS_queue;
  c.scheduler.seed = FLAGS_scheduler_seed;
  auto shed = scheduler::shed_rule_from_name(FLAGS_shed);
  if (!shed.ok()) return shed.status().with_context("--shed");
  c.scheduler.shed = *shed;
  c.scheduler.sharing = FLAGS_sharing;
  auto prewarm = scheduler::prewarm_rule_from_name(FLAGS_prewarm);
  if (!prewarm.ok()) return prewarm.status().with_context("--prewarm");
  c.scheduler.prewarm = *prewarm;
  auto pool = memory::parse_pool_kind(FLAGS_memory_pool);
  if (!pool.ok()) return pool.status().with_context("--memory_pool");
  c.pools.kind = *pool;
  c.pools.reserve_bytes = FLAGS_gpu_reserve_mib << 20;
  c.pools.chunk_bytes = FLAGS_pool_chunk_mib << 20;
  c.repository.chunk_bytes = FLAGS_host_pool_chunk_mib << 20;
  c.repository.max_bytes = FLAGS_host_pool_max_mib << 20;
  c.repository.pinned = FLAGS_pinned_host_copies;
  c.swap_group_bytes = FLAGS_swap_group_kib << 10;
  c.elbow_cache = FLAGS_elbow_cache.empty() ? run_dir + "/elbow" : FLAGS_elbow_cache;
  c.pipelined = FLAGS_pipelined;
  if (!(FLAGS_default_slo_ms > 0)) {
    return error(ErrorCode::kInvalidValue, "--default_slo_ms must be positive");
  }
  c.default_slo = static_cast<scheduler::Duration>(FLAGS_default_slo_ms * 1e6);
  constexpr uint64_t kMaxMs = uint64_t{1} << 40;  // far beyond any use; keeps the nanoseconds exact
  if (FLAGS_kernel_deadline_ms > kMaxMs || FLAGS_lease_slice_ms > kMaxMs) {
    return error(ErrorCode::kInvalidValue,
                 "--kernel_deadline_ms and --lease_slice_ms must be at most ", kMaxMs);
  }
  c.kernel_deadline = static_cast<scheduler::Duration>(FLAGS_kernel_deadline_ms) * 1'000'000;
  c.lease_slice = static_cast<scheduler::Duration>(FLAGS_lease_slice_ms) * 1'000'000;
  options.implicit_lease_idle = std::chrono::microseconds(FLAGS_implicit_lease_idle_us);
  if (FLAGS_session_va_factor != 0 &&
      !(FLAGS_session_va_factor >= 1.25 && FLAGS_session_va_factor <= 64)) {
    return error(ErrorCode::kInvalidValue,
                 "--session_va_factor must be 0 (automatic) or between 1.25 and 64, not ",
                 FLAGS_session_va_factor);
  }
  options.session_va_factor = FLAGS_session_va_factor != 0 ? FLAGS_session_va_factor
                              : FLAGS_device == "sim"      ? 1.25
                                                           : 2.5;
  HIBER_ASSIGN_OR_RETURN(options.isolation, server::parse_isolation(FLAGS_isolation));
  c.isolation = options.isolation;
  if (FLAGS_contexts_ready_per_gpu < 0 || FLAGS_contexts_ready_per_gpu > 64) {
    return error(ErrorCode::kInvalidValue, "--contexts_ready_per_gpu must be in 0..64");
  }
  options.contexts_ready_per_gpu = FLAGS_contexts_ready_per_gpu;
  options.session_limits.max_queued_bytes = FLAGS_session_max_queued_mib << 20;
  options.session_limits.max_queue_age = std::chrono::milliseconds(FLAGS_session_max_queue_age_ms);
  options.session_limits.max_module_bytes = FLAGS_session_max_module_mib << 20;
  options.max_module_bytes = FLAGS_max_module_mib << 20;
  options.channel.request_ring_bytes = FLAGS_request_ring_kib << 10;
  options.channel.completion_ring_bytes = FLAGS_completion_ring_kib << 10;
  options.channel.arena_bytes = FLAGS_arena_mib << 20;
  options.channel.max_message_bytes = FLAGS_max_message_mib << 20;
  if (auto layout = wire::make_layout(options.channel); !layout.ok()) {
    return layout.status().with_context("channel sizes");
  }
  options.max_sessions = FLAGS_max_sessions;
  options.handshake_timeout = std::chrono::milliseconds(FLAGS_handshake_timeout_ms);
  options.shutdown_timeout = std::chrono::milliseconds(FLAGS_shutdown_timeout_ms);
  if (FLAGS_keep_sessions) {
    options.state_dir = FLAGS_state_dir.empty() ? run_dir + "/state" : FLAGS_state_dir;
  }
  options.resume_window = std::chrono::milliseconds(FLAGS_resume_window_ms);
  options.metrics_listen = FLAGS_metrics_listen;
  options.metrics_port_file = FLAGS_metrics_port_file;
  if (options.metrics_listen.empty() && !options.metrics_port_file.empty()) {
    return error(ErrorCode::kInvalidValue, "--metrics_port_file needs --metrics_listen");
  }
  return options;
}

// The run directory holds the sockets and the token, so nobody else may be able to swap them:
// it must be a real directory, owned by us, and writable by nobody else. (/tmp/hiber-<uid> could
// otherwise be created by another user first.)
Status prepare_run_dir(const std::string& run_dir) {
  if (::mkdir(run_dir.c_str(), 0755) != 0 && errno != EEXIST) {
    return error(ErrorCode::kOperatingSystem, "cannot create run directory ", run_dir, ": ",
                 std::strerror(errno));
  }
  struct stat st {};
  if (::lstat(run_dir.c_str(), &st) != 0) {
    return error(ErrorCode::kOperatingSystem, "run directory ", run_dir, ": ",
                 std::strerror(errno));
  }
  if (!S_ISDIR(st.st_mode)) {
    return error(ErrorCode::kNotPermitted, "run directory ", run_dir, " is not a directory");
  }
  if (st.st_uid != ::geteuid() || (st.st_mode & (S_IWGRP | S_IWOTH)) != 0) {
    return error(ErrorCode::kNotPermitted, "run directory ", run_dir, " is owned by uid ",
                 st.st_uid, " with mode ", std::oct, (st.st_mode & 07777),
                 ": it must be ours and writable only by us (remove it or pick --run_dir)");
  }
  return Status();
}

// Each session holds its socket and its channel memfd, so a full hiberd needs about two
// descriptors per session plus some; the usual soft limit of 1024 is too low for that.
void raise_fd_limit() {
  rlimit limit{};
  if (::getrlimit(RLIMIT_NOFILE, &limit) != 0) return;
  const rlim_t wanted = 2 * FLAGS_max_sessions + 256;
  if (limit.rlim_cur < limit.rlim_max) {
    limit.rlim_cur = limit.rlim_max;
    ::setrlimit(RLIMIT_NOFILE, &limit);
  }
  if (limit.rlim_cur < wanted) {
    LOG(WARNING) << "open-file limit " << limit.rlim_cur << " is below the " << wanted
                 << " that --max_sessions=" << FLAGS_max_sessions << " may need";
  }
}

int run() {
  raise_fd_limit();
  const std::string run_dir = FLAGS_run_dir.empty() ? default_run_dir() : FLAGS_run_dir;
  if (Status ready = prepare_run_dir(run_dir); !ready.ok()) {
    LOG(ERROR) << ready;
    return 1;
  }
  auto options = make_options(run_dir);
  if (!options.ok()) {
    LOG(ERROR) << options.status();
    return 1;
  }
  // The ranges of sessions kept across the restart stay free while the device maps its own.
  if (!options->state_dir.empty()) server::SessionStore::hold_recorded_ranges(options->state_dir);
  auto device = make_device();
  if (!device.ok()) {
    LOG(ERROR) << device.status();
    return 1;
  }
  LOG(INFO) << "device backend " << (*device)->backend_name() << ":\n"
            << describe((*device)->topology());
  auto daemon = server::Daemon::create(**device, std::move(options).value());
  if (!daemon.ok()) {
    LOG(ERROR) << daemon.status();
    return 1;
  }
  if (!FLAGS_control_tcp_port_file.empty()) {
    if (Status written =
            write_port_file(FLAGS_control_tcp_port_file, (*daemon)->control_tcp_port());
        !written.ok()) {
      LOG(ERROR) << written;
      return 1;
    }
  }
  Status served = (*daemon)->run();
  if (!served.ok()) {
    LOG(ERROR) << served;
    return 1;
  }
  return 0;
}

}  // namespace
}  // namespace hiber

int main(int argc, char** argv) {
  hiber::init_program(&argc, &argv,
                      "hiberd: Hiber's GPU server; executes the CUDA calls of the node's "
                      "inference functions.\n"
                      "  hiberd --device=sim     simulated GPUs (no GPU needed)\n"
                      "  hiberd --device=cuda    the node's GPUs",
                      __FILE__);

  // Signals are read from a signalfd by the event loop: block them before any thread starts so
  // every thread inherits the mask. Writes to a vanished client must not kill the server.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  ::signal(SIGPIPE, SIG_IGN);

  int rc = hiber::run();
  gflags::ShutDownCommandLineFlags();
  google::ShutdownGoogleLogging();
  return rc;
}
