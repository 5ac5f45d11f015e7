// Runs a real hiberd process for integration tests and looks at it from outside: its control
// socket, its open file descriptors and its CPU time in /proc, its exit status.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"
#include "wire/call_client.h"
#include "wire/control_client.h"

namespace hiber::testing {

// Paths baked in by CMake.
std::string hiberd_path();
std::string probe_path();
std::string test_client_path();
std::string kernel_plugin_path();
std::string kernels_fatbin_path();  // empty when the CUDA toolkit was absent at build time
// A whole file's bytes (a module image); empty when it cannot be read.
std::vector<std::byte> read_bytes(const std::string& path);
// A node config of one simulated GPU whose PCIe moves `pcie_gbps` each way (when throttled,
// --sim_throttle); the file lives in /tmp. slow_node_config: 0.1 GB/s, so a 32 MiB copy takes a
// third of a second.
std::string one_gpu_node_config(double pcie_gbps);
std::string slow_node_config();

struct SessionView {
  uint64_t id = 0;
  std::string function_id;
  int pid = 0;
  uint64_t allocated_bytes = 0;
  uint64_t calls = 0;
  uint64_t failed_calls = 0;
};

// What `hiberctl status` shows, as values.
struct StatusView {
  std::vector<SessionView> sessions;
  std::vector<uint64_t> device_session_bytes;  // per GPU
  uint64_t sessions_opened = 0;
  uint64_t sessions_closed = 0;
  uint64_t handshakes_rejected = 0;
  uint64_t malformed_messages = 0;
  // The module cache.
  uint64_t cached_modules = 0;
  uint64_t cached_module_bytes = 0;
  uint64_t module_cache_hits = 0;
  uint64_t module_cache_misses = 0;
  uint64_t module_cache_unknown_hashes = 0;
};

// How to start a hiberd, for what the plain constructor does not cover.
struct HiberdOptions {
  // User-declared, so the struct is no aggregate: Hiberd({"--flag"}) keeps meaning extra flags.
  HiberdOptions() = default;
  std::string device = "sim";  // --device: "sim" or "cuda"
  // With "sim": kernel plugins loaded after the test kernel plugin (their kernel names must not
  // collide with its).
  std::vector<std::string> extra_plugins;
  std::vector<std::string> extra_flags;  // appended last
  unsigned fd_limit = 0;                 // as in the plain constructor
};

class Hiberd {
 public:
  // Starts hiberd --device=sim in a fresh run directory with the test kernel plugin loaded and
  // `extra_flags` appended, and waits until its control socket answers. A non-zero
  // `fd_limit` caps the process's open files (soft and hard).
  explicit Hiberd(std::vector<std::string> extra_flags = {}, unsigned fd_limit = 0);
  // The same, as `options` say (another device, more kernel plugins).
  explicit Hiberd(const HiberdOptions& options);
  // Sends SIGTERM if still running and waits; a test that cares about the exit status calls
  // stop() itself.
  ~Hiberd();

  Hiberd(const Hiberd&) = delete;
  Hiberd& operator=(const Hiberd&) = delete;

  pid_t pid() const { return pid_; }
  const std::string& run_dir() const { return run_dir_; }
  std::string socket_path() const;
  std::string control_socket_path() const;
  std::string token() const;  // the functions' auth token
  // The control token's file: --control_token_file if given, else hiberd's default.
  const std::string& control_token_file() const { return control_token_file_; }
  // A control client with the control token.
  Result<wire::ControlClient> control(
      std::chrono::milliseconds timeout = std::chrono::seconds(30)) const;
  const std::string& log_path() const { return log_path_; }

  // Options for a client of this hiberd.
  wire::ClientOptions client_options(const std::string& function_id) const;
  Result<std::unique_ptr<wire::CallClient>> connect(const std::string& function_id) const;

  Result<StatusView> status() const;
  // Polls status() until pred holds or the timeout passes; returns the last view.
  template <typename Pred>
  Result<StatusView> wait_for(Pred pred, std::chrono::milliseconds timeout) const;

  // Open file descriptors of the hiberd process.
  int open_fds() const;
  // The fd count once it has not changed for 200 ms (connections of earlier status queries
  // close asynchronously), or after `timeout`.
  int settled_fds(std::chrono::milliseconds timeout = std::chrono::seconds(10)) const;
  // Polls until hiberd has `expected` fds open or `timeout` passes; returns the last count.
  int wait_for_fds(int expected,
                   std::chrono::milliseconds timeout = std::chrono::seconds(10)) const;
  // User + system CPU time hiberd has used.
  std::chrono::milliseconds cpu_time() const;
  // Lines of hiberd's log (stderr).
  std::string log() const;

  // Polls until hiberd's state directory (<run_dir>/state, the default) holds at least `records`
  // session records, or `timeout` passes; returns how many it holds. A record is written when a
  // session's first request fixes its model, to a temporary file renamed when complete.
  size_t wait_for_session_records(size_t records,
                                  std::chrono::milliseconds timeout = std::chrono::seconds(30)) const;

  // SIGTERM, then waits; returns the exit status as from waitpid (or -1).
  int stop(std::chrono::milliseconds timeout = std::chrono::seconds(20));
  // SIGKILLs hiberd, waits `pause`, and starts it again as before (same flags and run
  // directory, so the same sockets and tokens), waiting until it serves. The killed run's log is
  // kept as <log>.run-<n>.
  void kill_and_restart(std::chrono::milliseconds pause);
  // The same after a clean stop (SIGTERM, as an upgrade does); returns the old run's exit status.
  int stop_and_restart();

 private:
  // Spawns argv_ and waits until the control socket accepts.
  void start();
  // start() after a previous run ended, waiting until the new run says it serves.
  void restart();

  std::vector<std::string> argv_;
  unsigned fd_limit_ = 0;
  int restarts_ = 0;
  pid_t pid_ = -1;
  std::string run_dir_;
  std::string log_path_;
  std::string control_token_file_;
};

// User + system CPU time a process has used, from /proc.
std::chrono::milliseconds process_cpu_time(pid_t pid);

// Runs a program to completion; returns its exit code (128 + signal if killed) and output.
struct ProgramResult {
  int exit_code = -1;
  std::string output;
};
ProgramResult run_program(const std::vector<std::string>& argv,
                          std::chrono::milliseconds timeout = std::chrono::seconds(120));
// The same with `env` ("NAME=value" entries) added to the environment, replacing variables of
// the same name.
ProgramResult run_program(const std::vector<std::string>& argv, const std::vector<std::string>& env,
                          std::chrono::milliseconds timeout = std::chrono::seconds(120));

// Starts a program in the background; its output goes to `log_path`. A non-zero `fd_limit`
// caps its open files; `env` is added to the environment as in run_program.
pid_t spawn(const std::vector<std::string>& argv, const std::string& log_path,
            unsigned fd_limit = 0, const std::vector<std::string>& env = {});
// Waits for a spawned program; exit code as in run_program, or -1 on time-out.
int wait_exit(pid_t pid, std::chrono::milliseconds timeout);

// A program started with pipes to its stdin and from its stdout (stderr goes to a file).
struct PipedProcess {
  pid_t pid = -1;
  int to_stdin = -1;     // owned by the caller
  int from_stdout = -1;  // owned by the caller
};
PipedProcess spawn_piped(const std::vector<std::string>& argv, const std::string& stderr_path,
                         const std::vector<std::string>& env = {});

template <typename Pred>
Result<StatusView> Hiberd::wait_for(Pred pred, std::chrono::milliseconds timeout) const {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (true) {
    auto view = status();
    if (!view.ok()) return view;
    if (pred(*view) || std::chrono::steady_clock::now() > deadline) return view;
    struct timespec ts = {0, 20'000'000};
    nanosleep(&ts, nullptr);
  }
}

}  // namespace hiber::testing
